"""--enable-mixed-chunk: the running requests' next tokens ride in the extend passes of newly admitted prompts.
Outputs must be those of separate passes, with and without overlap scheduling, and steps that cannot be mixed
(a prompt chunk that does not end, input logprobs) must run as before."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from conftest import PROMPTS
from test_overlap_schedule import MIXED, _outputs, _settle


@contextmanager
def staggered(engine, mixed: bool, overlap: bool):
    """Prompts admitted a few at a time (8-token chunks from a flushed cache), so later prompts end in extend
    passes while earlier requests decode; `mixed` and `overlap` set for the block."""
    sched = engine.scheduler
    saved = sched.args.chunked_prefill_size, sched.args.enable_mixed_chunk, sched.overlap
    assert engine.stepper.exclusive(sched.flush_cache), "the engine must be idle"
    sched.args.chunked_prefill_size, sched.args.enable_mixed_chunk, sched.overlap = 8, mixed, overlap
    try:
        yield sched
    finally:
        sched.args.chunked_prefill_size, sched.args.enable_mixed_chunk, sched.overlap = saved


def _run(engine, mixed: bool, overlap: bool, params: list = MIXED, **kw) -> tuple[list, int, int]:
    with staggered(engine, mixed, overlap) as sched:
        steps, mixed_steps = sched.stats.forward_steps, sched.stats.mixed_steps
        out = _outputs(engine.generate(PROMPTS, params, **kw))
        _settle(sched)
        return out, sched.stats.forward_steps - steps, sched.stats.mixed_steps - mixed_steps


@pytest.mark.parametrize("overlap", [False, True], ids=["no-overlap", "overlap"])
def test_mixed_passes_give_the_same_outputs(engine, overlap):
    ref, _, none = _run(engine, mixed=False, overlap=overlap)
    got, _, mixed_steps = _run(engine, mixed=True, overlap=overlap)
    assert none == 0 and mixed_steps > 0
    assert got == ref


@pytest.mark.parametrize("overlap", [False, True], ids=["no-overlap", "overlap"])
def test_a_request_decodes_while_later_prompts_are_admitted(engine, overlap):
    """Without mixing the first request waits through every later prompt's passes (a step admits before it
    decodes); mixed, it decodes in them, so the run takes fewer passes."""
    params = [{"max_new_tokens": 30, "temperature": 0, "ignore_eos": True}] + [{"max_new_tokens": 2, "temperature": 0}] * 7
    ref, ref_steps, _ = _run(engine, mixed=False, overlap=overlap, params=params)
    got, steps, mixed_steps = _run(engine, mixed=True, overlap=overlap, params=params)
    assert got == ref and steps <= ref_steps - mixed_steps // 2, (steps, ref_steps, mixed_steps)


def test_prompts_that_want_input_logprobs_are_not_mixed(engine):
    ref = _run(engine, mixed=False, overlap=False, return_logprob=True, logprob_start_len=0)
    got, _, mixed_steps = _run(engine, mixed=True, overlap=False, return_logprob=True, logprob_start_len=0)
    assert mixed_steps == 0 and got == ref[0]


def test_mixed_chunk_is_off_by_default_and_a_serve_flag():
    from radixflow.__main__ import serve_args
    from radixflow.runtime.server_args import ServerArgs

    assert ServerArgs().enable_mixed_chunk is False
    assert serve_args(["--enable-mixed-chunk"]).enable_mixed_chunk is True
