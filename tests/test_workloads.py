"""Workload specs, presets and compute graphs: shapes, node counts, FLOP and parameter counts
against Megatron's closed forms and the published Table 1 numbers."""

from __future__ import annotations

import csv
import textwrap
from collections import Counter

import networkx as nx
import pytest
import yaml

from crossflow.config import load_spec, preset_names
from crossflow.config.loader import preset_dir
from crossflow.errors import ConfigError
from crossflow.workloads import (
    compute_graph,
    graph_flops,
    hardware_flops,
    lstm_flops,
    lstm_graph,
    megatron_eq3_flops,
    model_flops,
    parameter_count,
    transformer_flops,
    transformer_graph,
)
from crossflow.workloads.graph import EDGE_KINDS, OPS, PHASES, SHAPE_KEYS
from crossflow.workloads.transformer import BLOCK_OPS

#: the published measurements, packaged under crossflow/presets/measurements/
MEASUREMENTS = preset_dir("measurements")

TINY = {  # a small transformer, quick to build
    "kind": "transformer", "num_layers": 3, "hidden_size": 64, "num_attention_heads": 4,
    "seq_length": 32, "vocab_size": 100, "global_batch_size": 8, "micro_batch_size": 2,
    "precision": "bf16",
}
SMALL_LSTM = {"kind": "lstm", "global_batch_size": 8, "hidden_size": 16, "vocab_size": 50,
              "num_layers": 2, "seq_length": 3}


def _tiny(**changes):
    return load_spec({**TINY, **changes}, "workloads")


def _rows(name):
    with open(MEASUREMENTS / name, encoding="utf-8") as fh:
        return list(csv.DictReader(ln for ln in fh if not ln.startswith("#")))


# --- specs and presets -----------------------------------------------------------------------


def test_the_design_example_loads_from_yaml(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(textwrap.dedent("""\
        kind: transformer
        num_layers: 96
        hidden_size: 12288
        num_attention_heads: 96
        seq_length: 2048
        vocab_size: 51200
        global_batch_size: 1536
        micro_batch_size: 1
        precision: fp16            # fp32 | tf32 | fp16 | bf16 | fp8
        activation_recompute: full # none | selective | full
    """))
    spec = load_spec(path, "workloads")
    assert spec.ffn == 4 * 12288 and spec.head_dim == 128
    preset = load_spec("gpt3-175b", "workloads")
    assert spec.model_dump(exclude={"name"}) == preset.model_dump(exclude={"name"})


@pytest.mark.parametrize(("change", "key"), [
    ({"num_attention_heads": 5}, "num_attention_heads"),
    ({"micro_batch_size": 3}, "micro_batch_size"),
    ({"activation_recompute": "some"}, "activation_recompute"),
    ({"hidden_size": 0}, "hidden_size"),
    ({"ffn_hidden_size": -1}, "ffn_hidden_size"),
    ({"num_heads": 4}, "num_heads"),
])
def test_bad_transformer_values_name_the_key(change, key):
    with pytest.raises(ConfigError) as info:
        _tiny(**change)
    assert f"key '{key}'" in str(info.value)


def test_expected_presets_ship():
    names = set(preset_names("workloads"))
    assert {"gpt3-175b", "lstm-paper-case-study", "korthikanti-22b", "korthikanti-175b",
            "korthikanti-530b", "korthikanti-1t", "megatron-sc21-1t",
            "megatron-sc21-145.6b"} <= names
    assert sum(n.startswith("megatron-sc21-") for n in names) == 10


def test_megatron_presets_match_table1():
    for row in _rows("megatron_sc21_table1.csv"):
        label = "1t" if row["params_billion"] == "1008.0" else row["params_billion"] + "b"
        spec = load_spec(f"megatron-sc21-{label}", "workloads")
        assert (spec.num_attention_heads, spec.hidden_size, spec.num_layers,
                spec.global_batch_size, spec.seq_length, spec.vocab_size) == (
            int(row["attention_heads"]), int(row["hidden_size"]), int(row["num_layers"]),
            int(row["global_batch_size"]), int(row["seq_len"]), int(row["vocab"]))


def test_korthikanti_presets_match_table3():
    for row in _rows("korthikanti2022_tables3_5.csv"):
        spec = load_spec(f"korthikanti-{row['model'].split()[0].lower()}", "workloads")
        assert (spec.num_attention_heads, spec.hidden_size, spec.num_layers,
                spec.global_batch_size, spec.micro_batch_size) == (
            int(row["attention_heads"]), int(row["hidden_size"]), int(row["num_layers"]),
            int(row["global_batch_size"]), int(row["microbatch_size"]))


def test_lstm_case_study_preset():
    spec = load_spec("lstm-paper-case-study", "workloads")
    assert (spec.hidden_size, spec.global_batch_size, spec.vocab_size, spec.num_layers,
            spec.seq_length, spec.num_gates, spec.precision) == (
        16384, 16384, 800000, 2, 20, 4, "fp16")


@pytest.mark.parametrize("name", preset_names("workloads"))
def test_every_workload_preset_builds_a_dag(name):
    g = compute_graph(load_spec(name, "workloads"))
    assert g.number_of_nodes() >= 1 and nx.is_directed_acyclic_graph(g)


# --- FLOP and parameter counts ------------------------------------------------------------


@pytest.mark.parametrize("row", _rows("megatron_sc21_table1.csv"),
                         ids=lambda r: r["params_billion"])
def test_eq3_matches_the_table1_derived_column(row):
    label = "1t" if row["params_billion"] == "1008.0" else row["params_billion"] + "b"
    spec = load_spec(f"megatron-sc21-{label}", "workloads")
    expected = float(row["derived_flops_per_iter_eq3"])  # 5 significant digits
    assert megatron_eq3_flops(spec) == pytest.approx(expected, rel=1e-4)
    assert transformer_flops(spec) == pytest.approx(megatron_eq3_flops(spec), rel=1e-12)
    assert hardware_flops(spec) == transformer_flops(spec)


def test_model_flops_is_the_72_form_without_recomputation():
    spec = load_spec("gpt3-175b", "workloads")
    B, s, L, h, V = 1536, 2048, 96, 12288, 51200
    assert model_flops(spec) == pytest.approx(
        72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)), rel=1e-12)
    # HFU / MFU of full recomputation: (4·block + 3·logit) / (3·block + 3·logit)
    assert hardware_flops(spec) / model_flops(spec) == pytest.approx(
        (4 * (1 + s / (6 * h)) + 3 * V / (12 * L * h)) / (3 * (1 + s / (6 * h) + V / (12 * L * h))))


def test_graph_flops_equal_eq3_for_gpt3():
    spec = load_spec("gpt3-175b", "workloads")
    g = transformer_graph(spec)
    total = graph_flops(g, ops=["gemm"]) * g.graph["microbatches"]
    assert total == pytest.approx(megatron_eq3_flops(spec), rel=1e-12)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("ffn", [None, 96])
def test_graph_flops_equal_the_closed_form(recompute, ffn):
    spec = _tiny(activation_recompute=recompute, ffn_hidden_size=ffn)
    g = transformer_graph(spec)
    assert graph_flops(g, ops=["gemm"]) * g.graph["microbatches"] == pytest.approx(
        transformer_flops(spec), rel=1e-12)
    fwd = graph_flops(g, ops=["gemm"], phases=["fwd"])
    assert graph_flops(g, ops=["gemm"], phases=["bwd"]) == pytest.approx(2 * fwd)


def test_selective_recompute_adds_one_qk_gemm_per_layer():
    b, s, h, L = 2, 32, 64, 3
    sel = transformer_graph(_tiny(activation_recompute="selective"))
    assert graph_flops(sel, ops=["gemm"], phases=["recompute"]) == 2 * b * s * s * h * L


def test_parameter_count_matches_megatron():
    spec = load_spec("gpt3-175b", "workloads")
    L, h, V, s = 96, 12288, 51200, 2048
    megatron = 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))
    assert parameter_count(spec) == pytest.approx(megatron + 2 * h, rel=1e-12)
    assert round(parameter_count(spec) / 1e9, 1) == 174.6  # SC21 Table 2
    g = transformer_graph(spec)
    assert sum(a["params"] for _, a in g.nodes(data=True)) == parameter_count(spec)
    grads = sum(a["wgrad_elements"] for _, a in g.nodes(data=True))
    assert grads == parameter_count(spec) + V * h  # the tied embedding gets two gradients


# --- transformer graph structure -----------------------------------------------------------


PER_BLOCK = {"none": 13 + 19 + 1, "selective": 13 + 19 + 1 + 3, "full": 13 + 19 + 1 + 13}


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_node_counts_per_block(recompute):
    # Per block: 13 forward ops (BLOCK_OPS); 19 backward: dX and dW of qkv, proj, mlp1, mlp2
    # (8), dQ, dK of qk and dP, dV of av (4), and 7 element-wise (the two residual dropouts,
    # gelu, attention dropout, softmax, the two layernorms); 1 optimizer; recomputation adds
    # 3 (selective: qk, softmax, attn_dropout) or all 13 (full).  Embedding: lookup and
    # add + dropout, their backward, optimizer (5).  Head: final_ln, logits, cross_entropy,
    # cross_entropy.bwd, logits dX and dW, final_ln.bwd, optimizer (8).
    spec = _tiny(activation_recompute=recompute)
    g = transformer_graph(spec)
    per_layer = Counter(a["layer"] for _, a in g.nodes(data=True))
    assert all(per_layer[i] == PER_BLOCK[recompute] for i in range(3))
    assert per_layer[-1] == 5 and per_layer[3] == 8
    assert g.number_of_nodes() == 3 * PER_BLOCK[recompute] + 13
    bwd = Counter(a["op"] for _, a in g.nodes(data=True)
                  if a["layer"] == 0 and a["phase"] == "bwd")
    assert bwd == {"gemm": 12, "elementwise": 7}
    assert [g.nodes[f"L1.{op}"]["name"] for op in BLOCK_OPS] == list(BLOCK_OPS)


def test_attention_is_unfused_with_megatron_shapes():
    g = transformer_graph(_tiny())
    b, s, h, a = 2, 32, 64, 4
    assert g.graph["attention"] == "unfused"
    qk, sm, av = g.nodes["L0.qk"], g.nodes["L0.softmax"], g.nodes["L0.av"]
    assert (qk["op"], qk["count"], qk["m"], qk["k"], qk["n"]) == ("gemm", b * a, s, h // a, s)
    assert (sm["op"], sm["rows"], sm["cols"]) == ("softmax", b * a * s, s)
    assert (av["count"], av["m"], av["k"], av["n"]) == (b * a, s, s, h // a)
    qkv, mlp1 = g.nodes["L0.qkv"], g.nodes["L0.mlp1"]
    assert (qkv["m"], qkv["k"], qkv["n"]) == (b * s, h, 3 * h)
    assert (mlp1["m"], mlp1["k"], mlp1["n"]) == (b * s, h, 4 * h)
    logits = g.nodes["head.logits"]
    assert (logits["m"], logits["k"], logits["n"]) == (b * s, h, 100)
    assert g.nodes["emb.lookup"]["op"] == "embedding"


def test_recomputation_runs_after_its_gradient_arrives():
    sel = transformer_graph(_tiny(activation_recompute="selective"))
    assert sel.edges["L1.proj.dX", "L1.qk.re"]["kind"] == "control"
    assert sel.has_edge("L1.attn_dropout.re", "L1.attn_dropout.bwd")  # backward reads it
    assert not sel.has_edge("L1.attn_dropout", "L1.attn_dropout.bwd")
    full = transformer_graph(_tiny(activation_recompute="full"))
    assert full.edges["L2.ln1.bwd", "L1.ln1.re"]["kind"] == "control"
    assert full.edges["L0.mlp_residual", "L1.ln1.re"]["kind"] == "stash"  # the checkpoint
    assert {a["phase"] for n, a in full.nodes(data=True) if n.endswith(".re")} == {"recompute"}


def test_node_and_edge_conventions():
    for g in (transformer_graph(_tiny(activation_recompute="full")),
              lstm_graph(load_spec(SMALL_LSTM, "workloads"))):
        for _, a in g.nodes(data=True):
            assert a["op"] in OPS and a["phase"] in PHASES
            assert all(a[k] >= 1 for k in SHAPE_KEYS[a["op"]])
            assert a["precision"] in ("bf16", "fp16", "fp32")
            assert a["batch_key"] is None or a["batch_key"] in SHAPE_KEYS[a["op"]]
            assert a["tp_key"] is None or a["tp_key"] in SHAPE_KEYS[a["op"]]
        for _, _, e in g.edges(data=True):
            assert e["kind"] in EDGE_KINDS and e["bytes"] >= 0
        assert nx.is_directed_acyclic_graph(g)


def test_graphs_are_cached_and_frozen():
    spec = _tiny()
    g = transformer_graph(spec)
    assert transformer_graph(spec) is g
    with pytest.raises(nx.NetworkXError):
        g.add_node("x")


def test_micro_batch_override():
    spec = _tiny()
    g = transformer_graph(spec, micro_batch_size=4)
    assert g.graph["batch"] == 4 and g.graph["microbatches"] == 2
    assert g.nodes["L0.qkv"]["m"] == 4 * 32
    with pytest.raises(ConfigError, match="micro_batch_size"):
        transformer_graph(spec, micro_batch_size=3)


# --- LSTM and GEMM -------------------------------------------------------------------------


def test_lstm_graph_shapes_and_counts():
    spec = load_spec(SMALL_LSTM, "workloads")
    g = lstm_graph(spec)
    B, H, V, L, S = 8, 16, 50, 2, 3
    # per step: embedding (1 + 1 bwd), per layer cell GEMM + gates (2) and gates.bwd, dX,
    # dW (3), projection + softmax (2) and softmax.bwd, dX, dW (3); one optimizer per unit
    assert g.number_of_nodes() == S * (2 + 5 * L + 5) + (L + 2)
    cell = g.nodes["t1.L1.cell"]
    assert (cell["m"], cell["k"], cell["n"]) == (B, 2 * H, 4 * H)
    logits = g.nodes["t2.logits"]
    assert (logits["m"], logits["k"], logits["n"]) == (B, H, V)
    assert g.nodes["t0.softmax"]["op"] == "softmax"
    assert g.nodes["t0.L0.gates"]["flops_per_element"] == 13  # DeepFlow: 5 non-linear + 8 add
    assert g.has_edge("t0.L0.gates", "t1.L0.cell")  # recurrence
    assert graph_flops(g, ops=["gemm"]) == lstm_flops(spec) == model_flops(spec)
    fwd = graph_flops(g, ops=["gemm"], phases=["fwd"])
    assert graph_flops(g, ops=["gemm"], phases=["bwd"]) == 2 * fwd
    assert sum(a["params"] for _, a in g.nodes(data=True)) == parameter_count(spec)


@pytest.mark.parametrize("implementation", ["per_step", "cudnn"])
def test_lstm_shared_weights_are_all_reduced_once_per_iteration(implementation):
    """The cell and projection weights are shared over time steps: their gradients
    accumulate and data parallelism all-reduces them once, not once per step."""
    spec = load_spec({**SMALL_LSTM, "implementation": implementation}, "workloads")
    B, H, V, L, S = 8, 16, 50, 2, 3
    wgrad = Counter()
    for _, a in lstm_graph(spec).nodes(data=True):
        wgrad[a["name"]] += a["wgrad_elements"]
    assert wgrad["cell.dW"] == L * (2 * H * 4 * H + 4 * H)
    assert wgrad["logits.dW"] == H * V + V
    assert wgrad["embedding.bwd"] == S * B * H     # the rows the iteration's tokens touch


def test_cudnn_lstm_batches_what_does_not_recur():
    """cuDNN's formulation: the same FLOPs and parameters in fewer, larger kernels; the
    input GEMM, the projection and the weight gradients over all S·B positions at once."""
    spec = load_spec({**SMALL_LSTM, "implementation": "cudnn"}, "workloads")
    g = lstm_graph(spec)
    B, H, V, S = 8, 16, 50, 3
    assert graph_flops(g, ops=["gemm"]) == lstm_flops(spec) == model_flops(spec)
    assert sum(a["params"] for _, a in g.nodes(data=True)) == parameter_count(spec)
    assert g.number_of_nodes() < lstm_graph(load_spec(SMALL_LSTM, "workloads")).number_of_nodes()
    shape = {n: (g.nodes[n]["m"], g.nodes[n]["k"], g.nodes[n]["n"])
             for n in ("L1.input", "t2.L1.cell", "logits", "L0.dW", "logits.dW")}
    assert shape == {"L1.input": (S * B, H, 4 * H), "t2.L1.cell": (B, H, 4 * H),
                     "logits": (S * B, H, V), "L0.dW": (2 * H, S * B, 4 * H),
                     "logits.dW": (H, S * B, V)}
    assert g.has_edge("t1.L0.gates", "t2.L0.cell")  # the recurrence stays step by step
    assert nx.is_directed_acyclic_graph(g)


def test_cudnn_lstm_is_faster_where_the_batch_is_small():
    """Per step with a small batch the paper's formulation streams the whole weight (and its
    gradient) from DRAM every time; cuDNN's does it once per iteration (measured on an H200,
    docs/validation.md)."""
    from crossflow import predict

    small = {"kind": "lstm", "global_batch_size": 64, "hidden_size": 4096,
             "vocab_size": 32000, "num_layers": 2, "seq_length": 20}
    per_step = predict(small, "h200-sxm-141gb").time_s
    cudnn = predict({**small, "implementation": "cudnn"}, "h200-sxm-141gb").time_s
    assert cudnn < 0.6 * per_step


def test_lstm_case_study_flops():
    spec = load_spec("lstm-paper-case-study", "workloads")
    B, H, V = 16384, 16384, 800000
    per_step = 2 * 2 * B * 2 * H * 4 * H + 2 * B * H * V
    assert lstm_flops(spec) == 3 * 20 * per_step


def test_gemm_graph_is_one_node():
    g = compute_graph(load_spec({"kind": "gemm", "m": 64, "k": 32, "n": 16, "count": 3},
                                "workloads"))
    (node, a), = g.nodes(data=True)
    assert (a["op"], a["m"], a["k"], a["n"], a["count"]) == ("gemm", 64, 32, 16, 3)
    assert a["flops"] == 2 * 64 * 32 * 16 * 3


# --- parallelism files (kind optional) -------------------------------------------------------


def test_parallelism_file_without_kind_loads(tmp_path, cli):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"tensor_parallel": 8, "pipeline_parallel": 8,
                                    "data_parallel": 24, "virtual_pipeline_stages": 1,
                                    "sequence_parallel": False}))
    spec = load_spec(path, "parallelism")
    assert spec.kind == "parallelism" and str(spec.to_strategy()) == "t8-d24-p8"
    code, out, err = cli("check", path)
    assert code == 0 and "ok (parallelism)" in out, err


def test_other_files_without_kind_still_need_it(tmp_path, cli):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump({"m": 1, "k": 1, "n": 1}))
    code, _, err = cli("check", path)
    assert code == 2 and "key 'kind'" in err
    with pytest.raises(ConfigError, match="kind"):
        load_spec({"m": 1, "k": 1, "n": 1}, "workloads")
