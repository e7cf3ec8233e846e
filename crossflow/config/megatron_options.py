"""The execution options of a transformer workload in Megatron-LM's names — which modules
or layers the backward recomputes, how MoE tokens reach other ranks' experts, what CUDA graphs
capture, which communication and kernels run overlapped or in FP8, which layers of a quantized
run stay in BF16 — and the checks that refuse a combination Megatron-LM refuses or CrossFlow
does not model (docs/model.md, "Recomputation by module", "Full recomputation of some
layers", "The flex dispatcher", "CUDA graphs and overlapped expert all-to-alls")."""

from __future__ import annotations

from crossflow.config.attention_window import check_window, check_window_under_cp
from crossflow.errors import ConfigError

#: what each of Megatron-Core's selective ``recompute_modules`` recomputes in backward, in
#: the layers that have it
RECOMPUTE_MODULES: dict[str, str] = {
    "core_attn": "the attention core (its s x s scores, or a flash kernel's softmax state)",
    "layernorm": "the norms not fused into a linear layer (every pre-MLP norm of an MoE "
                 "model, MLA's input norm, a hybrid stack's MoE-layer norm)",
    "mla_up_proj": "MLA's query and key/value up-projections and RoPE",
    "mlp": "the whole dense MLP",
    "moe": "the whole MoE layer, its token dispatch and combine included",
    "moe_act": "the routed experts' activation function",
    "shared_experts": "the shared expert's MLP",
}


#: what each of Megatron-Core's ``cuda_graph_modules`` captures in a per-layer graph
#: (TransformerConfig.cuda_graph_modules; [] captures the whole layer)
CUDA_GRAPH_MODULES: dict[str, str] = {
    "attn": "the attention half of each layer",
    "mlp": "a dense layer's MLP",
    "moe": "an MoE layer, its experts included",
    "moe_router": "an MoE layer up to its router (and shared experts not overlapped)",
    "moe_preprocess": "the MoE dispatcher's preprocessing (with moe_router)",
    "mamba": "a Mamba-2 mixer",
}


def experts_captured(spec) -> bool:
    """Whether a CUDA graph captures the MoE layers' experts: a full-iteration graph, or
    per-layer graphs of whole layers or of ``moe``.  Captured, the dropless dispatcher runs
    without its host synchronisation on the tokens each expert received (a graph needs the
    sizes fixed: Megatron-Core's paged stash and padded expert buffers), so the layer's many
    small kernels are not launch-bound: the software profile's ``moe_efficiency``, fitted to
    eager runs, does not apply."""
    impl, modules = spec.cuda_graph_impl, spec.cuda_graph_modules
    return impl == "full_iteration" or (impl != "none" and (not modules or "moe" in modules))


def check_options(spec) -> None:
    """Raise a ConfigError naming the key unless the TransformerSpec's execution options
    (above) fit it and each other."""
    _check_dispatcher(spec)
    _check_recompute_method(spec)
    _check_recompute_modules(spec)
    _check_cuda_graphs(spec)
    _check_overlap_and_fp8(spec)
    _check_bf16_layers(spec)
    check_window(spec)


def _check_dispatcher(spec) -> None:
    if spec.moe_token_dispatcher_type != "flex":
        return
    key = "moe_token_dispatcher_type"
    if spec.num_moe_experts is None:
        raise ConfigError(
            "a token dispatcher sends tokens to the experts of MoE layers, and the model "
            "has none (num_moe_experts is not set)", key=key, value="flex",
            allowed="alltoall (the default) for a dense model, or set num_moe_experts")
    if spec.moe_pad_expert_input_to_capacity:
        raise ConfigError(
            "the flex dispatcher does not pad the experts' inputs to their capacity "
            "(Megatron-Core refuses moe_pad_expert_input_to_capacity with DeepEP)",
            key=key, value="flex",
            allowed="alltoall, or moe_pad_expert_input_to_capacity: false")


def _check_recompute_method(spec) -> None:
    for key in ("recompute_method", "recompute_num_layers"):
        value = getattr(spec, key)
        if value is not None and spec.activation_recompute != "full":
            raise ConfigError(
                "says which layers full recomputation recomputes; this workload's "
                f"activation_recompute is {spec.activation_recompute} (Megatron-LM "
                "refuses it without --recompute-granularity full)", key=key, value=value,
                allowed="null, or activation_recompute: full")
    if spec.recompute_method == "block" and spec.recompute_num_layers is None:
        raise ConfigError(
            "the block method recomputes the first recompute_num_layers layers of each "
            "pipeline chunk, and recompute_num_layers is not set", key="recompute_method",
            value="block", allowed="uniform, or set recompute_num_layers")


def _check_recompute_modules(spec) -> None:
    modules, key = spec.recompute_modules, "recompute_modules"
    if modules is None:
        return
    if modules and spec.activation_recompute != "selective":
        raise ConfigError(
            "names modules that selective recomputation recomputes; this workload's "
            f"activation_recompute is {spec.activation_recompute} (Megatron-Core refuses "
            "recompute modules without --recompute-granularity selective)", key=key,
            value=list(modules), allowed="null or [], or activation_recompute: selective")
    unknown = [m for m in modules if m not in RECOMPUTE_MODULES]
    if unknown:
        raise ConfigError(
            f"{', '.join(repr(m) for m in unknown)} is no module CrossFlow recomputes",
            key=key, value=list(modules), allowed=", ".join(RECOMPUTE_MODULES))
    kinds = "".join(spec.layer_kinds)
    has = {"mla_up_proj": spec.multi_latent_attention, "moe": spec.moe,
           "moe_act": spec.moe, "shared_experts": spec.moe and spec.shared_ffn > 0,
           "mlp": "-" in kinds, "layernorm": spec.multi_latent_attention
           or any(map(spec.separate_pre_mlp_norm, spec.layer_kinds))}
    missing = [m for m in modules if not has.get(m, True)]
    if missing:
        m = missing[0]
        raise ConfigError(
            f"{m!r} recomputes {RECOMPUTE_MODULES[m]}, which this model does not have",
            key=key, value=list(modules),
            allowed=", ".join(m for m in RECOMPUTE_MODULES if has.get(m, True)))


def _check_cuda_graphs(spec) -> None:
    modules, key = spec.cuda_graph_modules, "cuda_graph_modules"
    unknown = [m for m in modules if m not in CUDA_GRAPH_MODULES]
    if unknown:
        raise ConfigError(
            f"{', '.join(repr(m) for m in unknown)} is no module Megatron-Core captures in a "
            "CUDA graph", key=key, value=list(modules), allowed=", ".join(CUDA_GRAPH_MODULES))
    if modules and spec.cuda_graph_impl in ("none", "full_iteration"):
        raise ConfigError(
            "names what per-layer CUDA graphs capture; this workload's cuda_graph_impl is "
            f"{spec.cuda_graph_impl} (Megatron-Core ignores the list without graphs and wants "
            "it empty with one full-iteration graph)", key=key,
            value=list(modules),
            allowed="[], or cuda_graph_impl: local or transformer_engine")
    if "moe_preprocess" in modules and "moe_router" not in modules:
        raise ConfigError(
            "captures the MoE preprocessing, which Megatron-Core captures only with the "
            "router", key=key, value=list(modules), allowed="moe_router beside moe_preprocess")


def _check_overlap_and_fp8(spec) -> None:
    if spec.overlap_moe_expert_parallel_comm and not spec.moe:
        raise ConfigError(
            "overlaps the all-to-alls of MoE layers, and the model has none", value=True,
            key="overlap_moe_expert_parallel_comm",
            allowed="false for a dense model, or set num_moe_experts")
    if spec.fp8_dot_product_attention and not spec.quantized:
        raise ConfigError(
            "runs the attention core in FP8, which Transformer Engine does only inside an "
            f"FP8 run; this workload's precision is {spec.precision}", value=True,
            key="fp8_dot_product_attention", allowed="false, or precision: fp8 or fp4")
    if spec.fp8_dot_product_attention and spec.attention_backend == "unfused":
        raise ConfigError(
            "runs the attention core in FP8, which only a fused kernel does (Transformer "
            "Engine's FP8 attention), and attention_backend is unfused", value=True,
            key="fp8_dot_product_attention", allowed="false, or attention_backend: flash")


def _check_bf16_layers(spec) -> None:
    if not spec.first_last_layers_bf16:
        return
    if not spec.quantized:
        raise ConfigError(
            "keeps layers in BF16 in a quantized run; this workload's GEMMs are "
            f"{spec.precision} throughout", key="first_last_layers_bf16", value=True,
            allowed="true with precision fp8 or fp4, else false")
    start, end, L = (spec.num_layers_at_start_in_bf16, spec.num_layers_at_end_in_bf16,
                     spec.num_layers)
    if start + end > L:
        raise ConfigError(
            f"with num_layers_at_start_in_bf16 = {start}, more BF16 layers than the model's "
            f"{L}", key="num_layers_at_end_in_bf16", value=end, allowed=f"0 to {L - start}")


def check_context_parallel(spec, cp: int) -> None:
    """Raise a ConfigError naming ``context_parallel`` unless the workload (any kind) can
    split its sequences over ``cp`` ranks as CrossFlow models it: a transformer's, into
    2·cp chunks, through attention layers only (no Mamba-2 mixer) without a sliding
    window."""
    if cp == 1:
        return
    if "M" in (getattr(spec, "hybrid_override_pattern", None) or ""):
        raise ConfigError(
            "context parallelism of Mamba-2 layers (Megatron-Core's all-to-all between "
            "the sequence and the heads around each mixer) is not modelled",
            key="context_parallel", value=cp,
            allowed="1 for a model with Mamba-2 layers (M in hybrid_override_pattern)")
    if spec.kind != "transformer" or spec.seq_length % (2 * cp):
        raise ConfigError(
            "context parallelism splits a transformer's sequence into 2·cp chunks (each "
            "rank takes one from each end, balancing the causal mask)",
            key="context_parallel", value=cp,
            allowed="a degree whose double divides the workload's seq_length"
            + ("" if spec.kind == "transformer" else " (transformers only)"))
    check_window_under_cp(spec, cp)
