"""A request graph's constant text is tokenized on the caller's thread (runtime/programs/
text_pieces.py), so the scheduler's turn encodes only pieces that hold generated values; the
tokens are the same either way (graph vs eager greedy outputs stay equal). The program is
parsed there too, once, and the chat template's role markers are read once per backend."""

from __future__ import annotations

import copy
import random

import pytest
from tokenizers.processors import TemplateProcessing

import radixflow as rf
from radixflow.errors import RadixflowError
from radixflow.lang.backends.engine_backend import EngineBackend
from radixflow.runtime.programs import program_executor
from radixflow.runtime.programs import piece_codec, text_pieces
from radixflow.runtime.programs.program_ops import check_programs, parse_program
from radixflow.runtime.programs.piece_codec import plain_encode
from radixflow.runtime.programs.segment_tokens import encode_piece
from radixflow.runtime.programs.text_pieces import constant_pieces


@rf.function
def rated_ideas(s, problem):
    s += "Problem: " + problem + "\n"
    forks = s.fork(2)
    forks += lambda i: f"Idea {i + 1}:" + rf.gen("idea", max_tokens=4, stop="\n") + "\nGood?"
    forks += rf.select("ok", [" yes", " no"])
    forks.join()
    s += "Best:" + rf.gen("best", max_tokens=4, stop="\n")


@rf.function
def echo(s, topic):
    s += f"Topic: {topic}\nA word:" + rf.gen("word", max_tokens=3, stop="\n")
    s += "\nAgain, " + s["word"] + ":" + rf.gen("again", max_tokens=3, stop="\n")


def _lowered(engine, program, **kwargs) -> dict:
    b = EngineBackend.for_engine(engine)
    return program._compile(b, *program._split((), {**kwargs, "max_new_tokens": 4, "temperature": 0}), "graph")[1]


def test_constant_pieces_hold_the_tokens_the_executor_would_encode(engine):
    tok = engine.tokenizer
    pieces = constant_pieces(tok, parse_program(_lowered(engine, rated_ideas, problem="a leaking roof")))
    assert pieces[("Problem: a leaking roof\n", True)] == encode_piece(tok, "Problem: a leaking roof\n", True)
    assert ("Idea 1:", False) in pieces and ("Idea 2:", False) in pieces  # each branch's own text
    assert (" yes", False) in pieces and (" no", False) in pieces  # select choices
    assert all(ids == encode_piece(tok, text, first) for (text, first), ids in pieces.items())
    # a piece holding a generated value is left to the run
    pieces = constant_pieces(tok, parse_program(_lowered(engine, echo, topic="rain")))
    assert [text for text, _ in pieces] == ["Topic: rain\nA word:"]


def test_a_static_program_encodes_nothing_in_the_scheduler_turn(engine, monkeypatch):
    calls = []
    real = program_executor.encode_piece
    monkeypatch.setattr(program_executor, "encode_piece", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    b = EngineBackend.for_engine(engine)
    graph = rated_ideas.run(problem="a leaking roof", backend=b, temperature=0)
    assert graph.mode == "graph" and calls == []
    echoed = echo.run(topic="rain", backend=b, temperature=0)
    assert echoed.mode == "graph" and len(calls) == 1 and calls[0].startswith("\nAgain, ")  # the piece with s["word"]
    for state, program, kw in ((graph, rated_ideas, {"problem": "a leaking roof"}), (echoed, echo, {"topic": "rain"})):
        eager = program.run(backend=b, mode="eager", temperature=0, **kw)
        assert state.text() == eager.text()


def test_a_program_is_parsed_once_on_the_callers_thread(engine, monkeypatch):
    """The Engine parses a program while checking it and hands those ops on; the executor
    parses nothing in the scheduler's turn."""
    monkeypatch.setattr(program_executor, "parse_program", lambda p: (_ for _ in ()).throw(AssertionError("parsed in the turn")))
    state = echo.run(topic="rain", backend=EngineBackend.for_engine(engine), temperature=0)
    assert state.mode == "graph" and state["again"] is not None


def test_the_chat_template_is_rendered_once_per_backend(engine, monkeypatch):
    b = EngineBackend.for_engine(engine)
    b.chat_template()  # read once (it may already be)
    renders = []
    real = type(engine.tokenizer).apply_chat_template
    monkeypatch.setattr(type(engine.tokenizer), "apply_chat_template", lambda *a, **k: renders.append(1) or real(*a, **k))
    for mode in ("graph", "eager"):
        assert echo.run(topic="rain", backend=b, mode=mode, temperature=0).mode == mode
    assert renders == []


def test_the_server_parses_a_program_once_in_the_main_process(engine, monkeypatch):
    """POST /program parses each program while checking it and sends those ops with it; the
    scheduler process hands them to the executor instead of parsing again in its turn."""
    import pickle
    from types import SimpleNamespace

    from radixflow.runtime.programs import program_ops
    from radixflow.runtime.server import program_service

    parsed = []
    monkeypatch.setattr(program_ops, "parse_program", lambda p, real=parse_program: parsed.append(p) or real(p))
    program = _lowered(engine, echo, topic="rain")
    programs, ops, _ = program_service.parse_program_body({"program": program}, engine.builder, 64)
    sent: list = []
    tm = SimpleNamespace(new_request_id=lambda: "r1", program_streams={}, send=sent.append, tokenizer=engine.tokenizer)
    program_service.stream_program(tm, programs[0], ops[0])
    assert len(parsed) == 1 and sent[0].ops == ops

    submitted = []
    executor = SimpleNamespace(submit=lambda *a: submitted.append(a), on_step=lambda: None)
    program_service.SchedulerPrograms(executor, send=lambda m: None).handle(pickle.loads(pickle.dumps(sent[0])))
    assert submitted[0][4] == ops[0] and len(parsed) == 1


def _texts(seed: int, n: int) -> list:
    rng = random.Random(seed)
    alphabet = list("ab XY\n\t.,!'é日<|>/") + ["<|endoftext|>", "<|im_start|>", "  ", "\n\n", " Paris"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30))) for _ in range(n)]


def test_pieces_encoded_in_one_batch_are_encode_pieces_ids(engine):
    """The backend's encode_batch where transformers' encode would give the same ids: with the
    tokenizer's special tokens on a program's first piece (a BOS added here), split or not."""
    tok = copy.deepcopy(engine.tokenizer)
    bos = tok.convert_tokens_to_ids("<|endoftext|>")
    tok.backend_tokenizer.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    assert tok.encode("hi")[0] == bos and tok.encode("hi", add_special_tokens=False)[0] != bos
    for t in (engine.tokenizer, tok):
        try:
            for split in (False, True):
                t.split_special_tokens = split
                encode = text_pieces.batch_encoder(t)
                assert encode.__name__ == "fast"
                texts = _texts(int(split), 300)
                for first in (True, False):
                    want = [plain_encode(t, x, first) for x in texts]  # transformers' encode
                    assert encode(texts, first) == want and [encode_piece(t, x, first) for x in texts] == want
        finally:
            t.split_special_tokens = False


def test_a_tokenizer_with_its_own_encode_keeps_it(engine):
    class Shouting(type(engine.tokenizer)):
        def encode(self, text, *a, **k):
            return super().encode(text.upper(), *a, **k)

    tok = copy.copy(engine.tokenizer)
    tok.__class__ = Shouting
    encode = text_pieces.batch_encoder(tok)
    assert encode(["quiet words"], False) == [plain_encode(tok, "quiet words", False)] != [plain_encode(engine.tokenizer, "quiet words", False)]
    assert encode_piece(tok, "quiet words", False) == plain_encode(tok, "quiet words", False)


def test_sampling_params_are_parsed_once_per_distinct_dict_and_kept_apart(engine):
    def gen_op(sp: dict) -> dict:
        return {"ops": [{"op": "text", "text": "x"}, {"op": "gen", "id": 1, "name": "a", "sampling_params": sp}]}

    stop = ["\n"]
    first = parse_program(gen_op({"max_new_tokens": 4, "stop": stop}))[1].sampling
    again = parse_program(gen_op({"max_new_tokens": 4, "stop": ["\n"]}))[1].sampling
    assert again is first  # the same content: one SamplingParams
    stop.append("END")  # the caller's list changes after: the parsed one does not
    assert first.stop == ["\n"] and parse_program(gen_op({"max_new_tokens": 4, "stop": stop}))[1].sampling.stop == ["\n", "END"]
    ints, floats = (parse_program(gen_op({"max_new_tokens": 4, "top_k": v}))[1].sampling for v in (1, 2))
    assert ints.top_k == 1 and floats.top_k == 2
    with pytest.raises(RadixflowError):  # True is not 1: refused, not served from 1's entry
        parse_program(gen_op({"max_new_tokens": 4, "n": True}))
    parse_program(gen_op({"max_new_tokens": 4, "n": 1}))
    with pytest.raises(RadixflowError):
        parse_program(gen_op({"max_new_tokens": 4, "n": True}))
    # a check that failed is not remembered as passed; one that passed is not run again
    checks = []
    bad = gen_op({"max_new_tokens": 10**9})
    for _ in range(2):
        with pytest.raises(RadixflowError, match="limit"):
            check_programs([bad], engine.builder.sampling, None)
    ok = gen_op({"max_new_tokens": 5, "temperature": 0.5})
    real = type(engine.builder)._check
    type(engine.builder)._check = lambda self, sp: checks.append(sp) or real(self, sp)
    try:
        gens = [check_programs([ok], engine.builder.sampling, None)[0][1].sampling for _ in range(3)]
    finally:
        type(engine.builder)._check = real
    assert len(checks) <= 1  # the builder's one cache: eager requests and graph gens share it
    assert gens[0] is gens[1] is gens[2] is engine.builder.sampling({"max_new_tokens": 5, "temperature": 0.5})


def test_a_cached_encoder_lets_its_tokenizer_go(engine):
    import gc
    import weakref

    tok = copy.deepcopy(engine.tokenizer)
    assert text_pieces.batch_encoder(tok)(["hi there"], True) == [plain_encode(tok, "hi there", True)]
    assert piece_codec.piece_decoder(tok)([1, 2], True) == tok.decode([1, 2], skip_special_tokens=True)
    ref = weakref.ref(tok)
    del tok
    gc.collect()
    assert ref() is None  # the encoder (or decoder) held it strongly: every Engine's tokenizer lived as long as the process


def test_pieces_and_results_skip_transformers_wrappers(engine):
    """Eager programs encode every text piece and decode every gen on their own threads (the executor on
    the engine thread): through the tokenizers backend, with transformers' ids and text, never its wrappers."""
    from radixflow.runtime.generate_request import output_text
    from radixflow.runtime.programs.segment_tokens import gen_piece

    tok = copy.deepcopy(engine.tokenizer)
    texts = _texts(5, 40)
    ids = [plain_encode(tok, t, first) for t in texts for first in (True, False)]
    decoded = [tok.decode(i, skip_special_tokens=skip) for i in ids for skip in (True, False)]
    piece_codec.batch_encoder(tok), piece_codec.piece_decoder(tok)  # their one-off probes compare with the wrappers
    tok.encode = lambda *a, **k: pytest.fail("transformers' encode was called")  # the instance's: the type stays stock
    tok.decode = lambda *a, **k: pytest.fail("transformers' decode was called")
    assert [encode_piece(tok, t, first) for t in texts for first in (True, False)] == ids
    assert [gen_piece(tok, i, None, skip)[0] for i in ids for skip in (True, False)] == decoded
    assert [output_text(tok, i, None, skip, False) for i in ids for skip in (True, False)] == decoded


def test_generate_parses_and_checks_each_sampling_dict_once(engine, monkeypatch):
    """An eager program's gens send the same few sampling_params dicts on every call: each distinct
    content is parsed and checked once, kept apart from any other (True is not 1), never a failed one."""
    from radixflow.runtime import generate_request

    builder = generate_request.RequestBuilder(engine.tokenizer, engine.runner.vocab_size, 4096, 100000, 64)
    parsed = []
    real = generate_request.SamplingParams.from_dict
    monkeypatch.setattr(generate_request.SamplingParams, "from_dict", lambda d: parsed.append(d) or real(d))
    stop = ["\n"]
    first = builder.sampling({"max_new_tokens": 4, "stop": stop})
    assert builder.sampling({"max_new_tokens": 4, "stop": ["\n"]}) is first and len(parsed) == 1
    stop.append("END")  # the caller's list changes after: the kept one does not
    assert first.stop == ["\n"] and builder.sampling({"max_new_tokens": 4, "stop": stop}).stop == ["\n", "END"]
    assert builder.sampling({"max_new_tokens": 4, "top_k": 1}).top_k == 1
    with pytest.raises(RadixflowError):
        builder.sampling({"max_new_tokens": 4, "n": True})
    assert builder.sampling({"max_new_tokens": 4, "n": 1}).n == 1
    with pytest.raises(RadixflowError):  # not served from 1's entry
        builder.sampling({"max_new_tokens": 4, "n": True})
    for _ in range(2):  # a failed check is not remembered
        with pytest.raises(RadixflowError, match="limit"):
            builder.sampling({"max_new_tokens": 65})
    n = len(parsed)
    outs = [engine.generate("Hi", {"max_new_tokens": 2, "temperature": 0, "top_p": 0.93}) for _ in range(3)]
    assert len({o["text"] for o in outs}) == 1 and len(parsed) - n <= 1  # the Engine's builder too


def test_a_dict_nested_past_the_recursion_limit_is_not_cached_and_reaches_the_grammar_check(engine):
    """A json_schema nested deeper than Python's recursion limit has no cache key (the key's walk, repr and
    deepcopy recurse), and goes on to the grammar's own depth check: a GrammarError naming the depth, which the
    server turns into a 400 (was a RecursionError and a 500)."""
    from radixflow.runtime import generate_request
    from radixflow.runtime.sampling_params import params_key

    deep = {"type": "integer"}
    for _ in range(300):
        deep = {"type": "object", "properties": {"a": deep}, "required": ["a"]}
    assert params_key({"json_schema": deep}) is None and params_key({"json_schema": {"type": "integer"}})
    builder = generate_request.RequestBuilder(engine.tokenizer, engine.runner.vocab_size, 4096, 100000, 64)
    with pytest.raises(RadixflowError, match="nested too deeply"):
        builder.sampling({"max_new_tokens": 4, "json_schema": deep})
