"""Every supported family loads from a HF directory (sharded safetensors too) and
matches transformers: tiny random models built here with transformers itself."""

from __future__ import annotations

import glob
import os
import shutil

import pytest
import torch

from radixflow import Engine

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)


def _configs():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    return {
        "llama3-untied": LlamaConfig(**TINY, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                             "original_max_position_embeddings": 64},
                                     tie_word_embeddings=False),
        "mistral": MistralConfig(**TINY, sliding_window=None, tie_word_embeddings=False),
        "qwen2": Qwen2Config(**TINY, tie_word_embeddings=True),
        "qwen3": Qwen3Config(**TINY, head_dim=32, tie_word_embeddings=False),
    }


def _build(tmp_path, name, config, tokenizer_dir, vocab):
    from transformers import AutoModelForCausalLM

    config.vocab_size = vocab
    config.architectures = [config.architectures[0]] if config.architectures else None
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger weights than the default init, so outputs vary
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    path = tmp_path / name
    model.save_pretrained(path, max_shard_size="200KB")  # forces several shards
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        src = os.path.join(tokenizer_dir, f)
        if os.path.exists(src):
            shutil.copy(src, path / f)
    return model.eval(), str(path)


@pytest.mark.parametrize("name", ["llama3-untied", "mistral", "qwen2", "qwen3"])
def test_family_matches_transformers(tmp_path, model_dir, tokenizer, name):
    config = _configs()[name]
    hf, path = _build(tmp_path, name, config, model_dir, len(tokenizer))
    assert len(glob.glob(os.path.join(path, "*.safetensors"))) > 1
    prompts = ["Hello there, how are", "The capital of France is Paris and the capital of Spain"]
    with Engine(path) as e:
        outs = e.generate(prompts, {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
                          return_logprob=True, logprob_start_len=0)
    for prompt, out in zip(prompts, outs):
        ids = torch.tensor([tokenizer.encode(prompt)])
        with torch.no_grad():
            ref = hf.generate(ids, max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(ids),
                              eos_token_id=None, pad_token_id=0)[0, ids.shape[1]:].tolist()
            logits = hf(torch.tensor([ids[0].tolist() + out["output_ids"]])).logits[0]
        assert out["output_ids"] == ref
        lp = torch.log_softmax(logits.float(), -1)
        n = ids.shape[1]
        got = [t[0] for t in out["meta_info"]["input_token_logprobs"][1:]]
        want = [lp[i - 1, ids[0, i]].item() for i in range(1, n)]
        assert max(abs(a - b) for a, b in zip(got, want)) < 1e-3


def test_dtypes_bf16_and_fp16_run(model_dir):
    """16-bit models run, with a 16-bit KV pool and activations but a float32 residual stream."""
    for dtype in ("bfloat16", "float16"):
        with Engine(dtype=dtype, max_total_tokens=2048) as e:
            seen = []
            last = e.runner.model.layers[-1]
            hook = last.register_forward_hook(lambda m, args, out: seen.append((out[0].dtype, out[1].dtype)))
            out = e.generate("The capital of France is", {"max_new_tokens": 6, "temperature": 0})
            hook.remove()
            assert e.runner.kv_pool.dtype == getattr(torch, dtype)
            assert len(out["output_ids"]) == 6
            assert seen and set(seen) == {(getattr(torch, dtype), torch.float32)}  # (branch output, residual)


def test_gguf_key_memo(tmp_path, monkeypatch):
    """The content key is memoized on disk by (path, size, mtime, inode): the next start does not hash the file again,
    and a rewritten file is hashed anew."""
    from radixflow import model_files

    monkeypatch.setenv("RADIXFLOW_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights v1")
    first = model_files._gguf_cache_dir(str(gguf))
    (memo,) = (tmp_path / "cache" / "gguf-keys").iterdir()
    memo.write_text("feedfacecafe")  # stands for a key from an earlier process
    model_files._content_key.cache_clear()
    assert model_files._gguf_cache_dir(str(gguf)).endswith("gguf-feedfacecafe")  # read, not hashed
    gguf.write_bytes(b"weights v2")
    os.utime(gguf, ns=(1, 1))
    model_files._content_key.cache_clear()
    assert model_files._gguf_cache_dir(str(gguf)) not in (first, str(tmp_path / "cache" / "gguf-feedfacecafe"))


def test_gguf_paths(tmp_path, model_dir):
    from radixflow.errors import ModelPathError
    from radixflow.model_files import _gguf_cache_dir, default_gguf_path, resolve_model

    assert resolve_model(default_gguf_path()).path == model_dir  # converted once, then cached
    assert resolve_model(None).path == model_dir
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelPathError, match="cannot read GGUF"):
        resolve_model(str(bad))
    assert not glob.glob(_gguf_cache_dir(str(bad)) + ".tmp*")  # a failed conversion leaves nothing behind
    copy = tmp_path / "elsewhere.gguf"  # the same file in another venv: keyed by content, so converted once
    shutil.copyfile(default_gguf_path(), copy)
    assert resolve_model(str(copy)).path == model_dir
    data = bytearray(copy.read_bytes())  # a byte changed mid-file (a fine-tune of middle layers): another key
    data[len(data) // 2] ^= 1
    (tmp_path / "tuned.gguf").write_bytes(bytes(data))
    assert _gguf_cache_dir(str(tmp_path / "tuned.gguf")) != model_dir
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(ModelPathError, match=".gguf"):
        resolve_model(str(other))
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{not json")
    (tmp_path / "hf" / "tokenizer.json").write_text("{}")
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelPathError, match="not valid JSON"):
        resolve_model(str(tmp_path / "hf"))
