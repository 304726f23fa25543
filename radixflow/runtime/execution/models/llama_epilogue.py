"""The decode pass of a folded Llama (layers/norm_fold.py) with every linear on the batch-1..8 GEMV: no
RMSNorm or SiLU-and-mul kernel but the first layer's input norm and the final norm (issue 28).

Per layer: qkv (rstd of the stream in its epilogue) -> attention -> o_proj (+ residual, sum of squares)
-> gate_up (rstd, SiLU-and-mul of its interleaved rows) -> down (+ residual, sum of squares). The sums
live in one float32 [2 * layers, rows] buffer; slot 2i holds layer i's stream after o_proj, slot 2i + 1
after down, each stored whole by its producer's last program (no zeroing). Each slot has an int32 ticket
counter that producer's programs count on; the tickets are zeroed at the pass's start (inside the CUDA
graph) and the last program leaves its ticket at 0 too. The first layer's stream comes from the
embedding, whose sum no GEMV made: its input norm runs as the kernel (weight ones after the fold).
"""

from __future__ import annotations

import torch

from radixflow import env
from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode


def takes_epilogues(model, fb: ForwardBatch) -> bool:
    """Whether this pass runs `forward_with_epilogues`: a folded model with the epilogues on (the rule is
    layers/norm_fold.py's fold_off_reason, at load), a decode pass, and every linear taking its rows on the GEMV."""
    if not (model.folded and model.epilogue_on and fb.mode == ForwardMode.DECODE):
        return False
    rows = fb.input_ids.shape[0]
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    on_gemv = all(0 < rows <= lin.gemv_max_m for lin in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj))
    return on_gemv and (fb.input_ids.is_cuda or env.triton_interpret())


def _kw(linear) -> dict:
    """The GEMV's arguments a linear layer holds: bias, FP8 row scales, launch config, kernel settings."""
    return {"bias": linear.bias, "w_scale": getattr(linear, "weight_scale", None) if linear.weight.element_size() == 1
            else None, "config": linear.gemv_config, "settings": linear.kernels}


def forward_with_epilogues(model, fb: ForwardBatch, backend) -> torch.Tensor:
    """LlamaForCausalLM.forward for such a pass: the final hidden states of every row."""
    from radixflow.kernels.gemv_epilogue import gemv_residual, gemv_rstd

    x = model.embed_tokens(fb.input_ids)
    model.rotary.new_pass()
    layers = model.layers
    sums = torch.empty(2 * len(layers), x.shape[0], dtype=torch.float32, device=x.device)
    tickets = torch.zeros(2 * len(layers), dtype=torch.int32, device=x.device)
    first = layers[0]
    residual = x if first.residual_dtype is None else x.to(first.residual_dtype)
    qkv = first.self_attn.qkv_proj(first.input_layernorm(x))
    for i, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        if i:
            qkv = gemv_rstd(x, attn.qkv_proj.weight, sums[2 * i - 1], layer.input_layernorm.eps, **_kw(attn.qkv_proj))
        out = attn.attend(fb.positions, qkv, fb, backend)
        residual, x = gemv_residual(out, attn.o_proj.weight, residual, sums[2 * i], tickets[2 * i], **_kw(attn.o_proj))
        act = gemv_rstd(x, mlp.gate_up_proj.weight, sums[2 * i], layer.post_attention_layernorm.eps, silu=True,
                        **_kw(mlp.gate_up_proj))
        residual, x = gemv_residual(act, mlp.down_proj.weight, residual, sums[2 * i + 1], tickets[2 * i + 1],
                                    **_kw(mlp.down_proj))
    return model.norm(residual, out_dtype=x.dtype)
