"""benchmarks/gpu_real_model.py: its float32 yardstick on hand-made results, and the whole driver on the CPU."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

from gpu_real_model import against_truth  # noqa: E402


def _row(i: int, ref: str, cand: str) -> dict:
    return {"i": i, "match": ref == cand, "ref_text": ref, "cand_text": cand}


def test_bf16_divergences_are_scored_against_float32():
    fp32 = [_row(0, "the cat sat", "the cat sat"), _row(1, "a b c", "a b c"), _row(2, "x y", "x y"),
            _row(3, "one two", "one too"), _row(4, "red fox", "red fox")]
    bf16 = [_row(0, "the cat sat", "the cat ran"),  # float32 follows the reference past the split
            _row(1, "a b d", "a b c"),  # ... the candidate
            _row(2, "q y", "q z"),  # it left both before they split
            _row(3, "one two", "one two"),  # float32's own backends disagree: not a yardstick
            _row(4, "red fox", "red fox")]  # equal to float32 on both backends
    res = {"dtypes": {"float32": {"prompts": fp32}, "bfloat16": {"prompts": bf16}}}
    got = against_truth(res)["bfloat16"]
    assert got["prompts"] == 4
    assert got["divergence_follows"] == {0: "reference", 1: "candidate", 2: "neither"}
    assert got["follows_count"] == {"reference": 1, "candidate": 1, "neither": 1}
    assert (got["reference_equal"], got["candidate_equal"]) == (2, 2)  # prompts 0 and 4; 1 and 4


def test_no_float32_run_gives_no_yardstick():
    assert against_truth({"dtypes": {"bfloat16": {"prompts": [_row(0, "a", "b")]}}}) == {}


def test_the_script_runs_end_to_end_on_cpu_with_the_fp8_candidate_and_dlogprob(tmp_path):
    """The whole driver on the real default model (CPU, torch-native twice): the FP8 candidate against the
    float32 reference, with --dlogprob's teacher forcing. Its dlogprob path once crashed on every GPU run."""
    import json
    import subprocess

    from radixflow.env import cache_dir

    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "gpu_real_model.py")
    cmd = [sys.executable, script, "--device", "cpu", "--prompts", "2", "--max-new-tokens", "3", "--dtype", "float32",
           "--candidate-quantization", "fp8", "--dlogprob", "--cache", cache_dir(), "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    dlogprob = json.load(open(tmp_path / "real_model.json"))["dtypes"]["float32"]["summary"]["reference_tokens_dlogprob"]
    assert dlogprob["tokens"] >= 3
    assert dlogprob["mean_abs"] > 0  # FP8 weights move the logprobs; an equal engine would give 0
