"""The stop checker's decode of a request's tail: the tokenizers backend called directly where that
gives transformers' text, transformers' decode otherwise."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from radixflow.model_files import load_tokenizer, resolve_model
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduling.req import Req
from radixflow.runtime.scheduling.scheduler import Scheduler
from radixflow.runtime.scheduling.stop_checker import StopChecker, backend_decode


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model(None).path)


def test_the_default_tokenizer_decodes_through_its_backend_with_transformers_text(tok):
    rng = random.Random(0)
    special = sorted(set(tok.all_special_ids))
    decode = backend_decode(tok)
    tok.decode = lambda *a, **k: pytest.fail("the wrapper was called")  # the instance's: the fast path must not use it
    try:
        for _ in range(300):
            ids = [rng.choice(special) if rng.random() < 0.2 else rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 12))]
            for skip in (True, False):
                assert decode(ids, skip) == type(tok).decode(tok, ids, skip_special_tokens=skip)
    finally:
        del tok.decode


def test_tokenizers_that_change_the_backends_text_keep_transformers_decode(tok):
    calls = []

    class Cleaning(type(tok)):
        def _decode(self, *a, **k):  # a subclass's own decoding (as some models' tokenizers have)
            calls.append(1)
            return super()._decode(*a, **k)

    sub = Cleaning.__new__(Cleaning)
    sub.__dict__.update(tok.__dict__)
    backend_decode(sub)([1, 2], True)
    assert calls == [1]
    saved = tok.clean_up_tokenization_spaces
    tok.clean_up_tokenization_spaces = True
    try:
        seen = []
        tok.decode = lambda ids, skip_special_tokens: seen.append(ids) or ""  # a decode whose text differs
        backend_decode(tok)([3], False)
        assert seen[-1] == [3]
        seen.clear()
        cleaned = lambda ids, skip_special_tokens: tok.clean_up_tokenization(type(tok).decode(tok, ids, skip_special_tokens=skip_special_tokens))
        tok.decode = lambda ids, skip_special_tokens: seen.append(ids) or cleaned(ids, skip_special_tokens)
        backend_decode(tok)([3], False)  # a clean-up transformers applies: " ." becomes "."
        assert seen[-1] == [3]
    finally:
        tok.clean_up_tokenization_spaces = saved
        del tok.decode


def test_a_clean_up_transformers_skips_still_takes_the_backend_path(tok):
    """As for Llama-3: clean_up_tokenization_spaces is true, but transformers ignores it for a BPE
    tokenizer, so the backend's text is transformers' text."""
    saved = tok.clean_up_tokenization_spaces
    tok.clean_up_tokenization_spaces = True
    try:
        decode = backend_decode(tok)
        tok.decode = lambda *a, **k: pytest.fail("the wrapper was called")
        for ids in (tok.encode("it isn't here . Or , is it ?", add_special_tokens=False), [1, 2, 3]):
            for skip in (True, False):
                assert decode(ids, skip) == type(tok).decode(tok, ids, skip_special_tokens=skip)
    finally:
        tok.clean_up_tokenization_spaces = saved
        del tok.decode


def test_a_stop_string_inside_a_jumps_tokens_is_found(tok):
    """A jump appends many tokens at once, checked once: the decoded window must reach back to its first."""
    stops = StopChecker(tok, eos_ids=set())
    req = Req("r", [1], SamplingParams.from_dict({"max_new_tokens": 100, "stop": ["END"]}), output_ids=tok.encode("hello", add_special_tokens=False))
    forced = tok.encode(" END of the text that the grammar forces here and goes on", add_special_tokens=False)[:10]
    assert len(forced) == 10 and "END" in tok.decode(forced)
    scheduler = SimpleNamespace(jump_forward=lambda *a: forced, stops=stops, runner=SimpleNamespace(context_len=10**6))
    Scheduler._apply_jump_forward(scheduler, req)
    assert req.output_ids[-10:] == forced and req.finish_reason == {"type": "stop", "matched": "END"}
