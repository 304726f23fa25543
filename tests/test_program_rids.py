"""A program run's rid is made on the engine thread without a random draw: os.urandom (uuid4)
lets go of the GIL, and taking it back there waits behind the program threads (session 12: 0.26 s
of the engine thread's wall time in 384 submissions on the 2-core CPU)."""

from __future__ import annotations

import os
import uuid

from radixflow.runtime.programs.program_executor import ProgramExecutor

PROGRAM = {"ops": [{"op": "text", "text": "Q:"}, {"op": "gen", "id": 1, "sampling_params": {"max_new_tokens": 2}}]}


def test_a_runs_rid_is_unique_and_made_without_a_random_draw(monkeypatch):
    ex, other = ProgramExecutor(None, None), ProgramExecutor(None, None)

    def drawn(*a, **k):
        raise AssertionError("a random draw per run")

    monkeypatch.setattr(uuid, "uuid4", drawn)
    monkeypatch.setattr(os, "urandom", drawn)
    rids = [ex.submit(PROGRAM).rid for _ in range(3)] + [other.submit(PROGRAM).rid]
    assert len(set(rids)) == 4 and all(len(r) == 32 and int(r, 16) >= 0 for r in rids)
    assert ex.submit({**PROGRAM, "rid": "mine"}).rid == "mine"
