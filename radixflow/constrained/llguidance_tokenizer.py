"""llguidance's view of a Hugging Face tokenizer: an `LLTokenizer` built once per tokenizer
from the fast tokenizer's JSON, checked to read every token as the bytes it decodes to."""

from __future__ import annotations

import json
import re
from importlib import metadata

from llguidance import LLTokenizer

from radixflow.constrained.options import TokenizerInfo
from radixflow.constrained.vocabulary import plain_rust_tokenizer
from radixflow.errors import GrammarError

_TOKENIZERS: dict = {}
# LLTokenizer takes several EOS ids as a list from this version (pyproject pins llguidance>=1.9.1,<2);
# older ones fail every grammar with a TypeError that reads like the grammar's fault
NEEDED = (1, 9, 1)


def check_version(installed: str | None = None) -> None:
    """RadixflowError naming the fix where the installed llguidance (or `installed`) is older than NEEDED."""
    version = metadata.version("llguidance") if installed is None else installed
    parts = tuple(int(x) for x in re.findall(r"\d+", version)[:3])
    if parts < NEEDED:
        need = ".".join(map(str, NEEDED))
        raise GrammarError(
            f"llguidance {version} is installed; radixflow's llguidance grammar backend needs llguidance>={need},<2: "
            f"pip install 'llguidance>={need},<2', or choose --grammar-backend outlines"
        )


def ll_tokenizer(info: TokenizerInfo) -> LLTokenizer:
    """Built once per tokenizer (about a second), from the fast tokenizer's JSON."""
    key = (id(info.tokenizer), info.vocab_size, info.eos_ids)
    hit = _TOKENIZERS.get(key)
    if hit is None:
        backend = plain_rust_tokenizer(info.tokenizer)
        if backend is None:
            raise GrammarError("the llguidance grammar backend needs a fast (tokenizer.json) tokenizer")
        ll = LLTokenizer(_without_byte_fallback(backend.to_str()), n_vocab=info.vocab_size, eos_token=list(info.eos_ids))
        _check_token_bytes(ll, info.tokenizer)
        hit = (info.tokenizer, ll)
        _TOKENIZERS[key] = hit
    return hit[1]


def _without_byte_fallback(tokenizer_json: str) -> str:
    """A byte-level BPE tokenizer (ByteLevel pre-tokenizer) marked `byte_fallback`, as
    some transformers versions convert the default GGUF's: llguidance then reads its tokens as
    sentencepiece pieces ("Ġ" stays "Ġ", not a space), so no mask allows the right text.
    Byte-level vocabularies hold every byte, so the flag changes no encoding: drop it."""
    doc = json.loads(tokenizer_json)
    model, pre = doc.get("model") or {}, doc.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    if not (model.get("byte_fallback") and any(step.get("type") == "ByteLevel" for step in steps)):
        return tokenizer_json
    model["byte_fallback"] = False
    doc["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    return json.dumps(doc)


_BYTES_PROBE = 'a <b>\n{"c": [1, 2.5]}\tdef f(x):'


def _check_token_bytes(ll: LLTokenizer, tokenizer) -> None:
    """llguidance must read the tokens as the bytes the tokenizer decodes them to (a leading
    space aside: sentencepiece decoders drop it); otherwise every mask would be wrong."""
    ids = tokenizer.encode(_BYTES_PROBE, add_special_tokens=False)
    mine, theirs = ll.decode_bytes(ids).lstrip(b" "), tokenizer.decode(ids).encode().lstrip(b" ")
    if mine != theirs:
        raise GrammarError(
            f"llguidance reads this tokenizer's tokens as other bytes than it decodes them to ({mine[:40]!r} "
            f"vs {theirs[:40]!r}), so its grammars cannot work; use --grammar-backend outlines, or "
            "re-create the tokenizer files (a GGUF converted by another transformers version may give a correct tokenizer.json)"
        )
