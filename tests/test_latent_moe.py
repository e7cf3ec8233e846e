"""Latent MoE (Megatron-LM's ``moe_latent_size``; Nemotron 3 Super): the routed experts
work in a narrower latent space — a token projected down before the dispatch and back up
after the combine — so the experts' GEMMs, the all-to-alls and the permuted copies carry
the latent width, and the router and the shared expert the full one."""

from __future__ import annotations

import pytest

import crossflow
from crossflow.config import load_spec
from crossflow.config.workload import TransformerSpec
from crossflow.errors import ConfigError
from crossflow.sim.model_flops import hybrid_model_flops
from crossflow.workloads import graph_flops, transformer_flops, transformer_graph
from crossflow.workloads.transformer import layer_params

SYSTEM = "dgx-h100-megatron-core"


def _tiny(**kw) -> TransformerSpec:
    base = dict(kind="transformer", num_layers=4, hidden_size=64, num_attention_heads=4,
                seq_length=256, vocab_size=100, global_batch_size=4, micro_batch_size=2,
                num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=48,
                moe_shared_expert_intermediate_size=32, moe_latent_size=16)
    return TransformerSpec(**(base | kw))


def test_a_latent_space_without_experts_is_refused_naming_the_key():
    with pytest.raises(ConfigError) as info:
        _tiny(num_moe_experts=None, moe_shared_expert_intermediate_size=None)
    assert info.value.key == "moe_latent_size" and "num_moe_experts" in str(info.value)


@pytest.mark.parametrize("precision", ["fp16", "fp8"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_graph_flops_equal_the_closed_form(precision, recompute):
    spec = _tiny(activation_recompute=recompute, precision=precision)
    g = transformer_graph(spec)
    assert graph_flops(g, ops=["gemm", "attention"]) * g.graph["microbatches"] == (
        pytest.approx(transformer_flops(spec), rel=1e-12))


def test_the_experts_and_the_projections_carry_the_latent_width():
    spec = _tiny()
    g = transformer_graph(spec)
    nodes = {a["name"]: a for _, a in g.nodes(data=True) if a["layer"] == 0}
    h, w, f = 64, 16, 48
    assert (nodes["latent_down"]["k"], nodes["latent_down"]["n"]) == (h, w)
    assert (nodes["latent_up"]["k"], nodes["latent_up"]["n"]) == (w, h)
    assert nodes["expert_fc1"]["k"] == w and nodes["expert_fc2"]["n"] == w
    assert nodes["router"]["k"] == h and nodes["shared_fc1"]["k"] == h
    for name in ("latent_up.dX", "latent_up.dW", "latent_down.dX", "latent_down.dW"):
        assert name in nodes
    # every weight gradient of the layer goes to its optimizer step
    wgrad = {n for n, a in g.nodes(data=True) if a["layer"] == 0 and a.get("wgrad_elements")}
    into_optimizer = {u for u, v, e in g.edges(data=True)
                      if e.get("kind") == "wgrad" and g.nodes[v]["layer"] == 0}
    assert {g.nodes[n]["name"] for n in wgrad - into_optimizer} == set()
    assert {"latent_up.dW", "latent_down.dW"} <= {g.nodes[n]["name"] for n in into_optimizer}
    # parameters: the router, the two projections and the shared expert beside attention;
    # the experts' weights at the latent width
    owned = sum(a["params"] for _, a in g.nodes(data=True)
                if a["layer"] == 0 and a["phase"] == "fwd")
    assert owned == layer_params(spec, 0)[0]
    assert layer_params(spec, 0)[1] == 8 * (w * f + f * w)
    assert layer_params(spec, 0)[0] - layer_params(_tiny(moe_latent_size=None), 0)[0] == (
        2 * h * w)


def test_model_flops_count_what_megatron_bridge_counts():
    """Megatron-Bridge's ``moe_layer_flops`` with a latent size (flop_utils.py): the routed
    experts at the latent width, 4·h·latent for the two projections, the shared expert at
    the hidden width; the router (2·h·experts) as Megatron-LM counts it."""
    spec = load_spec("nemotron-3-super", "workloads")
    h, w, f, k, E = 4096, 1024, 2688, 22, 512
    sf = 5376
    per_token = 4 * w * f * k + 4 * h * w + 4 * h * sf + 2 * h * E
    assert 2 * spec.moe_macs == per_token
    without = spec.model_copy(update={"moe_latent_size": None})
    assert hybrid_model_flops(spec) < hybrid_model_flops(without)


def test_nemotron_3_super_has_its_published_size_and_predicts():
    """120B total, 12B active (the model's name, NVIDIA-Nemotron-3-Super-120B-A12B):
    without the latent space the same experts would hold ~4x the parameters."""
    spec = load_spec("nemotron-3-super", "workloads")
    assert spec.layer_kinds.count("M") == 40 and spec.layer_kinds.count("E") == 40
    layers = [layer_params(spec, i) for i in range(spec.num_layers)]
    embeddings = 2 * spec.vocab_size * spec.hidden_size
    total = sum(a + b for a, b in layers) + embeddings
    active = sum(a + b * 22 / 512 for a, b in layers) + embeddings
    assert 118e9 < total < 123e9 and 11e9 < active < 13.5e9
    par = {"tensor_parallel": 8, "data_parallel": 8, "expert_parallel": 16,
           "sequence_parallel": True, "use_distributed_optimizer": True}
    assert crossflow.predict(workload=spec, system=SYSTEM, parallelism=par).feasible


def test_the_dispatch_and_combine_carry_the_latent_width():
    """Nemotron 3 Nano's published layout with its experts in a quarter-wide latent space:
    the all-to-alls carry a quarter of the bytes, the experts' GEMMs a quarter of the
    FLOPs."""
    # 4K sequences: the published 8K run fits by recomputing modules, which are not modelled
    nano = load_spec("nemotron-3-nano", "workloads").model_copy(update={"seq_length": 4096})
    par = {"data_parallel": 16, "expert_parallel": 8, "use_distributed_optimizer": True}
    plain = crossflow.predict(workload=nano, system=SYSTEM, parallelism=par)
    latent = crossflow.predict(workload=nano.model_copy(update={"moe_latent_size": 672}),
                               system=SYSTEM, parallelism=par)
    ep = [p.breakdown["ep_comm_s"] + p.details["hidden_comm_s"]["ep_comm_s"]
          for p in (latent, plain)]
    assert 0.15 < ep[0] / ep[1] < 0.4
    assert latent.time_s < plain.time_s
