"""Draw BENCHMARKS.md's plots from the figures recorded there.

    python benchmarks/plot_figures.py            # writes benchmarks/plots/*.png (needs matplotlib)

The numbers below are copied from BENCHMARKS.md's current table and from
benchmarks/history/ (each names the run it comes from); nothing is measured here.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "plots")

# Batch-1 decode, Llama-3-8B shape, bf16, one H200: the best committed figure of each session
# (history/2026-11-30.md, the "batch-1 decode" row of each session's table).
BATCH1_BY_SESSION = [(1, 197.8), (2, 220.7), (3, 234.2), (4, 238.0), (5, 239.6), (6, 237.0),
                     (8, 252.1), (9, 250.6), (10, 248.9)]  # fmt: skip
READ_PROBE_TB_S = 4.35  # read-only bandwidth probe, session 10 run 2
ALL_WEIGHT_GB = 16.06  # every weight, the input embedding included (the roofline used until session 11)
STEP_READ_GB = 15.0  # what a decode step reads: no input embedding (issue 28's count)
HF_PEERS = {"HF eager": 28.2, "HF compiled static cache": 129.5}  # session 9 run 5, same machine kind

# Current figures against the baseline measured in the same run (BENCHMARKS.md).
RATIOS = [
    ("GPU: batch 1 vs HF compiled static cache", 248.7 / 129.5),  # session 9 run 5
    ("GPU: shared prefix, radix on vs off", 36.13 / 6.24),  # session 9 run 5
    ("CPU: shared prefix, radix on vs off", 12.77),
    ("CPU: JSON extraction, jump-forward on vs off (batch 1)", 3.30),
    ("CPU: programs, request graph vs eager", 2.68),
    ("CPU: offline vs transformers' best batch", 1.97),
]


def plot_batch1(path: str) -> None:
    sessions, tok_s = zip(*BATCH1_BY_SESSION)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(sessions, tok_s, "o-", label="radixflow (Triton, CUDA graphs)")
    for gb, style, name in ((STEP_READ_GB, "--", "bytes a step reads"), (ALL_WEIGHT_GB, ":", "all weights")):
        ax.axhline(READ_PROBE_TB_S * 1e3 / gb, ls=style, color="gray", label=f"roofline: {name} / read bandwidth")
    for (name, value), color in zip(HF_PEERS.items(), ("tab:red", "tab:orange")):
        ax.axhline(value, color=color, alpha=0.7, label=name)
    ax.set(xlabel="session (2026-11-30)", ylabel="output tok/s", ylim=(0, 320),
           title="Batch-1 decode, Llama-3-8B shape, bf16, one H200")  # fmt: skip
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_ratios(path: str) -> None:
    names, values = zip(*RATIOS)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.barh(range(len(values)), values, color="tab:blue")
    ax.set_yticks(range(len(values)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", lw=0.8)
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f}x", va="center", fontsize=8)
    ax.set(xlabel="radixflow / baseline of the same run (log scale)", title="Current figures as ratios")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    plot_batch1(os.path.join(OUT, "batch1_decode.png"))
    plot_ratios(os.path.join(OUT, "ratios.png"))
    print("wrote", OUT)


if __name__ == "__main__":
    main()
