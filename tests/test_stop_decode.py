"""The stop checker's decode of a request's tail: the tokenizers backend called directly where that
gives transformers' text, transformers' decode otherwise."""

from __future__ import annotations

import random

import pytest

from radixflow.model_files import load_tokenizer, resolve_model
from radixflow.runtime.scheduling.stop_checker import backend_decode


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
    tok.clean_up_tokenization_spaces = True
    try:
        seen = []
        tok.decode = lambda ids, skip_special_tokens: seen.append(ids) or ""
        backend_decode(tok)([3], False)  # its probe found the wrapper's text different: the wrapper it is
        assert seen[-1] == [3]
    finally:
        tok.clean_up_tokenization_spaces = False
        del tok.decode


def test_a_clean_up_that_changes_nothing_keeps_the_fast_path(tok):
    """clean_up_tokenization_spaces set (as some checkpoints' configs do) on a tokenizer whose wrapper skips
    it (transformers 5, BPE): the probe finds the same text, so the backend is called, with the same text."""
    tok.clean_up_tokenization_spaces = True
    try:
        text = type(tok).decode(tok, tok.encode("a . b , c 's d"), skip_special_tokens=True)
        decode = backend_decode(tok)
        tok.decode = lambda *a, **k: pytest.fail("the wrapper was called")
        assert decode(tok.encode("a . b , c 's d"), True) == text
    finally:
        tok.clean_up_tokenization_spaces = False
        tok.__dict__.pop("decode", None)
