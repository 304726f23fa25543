"""Takes what start-up made out of the cyclic garbage collector's view, shared by every engine of a process.

A full collection walks every tracked object: the model's modules, the tokenizer, kernel caches
(a few hundred thousand objects), so without this it pauses a forward pass now and then for as
long as that walk takes. `gc.freeze()` moves them to a permanent generation that collections skip.

Several engines may live in one process (tests, benchmarks, an application with two models), and
`gc.unfreeze()` thaws everything at once. So the freeze has one owner: the engine that made it,
when no freeze was in place. An engine made while another's freeze is in place is not frozen:
freezing it would keep its reference cycles (scheduler, runner, KV pool) out of reach of the
collector until the owner goes, long after its own shutdown. The owner's release unfreezes
everything, so objects that something else froze before it (a library's or a site hook's freeze)
are thawed with it: declining to freeze whenever anything was frozen first would leave every
start-up object in every full collection's walk.
"""

from __future__ import annotations

import gc
import threading
from dataclasses import dataclass


@dataclass
class FreezeState:
    held: bool = False  # an engine's freeze is in place


_state = FreezeState()
_lock = threading.Lock()


def freeze_startup_objects() -> bool:
    """Collect, then freeze every object alive now, unless a freeze is already in place. Returns
    whether this call froze: its caller then owns the freeze and gives it back with
    release_startup_objects(True)."""
    gc.collect()  # garbage alive now (a dropped engine's cycles, with its KV pool) would be kept for good
    with _lock:
        if _state.held:
            return False
        _state.held = True
        gc.freeze()
        return True


def freeze_warm_objects(owner: bool) -> int:
    """The owner's freeze again, after warm-up: what the first requests made and keep (kernels
    compiled for new shapes, their caches, the tokenizer's) would otherwise be walked by every
    full collection. Returns how many objects this froze (0 for an engine that does not own the
    freeze: see the module's note). Cycles among them that die later are kept until the owner's
    release, as start-up's are."""
    if not owner:
        return 0
    gc.collect()
    with _lock:
        assert _state.held, "the freeze was released"
        before = gc.get_freeze_count()
        gc.freeze()
        return gc.get_freeze_count() - before


def release_startup_objects(owner: bool) -> None:
    """The owner's release unfreezes, so what the engines left behind can be collected."""
    if not owner:
        return
    with _lock:
        assert _state.held, "the freeze was released twice"
        _state.held = False
        gc.unfreeze()
