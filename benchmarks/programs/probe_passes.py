"""Passes that graph_eager_probe.py times directly on the engine's runner, with the scheduler idle: a bucket
graph's first launch against its second (first_replays), and a decode step with continuing rows three ways
(mixed_costs): one extend pass holding every row (what the scheduler runs today when some running requests hold
several pending tokens: a request graph's continuation text), the same pass eagerly, and split into an extend
pass of the continuing rows plus a decode pass (decode graph) of the others; a decode pass of every row for
reference. Each pass writes K/V to pool slots from 1 on and reads req_to_token rows from 1 on, which the next
round's cache flush gives back."""

from __future__ import annotations

import statistics
import time

import torch

from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode


def first_replays(engine, seen: set, most: int = 6) -> list:
    """Host ms of the launch call, and wall and GPU ms to completion, of a bucket graph's first launch and its
    second, on up to `most` buckets that no pass has used yet (spread over the sizes), each filled with padding
    only (what capture ran: K/V to the scratch slot), with the scheduler idle. [] without extend graphs."""
    graphs = engine.runner.extend_graphs
    if graphs is None or not graphs.use_graphs:
        return []
    fresh = [b for b in graphs.buckets if b not in seen]
    pick = fresh[:: max(1, len(fresh) // most)][:most]
    out: list = []

    def launch(b) -> dict:
        graphs.inputs.fill(None, b)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        start.record()
        graphs.graphs[b].replay()
        end.record()
        call = time.perf_counter() - t
        torch.cuda.synchronize()
        return {"call_ms": 1000 * call, "wall_ms": 1000 * (time.perf_counter() - t), "gpu_ms": start.elapsed_time(end)}

    def measure() -> None:
        for b in pick:
            out.append({"bucket": tuple(b), "first": launch(b), "second": launch(b)})
            seen.add(b)

    engine.stepper.exclusive(measure)
    return out


def _rows(runner, new: list, prefix: int, first_row: int = 1) -> tuple:
    """req_to_token rows first_row.. for len(new) requests of `prefix` cached tokens plus new[i] new ones, their
    slots consecutive after the scratch slot 0; returns (rows, slots per request)."""
    width = prefix + max(new)
    rows = list(range(first_row, first_row + len(new)))
    slots = torch.arange(1, 1 + len(new) * width, dtype=torch.int64).view(len(new), width)
    runner.req_to_token.table[rows[0] : rows[-1] + 1, :width] = slots.to(runner.req_to_token.table.dtype)
    return rows, slots


def batch(runner, new: list, prefix: int, decode: bool = False) -> ForwardBatch:
    """A pass over len(new) requests (rows from 1 on) with `prefix` cached tokens each and new[i] new tokens;
    `decode`: a decode pass (every new[i] 1), which the decode graphs take. Logits for each request's last row."""
    rows, slots = _rows(runner, new, prefix)
    dev = runner.device
    t = lambda xs: torch.as_tensor(xs, dtype=torch.int64).to(dev)  # noqa: E731
    seq = [prefix + n for n in new]
    pos = torch.cat([torch.arange(prefix, prefix + n) for n in new])
    locs = torch.cat([slots[i, prefix : prefix + n] for i, n in enumerate(new)])
    ends = torch.tensor(new).cumsum(0) - 1
    return ForwardBatch(
        mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND, input_ids=t(torch.randint(3, 1000, (sum(new),))),
        positions=t(pos), out_cache_loc=t(locs), req_pool_indices=t(rows), seq_lens=t(seq),
        prefix_lens=t([prefix] * len(new)), extend_lens=t(new), logits_indices=t(ends),
        seq_lens_list=seq, prefix_lens_list=[prefix] * len(new), extend_lens_list=list(new),
    )  # fmt: skip


def timed_ms(fn, reps: int) -> float:
    """Median ms of `fn` over reps after one untimed call: CUDA events on CUDA, the wall time on the CPU."""
    fn()
    cuda = torch.cuda.is_available()
    times = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - t))
    return statistics.median(times)


def mixed_costs(engine, rows: int = 64, continuing: tuple = (4, 16, 64), new: int = 8, prefix: int = 500,
                reps: int = 10) -> list:
    """Per count k of continuing rows (new tokens each, the other rows one) over `prefix` cached tokens: ms of the
    one mixed pass as the runner takes it (an extend graph's bucket when it fits), eagerly, split (an extend pass of
    the k rows, then a decode pass of the rest), and a decode pass of all rows."""
    runner, out = engine.runner, []

    def eager(fb):
        runner.backend.init_forward_metadata(fb)
        return runner.model.compute_logits(runner.model(fb, runner.backend))

    def measure() -> None:
        with torch.inference_mode():
            for k in continuing:
                mixed = batch(runner, [new] * k + [1] * (rows - k), prefix)
                bucket = runner.extend_graphs.bucket_for(mixed) if runner.extend_graphs is not None else None
                ext = batch(runner, [new] * k, prefix)
                dec = batch(runner, [1] * (rows - k), prefix, decode=True) if rows > k else None
                every = batch(runner, [1] * rows, prefix, decode=True)
                row = {"rows": rows, "continuing": k, "new": new, "prefix": prefix,
                       "bucket": None if bucket is None else tuple(bucket),
                       "mixed_ms": timed_ms(lambda: runner.forward(mixed), reps),
                       "mixed_eager_ms": timed_ms(lambda: eager(mixed), reps),
                       "split_ms": timed_ms(lambda: (runner.forward(ext), dec is not None and runner.forward(dec)), reps),
                       "decode_all_ms": timed_ms(lambda: runner.forward(every), reps)}  # fmt: skip
                out.append(row)

    engine.flush_cache()  # the last round's cached prefixes hold slots that these passes overwrite
    engine.stepper.exclusive(measure)
    engine.flush_cache()
    return out
