"""A tokenizer's encode and decode for program pieces and results, through the tokenizers backend
where that gives transformers' ids and text (checked once per tokenizer), else through transformers.

Programs tokenize every text piece and decode every gen (eager programs on their own threads, the
request-graph executor on the engine thread). transformers' wrappers are Python that holds the GIL
several times as long as the backend's own work on a short piece, while the engine thread needs the
GIL to launch passes; the backend's encode_batch releases it.
"""

from __future__ import annotations

import copy
import functools
import threading
import weakref
from typing import Any, Callable, Optional

from radixflow.errors import RadixflowError
from radixflow.runtime.scheduling.stop_checker import _defined_in, decode_backend, decode_with

BatchEncode = Callable[[list, bool], list]  # (texts, first) -> each text's token ids
Decode = Callable[[list, bool], str]  # (ids, skip_special_tokens) -> text

# transformers' modules whose encode hands the text to the tokenizers backend's encode_batch as it is
_STOCK_ENCODE = ("transformers.tokenization_utils_base", "transformers.tokenization_utils_tokenizers",
                 "transformers.tokenization_utils_fast")  # fmt: skip
_PROBE = "Hello world!\n\n  It's 3.14 -- naïve café, 日本語 <|endoftext|> <s></s> [CLS]\tend "
_ENCODERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_DECODERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # tokenizer -> (clean-up flag, backend|None)
_LOCK = threading.Lock()


def plain_encode(tokenizer, text: str, first: bool) -> list[int]:
    """transformers' encode of one piece (the reference the backend path is checked against)."""
    if first:
        return list(tokenizer.encode(text))
    return list(tokenizer.encode(text, add_special_tokens=False))


def batch_encoder(tokenizer) -> BatchEncode:
    """plain_encode over many texts: the tokenizers backend's encode_batch where that gives
    tokenizer.encode's ids (a stock fast tokenizer, checked on a probe), else plain_encode each."""
    try:
        found = _ENCODERS.get(tokenizer)  # the lock only on a miss
        if found is None:
            with _LOCK:
                found = _ENCODERS.get(tokenizer)
                if found is None:
                    found = _ENCODERS[tokenizer] = _make_encoder(weakref.ref(tokenizer))
        return found
    except TypeError:  # not weakly referenceable: work it out each time
        return _make_encoder(lambda: tokenizer)


def piece_decoder(tokenizer) -> Decode:
    """stop_checker.backend_decode, its check done once per tokenizer (again if the tokenizer's space
    clean-up setting changes, which decides whether the backend's text is transformers')."""
    clean = getattr(tokenizer, "clean_up_tokenization_spaces", None)
    try:
        found = _DECODERS.get(tokenizer)
        if found is None or found[0] is not clean:
            found = (clean, decode_backend(tokenizer))  # never the tokenizer itself: the key is held weakly
            with _LOCK:
                _DECODERS[tokenizer] = found
        backend = found[1]
    except TypeError:  # not weakly referenceable
        backend = decode_backend(tokenizer)
    return decode_with(tokenizer, backend)


def _make_encoder(tokenizer_ref: Callable[[], Any]) -> BatchEncode:
    """The encoder reaches its tokenizer through `tokenizer_ref` (a weakref when cached): a
    strong reference in the WeakKeyDictionary's value would keep its key alive forever."""

    def each(texts: list, first: bool) -> list:
        return [plain_encode(tokenizer_ref(), t, first) for t in texts]

    backend = _plain_backend(tokenizer_ref())
    if backend is None:
        return _text_only(each)

    def fast(texts: list, first: bool) -> list:
        split = bool(getattr(tokenizer_ref(), "split_special_tokens", False))
        if backend.encode_special_tokens != split:  # the setter borrows the Rust side mutably: only on a change
            backend.encode_special_tokens = split
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=first)]

    same = all(fast([_PROBE, _PROBE[5:]], first) == each([_PROBE, _PROBE[5:]], first) for first in (True, False))
    return _text_only(fast if same else each)


def _text_only(encode: BatchEncode) -> BatchEncode:
    """`encode`, with a lone surrogate in a text ('\\udcff': not UTF-8, so not text) refused by name: tokenizers
    raised a TypeError about its input types (found by fuzzing)."""

    @functools.wraps(encode)  # keeps its name: which path was chosen (fast or each) shows in tests
    def checked(texts: list, first: bool) -> list:
        try:
            return encode(texts, first)
        except (TypeError, UnicodeEncodeError):
            if all(isinstance(t, str) for t in texts) and any(_has_surrogate(t) for t in texts):
                raise RadixflowError("the program's text holds a lone surrogate (such as '\\udcff'), which is not "
                                     "text; remove it or decode the bytes it came from properly") from None
            raise

    return checked


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _plain_backend(tokenizer) -> Optional[object]:
    """A copy of a stock fast tokenizer's Rust side with padding and truncation off (transformers'
    encode switches them off on every call; a tokenizer.json may leave them on), else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    names = ("encode", "_encode_plus", "set_truncation_and_padding")
    if backend is None or not all(_defined_in(type(tokenizer), n) in _STOCK_ENCODE for n in names):
        return None
    backend = copy.copy(backend)
    backend.no_padding()
    backend.no_truncation()
    return backend
