"""Constrained decoding against free decoding of the same lengths, in one run, on the GPU.

Llama-3-8B shape with dummy weights (bf16, Triton attention, CUDA graphs up to batch 256) and
the default model's tokenizer (vocab 49,152), so grammar masks are real. For each batch size
and temperature: a JSON schema, a regex, and free decoding with each row's output length copied
from the constrained run (ignore_eos), plus a half-constrained batch (even rows JSON, odd rows
free with the JSON run's lengths) against the all-free batch. Every constrained output is checked
(jsonschema / re.fullmatch). At batch 64, GPU idle between full-batch decode passes is measured
for all-constrained and free decoding (the gap between two forward passes counts the mask and
sampling kernels as idle, so it overstates idleness); the same for the regex at batch 256. A
correctness section first compares greedy outputs with overlap scheduling on and off for a mixed
batch (JSON, regex, free). Every grammar backend named by --grammar-backends runs in the same
engine (each keeps its compiled grammars), one backend after another (all sizes and temperatures
of the first, then the next: --deadline-s skips the last ones), each with its own free runs;
labels are prefixed with the backend. `auto` (the server default since session 10) starts each grammar on
llguidance and moves it to outlines once busy: the benchmark waits for that move after its
warm-up batch and warms once more, so the timed runs show the steady state (which backend each
kind ran on is recorded as `auto/promoted_KIND`, with outlines' compile time). The engine's --jump-forward-max-batch is
--jump-forward-max-batch here too (default: the engine's). After each size's warm-up (and the wait for
auto's moves) the benchmark calls `Engine.freeze_gc()`, as a server's warm-up would, so full
collections walk only what the timed runs make; how many objects each call froze is in
`env.freeze_gc`, and each timed run records its full collections (`full_gc_ms`, one per collection).

    python benchmarks/constrained_gpu.py --tokenizer DIR --out DIR           # GPU
    python benchmarks/constrained_gpu.py --smoke --out /tmp/cg               # CPU, tiny model, plumbing only
    python benchmarks/constrained_gpu.py --sections threads --threads 4,8,16 ...   # llguidance's pool size and builds, in the engine

DIR (tokenizer): tokenizer.json, tokenizer_config.json (and chat_template.jinja) of the default
model, e.g. its converted cache folder; default: that folder. Needs jsonschema.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import sys
import time
from typing import TYPE_CHECKING

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from gpubench.common import TINY_CONFIG  # noqa: E402
from gpubench.offline import ForwardRecorder  # noqa: E402
from host_timeline import HostTimeline  # noqa: E402

if TYPE_CHECKING:
    from radixflow import Engine

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "email": {"type": "string", "maxLength": 60},
    "role": {"enum": ["engineer", "manager", "sales", "other"]},
    "skills": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 5},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False}},
    "required": ["name", "age", "email", "role", "skills", "address"], "additionalProperties": False}  # fmt: skip
# anchored and closed: llguidance reads patterns and objects as JSON Schema does (a pattern matches
# anywhere, other keys are allowed), outlines anchors patterns and emits only the listed keys
# [0-9], not \d: llguidance's \d is Unicode 16's digits, Python 3.11's re (the validity check) knows Unicode 15
REGEX = r"[0-9]{3}-[0-9]{3}-[0-9]{4} \((home|work|cell)\), [A-Z][a-z]{2,12} [A-Z][a-z]{2,12}"
MAX_NEW = 160
CUDA = torch.cuda.is_available()
RESULTS: dict = {}


def log(out: str, *parts) -> None:
    print(*parts, flush=True)
    with open(os.path.join(out, "constrained_gpu.log"), "a") as f:
        print(*parts, file=f)


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def model_config(smoke: bool) -> str:
    """Llama-3-8B's shape with the default model's vocabulary and special ids (or a tiny model)."""
    if smoke:
        cfg = dict(TINY_CONFIG)
    else:
        with open(os.path.join(ROOT, "benchmarks", "configs", "llama3-8b.json")) as f:
            cfg = json.load(f)
    cfg.update(vocab_size=49152, bos_token_id=1, eos_token_id=2)
    path = "/tmp/radixflow-constrained-gpu-config.json"
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def make_engine(a, **overrides):
    """The benchmark's engine (GPU, or the tiny CPU one); `overrides` replace Engine arguments."""
    import radixflow

    if CUDA:
        kw = dict(dtype="bfloat16", attention_backend="triton", max_running_requests=1024, cuda_graph_max_bs=256,
                  chunked_prefill_size=8192)  # fmt: skip
    else:
        kw = dict(device="cpu", dtype="float32", max_total_tokens=16384, overlap_schedule="on")
    tok = a.tokenizer
    if tok is None:
        from radixflow.model_files import resolve_model

        tok = resolve_model(None).path
    kw["grammar_backend"] = a.backends[0]
    kw["grammar_threads"] = a.grammar_threads
    kw["grammar_compile_timeout_s"] = 120.0  # the first compile of SCHEMA, on a busy host
    if a.jump_forward_max_batch is not None:
        kw["jump_forward_max_batch"] = a.jump_forward_max_batch
    kw.update(overrides)
    return radixflow.Engine(model_config(a.smoke), load_format="dummy", tokenizer_path=tok, **kw)


def prompts(n: int) -> list:
    return [f"Record {i}: extract the person as JSON.\n" for i in range(n)]


def valid(kind: str, text: str) -> bool:
    if kind == "json":
        import jsonschema

        try:
            jsonschema.validate(json.loads(text), SCHEMA)
            return True
        except Exception:
            return False
    return re.fullmatch(REGEX, text) is not None


def grammar_params(kind: str, temp: float) -> dict:
    sp = {"temperature": temp, "max_new_tokens": MAX_NEW}
    return dict(sp, json_schema=json.dumps(SCHEMA)) if kind == "json" else dict(sp, regex=REGEX)


def free_params(temp: float, length: int) -> dict:
    return {"temperature": temp, "max_new_tokens": max(1, length), "ignore_eos": True}


def timed(eng, ps: list, params: list) -> tuple:
    """(outputs, seconds, scheduler stats deltas and the host's median ms per step, by part)."""
    st = eng.scheduler.stats
    before = (st.chained_decode_steps, st.fed_rows, st.decode_tokens)
    sync()
    t = time.perf_counter()
    with HostTimeline() as tl, FullCollections() as full:
        outs = eng.generate(ps, params)
        sync()
    dt = time.perf_counter() - t
    stats = {"chained": st.chained_decode_steps - before[0], "fed_rows": st.fed_rows - before[1],
             "decode_tokens": st.decode_tokens - before[2], "host_ms": tl.summary(), "full_gc_ms": full.ms}  # fmt: skip
    return outs, dt, stats


class FullCollections:
    """The cyclic GC's full (generation 2) collections during the block: ms each (gc.callbacks),
    to tell a slow run's pause from the engine's own work."""

    def __enter__(self) -> "FullCollections":
        self.ms: list[float] = []
        self._start = 0.0
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.ms.append(round((time.perf_counter() - self._start) * 1e3, 1))


def record(a, label: str, outs: list, dt: float, stats: dict, kind=None, check=None) -> dict:
    """One run of `label`; the label's tok_s is the median over its runs, `valid` counts all of them."""
    toks = sum(o["meta_info"]["completion_tokens"] for o in outs)
    run = {"s": dt, "tokens": toks, "tok_s": toks / dt, **stats,
           "jump_tokens": sum(o["meta_info"].get("jump_forward_tokens", 0) for o in outs)}  # fmt: skip
    entry = RESULTS.setdefault(label, {"runs": [], "n": 0, "checked": 0, "valid": 0})
    entry["runs"].append(run)
    entry["tok_s"] = statistics.median(r["tok_s"] for r in entry["runs"])
    if kind is not None:
        checked = outs if check is None else outs[check]
        entry["n"] += len(checked)
        entry["checked"] += len(checked)
        entry["valid"] += sum(valid(kind, o["text"]) for o in checked)
        entry["sample"] = checked[0]["text"][:120]
    log(a.out, label, json.dumps(run))
    return entry


def lengths(outs: list) -> list:
    return [o["meta_info"]["completion_tokens"] for o in outs]


def use_backend(eng, name: str) -> str:
    """Make `name` the grammar backend (between runs; each keeps its grammar cache): the
    scheduler's, and the request builder's up-front check, as a server started with
    `--grammar-backend name` has."""
    import dataclasses

    from radixflow.runtime.scheduling.grammar_wait import start_grammar_backend

    sched = eng.scheduler
    if not BACKENDS:
        BACKENDS[sched.args.grammar_backend] = start_grammar_backend(sched)
    sched.args = dataclasses.replace(sched.args, grammar_backend=name)
    if name not in BACKENDS:
        sched.grammar_backend = None
        BACKENDS[name] = start_grammar_backend(sched)
    sched.grammar_backend = BACKENDS[name]
    sched.jump_forward = BACKENDS[name].jump_forward
    eng.builder.grammar_backend = name
    return name + "/"


BACKENDS: dict = {}
SECTIONS = ("correctness", "threads", "idle", "throughput")


def run_size(a, eng, n: int, temp: float, backend: str) -> None:
    """JSON, regex, the free runs of their lengths and the half batch, `a.repeats` times in turn."""
    ps = prompts(n)
    tag = f"bs{n}_T{temp:g}"
    pre = use_backend(eng, backend)
    if a.no_jump_forward:  # as a server started with --disable-jump-forward
        eng.scheduler.jump_forward, BACKENDS[backend].jump_enabled = None, False
    for kind in ("json", "regex"):
        warm_params = [dict(grammar_params(kind, temp), max_new_tokens=64)] * n  # above both backends' shortest output
        eng.generate(ps, warm_params)  # compile the grammar, warm kernels at this batch's shapes
        if settle(eng, backend, kind):
            eng.generate(ps, warm_params)  # the promoted grammar's first masks
        eng.generate(ps, [free_params(temp, 16)] * n)
    RESULTS["env"].setdefault("freeze_gc", {})[f"{pre}{tag}"] = eng.freeze_gc()  # what warm-up made, out of the walk
    for _ in range(a.repeats):
        for kind in ("json", "regex"):
            outs, dt, st = timed(eng, ps, [grammar_params(kind, temp)] * n)
            record(a, f"{pre}{kind}_{tag}", outs, dt, st, kind)
            lens = lengths(outs)
            outs, dt, st = timed(eng, ps, [free_params(temp, L) for L in lens])
            record(a, f"{pre}free_{kind}_{tag}", outs, dt, st)
            if kind == "json" and n > 1:
                params = [grammar_params("json", temp) if i % 2 == 0 else free_params(temp, L) for i, L in enumerate(lens)]
                outs, dt, st = timed(eng, ps, params)
                record(a, f"{pre}half_{tag}", outs, dt, st, "json", check=slice(0, None, 2))


def settle(eng, backend: str, kind: str) -> bool:
    """auto: wait for the grammars' outlines compiles under way, and record whether `kind`'s
    grammar now runs on outlines. True when it does (then the caller warms it once more)."""
    if BACKENDS[backend].mover is None:
        return False
    BACKENDS[backend].wait_for_moves()
    spec = json.dumps(SCHEMA) if kind == "json" else REGEX
    done = BACKENDS[backend].mover.compile_of("json_schema" if kind == "json" else "regex", spec)
    promoted = done is not None and done.exception() is None
    # the outlines compile: its get_transitions call holds the GIL, the scheduler's one pause
    RESULTS[f"{backend}/promoted_{kind}"] = {"promoted": promoted, "compile_s": done.result().compile_s if promoted else None}
    return promoted


def idle(a, eng, n: int, kind: str, backend: str) -> None:
    """GPU idle between full-batch decode passes, all rows constrained (greedy) vs free, with the
    host's time per step split by host_timeline.py. The constrained batch runs twice: `cold` is the
    grammar's first batch (per-state caches empty), then the measured one."""
    ps = prompts(n)
    pre = use_backend(eng, backend)
    outs = None
    for label in ("cold", kind, "free"):
        params = [grammar_params(kind, 0.0)] * n if label != "free" else [free_params(0.0, L) for L in lengths(outs)]
        rec = ForwardRecorder(eng.runner)
        try:
            outs_now, dt, st = timed(eng, ps, params)
        finally:
            rec.close()
        outs = outs if outs is not None else outs_now
        if label == "cold":
            settle(eng, backend, kind)
        dec = [r for r in rec.records if r[0] == "decode" and r[1] == n]
        busy = [s.elapsed_time(e) for _, _, s, e, _ in dec]
        gaps = [x[3].elapsed_time(y[2]) for x, y in zip(dec, dec[1:])]
        name = f"{pre}idle_{label if label != kind else 'constrained'}_{kind}_bs{n}"
        RESULTS[name] = entry = {
            "s": dt, "all_passes": len(rec.records), "decode_passes": len(dec), "extend_passes": sum(r[0] == "extend" for r in rec.records),
            "gpu_busy_s": sum(s.elapsed_time(e) for _, _, s, e, _ in rec.records) / 1e3,
            "gpu_forward_ms": statistics.median(busy) if busy else None, "gap_ms": statistics.median(gaps) if gaps else None,
            "idle_fraction": sum(gaps) / (sum(gaps) + sum(busy[1:])) if gaps else None, "host_ms": st["host_ms"],
        }  # fmt: skip
        log(a.out, name, json.dumps(entry))


def thread_sweep(a: argparse.Namespace, eng: Engine, n: int) -> None:
    """llguidance JSON at batch `n`, greedy, for each pool size in `a.threads`. The pool size and
    the grammar's builds change together (one build per thread, at most one per CPU): what this
    measures is the pair. Per size, one untimed batch first hands out the requests that ask for the
    builds, which are waited for, so the timed batch copies all of them. tok/s and the host's
    mean ms per step by part, in the engine's own process; labels carry the size and the builds."""
    from radixflow.constrained.llguidance_threads import max_builds, set_threads

    ps = prompts(n)
    pre = use_backend(eng, "llguidance")
    params = [grammar_params("json", 0.0)] * n
    grammar = BACKENDS["llguidance"].compile("json_schema", json.dumps(SCHEMA))
    for threads in a.threads:
        set_threads(threads)
        eng.generate(ps, [dict(p, max_new_tokens=64) for p in params])
        builds = min(grammar.wait_for_builds(), max_builds())
        outs, dt, st = timed(eng, ps, params)
        record(a, f"{pre}threads{threads}_builds{builds}_json_bs{n}_T0", outs, dt, st, "json")
    set_threads(eng.scheduler.args.grammar_threads)


def correctness(a, eng) -> None:
    """Greedy outputs with overlap scheduling on and off, one request at a time (in a batch,
    overlap changes which rows share a pass, and with random weights bf16 rounding of another
    batch size flips near-tied argmaxes). Jump-forward off: both paths run the same decode
    passes, bit-identical expected. On: the overlapped path feeds forced tokens one a decode
    pass where the other runs one extend pass (other kernels, so rounding may differ)."""
    from radixflow.runtime.scheduling.grammar_wait import start_grammar_backend

    kinds = ["json", "json", "regex", "regex", "free", "free"]
    ps = prompts(len(kinds))
    params = [free_params(0.0, 40) if k == "free" else grammar_params(k, 0.0) for k in kinds]
    sched = eng.scheduler
    backend = start_grammar_backend(sched)
    saved = (sched.jump_forward, backend.jump_enabled)
    for jump in (False, True):
        sched.jump_forward, backend.jump_enabled = saved if jump else (None, False)
        got = {}
        for on in (False, True):
            sched.overlap = on
            got[on] = [(o["output_ids"], o["meta_info"]["finish_reason"]["type"]) for o in (eng.generate(p, sp) for p, sp in zip(ps, params))]
        sched.overlap = True
        same = [x == y for x, y in zip(got[False], got[True])]
        first_diff = [next((j for j, (p, q) in enumerate(zip(x[0], y[0])) if p != q), None) for x, y in zip(got[False], got[True])]
        entry = {"rows": len(kinds), "identical": sum(same), "by_kind": {k: f"{sum(s for s, kk in zip(same, kinds) if kk == k)}/{kinds.count(k)}" for k in set(kinds)},
                 "first_differing_token": [d for d, s in zip(first_diff, same) if not s]}  # fmt: skip
        RESULTS[f"correctness_jump_{'on' if jump else 'off'}"] = entry
        log(a.out, f"correctness_jump_{'on' if jump else 'off'}", json.dumps(entry))
    sched.jump_forward, backend.jump_enabled = saved


def table(a) -> None:
    log(a.out, "\n| backend | batch | T | JSON tok/s | free (same lengths) | ratio | valid | regex tok/s | free | ratio | valid | half JSON tok/s | ratio | valid |")
    log(a.out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for b, n, temp in ((b, n, temp) for b in a.backends for n in sorted(a.sizes) for temp in a.temps):
        tag = f"{b}/{{}}_bs{n}_T{temp:g}"
        j, fj, r, fr = (RESULTS.get(tag.format(k)) for k in ("json", "free_json", "regex", "free_regex"))
        h = RESULTS.get(tag.format("half"))
        if not (j and fj and r and fr):
            continue
        half = f"{h['tok_s']:.0f} | {h['tok_s'] / fj['tok_s']:.2f}x | {h['valid']}/{h['checked']}" if h else "- | - | -"
        log(a.out, f"| {b} | {n} | {temp:g} | {j['tok_s']:.0f} | {fj['tok_s']:.0f} | {j['tok_s'] / fj['tok_s']:.2f}x | "
            f"{j['valid']}/{j['checked']} | {r['tok_s']:.0f} | {fr['tok_s']:.0f} | {r['tok_s'] / fr['tok_s']:.2f}x | "
            f"{r['valid']}/{r['checked']} | {half} |")  # fmt: skip
    for key in sorted(k for k in RESULTS if "/threads" in k):
        e = RESULTS[key]
        mean = e["runs"][-1]["host_ms"].get("mean", {})
        log(a.out, f"{key}: {e['tok_s']:.0f} tok/s, {e['valid']}/{e['checked']} valid; host mean ms/step: step {mean.get('step')}, "
            f"fill {mean.get('fill')}, accept {mean.get('accept')} (follow {mean.get('follow')}, search {mean.get('search')}), "
            f"jump {mean.get('jump')}, untimed {mean.get('untimed')}")
    for key in sorted(k for k in RESULTS if "idle_" in k):
        e = RESULTS[key]
        if e["idle_fraction"] is not None:
            log(a.out, f"{key}: idle {100 * e['idle_fraction']:.1f}% (median gap {e['gap_ms']:.2f} ms, forward {e['gpu_forward_ms']:.2f} ms, {e['decode_passes']} passes); host ms/step {e['host_ms']}")


def parse_args(argv: list | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", help="the default model's tokenizer folder (default: its converted cache folder)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model: the script's plumbing only")
    ap.add_argument("--sizes", default=None, help="batch sizes, comma-separated (default 1,64,256; smoke 1,4)")
    ap.add_argument("--temps", default="0,1", help="temperatures, comma-separated")
    ap.add_argument("--sections", default="correctness,throughput,idle", help=f"comma-separated, of: {', '.join(SECTIONS)}")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each configuration, in turn (the median is reported)")
    ap.add_argument("--grammar-backends", default="llguidance,outlines", help="comma-separated; the first also runs correctness")
    ap.add_argument("--threads", default="4,8,16", help="llguidance pool sizes for the `threads` section (batch 256, or the largest "
                    "size); each also sets the grammar's builds (min(size, CPUs)), made before the timed batch")
    ap.add_argument("--idle-backends", default=None, help="backends of the idle section, comma-separated (default: --grammar-backends)")
    ap.add_argument("--grammar-threads", type=int, default=0, help="the engine's --grammar-threads (0: llguidance's default)")
    ap.add_argument("--no-jump-forward", action="store_true", help="throughput: grammar rows without jump-forward (--disable-jump-forward)")
    ap.add_argument("--jump-forward-max-batch", type=int, default=None, help="the engine's --jump-forward-max-batch "
                    "(default: the engine's default; e.g. 1024: jump forward in every batch, as before session 9)")
    ap.add_argument("--deadline-s", type=float, default=0, help="skip configurations that would start after this many seconds (0: none)")
    a = ap.parse_args(argv)
    a.backends = a.grammar_backends.split(",")
    a.idle_backends = a.idle_backends.split(",") if a.idle_backends else a.backends
    a.temps = [float(t) for t in a.temps.split(",")]
    a.threads = [int(t) for t in a.threads.split(",")]
    a.sizes = [int(s) for s in (a.sizes or ("1,4" if a.smoke else "1,64,256")).split(",")]
    sections = a.sections.split(",")
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        ap.error(f"--sections: unknown {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    a.sections = sections
    return a


def main() -> None:
    a = parse_args()
    os.makedirs(a.out, exist_ok=True)
    t = time.perf_counter()
    eng = make_engine(a)
    RESULTS["env"] = {"device": torch.cuda.get_device_name() if CUDA else "cpu", "torch": torch.__version__,
                      "engine_s": time.perf_counter() - t, "grammar_backend": eng.scheduler.args.grammar_backend,
                      "jump_forward_max_batch": eng.scheduler.args.jump_forward_max_batch}  # fmt: skip
    log(a.out, "env", json.dumps(RESULTS["env"]))
    try:
        if "correctness" in a.sections:
            correctness(a, eng)
        late = lambda: a.deadline_s and time.perf_counter() - t > a.deadline_s  # noqa: E731
        if "threads" in a.sections:
            thread_sweep(a, eng, max(a.sizes))
        if "idle" in a.sections:
            for b in a.idle_backends:
                idle(a, eng, 4 if a.smoke else 64, "json", b)
                idle(a, eng, 4 if a.smoke else 256, "regex", b)
        if "throughput" in a.sections:
            for b, n, temp in ((b, n, temp) for b in a.backends for n in a.sizes for temp in a.temps):
                if late():
                    log(a.out, f"skipped {b} bs{n} T{temp:g}: past --deadline-s")
                    continue
                run_size(a, eng, n, temp, b)
                with open(os.path.join(a.out, "constrained_gpu.json"), "w") as f:
                    json.dump(RESULTS, f, indent=1)
    finally:
        with open(os.path.join(a.out, "constrained_gpu.json"), "w") as f:
            json.dump(RESULTS, f, indent=1)
        table(a)
        eng.shutdown()


if __name__ == "__main__":
    main()
