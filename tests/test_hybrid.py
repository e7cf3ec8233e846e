"""Hybrid Mamba-2 stacks (Megatron-LM's ``hybrid_override_pattern``; Nemotron 3 Nano):
the spec's checks, the graph against its closed form and parameter counts, predictions
against the published runs, and the parallelism a Mamba-2 layer takes or refuses."""

from __future__ import annotations

import pytest

import crossflow
from crossflow.config import load_spec
from crossflow.config.workload import TransformerSpec
from crossflow.errors import ConfigError
from crossflow.workloads import graph_flops, transformer_flops, transformer_graph
from crossflow.workloads.transformer import layer_params

SYSTEM = "dgx-h100-megatron-core"


def _tiny(**kw) -> TransformerSpec:
    base = dict(kind="transformer", num_layers=5, hidden_size=64, num_attention_heads=4,
                seq_length=256, vocab_size=100, global_batch_size=4, micro_batch_size=2,
                hybrid_override_pattern="ME*-E", num_moe_experts=4, moe_router_topk=2,
                mamba_num_heads=4, mamba_head_dim=32, mamba_state_dim=16, mamba_num_groups=2)
    return TransformerSpec(**(base | kw))


@pytest.mark.parametrize("change, key", [
    ({"hybrid_override_pattern": "ME*-X"}, "hybrid_override_pattern"),   # not a symbol
    ({"hybrid_override_pattern": "ME*E"}, "hybrid_override_pattern"),    # 4 for 5 layers
    ({"num_moe_experts": None}, "hybrid_override_pattern"),              # E without experts
    ({"hybrid_override_pattern": "MM*-M"}, "hybrid_override_pattern"),   # experts, no E
    ({"moe_layer_freq": 2}, "moe_layer_freq"),                           # the pattern places them
    ({"mamba_num_groups": 3}, "mamba_num_groups"),                       # 4 heads in 3 groups
])
def test_a_pattern_that_does_not_fit_is_refused_naming_the_key(change, key):
    with pytest.raises(ConfigError) as info:
        _tiny(**change)
    assert info.value.key == key


def test_the_layers_are_what_the_pattern_says():
    spec = _tiny()
    assert spec.layer_kinds == ("M", "E", "*", "-", "E")
    assert spec.moe_layers == (False, True, False, False, True) and spec.moe
    assert (spec.mamba_inner, spec.mamba_conv_width, spec.mamba_in_width) == (
        128, 128 + 2 * 2 * 16, 128 + 192 + 4)
    # a model without a pattern keeps its attention + MLP / MoE blocks
    dense = _tiny(hybrid_override_pattern=None, num_moe_experts=None)
    assert dense.layer_kinds == ("*-",) * 5


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_graph_flops_equal_the_closed_form(recompute):
    spec = _tiny(activation_recompute=recompute)
    g = transformer_graph(spec)
    # the scan's in-chunk products are a flash-style kernel ("attention"), the rest GEMMs
    assert graph_flops(g, ops=["gemm", "attention"]) * g.graph["microbatches"] == (
        pytest.approx(transformer_flops(spec), rel=1e-12))


def test_each_layer_owns_its_own_parameters():
    spec = _tiny()
    g = transformer_graph(spec)
    for layer in range(spec.num_layers):
        owned = sum(a["params"] for _, a in g.nodes(data=True)
                    if a["layer"] == layer and a["phase"] == "fwd")
        assert owned == layer_params(spec, layer)[0], spec.layer_kinds[layer]
    # a Mamba-2 layer: norm, in_proj (z, x, B, C, dt), conv (x, B, C) weights and biases,
    # dt bias, A and D per head, the gated norm, out_proj
    h, di, heads = 64, 128, 4
    assert layer_params(spec, 0) == (2 * h + h * (2 * di + 2 * 2 * 16 + heads)
                                     + 5 * (di + 64) + 3 * heads + di + di * h, 0)


def test_nemotron_3_nano_matches_its_published_runs():
    """Held out: nothing is fitted to these rows (crossflow validate training prints them)."""
    from crossflow.validation.megatron_bridge import hybrid_dataset

    data = hybrid_dataset()
    assert len(data.rows) == 4 and data.passed
    for row in data.rows:  # measured 14 336-14 890 tokens/s per GPU
        assert abs(row.error) < 0.15, row


def test_nano_preset_predicts_and_tensor_parallelism_splits_the_mixers():
    spec = load_spec("nemotron-3-nano", "workloads")
    assert spec.layer_kinds.count("M") == 23 and spec.layer_kinds.count("*") == 6
    par = {"data_parallel": 16, "expert_parallel": 8, "use_distributed_optimizer": True,
           "recompute_granularity": "full"}
    one = crossflow.predict(workload=spec, system=SYSTEM, parallelism=par)
    two = crossflow.predict(workload=spec, system=SYSTEM, parallelism={
        **par, "tensor_parallel": 2, "data_parallel": 8, "sequence_parallel": True})
    assert one.feasible and two.feasible
    assert two.breakdown["tp_comm_s"] + two.details["hidden_comm_s"]["tp_comm_s"] > 0
    # twice the devices per replica (and twice the micro-batches per replica): each
    # micro-batch's GEMMs on a device take about half the time
    per_micro = [p.breakdown["compute_s"] / (1024 // dp) for p, dp in ((one, 16), (two, 8))]
    assert 0.4 < per_micro[1] / per_micro[0] < 0.6


def test_parallelism_a_mamba_layer_cannot_take_is_refused():
    spec = load_spec("nemotron-3-nano", "workloads")
    with pytest.raises(ConfigError) as info:  # 64 heads in 8 groups: 16 does not divide 8
        crossflow.predict(workload=spec, system=SYSTEM,
                          parallelism={"tensor_parallel": 16, "sequence_parallel": True})
    assert info.value.key == "tensor_parallel" and "mamba_num_groups" in str(info.value)
    with pytest.raises(ConfigError) as info:
        crossflow.predict(workload=spec, system=SYSTEM,
                          parallelism={"data_parallel": 8, "context_parallel": 2})
    assert info.value.key == "context_parallel" and "Mamba-2" in str(info.value)
