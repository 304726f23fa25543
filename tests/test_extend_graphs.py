"""Extend passes padded to a bucket (--cuda-graph-extend-max-tokens): on the CPU the padded, static-shaped
pass runs without a graph and must give each request's logits and K/V as the unpadded eager pass does,
with the torch-native backend and with the Triton one (in Triton's interpreter); on a GPU the captured
graphs must too."""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import os
from pathlib import Path

import pytest
import torch

from radixflow.errors import RadixflowError
from radixflow.runtime.execution.attention.triton_backend import TritonBackend
from radixflow.runtime.execution.extend_static_batch import (
    ExtendBucket, extend_buckets, pick_bucket, request_buckets, token_buckets,
)  # fmt: skip
from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode
from radixflow.runtime.execution.model_runner import ModelRunner
from radixflow.runtime.server_args import ServerArgs

TINY = str(Path(__file__).resolve().parents[1] / "benchmarks" / "configs" / "smollm2-tiny.json")
MAX_TOKENS, MAX_REQS = 48, 8
DEV = "cuda" if torch.cuda.is_available() else "cpu"
# cuBLAS may pick another algorithm for the padded row count; the CPU's float32 matmuls came out equal
# but for one-request passes (5 rows against 16: last bits)
TOL = {"rtol": 1e-4, "atol": 1e-4} if DEV == "cuda" else {"rtol": 1e-5, "atol": 1e-5}


# -- buckets ------------------------------------------------------------------------------------------------
def test_buckets():
    assert token_buckets(48) == [16, 24, 32, 48]
    assert token_buckets(100) == [16, 24, 32, 48, 64, 96, 100]
    assert token_buckets(10) == [10]
    assert request_buckets(8) == [1, 2, 4, 8] and request_buckets(6) == [1, 2, 4, 6] and request_buckets(1) == [1]
    b = extend_buckets(48, 64)
    assert b == sorted(b) and ExtendBucket(16, 16) in b and ExtendBucket(16, 32) not in b
    assert ExtendBucket(24, 32) in b and ExtendBucket(24, 64) not in b  # 24 one-token requests need 32 rows


def test_pick_bucket():
    b = extend_buckets(MAX_TOKENS, MAX_REQS)
    assert pick_bucket(b, 16, 4, 4) == ExtendBucket(16, 4)  # the bucket's edge: no padding
    assert pick_bucket(b, 15, 4, 4) == ExtendBucket(16, 4)  # the pad request has its own row past the bucket
    assert pick_bucket(b, 1, 1, 1) == ExtendBucket(16, 1)
    assert pick_bucket(b, 17, 2, 2) == ExtendBucket(24, 2)
    assert pick_bucket(b, 48, 8, 8) == ExtendBucket(48, 8)
    assert pick_bucket(b, 47, 8, 8) == ExtendBucket(48, 8)  # as many requests as the cap, and padding
    assert pick_bucket(b, 20, 9, 9) is None  # more requests than the cap
    assert pick_bucket(b, 49, 2, 2) is None  # more tokens than the largest bucket
    assert pick_bucket(b, 20, 2, 9) is None  # logits for 9 rows (input logprobs): more than any bucket holds
    # the programs' common pass: 64 continuations at the default cap of 64 requests
    assert pick_bucket(extend_buckets(512, 64), 300, 64, 64) == ExtendBucket(384, 64)


def test_pick_bucket_finds_what_a_scan_of_every_bucket_finds():
    """pick_bucket bisects (every extend pass asks it): the first bucket in order that holds the pass, as a
    scan finds it, for every pass shape up to past the largest bucket, the default buckets included."""
    for max_tokens, max_reqs in ((512, 256), (48, 8), (100, 6), (10, 3), (512, 64), (16, 1)):
        buckets = extend_buckets(max_tokens, max_reqs)
        for tokens in range(1, max_tokens + 3):
            for reqs in range(1, min(tokens, max_reqs) + 3):
                for logits in (reqs, tokens):
                    want = next((b for b in buckets if b.tokens >= tokens and b.reqs >= max(reqs, logits)), None)
                    assert pick_bucket(buckets, tokens, reqs, logits) == want, (max_tokens, max_reqs, tokens, reqs)


def test_server_args_reject_what_cannot_be_captured():
    with pytest.raises(RadixflowError, match="triton"):
        ServerArgs(cuda_graph_extend_max_tokens=64, attention_backend="flashinfer", device="cuda")
    with pytest.raises(RadixflowError, match="deterministic"):
        ServerArgs(cuda_graph_extend_max_tokens=64, enable_deterministic_inference=True)
    with pytest.raises(RadixflowError, match=">= 0"):
        ServerArgs(cuda_graph_extend_max_tokens=-1)
    with pytest.raises(RadixflowError, match=">= 1"):
        ServerArgs(cuda_graph_extend_max_reqs=0)
    with pytest.raises(RadixflowError, match="tp_size > 1") as err:
        ServerArgs(cuda_graph_extend_max_tokens=64, tp_size=2)
    assert "drop the option" in str(err.value)  # an error that stops the server says what to do
    with pytest.raises(RadixflowError, match="triton"):  # before any weights load
        ServerArgs(cuda_graph_extend_max_tokens=64, attention_backend="torch_native", device="cuda")
    ServerArgs(cuda_graph_extend_max_tokens=64, attention_backend="torch_native", device="cpu")


def test_server_args_warn_when_disable_cuda_graph_turns_the_option_off(caplog):
    with caplog.at_level(logging.WARNING, logger="radixflow.runtime.extend_graph_args"):
        ServerArgs(cuda_graph_extend_max_tokens=64, disable_cuda_graph=True)
    assert "ignored with disable_cuda_graph" in caplog.text


def test_on_by_default_on_cuda_where_the_graphs_can_run():
    """The default (no size set) is DEFAULT_EXTEND_GRAPH_TOKENS on CUDA and off wherever an explicit size
    would be refused or is unmeasured, without an error; the opt-outs turn it off."""
    from radixflow.runtime.server_args import DEFAULT_EXTEND_GRAPH_REQS, DEFAULT_EXTEND_GRAPH_TOKENS

    assert ServerArgs().extend_graph_tokens("cuda") == DEFAULT_EXTEND_GRAPH_TOKENS == 512
    assert ServerArgs().cuda_graph_extend_max_reqs == DEFAULT_EXTEND_GRAPH_REQS == 256
    assert ServerArgs(attention_backend="triton").extend_graph_tokens("cuda:0") == 512
    off = [{"tp_size": 2}, {"attention_backend": "flashinfer"}, {"enable_deterministic_inference": True},
           {"attention_backend": "torch_native"}, {"disable_cuda_graph": True}, {"disable_cuda_graph_extend": True},
           {"kv_cache_dtype": "fp8_e4m3"}, {"quantization": "fp8"}, {"cuda_graph_extend_max_tokens": 0}]
    for kw in off:
        assert ServerArgs(device="cuda", **kw).extend_graph_tokens("cuda") == 0, kw
    assert ServerArgs().extend_graph_tokens("cuda", fp8=True) == 0  # an FP8 checkpoint, as --quantization fp8
    assert ServerArgs(cuda_graph_extend_max_tokens=96).extend_graph_tokens("cuda", fp8=True) == 96
    assert ServerArgs().extend_graph_tokens("cpu") == 0  # the CPU never captures
    assert ServerArgs(cuda_graph_extend_max_tokens=64).extend_graph_tokens("cpu") == 64  # asked: padded passes
    assert ServerArgs(cuda_graph_extend_max_tokens=96, kv_cache_dtype="fp8_e4m3").extend_graph_tokens("cuda") == 96
    with pytest.raises(RadixflowError, match="contradict"):
        ServerArgs(cuda_graph_extend_max_tokens=64, disable_cuda_graph_extend=True)


def test_the_default_runs_without_extend_graphs_on_the_cpu():
    args = ServerArgs(model_path=TINY, tokenizer_path=os.environ.get("RADIXFLOW_TOKENIZER"), load_format="dummy",
                      device="cpu", dtype="float32", max_total_tokens=1024, max_running_requests=4)
    assert ModelRunner(args).extend_graphs is None


def test_the_options_are_in_the_cli_help():
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    text = parser.format_help()
    for flag in ("--cuda-graph-extend-max-tokens", "--cuda-graph-extend-max-reqs", "--disable-cuda-graph-extend"):
        assert flag in text and "graph" in parser._option_string_actions[flag].help
    help_tokens = parser._option_string_actions["--cuda-graph-extend-max-tokens"].help
    assert "Default: 512 on CUDA" in help_tokens
    for case in ("--disable-cuda-graph", "FP8 weights", "do not fit", "prefill chunk"):  # every case it is off or cut
        assert case in help_tokens, case
    defaults = ServerArgs()
    for flag, default in (("--cuda-graph-extend-max-reqs", defaults.cuda_graph_extend_max_reqs),
                          ("--jump-forward-max-batch", defaults.jump_forward_max_batch)):
        assert f"default {default}" in parser._option_string_actions[flag].help
    args = parser.parse_args(["--cuda-graph-extend-max-tokens", "256", "--cuda-graph-extend-max-reqs", "32"])
    assert (args.cuda_graph_extend_max_tokens, args.cuda_graph_extend_max_reqs) == (256, 32)
    assert ServerArgs.from_cli(parser.parse_args([])).cuda_graph_extend_max_tokens is None  # the default: auto
    assert ServerArgs.from_cli(parser.parse_args(["--disable-cuda-graph-extend"])).extend_graph_tokens("cuda") == 0


# -- padded passes against unpadded ones ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def runner():
    args = ServerArgs(model_path=TINY, tokenizer_path=os.environ.get("RADIXFLOW_TOKENIZER"), load_format="dummy",
                      device=DEV, dtype="float32", max_total_tokens=4096,
                      max_running_requests=16, attention_backend="torch_native" if DEV == "cpu" else "triton",
                      cuda_graph_extend_max_tokens=MAX_TOKENS, cuda_graph_extend_max_reqs=MAX_REQS)
    r = ModelRunner(args)
    assert r.extend_graphs is not None and r.extend_graphs.use_graphs == (DEV == "cuda")
    yield r
    r.release_device_memory()  # later GPU tests size their KV pools and graphs from the free memory


@pytest.fixture
def built():
    """ModelRunner(args), released when the test ends: a GPU runner left alive shrinks what later tests find free."""
    runners: list[ModelRunner] = []
    yield lambda args: runners.append(ModelRunner(args)) or runners[-1]
    for r in runners:
        r.release_device_memory()


def test_graph_memory_is_checked_before_capture(runner, monkeypatch, caplog):
    """More than the free memory: a clear error that names the options when they were set, not CUDA's
    out-of-memory error halfway through the capture; the default is turned off with a warning instead."""
    from radixflow.runtime.execution.extend_graph_runner import graph_memory_bytes

    monkeypatch.setattr(runner, "device", "cuda")
    s = runner.model.shape
    need = graph_memory_bytes(s.hidden, s.intermediate, s.vocab_size, MAX_TOKENS, MAX_REQS)
    assert runner._extend_graph_bytes() == need > 2 * MAX_REQS * s.vocab_size * 4
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (need - 1, 10 * need))
    with pytest.raises(RadixflowError, match="cuda_graph_extend_max_tokens=48, cuda_graph_extend_max_reqs=8"):
        runner._extend_graphs_fit(explicit=True)
    with caplog.at_level(logging.WARNING, logger="radixflow.runtime.execution.model_runner"):
        assert not runner._extend_graphs_fit(explicit=False)
    assert "extend passes run eagerly" in caplog.text
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (need, 10 * need))
    assert runner._extend_graphs_fit()


def test_the_default_turned_off_at_capture_leaves_no_plan(runner, monkeypatch, caplog):
    """The default planned on, then too little free at capture (the decode graphs took it): no graphs, no
    plan left saying they are on, and the warning says the pool's share for them stays unused."""
    monkeypatch.setattr(runner, "device", "cuda")
    monkeypatch.setattr(runner, "args", ServerArgs(max_running_requests=16))  # no size set: the default
    monkeypatch.setattr(runner, "extend_limits", (MAX_TOKENS, MAX_REQS))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (runner._extend_graph_bytes() - 1, 1 << 40))
    with caplog.at_level(logging.WARNING, logger="radixflow.runtime.execution.model_runner"):
        assert runner._init_extend_graphs() is None
    assert runner.extend_limits is None
    assert "extend passes run eagerly" in caplog.text and "stays unused until a restart" in caplog.text


# -- the default's plan, on a CUDA device faked on the CPU ---------------------------------------------------
PER_TOKEN, TOTAL = 1024, 10 << 30  # KV bytes a token; the device's memory
HEADROOM = math.ceil((1 - ServerArgs.mem_fraction_static) * TOTAL)  # what eager passes keep, in whole bytes


def plan(runner: ModelRunner, monkeypatch, free: int, ckpt_fp8=None, **kw) -> tuple:
    """The extend graphs' plan on a CUDA device with `free` bytes free, and the KV slots that leaves:
    ModelRunner's own decisions, before anything is allocated (they run before the KV pool is sized)."""
    monkeypatch.setattr(runner, "device", "cuda")
    monkeypatch.setattr(runner, "ckpt_fp8", ckpt_fp8)
    monkeypatch.setattr(runner, "args", ServerArgs(max_running_requests=16, **kw))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (free, TOTAL))
    monkeypatch.setattr(runner, "extend_limits", runner._plan_extend_graphs(PER_TOKEN))
    return runner.extend_limits, runner._kv_slots(PER_TOKEN)


def default_need(runner: ModelRunner, max_tokens: int = 512) -> int:
    from radixflow.runtime.execution.extend_graph_runner import graph_memory_bytes

    s = runner.model.shape
    return graph_memory_bytes(s.hidden, s.intermediate, s.vocab_size, max_tokens, 16)


def test_the_default_comes_out_of_the_kv_pool_only_when_it_is_on(runner, monkeypatch, caplog):
    """With the pool sized from free memory, the default's graphs come out of the pool's share; when they
    do not fit beside its smallest size, the default turns itself off before the pool is sized, so the
    pool keeps that memory."""
    need, room = default_need(runner), 1 << 30
    limits, slots = plan(runner, monkeypatch, HEADROOM + room)
    assert limits == (512, 16) and slots == (room - need) // PER_TOKEN
    with caplog.at_level(logging.WARNING, logger="radixflow.runtime.execution.model_runner"):
        limits, slots = plan(runner, monkeypatch, HEADROOM + 1024 * PER_TOKEN + need - 1)
    assert limits is None and slots == (1024 * PER_TOKEN + need - 1) // PER_TOKEN  # nothing given up
    assert "extend CUDA graphs off" in caplog.text and "headroom" in caplog.text
    limits, _ = plan(runner, monkeypatch, HEADROOM + 1024 * PER_TOKEN + need)
    assert limits == (512, 16)


def test_the_default_leaves_the_headroom_alone_beside_a_set_pool(runner, monkeypatch):
    """--max-total-tokens: the pool is not reduced, so the default's graphs must fit in what is free beside
    it and --mem-fraction-static's headroom (eager prefill chunks need that), not in all that is free."""
    need, pool = default_need(runner), 4096 * PER_TOKEN
    limits, slots = plan(runner, monkeypatch, HEADROOM + pool + need, max_total_tokens=4096)
    assert limits == (512, 16) and slots == 4096
    limits, slots = plan(runner, monkeypatch, HEADROOM + pool + need - 1, max_total_tokens=4096)
    assert limits is None and slots == 4096
    explicit = {"max_total_tokens": 4096, "cuda_graph_extend_max_tokens": 512, "attention_backend": "triton"}
    limits, _ = plan(runner, monkeypatch, HEADROOM + pool + need - 1, **explicit)
    assert limits == (512, 16)  # a size that was set: checked against the free memory at capture


@pytest.mark.parametrize("off", [
    {"disable_cuda_graph": True}, {"disable_cuda_graph_extend": True}, {"tp_size": 2},
    {"attention_backend": "flashinfer"}, {"attention_backend": "torch_native"},
    {"enable_deterministic_inference": True}, {"quantization": "fp8"}, {"kv_cache_dtype": "fp8_e4m3"},
    {"ckpt_fp8": "an FP8 checkpoint"},
])  # fmt: skip
def test_every_case_that_keeps_the_default_off_logs_one_line(runner, monkeypatch, caplog, off):
    kw = dict(off)
    ckpt_fp8 = kw.pop("ckpt_fp8", None)
    with caplog.at_level(logging.INFO, logger="radixflow.runtime.execution.model_runner"):
        limits, _ = plan(runner, monkeypatch, TOTAL, ckpt_fp8=ckpt_fp8, **kw)
    assert limits is None
    assert [r.levelname for r in caplog.records if "extend CUDA graphs off" in r.getMessage()] == ["INFO"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="radixflow.runtime.execution.model_runner"):
        assert plan(runner, monkeypatch, TOTAL)[0] == (512, 16)  # the same without it: on, no such line
    assert "extend CUDA graphs off" not in caplog.text


def test_the_default_on_the_cpu_logs_why_it_is_off(caplog):
    args = ServerArgs(model_path=TINY, tokenizer_path=os.environ.get("RADIXFLOW_TOKENIZER"), load_format="dummy",
                      device="cpu", dtype="float32", max_total_tokens=1024, max_running_requests=4)
    with caplog.at_level(logging.INFO, logger="radixflow.runtime.execution.model_runner"):
        assert ModelRunner(args).extend_graphs is None
    assert "extend CUDA graphs off: no CUDA device" in caplog.text


def test_a_backend_without_extend_graphs_turns_the_default_off_without_an_error(runner, monkeypatch, caplog):
    """The capability decides, not the backend's name: a backend "auto" resolves to that cannot capture
    extend passes keeps the default off (an info line); a size that was set is an error."""
    monkeypatch.setattr(TritonBackend, "supports_extend_graph", False)
    with caplog.at_level(logging.INFO, logger="radixflow.runtime.execution.model_runner"):
        assert plan(runner, monkeypatch, TOTAL)[0] is None
    assert "extend CUDA graphs off: needs the triton attention backend (the TritonBackend cannot replay" in caplog.text
    with pytest.raises(RadixflowError, match="TritonBackend cannot replay"):  # when ServerArgs is built
        plan(runner, monkeypatch, TOTAL, cuda_graph_extend_max_tokens=64, device="cuda")


def test_no_buckets_above_the_prefill_chunk(runner, monkeypatch, caplog):
    """No extend pass holds more new tokens than --chunked-prefill-size (and --max-prefill-tokens): larger
    buckets could never be taken, so they are neither captured nor counted out of the memory."""
    assert plan(runner, monkeypatch, TOTAL, chunked_prefill_size=256)[0] == (256, 16)
    assert plan(runner, monkeypatch, TOTAL, chunked_prefill_size=1024, max_prefill_tokens=128)[0] == (128, 16)
    assert runner._extend_graph_bytes() == default_need(runner, 128)
    assert plan(runner, monkeypatch, TOTAL, chunked_prefill_size=-1, max_prefill_tokens=128)[0] == (512, 16)


def test_an_fp8_checkpoint_keeps_the_default_off(tmp_path, monkeypatch, caplog):
    """FP8 weights from the checkpoint's config (no --quantization flag) count as --quantization fp8 does:
    ModelRunner reads the config's quantization_config before the KV pool is sized, and the default is off."""
    import json
    import shutil

    from radixflow.model_files import resolve_model
    from radixflow.runtime.execution import model_runner

    tokenizer = os.environ.get("RADIXFLOW_TOKENIZER") or resolve_model(None).path
    config = json.loads(Path(TINY).read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tokenizer) / f, tmp_path / f)
    (tmp_path / "model.safetensors").touch()  # load_format dummy: never read
    monkeypatch.setattr(model_runner, "init_dummy_weights", lambda model, seed: None)  # no random FP8 draws
    r = ModelRunner(ServerArgs(model_path=str(tmp_path), load_format="dummy", device="cpu", dtype="float32",
                               max_total_tokens=1024, max_running_requests=4))  # fmt: skip
    assert r.ckpt_fp8 is not None and r.ckpt_fp8.method == "fp8"
    with caplog.at_level(logging.INFO, logger="radixflow.runtime.execution.model_runner"):
        assert plan(r, monkeypatch, TOTAL, ckpt_fp8=r.ckpt_fp8)[0] is None
    assert "extend CUDA graphs off: FP8" in caplog.text
    assert plan(r, monkeypatch, TOTAL)[0] == (512, 16)  # the same model without FP8 weights: on


def test_a_limit_above_the_context_is_cut_down_with_a_warning(caplog):
    args = ServerArgs(model_path=TINY, tokenizer_path=os.environ.get("RADIXFLOW_TOKENIZER"), load_format="dummy",
                      device="cpu", dtype="float32", max_total_tokens=1024, max_running_requests=4, context_length=32,
                      cuda_graph_extend_max_tokens=MAX_TOKENS, cuda_graph_extend_max_reqs=4)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="radixflow.runtime.execution.model_runner"):
        r = ModelRunner(args)
    assert r.extend_graphs.buckets[-1].tokens == 32
    assert "above the context length" in caplog.text


class Batches:
    """Requests with KV already cached for their prefixes: row r of req_to_token holds request r's slots."""

    seeds = itertools.count()  # each batch its own tokens: a pass never rewrites the K/V a previous one left

    def __init__(self, runner: ModelRunner, prefix: list[int], new: list[int]):
        g = torch.Generator().manual_seed(next(Batches.seeds))
        self.prefix, self.new = prefix, new
        self.rows = list(range(1, len(new) + 1))
        self.ids = [torch.randint(0, runner.vocab_size, (p + n,), generator=g) for p, n in zip(prefix, new)]
        slot, self.slots = 1, []
        for r, (p, n) in zip(self.rows, zip(prefix, new)):
            self.slots.append(torch.arange(slot, slot + p + n))
            runner.req_to_token.table[r, : p + n] = self.slots[-1].to(torch.int32)
            slot += p + n
        cached = [i for i, p in enumerate(prefix) if p]
        if cached:  # the prefixes' K/V, from an eager pass of their own
            eager(runner, self._batch([i for i in cached], [0] * len(cached), [prefix[i] for i in cached], 0))

    def _batch(self, reqs: list[int], start: list[int], count: list[int], tail: int) -> ForwardBatch:
        """Requests `reqs`, each extended by `count` tokens after its first `start`; logits for each request's
        last `tail` tokens (0: the last one only)."""
        ids = torch.cat([self.ids[i][s : s + c] for i, s, c in zip(reqs, start, count)])
        pos = torch.cat([torch.arange(s, s + c) for s, c in zip(start, count)])
        locs = torch.cat([self.slots[i][s : s + c] for i, s, c in zip(reqs, start, count)])
        ends = torch.tensor(count).cumsum(0)
        logits = torch.cat([torch.arange(e - max(tail, 1), e) for e in ends.tolist()])
        seq = [s + c for s, c in zip(start, count)]
        t = lambda xs: torch.as_tensor(xs, dtype=torch.int64).to(DEV)  # noqa: E731
        return ForwardBatch(
            mode=ForwardMode.EXTEND, input_ids=t(ids), positions=t(pos), out_cache_loc=t(locs),
            req_pool_indices=t([self.rows[i] for i in reqs]), seq_lens=t(seq), prefix_lens=t(start),
            extend_lens=t(count), logits_indices=t(logits), seq_lens_list=seq, prefix_lens_list=list(start),
            extend_lens_list=list(count),
        )  # fmt: skip

    def extend(self, tail: int = 0) -> ForwardBatch:
        return self._batch(list(range(len(self.new))), self.prefix, self.new, tail)


def eager(runner: ModelRunner, fb: ForwardBatch) -> torch.Tensor:
    with torch.inference_mode():
        runner.backend.init_forward_metadata(fb)
        return runner.model.compute_logits(runner.model(fb, runner.backend))


def kv_snapshot(runner: ModelRunner) -> list[torch.Tensor]:
    return [t.clone() for t in runner.kv_pool.k + runner.kv_pool.v]


def restore(runner: ModelRunner, snap: list[torch.Tensor]) -> None:
    for t, s in zip(runner.kv_pool.k + runner.kv_pool.v, snap):
        t.copy_(s)


def compare(runner: ModelRunner, batches: Batches, tail: int = 0, expect_bucket: bool = True) -> None:
    """The pass through runner.forward (padded, in a bucket) against the unpadded eager pass: the same
    logits, the same K/V in every slot but the scratch slot 0."""
    before = kv_snapshot(runner)
    want = eager(runner, batches.extend(tail))
    want_kv = kv_snapshot(runner)
    restore(runner, before)
    fb = batches.extend(tail)
    assert (runner.extend_graphs.bucket_for(fb) is not None) == expect_bucket
    got = runner.forward(fb)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, **TOL)
    for g, w, b in zip(kv_snapshot(runner), want_kv, before):
        torch.testing.assert_close(g[1:], w[1:], **TOL)
        assert not torch.equal(w[1:], b[1:])  # the pass wrote K/V: the comparison can fail


CASES = {
    "one request, no prefix": ([0], [5]),
    "one request, prefix hit": ([7], [3]),
    "mixed lengths and prefix hits": ([9, 0, 4, 0], [2, 11, 1, 6]),
    "the bucket's edge (16 tokens, no padding)": ([3, 0, 5, 2], [4, 4, 4, 4]),
    "the largest bucket, full": ([2] * 8, [6] * 8),
    "as many requests as the cap, with padding": ([1] * 8, [2] * 7 + [1]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_padded_pass_matches_eager(runner, case):
    prefix, new = CASES[case]
    compare(runner, Batches(runner, prefix, new))


def test_logits_for_several_rows_per_request(runner):
    """Input logprobs ask for the logits of a request's last tokens: padded up to the bucket's request rows."""
    compare(runner, Batches(runner, [4, 0], [5, 3]), tail=3)


def test_passes_that_do_not_fit_run_eagerly(runner):
    compare(runner, Batches(runner, [1] * 9, [1] * 9), expect_bucket=False)  # more requests than the cap
    compare(runner, Batches(runner, [0, 3], [30, 20]), expect_bucket=False)  # 50 tokens
    compare(runner, Batches(runner, [0, 3], [5, 6]), tail=5, expect_bucket=False)  # 10 logits rows


@pytest.mark.skipif(DEV != "cpu", reason="the Triton backend under Triton's CPU interpreter")
def test_triton_backend_padded_pass_matches_eager(runner):
    """The metadata a graph would capture (AttentionBackend.init_static_extend): the Triton extend kernel's
    grid bound by the bucket, padding and empty request rows exiting at once."""
    native = runner.backend
    runner.backend = runner.extend_graphs.backend = TritonBackend(
        kv_pool=native.kv_pool, req_to_token=native.req_to_token, num_q_heads=native.num_q_heads,
        num_kv_heads=native.num_kv_heads, head_dim=native.head_dim)  # fmt: skip
    try:
        for prefix, new in ([7, 0, 2], [3, 9, 1]), ([5, 0], [40, 2]):  # 40 tokens: two of the kernel's row blocks
            compare(runner, Batches(runner, prefix, new))
    finally:
        runner.backend = runner.extend_graphs.backend = native


@pytest.mark.gpu
@pytest.mark.skipif(DEV != "cuda", reason="captures CUDA graphs")
def test_gpu_graph_replay_matches_eager(runner):
    """On a GPU the fixture's runner captured the graphs (triton backend, float32): replaying them must
    give the unpadded eager pass's logits and K/V, also after other buckets' replays rewrote the static
    buffers."""
    assert runner.extend_graphs.graphs
    for case in CASES.values():
        compare(runner, Batches(runner, *case))
    shared = runner.extend_graphs.out
    assert shared.shape[0] == MAX_REQS  # one logits buffer for every bucket
    for prefix, new in ([0], [5]), ([0, 0], [20, 20]):
        with torch.inference_mode():
            got = runner.forward(Batches(runner, prefix, new).extend())
        assert got.data_ptr() == shared.data_ptr()
    compare(runner, Batches(runner, [0], [5]))  # a small bucket after the largest one
    compare(runner, Batches(runner, [4, 0], [5, 3]), tail=3)


@pytest.mark.gpu
@pytest.mark.skipif(DEV != "cuda", reason="captures CUDA graphs")
@pytest.mark.parametrize("dtype, max_tokens, max_reqs", [("float32", MAX_TOKENS, MAX_REQS), ("bfloat16", 512, 256)])
def test_gpu_capture_memory_is_within_the_estimate(built, dtype, max_tokens, max_reqs):
    """What capture really holds on the device (reserved after minus before) never exceeds the estimate
    that the KV pool's sizing and the check before capture use. Also at the default buckets in bf16."""
    args = ServerArgs(model_path=TINY, tokenizer_path=os.environ.get("RADIXFLOW_TOKENIZER"), load_format="dummy",
                      device="cuda", dtype=dtype, max_total_tokens=4096, max_running_requests=max_reqs,
                      cuda_graph_max_bs=1, cuda_graph_extend_max_tokens=max_tokens,
                      cuda_graph_extend_max_reqs=max_reqs)  # fmt: skip
    cost = built(args).extend_graphs.capture_cost
    print(f"extend graphs {dtype} {max_tokens}/{max_reqs}: {cost}")  # the figures for the history
    assert cost.graphs == len(extend_buckets(max_tokens, max_reqs))
    assert 0 < cost.reserved_bytes <= cost.estimate_bytes and cost.allocated_bytes <= cost.estimate_bytes
    assert cost.reserved_bytes <= cost.peak_reserved_bytes <= cost.estimate_bytes  # the warm-ups' blocks included


def test_the_estimate_covers_the_warm_ups_cache_at_llama3_shapes():
    """Session 10's H200 capture at Llama-3-8B shapes (512 tokens, 256 requests) held 386 MiB reserved
    after capture; during it, the warm-up passes' float32 logits of 256 rows (125 MiB) were cached
    besides, outside the graphs' pool: the estimate must hold at least both."""
    from radixflow.runtime.execution.extend_graph_runner import graph_memory_bytes

    estimate = graph_memory_bytes(4096, 14336, 128256, 512, 256)
    assert estimate >= (386 << 20) + 256 * 128256 * 4


class _DeviceMemory:
    """torch.cuda's memory counters, by hand: 100 reserved now, and a peak of 1000 left from before
    (what the KV pool's sizing or an earlier engine reached)."""

    def __init__(self):
        self.allocated, self.reserved, self.peak = 10, 100, 1000

    def hold(self, allocated: int, reserved: int) -> None:
        self.allocated, self.reserved, self.peak = allocated, reserved, max(self.peak, reserved)

    def reset_peak(self) -> None:
        self.peak = self.reserved


def test_capture_cost_reads_the_peak_of_capture_itself(monkeypatch):
    """Capture reserves 600 at its peak (the warm-up passes' blocks) and keeps 300: the cost is 200
    reserved after and 500 at the peak, counted from before capture, not from an earlier peak."""
    from radixflow.runtime.execution import extend_graph_runner as egr

    mem = _DeviceMemory()
    for name, fn in (("empty_cache", lambda: None), ("reset_peak_memory_stats", mem.reset_peak),
                     ("memory_allocated", lambda: mem.allocated), ("memory_reserved", lambda: mem.reserved),
                     ("max_memory_reserved", lambda: mem.peak)):  # fmt: skip
        monkeypatch.setattr(torch.cuda, name, fn)

    def capture_graphs(buckets, prepare):
        mem.hold(400, 600)
        mem.hold(150, 300)  # capture_graphs' empty_cache gives the warm-ups' blocks back
        return {}, {}

    monkeypatch.setattr(egr, "capture_graphs", capture_graphs)
    shape = argparse.Namespace(vocab_size=64, hidden=8, intermediate=16)
    runner = egr.ExtendGraphRunner(argparse.Namespace(shape=shape), None, 64, 4, device="cpu")
    cost = runner.capture_cost
    assert (cost.allocated_bytes, cost.reserved_bytes, cost.peak_reserved_bytes) == (140, 200, 500)


@pytest.mark.gpu
@pytest.mark.skipif(DEV != "cuda", reason="captures CUDA graphs")
def test_gpu_the_default_captures_its_buckets_from_the_kv_pools_share(built):
    """No size set, the pool sized from free memory: the default path (the plan, the pool's share, the
    capture) on a GPU. The pool leaves the graphs' estimate free beside the headroom; capture fits in it."""
    from radixflow.runtime.execution.extend_graph_runner import graph_memory_bytes
    from radixflow.runtime.server_args import DEFAULT_EXTEND_GRAPH_REQS, DEFAULT_EXTEND_GRAPH_TOKENS

    free, total = torch.cuda.mem_get_info()
    # the KV pool's share about 1 GiB (the rest of the free memory is headroom), not all of an H200
    fraction = 1 - (free - (1 << 30)) / total
    args = ServerArgs(model_path=TINY, tokenizer_path=os.environ.get("RADIXFLOW_TOKENIZER"), load_format="dummy",
                      device="cuda", dtype="float32", mem_fraction_static=fraction, cuda_graph_max_bs=1)  # fmt: skip
    assert args.cuda_graph_extend_max_tokens is None
    r = built(args)
    reqs = min(DEFAULT_EXTEND_GRAPH_REQS, args.max_running_requests)
    assert r.extend_limits == (DEFAULT_EXTEND_GRAPH_TOKENS, reqs)
    s = r.model.shape
    estimate = graph_memory_bytes(s.hidden, s.intermediate, s.vocab_size, DEFAULT_EXTEND_GRAPH_TOKENS, reqs)
    pool = sum(t.numel() * t.element_size() for t in r.kv_pool.k + r.kv_pool.v)
    assert (1 << 30) - 2 * estimate < pool <= (1 << 30) - estimate  # the pool gave the graphs their share
    cost = r.extend_graphs.capture_cost
    print(f"extend graphs by default: {cost}")
    assert cost.graphs == len(extend_buckets(DEFAULT_EXTEND_GRAPH_TOKENS, reqs))
    assert 0 < cost.reserved_bytes <= cost.estimate_bytes == estimate
    compare(r, Batches(r, [3, 0, 5], [20, 9, 1]))  # a replay through the default's graphs, against eager


@pytest.mark.gpu
@pytest.mark.skipif(DEV != "cuda", reason="captures CUDA graphs")
def test_gpu_bf16_graph_replay_matches_the_padded_pass_run_eagerly(built):
    """bfloat16, where eager passes may take the flash kernel for prompt-only rows and the graphs do not:
    the graph's replay against the same padded pass launched kernel by kernel (use_graphs=False), which
    runs the same kernels on the same shapes."""
    from radixflow.runtime.execution.extend_graph_runner import ExtendGraphRunner

    args = ServerArgs(model_path=TINY, tokenizer_path=os.environ.get("RADIXFLOW_TOKENIZER"), load_format="dummy",
                      device="cuda", dtype="bfloat16", max_total_tokens=4096,
                      max_running_requests=16, cuda_graph_extend_max_tokens=MAX_TOKENS,
                      cuda_graph_extend_max_reqs=MAX_REQS)  # fmt: skip
    r = built(args)
    plain = ExtendGraphRunner(r.model, r.backend, MAX_TOKENS, MAX_REQS, "cuda", use_graphs=False)
    for prefix, new in list(CASES.values()) + [([0], [5])]:
        batches = Batches(r, prefix, new)
        before = kv_snapshot(r)
        fb = batches.extend()
        bucket = r.extend_graphs.bucket_for(fb)
        with torch.inference_mode():
            want = plain.replay(fb, bucket).clone()
        want_kv = kv_snapshot(r)
        restore(r, before)
        with torch.inference_mode():
            got = r.extend_graphs.replay(batches.extend(), bucket)
        torch.testing.assert_close(got, want)
        for g, w in zip(kv_snapshot(r), want_kv):
            torch.testing.assert_close(g[1:], w[1:])


def test_engine_generates_the_same_tokens_with_padded_extend_passes():
    """End to end on the CPU: programs-like traffic (a shared prefix, then continuations) through the
    scheduler, with the padded passes and without them; greedy, so the same tokens (the padded engine
    ran some of its passes padded, so the comparison is not of one path with itself)."""
    from radixflow import Engine

    prefix = list(range(100, 140))
    prompts = [prefix + [200 + i] * (1 + 3 * i) for i in range(5)]
    sampling = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    outs = {}
    for max_tokens in (0, MAX_TOKENS):
        with Engine(TINY, load_format="dummy", device="cpu", max_running_requests=8,
                    cuda_graph_extend_max_tokens=max_tokens) as engine:
            calls = []
            if max_tokens:
                runner = engine.runner.extend_graphs
                replay = runner.replay
                runner.replay = lambda fb, b: calls.append(b) or replay(fb, b)
            first = engine.generate(input_ids=prompts[0], sampling_params=sampling)  # caches the prefix
            rest = engine.generate(input_ids=prompts[1:], sampling_params=sampling)
            outs[max_tokens] = [o["output_ids"] for o in [first] + rest]
            assert calls or not max_tokens
    assert outs[0] == outs[MAX_TOKENS]


def test_late_extend_read_backs_take_their_logits_before_the_next_pass_overwrites_the_shared_buffer():
    """Every padded pass writes its logits into one shared buffer (on the GPU the graphs do), so a
    consumer that read them after the next extend pass was launched would read that pass's logits.
    Under overlap scheduling with late extend read-backs, each pass first poisons the buffer with NaN:
    the outputs must still be those of the run without overlap."""
    from radixflow import Engine
    from test_overlap_schedule import _constrained_batch, _outputs, _settle, overlap_on

    with Engine(grammar_backend="llguidance", cuda_graph_extend_max_tokens=64, cuda_graph_extend_max_reqs=16) as eng:
        g = eng.runner.extend_graphs
        forward, replay, aliased = g._forward, g.replay, []
        g._forward = lambda fb: _poison_then(forward, fb, g.out)
        g.replay = lambda fb, b: _note_aliased(replay(fb, b), g.out, aliased)
        prompts, params = _constrained_batch()
        ref = _outputs(eng.generate(prompts, params))
        with overlap_on(eng, cold_chunk=16) as sched:
            got = _outputs(eng.generate(prompts, params))
            _settle(sched)
        assert sched.stats.late_extend_read_backs > 0 and aliased and all(aliased)
    assert got == ref


def _poison_then(forward, fb: ForwardBatch, out: torch.Tensor) -> torch.Tensor:
    out.fill_(float("nan"))  # what a reader late by one pass would see
    return forward(fb)


def _note_aliased(logits: torch.Tensor, out: torch.Tensor, aliased: list) -> torch.Tensor:
    aliased.append(logits.data_ptr() == out.data_ptr())
    return logits
