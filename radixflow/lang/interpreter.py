"""Runs program nodes eagerly against a backend: one backend call per gen / select.

With a backend that has the model's tokenizer, the interpreter keeps the program's token
ids as well as its text, and sends ids: the same pieces (runtime/programs/segment_tokens.py) as
the request-graph executor, so a static program gives the same tokens either way.
The same class replays a request graph's results into a ProgramState.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from radixflow.lang.chat_template import ChatTemplate
from radixflow.lang.errors import GenerationError, ProgramError
from radixflow.lang.ir import (
    ArgRef, Gen, Node, RoleBegin, RoleEnd, ScopeBegin, ScopeEnd, Select, SeparateReasoning, Text, VarRef,
)
from radixflow.lang.primitives import logprob_options, sampling_params
from radixflow.lang.speculation import Speculation
from radixflow.lang.stream_log import ChunkMeta, StreamLog
from radixflow.runtime.incremental_text import partial_stop_len
from radixflow.runtime.programs.program_ops import joined_names
from radixflow.runtime.programs.segment_tokens import encode_piece
from radixflow.runtime.reasoning import get_format, prompt_forces, split
from radixflow.runtime.sampling_params import SamplingParams



@dataclass
class Prompt:
    text: str
    ids: Optional[list] = None
    messages: Optional[list] = None  # finished turns (for chat APIs)
    role: Optional[tuple] = None  # (open role, its text so far)


@dataclass
class GenResult:
    text: str
    ids: Optional[list] = None  # the kept token ids (None: text-only backend)
    meta: Optional[dict] = None


@dataclass
class SelectResult:
    index: int
    ids: Optional[list] = None
    meta: Optional[dict] = None


class Interpreter:
    def __init__(self, backend, defaults: dict, template: ChatTemplate, use_ids: bool, streaming: bool = False, log=None):
        self.backend = backend
        self.defaults = defaults
        self.template = template
        self.streaming = streaming
        self.text = ""
        self.ids: Optional[list] = [] if use_ids else None
        self.pending = ""  # text not yet tokenized
        self.vars: dict = {}
        self.metas: dict = {}
        self.messages: list = []
        self.role: Optional[tuple] = None
        self.role_seen = False
        self.scopes: dict = {}
        self.produced: list = []
        self.spans: dict = {}  # gen / select name -> [text start, text end, ids start] of its output (separate_reasoning)
        self.base = (0, 0)  # (text, ids) lengths at the fork that made this one
        self.log = StreamLog() if log is None else log
        self.spec: Optional[Speculation] = None  # API speculative execution (speculation.py)

    # -- nodes -------------------------------------------------------------------------------
    def execute(self, node: Node) -> None:
        if isinstance(node, Text):
            self._append(node.text)
        elif isinstance(node, VarRef):
            self._append(str(self.get(node.name)))
        elif isinstance(node, Gen):
            self._gen(node)
        elif isinstance(node, Select):
            self._select(node)
        elif isinstance(node, RoleBegin):
            self._role_begin(node.role)
        elif isinstance(node, RoleEnd):
            self._role_end(node.role)
        elif isinstance(node, ScopeBegin):
            self.scopes[node.name] = len(self.text)
        elif isinstance(node, ScopeEnd):
            self.set(node.name, self.text[self.scopes.pop(node.name) :])
        elif isinstance(node, SeparateReasoning):
            self._separate(node)
        elif isinstance(node, ArgRef):
            raise ProgramError(f"argument {node.name!r} was not given")
        else:
            raise ProgramError(f"cannot execute a {node.kind} node here")

    def _append(self, text: str, var: Optional[str] = None) -> None:
        if self.spec is not None:
            self.spec.fill(text)
        self.text += text
        if self.ids is not None:
            self.pending += text
        self.log.put(var, text)

    def _flush(self) -> None:
        if self.ids is not None and self.pending:
            self.ids.extend(encode_piece(self.backend.tokenizer, self.pending, first=not self.ids))
            self.pending = ""

    def _prompt(self) -> Prompt:
        self._flush()
        role = None if self.role is None else (self.role[0], self.text[self.role[1] :])
        return Prompt(self.text, None if self.ids is None else list(self.ids), list(self.messages), role)

    def _gen(self, node: Gen) -> None:
        logprobs = logprob_options(node.params, self.defaults)  # run(return_logprob=...) asks every gen
        if logprobs.keys() - node.params.keys():
            node = dataclasses.replace(node, params={**node.params, **logprobs})
        params = sampling_params(self.defaults, node.params)
        prompt = self._prompt()
        shown, chunk_meta = 0, ChunkMeta()
        try:
            if self.spec is not None and self._speculated(node, params, prompt):
                return
            if self.streaming and params.get("n", 1) == 1:
                res, shown = self._gen_stream(prompt, params, node, chunk_meta)
            else:
                res = self.backend.generate(prompt, params, node)
        except ProgramError:
            raise
        except Exception as e:
            raise GenerationError(f"gen {node.name!r} failed: {e}") from e
        if isinstance(res, list):  # n > 1: the variable holds all samples, the text the first
            self.set(node.name, [r.text for r in res], [r.meta for r in res])
            res = res[0]
        else:
            self.set(node.name, res.text, res.meta)
        self._append_generated(res, node.name, shown, chunk_meta(res.meta))

    def _speculated(self, node: Gen, params: dict, prompt: Prompt) -> bool:
        """Serve the gen from the speculation if it can be (speculation.py)."""
        assert self.spec is not None
        if not Speculation.applies(params, node.params):
            self.spec.drop()
            return False
        tok = self.backend.tokenizer
        count = None if tok is None else (lambda text: len(encode_piece(tok, text, first=False)))
        cut = self.spec.take(params, lambda p: _call_result(self.backend.generate(prompt, p, None)), count)
        if cut is None:
            return False
        self.set(node.name, cut[0], cut[1])
        self._append_generated(GenResult(cut[0]), node.name, 0)
        return True

    def _gen_stream(self, prompt: Prompt, params: dict, node: Gen, chunk_meta: ChunkMeta) -> tuple:
        """Stream a gen's text as it grows, holding back a tail that may be the start of a stop string (or of a
        stop_regex's own text), where the output would be cut; it held back 32 characters whatever the stops, so a
        short gen showed nothing until it ended (fuzzing, session 30)."""
        shown, cuts = 0, SamplingParams.from_dict(params).cut_strs  # the runtime's rule: stops and stop_regex texts
        for item in self.backend.generate_stream(prompt, params, node):
            if isinstance(item, GenResult):
                return item, shown
            text, meta = item
            safe = max(shown, len(text) - partial_stop_len(text, cuts))
            if safe > shown:
                self.log.put(node.name, text[shown:safe], chunk_meta(meta))
            shown = safe
        raise GenerationError(f"gen {node.name!r}: the stream ended without a result")

    def _append_generated(self, res: GenResult, var: Optional[str], shown: int, meta: Optional[dict] = None) -> None:
        assert not self.pending, "a gen's prompt is flushed before it runs"
        if var is not None:
            self.spans[var] = [len(self.text), len(self.text) + len(res.text), None if self.ids is None else len(self.ids)]
        self.text += res.text
        if self.ids is not None:
            self.ids.extend(res.ids if res.ids is not None else encode_piece(self.backend.tokenizer, res.text, False))
        self.log.put(var, res.text[shown:], meta)

    def _select(self, node: Select) -> None:
        if self.spec is not None:
            self.spec.drop()
        prompt = self._prompt()
        if not prompt.text and not prompt.ids:  # as graph mode: every choice would score 0 after nothing
            raise GenerationError(f"select {node.name!r}: a program must have some text before its first gen or select")
        try:
            res = self.backend.select(prompt, node.choices, node.method, node)
        except ProgramError:
            raise
        except Exception as e:
            raise GenerationError(f"select {node.name!r} failed: {e}") from e
        choice = node.choices[res.index]
        self.set(node.name, choice, res.meta)
        self._append_generated(GenResult(choice, res.ids), node.name, 0, res.meta)

    # -- reasoning -------------------------------------------------------------------------------
    def _separate(self, node: SeparateReasoning) -> None:
        """The gen's thinking to its own variable; the variable and the text keep the answer."""
        span, value = self.spans.get(node.name), self.vars.get(node.name)
        if span is None or not isinstance(value, str):
            raise ProgramError(f"separate_reasoning: {node.name!r} is not a gen or select with one output in this strand")
        start, end, ids_start = span
        fmt = get_format(node.model_type)
        parts = split(value, fmt, prompt_forces(fmt, self.text[:start]))
        self.set(node.name, parts.content)
        self.set(node.reasoning_var, parts.reasoning)
        self._replace(start, end, parts.content, ids_start)

    def _replace(self, start: int, end: int, new: str, ids_start: Optional[int]) -> None:
        """text[start:end] becomes `new`; token ids from there on are encoded again at the next flush."""
        text = self.text[:start] + new + self.text[end:]
        if self.ids is not None:
            covered = len(self.text) - len(self.pending)  # the text the ids hold
            if start < covered:
                del self.ids[ids_start:]
                covered = start
            self.pending = text[covered:]
        shift = len(new) - (end - start)
        for span in self.spans.values():
            if span[0] >= end:
                span[0], span[1] = span[0] + shift, span[1] + shift
        self.scopes = {k: v + shift if v >= end else v for k, v in self.scopes.items()}
        if self.role is not None and self.role[1] >= end:
            self.role = (self.role[0], self.role[1] + shift)
        self.text = text

    # -- roles ---------------------------------------------------------------------------------
    def _role_begin(self, role: str) -> None:
        if self.role is not None:
            raise ProgramError(f"role {role!r} begins inside role {self.role[0]!r}; roles cannot nest")
        if role != "system" and not self.role_seen and self.template.default_system:
            self._role_begin("system")
            self._append(self.template.default_system)
            self._role_end("system")
        self.role_seen = True
        self._append(self.template.begin(role))
        self.role = (role, len(self.text))

    def _role_end(self, role: str) -> None:
        if self.role is None or self.role[0] != role:
            raise ProgramError(f"role {role!r} ends but {self.role[0] if self.role else 'no role'!r} is open")
        content = self.text[self.role[1] :]
        self.role = None
        self._append(self.template.end(role))
        self.messages.append({"role": role, "content": content.lstrip()})

    # -- variables -------------------------------------------------------------------------------
    def get(self, name: str) -> Any:
        if name not in self.vars:
            raise KeyError(f"the program has no variable {name!r} (yet)")
        return self.vars[name]

    def set(self, name: Optional[str], value: Any, meta: Optional[dict] = None) -> None:
        if name is None:
            return
        self.vars[name] = value
        if meta is not None:
            self.metas[name] = meta
        self.produced.append(name)

    # -- fork / join ---------------------------------------------------------------------------------
    def fork(self, n: int) -> tuple[list["Interpreter"], None]:
        self._flush()
        kids = []
        for _ in range(n):
            kid = copy.copy(self)
            kid.vars, kid.metas = dict(self.vars), dict(self.metas)
            kid.messages, kid.scopes, kid.produced = [dict(m) for m in self.messages], dict(self.scopes), []  # str values
            kid.spans = {}  # a branch separates only its own outputs
            kid.ids = None if self.ids is None else list(self.ids)
            kid.log = type(self.log)()
            kid.spec = None  # branches call the backend for each gen
            kid.base = (len(self.text), 0 if self.ids is None else len(self.ids))
            kids.append(kid)
        return kids, None

    def join(self, kids: list["Interpreter"], mode: str, fork_nid: Optional[int] = None) -> None:
        for name, having in joined_names(self.vars, kids):  # new branch variables -> lists
            self.set(name, [k.vars[name] for k in having], {"forks": [k.metas.get(name) for k in having]})
        if mode == "gather":
            return
        if self.spec is not None:
            self.spec.drop()
        self._flush()
        for k in kids:
            k._flush()
            text_base, ids_base = k.base
            self.text += k.text[text_base:]
            self.log.put(None, k.text[text_base:])
            if self.ids is not None:
                self.ids.extend(k.ids[ids_base:])


def _call_result(res: GenResult) -> tuple:
    """(text, meta, whether the model stopped by itself) of a speculative call."""
    reason = (res.meta or {}).get("finish_reason")
    kind = reason.get("type") if isinstance(reason, dict) else reason  # native dict, or OpenAI's string
    return res.text, res.meta, kind == "stop"

