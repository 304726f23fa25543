"""Fold diagnosis: decode logprobs of the 4-layer random-norm model, bf16 folded+epilogues / folded, epilogues off /
unfolded, each against float32 unfolded."""
import sys, tempfile, pathlib
sys.path.insert(0, "tests")
import pytest
import test_gemv_epilogue_engine as T

mp = pytest.MonkeyPatch()
tmp = pathlib.Path(tempfile.mkdtemp())
path = T._config(tmp, False)
res = {}
with T._engine(path, None, "float32", mp, disable_gemv_epilogue=True) as eng:
    res["f32"] = T._decode(eng)
with T._engine(path, None, "bfloat16", mp, disable_gemv_epilogue=True) as eng:
    res["bf16_unfolded"] = T._decode(eng)
with T._engine(path, None, "bfloat16", mp) as eng:
    res["bf16_folded_epi"] = T._decode(eng)
    r = eng.runner
    def off():
        import dataclasses
        s = dataclasses.replace(r.settings, gemv_epilogue=False)
        r.set_kernel_settings(s, graph_max_bs=2)
    eng.stepper.exclusive(off)
    print("epilogues after switch:", T._takes_epilogues(eng, 1))
    res["bf16_folded_noepi"] = T._decode(eng)
for k, v in res.items():
    d = T._decode_diffs(v, res["f32"])
    print(f"{k:20s} vs f32: n={len(d)} max={max(d):.4f} mean={sum(d)/len(d):.4f}  ids={[x[0][:6] for x in v]}")
for a, b in [("bf16_folded_epi", "bf16_unfolded"), ("bf16_folded_noepi", "bf16_unfolded"), ("bf16_folded_epi", "bf16_folded_noepi")]:
    d = T._decode_diffs(res[a], res[b])
    print(f"{a} vs {b}: n={len(d)} max={max(d):.4f} mean={sum(d)/len(d):.4f}")
