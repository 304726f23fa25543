"""Small all-reduces on 2+ GPUs: NCCL against PyTorch's symmetric-memory one-shot all-reduce.

A decode step at tp=N all-reduces two [batch, hidden] bf16 tensors per layer (64 a step for
Llama-3-8B), each a few KB at small batches, where latency, not bandwidth, sets the cost. This
times a chain of 64 all-reduces captured in one CUDA graph (as a decode graph holds them) and
checks each result against the exact sum. Multicast stays off (TORCH_SYMM_MEM_DISABLE_MULTICAST=1).

    NCCL_NVLS_ENABLE=0 python3 benchmarks/allreduce_bench.py --tp 2 --out $OUT/allreduce.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from radixflow.kernels.gemv import capture_graph, replay_us  # noqa: E402

CHAIN = 64  # all-reduces per decode step of a 32-layer model


def _graph_us(fn) -> float:
    """Mean µs of one all-reduce in a captured chain of CHAIN (the GEMV chooser's graph timing),
    started on every rank together."""
    graph = capture_graph(lambda i: fn(), CHAIN)
    torch.cuda.synchronize()
    dist.barrier()
    return replay_us(graph, CHAIN)


def _worker(rank: int, world: int, port: int, sizes: list, out: str) -> None:
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    group = dist.group.WORLD
    res = {}
    for n in sizes:
        row = {"bytes": n * 2}
        x = torch.full((n,), float(rank + 1), device="cuda", dtype=torch.bfloat16)
        want = float(world * (world + 1) // 2)

        def nccl():
            x.fill_(rank + 1)
            dist.all_reduce(x, group=group)

        row["nccl_us"] = _graph_us(nccl)
        row["nccl_ok"] = bool((x == want).all())
        try:
            import torch.distributed._symmetric_memory as symm_mem

            buf = symm_mem.empty(n, device="cuda", dtype=torch.bfloat16)
            symm_mem.rendezvous(buf, group.group_name)
            y = torch.empty_like(buf)

            def one_shot():
                buf.fill_(rank + 1)
                torch.ops.symm_mem.one_shot_all_reduce_out(buf, "sum", group.group_name, y)

            row["symm_one_shot_us"] = _graph_us(one_shot)
            row["symm_one_shot_ok"] = bool((y == want).all())
        except Exception as e:  # report, keep the NCCL figures
            row["symm_error"] = repr(e)[:300]
            row["symm_trace"] = traceback.format_exc()[-800:]
        res[str(n)] = row
        if rank == 0:
            print(json.dumps(row)[:400], flush=True)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"world": world, "chain": CHAIN, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "results": res}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--sizes", default="4096,32768,262144,1048576", help="bf16 elements (4096 = Llama-3-8B hidden at batch 1)")
    ap.add_argument("--port", type=int, default=29531)
    ap.add_argument("--out", default="/tmp/allreduce.json")
    a = ap.parse_args()
    assert torch.cuda.device_count() >= a.tp, f"needs {a.tp} GPUs"
    mp.spawn(_worker, args=(a.tp, a.port, [int(s) for s in a.sizes.split(",")], a.out), nprocs=a.tp)


if __name__ == "__main__":
    main()
