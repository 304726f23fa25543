"""Greedy outputs and logprobs agree with Hugging Face transformers on the real model."""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPTS
from radixflow import Engine, RadixflowError

MAX_NEW = 24


def hf_greedy(hf_model, tokenizer, prompt: str, max_new: int) -> list[int]:
    ids = torch.tensor([tokenizer.encode(prompt)])
    with torch.no_grad():
        out = hf_model.generate(ids, max_new_tokens=max_new, do_sample=False, attention_mask=torch.ones_like(ids))
    return out[0, ids.shape[1] :].tolist()


@pytest.fixture(scope="module")
def hf_outputs(hf_model, tokenizer):
    return [hf_greedy(hf_model, tokenizer, p, MAX_NEW) for p in PROMPTS]


GREEDY = {"max_new_tokens": MAX_NEW, "temperature": 0}


def test_greedy_batch_matches_transformers_with_radix_cache(engine, hf_outputs):
    engine.flush_cache()
    first = engine.generate(PROMPTS, GREEDY)
    assert [o["output_ids"] for o in first] == hf_outputs
    second = engine.generate(PROMPTS, GREEDY)
    assert [o["output_ids"] for o in second] == hf_outputs
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in second)
    assert all(o["meta_info"]["cached_tokens"] == o["meta_info"]["prompt_tokens"] - 1 for o in second)


def test_greedy_batch_matches_transformers_without_radix_cache(engine, hf_outputs):
    with Engine(disable_radix_cache=True) as e:
        for _ in range(2):
            outs = e.generate(PROMPTS, GREEDY)
            assert [o["output_ids"] for o in outs] == hf_outputs
            assert all(o["meta_info"]["cached_tokens"] == 0 for o in outs)


def test_chunked_prefill_matches_transformers(engine, hf_outputs, tokenizer):
    chunk = 4
    with Engine(chunked_prefill_size=chunk) as e:
        chunks: dict[str, int] = {}
        run_extend = e.scheduler._run_extend

        def counting(batch):
            for req, n in batch:
                if req.kv_len < len(req.origin_input_ids):  # a prompt chunk, not a continuation
                    chunks[req.rid] = chunks.get(req.rid, 0) + 1
            return run_extend(batch)

        e.scheduler._run_extend = counting
        outs = e.generate(PROMPTS, GREEDY, rid=[f"r{i}" for i in range(len(PROMPTS))])
        assert [o["output_ids"] for o in outs] == hf_outputs
        long_ones = [f"r{i}" for i, p in enumerate(PROMPTS) if len(tokenizer.encode(p)) >= 3 * chunk]
        assert len(long_ones) >= 4
        assert all(chunks[r] >= 3 for r in long_ones), chunks


def test_page_size_4_matches_transformers(hf_outputs):
    with Engine(page_size=4) as e:
        for _ in range(2):
            outs = e.generate(PROMPTS, GREEDY)
            assert [o["output_ids"] for o in outs] == hf_outputs
        assert any(o["meta_info"]["cached_tokens"] > 0 for o in outs)
        assert all(o["meta_info"]["cached_tokens"] % 4 == 0 for o in outs)


def test_logprobs_match_transformers(engine, hf_model, tokenizer):
    prompt = PROMPTS[2]
    out = engine.generate(
        prompt, {"max_new_tokens": 8, "temperature": 0}, return_logprob=True, logprob_start_len=0, top_logprobs_num=3
    )
    ids = tokenizer.encode(prompt) + out["output_ids"]
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    ref = torch.log_softmax(logits, dim=-1)
    n_prompt = len(tokenizer.encode(prompt))
    m = out["meta_info"]
    inp = m["input_token_logprobs"]
    assert len(inp) == n_prompt and inp[0][0] is None and inp[0][1] == ids[0]
    for pos in range(1, n_prompt):
        lp, tid, _ = inp[pos]
        assert tid == ids[pos]
        assert abs(lp - ref[pos - 1, tid].item()) < 1e-3
    outp = m["output_token_logprobs"]
    assert len(outp) == 8
    for j, (lp, tid, text) in enumerate(outp):
        assert tid == out["output_ids"][j] and isinstance(text, str)
        assert abs(lp - ref[n_prompt - 1 + j, tid].item()) < 1e-3
    top = m["output_top_logprobs"][0]
    ref_vals, ref_ids = ref[n_prompt - 1].topk(3)
    assert [t[1] for t in top] == ref_ids.tolist()
    assert all(abs(t[0] - v) < 1e-3 for t, v in zip(top, ref_vals.tolist()))


def test_input_logprobs_from_start_len_with_cached_prefix(engine, hf_model, tokenizer):
    prompt = PROMPTS[7]
    engine.generate(prompt, {"max_new_tokens": 1})  # cache the whole prompt
    start = 10
    out = engine.generate(prompt, {"max_new_tokens": 1, "temperature": 0}, return_logprob=True, logprob_start_len=start)
    _check_input_logprobs(out, tokenizer.encode(prompt), start, hf_model)
    assert out["meta_info"]["cached_tokens"] == start - 1


def _check_input_logprobs(out: dict, ids: list, start: int, hf_model) -> torch.Tensor:
    """out's input logprobs from `start` match transformers'; returns transformers' log-softmax."""
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)
    inp = out["meta_info"]["input_token_logprobs"]
    assert [t[1] for t in inp] == ids[start:]
    for k, (lp, tid, _) in enumerate(inp):
        assert abs(lp - ref[start + k - 1, tid].item()) < 1e-3
    return ref


def test_input_logprobs_from_start_len_compute_only_the_logits_they_use(engine, hf_model, tokenizer, monkeypatch):
    """An uncached prompt with logprob_start_len = start computes the whole prompt but the logits
    of positions start-1 .. end only (a select's scoring request needs those of its choice)."""
    prompt, start = " ".join(PROMPTS[:4]), 9
    ids = tokenizer.encode(prompt)
    rows = []
    forward = engine.runner.forward
    monkeypatch.setattr(engine.runner, "forward", lambda fb: rows.append(fb.logits_indices.numel()) or forward(fb))
    engine.flush_cache()
    out = engine.generate(prompt, {"max_new_tokens": 1, "temperature": 0}, return_logprob=True, logprob_start_len=start)
    assert out["meta_info"]["cached_tokens"] == 0 and rows == [len(ids) - start + 1]
    ref = _check_input_logprobs(out, ids, start, hf_model)
    assert out["output_ids"] == [int(ref[-1].argmax())]


def test_input_logprobs_of_a_batch_match_transformers(engine, hf_model, tokenizer, monkeypatch):
    """A pass's input logprobs are computed together, in chunks of rows (logprobs.add_inputs);
    small chunks here, so requests are split across them: each prompt's values and top tokens
    still match transformers."""
    from radixflow.runtime.scheduling import logprobs

    monkeypatch.setattr(logprobs, "CHUNK_ROWS", 8)  # the first two prompts share a chunk
    prompts = PROMPTS[:3]
    outs = engine.generate(prompts, {"max_new_tokens": 1, "temperature": 0}, return_logprob=True, logprob_start_len=2,
                           top_logprobs_num=2)  # fmt: skip
    for prompt, out in zip(prompts, outs):
        ids = tokenizer.encode(prompt)
        with torch.no_grad():
            ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)
        inp, top = out["meta_info"]["input_token_logprobs"], out["meta_info"]["input_top_logprobs"]
        assert [t[1] for t in inp] == ids[2:] and len(top) == len(ids) - 2
        for k, ((lp, tid, _), best) in enumerate(zip(inp, top)):
            assert abs(lp - ref[k + 1, tid].item()) < 1e-3
            assert [t[1] for t in best] == ref[k + 1].topk(2).indices.tolist()


def test_token_ids_logprob_gives_the_asked_ids_logprobs_at_every_position(engine, hf_model, tokenizer):
    """SGLang's token_ids_logprob: at each prompt position (from logprob_start_len) and each output token, the
    logprobs of the asked ids in their order, against transformers; the same when streamed; per prompt in a batch."""
    prompt, params = PROMPTS[2], {"max_new_tokens": 4, "temperature": 0}
    asked = [tokenizer.encode(prompt)[3], 7042, 5]
    out = engine.generate(prompt, params, return_logprob=True, logprob_start_len=0, token_ids_logprob=asked)
    ids = tokenizer.encode(prompt) + out["output_ids"]
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)
    m, n_prompt = out["meta_info"], len(tokenizer.encode(prompt))
    rows = m["input_token_ids_logprobs"] + m["output_token_ids_logprobs"]
    assert m["input_token_ids_logprobs"][0] is None and len(rows) == n_prompt + 4
    for pos, row in enumerate(rows[1:], start=1):
        assert [t[1] for t in row] == asked and all(isinstance(t[2], str) for t in row)
        for lp, tid, _ in row:
            assert abs(lp - ref[pos - 1, tid].item()) < 1e-3
    streamed = list(engine.generate(prompt, params, return_logprob=True, logprob_start_len=0, token_ids_logprob=asked,
                                    stream=True))[-1]["meta_info"]
    assert streamed["output_token_ids_logprobs"] == m["output_token_ids_logprobs"]
    assert streamed["input_token_ids_logprobs"] == m["input_token_ids_logprobs"]
    both = engine.generate([prompt, "Hello"], params, return_logprob=True, token_ids_logprob=[[5], None])
    assert [len(r) for r in both[0]["meta_info"]["output_token_ids_logprobs"]] == [1] * 4
    assert "output_token_ids_logprobs" not in both[1]["meta_info"]
    for bad in ([-1], [10**9], "x", [[1], [2], [3]]):
        with pytest.raises(RadixflowError, match="token_ids_logprob"):
            engine.generate(prompt, params, return_logprob=True, token_ids_logprob=bad)


def test_a_selects_choices_share_its_short_uncached_context(engine, hf_model, tokenizer, monkeypatch):
    """A select scores each choice as prompt + choice (prompt-only requests, logprobs from the
    choice on). With the prompt uncached, over a handful of tokens and shorter than the
    in-batch sharing threshold (the GPU's, 32: the CPU's would defer them anyway), the first
    choice computes it and the others wait a pass and compute the position before their choice
    and the choice only. The logprobs match transformers."""
    from radixflow.runtime.scheduling import admission
    from radixflow.runtime.server_args import IN_BATCH_PREFIX_THRESHOLD

    monkeypatch.setattr(engine.scheduler.args, "in_batch_prefix_threshold", IN_BATCH_PREFIX_THRESHOLD["cuda"])
    prompt = tokenizer.encode("The weather report for the small villages high up in the northern mountains this coming weekend says that it will be")
    choices = [tokenizer.encode(c, add_special_tokens=False) for c in (" sunny and warm", " cold", " windy", " rainy again")]
    assert admission.SCORING_SHARE_MIN <= len(prompt) - 1 < IN_BATCH_PREFIX_THRESHOLD["cuda"]
    engine.flush_cache()
    before = engine.scheduler.stats.extend_tokens
    outs = engine.generate(input_ids=[prompt + c for c in choices], sampling_params={"max_new_tokens": 0},
                           return_logprob=True, logprob_start_len=len(prompt))  # fmt: skip
    computed = engine.scheduler.stats.extend_tokens - before
    assert computed == len(prompt) + len(choices[0]) + sum(1 + len(c) for c in choices[1:])
    for c, out in zip(choices, outs):
        _check_input_logprobs(out, prompt + c, len(prompt), hf_model)


def test_select_choices_sharing_leading_tokens_are_scored_in_one_pass(engine, hf_model, tokenizer, monkeypatch):
    """A select's scoring requests (prompt + choice from the choice on, and with
    unconditional_likelihood_normalized each choice alone from its start) whose choices share
    a long leading part: those tokens are scored again for every choice, so none of them waits
    for another's KV: one pass admits them all. The logprobs match transformers."""
    shared = tokenizer.encode(" in the large old house at the end of the quiet street where the river meets the sea,", add_special_tokens=False)
    assert len(shared) >= 16
    choices = [shared + tokenizer.encode(c, add_special_tokens=False) for c in (" yes", " no", " maybe so")]
    prompt = tokenizer.encode("They lived")
    passes: list[int] = []
    forward = engine.runner.forward
    monkeypatch.setattr(engine.runner, "forward", lambda fb: passes.append(1) or forward(fb))
    engine.flush_cache()
    inputs = [prompt + c for c in choices] + choices
    outs = engine.generate(input_ids=inputs, sampling_params={"max_new_tokens": 0}, return_logprob=True,
                           logprob_start_len=[len(prompt)] * len(choices) + [0] * len(choices))  # fmt: skip
    assert len(passes) == 1
    for c, out in zip(choices, outs):
        _check_input_logprobs(out, prompt + c, len(prompt), hf_model)
    for c, out in zip(choices, outs[len(choices):]):
        inp = out["meta_info"]["input_token_logprobs"]
        assert inp[0][0] is None and [t[1] for t in inp] == c
        _check_input_logprobs({"meta_info": {"input_token_logprobs": inp[1:]}}, c, 1, hf_model)
