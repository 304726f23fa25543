"""Takes what start-up made out of the cyclic garbage collector's view, shared by every engine of a process.

A full collection walks every tracked object: the model's modules, the tokenizer, kernel caches
(a few hundred thousand objects), so without this it pauses a forward pass now and then for as
long as that walk takes. `gc.freeze()` moves them to a permanent generation that collections skip.

Several engines may live in one process (tests, benchmarks, an application with two models), and
`gc.unfreeze()` thaws everything at once. So each engine holds a share of the freeze, and only the
last share's release unfreezes. If objects were already frozen before the first share was taken
(the host application froze them), the release leaves them frozen: unfreezing would undo its freeze.
"""

from __future__ import annotations

import gc
import threading
from dataclasses import dataclass


@dataclass
class FreezeShares:
    count: int = 0  # engines holding a share of the freeze
    host_frozen: bool = False  # objects were frozen before the first share: not ours to unfreeze


_shares = FreezeShares()
_lock = threading.Lock()


def freeze_startup_objects() -> None:
    """Collect, then freeze every object alive now; one share, released by release_startup_objects."""
    gc.collect()  # garbage alive now (a dropped engine's cycles, with its KV pool) would be kept for good
    with _lock:
        if _shares.count == 0:
            _shares.host_frozen = gc.get_freeze_count() > 0
        _shares.count += 1
        gc.freeze()


def release_startup_objects() -> None:
    """Give back one share; the last one unfreezes, so what the engines left behind can be collected."""
    with _lock:
        assert _shares.count > 0, "more releases than freezes"
        _shares.count -= 1
        if _shares.count == 0 and not _shares.host_frozen:
            gc.unfreeze()
