"""Closed-form FLOP and parameter counts (GEMM FLOPs only, the usual convention).

Transformer: Narayanan et al. SC21 (arXiv:2104.04473) §5.1 and Appendix — per block a
forward pass costs 24·B·s·h² + 4·B·s²·h (with f = 4h), the logit layer 2·B·s·h·V; backward
is twice the forward; full recomputation runs the blocks' forward once more.  With full
recomputation this is their eq. 3,

    F = 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)),

and without it 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)) ("model FLOPs", the numerator of MFU,
Korthikanti et al. 2022 §6).  Selective recomputation adds the QKᵀ GEMM once more,
2·B·s²·h per block.  The graphs of :mod:`crossflow.workloads` sum to the same numbers.
"""

from __future__ import annotations

from crossflow.config.base import Spec
from crossflow.config.workload import GemmSpec, LstmSpec, TransformerSpec
from crossflow.workloads.transformer import MAMBA_CHUNK, layer_params


def megatron_eq3_flops(spec: TransformerSpec) -> float:
    """SC21 eq. 3 literally (assumes f = 4h and full recomputation)."""
    B, s, L, h, V = (spec.global_batch_size, spec.seq_length, spec.num_layers,
                     spec.hidden_size, spec.vocab_size)
    return 96.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def transformer_flops(spec: TransformerSpec, recompute: str | None = None) -> float:
    """GEMM FLOPs of one iteration; ``recompute`` defaults to the spec's mode."""
    recompute = recompute or spec.activation_recompute
    if spec.hybrid_override_pattern is not None:
        return _hybrid_flops(spec, recompute)
    B, s, L, h, V, f = (spec.global_batch_size, spec.seq_length, spec.num_layers,
                        spec.hidden_size, spec.vocab_size, spec.ffn)
    block = 2.0 * B * s * (4 * h * h + 2 * h * f) + 4.0 * B * s * s * h
    if spec.moe:  # the MLP of an MoE layer: only each token's active experts and router
        moe_mlp = 2.0 * B * s * spec.moe_macs
        share = sum(spec.moe_layers) / L
        block += share * (moe_mlp - 2.0 * B * s * 2 * h * f)
    passes = {"none": 3, "selective": 3, "full": 4}[recompute]
    extra = 2.0 * B * s * s * h if recompute == "selective" else 0.0
    return L * (passes * block + extra) + 3 * 2.0 * B * s * h * V


def _hybrid_flops(spec: TransformerSpec, recompute: str) -> float:
    """:func:`transformer_flops` of a hybrid stack, layer by layer: attention's GEMMs and
    scores, an MLP's, an MoE layer's active experts and router, a Mamba-2 layer's two
    projections and its scan's products (the chunked SSD: the states Bᵀ·x and outputs
    C·state, 4·state·head width per token and head; within each chunk the masked C·Bᵀ·x,
    chunk·(groups·state + heads·head width) per token forward and 2.5 times that backward,
    where mamba_ssm recomputes C·Bᵀ as a flash kernel recomputes its scores)."""
    B, s, h, V = spec.global_batch_size, spec.seq_length, spec.hidden_size, spec.vocab_size
    di, heads, N = spec.mamba_inner, spec.mamba_heads, spec.mamba_state_dim
    per_token = {
        "*": 2.0 * (h * spec.qkv_width + spec.q_width * h) + 4.0 * s * spec.q_width,
        "-": 2.0 * (h * spec.mlp_in_width + spec.ffn * h),
        "E": 2.0 * spec.moe_macs,
        "M": 2.0 * (h * spec.mamba_in_width + di * h) + 4.0 * N * di,
    }
    chunk = MAMBA_CHUNK * (spec.mamba_num_groups * N + heads * spec.mamba_head_dim)
    passes = {"none": 3, "selective": 3, "full": 4}[recompute]
    extra = {"*": 2.0 * s * spec.q_width} if recompute == "selective" else {}
    layers = sum(passes * per_token[c] + extra.get(c, 0.0)
                 + (chunk * (passes + 0.5) if c == "M" else 0.0)
                 for c in spec.hybrid_override_pattern)
    return B * s * layers + 3 * 2.0 * B * s * h * V


def lstm_flops(spec: LstmSpec) -> float:
    """GEMM FLOPs of one iteration: 3 × (cell GEMMs + vocabulary projection) per step."""
    B, H, V = spec.global_batch_size, spec.hidden_size, spec.vocab_size
    step = spec.num_layers * 2.0 * B * (2 * H) * (spec.num_gates * H) + 2.0 * B * H * V
    return 3 * spec.seq_length * step


def model_flops(spec: Spec) -> float:
    """FLOPs the model needs per iteration, without recomputation (the MFU numerator)."""
    if isinstance(spec, TransformerSpec):
        return transformer_flops(spec, "none")
    if isinstance(spec, LstmSpec):
        return lstm_flops(spec)
    if isinstance(spec, GemmSpec):
        return 2.0 * spec.m * spec.k * spec.n * spec.count
    raise TypeError(f"no FLOP count for {type(spec).__name__}")


def hardware_flops(spec: Spec) -> float:
    """FLOPs executed per iteration, recomputation included (the HFU numerator)."""
    if isinstance(spec, TransformerSpec):
        return transformer_flops(spec)
    return model_flops(spec)


def parameter_count(spec: Spec) -> int:
    """Trainable parameters (transformer: 12lh² + 13lh + (V + s)h + 2h, the final layernorm
    included, word embedding tied with the output layer — SC21 §5.1 without the 2h)."""
    if isinstance(spec, TransformerSpec):
        h = spec.hidden_size
        blocks = sum(sum(layer_params(spec, i)) for i in range(spec.num_layers))
        return blocks + (spec.vocab_size + spec.seq_length) * h + 2 * h
    if isinstance(spec, LstmSpec):
        H, G = spec.hidden_size, spec.num_gates
        return (spec.vocab_size * H + spec.num_layers * (2 * H * G * H + G * H)
                + H * spec.vocab_size + spec.vocab_size)
    if isinstance(spec, GemmSpec):
        return 0
    raise TypeError(f"no parameter count for {type(spec).__name__}")
