"""Where does bf16 lose logprob accuracy in a Llama-shaped model with random weights?

A plain-torch Llama forward (teacher-forced, causal, GQA, rotary) computed in float32 from
bf16 weights, with each place where a real bf16 engine rounds a tensor to bf16 switchable:

  resid     the residual stream after each add
  gemm_in   the inputs of the projections (normed hidden, attention output, SiLU-and-mul)
  gemm_out  the outputs of the projections (q, k, v, o, gate, up, down, logits)
  kv        the stored keys and values (after rotary)
  probs     the attention probabilities before they weight V (flash attention rounds them)

Every configuration is compared with all rounding off (same weights): the max, p99 and
median |dlogprob| of the scored tokens. "impl_*" compares a configuration with itself computed
with another accumulation order in every projection (K split in two halves): what two
implementations of the same rounding differ by. Usage:
  python3 benchmarks/bf16_error_sources.py --config benchmarks/configs/llama3-8b.json --out x.json
"""
import argparse
import json
import math
import time

import os
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from radixflow.runtime.execution.layers.rotary import RotaryEmbedding  # noqa: E402

KNOBS = ("resid", "gemm_in", "gemm_out", "kv", "probs")


def rnd(x: torch.Tensor, on: bool) -> torch.Tensor:
    return x.to(torch.bfloat16).float() if on else x


class Model:
    def __init__(self, cfg: dict, device: str, seed: int = 0, layers: int | None = None, init: str = "engine"):
        torch.manual_seed(seed)
        self.cfg = cfg
        h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
        self.nh, self.nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or h // self.nh
        self.eps = cfg["rms_norm_eps"]
        n = layers or cfg["num_hidden_layers"]

        def w(*shape):  # engine: the engine's dummy init, normal(0, 0.02); fan_in: std 1/sqrt(fan_in)
            std = 0.02 if init == "engine" else shape[1] ** -0.5
            return torch.empty(*shape, device=device, dtype=torch.bfloat16).normal_(0.0, std)

        self.embed = w(v, h)
        self.layers = [dict(q=w(self.nh * self.hd, h), k=w(self.nkv * self.hd, h), v=w(self.nkv * self.hd, h),
                            o=w(h, self.nh * self.hd), g=w(i, h), u=w(i, h), d=w(h, i)) for _ in range(n)]
        self.lm = self.embed if cfg.get("tie_word_embeddings") else w(v, h)
        self.rotary = RotaryEmbedding(SimpleNamespace(**cfg), self.hd, cfg["max_position_embeddings"]).to(device)  # the engine's (torch path)

    def forward(self, ids: torch.Tensor, knobs: dict, split_k: bool = False) -> torch.Tensor:
        """ids [B, T] -> logprob of each next token [B, T-1]."""
        k = {name: knobs.get(name, False) for name in KNOBS}
        B, T = ids.shape

        def mm(x, w):  # x float32 [.., K] (already rounded as the knobs say), w bf16 [N, K]
            if split_k:  # another accumulation order: two halves of K summed
                h = x.shape[-1] // 2
                return rnd(x[..., :h] @ w[:, :h].float().T + x[..., h:] @ w[:, h:].float().T, k["gemm_out"])
            return rnd(x @ w.float().T, k["gemm_out"])

        def norm(x):
            return rnd(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps), k["gemm_in"])

        pos = torch.arange(T, device=ids.device).repeat(B)
        h = self.embed[ids].float()
        mask = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
        for L in self.layers:
            x = norm(h)
            q, kk = self.rotary(pos, mm(x, L["q"]).view(B * T, self.nh, self.hd), mm(x, L["k"]).view(B * T, self.nkv, self.hd))
            q = q.view(B, T, self.nh, self.hd)
            kk = rnd(kk, k["kv"]).view(B, T, self.nkv, self.hd)
            vv = rnd(mm(x, L["v"]), k["kv"]).view(B, T, self.nkv, self.hd)
            rep = self.nh // self.nkv
            s = torch.einsum("bqhd,bkhd->bhqk", q, kk.repeat_interleave(rep, dim=2)) / math.sqrt(self.hd)
            p = rnd(torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1), k["probs"])
            a = rnd(torch.einsum("bhqk,bkhd->bqhd", p, vv.repeat_interleave(rep, dim=2)).reshape(B, T, -1), k["gemm_in"])
            h = rnd(h + mm(a, L["o"]), k["resid"])
            x = norm(h)
            act = rnd(torch.nn.functional.silu(mm(x, L["g"])) * mm(x, L["u"]), k["gemm_in"])
            h = rnd(h + mm(act, L["d"]), k["resid"])
        logits = mm(norm(h), self.lm)
        lp = torch.log_softmax(logits.float(), dim=-1)
        return lp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)


def stats(a: torch.Tensor, b: torch.Tensor) -> dict:
    d = (a - b).abs().flatten().sort().values
    n = d.numel()
    return {"max": d[-1].item(), "p99": d[int(0.99 * (n - 1))].item(), "p50": d[n // 2].item(),
            "within_2e-2": (d <= 2e-2).float().mean().item()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the config (smoke runs)")
    ap.add_argument("--hidden", type=int, default=None, help="override sizes (smoke runs): hidden,intermediate,vocab")
    ap.add_argument("--init", choices=("engine", "fan_in"), default="engine",
                    help="weights: the engine's dummy normal(0, 0.02), or std 1/sqrt(fan_in) (a control)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cfg = json.load(open(args.config))
    if args.hidden:
        cfg.update(hidden_size=args.hidden, intermediate_size=args.hidden * 3, vocab_size=args.hidden * 8,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=args.hidden // 4)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    model = Model(cfg, device, layers=args.layers, init=args.init)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg["vocab_size"], (args.batch, args.seq), generator=g).to(device)
    t0 = time.time()
    with torch.no_grad():
        exact = model.forward(ids, {})
        allon = {n: True for n in KNOBS}
        runs = {"all": allon, **{f"all_but_{n}": {**allon, n: False} for n in KNOBS},
                **{f"only_{n}": {n: True} for n in KNOBS}, "resid_fp32_gemm_out_fp32": {"gemm_in": True, "kv": True, "probs": True}}
        lps = {name: model.forward(ids, kn) for name, kn in runs.items()}
        res = {name: stats(lp, exact) for name, lp in lps.items()}
        for name in ("all", "all_but_resid", "resid_fp32_gemm_out_fp32"):
            res[f"impl_{name}"] = stats(model.forward(ids, runs[name], split_k=True), lps[name])
    out = {"config": args.config, "init": args.init, "layers": len(model.layers), "batch": args.batch, "seq": args.seq,
           "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "seconds": time.time() - t0, "results": res}
    for name, r in res.items():
        print(f"{name:34s} max {r['max']:.4f}  p99 {r['p99']:.4f}  p50 {r['p50']:.5f}  within 2e-2 {r['within_2e-2']:.3f}")
    if args.out:
        json.dump(out, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
