"""The grammar backends behind one interface (llguidance, outlines-core, and the server default auto over both):
MaskBench schemas per split with their instances, refusals that name the keyword and its
JSON pointer, annotations and unknown keywords ignored, ECMA-262 `\\d`, EBNF, the compile
time limit, the compile cache, and bad grammars as 400s with the server still serving."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import tarfile
import threading
import time
from types import SimpleNamespace

import jsonschema
import pytest

from radixflow import GrammarError, RadixflowError
from radixflow.constrained import Grammar, GrammarOptions
from radixflow.constrained.backend import GrammarBackend
from radixflow.constrained.grammar import tokenizer_info

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "maskbench-dev.tar.gz")
# two small schemas with valid and invalid instances per split (llguidance passes them all)
CORPUS_SAMPLES = [
    "Glaiveai2K---calculate_area_7853676d.json", "Glaiveai2K---calculate_area_826daac4.json",  # outlines passes these two
    "Github_easy---o14461.json", "Github_easy---o70019.json", "Github_trivial---o42156.json", "Github_trivial---o17608.json",
    "Kubernetes---kb_768_Normalized.json", "Kubernetes---kb_440_Normalized.json",
    "MCPspec---CompleteResult.json", "MCPspec---JSONRPCRequest.json",
]  # fmt: skip
WS = "[ ]?"  # the corpus' instances use json.dumps' ", " and ": "


@pytest.fixture(scope="module")
def corpus() -> dict:
    if not os.path.isfile(CORPUS):
        pytest.skip("../shared/data/maskbench-dev.tar.gz is not here")
    wanted = set(CORPUS_SAMPLES)
    docs = {}
    with tarfile.open(CORPUS) as tar:
        for member in tar:
            name = os.path.basename(member.name)
            if name in wanted:
                docs[name] = json.load(tar.extractfile(member))
    assert set(docs) == wanted, f"missing from the corpus: {wanted - set(docs)}"
    return docs


def check_instances(g: Grammar, doc: dict) -> None:
    for test in doc["tests"]:
        text = json.dumps(test["data"], ensure_ascii=False)
        assert g.accepts(text) == test["valid"], (test["description"], text[:200])


def test_corpus_schemas_per_split_llguidance(corpus, engine):
    for name in CORPUS_SAMPLES:
        doc = corpus[name]
        assert any(not t["valid"] for t in doc["tests"]) and any(t["valid"] for t in doc["tests"]), name
        check_instances(Grammar.from_json_schema(doc["schema"], engine.tokenizer, backend="llguidance", whitespace=WS), doc)


def test_corpus_schemas_outlines(corpus, engine):
    for name in CORPUS_SAMPLES[:2]:
        doc = corpus[name]
        check_instances(Grammar.from_json_schema(doc["schema"], engine.tokenizer, backend="outlines", whitespace=WS), doc)


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
def test_regex_goes_on_past_a_point_where_it_may_end(backend):
    """outlines-core 0.2.14 itself drops a token whose last byte leaves such a point (after
    `12`, `.`); fsm.py indexes each regex with an end marker instead."""
    cases = [("a(;c)?", ["a", "a;c"], ["a;", "ac"]), (r"[0-9]+(\.[0-9]+)?", ["12", "12.5"], ["12.", ".5"]),
             (r"x(\ny)*", ["x", "x\ny\ny"], ["x\n"])]  # fmt: skip
    for regex, good, bad in cases:
        g = Grammar.from_regex(regex, backend=backend)
        assert all(g.accepts(t) for t in good) and not any(g.accepts(t) for t in bad), regex


def test_outlines_refuses_a_regex_that_needs_nul():
    """The end marker is NUL, so the outlines backend never emits it; a regex that needs it is a clear error."""
    with pytest.raises(GrammarError, match="no token sequence completes it"):
        Grammar.from_regex(r"a\x00", backend="outlines")
    assert Grammar.from_regex(r"a[\x00-\x01]", backend="outlines").accepts("a\x01")


def test_default_tokenizer_and_public_errors():
    """tokenizer=None is the default model's; the error is radixflow.GrammarError."""
    g = Grammar.from_regex(r"(yes|no)")
    assert g.accepts("yes") and not g.accepts("maybe") and not g.accepts("ye")
    with pytest.raises(GrammarError, match="unknown grammar option"):
        Grammar.from_regex("a", whitespce="x")
    assert issubclass(GrammarError, RadixflowError)



def test_an_llguidance_older_than_the_pin_is_refused_with_the_fix(engine, monkeypatch):
    """llguidance 1.6 took one EOS id: each grammar failed with a TypeError ending "simplify it"
    (session 23's GPU carry had that wheel). Now building the llguidance backend refuses it and
    says which version to install; the message is what a constrained request's error carries."""
    from radixflow.constrained import grammar, llguidance_tokenizer
    from radixflow.constrained.backend import _message

    for ok in ("1.9.1", "1.10.0", "1.9.2.post1", "2.0.0"):
        llguidance_tokenizer.check_version(ok)
    with pytest.raises(GrammarError, match=r"llguidance 1\.6\.1 is installed.*pip install 'llguidance>=1\.9\.1,<2'") as e:
        llguidance_tokenizer.check_version("1.6.1")
    assert _message(e.value) == str(e.value)  # not "the grammar could not be compiled ...; simplify it"
    monkeypatch.setattr(llguidance_tokenizer.metadata, "version", lambda name: "1.6.1")
    info = tokenizer_info(engine.tokenizer)
    with pytest.raises(GrammarError, match="--grammar-backend outlines"):
        grammar._backend.__wrapped__("llguidance", info)  # past the cache of backends already built
    assert grammar._backend.__wrapped__("outlines", info) is not None


@pytest.mark.parametrize(
    "backend,schema,keyword,pointer",
    [
        ("llguidance", {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "not", "/properties/a/not"),
        ("outlines", {"type": "object", "properties": {"t": {"type": "array", "uniqueItems": True}}}, "uniqueItems", "/properties/t/uniqueItems"),
        ("llguidance", {"$defs": {"x": {"type": "string", "format": "no-such-format"}}, "$ref": "#/$defs/x"}, "format", "/$defs/x/format"),
    ],
)
def test_refusals_name_the_keyword_and_its_pointer(engine, backend, schema, keyword, pointer):
    with pytest.raises(GrammarError) as info:
        Grammar.from_json_schema(schema, engine.tokenizer, backend=backend)
    assert (info.value.keyword, info.value.pointer) == (keyword, pointer)
    assert keyword in str(info.value) and pointer in str(info.value)


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
def test_annotations_and_unknown_keywords_are_ignored_and_digits_are_ascii(engine, backend):
    schema = {
        "type": "object", "id": "thing", "readonly": True, "x-vendor": {"a": 1}, "preferredOrder": ["n"],
        "properties": {"n": {"type": "string", "pattern": r"^\d{2}$", "name": "n", "self": {}}},
        "required": ["n"], "additionalProperties": False,
    }  # fmt: skip
    g = Grammar.from_json_schema(schema, engine.tokenizer, backend=backend, whitespace=WS)
    assert g.accepts('{"n": "42"}')
    assert not g.accepts('{"n": "4\u0be9"}')  # TAMIL DIGIT THREE is no ECMA-262 \d
    assert not g.accepts('{"n": "421"}') and not g.accepts('{"n": 42}')


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
def test_arrays_of_free_items_keep_their_counts(engine, backend):
    """An array with minItems / maxItems and no items: on outlines its item regex (any value, two containers deep)
    was repeated per counted item, and maxItems 3 ran past the 10 s compile limit; it now compiles in about a second
    (items nest one container less, as in an unbounded free array)."""
    cases = [({"type": "array", "maxItems": 3}, ['[]', '[1, "x", null]', '[{"a": 1}, [2]]'], ['[1, 2, 3, 4]']),
             ({"type": "array", "items": {}, "minItems": 1, "maxItems": 2}, ['[true]', '[[], {}]'], ['[]', '[1, 2, 3]']),
             ({"type": "array", "minItems": 2}, ['[1, 2]', '[1, 2, 3, 4, 5]'], ['[1]'])]  # fmt: skip
    for schema, good, bad in cases:
        g = Grammar.from_json_schema(schema, engine.tokenizer, backend=backend, whitespace=WS)
        assert all(g.accepts(t) for t in good) and not any(g.accepts(t) for t in bad), schema


def test_huge_enums_and_deep_nesting_are_refused_clearly(engine):
    with pytest.raises(GrammarError, match="too large"):
        Grammar.from_json_schema({"enum": list(range(200_000))}, engine.tokenizer, backend="llguidance")
    deep = {"type": "integer"}
    for _ in range(400):
        deep = {"type": "array", "items": deep}
    for backend in ("llguidance", "outlines"):
        with pytest.raises(GrammarError, match="nested too deeply"):
            Grammar.from_json_schema(deep, engine.tokenizer, backend=backend)


def test_ebnf_lark_and_gbnf(engine):
    lark = Grammar.from_ebnf('start: "yes" | "no" | NUM\nNUM: /[0-9]{2}/', engine.tokenizer)
    assert lark.accepts("yes") and lark.accepts("42") and not lark.accepts("4") and not lark.accepts("maybe")
    gbnf = Grammar.from_ebnf('root ::= "id-" [0-9]+', engine.tokenizer)
    assert gbnf.accepts("id-7") and not gbnf.accepts("id-") and not gbnf.accepts("x")
    with pytest.raises(GrammarError, match="ebnf"):
        Grammar.from_ebnf("start: (", engine.tokenizer)


def test_ebnf_sampling_parameter_through_the_engine(engine):
    outs = engine.generate(
        ["Is the sky blue? Answer:", "Pick a number:"],
        [{"ebnf": 'start: "yes" | "no"', "max_new_tokens": 4, "temperature": 1.0, "sampling_seed": 1},
         {"ebnf": 'root ::= [1-9] [0-9]', "max_new_tokens": 4, "temperature": 0}],
    )  # fmt: skip
    assert outs[0]["text"] in ("yes", "no")
    assert len(outs[1]["text"]) == 2 and outs[1]["text"].isdigit()


def _backend(engine, **args) -> GrammarBackend:
    args = {"grammar_backend": "llguidance", **args}
    return GrammarBackend(engine.tokenizer, engine.runner.vocab_size, engine.eos_ids, SimpleNamespace(**args))


class FakeReq:
    def __init__(self, kind: str, spec, max_new_tokens: int = 64):
        self.sampling = SimpleNamespace(grammar=(kind, spec), max_new_tokens=max_new_tokens)
        self.output_ids, self.segment_start, self.streamed, self.stop_checked = [], 0, False, 0
        self.jump_forward_tokens, self.grammar, self.finish_reason = 0, None, None
        self.logprob = SimpleNamespace(return_logprob=False)

    @property
    def segment_len(self) -> int:
        return len(self.output_ids) - self.segment_start

    def finish(self, reason: dict) -> None:
        self.finish_reason = reason

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def _poll(backend: GrammarBackend, req: FakeReq) -> bool:
    deadline = time.monotonic() + 120
    while (ready := backend.poll(req)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return ready


def test_jump_forward_on_llguidance(engine):
    """llguidance appends the tokens the grammar forces (before the first sample
    and after sampled ones) without sampling them."""
    backend = _backend(engine)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}  # fmt: skip
    req = FakeReq("json_schema", json.dumps(schema))
    backend.submit(req)
    assert _poll(backend, req) is True
    decode = engine.tokenizer.decode
    assert decode(req.output_ids).startswith('{"n') and req.jump_forward_tokens == len(req.output_ids)
    for t in engine.tokenizer.encode(decode(req.output_ids) + '":"Bo",', add_special_tokens=False)[len(req.output_ids) :]:
        req.output_ids.append(t)
        req.grammar.accept_token(t)
    forced = backend.jump_forward(req)
    assert forced and decode(req.output_ids + forced).startswith('{"name":"Bo","a')
    backend.cache.pool.shutdown(wait=False)


def _matcher_class(backend: GrammarBackend, kind: str, spec) -> str:
    req = FakeReq(kind, spec)
    backend.submit(req)
    assert _poll(backend, req) is True, req.finish_reason
    return type(req.grammar).__name__


def test_auto_moves_a_busy_grammar_to_outlines(engine, monkeypatch):
    """auto (the server default): a grammar's requests start on llguidance; from its
    PROMOTE_AFTER-th request it is compiled on outlines in the background, and once that is done
    its new requests run on outlines. ebnf, grammars outlines refuses, tensor-parallel servers and
    CPU schedulers stay on llguidance."""
    from radixflow.constrained.options import PROMOTE_AFTER

    backend = _backend(engine, grammar_backend="auto")
    regex = r"[0-9]{3}-[0-9]{4}"
    assert [_matcher_class(backend, "regex", regex) for _ in range(PROMOTE_AFTER)] == ["LLGuidanceMatcher"] * PROMOTE_AFTER
    backend.wait_for_moves()
    assert _matcher_class(backend, "regex", regex) == "GrammarMatcher"
    assert backend.mover.compile_of("regex", regex).result().compile_s > 0 and backend.mover.compile_of("regex", "[a-z]{3}") is None
    assert _matcher_class(backend, "regex", r"[a-z]{3}") == "LLGuidanceMatcher", "another grammar is not busy yet"

    monkeypatch.setattr(backend.impl_named("outlines"), "compile", lambda *a, **k: (_ for _ in ()).throw(GrammarError("refused")))
    for _ in range(PROMOTE_AFTER):
        _matcher_class(backend, "regex", "[0-9]{2}")
    backend.wait_for_moves()
    assert _matcher_class(backend, "regex", "[0-9]{2}") == "LLGuidanceMatcher", "outlines refused it"
    for _ in range(PROMOTE_AFTER + 1):
        assert _matcher_class(backend, "ebnf", 'start: "a" | "b"') == "LLGuidanceMatcher"
    backend.cache.pool.shutdown(wait=False)
    assert _backend(engine, grammar_backend="auto", tp_size=2).mover is None
    from radixflow.runtime.scheduling.grammar_wait import start_grammar_backend

    from radixflow.runtime.server_args import ServerArgs

    # what the scheduler builds: auto, the default, moves only on a GPU; llguidance never moves
    for args, device, moves in ((SimpleNamespace(grammar_backend="auto"), "cpu", False), (SimpleNamespace(grammar_backend="auto"), "cuda:0", True),
                                (ServerArgs(), "cuda:0", True), (ServerArgs(), "cpu", False),
                                (SimpleNamespace(grammar_backend="llguidance"), "cuda:0", False)):  # fmt: skip
        sched = SimpleNamespace(grammar_backend=None, tokenizer=engine.tokenizer, runner=engine.runner, eos_ids=engine.eos_ids,
                                args=args, device=device)  # fmt: skip
        assert (start_grammar_backend(sched).mover is not None) == moves, device
        assert sched.grammar_backend.name == args.grammar_backend
        sched.grammar_backend.cache.pool.shutdown(wait=False)


def _busy(backend: GrammarBackend, regex: str, n: int = 0) -> list:
    """Sends `regex` n times (PROMOTE_AFTER by default); the matcher class of each request."""
    from radixflow.constrained.options import PROMOTE_AFTER

    return [_matcher_class(backend, "regex", regex) for _ in range(n or PROMOTE_AFTER)]


def test_auto_runs_one_background_compile_at_a_time(engine, monkeypatch):
    """A second busy grammar waits for the first one's outlines compile (no queue of compiles,
    each pausing the scheduler); its next request after that starts its own."""
    backend = _backend(engine, grammar_backend="auto")
    outlines, release, started = backend.impl_named("outlines"), threading.Event(), []
    compile_fn = outlines.compile

    def slow(kind, spec, *a, **k):
        started.append(spec)
        release.wait(60)
        return compile_fn(kind, spec, *a, **k)

    monkeypatch.setattr(outlines, "compile", slow)
    try:
        _busy(backend, r"[0-9]{3}")
        _busy(backend, r"[a-z]{3}")
        assert list(backend.mover.compiles.entries) == [("outlines", "regex", r"[0-9]{3}", backend.options)]
    finally:
        release.set()
    backend.wait_for_moves()
    assert _busy(backend, r"[a-z]{3}", 1) == ["LLGuidanceMatcher"], "this request starts its compile"
    backend.wait_for_moves()
    assert started == [r"[0-9]{3}", r"[a-z]{3}"]
    assert _busy(backend, r"[a-z]{3}", 1) == ["GrammarMatcher"] and _busy(backend, r"[0-9]{3}", 1) == ["GrammarMatcher"]
    backend.cache.pool.shutdown(wait=False)


def test_auto_keeps_the_most_recently_used_moved_grammars(engine):
    """The moved grammars are a real LRU: a grammar in use is refreshed, so the one evicted is
    the least recently used, not the first moved."""
    backend = _backend(engine, grammar_backend="auto")
    backend.mover.compiles.capacity = 2
    for regex in (r"[0-9]{2}", r"[0-9]{3}"):
        _busy(backend, regex)
        backend.wait_for_moves()
    assert _busy(backend, r"[0-9]{2}", 1) == ["GrammarMatcher"]  # used last: kept
    _busy(backend, r"[0-9]{4}")
    backend.wait_for_moves()
    kept = {key[2] for key in backend.mover.compiles.entries}
    assert kept == {r"[0-9]{2}", r"[0-9]{4}"}, kept
    backend.cache.pool.shutdown(wait=False)


def test_auto_refuses_moves_over_its_bounds(engine, monkeypatch):
    """A grammar whose byte-level DFA is over the state bound stays on llguidance without its
    token index ever being built; a compile over the time bound is stopped (its process killed),
    one over the size bound refused before its arrays are sent; a refused grammar is not compiled again,
    also after the request counts restart."""
    import radixflow.constrained.auto_move as move_module
    import radixflow.constrained.outlines_grammars as outlines_module

    built = []
    compile_isolated = outlines_module.compile_isolated
    monkeypatch.setattr(outlines_module, "compile_isolated", lambda rx, *a: (built.append(rx), compile_isolated(rx, *a))[1])
    backend = _backend(engine, grammar_backend="auto")
    monkeypatch.setattr(move_module, "MOVE_MAX_DFA_STATES", 5)
    _busy(backend, r"[0-9]{3}-[0-9]{4}")
    backend.wait_for_moves()
    assert _busy(backend, r"[0-9]{3}-[0-9]{4}", 2) == ["LLGuidanceMatcher"] * 2 and built == []
    monkeypatch.setattr(move_module, "MOVE_MAX_DFA_STATES", 10**6)
    for limit, max_bytes, regex in ((0.0, 1 << 40, r"[a-z]{2}"), (60.0, 1, r"[a-z]{3}")):
        backend.mover.limit_s = limit
        monkeypatch.setattr(move_module, "MOVE_MAX_BYTES", max_bytes)
        _busy(backend, regex)
        backend.wait_for_moves()
        assert _busy(backend, regex, 3) == ["LLGuidanceMatcher"] * 3, (limit, max_bytes)
    assert len(built) == 2, "each refused grammar was compiled once, not again"
    backend.mover.counts.update({("count", i): 1 for i in range(move_module.MAX_COUNTED + 1)})
    _busy(backend, r"[0-9]{2}", 1)  # a new grammar's request: the counts restart
    assert len(backend.mover.counts) == 1
    n = move_module.PROMOTE_AFTER + 1  # enough requests to start a move, were it not refused
    assert _busy(backend, r"[a-z]{3}", n) == ["LLGuidanceMatcher"] * n
    backend.wait_for_moves()
    assert len(built) == 2, "the request counts restarted (past MAX_COUNTED grammars); the refusals did not"
    backend.cache.pool.shutdown(wait=False)


def test_auto_refuses_a_move_as_it_fails_or_before_it_starts(engine, monkeypatch):
    """A move that fails is refused, and leaves the moved grammars' LRU, when it fails, not on the
    grammar's next request; a grammar compiled from its spec (no outlines regex) is refused at its
    PROMOTE_AFTER-th request without a move being started."""
    from radixflow.constrained.options import PROMOTE_AFTER

    backend = _backend(engine, grammar_backend="auto")
    monkeypatch.setattr(backend.impl_named("outlines"), "compile", lambda *a, **k: (_ for _ in ()).throw(GrammarError("refused")))
    spec = json.dumps({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 3}}, "required": ["a"]})
    try:
        _busy(backend, r"[0-9]{2}")
        backend.wait_for_moves()
        assert ("outlines", "regex", r"[0-9]{2}", backend.options) in backend.mover.refused and not backend.mover.compiles.entries
        assert backend.compile("json_schema", spec).regex is None
        started: list = []
        monkeypatch.setattr(backend.mover, "_compile", lambda *a: started.append(a))
        assert [_matcher_class(backend, "json_schema", spec) for _ in range(PROMOTE_AFTER)] == ["LLGuidanceMatcher"] * PROMOTE_AFTER
        assert started == [] and ("outlines", "json_schema", spec, backend.options) in backend.mover.refused
    finally:
        backend.cache.pool.shutdown(wait=False)


def test_auto_makes_and_checks_a_moved_grammars_regex_once(engine, monkeypatch):
    """A grammar's llguidance compile and its move to outlines turn the spec into a regex once,
    and check the spec once (the move compiles outlines from the regex its llguidance compile kept)."""
    import collections

    import radixflow.constrained.grammar as grammar_module
    from radixflow.constrained.options import PROMOTE_AFTER
    import radixflow.constrained.outlines_grammars as outlines_module
    import radixflow.constrained.spec as spec_module

    calls: collections.Counter = collections.Counter()

    def counted(name, fn):
        return lambda *a, **k: (calls.update([name]), fn(*a, **k))[1]

    to_regex, check_spec = counted("to_regex", spec_module.to_regex), counted("check_spec", spec_module.check_spec)
    for module, name, fn in ((spec_module, "to_regex", to_regex), (outlines_module, "to_regex", to_regex),
                             (spec_module, "check_spec", check_spec), (grammar_module, "check_spec", check_spec)):  # fmt: skip
        monkeypatch.setattr(module, name, fn)
    backend, spec = _backend(engine, grammar_backend="auto"), json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})
    try:
        assert [_matcher_class(backend, "json_schema", spec) for _ in range(PROMOTE_AFTER)][0] == "LLGuidanceMatcher"
        backend.wait_for_moves()
        assert _matcher_class(backend, "json_schema", spec) == "GrammarMatcher"
    finally:
        backend.cache.pool.shutdown(wait=False)
    assert calls == {"to_regex": 1, "check_spec": 1}, calls


def _feed(req: FakeReq, ids: list) -> None:
    for t in ids:
        req.output_ids.append(t)
        req.grammar.accept_token(t)


def test_auto_switches_rows_that_started_before_the_move(engine):
    """Requests on llguidance when their grammar's move finishes: one polled after it starts on outlines;
    running rows go on on outlines from the state their tokens lead to, once (switch_moved), except a
    row whose budget no longer fits outlines' shortest completion and rows of another grammar."""
    from radixflow.constrained.options import PROMOTE_AFTER

    backend, regex = _backend(engine, grammar_backend="auto"), r"[0-9]{3}-[0-9]{4}"
    head = engine.tokenizer.encode("123-4", add_special_tokens=False)
    try:
        rows = [FakeReq("regex", regex) for _ in range(PROMOTE_AFTER)] + [FakeReq("regex", r"[a-z]{3}")]
        for req in rows:
            backend.submit(req)
            assert _poll(backend, req) is True
            _feed(req, head if req.sampling.grammar[1] == regex else [])
        rows[0].sampling.max_new_tokens = len(head) + 1  # "567" takes more than one token
        late = FakeReq("regex", regex)
        backend.submit(late)  # before the move is done: its job is llguidance's
        backend.wait_for_moves()
        assert _poll(backend, late) is True and type(late.grammar).__name__ == "GrammarMatcher"
        assert backend.switch_moved(rows) == PROMOTE_AFTER - 1 and backend.switch_moved(rows) == 0
    finally:
        backend.cache.pool.shutdown(wait=False)
    classes = [type(r.grammar).__name__ for r in rows]
    assert classes == ["LLGuidanceMatcher"] + ["GrammarMatcher"] * (PROMOTE_AFTER - 1) + ["LLGuidanceMatcher"], classes
    g = rows[1].grammar.grammar
    assert all(r.grammar.state == g.walk(g.initial_state, head) for r in rows[1:-1])


def test_auto_switches_rows_of_a_move_that_another_move_followed(engine):
    """A grammar's move finishes and a second grammar's move starts before any step has seen the first one
    done: the next switch_moved still switches the first grammar's running rows, with the second's."""
    from radixflow.constrained.options import PROMOTE_AFTER

    backend, specs = _backend(engine, grammar_backend="auto"), (r"[0-9]{3}-[0-9]{4}", r"[a-z]{3}-[0-9]{2}")
    rows: dict = {spec: [] for spec in specs}
    try:
        for spec in specs:
            for _ in range(PROMOTE_AFTER):
                rows[spec].append(FakeReq("regex", spec))
                backend.submit(rows[spec][-1])
                assert _poll(backend, rows[spec][-1]) is True
            backend.wait_for_moves()  # this grammar's move is done, and no step has seen it
            assert backend.mover.compile_of("regex", spec) is not None, "the move started"
        on_llguidance = [r for spec in specs for r in rows[spec] if r.grammar.backend == "llguidance"]
        assert {r.sampling.grammar[1] for r in on_llguidance} == set(specs), "rows of both grammars started on llguidance"
        assert backend.switch_moved(on_llguidance) == len(on_llguidance) and backend.switch_moved(on_llguidance) == 0
    finally:
        backend.cache.pool.shutdown(wait=False)
    assert all(r.grammar.backend == "outlines" for spec in specs for r in rows[spec])


def _moved_rows(engine, regex: str, head: list, n: int = 0):
    """An auto backend whose `regex` has moved, with n rows (PROMOTE_AFTER by default) polled on llguidance
    before the move finished, each fed `head`; no switch call has seen the move yet."""
    from radixflow.constrained.options import PROMOTE_AFTER

    backend = _backend(engine, grammar_backend="auto")
    rows = [FakeReq("regex", regex) for _ in range(n or PROMOTE_AFTER)]
    for req in rows:
        backend.submit(req)
        assert _poll(backend, req) is True and req.grammar.backend == "llguidance"
        _feed(req, head)
    backend.wait_for_moves()
    return backend, rows


def test_auto_tracks_rows_per_grammar_and_skips_refused_ones(engine):
    """Rows of a grammar the mover refused never switch: they are not tracked (no per-step work for them);
    the rest are kept per grammar, so a finished move walks only its own grammar's rows."""
    backend = _backend(engine, grammar_backend="auto")
    mover, refused, movable = backend.mover, r"[0-9]{3}-[0-9]{4}", r"[a-z]{2}-[0-9]{3}"
    mover.refused[mover.key("regex", refused)] = True
    try:
        rows = [FakeReq("regex", spec) for spec in (refused, movable, movable)]
        for req in rows:
            backend.submit(req)
            assert _poll(backend, req) is True and req.grammar.backend == "llguidance"
    finally:
        backend.cache.pool.shutdown(wait=False)
    assert list(mover._rows) == [("regex", movable)] and set(mover._rows[("regex", movable)]) == set(rows[1:])


def test_auto_switches_running_rows_after_a_call_with_only_new_rows(engine):
    """The first call that sees the move finished holds only a row that just finished its prefill (an extend
    step's): the running rows still switch in their own step's call, and none is tried twice."""
    regex = r"[0-9]{3}-[0-9]{4}"
    backend, rows = _moved_rows(engine, regex, engine.tokenizer.encode("123-4", add_special_tokens=False))
    try:
        late = FakeReq("regex", regex)
        backend.submit(late)
        assert _poll(backend, late) is True and late.grammar.backend == "outlines"
        assert backend.switch_moved([late]) == 0
        assert backend.switch_moved(rows) == len(rows) and backend.switch_moved(rows) == 0
    finally:
        backend.cache.pool.shutdown(wait=False)
    assert all(r.grammar.backend == "outlines" for r in rows)


def test_auto_switch_keeps_a_budget_closed_finish(engine):
    """A row llguidance closed early to fit its budget and that then switched still finishes as a length
    finish with grammar_closed, not as a stop."""
    from radixflow.runtime.scheduling.stop_checker import StopChecker

    regex, encode = r"[0-9]{3}-[0-9]{4}", lambda text: engine.tokenizer.encode(text, add_special_tokens=False)
    backend, rows = _moved_rows(engine, regex, encode("123-4"), n=8)
    try:
        rows[0].grammar.budget_closed = True  # as llguidance sets it when its mask narrowed to fit the budget
        assert backend.switch_moved(rows) == len(rows)
    finally:
        backend.cache.pool.shutdown(wait=False)
    checker = StopChecker(engine.tokenizer, engine.eos_ids)
    for req in rows[:2]:
        req.rid, req.seq_len = "r", 0
        req.sampling.__dict__.update(ignore_eos=False, stop_token_ids=None, stop_strs=None, stop_patterns=None)
        _feed(req, encode("567"))
        assert req.grammar.is_terminated()
        checker.check(req, 10**6)
    assert rows[0].finish_reason["type"] == "length" and rows[0].finish_reason["grammar_closed"], rows[0].finish_reason
    assert rows[1].finish_reason["type"] == "stop", rows[1].finish_reason


def test_auto_switched_rows_jump_as_rows_that_started_on_outlines(engine):
    """A switched row is an outlines row for the jump policy: at any state, with or without cuts (appends
    only above --jump-forward-max-batch under overlap), it jumps as a row that started on outlines."""
    regex, encode = r"\(?[0-9]{3}\) [0-9]{3}-[0-9]{4} \((home|work)\)", lambda t: engine.tokenizer.encode(t, add_special_tokens=False)
    heads, jumps = ["(1", "(123", "(123) 4", "(123) 456-7890", "(123) 456-7890 (h"], {}
    backend, _ = _moved_rows(engine, regex, [])
    try:
        for head, cut in itertools.product(heads, (True, False)):
            switched, native = FakeReq("regex", regex), FakeReq("regex", regex)
            llguidance = backend.compile_async("regex", regex).result()
            switched.grammar = backend.impl_named("llguidance").matcher(llguidance, switched, backend.cache.pool)
            backend.mover.track(switched)
            native.grammar = backend.impl_named("outlines").matcher(backend.mover.moved("regex", regex), native)
            _feed(switched, encode(head))
            _feed(native, encode(head))
            assert backend.switch_moved([switched]) == 1, head
            assert switched.grammar.jumps_in_any_batch and type(switched.grammar) is type(native.grammar)
            jumps[head, cut] = backend.jump_forward(native, True, None, cut)
            assert backend.jump_forward(switched, True, None, cut) == jumps[head, cut], (head, cut)
    finally:
        backend.cache.pool.shutdown(wait=False)
    cuts = [head for head in heads if isinstance(jumps[head, True], tuple)]
    assert cuts and not any(isinstance(jumps[head, False], tuple) for head in heads), "a head whose jump cuts, appended without"


def test_auto_rows_switch_to_outlines_mid_batch_through_the_scheduler(engine, monkeypatch):
    """Through the engine: a batch that starts on llguidance while its grammar's move runs goes on on
    outlines once the move finishes (here: made to finish after the batch's third step), every output valid;
    every row still running at the release switched, or has a repair pending / stays (outlines' shortest
    completion no longer fits its budget). The scheduler's stats count the rows switched."""
    from radixflow.constrained.options import PROMOTE_AFTER

    sched = engine.scheduler
    saved = (sched.grammar_backend, sched.jump_forward, engine.builder.grammar_backend)
    switched_before = sched.stats.grammar_rows_switched
    backend = _backend(engine, grammar_backend="auto")
    sched.grammar_backend, sched.jump_forward, engine.builder.grammar_backend = backend, backend.jump_forward, "auto"
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}},
              "required": ["name", "tags"], "additionalProperties": False}  # fmt: skip
    release, calls, switched, left = threading.Event(), [], [], []
    move, switch = backend.mover._compile_outlines, backend.switch_moved
    monkeypatch.setattr(backend.mover, "_compile_outlines", lambda *a: (release.wait(120), move(*a))[1])

    def counted(reqs):
        calls.append(1)
        if len(calls) == 3:
            release.set()
            backend.wait_for_moves()
        switched.append(switch(reqs))
        if release.is_set():  # rows that stay on llguidance after the move, and why
            left.extend((r.grammar.undo, r in backend.mover._staying) for r in reqs if not r.finished and r.grammar.backend == "llguidance")
        return switched[-1]

    monkeypatch.setattr(backend, "switch_moved", counted)
    params = {"temperature": 1, "max_new_tokens": 60, "json_schema": json.dumps(schema)}
    try:
        outs = engine.generate([f"Person {i}:" for i in range(PROMOTE_AFTER)], [params] * PROMOTE_AFTER)
    finally:
        release.set()
        backend.cache.pool.shutdown(wait=False)
        sched.grammar_backend, sched.jump_forward, engine.builder.grammar_backend = saved
    assert sum(switched) > 0 and all(undo or staying for undo, staying in left), (switched, left)
    assert sched.stats.grammar_rows_switched - switched_before == sum(switched)
    for out in outs:
        jsonschema.validate(json.loads(out["text"]), schema)


@pytest.mark.parametrize("overlap", [False, True])
def test_auto_running_rows_switch_after_an_extend_step_saw_the_move_first(engine, monkeypatch, overlap):
    """Through the scheduler: a request of the grammar arrives mid-batch while the move runs, and the move
    finishes just before that request's extend step advances it (the first call to see the move done holds
    only that row): the running rows still switch in their own next step (each one left on llguidance has a
    repair pending, or outlines' shortest completion no longer fits its budget). Under overlap above
    --jump-forward-max-batch (0 here) the switched rows jump as rows that started on outlines: appending only."""
    from radixflow.constrained.options import PROMOTE_AFTER
    from radixflow.runtime.generate_request import GenerateInput

    sched = engine.scheduler
    saved = (sched.grammar_backend, sched.jump_forward, engine.builder.grammar_backend, sched.overlap, sched.args)
    backend = _backend(engine, grammar_backend="auto")
    sched.grammar_backend, sched.jump_forward, engine.builder.grammar_backend = backend, backend.jump_forward, "auto"
    sched.overlap, sched.args = overlap, dataclasses.replace(sched.args, jump_forward_max_batch=0)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}},
              "required": ["name", "tags"], "additionalProperties": False}  # fmt: skip
    params = {"temperature": 1, "max_new_tokens": 60, "json_schema": json.dumps(schema)}
    batch = engine.builder.build(GenerateInput(text=[f"Person {i}:" for i in range(PROMOTE_AFTER)], sampling_params=[params] * PROMOTE_AFTER))
    late = engine.builder.build(GenerateInput(text="Another person:", sampling_params=params))[0]
    release, calls, switched, jumps, left, released_at = threading.Event(), [], [], [], [], []
    move, switch, jump = backend.mover._compile_outlines, backend.switch_moved, backend.jump_forward
    monkeypatch.setattr(backend.mover, "_compile_outlines", lambda *a: (release.wait(120), move(*a))[1])

    def counted(reqs):
        calls.append(1)
        if len(calls) == 3:
            sched.add_request(late)  # compiled already: polled while the move runs, so on llguidance
        if reqs == [late] and not release.is_set():
            release.set()
            backend.wait_for_moves()
            released_at.append(len(switched))
        switched.append(switch(reqs))
        if release.is_set():  # rows that stay on llguidance after the move, and why
            left.extend((r.grammar.undo, r in backend.mover._staying) for r in reqs if not r.finished and r.grammar.backend == "llguidance")
        return switched[-1]

    def jumped(req, allowed=True, limit=None, cut=True):
        if req.grammar is not None and req.grammar.backend == "outlines":
            jumps.append((allowed, cut))
        return jump(req, allowed, limit, cut)

    monkeypatch.setattr(backend, "switch_moved", counted)
    sched.jump_forward = jumped
    try:
        engine._run(batch)
        engine.stepper.run_until(lambda: late.finished)
    finally:
        release.set()
        backend.cache.pool.shutdown(wait=False)
        sched.grammar_backend, sched.jump_forward, engine.builder.grammar_backend, sched.overlap, sched.args = saved
    assert released_at, "the move finished at the late request's own step"
    assert sum(switched[released_at[0] + 1 :]) > 0, (released_at, switched)  # the running rows, in later calls
    assert all(undo or staying for undo, staying in left), left
    assert jumps and (not overlap or set(jumps) == {(True, False)}), set(jumps)
    for req in [*batch, late]:
        jsonschema.validate(json.loads(engine.tokenizer.decode(req.output_ids)), schema)


def test_auto_serves_both_backends_in_one_batch(engine):
    """Through the engine: a batch whose schema has been promoted beside a newer one still on
    llguidance; every output is valid, and both backends' rows jump forward."""
    from radixflow.constrained.options import PROMOTE_AFTER

    sched = engine.scheduler
    saved = (sched.grammar_backend, sched.jump_forward, engine.builder.grammar_backend)
    backend = _backend(engine, grammar_backend="auto")
    sched.grammar_backend, sched.jump_forward, engine.builder.grammar_backend = backend, backend.jump_forward, "auto"
    schemas = [{"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["name", "age"], "additionalProperties": False},
               {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}]  # fmt: skip
    params = lambda i: {"temperature": 0, "max_new_tokens": 40, "json_schema": json.dumps(schemas[i])}  # noqa: E731
    seen = []
    poll = backend.poll
    backend.poll = lambda req: (ok := poll(req), ok and seen.append(type(req.grammar).__name__))[0]  # noqa: E731
    try:
        engine.generate(["Person:"] * PROMOTE_AFTER, [params(0)] * PROMOTE_AFTER)
        backend.wait_for_moves()
        seen.clear()
        outs = engine.generate(["Person:", "Another person:", "Status:"], [params(0), params(0), params(1)])
    finally:
        backend.cache.pool.shutdown(wait=False)
        sched.grammar_backend, sched.jump_forward, engine.builder.grammar_backend = saved
    assert sorted(seen) == ["GrammarMatcher", "GrammarMatcher", "LLGuidanceMatcher"]
    for out, i in zip(outs, (0, 0, 1)):
        jsonschema.validate(json.loads(out["text"]), schemas[i])
        assert out["meta_info"].get("jump_forward_tokens", 0) > 0


def test_a_matcher_in_error_fails_its_request_with_the_matchers_message(engine, monkeypatch):
    """A broken llguidance matcher (here fed a token its grammar refuses, as a misread tokenizer
    would) masks all but EOS: the request must fail with a server error carrying llguidance's
    message, not end as a "stop" with a cut-short output; the engine keeps serving."""
    from radixflow.constrained.llguidance_grammars import LLGuidanceMatcher

    consumed, refused = LLGuidanceMatcher._consumed, engine.tokenizer.encode("zz", add_special_tokens=False)[0]

    def consumed_then_broken(self, token, ok):
        consumed(self, token, ok)
        self.m.consume_token(refused)  # not a digit: the matcher is now in error

    monkeypatch.setattr(LLGuidanceMatcher, "_consumed", consumed_then_broken)
    out = engine.generate("Digits:", {"regex": "[0-9]{12}", "max_new_tokens": 16, "temperature": 0})
    reason = out["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and reason["status_code"] == 500, reason
    assert "doesn't satisfy the grammar" in reason["message"], reason
    monkeypatch.undo()
    out = engine.generate("Digits:", {"regex": "[0-9]{12}", "max_new_tokens": 16, "temperature": 0})
    assert out["meta_info"]["finish_reason"]["type"] == "stop" and re.fullmatch("[0-9]{12}", out["text"])


@pytest.mark.parametrize("name", ["llguidance", "outlines"])
def test_an_eos_id_past_the_tokenizer_is_left_out_of_grammars(engine, name):
    """A model config paired with another model's tokenizer (dummy-weight benchmarks: Llama-3's
    config, EOS 128001, with the default 49k tokenizer): grammars still compile."""
    eos = set(engine.eos_ids) | {len(engine.tokenizer) + 78849}
    backend = GrammarBackend(engine.tokenizer, engine.runner.vocab_size, eos, SimpleNamespace(grammar_backend=name))
    req = FakeReq("regex", "[a-z]{1,5}")
    backend.submit(req)
    assert _poll(backend, req) is True
    assert backend.info.eos_ids == tuple(sorted(engine.eos_ids))
    backend.cache.pool.shutdown(wait=False)


def test_compile_time_limit_fails_only_that_request(engine):
    backend = _backend(engine, grammar_backend="outlines", grammar_compile_timeout_s=0.05)
    try:
        slow = FakeReq("regex", "(a|b)*a(a|b){11}[0-9]{1,40}")  # an exponential DFA: ~0.9 s to compile on an idle 2-core machine
        backend.submit(slow)
        # the limit counts the compile's own time, which starts once a worker runs it: in a fresh venv the worker's
        # first imports can take longer than any fixed sleep. Without the limit the compile would finish: True.
        deadline = time.monotonic() + 60
        while (ready := backend.poll(slow)) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready is False
        assert slow.finish_reason["status_code"] == 400
        assert "grammar-compile-timeout-s" in slow.finish_reason["message"]
        quick = FakeReq("regex", "yes|no")
        backend.compile_async("regex", "yes|no").result(timeout=60)  # compiled before its clock starts
        backend.submit(quick)
        assert backend.poll(quick) is True and quick.grammar is not None
    finally:
        backend.cache.pool.shutdown(wait=False, cancel_futures=True)


def test_compile_time_limit_does_not_count_time_queued_behind_other_compiles(engine, monkeypatch):
    """The limit counts a grammar's own compile time: a request whose compile waited for a
    busy worker past the limit is served; one that waits past the queue bound gets a 503."""
    from radixflow.constrained import backend as backend_module

    backend = _backend(engine, grammar_compile_workers=1, grammar_compile_timeout_s=0.3)
    gate = threading.Event()
    try:
        backend.impl  # the backend itself is built on the pool first
        backend.cache.pool.submit(gate.wait, 30)  # the only worker is busy
        queued = FakeReq("json_schema", json.dumps({"type": "string", "maxLength": 3}))
        backend.submit(queued)
        time.sleep(0.6)
        assert backend.poll(queued) is None and queued.finish_reason is None
        monkeypatch.setattr(backend_module, "QUEUE_LIMIT_FACTOR", 1)
        starved = FakeReq("json_schema", json.dumps({"type": "integer"}))
        backend.submit(starved)
        time.sleep(0.4)
        assert backend.poll(starved) is False and starved.finish_reason["status_code"] == 503
        assert "--grammar-compile-workers" in starved.finish_reason["message"]
        monkeypatch.setattr(backend_module, "QUEUE_LIMIT_FACTOR", 30)
        gate.set()
        assert _poll(backend, queued) is True and queued.grammar is not None
    finally:
        gate.set()
        backend.cache.pool.shutdown(wait=False, cancel_futures=True)


def test_exponential_regex_on_outlines_fails_only_its_request(engine, monkeypatch):
    """The outlines backend builds a regex's DFA in a child process killed at the time limit:
    the request gets a clear 400 and the compile threads stay free for the next grammar."""
    from radixflow.constrained import regex_guard

    killed = []
    kill = regex_guard.stop
    monkeypatch.setattr(regex_guard, "stop", lambda child: killed.append(child) or kill(child))
    backend = _backend(engine, grammar_backend="outlines", grammar_compile_timeout_s=1.0)
    try:
        bomb = FakeReq("regex", "(a|b)*a(a|b){24}")  # hours of DFA building
        backend.submit(bomb)
        assert _poll(backend, bomb) is False and bomb.finish_reason["status_code"] == 400
        assert "grammar-compile-timeout-s" in bomb.finish_reason["message"]
        with pytest.raises(GrammarError, match="automaton is too large"):
            backend.compile_async("regex", "(a|b)*a(a|b){24}").result(timeout=30)  # the child was killed
        quick = FakeReq("regex", "(yes|no)")
        backend.submit(quick)
        assert _poll(backend, quick) is True and quick.grammar is not None
        assert killed and all(child.poll() is not None for child in killed)  # the bomb's child was killed
        assert not set(killed) & set(regex_guard._idle)  # and is not reused
    finally:
        backend.cache.pool.shutdown(wait=False, cancel_futures=True)


def test_cache_is_keyed_by_kind_spec_and_options(engine):
    backend = _backend(engine)
    spec = json.dumps({"type": "string", "maxLength": 5})
    first = backend.compile_async("json_schema", spec)
    assert backend.compile_async("json_schema", spec) is first
    assert ("llguidance", "json_schema", spec, GrammarOptions()) in backend.cache.entries
    spaced = _backend(engine, constrained_json_whitespace_pattern=WS)
    assert spaced.options == GrammarOptions(WS) and spaced.options != backend.options
    bad = backend.compile_async("json_schema", json.dumps({"type": "integer", "minimum": 3, "maximum": 1}))
    assert isinstance(bad.exception(timeout=60), GrammarError) and "minimum" in str(bad.exception())
    assert backend.compile_async("json_schema", json.dumps({"type": "integer", "minimum": 3, "maximum": 1})) is bad
    assert (backend.cache.hits, backend.cache.misses) == (2, 2)
    for b in (backend, spaced):
        b.cache.pool.shutdown(wait=False)


def _deep_schema(levels: int) -> dict:
    schema = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


BAD_GRAMMARS = [
    ({"json_schema": "{not json"}, "json"),
    ({"json_schema": {"type": 12}}, "type"),
    ({"json_schema": {"type": "integer", "minimum": 5, "maximum": 1}}, "minimum"),
    ({"json_schema": {"type": "object", "properties": {"a": {"not": {}}}}}, "'not'"),
    ({"json_schema": _deep_schema(300)}, "nested too deeply"),
    ({"regex": "(?=a)b"}, "unsupported regex"),
    ({"ebnf": "start: ("}, "ebnf"),
]


@pytest.mark.parametrize("params,needle", BAD_GRAMMARS, ids=[n for _, n in BAD_GRAMMARS])
def test_bad_grammars_are_400s_and_the_server_keeps_serving(server, params, needle):
    with server.client() as c:
        r = c.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 4, **params}})
        assert r.status_code == 400, r.text
        assert needle.lower() in r.json()["error"]["message"].lower()
        ok = c.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 8, "temperature": 0, "regex": "(ab)+"}})
    assert ok.status_code == 200 and ok.json()["text"].startswith("ab")


def test_catastrophic_regex_compiles_lazily_on_llguidance(engine):
    """A regex whose DFA is exponential: llguidance builds its lexer lazily (no hang)."""
    g = Grammar.from_regex("(a|b)*a(a|b){24}", engine.tokenizer, backend="llguidance")
    assert g.accepts("b" + "a" * 25) and not g.accepts("b" * 26)


def test_unknown_keywords_over_http(server):
    """Unknown keywords are annotations (200) on the server's backend."""
    with server.client() as c:
        schema = {"type": "object", "properties": {"k": {"type": "boolean", "x-note": "v"}}, "required": ["k"], "id": "x",
                  "additionalProperties": False}  # fmt: skip
        r = c.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 16, "temperature": 0, "json_schema": json.dumps(schema)}})
    assert r.status_code == 200, r.text
    assert isinstance(json.loads(r.json()["text"])["k"], bool)


def _byte_fallback_tokenizer():
    """The default tokenizer as transformers 5.17 writes it when converting the default GGUF:
    byte-level BPE marked byte_fallback, with a sentencepiece-style decoder sequence."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    doc = json.loads(tokenizer_info().tokenizer.backend_tokenizer.to_str())
    doc["model"]["byte_fallback"] = True
    doc["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}  # fmt: skip
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(doc)), eos_token="<|im_end|>")


def test_llguidance_reads_a_byte_level_tokenizer_marked_byte_fallback():
    """Read as sentencepiece pieces ("Ġ" not a space), no mask allowed the right text: every
    tool call on the GPU machine's conversion ended at its first token."""
    tok = _byte_fallback_tokenizer()
    assert tok.decode(tok.encode("a <b> c", add_special_tokens=False)) == "a <b> c"  # the tokenizer itself is fine
    g = Grammar.from_regex(r'<tool_call> \{"x": (1|22)\}', tokenizer=tok, backend="llguidance")
    assert g.accepts('<tool_call> {"x": 22}') and not g.accepts('<tool_call> {"x": 3}')


def test_llguidance_refuses_a_tokenizer_whose_bytes_it_misreads(monkeypatch):
    from radixflow.constrained import llguidance_tokenizer

    monkeypatch.setattr(llguidance_tokenizer, "_without_byte_fallback", lambda text: text)
    with pytest.raises(GrammarError, match="reads this tokenizer's tokens as other bytes"):
        Grammar.from_regex("(yes|no)", tokenizer=_byte_fallback_tokenizer(), backend="llguidance")


def test_outlines_jumps_encode_without_a_tokenizer_json_s_padding():
    """A tokenizer.json that pads leaves padding on in the fast tokenizer's Rust side: the
    jump's direct encode once added pad tokens to the forced text."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from radixflow.constrained.options import TokenizerInfo
    from radixflow.constrained.outlines_grammars import OutlinesGrammars

    doc = json.loads(tokenizer_info().tokenizer.backend_tokenizer.to_str())
    doc["padding"] = {"strategy": {"Fixed": 8}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 2,
                      "pad_type_id": 0, "pad_token": "<|im_end|>"}  # fmt: skip
    doc["truncation"] = {"direction": "Right", "max_length": 2, "strategy": "LongestFirst", "stride": 0}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(doc)), eos_token="<|im_end|>")
    outlines = OutlinesGrammars(TokenizerInfo(tok, len(tok), (tok.eos_token_id,)))
    for text in ('"name": "', '}\n', "x"):
        assert outlines._encode(text) == tok.encode(text, add_special_tokens=False) == tokenizer_info().tokenizer.encode(text, add_special_tokens=False)


def test_the_gpu_benchmark_switches_the_up_front_check_with_the_backend(engine, monkeypatch):
    """benchmarks/constrained_gpu.py runs both backends in one engine: an outlines run must
    check its requests up front as an outlines server does, not with llguidance's check."""
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    import constrained_gpu

    sched = engine.scheduler
    saved = (sched.args, sched.grammar_backend, sched.jump_forward, engine.builder.grammar_backend)
    try:
        constrained_gpu.use_backend(engine, "outlines")
        assert (sched.args.grammar_backend, sched.grammar_backend.name, engine.builder.grammar_backend) == ("outlines",) * 3
    finally:
        for backend in constrained_gpu.BACKENDS.values():  # those it started for this test
            if backend is not saved[1]:
                backend.cache.pool.shutdown(wait=False)
        constrained_gpu.BACKENDS.clear()
        sched.args, sched.grammar_backend, sched.jump_forward, engine.builder.grammar_backend = saved


def test_the_gpu_benchmark_refuses_an_unknown_section(monkeypatch, capsys):
    """A misspelled or retired --sections name (e.g. `background`) would otherwise run nothing
    for it and say nothing: it is refused up front, naming the sections there are."""
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    import constrained_gpu

    assert constrained_gpu.parse_args(["--out", "x", "--sections", "idle,throughput"]).sections == ["idle", "throughput"]
    with pytest.raises(SystemExit):
        constrained_gpu.parse_args(["--out", "x", "--sections", "background,throughput"])
    err = capsys.readouterr().err
    assert "unknown background" in err and "correctness, threads, idle, throughput" in err


# the review's cases where llguidance's reading of a spec and outlines' regex disagree (issue 23)
DIVERGENT = [
    ("json_schema", {"type": "object", "properties": {"x": {}}, "required": ["x"]}, {},
     ['{"x":1}', '{"x":{"a":{"b":{"c":1}}}}', '{"x":[[[[[1]]]]]}']),
    ("json_schema", {"type": "object", "properties": {"x": {"type": "object"}}, "required": ["x"]}, {},
     ['{"x":{}}', '{"x":{"a":{"b":{"c":1}}}}']),
    ("json_schema", {"type": "string", "format": "time"}, {}, ['"12:00:00Z"', '"12:00:00"', '"12:00:00+01:00"']),
    ("json_schema", {"type": "string", "format": "date-time"}, {},
     ['"2024-02-29T00:00:00Z"', '"2023-02-28T00:00:00.1234567Z"', '"2023-02-28t00:00:00z"']),
    ("json_schema", {"type": "string", "format": "uuid"}, {},
     ['"123e4567-e89b-12d3-a456-426614174000"', '"123E4567-E89B-12D3-A456-426614174000"']),
    ("json_schema", {"type": "string", "format": "email"}, {}, ['"a@b.co"', '"a@b"']),
    ("json_schema", {"type": "number"}, {}, ["1e5", "1E+5", "-1.5e-3", "01"]),
    ("json_schema", {"type": "string"}, {}, ['"\\/"', '"\\u0041"', '"a\\tb"']),
    ("json_schema", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "integer"}}},
                     "required": ["a", "b"]}, {"whitespace": "[ \\n]*"},
     ['{"a":1,"b":[1,2]}', '{"a": 1, "b": [1, 2]}', '{"a": 1, "b": [ 1 , 2 ]}', ' {"a":1,"b":[1,2]}']),
    ("json_schema", {"type": "string", "pattern": "[0-9]{3}"}, {}, ['"123"', '"x123y"']),
    ("json_schema", {"type": "object", "properties": {"a": {"type": "integer"}}}, {}, ['{"a":1}', '{"a":1,"c":2}']),
    ("regex", r"\d+", {}, ["123", "١٢٣"]),
    ("regex", r"\w+", {}, ["abc", "é", "a_b"]),
]  # fmt: skip


def _same_language_pair(engine, kind, spec, opts):
    """auto's llguidance compile of a grammar that may move, and the outlines grammar it moves to."""
    from radixflow.constrained.grammar import compile_grammar, grammar_backend
    from radixflow.constrained.spec import to_regex

    options, info = GrammarOptions(**opts), tokenizer_info(engine.tokenizer)
    backend = _backend(engine, grammar_backend="auto", constrained_json_whitespace_pattern=opts.get("whitespace"))
    try:
        before = backend.compile(kind, spec)
    finally:
        backend.cache.pool.shutdown(wait=False)
    assert before.regex == to_regex(kind, spec, options.whitespace or "", options.any_depth), "compiled from outlines' regex"
    ll, ol = grammar_backend("llguidance", info), grammar_backend("outlines", info)
    return Grammar(kind, spec, options, ll, before), Grammar(kind, spec, options, ol, compile_grammar(ol, kind, spec, options))


@pytest.mark.parametrize("kind,spec,opts,texts", DIVERGENT, ids=[f"{c[0]}-{i}" for i, c in enumerate(DIVERGENT)])
def test_auto_keeps_a_grammars_language_across_its_move(engine, kind, spec, opts, texts):
    """Under auto, a grammar that may move is compiled on llguidance from outlines' regex: both
    backends' matchers, fed each string's tokens, accept and refuse the same strings (each case has
    at least one string llguidance's own reading of the spec decides the other way)."""
    spec = json.dumps(spec) if kind == "json_schema" else spec  # as requests carry it (hashable: the cache key)
    before, after = _same_language_pair(engine, kind, spec, opts)
    native = Grammar.compile(kind, spec, engine.tokenizer, backend="llguidance", **opts)
    got = [(t, before.accepts(t), after.accepts(t)) for t in texts]
    assert all(b == a for _, b, a in got), got
    assert any(native.accepts(t) != a for t, _, a in got), ("not a divergent case", got)


def test_auto_compiles_a_spec_without_outlines_regex_natively_and_never_moves_it(engine):
    """A schema outlines cannot turn into a regex (`multipleOf`) is compiled by llguidance from the
    spec itself (its own language) and is never compiled on outlines, however busy."""
    from radixflow.constrained.options import PROMOTE_AFTER

    backend = _backend(engine, grammar_backend="auto")
    spec = json.dumps({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 3}}, "required": ["a"]})
    try:
        classes = [_matcher_class(backend, "json_schema", spec) for _ in range(PROMOTE_AFTER + 2)]
        backend.wait_for_moves()
        classes.append(_matcher_class(backend, "json_schema", spec))
        assert classes == ["LLGuidanceMatcher"] * (PROMOTE_AFTER + 3)
        assert backend.mover.compile_of("json_schema", spec) is None and backend.compile("json_schema", spec).regex is None
    finally:
        backend.cache.pool.shutdown(wait=False)


def _gil_holding_compile(regex, vocab):
    """A slow outlines compile: one C call that holds the GIL (as outlines-core's get_transitions does)."""
    from radixflow.constrained.fsm import compile_regex

    re.match(r"(a+)+b", "a" * 24)
    return compile_regex(regex, vocab)


def test_auto_moves_compile_in_a_child_process_without_pausing_the_scheduler(engine, monkeypatch):
    """auto's outlines compile runs in a child process: a compile that holds its GIL for ~0.5 s
    (here a fake slow one) leaves the server's threads running; the same work in-process pauses them."""
    import functools

    import radixflow.constrained.outlines_grammars as outlines_module

    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    from auto_language_cost_cpu import longest_pause  # the longest wait of a thread that wakes every millisecond

    slow = functools.partial(outlines_module.compile_isolated, target=_gil_holding_compile)
    monkeypatch.setattr(outlines_module, "compile_isolated", slow)
    monkeypatch.setattr(outlines_module, "compile_regex", _gil_holding_compile)  # the same work, were it done in-process
    backend, regex = _backend(engine, grammar_backend="auto"), r"[0-9]{3}-[a-z]{2}"
    vocab = backend.impl_named("outlines").vocab
    try:
        in_process = longest_pause(lambda: _gil_holding_compile(regex, vocab))[2]
        moving = longest_pause(lambda: (_busy(backend, regex), backend.wait_for_moves()))[2]
        assert _busy(backend, regex, 1) == ["GrammarMatcher"], "it moved"
    finally:
        backend.cache.pool.shutdown(wait=False)
    assert in_process > 0.3, f"the fake compile does not hold the GIL ({in_process:.2f} s)"
    assert moving < 0.2, f"the scheduler's thread waited {moving:.2f} s during the move"


def test_a_moves_compile_process_skips_radixflows_package_imports():
    """The move's child imports fsm.py (numpy, outlines-core) without radixflow's package __init__, whose
    ServerArgs import loads torch: seconds added to every move (a regex's move took 2.0 s against 0.15 s
    in-process here, 0.4 s without them)."""
    import pickle
    import subprocess
    import sys

    from radixflow.constrained.isolated_compile import BARE_PACKAGES, PRELUDE

    code = PRELUDE + "import radixflow.constrained.fsm\nprint(sorted({'torch', 'radixflow.runtime'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps((list(sys.path), BARE_PACKAGES)),
                         capture_output=True, timeout=120, check=True)  # fmt: skip
    assert out.stdout.decode().strip() == "[]", out


def test_isolated_compile_limits(engine):
    """The child compile: the same grammar as in-process; refused past its memory cap and its byte cap
    (GrammarError); outlines-core's refusal comes back as its ValueError."""
    from radixflow.constrained.fsm import compile_regex
    from radixflow.constrained.isolated_compile import Limits, compile_isolated
    from radixflow.constrained.outlines_grammars import OutlinesGrammars

    vocab, regex = OutlinesGrammars(tokenizer_info(engine.tokenizer)).vocab, r"[0-9]{3}-[a-z]{2}"
    got, want = compile_isolated(regex, vocab, Limits(60, 1 << 30, 4 << 30)), compile_regex(regex, vocab)
    assert (got.tokens == want.tokens).all() and (got.dist == want.dist).all() and got.vocab is vocab
    with pytest.raises(GrammarError, match="memory"):
        compile_isolated(r"[a-z]{1,200}", vocab, Limits(60, 1 << 30, 1 << 20))
    with pytest.raises(GrammarError, match="MiB"):
        compile_isolated(regex, vocab, Limits(60, 1, 4 << 30))
    with pytest.raises(ValueError):
        compile_isolated("a(?=b)", vocab, Limits(60, 1 << 30, 4 << 30))


def test_a_stop_string_in_the_grammars_last_token_stops_on_llguidance(engine):
    """As on outlines (test_constrained_engine.py): the stop string, not the grammar's end, ends the output."""
    for regex, stop, text in (("no", "o", "n"), ("abc", "b", "a")):
        out = engine.generate("x", {"regex": regex, "stop": [stop], "max_new_tokens": 8, "temperature": 0})
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop} and out["text"] == text, out
