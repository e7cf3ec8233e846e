"""The system layer: presets, greedy mapping, XY routing, link sharing, collectives, NCCL fit."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import assert_numbers_have_sources
from hypothesis import given, settings
from hypothesis import strategies as st

import crossflow
from crossflow.config import load_spec, preset_names
from crossflow.config.loader import preset_dir
from crossflow.errors import ConfigError
from crossflow.system import (
    DIMS,
    ORDERS,
    Group,
    all_gather,
    all_reduce,
    build_system,
    bus_bandwidth,
    hierarchical_all_reduce,
    parse_order,
    reduce_scatter,
    send_recv,
    switch_group,
)
from crossflow.validation import SUITES
from crossflow.validation.collectives import collective_datasets, fit_nccl_all_reduce

SYSTEMS = preset_names("systems")
GB = 1e9


def torus16(**intra) -> dict:
    """16 devices on a 4 x 4 torus, 400 GB/s per device = 100 GB/s per port and direction."""
    level = {"topology": "torus", "dims": [4, 4], "bandwidth_GBps": 400, "latency_us": 1.0,
             "efficiency": 1.0, **intra}
    return {"kind": "system", "name": "torus16", "device": "a100-sxm4-80gb",
            "devices_per_node": 16, "num_nodes": 1, "intra": level}


def loads_by_pair(mapping, dims) -> dict[tuple[int, int], int]:
    """link_loads keyed by (device, device) for an intra-node grid level."""
    return {(u[1], v[1]): n for (u, v, _), n in mapping.link_loads(dims).items()}


def dev(x: int, y: int) -> int:
    return x + 4 * y


# --- presets ------------------------------------------------------------------------------------


def test_the_expected_system_presets_ship():
    assert {"dgx-a100", "dgx-h100", "dgx1-v100", "deepflow-case-study-512"} <= set(SYSTEMS)


@pytest.mark.parametrize("name", SYSTEMS)
def test_every_system_preset_loads_and_builds(name):
    spec = load_spec(name, "systems")
    assert spec.name == name and spec.kind == "system"
    system = build_system(spec)
    assert system.num_devices == spec.devices_per_node * spec.num_nodes
    assert system.arch.links  # the device's own links fill the defaults
    for level in (system.intra, system.inter):
        if level is not None:
            assert level.bandwidth_Bps > 0 and 0 < level.capacity_factor <= 1
    m = system.map((system.devices_per_node, 1, system.num_nodes, 1))
    for dim, size in (("kp1", system.devices_per_node), ("dp", system.num_nodes)):
        assert 0 < m.group_bandwidth(dim) < math.inf or size == 1


@pytest.mark.parametrize("name", SYSTEMS)
def test_every_system_number_has_a_source_comment(name):
    assert_numbers_have_sources(
        Path(crossflow.__file__).parent / "presets" / "systems" / f"{name}.yaml")


def test_dgx_a100_numbers():
    s = build_system("dgx-a100")
    assert (s.devices_per_node, s.num_nodes, s.num_devices) == (8, 384, 3072)  # Megatron's 3072
    assert s.intra.topology == "switch" and s.intra.bandwidth_Bps == pytest.approx(300 * GB)
    # 8 x 200 Gb/s HDR per node, pooled at the node
    assert s.inter.topology == "fat_tree" and s.inter.bandwidth_Bps == pytest.approx(8 * 25 * GB)
    assert build_system("dgx-a100", num_nodes=2).num_devices == 16


def test_dgx1_hybrid_cube_mesh_gives_every_gpu_six_nvlinks():
    s = build_system("dgx1-v100")
    assert s.intra.topology == "graph"
    assert (s.intra.links.sum(1) == 6).all()
    assert s.intra.links[0, 5] == 0 and s.intra.links[0, 3] == 2  # SYS and NV2 in nvidia-smi


def test_dgx1_full_node_all_reduce_matches_the_measured_busbw():
    """hardware.csv: 8x V100 nccl-tests busbw 134.5 GB/s at 1 GiB (S10); NCCL's rings use all
    six NVLinks of every GPU, which the graph level's multi-ring spreading reproduces."""
    s = build_system("dgx1-v100")
    t = all_reduce(2**30, s.map((8, 1, 1, 1)).group("kp1"))
    assert bus_bandwidth(2**30, t, 8) == pytest.approx(134.5 * GB, rel=0.03)
    # A fully linked quad uses its members' 4 links, a pair its direct link (NV1 = 25 GB/s).
    assert s.map((4, 1, 2, 1)).group_bandwidth("kp1") == pytest.approx(4 * 25 * GB * 0.9)
    assert s.map((2, 1, 4, 1)).group_bandwidth("kp1") == pytest.approx(25 * GB * 0.9)


def test_case_study_system_is_512_nodes_on_a_2d_torus():
    s = build_system("deepflow-case-study-512")
    assert s.num_devices == 512 and s.intra is None
    assert s.inter.topology == "torus" and s.inter.dims == (16, 32)
    assert s.inter.bandwidth_Bps == pytest.approx(s.arch.links["inter"].bandwidth_Bps)


def test_num_nodes_override_on_a_torus_must_fit_its_dims():
    with pytest.raises(ConfigError, match=r"deepflow-case-study-512.yaml: key 'inter.dims'"):
        build_system("deepflow-case-study-512", num_nodes=64)


# --- mapping ------------------------------------------------------------------------------------


def test_grid_4_2_1_2_on_a_4x4_torus_by_hand(a100):
    """Order kp1, kp2, dp, lp: kp1 along x, kp2 the next row, lp two rows further (wrapping on
    to y as x runs out: paper §5.2).  Checked link by link."""
    m = build_system(torus16(), a100).map((4, 2, 1, 2), ("kp1", "kp2", "dp", "lp"))
    expected = np.array([[[[dev(x, y + 2 * p) for p in range(2)]] for y in range(2)]
                         for x in range(4)])
    assert (m.devices == expected).all()

    # kp1: a bidirectional ring along every row -> each x link once in each direction.
    kp1 = loads_by_pair(m, ["kp1"])
    x_links = {(dev(x, y), dev((x + s) % 4, y)) for x in range(4) for y in range(4)
               for s in (1, -1)}
    assert kp1 == dict.fromkeys(x_links, 1)
    # kp2: pairs (y0, y1) and (y2, y3); the way back is one hop -y.
    kp2 = loads_by_pair(m, ["kp2"])
    assert kp2 == {pair: 1 for x in range(4) for pair in (
        (dev(x, 0), dev(x, 1)), (dev(x, 1), dev(x, 0)),
        (dev(x, 2), dev(x, 3)), (dev(x, 3), dev(x, 2)))}
    # lp: y -> y+2 is two hops either way round; the tie goes +y, so row 1 -> 2 carries both.
    lp = loads_by_pair(m, ["lp"])
    assert lp == {pair: n for x in range(4) for pair, n in (
        ((dev(x, 0), dev(x, 1)), 1), ((dev(x, 1), dev(x, 2)), 2), ((dev(x, 2), dev(x, 3)), 1))}
    # Everything at once (the paper's §6.4 count).
    together = loads_by_pair(m, DIMS)
    assert together[(dev(2, 0), dev(2, 1))] == 2 and together[(dev(2, 1), dev(2, 2))] == 2
    assert together[(dev(2, 1), dev(2, 0))] == 1 and together[(dev(2, 0), dev(3, 0))] == 1

    port = 100 * GB
    assert m.group_bandwidth("kp1") == pytest.approx(2 * port)  # both ring directions
    assert m.group_bandwidth("kp2") == pytest.approx(port)  # a pair: one link each way
    assert m.group("lp").send_bandwidth_Bps == pytest.approx(port / 2)  # row 1 -> 2 shared
    assert m.group_bandwidth("kp2", concurrent=["lp"]) == pytest.approx(port / 2)
    assert m.group_bandwidth("kp1", concurrent=DIMS) == pytest.approx(2 * port)
    assert m.group_bandwidth("dp") == math.inf and all_reduce(1e9, m.group("dp")) == 0.0
    assert (m.group_latency("kp1"), m.group_latency("lp")) == pytest.approx((1e-6, 2e-6))


def test_a_dimension_wraps_on_to_the_next_physical_dimension(a100):
    """kp1 of 8 on a 4 x 4 torus takes rows 0 and 1; the ring's two wrap edges (3 -> 4 and
    7 -> 0) each cross one x link and one y link: two hops."""
    m = build_system(torus16(), a100).map((8, 1, 1, 2), ("kp1", "kp2", "dp", "lp"))
    assert m.devices[:, 0, 0, 0].tolist() == list(range(8))
    assert m.group_latency("kp1") == pytest.approx(2e-6)
    loads = loads_by_pair(m, ["kp1"])
    assert loads[(dev(3, 0), dev(0, 0))] == 1  # 3 -> 4 goes +x round the torus, then +y
    assert loads[(dev(0, 0), dev(0, 1))] == 1


def test_stride_two_ring_on_a_torus_by_hand(a100):
    """Order lp, kp1, …: kp1 shards sit 2 apart: 0, 2, 4, 6 = (0,0) (2,0) (0,1) (2,1).  The
    edge (2,0) -> (0,1) goes +x twice (tie) round the torus, then +y: 3 hops."""
    m = build_system(torus16(), a100).map((4, 2, 1, 2), ("lp", "kp1", "kp2", "dp"))
    assert m.devices[:, 0, 0, 0].tolist() == [0, 2, 4, 6]
    assert m.group_latency("kp1") == pytest.approx(3e-6)


@pytest.mark.parametrize("system, grid", [
    ("torus16", (4, 2, 1, 2)), ("torus16", (2, 2, 2, 2)), ("dgx-a100", (8, 2, 24, 8)),
    ("deepflow-case-study-512", (4, 2, 16, 4)), ("dgx1-v100", (2, 2, 2, 1)),
])
def test_all_24_orders_give_bijective_greedy_mappings(system, grid, a100):
    s = build_system(torus16(), a100) if system == "torus16" else build_system(system)
    n = math.prod(grid)
    for order in ORDERS:
        m = s.map(grid, order)
        assert m.devices.shape == grid
        assert np.array_equal(np.sort(m.devices.ravel()), np.arange(n))
        first = DIMS.index(order[0])
        steps = np.diff(m.devices, axis=first)
        assert steps.size == 0 or (steps == 1).all()  # the first dim on adjacent devices
        for d in DIMS:
            g = m.group(d)
            assert g.size == grid[DIMS.index(d)] and g.bandwidth_Bps > 0


def test_orders_that_only_move_size_one_dims_share_a_mapping(a100):
    s = build_system(torus16(), a100)
    assert s.map((4, 1, 4, 1), "kp1-kp2-dp-lp") is s.map((4, 1, 4, 1), "lp-kp1-dp-kp2")
    assert s.map((4, 1, 4, 1), "kp1-dp-kp2-lp") is not s.map((4, 1, 4, 1), "dp-kp1-kp2-lp")


def test_the_order_matters_on_a_torus():
    s = build_system("deepflow-case-study-512")
    bws = {order: s.map((4, 2, 16, 4), order).group_bandwidth("dp") for order in ORDERS}
    assert max(bws.values()) > 2 * min(bws.values())


def test_routes_follow_the_networkx_graph(a100):
    """Every routed path is a walk in System.graph from the source to the destination."""
    rng = np.random.default_rng(0)
    for s in (build_system(torus16(), a100), build_system("dgx-a100", num_nodes=3),
              build_system("dgx1-v100", num_nodes=2), build_system("deepflow-case-study-512")):
        g = s.graph
        src = rng.integers(0, s.num_devices, 60)
        dst = (src + rng.integers(1, s.num_devices, 60)) % s.num_devices
        edge, res = s.route(src, dst)
        dpn = s.devices_per_node
        for i in range(src.size):
            hops = [s.links[int(r)] for r in res[edge == i]]
            assert hops, (src[i], dst[i])
            cross = src[i] // dpn != dst[i] // dpn
            at = ("nic", src[i] // dpn) if cross else ("device", src[i])
            for u, v, key in hops:
                assert u == at and g.has_edge(u, v, key)
                at = v
            assert at == (("nic", dst[i] // dpn) if cross else ("device", dst[i]))


def test_graph_of_two_dgx_nodes():
    g = build_system("dgx-a100", num_nodes=2).graph
    kinds = sorted({n[0] for n in g.nodes})
    assert kinds == ["device", "fabric", "nic", "switch"]
    assert g.number_of_nodes() == 16 + 2 + 2 + 1
    assert g.number_of_edges() == 16 * 2 + 16 * 2 + 2 * 2  # NVSwitch ports, NIC attach, HCAs
    u, v, data = next((u, v, d) for u, v, d in g.edges(data=True) if d["level"] == "inter")
    assert data["bandwidth_Bps"] == pytest.approx(8 * 25 * GB * 0.96)


def test_parallel_dims_across_nodes_share_the_node_nics():
    s = build_system("dgx-a100", num_nodes=48)
    m = s.map((8, 1, 48, 1), "kp1-kp2-dp-lp")
    nic = 8 * 25 * GB * 0.96
    # 8 dp rings leave every node, two edges each per direction: 16 share the node's HCAs.
    assert m.group_bandwidth("dp") == pytest.approx(2 * nic / 16)
    assert m.spans_nodes("dp") and not m.spans_nodes("kp1")
    assert m.hierarchy("dp") is None  # one member per node: nothing to do inside a node
    assert m.group_bandwidth("kp1") == pytest.approx(300 * GB * 0.759)
    assert m.group_bandwidth("kp1") == pytest.approx(s.switch_group(8).bandwidth_Bps)
    assert m.group_latency("kp1") == pytest.approx(s.switch_group(8).step_latency_s)


def test_bad_orders_and_grids(a100):
    s = build_system(torus16(), a100)
    assert parse_order("dp, lp, kp1, kp2") == ("dp", "lp", "kp1", "kp2")
    with pytest.raises(ConfigError, match="key 'mapping_order'"):
        s.map((4, 2, 1, 2), ("kp1", "kp1", "dp", "lp"))
    with pytest.raises(ConfigError, match="needs 32 devices"):
        s.map((4, 2, 2, 2))
    with pytest.raises(ConfigError, match="four sizes"):
        s.map((4, 0, 1, 1))


# --- collectives --------------------------------------------------------------------------------


def test_ring_collectives_match_alpha_beta_by_hand():
    g = Group(size=8, bandwidth_Bps=100 * GB, step_latency_s=2e-6, launch_s=5e-6,
              p2p_bandwidth_Bps=40 * GB)
    s = 1e9
    assert all_reduce(s, g) == pytest.approx(5e-6 + 14 * 2e-6 + 14 / 8 * s / (100 * GB))
    assert reduce_scatter(s, g) == pytest.approx(5e-6 + 7 * 2e-6 + 7 / 8 * s / (100 * GB))
    assert all_gather(s, g) == pytest.approx(reduce_scatter(s, g))
    assert send_recv(s, g) == pytest.approx(5e-6 + 2e-6 + s / (40 * GB))
    one = Group(1, 1.0)
    assert all_reduce(s, one) == reduce_scatter(s, one) == send_recv(s, one) == 0.0


def test_busbw_is_algbw_times_2_n_minus_1_over_n():
    g = switch_group(8, 200 * GB)
    t = all_reduce(2**30, g)
    algbw = 2**30 / t
    assert bus_bandwidth(2**30, t, 8) == pytest.approx(algbw * 2 * 7 / 8)
    assert bus_bandwidth(2**30, t, 8) == pytest.approx(200 * GB)  # the ring's B, no latency
    assert bus_bandwidth(2**30, all_gather(2**30, g), 8, "all_gather") == pytest.approx(200 * GB)


def test_hierarchical_all_reduce_on_two_dgx_nodes():
    s = build_system("dgx-a100", num_nodes=2)
    m = s.map((1, 1, 16, 1), "dp-kp1-kp2-lp")
    intra, inter = m.hierarchy("dp")
    b_nvswitch, nic = 300 * GB * 0.759, 8 * 25 * GB * 0.96
    a_intra, a_inter, launch = (1.0 + 3.84) * 1e-6, (5.0 + 3.84) * 1e-6, 5e-6
    assert (intra.size, inter.size) == (8, 2)
    assert intra.bandwidth_Bps == pytest.approx(b_nvswitch)
    assert inter.bandwidth_Bps == pytest.approx(nic / 8)  # 8 concurrent 2-node rings share it
    assert (intra.step_latency_s, inter.step_latency_s) == pytest.approx((a_intra, a_inter))
    size = 2**30
    by_hand = (launch + 2 * (7 * a_intra + 7 / 8 * size / b_nvswitch)
               + 2 * a_inter + (size / 8) / (nic / 8))
    assert hierarchical_all_reduce(size, intra, inter) == pytest.approx(by_hand)
    # The flat 16-GPU ring crosses each node boundary twice: two edges per node's HCAs.
    flat = m.group("dp")
    assert flat.bandwidth_Bps == pytest.approx(nic)
    assert m.all_reduce("dp", size) == pytest.approx(min(all_reduce(size, flat), by_hand))


# --- NCCL calibration and validation -------------------------------------------------------------


def test_nccl_all_reduce_within_tolerance():
    ds = collective_datasets()[0]  # the others: tests/test_software_stack.py (Vidur)
    assert len(ds.rows) == 20
    assert ds.mape <= 0.15, ds.render()
    assert ds.spearman >= 0.9, ds.render()
    assert ds.passed and "collectives" in SUITES


def test_preset_holds_the_fitted_nccl_constants():
    fitted = fit_nccl_all_reduce()
    spec = load_spec("dgx-a100", "systems").intra.collective
    assert spec.efficiency == pytest.approx(fitted["efficiency"], abs=0.001)
    assert spec.step_latency_s == pytest.approx(fitted["step_latency_s"], abs=0.01e-6)


# --- properties -----------------------------------------------------------------------------------

TOPOLOGIES = [{"topology": "switch", "dims": []}, {"topology": "torus", "dims": [4, 4]},
              {"topology": "mesh", "dims": [2, 8]}, {"topology": "ring", "dims": []}]
GRIDS = [(4, 2, 1, 2), (2, 2, 2, 2), (16, 1, 1, 1), (1, 1, 8, 2), (2, 1, 4, 1)]


@settings(max_examples=60, deadline=None)
@given(topology=st.sampled_from(TOPOLOGIES), bw=st.floats(10, 1000), more=st.floats(1, 10),
       grid=st.sampled_from(GRIDS), order=st.sampled_from(ORDERS), dim=st.sampled_from(DIMS),
       nbytes=st.floats(1e3, 1e10))
def test_more_link_bandwidth_is_never_slower(a100, topology, bw, more, grid, order, dim, nbytes):
    def time(gbps: float) -> float:
        system = build_system(torus16(**topology, bandwidth_GBps=gbps), a100)
        return system.map(grid, order).all_reduce(dim, nbytes)

    assert time(bw * more) <= time(bw) * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 64), bw=st.floats(1e8, 1e12), alpha=st.floats(0, 1e-4),
       launch=st.floats(0, 1e-4), a=st.floats(0, 1e10), b=st.floats(0, 1e10))
def test_more_bytes_are_never_faster(size, bw, alpha, launch, a, b):
    small, big = sorted((a, b))
    g = Group(size, bw, alpha, launch)
    for op in (all_reduce, reduce_scatter, all_gather, send_recv):
        assert op(small, g) <= op(big, g)
    inter = Group(max(1, size // 2), bw / 3, 2 * alpha)
    assert hierarchical_all_reduce(small, g, inter) <= hierarchical_all_reduce(big, g, inter)


@settings(max_examples=40, deadline=None)
@given(grid=st.sampled_from([(8, 1, 2, 1), (2, 2, 4, 1), (1, 1, 16, 1), (4, 1, 2, 2)]),
       order=st.sampled_from(ORDERS), a=st.floats(1e3, 1e10), b=st.floats(1e3, 1e10))
def test_more_bytes_are_never_faster_on_a_mapped_two_node_system(grid, order, a, b):
    m = _TWO_DGX.map(grid, order)
    small, big = sorted((a, b))
    for d in DIMS:
        assert m.all_reduce(d, small) <= m.all_reduce(d, big)
        assert m.group_bandwidth(d, concurrent=DIMS) <= m.group_bandwidth(d)


_TWO_DGX = build_system("dgx-a100", num_nodes=2)


# --- bad system files -------------------------------------------------------------------------------

DGX = yaml.safe_load((preset_dir("systems") / "dgx-a100.yaml").read_text())


def _edit(**changes) -> dict:
    data = yaml.safe_load(yaml.safe_dump(DGX))
    for path, value in changes.items():
        node, *parts = path.split("__")
        target = data
        for p in [node, *parts][:-1]:
            target = target[p]
        last = [node, *parts][-1]
        if value is ...:
            del target[last]
        else:
            target[last] = value
    return data


BAD = [
    ("zero-devices", _edit(devices_per_node=0), "key 'devices_per_node' = 0"),
    ("unknown-topology", _edit(intra__topology="hypercube"), "key 'intra.topology' = 'hypercube'"),
    ("torus-dims-product", _edit(intra__topology="torus", intra__dims=[2, 2]),
     "key 'intra.dims' = [2, 2]: the torus sizes multiply to 4, but the level joins 8"),
    ("mesh-without-dims", _edit(intra__topology="mesh"), "key 'intra.dims'"),
    ("dims-on-a-switch", _edit(intra__dims=[8]), "key 'intra.dims' = [8]"),
    ("edges-on-a-switch", _edit(intra__edges=[[0, 1]]), "key 'intra.edges'"),
    ("graph-edge-out-of-range", _edit(intra__topology="graph", intra__edges=[[0, 1], [1, 9]]),
     "key 'intra.edges[1]' = [1, 9]: endpoint out of range"),
    ("graph-not-connected", _edit(intra__topology="graph", intra__edges=[[0, 1], [2, 3]]),
     "key 'intra.edges': the graph is not connected"),
    ("no-inter-level", _edit(inter=...), "key 'inter'"),
    ("negative-bandwidth", _edit(inter__bandwidth_Gbps=-200), "key 'inter.bandwidth_Gbps' = -200"),
    ("efficiency-over-one", _edit(intra__collective__efficiency=1.5),
     "key 'intra.collective.efficiency' = 1.5"),
    ("typo-in-key", _edit(intra__bandwith_GBps=300), "key 'intra.bandwith_GBps' = 300"),
    ("wrong-unit", _edit(intra__latency_GBps=1), "key 'intra.latency_GBps'"),
]


@pytest.mark.parametrize("data, message", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_system_files_name_the_key(data, message, tmp_path):
    with pytest.raises(ConfigError) as err:
        load_spec(data, "systems")
    assert message in str(err.value)
    path = tmp_path / "bad.yaml"  # from a file, the message also names the file
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=re.escape(f"{path}: {message.split(':')[0]}")):
        load_spec(str(path), "systems")


def test_unknown_device_names_the_key():
    with pytest.raises(ConfigError, match="key 'device' = 'a100-sxm9'"):
        build_system(_edit(device="a100-sxm9"))


def test_a_device_without_links_needs_their_bandwidth(a100):
    from dataclasses import replace

    bare = replace(a100, links={})
    with pytest.raises(ConfigError, match=r"key 'intra\.bandwidth_<"):
        build_system(_edit(intra__bandwidth_GBps=...), bare)


def test_route_caches_of_a_system_survive_the_topology_table_being_reset(monkeypatch):
    """Systems are keyed by a small id in the shared route cache; when the id table is
    reset, a new topology must never take the id of a system still in use (that system's
    rings would be looked up under the new one's routes: wrong times, or an IndexError)."""
    from crossflow.system import system as sysmod

    grid, orders = (8, 1, 2, 1), ORDERS[:6]
    expected = [build_system("dgx-a100", num_nodes=2).map(grid, o).all_reduce(d, 1e8)
                for o in orders for d in DIMS]
    monkeypatch.setattr(sysmod, "_MAX_TOPOLOGIES", 2)
    monkeypatch.setattr(sysmod, "_TOPOLOGIES", {})
    monkeypatch.setattr(sysmod, "_ROUTES", {})
    a = build_system("dgx-a100", num_nodes=2)  # built before the reset, asked after it
    for name in ("dgx-h100", "dgx1-v100"):  # the second resets the table, takes a new id
        other = build_system(name, num_nodes=2)
        for o in orders:
            for d in DIMS:
                other.map(grid, o).all_reduce(d, 1e8)
    assert [a.map(grid, o).all_reduce(d, 1e8) for o in orders for d in DIMS] == expected
