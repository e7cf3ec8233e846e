"""Query and key norms (Megatron-LM's ``--qk-layernorm``; Qwen3): one norm kernel over each
head's queries and keys before the rotary embedding, its backward, its weights and the input
it keeps for the backward."""

from __future__ import annotations

import pytest

import crossflow
from crossflow.config.loader import load_spec
from crossflow.config.workload import TransformerSpec
from crossflow.sim.training_memory import transformer_memory
from crossflow.workloads.transformer import block_ops, layer_params, transformer_graph


def _spec(**update) -> TransformerSpec:
    return TransformerSpec(**{
        "kind": "transformer", "name": "qkn", "num_layers": 2, "hidden_size": 2048,
        "num_attention_heads": 16, "num_query_groups": 4, "seq_length": 4096,
        "vocab_size": 32768, "global_batch_size": 16, "micro_batch_size": 1,
        "precision": "bf16", "gated_linear_unit": True, "position_embedding_type": "rope",
        "attention_backend": "flash", **update})


def _nodes(spec: TransformerSpec) -> dict[str, dict]:
    return dict(transformer_graph(spec).nodes(data=True))


def test_the_norms_sit_between_the_qkv_projection_and_the_rotary_embedding():
    off, on = _spec(), _spec(qk_layernorm=True)
    assert "qk_ln" not in block_ops(off)
    ops = block_ops(on)
    assert ops.index("qkv") + 1 == ops.index("qk_ln") == ops.index("rope") - 1
    g = transformer_graph(on)
    assert g.has_edge("L0.qkv", "L0.qk_ln") and g.has_edge("L0.qk_ln", "L0.rope")
    # without rotary embeddings the attention reads the norms' output
    plain = transformer_graph(_spec(qk_layernorm=True, position_embedding_type="none"))
    assert plain.has_edge("L0.qk_ln", "L0.attn")


def test_the_norms_cover_every_query_head_and_key_group_forward_and_backward():
    spec = _spec(qk_layernorm=True)
    width = (16 + 4) * spec.head_dim
    assert spec.qk_norm_width == width
    nodes = _nodes(spec)
    fwd, bwd = nodes["L0.qk_ln"], nodes["L0.qk_ln.bwd"]
    assert (fwd["rows"], fwd["cols"]) == (4096 * 20, spec.head_dim)
    assert bwd["elements"] == 4096 * width and bwd["wgrad_elements"] == 4 * spec.head_dim
    # the backward runs between the rotary embedding's and the QKV projection's
    g = transformer_graph(spec)
    assert g.has_edge("L0.rope.bwd", "L0.qk_ln.bwd") and g.has_edge("L0.qk_ln.bwd", "L0.qkv.dX")


def test_weights_memory_and_time_grow_by_the_norms_alone():
    off, on = _spec(), _spec(qk_layernorm=True)
    assert layer_params(on, 0)[0] - layer_params(off, 0)[0] == 4 * on.head_dim
    # the norms' input (every query and key, bf16) is kept for their backward
    def activations(spec: TransformerSpec) -> float:
        return transformer_memory(spec, tp=1, pp=1, dp=1)["activations_bytes"]

    kept = 2 * on.num_layers * 4096 * on.qk_norm_width
    assert activations(on) - activations(off) == pytest.approx(kept)
    t_off = crossflow.predict(workload=off, system="dgx-h100-megatron-core",
                              parallelism="t2-d4").time_s
    t_on = crossflow.predict(workload=on, system="dgx-h100-megatron-core",
                             parallelism="t2-d4").time_s
    assert 1.0 < t_on / t_off < 1.05


def test_latent_attention_has_its_own_norms_and_the_flag_adds_none():
    mla = load_spec("deepseek-v3", "workloads").model_copy(update={
        "num_layers": 2, "moe_layer_freq": 1, "mtp_num_layers": None,
        "global_batch_size": 8})
    flagged = mla.model_copy(update={"qk_layernorm": True})
    assert flagged.qk_norm_width == 0 and block_ops(flagged, "*E") == block_ops(mla, "*E")
    assert {"q_ln", "kv_ln"} <= set(block_ops(mla, "*E"))


def test_qwen3_presets_have_them():
    for name in ("qwen3-30b-a3b", "qwen3-235b-a22b"):
        spec = load_spec(name, "workloads")
        assert spec.qk_layernorm and "qk_ln" in block_ops(spec, "*E")
