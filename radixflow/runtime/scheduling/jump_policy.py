"""When a step may jump forward after its sampled tokens, and how far, under overlap scheduling.

Without overlap a jump's tokens go in one extend pass, saving passes. With it they are fed one a
decode pass, so an llguidance jump saves none (its forced tokens are the ones its masks allow
anyway) while its host work (every row, every step) bounds a large batch's step: there only the
jump at admission is taken. Rows whose matcher says `jumps_in_any_batch` (outlines) jump there too,
but only by appending: a jump that re-tokenizes the sampled token cuts it back, and the pass already
launched on that token is wasted, so the row takes one pass more than it saves in tokens.
"""

from __future__ import annotations

from typing import Optional

from radixflow.runtime.scheduling.overlap import MAX_FED_TOKENS


def decode_rows(running: list, advanced: list) -> int:
    """The decode batch after a step: the running rows and the advanced ones that join them."""
    if not advanced:
        return len(running)
    ids = {id(r) for r in running}
    return len(ids) + sum(id(r) not in ids for r in advanced)


def jumps_after_sampling(overlap: bool, batch_rows: int, max_batch: int) -> bool:
    """Whether a decode batch of `batch_rows` rows jumps forward after its sampled tokens."""
    return not overlap or batch_rows <= max_batch


def jump_limit(overlap: bool, seq_len: int, kv_len: int) -> Optional[int]:
    """The most tokens a jump after a sampled token may append (None: no limit). Under overlap a
    row left with more than MAX_FED_TOKENS tokens without KV cannot overlap and would drain the
    whole batch for an extend pass (one slack token: a jump may first cut one back; a jump without
    cuts, above --jump-forward-max-batch, leaves it unused)."""
    return MAX_FED_TOKENS - (seq_len - kv_len) - 1 if overlap else None
