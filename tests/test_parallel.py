"""Strategies (names, parsing), the parallelism file, the §5.1 super-graph, per-device
sharding and the enumeration of valid strategies."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossflow.config import load_spec
from crossflow.errors import ConfigError
from crossflow.parallel import GRAMMAR, Strategy
from crossflow.parallel.enumerate import check_strategy, enumerate_strategies
from crossflow.parallel.supergraph import assign_stages, local_graph, shard_node, supergraph
from crossflow.workloads import compute_graph, feedforward_graph, hardware_flops

TINY = {"kind": "transformer", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
        "seq_length": 32, "vocab_size": 100, "global_batch_size": 8, "micro_batch_size": 1}


def _w(data):
    return load_spec(data, "workloads")


# --- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "canonical", "grid"), [
    ("RC-4-2-d3-p2", "RC-4-2-d3-p2", (4, 2, 3, 2)),
    ("CR-8-d4-p1", "CR-8-d4-p1", (8, 1, 4, 1)),
    ("P2-D3-RC-4-2", "RC-4-2-d3-p2", (4, 2, 3, 2)),  # the paper's Fig. 5 order
    ("RC-K4-K2", "RC-4-2-d1-p1", (4, 2, 1, 1)),  # Fig. 5 caption
    ("t8-d24-p8", "t8-d24-p8", (8, 1, 24, 8)),
    ("p8-t8-d24-v3-sp", "t8-d24-p8-v3-sp", (8, 1, 24, 8)),
    ("d16", "RC-1-1-d16-p1", (1, 1, 16, 1)),
])
def test_parse_and_print(text, canonical, grid):
    s = Strategy.parse(text)
    assert str(s) == canonical and s.grid == grid
    assert s.devices == grid[0] * grid[1] * grid[2] * grid[3]
    assert Strategy.parse(canonical) == s


@pytest.mark.parametrize("text", [
    "", "RC-4", "RC-4-x-d3", "CR-4-2", "RC-4-2-d3-d2", "XY-4", "RC-4-2-t8", "t8-CR-2",
    "RC-0-2", "d-3", "RC-4-2-d3-p2-q1", "CR-8-sp", "t2-v2", "RC-2-2-d1.5",
])
def test_bad_names_say_the_grammar(text):
    with pytest.raises(ConfigError) as info:
        Strategy.parse(text)
    assert info.value.key == "strategy" and GRAMMAR in str(info.value)


def test_megatron_names():
    s = Strategy.megatron(tp=8, pp=8, dp=24)
    assert (s.tp, s.pp, s.dp, s.devices, str(s)) == (8, 8, 24, 1536, "t8-d24-p8")
    assert Strategy.parse("RC-4-2").tp == 1


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"kp1": 0}, "kp1"), ({"dp": True}, "dp"), ({"kp_type": "CR", "kp2": 2}, "kp2"),
    ({"kp_type": "XX"}, "kp_type"), ({"vp": 2}, "vp"), ({"sp": True}, "sp"),
    ({"kp_type": "TP", "kp1": 1, "sp": True}, "sp"),
])
def test_bad_degrees_name_the_field(kwargs, key):
    with pytest.raises(ConfigError) as info:
        Strategy(**kwargs)
    assert info.value.key == key


@st.composite
def strategies(draw):
    kp_type = draw(st.sampled_from(["RC", "CR", "TP"]))
    degree = st.integers(1, 512)
    kp1, dp, lp = draw(degree), draw(degree), draw(degree)
    kp2 = draw(degree) if kp_type == "RC" else 1
    vp = draw(st.integers(1, 8)) if lp > 1 else 1
    sp = draw(st.booleans()) if kp_type == "TP" and kp1 > 1 else False
    return Strategy(kp_type, kp1, kp2, dp, lp, vp, sp)


@given(strategies())
def test_print_then_parse_is_identity(s):
    text = str(s)
    assert Strategy.parse(text) == s
    assert str(Strategy.parse(text)) == text
    # any order of the parts is the same strategy (Fig. 5 writes P2-D3-RC-4-2)
    parts = text.split("-")
    head = 3 if s.kp_type == "RC" else 2 if s.kp_type == "CR" else 1
    reordered = "-".join(parts[head:] + parts[:head])
    assert Strategy.parse(reordered.upper() if s.kp_type != "TP" else reordered) == s


# --- the parallelism file --------------------------------------------------------------------


def test_parallelism_spec_forms():
    spec = load_spec({"strategy": "P2-D3-RC-4-2"}, "parallelism")
    assert str(spec.to_strategy()) == "RC-4-2-d3-p2"
    spec = load_spec({"tensor_parallel": 8, "pipeline_parallel": 8, "data_parallel": 3,
                      "virtual_pipeline_stages": 3, "sequence_parallel": True,
                      "zero1": True, "micro_batch_size": 2}, "parallelism")
    assert str(spec.to_strategy()) == "t8-d3-p8-v3-sp"
    assert spec.schedule == "1f1b" and spec.zero1 and spec.micro_batch_size == 2


@pytest.mark.parametrize(("data", "key"), [
    ({"strategy": "RC-4"}, "strategy"),
    ({"strategy": "RC-4-2", "tensor_parallel": 2}, "strategy"),
    ({"sequence_parallel": True}, "sequence_parallel"),
    ({"pipeline_parallel": 2, "virtual_pipeline_stages": 2, "schedule": "gpipe"},
     "virtual_pipeline_stages"),
    ({"virtual_pipeline_stages": 2}, "virtual_pipeline_stages"),
    ({"data_parallel": 0}, "data_parallel"),
    ({"schedule": "zb"}, "schedule"),
    ({"tensor_paralel": 2}, "tensor_paralel"),
])
def test_bad_parallelism_files_name_the_key(data, key):
    with pytest.raises(ConfigError) as info:
        load_spec(data, "parallelism")
    assert f"key '{key}'" in str(info.value)


# --- the super-graph (paper §5.1, Fig. 5) ----------------------------------------------------


def test_fig5_supergraph_counts():
    # G0: 3 fully connected layers L0 -> L1 -> L2 (3 nodes, 2 edges).
    # G1, P2: stages {L0, L1} | {L2}; the edge L1 -> L2 is a cross-edge (1).
    # G2, D3: 3 × 3 = 9 nodes; the 2 edges become 2 × 3 = 6 (3 of them cross stages);
    #   each node becomes a ring of 3: 3 ring edges × 3 nodes = 9 cross-edges.
    # G4, RC-4-2: each of the 9 nodes becomes a 4 × 2 torus: 72 nodes.  Torus edges per
    #   node: 2 rings of 4 along kp1 (8) + 4 rings of 2 along kp2 (8, both directions) = 16,
    #   × 9 = 144.  Every G2 edge is copied shard to shard (× 8): 6 × 8 = 48 data edges of
    #   which 3 × 8 = 24 cross stages, and 9 × 8 = 72 dp ring edges.
    #   Edges 48 + 72 + 144 = 264; cross-edges 24 + 72 + 144 = 240.
    g4 = supergraph(feedforward_graph(3), Strategy.parse("P2-D3-RC-4-2"))
    assert g4.number_of_nodes() == 72
    assert g4.number_of_edges() == 264
    cross = Counter(e["dim"] for _, _, e in g4.edges(data=True) if e["cross"])
    assert sum(cross.values()) == 240
    assert cross == {"lp": 24, "dp": 72, "kp1": 72, "kp2": 72}
    assert {a["device"] for _, a in g4.nodes(data=True)} == {
        (i, j, d, p) for i in range(4) for j in range(2) for d in range(3) for p in range(2)}
    assert g4.nodes["L2.fc", 0, 0, 0]["device"][3] == 1


@pytest.mark.parametrize("name", ["CR-4-d2-p3", "RC-1-3-d1-p1", "RC-2-2-d2-p1", "d2-p2"])
def test_supergraph_counts_follow_the_ring_rule(name):
    s = Strategy.parse(name)
    g0 = feedforward_graph(3)
    g = supergraph(g0, s)

    def ring(n):
        return n if n >= 2 else 0

    per_node_kernel = s.kp2 * ring(s.kp1) + s.kp1 * ring(s.kp2)
    assert g.number_of_nodes() == 3 * s.devices // s.lp
    cross = Counter(e["dim"] for _, _, e in g.edges(data=True) if e["cross"])
    assert cross["dp"] == 3 * ring(s.dp) * s.kernel_degree
    assert cross["kp1"] + cross["kp2"] == 3 * s.dp * per_node_kernel


def test_a_huge_supergraph_is_refused():
    g = compute_graph(load_spec("gpt3-175b", "workloads"))
    with pytest.raises(ValueError, match="local_graph"):
        supergraph(g, Strategy.megatron(8, 8, 24))


# --- stages and shards -----------------------------------------------------------------------


def test_interleaved_stage_assignment():
    g = compute_graph(_w({**TINY, "num_layers": 8}))
    stages = assign_stages(g, 2, 2)  # chunks of 2 layers, round robin over 2 stages
    assert [stages[u] for u in range(10)] == [
        (0, 0), (0, 0), (0, 0), (1, 0), (1, 0), (0, 1), (0, 1), (1, 1), (1, 1), (1, 1)]
    with pytest.raises(ConfigError, match="virtual_pipeline_stages"):
        assign_stages(g, 2, 3)
    with pytest.raises(ConfigError, match="pipeline_parallel"):
        assign_stages(g, 3)


def test_lstm_stages_are_balanced_over_embedding_layers_and_softmax():
    g = compute_graph(load_spec("lstm-paper-case-study", "workloads"))
    assert [assign_stages(g, 4)[u][0] for u in range(4)] == [0, 1, 2, 3]
    assert [assign_stages(g, 2)[u][0] for u in range(4)] == [0, 0, 1, 1]
    with pytest.raises(ConfigError):
        assign_stages(g, 5)


def test_megatron_sharding_of_a_block():
    g = compute_graph(_w(TINY))
    t8 = Strategy.megatron(tp=4)
    qkv = shard_node(g.nodes["L0.qkv"], t8, "microbatches")
    assert (qkv["m"], qkv["k"], qkv["n"]) == (32, 64, 48)  # column parallel
    proj = shard_node(g.nodes["L0.proj"], t8, "microbatches")
    assert (proj["k"], proj["params"]) == (16, (64 * 64 + 64) // 4)  # row parallel
    assert shard_node(g.nodes["L0.qk"], t8, "microbatches")["count"] == 1  # 4 heads / 4
    ln = g.nodes["L0.ln1"]
    assert shard_node(ln, t8, "microbatches")["rows"] == 32  # replicated
    assert shard_node(ln, Strategy.megatron(tp=4, sp=True), "microbatches")["rows"] == 8


def test_paper_sharding_of_a_gemm():
    a = compute_graph(_w({"kind": "gemm", "m": 64, "k": 32, "n": 16})).nodes["gemm"]
    rc = shard_node(a, Strategy.parse("RC-4-2"))
    assert (rc["m"], rc["k"], rc["n"], rc["flops"]) == (16, 32, 8, 2 * 16 * 32 * 8)
    cr = shard_node(a, Strategy.parse("CR-8"))
    assert (cr["m"], cr["k"], cr["n"]) == (64, 4, 16)
    dp = shard_node(a, Strategy.parse("d4"))
    assert dp["m"] == 16


def test_gpt3_local_graph_flops_and_pipeline_edges():
    spec = load_spec("gpt3-175b", "workloads")
    s = Strategy.megatron(tp=8, pp=8, dp=24)
    local = local_graph(compute_graph(spec), s)
    assert local.graph["microbatches"] == 1536 // 24
    gemm = sum(a["flops"] for _, a in local.nodes(data=True) if a["op"] == "gemm")
    # one tensor-parallel shard of one replica, all stages: × tp × dp = the iteration
    assert gemm * local.graph["microbatches"] * 8 * 24 == pytest.approx(hardware_flops(spec))
    cross = Counter(e["kind"] for _, _, e in local.edges(data=True)
                    if e["cross"] and e["kind"] in ("act", "grad", "wgrad"))
    # per stage boundary: the block output and its residual copy forward, the gradient and
    # its residual copy backward; plus the tied embedding's gradient (last -> first stage)
    assert cross == {"act": 2 * 7, "grad": 2 * 7, "wgrad": 1}
    assert {a["stage"] for _, a in local.nodes(data=True)} == set(range(8))
    assert local_graph(compute_graph(spec), s) is local  # cached


# --- checks and enumeration ------------------------------------------------------------------


GEMM64 = {"kind": "gemm", "m": 64, "k": 64, "n": 64}


@pytest.mark.parametrize(("workload", "devices", "expected"), [
    # RC: ordered (kp1, kp2) with kp1·kp2 = 8: (1,8) (2,4) (4,2) (8,1); CR: kp1 = 8.
    (GEMM64, 8, ["RC-1-8-d1-p1", "RC-2-4-d1-p1", "RC-4-2-d1-p1", "RC-8-1-d1-p1",
                 "CR-8-d1-p1"]),
    # m = 2 allows kp1 ∈ {1, 2}; k = 4 rules CR-8 out.
    ({"kind": "gemm", "m": 2, "k": 4, "n": 64}, 8, ["RC-1-8-d1-p1", "RC-2-4-d1-p1"]),
    ({"kind": "gemm", "m": 7, "k": 7, "n": 7}, 1, ["RC-1-1-d1-p1", "CR-1-d1-p1"]),
    ({"kind": "gemm", "m": 7, "k": 7, "n": 7}, 2, []),
])
def test_gemm_enumeration_by_hand(workload, devices, expected):
    assert [str(s) for s in enumerate_strategies(_w(workload), devices)] == expected


def test_lstm_enumeration_by_hand():
    # batch 8, hidden 2, 1 layer (3 pipeline units), 4 devices.  RC: ordered (kp1, kp2, dp,
    # lp) with product 4 are C(5, 3) = 10; kp2 | 2 drops kp2 = 4 and lp ≤ 3 drops lp = 4:
    # 8 (dp | 8 and kp1 | 8/dp always hold).  CR: (kp1, dp, lp) are C(4, 2) = 6; kp1 | 2
    # drops kp1 = 4, lp ≤ 3 drops lp = 4: 4.  Total 12.
    w = _w({"kind": "lstm", "global_batch_size": 8, "hidden_size": 2, "vocab_size": 10,
            "num_layers": 1, "seq_length": 2})
    found = enumerate_strategies(w, 4)
    assert len(found) == 12
    assert Counter(s.kp_type for s in found) == {"RC": 8, "CR": 4}


def test_transformer_enumeration_by_hand():
    # 4 layers, 4 heads, batch 8 (micro 1), 8 devices, (t, pp, dp) with t | 4, pp | 4:
    # t=1: pp 1, 2, 4 (dp 8, 4, 2); t=2: pp 1, 2, 4; t=4: pp 1, 2 (pp 4 leaves dp 1/2) -> 8.
    w = _w(TINY)
    assert len(enumerate_strategies(w, 8)) == 8
    assert len(enumerate_strategies(w, 8, max_tp=2)) == 6
    # vp = 2 needs pp > 1 and 2 | layers per stage (pp = 2 only) and pp | micro-batches
    # per replica: (t1, pp2, dp4) 2 ✓, (t2, pp2, dp2) 4 ✓, (t4, pp2, dp1) 8 ✓ -> 3 more.
    assert len(enumerate_strategies(w, 8, virtual_stages=(1, 2))) == 11
    # sequence parallelism doubles the t > 1 ones: 5 with vp 1 and 2 with vp 2 -> 18.
    both = enumerate_strategies(w, 8, virtual_stages=(1, 2), sequence_parallel=(False, True))
    assert len(both) == 18
    assert str(both[0]) == "t1-d2-p4"  # kp1, then dp ascending


def test_enumeration_is_valid_deterministic_and_unique():
    for name, devices in (("lstm-paper-case-study", 512), ("gpt3-175b", 1536)):
        w = load_spec(name, "workloads")
        found = enumerate_strategies(w, devices, max_tp=8)
        assert found and len(set(found)) == len(found)
        assert found == enumerate_strategies(w, devices, max_tp=8)
        for s in found:
            check_strategy(w, s, devices=devices)
            assert s.kernel_degree <= 8
    assert Strategy.megatron(8, 8, 24) in enumerate_strategies(
        load_spec("gpt3-175b", "workloads"), 1536, max_tp=8)


@pytest.mark.parametrize(("workload", "strategy", "key", "text"), [
    (TINY, Strategy.megatron(tp=3), "tensor_parallel", "num_attention_heads"),
    (TINY, Strategy.megatron(pp=3), "pipeline_parallel", "num_layers"),
    (TINY, Strategy.megatron(dp=3), "data_parallel", "global_batch_size"),
    (TINY, Strategy.megatron(pp=4, vp=2), "virtual_pipeline_stages", "layers per"),
    (TINY, Strategy.parse("RC-2-2"), "strategy", "Megatron"),
    (GEMM64, Strategy.parse("RC-3-1"), "strategy", "kp1 = 3 must divide m (64)"),
    (GEMM64, Strategy.parse("CR-3"), "strategy", "must divide k"),
    (GEMM64, Strategy.parse("RC-2-2-d2"), "strategy", "d1-p1"),
    (GEMM64, Strategy.megatron(tp=2), "strategy", "RC or CR"),
])
def test_strategies_that_do_not_fit_name_the_key(workload, strategy, key, text):
    with pytest.raises(ConfigError) as info:
        check_strategy(_w(workload), strategy)
    assert info.value.key == key and text in str(info.value)


def test_device_count_mismatch():
    with pytest.raises(ConfigError, match="128"):
        check_strategy(_w(TINY), Strategy.megatron(2, 2, 2), devices=128)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2, 4, 6, 8, 12, 16]))
def test_every_enumerated_gemm_strategy_divides_the_shape(devices):
    w = _w({"kind": "gemm", "m": 48, "k": 32, "n": 24})
    for s in enumerate_strategies(w, devices):
        assert s.devices == devices
        if s.kp_type == "RC":
            assert 48 % s.kp1 == 0 and 24 % s.kp2 == 0
        else:
            assert 32 % s.kp1 == 0
