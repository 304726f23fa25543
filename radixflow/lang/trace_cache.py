"""When a program's traced graph can be reused for calls with other arguments, and which.

SGLang-style programs run many times with other text (`s += "Q: " + question + "\n"`): tracing,
lowering and checking each call's graph again held the GIL for most of a program thread's work.
A function qualifies if reading its source proves (`analyse`) that

* its text parameters reach nothing but the program's text: every use is an operand of a `+`
  chain or an f-string field (no conversion, no format spec) made only of text (str constants,
  text parameters, f-strings, gen/select/role calls), and that chain is appended to
  the state (`s += ...`, `forks += ...`, `forks += lambda i: ...`, `s.user(...)`, `rf.user(...)`);
  no text parameter is ever assigned;
* it calls nothing but radixflow's primitives, the state's own methods, `join` on a fork,
  str constants' methods and side-effect-free builtins, so a call has no effect but its trace;
* everything else it reads is its other arguments, its defaults and globals / closure cells of
  plain data (str, numbers, bools, None, lists, tuples, dicts of these): `key` spells them all
  out (their repr, unambiguous for plain data), with the primitives' identity.

Then the trace is the same for any str values of the text parameters: Python takes the same
path (nothing it computes depends on them), and each text value only becomes text where its
placeholder is. So a graph traced once with placeholders for them (trace_templates.py) and
filled in with a call's values is the graph that call would trace, up to how its text is split
into nodes (the executor and the replay join adjacent text). A value holding the placeholder
mark, or a text argument that is not exactly a str, is not cached.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import inspect
import linecache
import symtable
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional

from radixflow.lang import primitives
from radixflow.lang.placeholder import MARK, plain_str
from radixflow.runtime.sampling_params import plain

PRIMITIVES = frozenset(getattr(primitives, n) for n in (
    "gen", "gen_int", "gen_string", "select", "system", "user", "assistant", "system_begin", "system_end",
    "user_begin", "user_end", "assistant_begin", "assistant_end"))  # fmt: skip
ROLES = frozenset((primitives.system, primitives.user, primitives.assistant))
PURE_BUILTINS = frozenset(getattr(builtins, n) for n in (
    "len", "range", "enumerate", "zip", "min", "max", "abs", "int", "float", "str", "bool", "list", "tuple",
    "dict", "sorted", "reversed", "round", "isinstance", "sum", "any", "all", "repr"))  # fmt: skip
STATE_METHODS = frozenset(("fork", "user", "assistant", "system", "var_scope", "get_var", "set_var"))
STATE_ROLES = frozenset(("user", "assistant", "system"))
_NODES = (ast.Expr, ast.Assign, ast.AugAssign, ast.For, ast.While, ast.If, ast.With, ast.withitem, ast.Return,
          ast.Pass, ast.Break, ast.Continue, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Lambda, ast.IfExp, ast.Dict,
          ast.Set, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Compare, ast.Call,
          ast.FormattedValue, ast.JoinedStr, ast.Constant, ast.Attribute, ast.Subscript, ast.Starred, ast.Name,
          ast.List, ast.Tuple, ast.Slice, ast.keyword, ast.arguments, ast.arg, ast.comprehension,
          ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)  # fmt: skip


@dataclass(frozen=True)
class Analysis:
    text: frozenset  # parameters proven to reach only the program's text
    reads: dict  # global / closure name -> the object it named when analysed, for calls (identity kept)
    data: tuple  # global / closure names read as plain data (their repr goes into the key)
    attrs: tuple = ()  # (global name, attribute, the primitive it named): `rf.gen` must stay rf.gen
    code: Any = None  # the code object read: a function whose __code__ is replaced is read again


def key(func: Callable, a: Analysis, arguments: dict) -> Optional[str]:
    """What the trace may depend on besides the text parameters' values, or None if this call is
    not cacheable (a text argument not an exact str or holding the mark, a read that changed)."""
    if func.__code__ is not a.code:
        return None
    env = _environment(func)
    if any(env(n, _MISSING) is not obj for n, obj in a.reads.items()):
        return None
    if any(getattr(env(n, None), attr, None) is not obj for n, attr, obj in a.attrs):
        return None
    data = [env(n, _MISSING) for n in a.data]
    keyed = {k: v for k, v in arguments.items() if k not in a.text}
    texts = [arguments[k] for k in a.text if k in arguments]
    rest = [data, keyed, func.__defaults__, func.__kwdefaults__]
    if not all(type(t) is str and MARK not in t for t in texts) or not plain(rest) or _has_mark(rest):
        return None  # a marked str elsewhere would be filled with a text argument's value
    return repr((id(a.code), sorted(k for k in a.text if k in arguments), data, sorted(keyed.items()), func.__defaults__,
                 func.__kwdefaults__))  # fmt: skip


_MISSING = object()


def _has_mark(obj: Any) -> bool:
    """Whether any str in plain data holds the placeholder mark (its repr escapes the mark)."""
    if isinstance(obj, str):
        return MARK in plain_str(obj)
    if isinstance(obj, dict):
        return any(_has_mark(k) or _has_mark(v) for k, v in obj.items())
    return isinstance(obj, (list, tuple)) and any(_has_mark(x) for x in obj)


def _environment(func: Callable) -> Callable[[str, Any], Any]:
    cells = dict(zip(func.__code__.co_freevars, func.__closure__ or ()))

    def lookup(name: str, default: Any) -> Any:
        if name in cells:
            try:
                return cells[name].cell_contents
            except ValueError:  # an empty cell
                return default
        if name in func.__globals__:
            return func.__globals__[name]
        return getattr(builtins, name, default)

    return lookup


_ANALYSE_LOCK = threading.Lock()


def analyse(func: Callable) -> Optional[Analysis]:
    """The proof above for `func`, or None where it does not go through (or its source is not there).
    One thread at a time: CPython 3.11's AST conversion keeps its recursion depth per interpreter,
    and concurrent ast.parse calls (a batch's first programs) fail with a SystemError; the lock
    is taken only on a miss. Keyed by the code object too: a replaced __code__ is read again."""
    k = (func, getattr(func, "__code__", None))
    found = _ANALYSED.get(k, _MISSING)
    if found is not _MISSING:
        return found
    with _ANALYSE_LOCK:
        try:
            found = _analyse(func, k[1])
        except Exception:  # reading the source must never fail a run: no template, as before
            found = None
        if len(_ANALYSED) >= 1024:
            _ANALYSED.pop(next(iter(_ANALYSED)))  # the oldest
        _ANALYSED[k] = found
        return found


_ANALYSED: dict = {}


def _analyse(func: Callable, code: Any) -> Optional[Analysis]:
    try:
        path = inspect.getsourcefile(func)
        src = "".join(linecache.getlines(path, func.__globals__)) if path else ""
        tree, table = ast.parse(src), symtable.symtable(src, path, "exec")
        compiled = compile(src, path, "exec", dont_inherit=True)
    except (OSError, TypeError, SyntaxError, ValueError):
        return None
    if code is None or code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE):
        return None
    made = _find(compiled, lambda c: c.co_name == code.co_name and c.co_firstlineno == code.co_firstlineno)
    if made is None or not _same_code(made, code):
        return None  # the file is not what was loaded (edited since), or the function was made otherwise
    fdef = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == code.co_name
                 and min([n.lineno] + [d.lineno for d in n.decorator_list]) == code.co_firstlineno), None)  # fmt: skip
    ftable = _find_table(table, code.co_name, None if fdef is None else fdef.lineno)
    a = None if fdef is None or ftable is None else _Reader(func, fdef, ftable).analysis()
    return None if a is None else dataclasses.replace(a, code=code)


def _find(code: Any, match: Callable[[Any], bool]) -> Any:
    if match(code):
        return code
    return next((f for c in code.co_consts if inspect.iscode(c) for f in [_find(c, match)] if f is not None), None)


def _find_table(table: symtable.SymbolTable, name: str, lineno: Optional[int]) -> Optional[symtable.SymbolTable]:
    for t in table.get_children():
        if t.get_type() == "function" and t.get_name() == name and t.get_lineno() == lineno:
            return t
        found = _find_table(t, name, lineno)
        if found is not None:
            return found
    return None


def _same_code(a: Any, b: Any) -> bool:
    fields = ("co_code", "co_names", "co_varnames", "co_freevars", "co_cellvars", "co_argcount", "co_kwonlyargcount")
    if any(getattr(a, f) != getattr(b, f) for f in fields) or len(a.co_consts) != len(b.co_consts):
        return False
    return all(_same_code(x, y) if inspect.iscode(x) and inspect.iscode(y) else type(x) is type(y) and x == y
               for x, y in zip(a.co_consts, b.co_consts))  # fmt: skip


class _Reader:
    def __init__(self, func: Callable, fdef: ast.FunctionDef, table: symtable.SymbolTable):
        self.func, self.fdef = func, fdef
        self.params = [a.arg for a in fdef.args.posonlyargs + fdef.args.args + fdef.args.kwonlyargs]
        self.state = self.params[0] if self.params else ""
        self.parents = {c: p for p in ast.walk(fdef) for c in ast.iter_child_nodes(p)}
        self.nodes = [n for stmt in fdef.body for n in ast.walk(stmt)]
        self.table = table
        stores = [n for n in self.nodes if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)]
        lambda_args = [a.arg for n in self.nodes if isinstance(n, ast.Lambda) for a in _args(n.args)]
        self.bound = {n.id for n in stores} | set(lambda_args)  # every binding: none of a text parameter
        # bindings that may change what a name holds: `s += x` and `forks += x` give back the same object
        augmented = {id(n.target) for n in self.nodes if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add)}
        self.assigned = Counter([n.id for n in stores if id(n) not in augmented] + lambda_args)
        self.forks = self._fork_locals()
        self.env = _environment(func)

    def analysis(self) -> Optional[Analysis]:
        f = self.fdef.args
        if self.table is None or f.vararg or f.kwarg or self.assigned[self.state]:
            return None
        if any(isinstance(n, ast.AugAssign) and not (isinstance(n.target, ast.Name) and n.target.id in
               self.forks | {self.state}) for n in self.nodes):  # fmt: skip
            return None  # `x += [...]` may change an argument in place, which a cache hit would skip
        if not all(isinstance(n, _NODES) for n in self.nodes):
            return None
        outside = self._outside_names()
        reads = {n: self.env(n, _MISSING) for n in outside}
        if not all(self._call_ok(c, reads) for c in self.nodes if isinstance(c, ast.Call)):
            return None
        if not all(isinstance(self.parents[n], ast.Call) and self.parents[n].func is n
                   for n in self.nodes if isinstance(n, ast.Attribute)):  # fmt: skip
            return None  # attributes only as called methods
        if any(isinstance(n, ast.Subscript) and not isinstance(n.ctx, ast.Load)
               and not (isinstance(n.value, ast.Name) and n.value.id == self.state) for n in self.nodes):  # fmt: skip
            return None  # x[k] = v writes to an argument or a global; s[k] = v only sets a variable
        callables = {n: v for n, v in reads.items() if _one_of(v, PRIMITIVES | PURE_BUILTINS) or _is_radixflow(v)}
        data = tuple(n for n in outside if n not in callables)
        if not all(plain(reads[n]) for n in data):
            return None
        attrs = tuple((f.value.id, f.attr, getattr(reads[f.value.id], f.attr)) for c in self.nodes
                      if isinstance(c, ast.Call) for f in [c.func] if isinstance(f, ast.Attribute)
                      and isinstance(f.value, ast.Name) and f.value.id in reads and _is_radixflow(reads[f.value.id]))  # fmt: skip
        return Analysis(self._text_params(), callables, data, attrs)

    def _outside_names(self) -> list:
        """Names read from globals, builtins or the function's closure, in any of its scopes."""
        names = {s.get_name() for s in self.table.get_symbols() if s.is_global() or s.is_free()}
        stack = list(self.table.get_children())
        while stack:
            t = stack.pop()
            names |= {s.get_name() for s in t.get_symbols() if s.is_global()}
            stack.extend(t.get_children())
        return sorted(names)

    def _fork_locals(self) -> set:
        """Names bound once in the function, to `s.fork(...)` (by assignment or `with ... as`)."""
        out = set()
        for n in self.nodes:
            if isinstance(n, ast.Assign) and len(n.targets) == 1:
                value, target = n.value, n.targets[0]
            elif isinstance(n, ast.withitem):
                value, target = n.context_expr, n.optional_vars
            else:
                continue
            if isinstance(target, ast.Name) and self.assigned[target.id] == 1 and self._state_call(value, {"fork"}):
                out.add(target.id)
        return out

    def _state_call(self, node: Any, methods: frozenset | set) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in methods
                and isinstance(node.func.value, ast.Name) and node.func.value.id == self.state)  # fmt: skip

    def _call_ok(self, call: ast.Call, reads: dict) -> bool:
        f = call.func
        if isinstance(f, ast.Name):
            return f.id in reads and _one_of(reads[f.id], PRIMITIVES | PURE_BUILTINS)
        if not isinstance(f, ast.Attribute):
            return False
        if isinstance(f.value, ast.Constant):
            return isinstance(f.value.value, str)  # str methods: pure
        if not isinstance(f.value, ast.Name):
            return False
        owner = f.value.id
        if owner == self.state:
            return f.attr in STATE_METHODS
        if owner in self.forks:
            return f.attr == "join"
        return owner in reads and _is_radixflow(reads[owner]) and _one_of(getattr(reads[owner], f.attr, None), PRIMITIVES)

    # -- text parameters ------------------------------------------------------------------------------
    def _text_params(self) -> frozenset:
        text = {p for p in self.params[1:] if p not in self.bound}
        while True:  # a parameter is text if its uses are, given which others are
            keep = {p for p in text if all(self._in_text(n, text) for n in self.nodes
                                           if isinstance(n, ast.Name) and n.id == p)}  # fmt: skip
            if keep == text:
                return frozenset(text)
            text = keep

    def _in_text(self, node: ast.AST, text: set) -> bool:
        cur = node
        while True:
            par = self.parents.get(cur)
            if isinstance(par, ast.FormattedValue):
                # only the bare parameter: `f"{q + '!'}"` formats the trace's ExprList, not text
                if cur is not node or par.conversion != -1 or par.format_spec is not None:
                    return False
                cur = self.parents[par]  # the f-string
            elif isinstance(par, ast.BinOp) and isinstance(par.op, ast.Add):
                if not (self._texty(par.left, text) and self._texty(par.right, text)):
                    return False
                cur = par
            elif isinstance(par, ast.Call) and par.args == [cur] and not par.keywords and self._role_call(par):
                if self._state_call(par, STATE_ROLES):
                    return isinstance(self.parents.get(par), ast.Expr)  # s.user(text) appends it
                cur = par
            elif isinstance(par, ast.AugAssign) and par.value is cur and isinstance(par.op, ast.Add):
                return isinstance(par.target, ast.Name) and par.target.id in self.forks | {self.state}
            elif isinstance(par, ast.Lambda) and par.body is cur:
                up = self.parents.get(par)
                return (isinstance(up, ast.AugAssign) and up.value is par and isinstance(up.target, ast.Name)
                        and up.target.id in self.forks)  # fmt: skip
            else:
                return False

    def _role_call(self, call: ast.Call) -> bool:
        if self._state_call(call, STATE_ROLES):
            return True
        f = call.func
        if isinstance(f, ast.Name):
            return _one_of(self.env(f.id, None), ROLES)
        return (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and _is_radixflow(self.env(f.value.id, None))
                and _one_of(getattr(self.env(f.value.id, None), f.attr, None), ROLES))  # fmt: skip

    def _texty(self, node: ast.AST, text: set) -> bool:
        """An operand that is text both in a real call and while tracing."""
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str)
        if isinstance(node, ast.Name):
            return node.id in text
        if isinstance(node, ast.JoinedStr):
            return True
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self._texty(node.left, text) and self._texty(node.right, text)
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else None
            obj = self.env(name, None) if name else None
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and _is_radixflow(self.env(f.value.id, None)):
                obj = getattr(self.env(f.value.id, None), f.attr, None)
            return _one_of(obj, PRIMITIVES) and not self._state_call(node, STATE_ROLES)
        return False


def _args(a: ast.arguments) -> list:
    return a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x is not None]


def _is_radixflow(obj: Any) -> bool:
    return inspect.ismodule(obj) and obj.__name__ in ("radixflow", "radixflow.lang")


def _one_of(obj: Any, group: frozenset) -> bool:
    return any(obj is x for x in group)  # by identity: a read may be unhashable data
