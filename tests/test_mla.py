"""Multi-head latent attention (DeepSeek-V2/V3; issue #22): its five projections in the
graph, FLOPs and parameters against closed forms, the DeepSeek-V3 preset against the
report's 671B parameters, the configuration errors, and MLA under tensor, context and
expert parallelism."""

from __future__ import annotations

import pytest

import crossflow
from crossflow.config.loader import load_spec
from crossflow.config.workload import TransformerSpec
from crossflow.errors import ConfigError
from crossflow.sim.training import spec_model_flops
from crossflow.workloads import transformer_graph
from crossflow.workloads.transformer import layer_params

SYSTEM = "dgx-h100-megatron-core"


def _mla(**kw) -> TransformerSpec:
    """A small DeepSeek-like model: MLA, two dense layers then two MoE layers."""
    base = dict(kind="transformer", name="mla", num_layers=4, hidden_size=1024,
                ffn_hidden_size=2048, num_attention_heads=16, multi_latent_attention=True,
                q_lora_rank=384, kv_lora_rank=128, qk_head_dim=64, qk_pos_emb_head_dim=32,
                v_head_dim=64, seq_length=1024, vocab_size=32000, global_batch_size=64,
                gated_linear_unit=True, untie_embeddings_and_output_weights=True,
                position_embedding_type="rope", num_moe_experts=16, moe_router_topk=4,
                moe_ffn_hidden_size=256, moe_shared_expert_intermediate_size=256,
                moe_layer_freq=(0, 0, 1, 1), precision="bf16")
    return TransformerSpec(**(base | kw))


H, A, QL, KVL, NOPE, ROPE, V, S = 1024, 16, 384, 128, 64, 32, 64, 1024
#: per token, the projections' multiply-adds: q down / up, kv down / up, output
MACS = H * QL + QL * A * (NOPE + ROPE) + H * (KVL + ROPE) + KVL * A * (NOPE + V) + A * V * H


def _fwd(g, layer: int, op: str) -> float:
    return sum(a["flops"] for n, a in g.nodes(data=True)
               if n.startswith(f"L{layer}.") and a["phase"] == "fwd" and a["op"] == op)


def test_the_graph_runs_mla_s_five_projections_and_wider_queries_and_keys():
    spec = _mla(attention_backend="flash")
    assert spec.attention_macs == MACS
    g = transformer_graph(spec)
    names = {a["name"] for n, a in g.nodes(data=True) if n.startswith("L0.")}
    assert {"q_down", "q_ln", "q_up", "kv_down", "kv_ln", "kv_up", "rope"} <= names
    assert "qkv" not in names
    # the dense layer's GEMMs: the five projections and the gated MLP
    assert _fwd(g, 0, "gemm") == 2 * S * (MACS + 3 * H * 2048)
    # the fused kernel: QKᵀ over qk_head_dim + rope, PV over v_head_dim, causal half
    assert _fwd(g, 0, "attention") == pytest.approx(2 * A * S * S * (NOPE + ROPE + V) / 2)
    bwd = sum(a["flops"] for n, a in g.nodes(data=True)
              if n.startswith("L0.") and a["op"] == "attention" and a["phase"] == "bwd")
    # backward: QKᵀ again, dQ, dK over the query width; dV, dP over the value width
    assert bwd == pytest.approx(2 * A * S * S * (3 * (NOPE + ROPE) + 2 * V) / 2)
    # unfused: the two batched GEMMs with their own widths
    u = transformer_graph(_mla(attention_backend="unfused"))
    qk, av = ({a["name"]: a for n, a in u.nodes(data=True) if n.startswith("L0.")}[x]
              for x in ("qk", "av"))
    assert (qk["k"], av["n"]) == (NOPE + ROPE, V)
    # every weight gradient of the projections, into the optimizer
    dws = {a["name"] for n, a in g.nodes(data=True)
           if n.startswith("L0.") and a.get("wgrad_elements") and a["op"] == "gemm"}
    assert {"q_down.dW", "q_up.dW", "kv_down.dW", "kv_up.dW", "proj.dW"} <= dws


def test_parameters_and_model_flops_follow_the_closed_forms():
    spec = _mla()
    norms = QL + KVL + 4 * H  # the two latents' norms, the block's two layernorms
    attention = MACS + norms
    mlp = 3 * H * 2048 + 2 * 2048 + H  # the dense MLP, with its biases as for any block
    assert layer_params(spec, 0)[0] == attention + mlp
    # model FLOPs: projections, the full s×s scores (qk width) and values (v width)
    per_token_attention = 2 * MACS + 2 * S * A * (NOPE + ROPE + V)
    dense = spec.model_copy(update={"moe_layer_freq": (0, 0, 0, 0)})
    without_mla_part = spec_model_flops(dense) - 3 * 64 * S * 4 * per_token_attention
    assert without_mla_part == 3 * 64 * S * (4 * 2 * 3 * H * 2048 + 2 * H * 32000)
    # without a q_lora_rank the queries come straight from the hidden state
    direct = _mla(q_lora_rank=None)
    assert direct.attention_macs == MACS - H * QL - QL * A * 96 + H * A * 96
    assert "q_proj" in {a["name"] for _, a in transformer_graph(direct).nodes(data=True)}


def test_the_deepseek_v3_preset_holds_671b_parameters():
    """DeepSeek-V3's report (arXiv:2412.19437, abstract): 671B parameters, 37B active per
    token (the MTP module's 14B not included)."""
    spec = load_spec("deepseek-v3", "workloads")
    assert spec.multi_latent_attention and sum(spec.moe_layers) == 58
    total = sum(sum(layer_params(spec, i)) for i in range(61)) + 2 * 129280 * 7168
    assert total == pytest.approx(671e9, rel=0.005)
    expert = 3 * 7168 * 2048
    active = total - 58 * (256 - 8) * expert
    assert active == pytest.approx(37e9, rel=0.03)


@pytest.mark.parametrize("kw, key", [
    ({"multi_latent_attention": False}, "q_lora_rank"),
    ({"num_query_groups": 4}, "num_query_groups"),
    ({"kv_channels": 64}, "kv_channels"),
])
def test_mla_widths_without_mla_or_gqa_widths_with_it_are_config_errors(kw, key):
    with pytest.raises(ConfigError, match="latent attention") as err:
        _mla(**kw)
    assert err.value.key == key and err.value.allowed


@pytest.mark.parametrize("par", [
    {"tensor_parallel": 2, "sequence_parallel": True, "data_parallel": 4,
     "expert_parallel": 8},
    {"data_parallel": 4, "context_parallel": 2, "expert_parallel": 8},
    {"pipeline_parallel": 2, "data_parallel": 4, "expert_parallel": 4},
])
def test_mla_predicts_under_every_parallelism(par):
    spec = _mla(precision="fp8")
    p = crossflow.predict(workload=spec, system=SYSTEM, parallelism=par
                          | {"use_distributed_optimizer": True})
    assert p.feasible and p.time_s > 0
    # a wider latent costs time
    wider = crossflow.predict(workload=_mla(precision="fp8", kv_lora_rank=1024),
                              system=SYSTEM, parallelism=par
                              | {"use_distributed_optimizer": True})
    assert wider.time_s > p.time_s
