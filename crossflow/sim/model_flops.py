"""Model FLOPs per iteration, as Megatron-LM counts them (SC21 eq. 3 and its MoE
generalisation): what MFU divides by.  Recomputation is counted only where asked; the
hardware FLOPs a device runs are the simulator's (:mod:`crossflow.sim.training`)."""

from __future__ import annotations


def model_flops(L: int, h: int, s: int, V: int, B: int, ffn: int, recompute: bool, *,
                qkv: int | None = None, q: int | None = None, ffn_in: int | None = None
                ) -> float:
    """Megatron's FLOPs per iteration (SC21 eq. 3, generalised to an MLP of width ``ffn``,
    grouped-query attention and a gated MLP).

    Forward: per layer and token 2·(h·qkv + q·h + h·ffn_in + ffn·h) GEMM FLOPs (qkv = 3h,
    q = h, ffn_in = ffn for GPT-3's block: 2·(4h² + 2·h·ffn)) plus 4·s·q for attention over
    the whole s×s score matrix, and 2·h·V for the logits; backward twice the forward; full
    recomputation one more forward.  With ffn = 4h this is 72·B·s·L·h²·(1 + s/(6h) +
    V/(12·L·h)), and 96·… with recompute.
    """
    qkv, q, ffn_in = qkv or 3 * h, q or h, ffn_in or ffn
    per_token_layer = 2 * (h * qkv + q * h + h * ffn_in + ffn * h) + 4 * s * q
    forward = B * s * (L * per_token_layer + 2 * h * V)
    layers_forward = B * s * L * per_token_layer
    return 3 * forward + (layers_forward if recompute else 0)


def spec_model_flops(spec, recompute: bool = False) -> float:
    """:func:`model_flops` of a TransformerSpec; with MoE layers, :func:`moe_model_flops`."""
    if spec.moe or spec.multi_latent_attention:
        return moe_model_flops(spec, recompute)
    return model_flops(spec.num_layers, spec.hidden_size, spec.seq_length, spec.vocab_size,
                       spec.global_batch_size, spec.ffn, recompute, qkv=spec.qkv_width,
                       q=spec.q_width, ffn_in=spec.mlp_in_width)


def moe_model_flops(spec, recompute: bool = False) -> float:
    """Model FLOPs of a model with MoE layers or multi-head latent attention (the
    attention's projections as :attr:`TransformerSpec.attention_macs` counts them):
    :func:`model_flops` with each MoE layer's MLP
    replaced by what one token runs — the router (2·h·E), its ``topk`` active experts
    (2·(h·moe_ffn_in + moe_ffn·h) each) and the shared expert — so only active experts
    count (the convention of Megatron-LM's ``num_floating_point_operations`` for MoE)."""
    h, s, B = spec.hidden_size, spec.seq_length, spec.global_batch_size
    L, V = spec.num_layers, spec.vocab_size
    # the projections, and the scores (q·k, heads × qk width) and their products with the
    # values (heads × v width) over the whole s × s, as Megatron-LM counts them
    a = spec.num_attention_heads
    attention = 2 * spec.attention_macs + 2 * s * a * (spec.qk_dim + spec.head_dim)
    dense_mlp = 2 * (h * spec.mlp_in_width + spec.ffn * h)
    gated = 2 if spec.gated_linear_unit else 1
    moe_mlp = (2 * h * (spec.num_moe_experts or 0)
               + spec.moe_router_topk * 2 * (h * spec.moe_in_width + spec.moe_ffn * h)
               + 2 * (gated + 1) * h * spec.shared_ffn)
    moe = sum(spec.moe_layers)
    layers_forward = B * s * (L * attention + moe * moe_mlp + (L - moe) * dense_mlp)
    forward = layers_forward + B * s * 2 * h * V
    return 3 * forward + (layers_forward if recompute else 0)
