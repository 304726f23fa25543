"""How much a mixed pass could save (issue 29): the scheduler runs newly admitted requests' prompts as an extend
pass of their own, and the requests that are decoding meanwhile wait for it; a mixed pass (the decoding rows
riding in the extend pass, one token each, as vLLM's chunked prefill and SGLang's --enable-mixed-chunk do) would
save the decode pass they run next. One round of each workload (after run.py's warm-up, which sizes the round),
with every forward pass timed on the device (CUDA events; on the CPU the wall time) and each extend pass noting
how many requests were decoding when it was built.

    python3 benchmarks/programs/mixed_pass_probe.py --device cuda --config benchmarks/configs/llama3-8b.json \\
        --load-format dummy --tokenizer TOK --n 64 --size 1.0 --max-total-tokens 400000

"Saving, at most": the extend passes run while requests were decoding, each priced at the round's mean decode
pass, over the round's forward time. An upper bound: a merged pass costs a little more than its extend alone,
and a decode pass saved may have carried rows that did not wait.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional

sys.path.insert(0, os.path.dirname(__file__))
import radixflow as rf  # noqa: E402
from run import run_mode, warm_up  # noqa: E402
from step_timeline import add_round_args, engine_kwargs  # noqa: E402


class PassLog:
    """Wraps the scheduler's extend step and the runner's forward call: one entry a forward pass, (kind,
    decoding rows when it was built, timer, rows); kind "extend" for the scheduler's extend passes (admitted
    requests), "decode" for decode passes (one token a row), "segment" for the decode step's extend-mode
    passes (a request graph's next segment, or rows holding several host-side tokens)."""

    def __init__(self, engine, kv: bool = False) -> None:
        import torch

        self.sched, self.runner = engine.scheduler, engine.runner
        self.cuda = str(self.runner.device).startswith("cuda")
        self._event = (lambda: torch.cuda.Event(enable_timing=True)) if self.cuda else None
        self.passes: list = []
        self.kv_reads: Optional[list] = [] if kv else None  # with kv: (KV slots, distinct KV slots) a decode pass reads
        self._decoding = None  # set while an extend pass is being built and launched
        self._orig = (self.sched._run_extend, self.runner.forward)
        self.sched._run_extend, self.runner.forward = self._run_extend, self._forward

    def _run_extend(self, batch):
        self._decoding = sum(not r.finished for r in self.sched.running)
        try:
            return self._orig[0](batch)
        finally:
            self._decoding = None

    def _forward(self, fb, *a, **k):
        from radixflow.runtime.execution.forward_batch import ForwardMode

        kind = "extend" if self._decoding is not None else "decode" if fb.mode == ForwardMode.DECODE else "segment"
        rows = len(fb.extend_lens_list) or fb.batch_size
        if kind == "decode" and self.kv_reads is not None:
            self.kv_reads.append(self._kv_read(fb))
        if self.cuda:
            start, end = self._event(), self._event()
            start.record()
            out = self._orig[1](fb, *a, **k)
            end.record()
            self.passes.append((kind, self._decoding or 0, (start, end), rows))
        else:
            t = time.perf_counter()
            out = self._orig[1](fb, *a, **k)
            self.passes.append((kind, self._decoding or 0, time.perf_counter() - t, rows))
        return out

    def _kv_read(self, fb) -> tuple[int, int]:
        """The KV slots a decode pass's attention reads, row by row, and how many of them are distinct (rows
        sharing a cached prefix read the same slots). Reads the pass's rows back: it waits for the GPU."""
        import numpy as np

        cells = self.sched.kv.req_to_token._cells
        slots = np.concatenate([cells[i, :n] for i, n in zip(fb.req_pool_indices.tolist(), fb.seq_lens_list)])
        return len(slots), len(np.unique(slots))

    def close(self) -> list:
        """Restores the wrapped methods; (kind, decoding rows, seconds, rows) a pass."""
        self.sched._run_extend, self.runner.forward = self._orig
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            return [(k, d, s.elapsed_time(e) / 1000, n) for k, d, (s, e), n in self.passes]
        return list(self.passes)


def summary(passes: list) -> dict:
    ext = [p for p in passes if p[0] == "extend"]
    dec = [p for p in passes if p[0] == "decode"]
    waiting = [p for p in ext if p[1] > 0]
    total = sum(p[2] for p in passes)
    mean_dec = sum(p[2] for p in dec) / len(dec) if dec else 0.0
    return {"passes": len(passes), "extend_passes": len(ext), "decode_passes": len(dec),
            "segment_passes": sum(p[0] == "segment" for p in passes), "forward_s": total,
            "extend_s": sum(p[2] for p in ext), "decode_s": sum(p[2] for p in dec), "mean_decode_ms": 1000 * mean_dec,
            "mean_decode_rows": sum(p[3] for p in dec) / len(dec) if dec else 0.0,
            "extends_while_decoding": len(waiting),
            "mean_decoding_rows": sum(p[1] for p in waiting) / len(waiting) if waiting else 0.0,
            "saving_at_most": len(waiting) * mean_dec / total if total else 0.0}  # fmt: skip


def kv_summary(kv_reads: list) -> dict:
    """Mean KV slots a decode pass reads, and the share of them that are distinct."""
    read, distinct = sum(r for r, _ in kv_reads), sum(d for _, d in kv_reads)
    return {"mean_kv_read": read / len(kv_reads) if kv_reads else 0.0, "distinct_share": distinct / read if read else 0.0}


def main(argv=None) -> None:
    from workloads import BY_NAME

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_round_args(ap, device="auto")
    ap.add_argument("--mode", default="graph", choices=("graph", "eager", "eager-noradix"))
    ap.add_argument("--kv", action="store_true",
                    help="also count the KV slots each decode pass reads and how many are distinct (waits for the GPU "
                         "at every decode pass: the table's times are then without overlap)")
    args = ap.parse_args(argv)
    sampling = {"max_new_tokens": args.max_new_tokens, "temperature": 0}
    rows: dict = {}
    print("| workload | passes (extend / decode / segment) | forward s | extend s | decode s | mean decode pass ms "
          "(rows) | extend passes while requests decode | mean decoding rows then | saving, at most |\n" + "| --- " * 9 + "|")
    with rf.Engine(args.config, **engine_kwargs(args)) as engine:
        for name in args.workloads.split(","):
            w = BY_NAME[name]
            inputs, _ = warm_up(engine, w, args.n, args.size, sampling, 0, args.min_round_s, ("graph", "eager"), None)
            log = PassLog(engine, kv=args.kv)
            try:
                run_mode(engine, w, inputs, args.mode, sampling, in_flight=args.n)
            finally:
                r = rows[name] = summary(log.close())
                if args.kv:
                    r.update(kv_summary(log.kv_reads))
            print(f"| {name} | {r['passes']} ({r['extend_passes']} / {r['decode_passes']} / {r['segment_passes']}) | "
                  f"{r['forward_s']:.3f} | {r['extend_s']:.3f} | {r['decode_s']:.3f} | {r['mean_decode_ms']:.2f} "
                  f"({r['mean_decode_rows']:.1f}) | {r['extends_while_decoding']} | "
                  f"{r['mean_decoding_rows']:.1f} | {100 * r['saving_at_most']:.0f}% |", flush=True)
            if args.kv:
                print(f"    decode passes read {r['mean_kv_read']:.0f} KV slots on average, "
                      f"{100 * r['distinct_share']:.0f}% of them distinct", flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
