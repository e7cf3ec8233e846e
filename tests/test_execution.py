"""A workload's execution options in Megatron-LM's names (crossflow.sim.execution): CUDA
graphs (``cuda_graph_impl``, ``cuda_graph_modules``), overlapped expert all-to-alls
(``overlap_moe_expert_parallel_comm``) and FP8 attention (``fp8_dot_product_attention``) —
each replaces the part of the software profile it makes untrue, and nothing else."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

import crossflow
from crossflow.config.loader import load_spec
from crossflow.predict import load_hardware
from crossflow.validation import megatron_bridge as mb


def _model(**update) -> dict:
    return {"kind": "transformer", "name": "small", "num_layers": 4, "hidden_size": 2048,
            "num_attention_heads": 16, "seq_length": 4096, "vocab_size": 32768,
            "global_batch_size": 64, "micro_batch_size": 1, "precision": "fp8",
            "gated_linear_unit": True, "position_embedding_type": "rope", **update}


def _moe(**update) -> dict:
    return _model(**{"num_moe_experts": 64, "moe_router_topk": 8, "moe_ffn_hidden_size": 512,
                     **update})


def _predict(workload: dict, system="dgx-h100-megatron-core", parallelism=None, **kw):
    par = parallelism or {"tensor_parallel": 1, "pipeline_parallel": 1, "data_parallel": 8,
                          **({"expert_parallel": 8} if "num_moe_experts" in workload else {})}
    return crossflow.predict(workload=workload, system=system, parallelism=par, **kw)


def _software(system: str, **update):
    spec = load_spec(system, "systems")
    return spec.model_copy(update={"software": spec.software.model_copy(update=update)})


def test_a_full_iteration_graph_drops_every_per_kernel_and_per_op_host_cost():
    """On a profile whose host is on the critical path (Megatron-DeepSpeed on A100, fitted
    dispatch costs per op), one graph per iteration prices as the same run with the
    device's and the profile's launch and dispatch costs at zero; the iteration tail stays
    (the optimizer step is outside the graph)."""
    system = "dgx-a100-megatron-deepspeed"
    work = _model(precision="bf16", num_layers=2, hidden_size=1024, seq_length=1024)
    eager = _predict(work, system)
    graphed = _predict({**work, "cuda_graph_impl": "full_iteration"}, system)
    arch = load_hardware(load_spec(system, "systems").device)
    by_hand = _predict(work, _software(system, dispatch_s=0.0, backward_dispatch_s=0.0,
                                       collective_dispatch_s=0.0, kernel_launch_s=0.0),
                       hardware=replace(arch, kernel_launch_s=0.0))
    assert graphed.time_s == pytest.approx(by_hand.time_s, rel=1e-12)
    assert graphed.time_s < 0.8 * eager.time_s
    assert graphed.memory_per_device_bytes == eager.memory_per_device_bytes


@pytest.mark.parametrize("impl, modules, captured", [
    ("full_iteration", [], True),
    ("transformer_engine", [], True),            # whole layers
    ("local", ["attn", "moe"], True),
    ("transformer_engine", ["attn", "moe_router", "moe_preprocess"], False),
    ("none", [], False),
])
def test_captured_experts_cost_what_their_kernels_cost(impl, modules, captured):
    """The fitted MoE shortfall (``moe_efficiency``) is that of the eager, host-synchronised
    dropless layer: it goes where a graph captures the experts, and stays where it captures
    only the router and the dispatcher's preprocessing (the Megatron-Bridge recipes the
    profile was fitted to)."""
    system = "dgx-h100-megatron-core"
    work = _moe(cuda_graph_impl=impl, cuda_graph_modules=modules)
    time = _predict(work, system).time_s
    # the same graphs on a profile without the shortfall
    unfitted = _predict(work, _software(system, moe_efficiency=1.0)).time_s
    assert unfitted < 0.9 * _predict(_moe(), system).time_s
    if captured:
        assert time == pytest.approx(unfitted, rel=1e-12)
    else:
        assert time > 1.1 * unfitted


def test_overlapped_all_to_alls_hide_while_the_gemms_last():
    """With ``overlap_moe_expert_parallel_comm`` every all-to-all may hide behind the GEMM
    time, in place of the profile's fitted share (``overlap.ep_comm``)."""
    work = _moe(num_layers=2, moe_ffn_hidden_size=2048)
    eager, overlapped = _predict(work), _predict({**work, "overlap_moe_expert_parallel_comm": True})
    share = load_spec("dgx-h100-megatron-core", "systems").software.overlap.ep_comm
    assert share < 1.0
    f = eager.details["block_forward_s"]
    assert f["ep_comm"] < f["compute"]  # all of it can hide
    assert overlapped.breakdown["ep_comm_s"] == pytest.approx(0.0, abs=1e-12)
    assert eager.breakdown["ep_comm_s"] > 0.0
    assert overlapped.time_s < eager.time_s


def test_fp8_attention_runs_the_flash_kernel_at_the_fp8_rate():
    """Long sequences make the flash kernel compute-bound: in FP8 its time follows the
    ratio of the device's BF16 and FP8 peaks; nothing else of the block changes."""
    work = _model(seq_length=16384, global_batch_size=16)
    bf16, fp8 = (_predict({**work, "fp8_dot_product_attention": on}).details
                 for on in (False, True))
    peaks = load_hardware("h100-sxm5-80gb").peak_flops
    for key in ("block_forward_s", "block_backward_s"):
        assert fp8[key]["attention"] / bf16[key]["attention"] == pytest.approx(
            peaks["bf16"] / peaks["fp8"], rel=0.02)
        assert fp8[key]["compute"] - fp8[key]["attention"] == pytest.approx(
            bf16[key]["compute"] - bf16[key]["attention"], rel=1e-9)


@pytest.mark.parametrize("update, key, pattern", [
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ["experts"]},
     "cuda_graph_modules", "no module Megatron-Core captures"),
    ({"cuda_graph_impl": "full_iteration", "cuda_graph_modules": ["attn"]},
     "cuda_graph_modules", "wants it empty"),
    ({"cuda_graph_modules": ["attn"]}, "cuda_graph_modules", "ignores the list without graphs"),
    ({"cuda_graph_impl": "local", "cuda_graph_modules": ["moe_preprocess"]},
     "cuda_graph_modules", "only with the router"),
    ({"overlap_moe_expert_parallel_comm": True}, "overlap_moe_expert_parallel_comm",
     "the model has none"),
    ({"fp8_dot_product_attention": True, "precision": "bf16"}, "fp8_dot_product_attention",
     "inside an FP8 run"),
    ({"fp8_dot_product_attention": True, "attention_backend": "unfused"},
     "fp8_dot_product_attention", "only a fused kernel"),
])
def test_an_option_megatron_refuses_exits_2_naming_the_key(refuses, update, key, pattern):
    refuses(_model(**update), key, pattern)


def test_predict_says_how_the_run_executes(cli, tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(_moe(cuda_graph_impl="full_iteration",
                                        overlap_moe_expert_parallel_comm=True,
                                        fp8_dot_product_attention=True)))
    args = ("predict", "--workload", path, "--system", "dgx-h100-megatron-core",
            "--parallelism", "t1-d8-e8")
    code, out, _ = cli(*args)
    assert code == 0
    assert ("executes      one CUDA graph per iteration, expert all-to-alls overlapped, "
            "FP8 attention") in out
    code, out, _ = cli(*args, "--json")
    details = json.loads(out)
    assert details["cuda_graph_impl"] == "full_iteration"
    assert details["overlap_moe_expert_parallel_comm"] is True
    assert "cuda_graph_modules" not in details  # only the options set


def _gb200_moe(release: str, model: str) -> dict:
    return next(r for r in mb._blackwell_rows("GB200", moe=True)
                if r["release"] == release and r["model_key"] == model)


def test_the_recipes_options_label_the_runs_that_used_them():
    """Megatron-Bridge's full-iteration MXFP8 recipes (26.06 on) on GB200; the overlap alone
    in GPT-OSS's BF16 recipe of 26.04; neither in the 26.04 MXFP8 runs."""
    spec, _ = mb.case(_gb200_moe("26.06", "qwen3_30b_a3b"))
    assert (spec.cuda_graph_impl, spec.overlap_moe_expert_parallel_comm,
            spec.fp8_dot_product_attention) == ("full_iteration", True, True)
    spec, _ = mb.case(_gb200_moe("26.08", "deepseek_v3"))
    assert (spec.cuda_graph_impl, spec.fp8_dot_product_attention) == ("full_iteration", False)
    bf16 = next(r for r in mb._blackwell_rows("GB200", moe=True) if r["release"] == "26.04"
                and r["model_key"] == "gpt_oss_120b" and r["precision"] == "BF16")
    spec, _ = mb.case(bf16)
    assert spec.overlap_moe_expert_parallel_comm and spec.cuda_graph_impl == "none"
    spec, _ = mb.case(_gb200_moe("26.04", "qwen3_30b_a3b"))
    assert spec.cuda_graph_impl == "none" and not spec.overlap_moe_expert_parallel_comm


def test_a_full_iteration_run_on_gb200_is_predicted_from_its_recipe():
    """Held out: Qwen3 30B-A3B on 8 GB200s, 26.06 (40706 tokens/s per GPU), 1.6× the eager
    26.04 recipe's 26032 at the same parallelism.  Predicted from the recipe within 6 %
    (−5.0 %; as an eager run, 45 % short)."""
    row = _gb200_moe("26.06", "qwen3_30b_a3b")
    tokens, _ = mb.predict_row(row, "gb200-nvl72-megatron-core")
    assert tokens == pytest.approx(float(row["tokens_per_s_per_gpu"]), rel=0.06)


def test_fp8_attention_without_a_flash_kernel_names_the_workload_file(cli, tmp_path):
    """Without a system (or with a profile that runs attention unfused) the kernel is
    settled at prediction: still refused, naming the workload file."""
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(_model(fp8_dot_product_attention=True)))
    code, out, err = cli("predict", "--workload", path, "--hardware", "h100-sxm5-80gb")
    assert code == 2 and not out
    assert f"{path}: key 'fp8_dot_product_attention'" in err and "unfused" in err


def test_a_per_layer_graph_runs_its_kernels_without_their_launches():
    """Whole-layer graphs (``cuda_graph_modules`` empty): the block's kernels cost what they
    cost on a device without a launch cost, as a full-iteration graph's do; the embedding
    and the head outside the layers keep theirs."""
    work = _model(precision="bf16", num_layers=2, hidden_size=1024, seq_length=1024)
    graphed = _predict({**work, "cuda_graph_impl": "transformer_engine"})
    arch = replace(load_hardware("h100-sxm5-80gb"), kernel_launch_s=0.0)
    free = _predict(work, hardware=arch)
    eager = _predict(work)
    for key in ("block_forward_s", "block_backward_s"):
        for part in ("compute", "memory"):
            assert graphed.details[key][part] == pytest.approx(free.details[key][part],
                                                               rel=1e-12)
            assert graphed.details[key][part] < eager.details[key][part]
    assert free.time_s < graphed.time_s < eager.time_s


def test_per_layer_graphs_issue_a_captured_run_of_kernels_as_one_op():
    """On a profile whose host issues every op (Megatron-DeepSpeed on A100, per-op dispatch
    fitted): capturing more of each layer saves more host time, and a full-iteration graph
    (no dispatch at all, the device's launches gone) most."""
    system = "dgx-a100-megatron-deepspeed"
    work = _model(precision="bf16", num_layers=2, hidden_size=1024, seq_length=1024)
    time = {mods: _predict({**work, "cuda_graph_impl": "local",
                            "cuda_graph_modules": list(mods)}, system).time_s
            for mods in (("attn",), ("mlp",), ())}
    eager = _predict(work, system).time_s
    full = _predict({**work, "cuda_graph_impl": "full_iteration"}, system).time_s
    assert eager > time[("attn",)] > time[()] > full
    assert eager > time[("mlp",)] > time[()]
    assert time[("attn",)] < 0.9 * eager


def test_the_router_graph_captures_the_moe_layer_up_to_its_router():
    """``moe_router`` captures the norm, router and shared expert, not the experts (so the
    fitted shortfall of the eager dropless experts stays); ``moe`` captures them all."""
    from crossflow.sim.execution import graphed_ops

    spec = load_spec(_moe(cuda_graph_impl="transformer_engine",
                          cuda_graph_modules=["attn", "moe_router"]), "workloads")
    graphed = graphed_ops(spec, "*E")
    assert graphed("qkv") and graphed("router") and graphed("ln2")
    assert not graphed("expert_fc1") and not graphed("permute")
    eager, router, moe = (_predict(_moe(cuda_graph_impl=impl, cuda_graph_modules=mods))
                          for impl, mods in (("none", []),
                                             ("transformer_engine", ["moe_router"]),
                                             ("transformer_engine", ["moe"])))
    assert moe.time_s < router.time_s < eager.time_s
    # a dense layer has no MoE module to capture
    dense = load_spec(_model(cuda_graph_impl="local", cuda_graph_modules=["moe"]), "workloads")
    assert graphed_ops(dense, "*-") is None


def test_every_op_of_a_layer_is_on_the_side_megatron_captures_it_with():
    """The mixer's ops (attention, MLA, Mamba-2: ``attn`` / ``mamba``) are exactly those of a
    hybrid stack's attention and Mamba layers, none of its MLP and MoE layers' (``mlp`` /
    ``moe``), for every precision and recomputation that adds ops of its own."""
    from crossflow.sim.execution import MIXER_OPS
    from crossflow.workloads.transformer import transformer_graph

    for update in ({}, {"qk_layernorm": True, "position_embedding_type": "rope"},
                   {"precision": "fp4", "activation_recompute": "full"},
                   {"precision": "fp8", "activation_recompute": "selective",
                    "recompute_modules": ("core_attn", "layernorm", "moe")}):
        spec = load_spec("nemotron-3-super", "workloads").model_copy(update={
            "num_layers": 4, "hybrid_override_pattern": "M*E-", "mtp_num_layers": None,
            "mtp_hybrid_override_pattern": None, "global_batch_size": 8,
            "attention_backend": "flash", **update})
        ops = {}
        for node, attrs in transformer_graph(spec).nodes(data=True):
            if 0 <= attrs["layer"] < 4 and attrs["phase"] != "optimizer":
                ops.setdefault(spec.layer_kinds[attrs["layer"]], set()).add(node.split(".")[1])
        assert ops["M"] <= MIXER_OPS and ops["*"] <= MIXER_OPS
        assert not ops["E"] & MIXER_OPS and not ops["-"] & MIXER_OPS
    mla = load_spec("deepseek-v3", "workloads")
    assert {"q_down", "kv_up"} <= MIXER_OPS and mla.multi_latent_attention
