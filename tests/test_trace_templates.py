"""A program's request graph is traced once and filled in with each call's text arguments
(lang/trace_cache.py, lang/trace_templates.py) only where reading its source proves that the
trace cannot depend on them; the outputs are those of tracing every call."""

from __future__ import annotations

import random
import sys

import pytest

import radixflow as rf
from radixflow.lang.backends.engine_backend import EngineBackend
from radixflow.lang.trace_cache import analyse, key

SUFFIXES = ["\n", "!\n"]
_function_module = sys.modules["radixflow.lang.function"]


@rf.function
def ask(s, context, question, n=1):
    s += context + f"Q: {question}\n"
    for i in range(n):
        s += f"A{i}:" + rf.gen(f"a{i}", max_tokens=3, stop="\n") + SUFFIXES[0]


@rf.function
def judged(s, topic):
    s += rf.user("About " + topic)
    forks = s.fork(2)
    forks += lambda i: f"View {i}: " + topic + rf.gen("view", max_tokens=3)
    forks.join()
    s += rf.assistant(rf.gen("verdict", max_tokens=3))


@rf.function
def by_length(s, topic):
    s += topic + "\n"
    if len(topic) > 5:  # the graph's shape depends on the value: no template may be shared
        s += "Long:" + rf.gen("long", max_tokens=2)
    else:
        s += "Short:" + rf.gen("short", max_tokens=2)


@rf.function
def typed(s, topic):
    s += ("Text: " if isinstance(topic, str) else "Other: ") + topic + rf.gen("x", max_tokens=2)


@rf.function
def fsum(s, q):
    s += f"Q: {q + '!'}\n" + rf.gen("a", max_tokens=2)


@rf.function
def frole(s, q):
    s += f"{rf.user(q)}" + rf.gen("a", max_tokens=2)


@rf.function
def injects(s, q, ctx):
    s += "Q: " + q + "\n" + rf.gen("a", max_tokens=2)
    if ctx:
        s += ctx + rf.gen("b", max_tokens=2)


def _run(fn, calls: list, b, cached: bool, monkeypatch) -> list:
    with monkeypatch.context() as m:
        if not cached:
            m.setattr(_function_module, "prepared", lambda *a, **k: None)
        states = [fn.run(backend=b, temperature=0, max_new_tokens=3, **kw) for kw in calls]
    return [(st.mode, st.text(), st.variables()) for st in states]


@pytest.mark.parametrize("fn, calls", [
    (ask, [{"context": "Facts: sky.\n", "question": "What colour?"}, {"context": "Facts: sea.\n", "question": "Deep?"},
           {"context": "", "question": "Why\\1 $x?", "n": 2}, {"context": "a" * 40, "question": "b", "n": 2}]),
    (judged, [{"topic": "rain"}, {"topic": "snow in the hills"}]),
    (by_length, [{"topic": "cats"}, {"topic": "elephants"}, {"topic": "dogs"}]),
    (typed, [{"topic": "cats"}, {"topic": "fish"}]),
    (fsum, [{"q": "hello"}, {"q": "bye"}]),  # an expression in an f-string field: the trace's repr, once
    (frole, [{"q": "hello"}, {"q": "bye"}]),
])  # fmt: skip
def test_a_template_gives_each_call_its_own_graph(engine, monkeypatch, fn, calls):
    b = EngineBackend.for_engine(engine)
    fn.templates.clear()
    assert _run(fn, calls, b, True, monkeypatch) == _run(fn, calls, b, False, monkeypatch)


def test_text_parameters_are_only_those_the_source_proves_are_text():
    assert analyse(ask.func).text == {"context", "question"}  # n shapes the loop: keyed by value
    assert analyse(judged.func).text == {"topic"}  # in a role call, and in a fork's lambda
    assert analyse(by_length.func).text == frozenset()  # len(topic) decides the branch
    assert analyse(typed.func).text == frozenset()  # isinstance reads it
    assert analyse(fsum.func).text == frozenset()  # f"{q + '!'}" formats an ExprList while tracing
    assert analyse(frole.func).text == frozenset()

    def text_of(src: str):
        scope: dict = {"rf": rf}
        exec(compile(src, "<test>", "exec"), scope)  # no source file: not analysed
        return scope

    assert analyse(text_of("def f(s, q):\n    s += q\n")["f"]) is None

    @rf.function
    def shapes(s, q, k):
        s += q + "x" + k  # k is not known to be text (it is also a gen's max_tokens), so neither is q
        s += str(q) + f"{q!r}" + rf.gen("a", max_tokens=k)

    @rf.function
    def rebinds(s, q):
        q = q + "!"
        s += q + rf.gen("a")

    assert analyse(shapes.func).text == frozenset()
    assert analyse(rebinds.func).text == frozenset()


def test_programs_that_do_more_than_trace_have_no_template():
    @rf.function
    def prints(s, q):
        print(q)
        s += q + rf.gen("a")

    @rf.function
    def draws(s, q):
        s += q + str(random.random()) + rf.gen("a")

    @rf.function
    def helper_call(s, q):
        s += words(q) + rf.gen("a")

    @rf.function
    def methods(s, q):
        s += q.upper() + rf.gen("a")

    @rf.function
    def shadows(s, q):
        forks = s.fork(2)
        forks += lambda s: q + rf.gen("a")

    for fn in (prints, draws, helper_call, methods, shadows):
        assert analyse(fn.func) is None, fn.__name__


def test_augmented_assignment_to_anything_but_the_state_or_a_fork_has_no_template():
    @rf.function
    def appends(s, q, hist):
        hist += ["x"]  # changes the caller's list in place: a cache hit would skip it
        s += q + rf.gen("a")

    @rf.function
    def counts(s, q):
        n = 0
        n *= 2
        s += q + rf.gen("a")

    assert analyse(appends.func) is None and analyse(counts.func) is None
    assert analyse(judged.func) is not None  # `forks += ...` and `s += ...` stay


def test_a_mark_in_any_keyed_value_refuses_the_call(engine):
    """An argument holding a placeholder's text (the mark is random per process, so only code that read it can)."""
    from radixflow.lang.placeholder import MARK

    forged = f"{MARK}arg:0:q{MARK}"  # a placeholder's text: kind, version, name
    a = analyse(injects.func)
    assert a.text == {"q"}
    assert key(injects.func, a, {"q": "x", "ctx": forged}) is None
    assert key(injects.func, a, {"q": "x", "ctx": ["a", {"k": forged}]}) is None
    b = EngineBackend.for_engine(engine)
    with pytest.raises(rf.ProgramError, match="'q'"):  # as when tracing it: not another argument's value
        injects.run(q="SECRET", ctx=forged, backend=b, temperature=0, max_new_tokens=2)


def test_a_replaced_code_object_is_read_again(engine, monkeypatch):
    @rf.function
    def prog(s, q):
        s += "A says " + q + rf.gen("a", max_tokens=2)

    def other(s, q):
        if len(q) > 3:
            s += "LONG " + rf.gen("a", max_tokens=2)
        else:
            s += "SHORT " + rf.gen("a", max_tokens=2)

    b = EngineBackend.for_engine(engine)
    calls = [{"q": "hello"}, {"q": "hi"}]
    before = _run(prog, calls, b, True, monkeypatch)
    k = key(prog.func, analyse(prog.func), {"q": "x"})
    prog.func.__code__ = other.__code__  # as hot-reload tools do
    assert key(prog.func, analyse(prog.func), {"q": "x"}) != k
    after = _run(prog, calls, b, True, monkeypatch)
    assert after == _run(prog, calls, b, False, monkeypatch) and after != before


def words(q):
    return q


def test_the_key_holds_what_else_the_trace_reads():
    a = analyse(ask.func)
    assert a.data == ("SUFFIXES",) and "range" in a.reads and "rf" in a.reads
    k = key(ask.func, a, {"context": "x", "question": "y"})
    assert k == key(ask.func, a, {"context": "other", "question": "text"})  # text values are not in it
    assert k != key(ask.func, a, {"context": "x", "question": "y", "n": 2})
    assert key(ask.func, a, {"context": 1, "question": "y"}) is None  # not exactly a str
    from radixflow.lang.placeholder import MARK

    assert key(ask.func, a, {"context": f"{MARK}arg:0:question{MARK}", "question": "y"}) is None  # the placeholder mark
    assert key(ask.func, a, {"context": "a\x1fb", "question": "y"}) == k  # a bare U+001F is text (the old mark)
    SUFFIXES[0] = "\n\n"
    try:
        assert key(ask.func, a, {"context": "x", "question": "y"}) != k  # a global it reads changed
    finally:
        SUFFIXES[0] = "\n"
    real = rf.gen
    rf.gen = lambda *args, **kwargs: real(*args, **kwargs)  # the primitive it calls, replaced
    try:
        assert key(ask.func, a, {"context": "x", "question": "y"}) is None
    finally:
        rf.gen = real


def test_a_changed_global_is_read_again(engine, monkeypatch):
    b = EngineBackend.for_engine(engine)
    ask.templates.clear()
    calls = [{"context": "Facts: sky.\n", "question": "What colour?"}]
    first = _run(ask, calls, b, True, monkeypatch)
    SUFFIXES[0] = " END\n"
    try:
        changed = _run(ask, calls, b, True, monkeypatch)
        assert changed == _run(ask, calls, b, False, monkeypatch) and changed != first
    finally:
        SUFFIXES[0] = "\n"


def test_a_template_is_checked_once_and_an_error_is_raised_as_before(engine, monkeypatch):
    b = EngineBackend.for_engine(engine)
    ask.templates.clear()
    checks = []
    real = type(b).prepare_graphs
    monkeypatch.setattr(type(b), "prepare_graphs", lambda self, p: checks.append(1) or real(self, p))
    for q in ("a?", "b?", "c?"):
        assert ask.run(context="", question=q, backend=b, temperature=0, max_new_tokens=2).mode == "graph"
    assert len(checks) == 1
    with pytest.raises(rf.ProgramError, match="temperature"):
        ask.run(context="", question="d?", backend=b, temperature=-1.0)
    with pytest.raises(rf.ProgramError, match="temperature"):  # not remembered as passed
        ask.run(context="", question="e?", backend=b, temperature=-1.0)


def test_the_least_recently_used_template_is_dropped(engine, monkeypatch):
    from radixflow.lang import trace_templates

    b = EngineBackend.for_engine(engine)
    ask.templates.clear()
    monkeypatch.setattr(trace_templates, "MAX_TEMPLATES", 2)
    for n in (1, 2, 1, 3):  # n=1 used again: n=2 is the oldest when n=3 comes
        ask.run(context="", question="a?", n=n, backend=b, temperature=0, max_new_tokens=2)
    held = list(ask.templates)
    assert len(held) == 2 and "('n', 1)" in held[0] and "('n', 3)" in held[1]


def test_a_missing_argument_is_left_to_the_calls_own_trace(engine):
    b = EngineBackend.for_engine(engine)
    ask.run(context="", question="a?", backend=b, temperature=0, max_new_tokens=2)  # a template exists
    with pytest.raises(TypeError, match="question"):  # as without templates: eager, and Python's own error
        ask.run(context="", backend=b, temperature=0, max_new_tokens=2)


def test_a_batchs_first_programs_read_the_source_at_once_without_failing():
    """64 program threads asked for the same function's analysis at once; CPython 3.11's ast.parse
    is not safe across threads (a SystemError), so analyse() reads one source at a time."""
    import threading

    from radixflow.lang import trace_cache

    results, errors = [], []

    def read() -> None:
        try:
            results.append(analyse(judged.func))
        except Exception as e:  # noqa: BLE001  the failure this test is for
            errors.append(e)

    for _ in range(3):
        trace_cache._ANALYSED.clear()
        threads = [threading.Thread(target=read) for _ in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == [] and all(r is not None and r.text == {"topic"} for r in results)
