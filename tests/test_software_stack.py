"""The software-stack layer (issue #12): host dispatch as a resource, kernel minimums, NCCL
protocols, and the accuracy it must show on vTrain's and Vidur's measurements."""

from __future__ import annotations

from functools import cache

import pytest

import crossflow
from crossflow.config.loader import load_spec
from crossflow.system import build_system
from crossflow.system.collectives import Group, all_reduce, send_recv

GPT_SMALL = {"kind": "transformer", "num_layers": 12, "hidden_size": 1024,
             "num_attention_heads": 16, "seq_length": 1024, "vocab_size": 50304,
             "global_batch_size": 8, "micro_batch_size": 1, "activation_recompute": "full"}


def _with_software(**update):
    base = load_spec("dgx-a100-megatron-deepspeed", "systems")
    return base.model_copy(update={"software": base.software.model_copy(update=update)})


def _time(system, workload=GPT_SMALL, tp=2, pp=2, dp=1) -> float:
    return crossflow.predict(workload=workload, hardware="a100-sxm4-80gb", system=system,
                             parallelism={"tensor_parallel": tp, "pipeline_parallel": pp,
                                          "data_parallel": dp}).time_s


# --- the model ----------------------------------------------------------------------------------


def test_a_free_host_gives_the_device_only_prediction():
    free = _with_software(dispatch_s=0.0, backward_dispatch_s=0.0, collective_dispatch_s=0.0,
                          iteration_s=0.0)
    device = _with_software(dispatch_s=0.0, backward_dispatch_s=0.0,
                            collective_dispatch_s=0.0, iteration_s=0.0, sync="none")
    assert _time(free) == pytest.approx(_time(device), rel=1e-12)
    assert "host_dispatch_s" not in crossflow.predict(
        workload=GPT_SMALL, hardware="a100-sxm4-80gb", system=free,
        parallelism={"tensor_parallel": 2}).breakdown


@pytest.mark.parametrize("sync", ["none", "pass", "layer"])
def test_more_host_time_is_never_faster_and_small_models_become_host_bound(sync):
    times = [_time(_with_software(dispatch_s=d * 1e-6, sync=sync)) for d in (0, 50, 100, 200)]
    assert times == sorted(times)
    # at micro-batch 1 and hidden 1024 the host is the critical path: doubling its dispatch
    # cost makes the iteration clearly longer
    assert times[3] > 1.3 * times[1]


def test_the_host_is_hidden_behind_a_large_model():
    big = {**GPT_SMALL, "hidden_size": 8192, "num_attention_heads": 64, "num_layers": 4,
           "micro_batch_size": 4, "global_batch_size": 16, "seq_length": 2048}
    free = _time(_with_software(dispatch_s=0.0, backward_dispatch_s=0.0), big, tp=4)
    busy = _time(_with_software(dispatch_s=20e-6, backward_dispatch_s=10e-6,
                                sync="pass"), big, tp=4)
    assert busy == pytest.approx(free, rel=0.01)


def test_layer_sync_is_never_faster_than_running_ahead():
    assert _time(_with_software(sync="layer")) >= _time(_with_software(sync="pass"))
    assert _time(_with_software(sync="pass")) >= _time(_with_software(sync="none"))


def test_kernel_minimum_bounds_tiny_kernels():
    from crossflow.distributed import with_software
    from crossflow.kernels import ops
    from crossflow.kernels.gemm import gemm
    from crossflow.predict import load_hardware

    a100 = load_hardware("a100-sxm4-80gb")
    sw = load_spec("vidur-a100-dgx", "systems").software
    run = with_software(a100, sw)
    tiny = gemm(run, 8, 64, 64, "fp16")
    assert tiny.time_s - tiny.launch_s == pytest.approx(sw.kernel_min_s)
    add = ops.elementwise(run, 16, "fp16", inputs=2)
    assert add.time_s - add.launch_s == pytest.approx(sw.kernel_min_s)
    # and nothing below: a big kernel is untouched
    big = gemm(run, 4096, 4096, 4096, "fp16")
    assert big.time_s - big.launch_s > 100 * sw.kernel_min_s


def test_memory_passes_scale_the_bytes_of_that_op_only():
    from dataclasses import replace

    from crossflow.kernels import ops
    from crossflow.predict import load_hardware

    a100 = load_hardware("a100-sxm4-80gb")
    twice = replace(a100, memory_passes={"layernorm": 2.0})
    one = ops.layernorm(a100, 8192, 8192)
    two = ops.layernorm(twice, 8192, 8192)
    assert sum(two.bytes_per_level.values()) == pytest.approx(
        2 * sum(one.bytes_per_level.values()))
    assert ops.softmax(twice, 8192, 8192).time_s == ops.softmax(a100, 8192, 8192).time_s


def test_rope_and_swiglu_passes_reach_a_training_steps_kernels():
    """A profile's ``memory_passes.rope`` and ``.swiglu`` price the transformer's rotary and
    gated-activation nodes (forward and backward), not only the op-level validation: the
    Llama-style block's memory-bound time grows by more than 30 % and its GEMMs do not
    move, and a GPT-style block (neither op) does not move at all."""
    from dataclasses import replace

    from crossflow.predict import load_hardware
    from crossflow.validation.blocks import block_passes

    h200 = load_hardware("h200-sxm-141gb")
    eager = replace(h200, memory_passes={"rope": 3.0, "swiglu": 2.0})
    llama = {"block": "l", "micro_batch": "1", "seq": "4096", "hidden": "4096", "heads": "32",
             "query_groups": "8", "head_dim": "128", "ffn": "14336", "gated": "1",
             "rope": "1", "experts": "0", "topk": "0", "dtype": "bf16"}
    gpt = {**llama, "gated": "0", "rope": "0"}
    for one, many in zip(block_passes(h200, llama), block_passes(eager, llama), strict=True):
        assert many.memory > 1.3 * one.memory and many.compute == one.compute
    for one, many in zip(block_passes(h200, gpt), block_passes(eager, gpt), strict=True):
        assert many.total == one.total


def test_ll_protocol_wins_small_messages_and_simple_large_ones():
    simple = Group(8, 200e9, step_latency_s=8e-6, launch_s=10e-6)
    both = Group(8, 200e9, step_latency_s=8e-6, launch_s=10e-6, ll_step_latency_s=0.5e-6,
                 ll_fraction=0.5)
    small, large = 8 << 10, 256 << 20
    assert all_reduce(small, both) < 0.3 * all_reduce(small, simple)
    assert all_reduce(large, both) == pytest.approx(all_reduce(large, simple))
    assert send_recv(small, both) < send_recv(small, simple)
    # never slower than either protocol alone
    for size in (1 << k for k in range(10, 30, 3)):
        assert all_reduce(size, both) <= all_reduce(size, simple) + 1e-15


def test_system_low_latency_reaches_the_groups():
    system = build_system("vidur-a100-dgx", num_nodes=1)
    group = system.map((8, 1, 1, 1)).group("kp1")
    assert group.ll_step_latency_s is not None
    assert 0 < group.ll_fraction < 1
    assert build_system("dgx-a100", num_nodes=1).map((8, 1, 1, 1)).group(
        "kp1").ll_step_latency_s is None


# --- accuracy (issue #12 "Must show") -----------------------------------------------------------


@cache
def _vtrain():
    from crossflow.validation.vtrain import vtrain_dataset

    return vtrain_dataset()


def test_vtrain_rows_on_megatron_deepspeed():
    from crossflow.validation.vtrain import group_bias

    ds = _vtrain()
    assert len(ds.rows) == 720
    assert ds.mape <= 0.10
    assert ds.spearman >= 0.95
    bias = group_bias(list(ds.rows))
    assert set(bias) == {"mb1", "mb2", "mb4", "mb8"}
    assert all(abs(b) <= 0.05 for b in bias.values()), bias


def test_vtrain_held_out_four_gpu_rows():
    """The host constants are fitted to the 2-GPU rows; the 4-GPU rows are held out."""
    import numpy as np

    def gpus(label: str) -> int:
        fields = {f[0]: f[1:] for f in label.split() if f[0] in "tdp" and f[1:].isdigit()}
        return int(fields["t"]) * int(fields["d"]) * int(fields["p"])

    rows = [r for r in _vtrain().rows if gpus(r.label) == 4]
    assert len(rows) == 480
    assert float(np.mean([abs(r.error) for r in rows])) <= 0.10


def test_vtrain_on_dgx_a100_without_host_is_what_the_issue_reports():
    """Without the layer the model under-predicts the micro-batch-1 rows, by ~40 % on
    average (issue #12); with it the same rows are unbiased.  One small row (h2048, t1 d4)
    is +3 % on ``dgx-a100`` since that profile prices the weight gradients' accumulation
    into the fp32 buffer (issue #19; −3.6 % before)."""
    import numpy as np

    from crossflow.validation.vtrain import predict_rows, vtrain_rows

    sample = [r for r in vtrain_rows() if r["micro batch"] == "1"][:40]
    without = predict_rows("dgx-a100", sample)
    assert sum(r.error < 0 for r in without) >= len(without) - 1
    assert max(r.error for r in without) < 0.05
    assert float(np.mean([r.error for r in without])) < -0.4
    with_layer = predict_rows("dgx-a100-megatron-deepspeed", sample)
    assert abs(float(np.mean([r.error for r in with_layer]))) < 0.1


@cache
def _collectives():
    from crossflow.validation.collectives import vidur_datasets

    return {ds.name: ds for ds in vidur_datasets()}


@pytest.mark.parametrize(("gpu", "kind", "where"), [
    ("A100", "all-reduce", "inside a node"), ("A100", "all-reduce", "across nodes"),
    ("A100", "send-recv", ""), ("H100", "all-reduce", ""), ("H100", "send-recv", "")])
def test_vidur_collectives_every_size_and_rank_count(gpu, kind, where):
    (ds,) = [d for n, d in _collectives().items() if gpu in n and kind in n and where in n]
    sizes = {int(r.label.split()[0]) for r in ds.rows}
    assert min(sizes) == 2048 and max(sizes) == 64 << 20
    assert ds.max_mape == 0.15
    assert ds.mape <= 0.15
    assert ds.spearman >= 0.9


def test_vidur_a100_across_nodes_covers_every_rank_count_and_placement():
    (ds,) = [d for n, d in _collectives().items() if "across nodes" in n]
    placements = {" ".join(r.label.split()[2:]) for r in ds.rows}  # "<bytes> B x8 (4/node)"
    assert placements == {"x2 (1/node)", "x4 (2/node)", "x8 (4/node)", "x16 (8/node)"}
    # no placement is left far off by the others: each within 25 %
    for placement in placements:
        errors = [abs(r.error) for r in ds.rows if r.label.endswith(placement)]
        assert sum(errors) / len(errors) <= 0.25, placement


# --- NCCL across nodes: tree, tuner, per-hop ring latency, NICs ---------------------------------


def test_tree_correction_is_nccls_simple_table():
    import numpy as np

    from crossflow.system.collectives import TREE_CORRECTION, tree_correction

    assert len(TREE_CORRECTION) == 23
    assert tree_correction(64) == 0.9 and tree_correction(32) == 0.9
    # log2i(bytes >> 6): 4 MiB -> 16, 8 MiB -> 17, 16 MiB -> 18, 64 MiB -> 20
    assert [tree_correction(m << 20) for m in (4, 8, 12, 16, 32, 64)] == [
        0.7, 0.8, 0.8, 0.7, 0.7, 0.8]
    assert tree_correction((8 << 20) - 1) == 0.7
    assert tree_correction(1 << 30) == 1.0  # none from 512 MiB up
    sizes = np.array([4 << 20, 8 << 20, 1 << 30], dtype=float)
    assert tree_correction(sizes).tolist() == [0.7, 0.8, 1.0]


def test_tree_sends_half_a_rings_bytes_across_two_nodes():
    from crossflow.system.collectives import Tree, tree_all_reduce

    node_Bps, size = 10e9, 1 << 30
    ring = Group(16, node_Bps)  # a ring over 2 nodes of 8: its node-crossing edges set the pace
    tree = Tree(2, 8, node_Bps)
    assert tree_all_reduce(size, tree) == pytest.approx(all_reduce(size, ring) * 16 / 30)
    # more nodes: each node sends the buffer twice (interior in one tree, leaf in the other)
    assert tree_all_reduce(size, Tree(4, 8, node_Bps)) == pytest.approx(2 * size / node_Bps)
    # latency: the chain in each node and log2(nodes) tree hops, up and down
    t = Tree(8, 4, node_Bps, chain_latency_s=1e-6, step_latency_s=10e-6, launch_s=5e-6)
    assert tree_all_reduce(1, t) == pytest.approx(5e-6 + 2 * (3e-6 + 3 * 10e-6), rel=1e-4)


def test_nccl_ring_pays_the_network_latency_only_at_node_boundaries():
    from crossflow.system.collectives import nccl_ring

    ring = Group(16, 1e12, step_latency_s=20e-6, ll_step_latency_s=4e-6, ll_fraction=0.5)
    intra = Group(8, 1e12, step_latency_s=2e-6, ll_step_latency_s=0.5e-6, ll_fraction=0.5)
    g = nccl_ring(ring, intra, nodes=2)
    # 30 steps: 4 cross the 2 node boundaries (two passes), 26 stay on NVLink
    assert 30 * g.step_latency_s == pytest.approx(4 * 20e-6 + 26 * 2e-6)
    assert 30 * g.ll_step_latency_s == pytest.approx(4 * 4e-6 + 26 * 0.5e-6)
    assert all_reduce(8, g) < all_reduce(8, ring)


def _vidur_tree(ranks: int, per_node: int):
    from crossflow.system.system import _tree
    from crossflow.validation.collectives import _placed

    system = _placed(load_spec("vidur-a100-dgx", "systems"), ranks, per_node)
    return system, _tree(system, *system.map((ranks, 1, 1, 1)).hierarchy("kp1"))


def test_nccl_tuner_flips_between_ring_and_tree_at_powers_of_two():
    """Vidur's 4 ranks on 2 nodes run the tree from 8 to 16 MiB and at 64 MiB, the ring
    between (measured busbw ~10.5 GB/s against ~5.9): where NCCL's tree correction is 0.8,
    not 0.7.  The shipped tuner constants reproduce those windows."""
    from crossflow.system.collectives import tuner_picks_tree

    _, tree = _vidur_tree(4, 2)
    picks = {m: bool(tuner_picks_tree(m << 20, tree)) for m in (2, 6, 9, 12, 15, 17, 24, 48, 64)}
    assert picks == {2: False, 6: False, 9: True, 12: True, 15: True, 17: False, 24: False,
                     48: False, 64: True}
    # 16 ranks (8 per node): the ring below ~12 MiB, the tree from there to 16 MiB
    _, tree16 = _vidur_tree(16, 8)
    assert not tuner_picks_tree(8 << 20, tree16) and tuner_picks_tree(15 << 20, tree16)
    assert tuner_picks_tree(48 << 20, tree16)


@pytest.mark.parametrize("nodes", [2, 4])
def test_tree_gets_the_nodes_network_bandwidth_at_its_own_efficiency(nodes):
    from crossflow.system.system import _tree

    spec = load_spec("vidur-a100-dgx", "systems")
    system = build_system(spec, num_nodes=nodes)
    mapping = system.map((8 * nodes, 1, 1, 1))
    tree = _tree(system, *mapping.hierarchy("kp1"))
    level = system.inter  # endpoints are nodes: bandwidth per node, after the NIC limit
    assert (tree.nodes, tree.local) == (nodes, 8)
    assert tree.bandwidth_Bps == pytest.approx(
        level.bandwidth_Bps * level.efficiency * spec.inter.collective.tree.efficiency)


def test_mapping_all_reduce_takes_the_tuners_choice():
    from crossflow.system.collectives import nccl_ring, tree_all_reduce

    system, tree = _vidur_tree(4, 2)
    mapping = system.map((4, 1, 1, 1))
    intra, _ = mapping.hierarchy("kp1")
    ring = nccl_ring(mapping.group("kp1"), intra, 2)
    for mib, algorithm in ((12, "tree"), (24, "ring")):
        size = mib << 20
        expected = tree_all_reduce(size, tree) if algorithm == "tree" else all_reduce(size, ring)
        assert mapping.all_reduce("kp1", size) == pytest.approx(expected), mib
    assert tree_all_reduce(12 << 20, tree) < all_reduce(12 << 20, ring)


def test_levels_without_a_tree_keep_the_two_level_all_reduce():
    from crossflow.system.collectives import hierarchical_all_reduce

    system = build_system("dgx-a100", num_nodes=2)
    mapping = system.map((16, 1, 1, 1))
    size = 256 << 20
    flat = all_reduce(size, mapping.group("kp1"))
    two_level = hierarchical_all_reduce(size, *mapping.hierarchy("kp1"))
    assert mapping.all_reduce("kp1", size) == pytest.approx(min(flat, two_level))


def test_p2p_efficiency_sets_send_recv_bandwidth_only():
    base = load_spec("vidur-a100-dgx", "systems")
    data = base.model_dump()
    data["inter"]["collective"]["p2p_efficiency"] = None
    plain = build_system(type(base).model_validate(data), num_nodes=2)
    shipped = build_system(base, num_nodes=2)
    cross = (1, 1, 1, 16)  # 16 pipeline stages: stage 7 -> 8 crosses the nodes
    ratio = (base.inter.collective.p2p_efficiency / base.inter.collective.efficiency)
    assert shipped.map(cross).group("lp").send_bandwidth_Bps == pytest.approx(
        plain.map(cross).group("lp").send_bandwidth_Bps * ratio)
    assert shipped.map(cross).group("lp").bandwidth_Bps == pytest.approx(
        plain.map(cross).group("lp").bandwidth_Bps)
    # the all-reduce across nodes (ring and tree) does not depend on it
    ring16 = (16, 1, 1, 1)
    assert shipped.map(ring16).all_reduce("kp1", 12 << 20) == pytest.approx(
        plain.map(ring16).all_reduce("kp1", 12 << 20))
    assert shipped.map(ring16).all_reduce("kp1", 1 << 20) == pytest.approx(
        plain.map(ring16).all_reduce("kp1", 1 << 20))


def test_nics_reached_by_the_gpus_used_up_to_the_nodes_limit():
    from crossflow.validation.collectives import _placed

    spec = load_spec("vidur-a100-dgx", "systems")
    nics, limit = spec.inter.nics, spec.inter.nic_limit
    assert nics == 4 and 1 < limit < 2

    def node_Bps(ranks, per_node):
        level = _placed(spec, ranks, per_node).inter
        return level.bandwidth_Bps  # per node (its endpoints are nodes)

    one_nic = spec.inter.bandwidth_Bps * spec.devices_per_node / nics
    assert node_Bps(2, 1) == pytest.approx(one_nic)  # GPU 0: its pair's NIC
    assert node_Bps(4, 2) == pytest.approx(one_nic)  # GPUs 0-1 share it
    assert node_Bps(8, 4) == pytest.approx(limit * one_nic)  # 2 NICs, capped
    assert node_Bps(16, 8) == pytest.approx(limit * one_nic)
    # the whole node (the system as the preset builds it) is capped alike
    full = build_system(spec, num_nodes=2).inter.bandwidth_Bps
    assert full == pytest.approx(limit * one_nic)


@pytest.mark.parametrize(("path", "value", "key"), [
    ("inter.collective.tree.efficiency", 1.5, "inter.collective.tree.efficiency"),
    ("inter.nic_limit", 0, "inter.nic_limit"),
    ("intra.nics", 4, "intra.nics")])
def test_bad_nccl_constants_are_rejected_with_the_key_named(tmp_path, cli, path, value, key):
    import yaml

    from crossflow.config.loader import preset_dir

    data = yaml.safe_load((preset_dir("systems") / "vidur-a100-dgx.yaml").read_text())
    node = data
    *head, last = path.split(".")
    for part in head:
        node = node[part]
    node[last] = value
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    code, _, err = cli("check", bad)
    assert code == 2
    assert key in err and str(bad) in err


@cache
def _ops():
    from crossflow.validation.ops import ops_datasets

    return ops_datasets(stride=8)  # every 8th row (~260 per GPU); `validate ops`: all rows


@pytest.mark.parametrize("gpu", ["A100", "H100"])
def test_vidur_gemms_and_memory_bound_ops(gpu):
    gemms, memory = [ds for ds in _ops() if f"on {gpu}" in ds.name]
    assert len(gemms.rows) >= 4 * 260
    tokens = {int(r.label.split()[1][1:]) for r in gemms.rows}
    assert min(tokens) == 1 and max(tokens) == 4096
    assert gemms.mape <= 0.15 and gemms.spearman >= 0.95
    assert memory.mape <= 0.25


# --- no regression (issue #12): within 1 point of the MAPE before the layer ---------------------

BEFORE = {  # `crossflow validate all` on the commit before issue #12
    "gemm: A100 SXM4 80GB fp16 M-sweep (LLMCompass)": 0.022,
    "collectives: NCCL all-reduce, 8x A100 NVSwitch (vTrain)": 0.045,
    "training: Korthikanti et al. 2022 Table 4, one 22B block on 8x A100 (t8, b4)": 0.033,
    "training: Korthikanti et al. 2022 Table 5, full recompute": 0.043,
    "training: Korthikanti et al. 2022 Table 5, sequence parallel + selective recompute": 0.071,
    "training: Megatron-LM SC21 Table 2 (PTD rows), per-GPU TFLOP/s": 0.016,
    "training: Megatron-LM SC21 Table 1, per-GPU TFLOP/s on DGX A100": 0.040,
}


def test_no_regression_on_the_earlier_data_sets():
    from crossflow.validation.collectives import nccl_all_reduce
    from crossflow.validation.gemm import a100_msweep
    from crossflow.validation.training import training_datasets

    sets = {ds.name: ds for ds in [a100_msweep(), nccl_all_reduce(), *training_datasets()]}
    for name, before in BEFORE.items():
        assert sets[name].mape <= before + 0.01, (name, sets[name].mape)


def test_cuda_graphs_profile_removes_most_of_the_host_cost():
    """The same small model: eager Megatron-DeepSpeed is host-bound; replayed from CUDA
    graphs it comes back to within 15 % of the device-only prediction (the optimizer tail
    stays eager)."""
    device_only, eager, graphs = (_time(s, {**GPT_SMALL, "global_batch_size": 16})
                                  for s in ("dgx-a100", "dgx-a100-megatron-deepspeed",
                                            "dgx-a100-cuda-graphs"))
    assert eager > 2.5 * device_only
    assert device_only <= graphs <= 1.15 * device_only


def test_shipped_vidur_h100_network_constants_match_a_fresh_fit():
    """The preset holds what `python -m crossflow.validation.collectives vidur h100` prints."""
    from crossflow.validation.collectives import _get, fit_vidur_collectives

    shipped = load_spec("vidur-h100-dgx", "systems").model_dump()
    for path, value in fit_vidur_collectives("h100").items():
        if path.endswith("_s"):
            assert _get(shipped, path) == pytest.approx(value, abs=0.05e-6), path
        else:
            assert _get(shipped, path) == pytest.approx(value, abs=0.002), path


def test_validate_summary_cli_lists_the_new_data_sets(cli):
    code, out, _ = cli("validate", "collectives", "--summary")
    assert code == 0
    lines = out.strip().splitlines()
    assert sum("(Vidur)" in line for line in lines) == 5
    assert all(line.endswith("PASS") for line in lines[:-1])


def test_shipped_megatron_deepspeed_host_constants_are_the_fits_optimum():
    """No single host constant moved by ±15 % makes the fitted (2-GPU) rows fit better: the
    preset holds what `python -m crossflow.validation.vtrain` converged to."""
    import numpy as np

    from crossflow.validation.vtrain import HOST_PARAMS, predict_rows, vtrain_rows

    rows = [r for r in vtrain_rows() if r["num_gpus"] == "2"][::2]
    base = load_spec("dgx-a100-megatron-deepspeed", "systems")

    def loss(**update) -> float:
        system = base.model_copy(update={"software": base.software.model_copy(update=update)})
        return float(np.mean([abs(np.log(r.predicted / r.measured))
                              for r in predict_rows(system, rows)]))

    shipped = loss()
    for name in HOST_PARAMS:
        for factor in (0.85, 1.15):
            assert loss(**{name: getattr(base.software, name) * factor}) >= shipped - 0.002
