"""Takes what start-up made out of the cyclic garbage collector's view, shared by every engine of a process.

A full collection walks every tracked object: the model's modules, the tokenizer, kernel caches
(a few hundred thousand objects), so without this it pauses a forward pass now and then for as
long as that walk takes. `gc.freeze()` moves them to a permanent generation that collections skip.

`gc.freeze()` takes in every object of the process and `gc.unfreeze()` thaws them all at once, so:
- An engine freezes only while it is the only live engine of the process: another live engine's
  reference cycles (scheduler, runner, KV pool) would otherwise stay alive after its shutdown,
  until the freeze's owner goes. An engine that declines logs why and returns 0.
- The freeze has one owner, the engine that made it; it is taken again (freeze_gc()) by the only
  live engine once the owner has gone.
- The owner's release thaws only when nothing was frozen before its freeze. Objects that someone
  else froze first (an application's freeze before fork, a library's) cannot be told apart from the
  engine's (gc has no partial unfreeze), so then everything stays frozen: the application's freeze
  holds, and the engine's dead cycles are kept for the life of the process. Engine.shutdown() frees
  the KV pool, req_to_token table, attention buffers, CUDA graphs and weights explicitly, so what is
  kept is the scheduler's and tokenizer's objects and small per-batch tensors.
Engine(disable_gc_freeze=True) (--disable-gc-freeze) opts out.
"""

from __future__ import annotations

import gc
import logging
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class FreezeState:
    held: bool = False  # an engine's freeze is in place
    live: int = 0  # engines made and not yet shut down or freed
    frozen_before: int = 0  # objects frozen before the held freeze was first made: while > 0 it is never thawed


_state = FreezeState()
_lock = threading.Lock()


def freeze_startup_objects(enabled: bool = True) -> None:
    """A server process's freeze (scheduler, TP rank, replica follower): one model per process,
    nothing to give back; `enabled` False (--disable-gc-freeze): nothing. Collect first: garbage
    alive now would be kept for good."""
    if enabled:
        gc.collect()
        with _lock:  # EngineFreeze reads the freeze count under it
            gc.freeze()


class EngineFreeze:
    """One engine's part in the process's freeze. Holds no reference to its engine, so it can be
    given back from the engine's finalizer."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.owner = False
        self._state = _state  # the state it registered with, even if the module's is replaced (tests)
        self._gone = False
        with _lock:
            self._state.live += 1

    def freeze(self, what: str) -> int:
        """Collect, then freeze every object alive now, if this engine may (see the module's
        note). Returns how many objects this froze; `what` names the call in the log."""
        if not self.enabled:
            return 0
        gc.collect()  # garbage alive now (a dropped engine's cycles, whose finalizer leaves `live`) would be kept
        with _lock:
            why_not = self._why_not()
            if why_not:
                log.info("gc freeze (%s) skipped: %s", what, why_not)
                return 0
            if not self._state.held:
                self._take_ownership()
            before = gc.get_freeze_count()
            gc.freeze()
            return gc.get_freeze_count() - before

    def _why_not(self) -> str:
        if self._gone:
            return "this engine was shut down"
        if self._state.held and not self.owner:
            return "another engine holds the process's freeze"
        if self._state.live > 1:
            return f"{self._state.live} engines are alive: freezing would keep the others' cycles after their shutdown"
        return ""

    def _take_ownership(self) -> None:
        self._state.held, self.owner = True, True
        self._state.frozen_before = gc.get_freeze_count()
        if self._state.frozen_before:
            log.warning(
                "%d objects were frozen (gc.freeze) before this engine's freeze; they stay frozen, and so do "
                "the engine's objects after its shutdown (disable_gc_freeze=True to opt out)",
                self._state.frozen_before,
            )

    def release(self) -> None:
        """At shutdown or when the engine is freed; idempotent. The owner's release thaws, unless
        something was frozen before its freeze."""
        with _lock:
            if self._gone:
                return
            self._gone = True
            self._state.live -= 1
            if not self.owner:
                return
            self.owner, self._state.held = False, False
            if not self._state.frozen_before:
                gc.unfreeze()
