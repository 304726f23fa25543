"""Traced graph -> the runtime's request-graph ops (runtime/programs/program_ops.py): role
blocks become their template text, gens get their final sampling params."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixflow.lang.chat_template import ChatTemplate
from radixflow.lang.errors import NotTraceable
from radixflow.lang.ir import (
    ArgRef,
    Fork,
    Gen,
    Graph,
    Join,
    RoleBegin,
    RoleEnd,
    ScopeBegin,
    ScopeEnd,
    Select,
    SeparateReasoning,
    Text,
    VarRef,
)
from radixflow.lang.primitives import logprob_options, sampling_params


@dataclass
class _Ctx:
    template: ChatTemplate
    defaults: dict
    role_seen: bool = False
    gen_vars: set = field(default_factory=set)
    fork_vars: dict = field(default_factory=dict)  # fork id -> (names its branches set, the parent's at the fork)
    separated: bool = False  # a separate_reasoning ran: the text after it differs from the graph's context

    def child(self) -> "_Ctx":
        return _Ctx(self.template, self.defaults, self.role_seen, set(), separated=self.separated)


def lower(graph: Graph, template: ChatTemplate, defaults: dict) -> dict:
    """Raises NotTraceable for what the executor cannot run (the program then runs eagerly)."""
    return {"ops": _lower(graph.nodes, _Ctx(template, defaults))}


def constant_prefix(graph: Graph, template: ChatTemplate) -> str:
    """The text a program starts with whatever its arguments: its leading text and role markers, up to its first
    argument, variable, gen, select or fork (what SGLang's f.cache() sends)."""
    ctx, out = _Ctx(template, {}), []
    for n in graph.nodes:
        if isinstance(n, Text):
            out.append(n.text)
        elif isinstance(n, RoleBegin):
            out += _role_begin(n.role, ctx)
        elif isinstance(n, RoleEnd):
            out.append(template.end(n.role))
        elif not isinstance(n, (ScopeBegin, ScopeEnd)):
            break
    return "".join(out)


def _lower(nodes: list, ctx: _Ctx) -> list[dict]:
    ops: list[dict] = []
    for n in nodes:
        if ctx.separated and isinstance(n, (VarRef, Gen, Select, Fork)):
            raise NotTraceable("a gen, select, fork or variable after separate_reasoning: "
                               "the runtime would see the thinking")
        if isinstance(n, SeparateReasoning):
            ctx.separated = True  # split when the results are replayed (graph_run.replay)
        elif isinstance(n, Text):
            ops.append({"op": "text", "text": n.text})
        elif isinstance(n, VarRef):
            if n.name not in ctx.gen_vars:
                raise NotTraceable(f"variable {n.name!r} is not the output of a gen or select")
            ops.append({"op": "var", "name": n.name})
        elif isinstance(n, ArgRef):
            raise NotTraceable(f"argument {n.name!r} has no value")
        elif isinstance(n, Gen):
            lp = logprob_options(n.params, ctx.defaults)
            start = lp.pop("logprob_start_len", None)
            if start is not None and start >= 0:
                raise NotTraceable(f"gen {n.name!r} asks for prompt logprobs, which request graphs do not return")
            sampling = sampling_params(ctx.defaults, n.params)
            ops.append({"op": "gen", "id": n.nid, "name": n.name, "sampling_params": sampling, **lp})
            if sampling.get("n", 1) == 1:  # n > 1: a list, which eager mode cannot append either (a TypeError)
                _produced(ctx, n.name)
            else:
                ctx.gen_vars.discard(n.name)
        elif isinstance(n, Select):
            ops.append({"op": "select", "id": n.nid, "name": n.name, "choices": n.choices, "method": n.method})
            _produced(ctx, n.name)
        elif isinstance(n, RoleBegin):
            ops.extend({"op": "text", "text": t} for t in _role_begin(n.role, ctx))
        elif isinstance(n, RoleEnd):
            ops.append({"op": "text", "text": ctx.template.end(n.role)})
        elif isinstance(n, (ScopeBegin, ScopeEnd)):
            ctx.gen_vars.discard(n.name)
        elif isinstance(n, Fork):
            kids = [ctx.child() for _ in n.branches]
            for k in kids:
                k.gen_vars = set(ctx.gen_vars)
            ops.append({"op": "fork", "id": n.nid, "branches": [_lower(b, k) for b, k in zip(n.branches, kids)]})
            ctx.fork_vars[n.nid] = ({v for k in kids for v in k.gen_vars - ctx.gen_vars}, set(ctx.gen_vars))
            ctx.separated = any(k.separated for k in kids)
        elif isinstance(n, Join):
            ops.append({"op": "join", "fork": n.fork, "mode": n.mode})
            branch_set, parent_had = ctx.fork_vars.get(n.fork, (set(), set()))
            # branch variables become lists, but one the parent set since the fork keeps its value (joined_names)
            ctx.gen_vars -= branch_set - (ctx.gen_vars - parent_had)
    return [o for o in ops if o["op"] != "text" or o["text"]]


def _produced(ctx: _Ctx, name) -> None:
    if name:
        ctx.gen_vars.add(name)


def _role_begin(role: str, ctx: _Ctx) -> list[str]:
    """The same text as Interpreter._role_begin, default system turn included."""
    out = []
    t = ctx.template
    if role != "system" and not ctx.role_seen and t.default_system:
        out += [t.begin("system"), t.default_system, t.end("system")]
    ctx.role_seen = True
    return out + [t.begin(role)]
