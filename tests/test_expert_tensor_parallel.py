"""Expert tensor parallelism (issue #22, Megatron's ``--expert-tensor-parallel-size``): the
expert grid's groups, the expert GEMMs' shards, the dispatcher's all-gather and
reduce-scatter in the expert-tensor group, the memory split, the configuration errors,
and predictions without it left exactly as they were."""

from __future__ import annotations

import pytest
from test_moe import _moe  # the small Qwen3-like MoE model both files price

import crossflow
from crossflow.arch.hardware import load_hardware
from crossflow.config.loader import load_spec
from crossflow.errors import ConfigError
from crossflow.sim.training import transformer_memory
from crossflow.sim.transformer import expert_shard as _expert_shard
from crossflow.system import build_system
from crossflow.system.collectives import all_gather
from crossflow.workloads import transformer_graph

SYSTEM = "dgx-h100-megatron-core"
ORDER = "kp1-kp2-dp-lp"  # tensor ranks adjacent, then data: a node holds 8 of a stage's ranks


def _par(etp: int | None = None, **kw) -> dict:
    par = {"tensor_parallel": 2, "sequence_parallel": True, "data_parallel": 8,
           "expert_parallel": 4, "use_distributed_optimizer": True} | kw
    return par if etp is None else par | {"expert_tensor_parallel": etp}


#: Predictions of MoE settings before expert tensor parallelism existed (commit 191ea82):
#: time, bytes per device, energy, exposed expert communication.  Unset, the degree is 1,
#: what those predictions assumed (each expert whole on one rank).  The FP8 one's bytes
#: re-recorded (583639040 before) when FP8's saved expert inputs — the permuted copies and
#: the experts' fc2 inputs — were counted at 1 byte, as a dense MLP's fc1 and fc2 inputs
#: already were; its time is unchanged.  Both bytes re-recorded (561880576 and 579444736
#: before) when memory counted the loss's fp32 logits and the fuller of the first and last
#: pipeline stages, and the first's energy (18.40255437635584) when one stage's untied
#: output layer was counted among its parameters (its optimizer step); times unchanged.
#: Both times and exposed all-to-alls re-recorded (0.305769 / 0.000471 and 0.294617 /
#: 0.000254 s before) when dgx-h100-megatron-core and its MoE constants were re-fitted to
#: the published runs without dropout; bytes and energy unchanged.
MOE_BEFORE = {
    "tp2 ep4": (_moe(), _par(), (0.30676127554936017, 719625728.0, 18.47511583555584,
                                 0.00041706130523577235)),
    "tp2 ep8 pp2 fp8": (_moe(precision="fp8"), {
        "tensor_parallel": 2, "sequence_parallel": True, "data_parallel": 8,
        "pipeline_parallel": 2, "expert_parallel": 8},
        (0.29560317800159286, 610377728.0, 16.0467792166912, 0.00022471680138753405)),
}


@pytest.mark.parametrize("name", sorted(MOE_BEFORE))
def test_moe_predictions_without_expert_tensor_parallelism_are_unchanged(name):
    spec, par, before = MOE_BEFORE[name]
    for given in (par, par | {"expert_tensor_parallel": 1}):
        p = crossflow.predict(workload=spec, system=SYSTEM, parallelism=given)
        assert (p.time_s, p.memory_per_device_bytes, p.energy_J,
                p.breakdown["ep_comm_s"]) == before
        assert p.details["expert_tensor_parallel"] == 1


def test_the_expert_grid_is_expert_tensor_fastest_then_expert():
    """Megatron-Core's expert RankGenerator (order tp-ep-dp-pp): over a stage's ranks an
    expert-tensor group is etp consecutive ranks, an expert group every etp-th rank."""
    spec = load_spec(SYSTEM, "systems")
    system = build_system(spec, load_hardware(spec.device), num_nodes=2)
    m = system.map((2, 1, 8, 1), ORDER)  # tp 2 × dp 8, one stage of 16 ranks
    assert m.expert_tensor_groups(2).tolist() == [[2 * i, 2 * i + 1] for i in range(8)]
    assert m.expert_groups(4, 2).tolist() == [[0, 2, 4, 6], [1, 3, 5, 7],
                                              [8, 10, 12, 14], [9, 11, 13, 15]]
    # without expert tensor parallelism: consecutive ranks, as before
    assert m.expert_groups(4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7],
                                           [8, 9, 10, 11], [12, 13, 14, 15]]
    # an expert-tensor group as large as the tensor-parallel one is that group
    assert m.expert_tensor("all_gather", 1e8, 2) == all_gather(1e8, m.group("kp1"))


def test_expert_gemms_split_their_width_for_the_groups_tokens():
    """Each of etp ranks holds 1/etp of an expert's width (fc1's columns, fc2's rows) and
    runs the tokens of its whole expert-tensor group: the same FLOPs per rank, GEMMs of
    another shape, the weight gradients of its slice only."""
    g = transformer_graph(_moe())
    experts = [a for _, a in g.nodes(data=True) if a.get("expert_tokens")]
    assert {a["name"] for a in experts} == {
        "expert_fc1", "expert_fc2", "expert_fc1.dX", "expert_fc1.dW", "expert_fc2.dX",
        "expert_fc2.dW"}
    split = {"expert_fc1": "n", "expert_fc2": "k", "expert_fc1.dX": "k",
             "expert_fc1.dW": "n", "expert_fc2.dX": "n", "expert_fc2.dW": "m"}
    for a in experts:
        one, two = _expert_shard(a, 4), _expert_shard(a, 4, 2)
        width, tokens = split[a["name"]], a["expert_tokens"]
        assert two[width] * 2 == one[width] == a[width]
        assert two[tokens] == 2 * one[tokens] == 8 * a[tokens]
        assert two["count"] == one["count"] == 32 // 4
        assert two["flops"] == one["flops"] == a["flops"]
        if a["wgrad_elements"]:
            assert two["wgrad_elements"] * 2 == one["wgrad_elements"]
    # FP8: Transformer Engine casts the gathered rows (fc1's input, fc2's output gradient),
    # etp times a rank's own; the casts of narrower tensors keep their size
    from crossflow.sim.transformer import expert_gathered as _expert_gathered

    g8 = transformer_graph(_moe(precision="fp8"))
    gathered = {n for n, a in g8.nodes(data=True)
                if n.startswith("L0.") and a.get("expert_gathered")}
    assert gathered == {"L0.expert_cast", "L0.expert_fc2.dY_cast"}
    for n in gathered:
        a = g8.nodes[n]
        assert _expert_gathered(a, 2)["elements"] == 2 * a["elements"]
        assert _expert_gathered(a, 2)["flops"] == 2 * a["flops"]
    p1, p2 = (crossflow.predict(workload=_moe(precision="fp8"), system=SYSTEM,
                                parallelism=_par(etp)) for etp in (1, 2))
    assert p2.details["block_forward_s"]["memory"] > p1.details["block_forward_s"]["memory"]


def test_the_dispatcher_gathers_and_scatters_in_the_expert_tensor_group():
    """Beside each of the four all-to-alls of a pass pair (dispatch and combine, forward
    and backward), an all-gather or a reduce-scatter of etp × a rank's routed rows in the
    expert-tensor group: inside a node over NVSwitch, across nodes over the network."""
    spec = load_spec(SYSTEM, "systems")
    system = build_system(spec, load_hardware(spec.device), num_nodes=2)
    near = system.map((2, 1, 8, 1), ORDER)
    routed = 1024 * 4 // 2 * 1024 * 2  # the tokens' 4 copies on one of 2 ranks, bf16
    a2a, gather = near.all_to_all(routed, 4, 2), near.expert_tensor("all_gather",
                                                                     2 * routed, 2)
    assert gather == all_gather(2 * routed, near.group("kp1")) > 0
    p = crossflow.predict(workload=_moe(), system=SYSTEM, parallelism=_par(2),
                          mapping_order=ORDER)
    f, b = p.details["block_forward_s"], p.details["block_backward_s"]
    assert f["ep_comm"] == pytest.approx(2 * (a2a + gather))
    assert b["ep_comm"] == pytest.approx(2 * (a2a + gather))
    # two collectives more per pass than the all-to-alls alone
    one = crossflow.predict(workload=_moe(), system=SYSTEM, parallelism=_par(),
                            mapping_order=ORDER)
    assert f["collectives"] == one.details["block_forward_s"]["collectives"] + 2
    # the same groups with the data ranks placed across the two nodes: each expert-tensor
    # pair spans them, its ring on the network
    far = system.map((2, 1, 8, 1), ("dp", "kp1", "kp2", "lp"))
    assert len(set(far.expert_tensor_groups(2)[0] // 8)) == 2
    big = 1e10  # latencies vanish
    ratio = far.expert_tensor("all_gather", big, 2) / near.expert_tensor("all_gather", big, 2)
    nvswitch = spec.intra.bandwidth_Bps * spec.intra.collective.efficiency
    nic = spec.inter.bandwidth_Bps * spec.inter.collective.efficiency
    assert ratio == pytest.approx(nvswitch / nic, rel=0.02)


def test_an_expert_grid_as_large_as_the_stage_fits():
    """etp × ep = tp × dp: one expert-data-parallel rank, nothing to reduce the experts'
    gradients over."""
    p = crossflow.predict(workload=_moe(), system=SYSTEM, parallelism=_par(4))
    assert p.feasible and p.details["expert_tensor_parallel"] == 4


def test_only_expert_tensor_parallelism_gathers_without_all_to_alls():
    """expert_parallel 1, expert_tensor_parallel 2: no all-to-all, the gathers only."""
    p = crossflow.predict(workload=_moe(), system=SYSTEM, parallelism=_par(2, expert_parallel=1),
                          mapping_order=ORDER)
    spec = load_spec(SYSTEM, "systems")
    system = build_system(spec, load_hardware(spec.device), num_nodes=2)
    m = system.map((2, 1, 8, 1), ORDER)
    routed = 1024 * 4 // 2 * 1024 * 2
    gather = m.expert_tensor("all_gather", 2 * routed, 2)
    assert p.details["block_forward_s"]["ep_comm"] == pytest.approx(2 * gather)


def test_expert_weights_and_state_split_by_expert_and_expert_tensor_parallelism():
    spec = _moe()

    def memory(etp: int) -> dict:
        return transformer_memory(spec, tp=2, pp=1, dp=8, sp=True, zero1=True, ep=4, etp=etp)

    one, two = memory(1), memory(2)
    experts = 4 * 32 * 3 * 1024 * 512  # every layer's routed experts
    # weights (2 B) and the fp32 gradient buffer (4 B): experts / (ep · etp)
    assert one["weights_bytes"] - two["weights_bytes"] == pytest.approx(
        2 * experts * (1 / 4 - 1 / 8))
    assert one["gradients_bytes"] - two["gradients_bytes"] == pytest.approx(
        4 * experts * (1 / 4 - 1 / 8))
    # the distributed optimizer shards them over the expert-data-parallel ranks:
    # 16 / (4 · etp), so the state per rank is the same
    assert one["optimizer_state_bytes"] == pytest.approx(two["optimizer_state_bytes"])
    # each rank keeps the experts' input its group gathered: 2 bytes × 4 copies × etp per
    # token of its sequence-parallel share (1024 / 2), in each of the 4 layers
    assert two["activations_bytes"] - one["activations_bytes"] == pytest.approx(
        2 * 4 * (2 - 1) * 1024 * 1024 / 2 * 4)


@pytest.mark.parametrize("spec, par, text, allowed", [
    (_moe(), _par(4, data_parallel=4), r"\(4 × 4 = 16\) must divide 8",
     "with expert_parallel 4, a divisor of 2: 1, 2"),
    (_moe().model_copy(update={"num_moe_experts": None}),
     {"data_parallel": 8, "expert_tensor_parallel": 2}, "has none", None),
    (_moe(), {"data_parallel": 6, "expert_tensor_parallel": 3}, "moe_ffn_hidden_size",
     "a divisor of 512"),
    (_moe(), {"strategy": "RC-2-2-d4-p1", "expert_tensor_parallel": 2},
     "kernel parallelism", "1 with an RC / CR strategy"),
])
def test_bad_expert_tensor_parallelism_is_a_config_error(spec, par, text, allowed):
    with pytest.raises(ConfigError, match=text) as err:
        crossflow.predict(workload=spec, system=SYSTEM, parallelism=par)
    assert err.value.key == "expert_tensor_parallel"
    assert err.value.value == par["expert_tensor_parallel"]
    if allowed:
        assert err.value.allowed == allowed


def test_expert_tensor_parallel_is_a_searchable_parallelism_option():
    from dataclasses import replace

    from crossflow.search.space import Dimension, SearchSpaceSpec
    from crossflow.search.study import load_study

    assert SearchSpaceSpec(params={"expert_tensor_parallel": [1, 2]})
    with pytest.raises(ConfigError, match="not an allowed value") as err:
        SearchSpaceSpec(params={"expert_tensor_parallel": [1, 0]})
    assert err.value.key == "params.expert_tensor_parallel[1]"
    setup = load_study("qwen3-30b-a3b-h100")
    space = replace(setup.space, dimensions=(
        *setup.space.dimensions, Dimension("expert_tensor_parallel", "categorical", (1, 2))))
    design = space.decode({"strategy": "t2-d8-p1-sp", "mapping_order": ORDER,
                           "expert_parallel": 4, "expert_tensor_parallel": 2,
                           "context_parallel": 1, "micro_batch_size": 1,
                           "use_distributed_optimizer": True})
    par = setup.parallelism(design)
    assert par["expert_tensor_parallel"] == 2
    p = crossflow.predict(workload=setup.workload, system=SYSTEM, parallelism=par)
    assert p.feasible and p.details["expert_tensor_parallel"] == 2
