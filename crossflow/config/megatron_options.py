"""The execution options of a transformer workload in Megatron-LM's names — which modules
or layers the backward recomputes, and how MoE tokens reach other ranks' experts — and the
checks that refuse a combination Megatron-LM refuses or CrossFlow does not model (docs/model.md,
"Recomputation by module", "Full recomputation of some layers", "The flex dispatcher")."""

from __future__ import annotations

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


def check_options(spec) -> None:
    """Raise a ConfigError naming the key unless the TransformerSpec's recomputation and
    token-dispatcher options fit it and each other."""
    _check_dispatcher(spec)
    _check_recompute_method(spec)
    _check_recompute_modules(spec)


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
