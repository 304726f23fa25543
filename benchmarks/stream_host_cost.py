"""Host cost per streamed token, early (tokens 1-100) and late (tokens 1,901-2,000) in a 2,000-token output, of
what a stream does each step besides the forward pass: the server's report (scheduler -> pickle -> detokenizer ->
pickle -> TokenizerManager result) and the in-process Engine's growing result. Each is timed two ways in the same
run: as radixflow does it now (reports carry deltas, each logprob's text added once, the Engine's text decoded
incrementally)
and as it did before session 29, re-created here with today's functions (whole lists in every report, every
logprob's text decoded again, the whole output decoded every step), not the old commit's code. A cost that grows with the output's length shows as late / early > 1.

    python benchmarks/stream_host_cost.py [--tokens 2000]
"""

from __future__ import annotations

import argparse
import pickle
import random
import time

from radixflow.model_files import load_tokenizer, resolve_model
from radixflow.runtime.generate_request import build_result, output_text
from radixflow.runtime.incremental_text import StreamText
from radixflow.runtime.output_delta import Assembly, Sent, as_delta
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduling.logprobs import LogprobCollector
from radixflow.runtime.scheduling.req import LogprobOptions, Req
from radixflow.runtime.server.detokenizer import Detokenizer
from radixflow.runtime.server.server_messages import DecodeParams, DetokBatch, OutputBatch

CASES = {"no logprobs": None, "logprobs": LogprobOptions(True, -1, 0, True), "top-5 logprobs": LogprobOptions(True, -1, 5, True)}


def grow(req: Req, ids: list, i: int) -> None:
    req.output_ids.append(ids[i])
    if req.logprob.return_logprob:
        req.output_token_logprobs.append((-random.random(), ids[i]))
        if req.logprob.top_logprobs_num:
            req.output_top_logprobs.append([(-random.random(), ids[(i + j) % len(ids)]) for j in range(5)])


def server_step(state: dict, deltas: bool) -> None:
    req = state["req"]
    out = as_delta(req.to_output(), state["sent"]) if deltas else req.to_output()
    sent = pickle.loads(pickle.dumps(OutputBatch([out])))
    texts = [state["detok"].text_of(o) for o in sent.outputs]
    got = pickle.loads(pickle.dumps(DetokBatch(sent.outputs, texts)))
    if deltas:  # the TokenizerManager's: lists put back together, logprob texts added once an entry
        build_result(state["assembly"].apply(got.outputs[0]), got.texts[0], req.logprob, False, 0.0)
    else:  # whole lists, every entry converted at every report
        build_result(_converted(state, got.outputs[0]), got.texts[0], req.logprob, False, 0.0)


def engine_step(state: dict, deltas: bool) -> None:
    req, sp = state["req"], state["req"].sampling
    if deltas:  # Engine._result with a stream's view
        out = state["assembly"].apply(as_delta(req.to_output(), state["sent"]))
        text = state["decoded"].shown(state["tok"], out.output_ids)
        build_result(out, text, req.logprob, False, 0.0)
    else:
        text = output_text(state["tok"], req.output_ids, None, sp.skip_special_tokens, sp.no_stop_trim)
        build_result(_converted(state, req.to_output()), text, req.logprob, False, 0.0)


def _converted(state: dict, out):
    """`out`'s whole lists as SGLang's triples, converted afresh (what a result cost before deltas)."""
    return Assembly.with_texts(state["with_text"], state["req"].logprob).apply(out)


def timed(step, make_state, tokens: int, ids: list, deltas: bool) -> tuple[float, float]:
    """Mean microseconds a step over the first 100 tokens and over the last 100."""
    state, times = make_state(deltas), []
    for i in range(tokens):
        grow(state["req"], ids, i)
        t = time.perf_counter()
        step(state, deltas)
        times.append(time.perf_counter() - t)
    return sum(times[:100]) * 1e4, sum(times[-100:]) * 1e4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2000)
    args = ap.parse_args()
    random.seed(0)
    tok = load_tokenizer(resolve_model(None).path)
    text = "The quick brown fox jumps over the lazy dog while the committee reviews the annual budget. " * 400
    ids = tok.encode(text, add_special_tokens=False)[: args.tokens]
    cached = LogprobCollector(tok).with_text
    uncached = lambda pairs, want: [[lp, t, tok.decode([t]) if want else None] for lp, t in pairs]  # noqa: E731
    print(f"| path | logprobs | now: us/token early / late | before: us/token early / late | late, before / now |")
    print("|---|---|---|---|---|")
    for name, lp in CASES.items():
        def make_state(deltas: bool, lp=lp) -> dict:
            detok = Detokenizer(tok)
            detok.register({"r": DecodeParams()})
            want = lp is not None and lp.return_text_in_logprobs
            return {"req": Req("r", [1, 2, 3], SamplingParams.from_dict({"max_new_tokens": 5000}), lp or LogprobOptions()),
                    "sent": Sent(), "assembly": Assembly(convert=lambda pairs: cached(pairs, want)), "detok": detok,
                    "decoded": StreamText(), "tok": tok, "with_text": cached if deltas else uncached}  # fmt: skip
        for path, step in (("server report", server_step), ("Engine stream", engine_step)):
            now, before = timed(step, make_state, len(ids), ids, True), timed(step, make_state, len(ids), ids, False)
            print(f"| {path} | {name} | {now[0]:.1f} / {now[1]:.1f} | {before[0]:.1f} / {before[1]:.1f} | "
                  f"{before[1] / now[1]:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
