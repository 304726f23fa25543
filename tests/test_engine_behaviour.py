"""Engine behaviour: small KV pools, bad input, sampling parameters, streaming."""

from __future__ import annotations

import gc
import re
import weakref

import pytest
import torch

from conftest import PROMPTS
from radixflow import Engine, RadixflowError
from radixflow.errors import ModelPathError
from radixflow.runtime import gc_freeze

GREEDY = {"max_new_tokens": 24, "temperature": 0}


@pytest.mark.parametrize("rule", ["ratio", "peak"])
def test_small_kv_pool_completes_everything_with_same_outputs(engine, rule):
    ref = [o["output_ids"] for o in engine.generate(PROMPTS, GREEDY)]
    with Engine(max_total_tokens=160, chunked_prefill_size=64, admission_rule=rule) as small:
        assert small.runner.kv_pool.allocator.capacity_slots < sum(
            o["meta_info"]["prompt_tokens"] + 24 for o in engine.generate(PROMPTS, GREEDY)
        )
        outs = small.generate(PROMPTS, GREEDY)
        assert [o["output_ids"] for o in outs] == ref
        if rule == "ratio":  # it over-commits the pool: decode retracts (or a prompt is computed again)
            assert small.scheduler.stats.retractions > 0 or small.scheduler.stats.prompt_tokens > sum(
                o["meta_info"]["prompt_tokens"] for o in outs
            )
        small.scheduler.check_invariants()
        assert not small.scheduler.has_work()


def test_retraction_resumes_without_altering_output(engine):
    long_prompts = [p * 2 for p in PROMPTS[:4]]
    params = {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}
    ref = [o["output_ids"] for o in engine.generate(long_prompts, params)]
    with Engine(max_total_tokens=220, admission_rule="ratio") as small:  # the rule that over-commits
        outs = small.generate(long_prompts, params)
        assert small.scheduler.stats.retractions > 0
        assert [o["output_ids"] for o in outs] == ref
        assert sum(o["meta_info"]["num_retractions"] for o in outs) > 0
        small.scheduler.check_invariants()


def test_a_request_that_outgrows_the_kv_pool_ends_at_it(engine):
    """prompt + max_new_tokens past the KV pool: the request was retracted when the pool filled, never admitted
    again, and every request behind it waited for ever (fuzzing, session 29). It now ends with "length" where the
    pool is full, as a /generate, a program's gen and a gen continued in its request; the others run."""
    params = {"max_new_tokens": 100, "temperature": 0, "ignore_eos": True}
    with Engine(max_total_tokens=160) as small:
        pool = small.runner.kv_pool.allocator.capacity_slots
        outs = small.generate(input_ids=[[1000 + i for i in range(pool - 40)], [1000, 1001]], sampling_params=params)
        assert [o["meta_info"]["finish_reason"]["type"] for o in outs] == ["length", "length"]
        assert len(outs[0]["output_ids"]) == 41 and len(outs[1]["output_ids"]) == 100  # 40 + 1: the last needs no KV
        text = small.tokenizer.decode([1000 + i for i in range(pool - 40)])
        gen = {"op": "gen", "id": 1, "name": "x", "sampling_params": {**params, "max_new_tokens": 30}}
        program = {"ops": [{"op": "text", "text": text}, gen, {"op": "text", "text": " and"}, {**gen, "id": 2, "name": "y"}]}
        out = small.run_program(program)
        assert sum(out["results"][k]["meta_info"]["completion_tokens"] for k in out["results"]) <= 41
        small.scheduler.check_invariants()
        assert not small.scheduler.has_work()


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"prompt": ""}, "empty"),
        ({"prompt": "hi", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"prompt": "hi", "sampling_params": {"top_p": 0.0}}, "top_p"),
        ({"prompt": "hi", "sampling_params": {"top_p": 1.5}}, "top_p"),
        ({"prompt": "hi", "sampling_params": {"temperatur": 0.5}}, "unknown sampling param"),
        ({"prompt": "hi", "sampling_params": {"max_new_tokens": "3"}}, "max_new_tokens"),
        ({"prompt": "word " * 9000}, "context length"),
        ({"prompt": None, "input_ids": None}, "exactly one"),
        ({"prompt": "hi", "input_ids": [1, 2]}, "exactly one"),
        ({"input_ids": [1, 10**9]}, "input_ids"),
        ({"prompt": ["a", "b"], "sampling_params": [{}]}, "entries"),
    ],
)
def test_bad_input_is_rejected_and_engine_keeps_working(engine, kwargs, fragment):
    with pytest.raises(RadixflowError, match=fragment):
        engine.generate(**kwargs)
    assert not engine.scheduler.has_work()
    assert engine.generate("The capital of France is", {"max_new_tokens": 2, "temperature": 0})["output_ids"]


def test_each_forward_pass_starts_a_new_rotary_pass(engine, monkeypatch):
    """LlamaForCausalLM.forward clears the rotary layer's per-pass cos/sin rows first
    (tests/test_kernels.py::test_rotary_layer_regathers_after_new_pass shows why)."""
    from radixflow.runtime.execution.layers.rotary import RotaryEmbedding

    model, calls = engine.runner.model, []
    new_pass, forward = RotaryEmbedding.new_pass, model.forward
    monkeypatch.setattr(RotaryEmbedding, "new_pass", lambda self: calls.append("new_pass") or new_pass(self))
    monkeypatch.setattr(model, "forward", lambda *a, **kw: calls.append("forward") or forward(*a, **kw))
    engine.generate(PROMPTS[0], {"max_new_tokens": 3, "temperature": 0.0})
    assert calls.count("forward") >= 3 and calls == ["forward", "new_pass"] * calls.count("forward")


def test_bad_model_path():
    with pytest.raises(ModelPathError, match="does not exist"):
        Engine("/nonexistent/model")
    with pytest.raises(ModelPathError, match="config.json"):
        Engine("/tmp")


def test_a_memory_fraction_outside_0_1_says_what_to_give():
    from radixflow.runtime.server_args import ServerArgs

    for bad in (0, 1, 1.2, -0.5):
        with pytest.raises(RadixflowError, match="between 0 and 1"):
            ServerArgs(mem_fraction_static=bad)
    assert ServerArgs(mem_fraction_static=0.9).mem_fraction_static == 0.9


def test_the_in_batch_prefix_threshold_defaults_by_device_and_refuses_a_negative_one():
    from radixflow.runtime.server_args import ServerArgs

    assert (ServerArgs().resolve_in_batch_threshold("cuda:0"), ServerArgs().resolve_in_batch_threshold("cpu")) == (32, 4)
    assert ServerArgs(in_batch_prefix_threshold=0).resolve_in_batch_threshold("cuda") == 0
    with pytest.raises(RadixflowError, match="in_batch_prefix_threshold must be >= 0"):
        ServerArgs(in_batch_prefix_threshold=-1)


def test_deterministic_inference_says_what_it_needs():
    from radixflow.runtime.server_args import ServerArgs

    for bad in (dict(tp_size=2), dict(attention_backend="flashinfer")):
        with pytest.raises(RadixflowError, match="tp_size 1 and the triton or torch_native"):
            ServerArgs(enable_deterministic_inference=True, **bad)
    with pytest.raises(RadixflowError, match="needs a CUDA device"):
        Engine(device="cpu", enable_deterministic_inference=True)


def test_stop_strings_trimmed_unless_no_stop_trim(engine):
    free = engine.generate("List three colors:", GREEDY)["text"]
    stop = free.strip().split()[1]
    out = engine.generate("List three colors:", {**GREEDY, "stop": [stop]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop not in out["text"] and free.startswith(out["text"])
    kept = engine.generate("List three colors:", {**GREEDY, "stop": stop, "no_stop_trim": True})
    assert kept["text"].endswith(stop) or stop in kept["text"]


@pytest.mark.parametrize("pattern", [r"[A-Za-z]{3}[^A-Za-z]", r"[A-Za-z]{3,}[^A-Za-z]"], ids=["bounded", "unbounded"])
def test_stop_regex_stops_at_the_token_that_completes_a_match(engine, pattern):
    """The output is the free output cut at the first token whose text completes a match (the match stays:
    SGLang cuts only a pattern's literal text); an unbounded pattern decodes the whole gen to find it."""
    sampling = {**GREEDY, "max_new_tokens": 24}
    free = engine.generate("List three colors:", sampling)
    assert re.search(pattern, free["text"]), free["text"]  # the test needs a match in the free output
    out = engine.generate("List three colors:", {**sampling, "stop_regex": [r"\d{9}", pattern]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    ids = out["output_ids"]
    assert ids == free["output_ids"][: len(ids)] and re.search(pattern, out["text"])
    assert not re.search(pattern, engine.tokenizer.decode(ids[:-1]))  # it stopped at the first such token


def test_stop_regex_of_plain_text_is_trimmed_as_sglang_trims_it(engine):
    free = engine.generate("List three colors:", GREEDY)["text"]
    word = next(w for w in free.split()[1:] if w.isalpha())
    out = engine.generate("List three colors:", {**GREEDY, "stop_regex": word})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert word not in out["text"] and free.startswith(out["text"])
    kept = engine.generate("List three colors:", {**GREEDY, "stop_regex": word, "no_stop_trim": True})
    assert kept["text"].endswith(word) or word in kept["text"]


def test_stop_token_ids_ignore_eos_and_min_new_tokens(engine):
    base = engine.generate("The capital of France is", GREEDY)
    tok = base["output_ids"][2]
    out = engine.generate("The capital of France is", {**GREEDY, "stop_token_ids": [tok]})
    assert out["output_ids"] == base["output_ids"][:3]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": tok}
    # a prompt the model answers briefly, then ends with EOS
    chat = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hi."}], tokenize=False, add_generation_prompt=True
    )
    short = engine.generate(chat, {"max_new_tokens": 64, "temperature": 0})
    assert short["meta_info"]["finish_reason"]["type"] == "stop"
    n = short["meta_info"]["completion_tokens"]
    longer = engine.generate(chat, {"max_new_tokens": 64, "temperature": 0, "min_new_tokens": n + 5})
    assert longer["meta_info"]["completion_tokens"] >= n + 5
    ign = engine.generate(chat, {"max_new_tokens": n + 6, "temperature": 0, "ignore_eos": True})
    assert ign["meta_info"]["completion_tokens"] == n + 6
    assert ign["meta_info"]["finish_reason"] == {"type": "length", "length": n + 6}


def test_sampling_seed_is_reproducible_and_n_gives_n(engine):
    p = {"max_new_tokens": 12, "temperature": 1.0, "sampling_seed": 7}
    a = engine.generate("Once upon a time", p)["output_ids"]
    b = engine.generate("Once upon a time", p)["output_ids"]
    assert a == b
    outs = engine.generate(["Once upon a time", "The sea"], {**p, "n": 3})
    assert len(outs) == 6
    assert len({tuple(o["output_ids"]) for o in outs[:3]}) > 1  # n samples differ
    assert outs[0]["output_ids"] == a  # the first of n uses the seed itself


def test_seeded_request_draws_the_same_beside_unseeded_and_other_seeds(engine):
    """Seeded rows are drawn in the batch's one sampling pass, keyed by (seed, output position):
    a seeded request's tokens do not depend on its neighbours; another seed draws others."""
    p = {"max_new_tokens": 12, "temperature": 1.0, "top_p": 0.95}
    alone = engine.generate("Once upon a time", {**p, "sampling_seed": 3})["output_ids"]
    batch = engine.generate(["The sea", "Once upon a time", "Once upon a time"],
                            [p, {**p, "sampling_seed": 3}, {**p, "sampling_seed": 4}])
    assert batch[1]["output_ids"] == alone
    assert batch[2]["output_ids"] != alone


def test_top_k_1_is_greedy_and_top_p_small_is_greedy(engine):
    g = engine.generate(PROMPTS[:3], GREEDY)
    k1 = engine.generate(PROMPTS[:3], {"max_new_tokens": 24, "temperature": 0.8, "top_k": 1})
    p0 = engine.generate(PROMPTS[:3], {"max_new_tokens": 24, "temperature": 0.8, "top_p": 1e-6})
    assert [o["output_ids"] for o in g] == [o["output_ids"] for o in k1] == [o["output_ids"] for o in p0]


def test_repetition_penalty_matches_transformers(engine, hf_model, tokenizer):
    prompt = PROMPTS[6]
    ids = torch.tensor([tokenizer.encode(prompt)])
    with torch.no_grad():
        ref = hf_model.generate(ids, max_new_tokens=20, do_sample=False, repetition_penalty=1.3,
                                attention_mask=torch.ones_like(ids))[0, ids.shape[1]:].tolist()
    out = engine.generate(prompt, {"max_new_tokens": 20, "temperature": 0, "repetition_penalty": 1.3})
    assert out["output_ids"] == ref


def test_repetition_penalty_covers_the_prompt_in_any_batch(engine):
    """A request with only a frequency penalty has no prompt mask, and beside one the repetition penalty of every
    other row left its prompt out (fuzzing, session 28): in a batch the output is the one alone."""
    prompt = "The cat sat on the mat. The cat sat on the mat. The cat sat on the"
    rep = {"max_new_tokens": 12, "temperature": 0, "repetition_penalty": 1.8}
    alone = engine.generate(prompt, rep)["output_ids"]
    both = engine.generate([prompt, "Hello there, my friend"], [rep, {**rep, "repetition_penalty": 1.0,
                                                                     "frequency_penalty": 0.5}])
    assert both[0]["output_ids"] == alone


@pytest.mark.parametrize("penalty", [{"repetition_penalty": 2.0}, {"frequency_penalty": 2.0, "presence_penalty": 2.0}])
def test_penalties_count_tokens_a_grammar_jumped_over(engine, penalty):
    """Tokens a grammar forces are appended unsampled (jump-forward); the penalties left them out of their counts,
    so the output changed with jumping (fuzzing, session 28). A request with logprobs does not jump: both agree."""
    regex = r" (Yes|No), Paris is the capital of France\. The capital of France is [A-Za-z ]{3,30}\."
    params = {"max_new_tokens": 32, "temperature": 0, "regex": regex, **penalty}
    prompt = "Q: What is the capital of France? A:"
    jumped = engine.generate(prompt, params)
    sampled = engine.generate(prompt, params, return_logprob=True)
    assert jumped["meta_info"]["jump_forward_tokens"] > 0 and sampled["meta_info"].get("jump_forward_tokens", 0) == 0
    assert jumped["output_ids"] == sampled["output_ids"]


@pytest.mark.parametrize("regex", ["(\U0001f600\U0001f389\u65e5\u672c\u8a9ee\u0301){2}",
                                   "\U0001f600\U0001f389\u65e5\u672c\u8a9ee\u0301[a-z ]{1,20}"])
def test_a_stop_inside_jumped_tokens_ends_the_output_where_sampling_would(engine, regex):
    """A grammar's forced run past a stop string: the output (ids, usage) ends at the token completing the stop, as
    it does for a request with logprobs (which does not jump); before, all 30 jumped ids stayed, or a token sampled
    after them (fuzzing, session 28)."""
    params = {"max_new_tokens": 32, "temperature": 0, "regex": regex, "stop": ["\u8a9ee"]}
    jumped = engine.generate("Emoji:", params)
    sampled = engine.generate("Emoji:", params, return_logprob=True)
    assert jumped["meta_info"]["jump_forward_tokens"] > 0
    assert jumped["text"] == sampled["text"] == "\U0001f600\U0001f389\u65e5\u672c"
    assert jumped["output_ids"] == sampled["output_ids"]
    assert jumped["meta_info"]["completion_tokens"] == len(sampled["output_ids"])


def test_frequency_and_presence_penalties_reduce_repeats(engine):
    prompt = "Repeat after me: la la la la la la la la"
    plain = engine.generate(prompt, {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True})["output_ids"]
    pen = engine.generate(prompt, {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True,
                                   "frequency_penalty": 2.0, "presence_penalty": 2.0})["output_ids"]
    assert len(set(pen)) > len(set(plain))


def test_streaming_grows_to_the_final_result(engine):
    chunks = list(engine.generate("The capital of France is", GREEDY, stream=True))
    final = engine.generate("The capital of France is", GREEDY)
    assert len(chunks) >= 2
    assert chunks[-1]["output_ids"] == final["output_ids"] and chunks[-1]["text"] == final["text"]
    lens = [len(c["output_ids"]) for c in chunks]
    assert lens == sorted(lens)
    assert chunks[-1]["meta_info"]["finish_reason"] is not None
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_max_new_tokens_zero_prefills_only(engine):
    out = engine.generate(PROMPTS[2], {"max_new_tokens": 0})
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"]["type"] == "length"
    again = engine.generate(PROMPTS[2], {"max_new_tokens": 1})
    assert again["meta_info"]["cached_tokens"] == again["meta_info"]["prompt_tokens"] - 1


def test_grammar_compile_queue_full_raises_server_busy(engine, monkeypatch):
    """A grammar still queued behind busy compile workers past the queue bound is a 503 over
    HTTP; in-process it raises ServerBusyError (not an abort output), streamed or not, and the
    engine keeps serving."""
    import threading

    from radixflow import ServerBusyError
    from radixflow.constrained import backend as backend_module
    from radixflow.runtime.scheduling.grammar_wait import start_grammar_backend

    backend = engine.stepper.exclusive(lambda: start_grammar_backend(engine.scheduler))
    backend.impl  # built before the workers are taken
    monkeypatch.setattr(backend, "timeout_s", 0.05)
    monkeypatch.setattr(backend_module, "QUEUE_LIMIT_FACTOR", 1)
    gate = threading.Event()
    busy = [backend.cache.pool.submit(gate.wait, 30) for _ in range(backend.cache.pool._max_workers)]
    try:
        params = {"max_new_tokens": 4, "json_schema": '{"type": "integer", "minimum": 7}'}
        with pytest.raises(ServerBusyError, match="--grammar-compile-workers") as busy_error:
            engine.generate("n =", params)
        # not bad input: handlers that answer a RadixflowError with a 400 must let it through
        assert not isinstance(busy_error.value, RadixflowError)
        with pytest.raises(ServerBusyError, match="--grammar-compile-workers"):
            list(engine.generate("n =", {**params, "json_schema": '{"type": "integer", "minimum": 8}'}, stream=True))
    finally:
        gate.set()
        for f in busy:
            f.result(timeout=30)
    assert engine.generate("1, 2,", {"max_new_tokens": 2, "temperature": 0})["meta_info"]["finish_reason"]["type"] == "length"


class _Cycle:
    me: "_Cycle"


def _seen_by_gc(obj) -> bool:
    """Whether the cyclic garbage collector walks obj (gc.get_objects leaves frozen objects out)."""
    return any(o is obj for o in gc.get_objects())


def test_the_first_engine_freezes_start_up_objects_and_a_later_one_is_still_collected(monkeypatch):
    """A full collection would otherwise walk the model's and tokenizer's objects inside some pass.
    An engine made while that freeze is in place is not frozen: its cycles must be collectable
    after its shutdown, not kept until the first engine goes."""
    gc.unfreeze()  # the session's engine is frozen already: count these engines alone
    monkeypatch.setattr(gc_freeze, "_state", gc_freeze.FreezeState())
    garbage = _Cycle()
    garbage.me, dropped = garbage, weakref.ref(garbage)
    del garbage
    gc.disable()  # so only the freeze's own collection can free the garbage before it is frozen
    try:
        first = Engine(max_total_tokens=160)
    finally:
        gc.enable()
    assert dropped() is None
    model = first.runner.model
    try:
        second = Engine(max_total_tokens=160)
        second.generate("1, 2,", {"max_new_tokens": 2})
        assert not _seen_by_gc(model) and _seen_by_gc(second.runner.model)
        runner = weakref.ref(second.runner)
        second.shutdown()
        del second
        gc.collect()
        assert runner() is None  # not kept frozen until the first engine goes
        assert not _seen_by_gc(model)
    finally:
        first.shutdown()
    assert _seen_by_gc(model)  # what the engines leave behind can be collected


def test_shutdown_empties_the_weights_even_of_a_model_someone_still_holds():
    """A reference that outlives the engine (a frozen cycle, a caller's variable) must not keep its weights: the
    next engine's KV pool is sized from the free memory."""
    eng = Engine(max_total_tokens=160)
    model = eng.runner.model
    assert sum(p.numel() for p in model.parameters()) > 0
    eng.shutdown()
    assert all(p.numel() == 0 for p in model.parameters())
    assert all(b.numel() == 0 for b in model.buffers())


def test_engine_dropped_without_shutdown_gives_back_its_freeze(monkeypatch):
    gc.unfreeze()
    monkeypatch.setattr(gc_freeze, "_state", gc_freeze.FreezeState())
    eng = Engine(max_total_tokens=160)
    assert gc_freeze._state.held
    eng.generate("1, 2,", {"max_new_tokens": 2})
    runner = weakref.ref(eng.runner)
    del eng
    assert not gc_freeze._state.held
    gc.collect()
    assert runner() is None


def test_freeze_gc_after_warm_up_takes_what_requests_made_out_of_full_collections(monkeypatch):
    """Kernels compiled for new shapes and their caches are made by the first requests, after
    start-up's freeze; a full collection would walk them in every later step. No engine freezes
    while another is alive: the other's runner and KV pool must go at its shutdown."""
    gc.unfreeze()
    monkeypatch.setattr(gc_freeze, "_state", gc_freeze.FreezeState())
    owner = Engine(max_total_tokens=160)
    try:
        owner.generate("1, 2,", {"max_new_tokens": 2})
        made_by_warm_up = [_Cycle()]  # stands in for what the warm-up requests keep
        other = Engine(max_total_tokens=160)
        runner = weakref.ref(other.runner)
        try:
            assert other.freeze_gc() == 0 and owner.freeze_gc() == 0  # other is alive
            assert _seen_by_gc(made_by_warm_up) and _seen_by_gc(other.runner.model)
        finally:
            other.shutdown()
        del other
        gc.collect()
        assert runner() is None
        garbage = _Cycle()
        garbage.me, dropped = garbage, weakref.ref(garbage)
        del garbage
        gc.disable()  # so only freeze_gc's own collection can free the garbage before it is frozen
        try:
            frozen = owner.freeze_gc()
        finally:
            gc.enable()
        assert frozen > 0 and not _seen_by_gc(made_by_warm_up) and dropped() is None
    finally:
        owner.shutdown()
    assert _seen_by_gc(made_by_warm_up)  # the owner's release thaws it with start-up's objects
    with pytest.raises(RuntimeError, match="shut down"):
        owner.freeze_gc()


def test_the_only_live_engine_takes_the_freeze_once_its_owner_is_gone(monkeypatch):
    """Swapping models (make the new engine, then shut the old one down) must not leave the new
    one unfrozen for good; an engine made while another is alive must not freeze it."""
    gc.unfreeze()
    monkeypatch.setattr(gc_freeze, "_state", gc_freeze.FreezeState())
    old = Engine(max_total_tokens=160)
    new = Engine(max_total_tokens=160)
    try:
        assert _seen_by_gc(new.runner.model)
        old.shutdown()
        third = Engine(max_total_tokens=160)  # new is alive: third must not freeze it
        runner = weakref.ref(third.runner)
        assert _seen_by_gc(new.runner.model) and _seen_by_gc(third.runner.model)
        third.shutdown()
        del third
        gc.collect()
        assert runner() is None
        assert new.freeze_gc() > 0 and not _seen_by_gc(new.runner.model)
        model = new.runner.model
    finally:
        new.shutdown()
    assert _seen_by_gc(model) and not gc_freeze._state.held and gc_freeze._state.live == 0


def test_a_freeze_after_release_declines_without_raising(monkeypatch):
    """freeze_gc() racing shutdown() on another thread: 0, not an AssertionError or an orphan freeze."""
    monkeypatch.setattr(gc_freeze, "_state", gc_freeze.FreezeState())
    part = gc_freeze.EngineFreeze()
    part.release()
    part.release()
    assert part.freeze("freeze_gc") == 0 and gc_freeze._state == gc_freeze.FreezeState()


def test_shutdown_frees_the_kv_pool_and_weights_whoever_keeps_the_runner(monkeypatch):
    """A frozen cycle (someone else's freeze is never thawed) or a caller may keep the runner
    after shutdown: on a GPU its KV pool is tens of GB."""
    monkeypatch.setattr(gc_freeze, "_state", gc_freeze.FreezeState())
    eng = Engine(max_total_tokens=160)
    eng.generate("1, 2,", {"max_new_tokens": 2})
    runner, pool, table = eng.runner, eng.runner.kv_pool, eng.runner.req_to_token
    model, backend = weakref.ref(runner.model), weakref.ref(runner.backend)
    eng.shutdown()
    assert pool.k == [] and pool.v == [] and runner.model is None
    assert table.table.numel() == 0 and table.host.numel() == 0
    gc.collect()
    assert model() is None and backend() is None


def test_an_earlier_freeze_by_someone_else_is_kept_and_the_engine_still_freezes(monkeypatch, caplog):
    """Objects frozen before the engine (an application's freeze before fork) must not stop its
    own (every full collection would walk the model), and its shutdown must not thaw theirs
    (gc has no partial unfreeze: both stay frozen)."""
    gc.unfreeze()
    monkeypatch.setattr(gc_freeze, "_state", gc_freeze.FreezeState())
    theirs = [_Cycle()]
    gc.freeze()  # someone else's freeze, before the engine
    try:
        with caplog.at_level("WARNING", logger=gc_freeze.__name__):
            eng = Engine(max_total_tokens=160)
        model = eng.runner.model
        try:
            assert not _seen_by_gc(model) and gc_freeze._state.held
            assert "stay frozen" in caplog.text
        finally:
            eng.shutdown()
        assert not _seen_by_gc(theirs) and not gc_freeze._state.held
    finally:
        gc.unfreeze()


def test_disable_gc_freeze_leaves_the_collector_alone(monkeypatch):
    gc.unfreeze()
    monkeypatch.setattr(gc_freeze, "_state", gc_freeze.FreezeState())
    with Engine(max_total_tokens=160, disable_gc_freeze=True) as eng:
        assert _seen_by_gc(eng.runner.model) and eng.freeze_gc() == 0 and gc.get_freeze_count() == 0


def test_async_generate_as_sglang_has_it(engine):
    """SGLang's Engine.async_generate: awaited results equal generate()'s, stream=True gives an async iterator, bad
    input raises at the await, and a stream dropped early or a call cancelled is aborted (nothing left running)."""
    import asyncio

    params = {"max_new_tokens": 5, "temperature": 0}

    async def main():
        many = await asyncio.gather(*[engine.async_generate(f"Count {i}:", params) for i in range(3)])
        chunks = [c async for c in await engine.async_generate("Hello", params, stream=True)]
        with pytest.raises(RadixflowError, match="unknown sampling param"):
            await engine.async_generate("x", {"temprature": 0})
        long = {**params, "max_new_tokens": 60, "ignore_eos": True}
        dropped = await engine.async_generate("Hello", long, stream=True)
        async for _ in dropped:
            break
        await dropped.aclose()
        endless = {**long, "max_new_tokens": 4000}  # runs for seconds even on a GPU: a missed abort is still running
        for stream in (True, False):  # cancelled mid-run (the review found a ValueError and requests left running)
            async def consume(stream=stream):
                out = await engine.async_generate("Hello", endless, stream=stream)
                return [c async for c in out] if stream else out

            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(consume(), timeout=0.3)
            await asyncio.sleep(0.5)  # the worker closes a dropped stream after its current step
            assert not engine.scheduler.running and not engine.scheduler.waiting, stream
        return many, chunks

    many, chunks = asyncio.run(main())
    assert [m["text"] for m in many] == [engine.generate(f"Count {i}:", params)["text"] for i in range(3)]
    assert chunks[-1]["text"] == engine.generate("Hello", params)["text"] and len(chunks) > 1
    assert not engine.scheduler.running and not engine.scheduler.waiting


def test_a_batched_stream_sends_each_request_once_finished(engine):
    """Once one request of a batched stream had finished, it was sent again (finished) at every later step of the
    others, each time decoded and built anew (review, session 30: 29 finished events for one request)."""
    events = list(engine.generate(["1, 2, 3,", "Tell me a story."], [{"max_new_tokens": 2, "temperature": 0},
                                  {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}], stream=True))
    finished = [e["index"] for e in events if e["meta_info"]["finish_reason"] is not None]
    assert sorted(finished) == [0, 1]
    assert events[-1]["meta_info"]["completion_tokens"] == 12
