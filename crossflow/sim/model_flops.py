"""Model FLOPs per iteration, as Megatron-LM counts them (SC21 eq. 3 and its MoE
generalisation): what MFU divides by.  Recomputation is counted only where asked (the
share of the decoder's layers full recomputation reruns, 0 to 1); the hardware FLOPs a
device runs are the simulator's (:mod:`crossflow.sim.training`)."""

from __future__ import annotations


def model_flops(L: int, h: int, s: int, V: int, B: int, ffn: int, recompute: float, *,
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
    return 3 * forward + layers_forward * recompute


def spec_model_flops(spec, recompute: float = 0.0) -> float:
    """:func:`model_flops` of a TransformerSpec; with MoE layers, :func:`moe_model_flops`;
    of a hybrid stack, :func:`hybrid_model_flops`."""
    if spec.hybrid_override_pattern is not None:
        base = hybrid_model_flops(spec, recompute)
    elif spec.moe or spec.multi_latent_attention:
        base = moe_model_flops(spec, recompute)
    else:
        base = model_flops(spec.num_layers, spec.hidden_size, spec.seq_length,
                           spec.vocab_size, spec.global_batch_size, spec.ffn, recompute,
                           qkv=spec.qkv_width, q=spec.q_width, ffn_in=spec.mlp_in_width)
    # Megatron-Core's block method does not recompute the MTP depths (it warns and skips)
    block = getattr(spec, "recompute_method", None) == "block"
    return base + mtp_model_flops(spec, 0.0 if block else recompute)


def mtp_model_flops(spec, recompute: float = 0.0) -> float:
    """The multi-token-prediction depths' model FLOPs, as Megatron-LM's
    ``num_floating_point_operations`` counts them: per depth its layers (each as a layer of
    its kind), its norms and 2h -> h projection (2·(3h + 2h²) per token) and another
    logits GEMM (2·h·V); backward twice the forward."""
    if not spec.mtp_num_layers:
        return 0.0
    h, tokens = spec.hidden_size, spec.global_batch_size * spec.seq_length
    per = _per_token(spec)
    layers = spec.mtp_num_layers * tokens * sum(
        per[symbol] for kind in spec.mtp_layer_kinds for symbol in kind)
    forward = layers + spec.mtp_num_layers * tokens * (
        2 * (3 * h + 2 * h * h) + 2 * h * spec.vocab_size)
    return 3 * forward + layers * recompute


def _per_token(spec) -> dict[str, float]:
    """Forward FLOPs per token of each sublayer as Megatron-LM counts them: attention's
    projections (:attr:`TransformerSpec.attention_macs`) and its scores (q·k, heads × qk
    width) and their products with the values (heads × v width) over the whole s × s, a
    dense MLP, an MoE layer (its router, the active experts and the shared expert)."""
    h, s, a = spec.hidden_size, spec.seq_length, spec.num_attention_heads
    per = {
        "*": 2 * spec.attention_macs + 2 * s * a * (spec.qk_dim + spec.head_dim),
        "-": 2 * (h * spec.mlp_in_width + spec.ffn * h),
        "E": 2 * spec.moe_macs,
    }
    if spec.hybrid_override_pattern is not None:
        di = spec.mamba_inner
        per["M"] = 2 * h * spec.mamba_in_width + 7 * di * spec.mamba_state_dim + 2 * di * h
    return per


def hybrid_model_flops(spec, recompute: float = 0.0) -> float:
    """Model FLOPs of a hybrid stack (Megatron-LM's ``hybrid_flops`` in
    megatron/training/training.py): per layer its own sublayer — a Mamba-2 layer's input
    projection (2·h·(2·d_inner + 2·groups·state + heads)), scan (7·d_inner·state) and output
    projection (2·d_inner·h), with d_inner the model's heads × head width where Megatron-LM
    takes 2·h — and the logits; backward twice the forward."""
    h, s, B, V = spec.hidden_size, spec.seq_length, spec.global_batch_size, spec.vocab_size
    per = _per_token(spec)
    layers_forward = B * s * sum(per[c] for c in spec.hybrid_override_pattern)
    forward = layers_forward + B * s * 2 * h * V
    return 3 * forward + layers_forward * recompute


def moe_model_flops(spec, recompute: float = 0.0) -> float:
    """Model FLOPs of a model with MoE layers or multi-head latent attention (the
    attention's projections as :attr:`TransformerSpec.attention_macs` counts them):
    :func:`model_flops` with each MoE layer's MLP
    replaced by what one token runs — the router (2·h·E), its ``topk`` active experts
    (2·(h·moe_ffn_in + moe_ffn·h) each) and the shared expert — so only active experts
    count (the convention of Megatron-LM's ``num_floating_point_operations`` for MoE)."""
    h, s, B = spec.hidden_size, spec.seq_length, spec.global_batch_size
    L, V = spec.num_layers, spec.vocab_size
    per = _per_token(spec)
    attention, dense_mlp, moe_mlp = per["*"], per["-"], per["E"]
    moe = sum(spec.moe_layers)
    layers_forward = B * s * (L * attention + moe * moe_mlp + (L - moe) * dense_mlp)
    forward = layers_forward + B * s * 2 * h * V
    return 3 * forward + layers_forward * recompute
