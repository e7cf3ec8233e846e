"""Today's training stacks (issue #19): Llama-style blocks (GQA, SwiGLU, untied embeddings,
rotary), FlashAttention, FP8 GEMMs, communication overlap, the distributed optimizer's
Megatron name, systems of any size, Megatron's fp32 gradient buffer."""

from __future__ import annotations

import pytest

import crossflow
from crossflow.config.loader import load_spec
from crossflow.config.workload import TransformerSpec
from crossflow.errors import ConfigError
from crossflow.parallel import parse_parallelism
from crossflow.sim.training import spec_model_flops, transformer_memory
from crossflow.workloads import transformer_graph
from crossflow.workloads.transformer import block_params

H100 = "h100-sxm5-80gb"
MCORE = "dgx-h100-megatron-core"


def _spec(**kw) -> TransformerSpec:
    base = dict(kind="transformer", num_layers=2, hidden_size=4096, num_attention_heads=32,
                seq_length=4096, vocab_size=32000, global_batch_size=8)
    return TransformerSpec(**{**base, **kw})


def _params(spec: TransformerSpec) -> float:
    tied = not spec.untie_embeddings_and_output_weights
    return spec.num_layers * block_params(spec) + (1 if tied else 2) * spec.vocab_size * (
        spec.hidden_size)


@pytest.mark.parametrize("preset, billions", [
    ("llama3-8b", 8.03), ("llama3-70b", 70.6), ("llama2-7b", 6.74), ("llama2-70b", 69.0),
    ("llama3.1-405b", 405.9), ("gpt3-5b", 5.0)])
def test_presets_have_the_published_parameter_counts(preset, billions):
    # Llama 3 8B: 8.03 B, Llama 3 70B: 70.6 B, Llama 2 7B: 6.74 B, Llama 2 70B: 69.0 B
    # (Meta's model cards); Llama 3.1 405B: 405.9 B (its card); GPT-3 5B as named
    spec = load_spec(preset, "workloads")
    assert _params(spec) / 1e9 == pytest.approx(billions, rel=0.03)


def test_gqa_and_swiglu_shape_the_gemms():
    spec = _spec(num_query_groups=8, ffn_hidden_size=14336, gated_linear_unit=True)
    g = transformer_graph(spec)
    qkv, mlp1, mlp2 = (g.nodes[f"L0.{op}"] for op in ("qkv", "mlp1", "mlp2"))
    assert (qkv["k"], qkv["n"]) == (4096, (32 + 2 * 8) * 128)
    assert mlp1["n"] == 2 * 14336 and mlp2["k"] == 14336
    assert "L0.swiglu" in g and "L0.gelu" not in g
    # three h x ffn GEMMs in the MLP: the FLOPs grow by half of the ungated MLP's
    plain = spec.model_copy(update={"gated_linear_unit": False})
    mlp_flops = 3 * 2 * 2 * 4096 * 14336 * spec.seq_length * spec.global_batch_size * 2
    assert spec_model_flops(spec) - spec_model_flops(plain) == pytest.approx(mlp_flops / 2)


def test_kv_channels_set_the_head_width():
    spec = _spec(hidden_size=4096, num_attention_heads=16, kv_channels=128)
    g = transformer_graph(spec)
    assert g.nodes["L0.qk"]["k"] == 128 and g.nodes["L0.proj"]["k"] == 16 * 128
    with pytest.raises(ConfigError, match="num_query_groups"):
        _spec(num_query_groups=5)


def test_untied_embeddings_have_their_own_output_weight_and_no_exchange():
    tied, untied = _spec(), _spec(untie_embeddings_and_output_weights=True)
    assert _params(untied) - _params(tied) == 32000 * 4096
    g = transformer_graph(untied)
    assert not g.has_edge("head.logits.dW", "emb.optimizer")
    par = {"pipeline_parallel": 2}
    pt = crossflow.predict(workload=tied, system="dgx-h100", parallelism=par)
    pu = crossflow.predict(workload=untied, system="dgx-h100", parallelism=par)
    assert pt.breakdown["embedding_allreduce_s"] > 0 == pu.breakdown["embedding_allreduce_s"]


def test_flash_attention_is_one_fused_kernel_without_s_squared_traffic():
    unfused, flash = _spec(), _spec(attention_backend="flash")
    gu, gf = transformer_graph(unfused), transformer_graph(flash)
    s2 = flash.seq_length ** 2
    scores = flash.micro_batch_size * 32 * s2  # b·a·s²: the unfused score tensors
    assert any(a.get("elements", 0) >= scores for _, a in gu.nodes(data=True))
    assert not any(a.get("elements", 0) >= scores
                   or a.get("rows", 0) * a.get("cols", 0) >= scores
                   for _, a in gf.nodes(data=True))
    attn = gf.nodes["L0.attn"]
    # causal: half of QKᵀ and PV, 2·2·b·a·s²·d / 2
    assert attn["flops"] == pytest.approx(2 * 2 * 1 * 32 * s2 * 128 / 2)
    full = _spec(attention_backend="flash", causal=False)
    assert transformer_graph(full).nodes["L0.attn"]["flops"] == 2 * attn["flops"]
    # faster than the unfused kernels at seq 4096, and no s×s activations in memory
    p = {k: crossflow.predict(workload=w, system="dgx-h100") for k, w in
         (("unfused", unfused), ("flash", flash))}
    assert p["flash"].time_s < p["unfused"].time_s
    mu = transformer_memory(unfused, tp=1, pp=1, dp=1)["activations_bytes"]
    mf = transformer_memory(flash, tp=1, pp=1, dp=1)["activations_bytes"]
    assert mf < 0.5 * mu


def test_a_modern_profile_makes_flash_the_default_and_old_ones_keep_unfused():
    spec = _spec()
    assert crossflow.predict(workload=spec, system=MCORE).details["attention"] == "flash"
    assert crossflow.predict(workload=spec, system="dgx-a100").details["attention"] == "unfused"
    # the workload's own choice wins
    mine = _spec(attention_backend="unfused")
    assert crossflow.predict(workload=mine, system=MCORE).details["attention"] == "unfused"


def test_fp8_runs_the_linear_gemms_at_the_fp8_rate_with_casts():
    bf16, fp8 = _spec(precision="bf16"), _spec(precision="fp8")
    g = transformer_graph(fp8)
    assert g.nodes["L0.qkv"]["precision"] == "fp8" and g.nodes["L0.mlp2.dW"]["precision"] == "fp8"
    assert g.nodes["L0.qk"]["precision"] == "bf16"  # attention stays bf16
    assert g.nodes["head.logits"]["precision"] == "bf16"
    assert g.nodes["L0.ln1"]["precision"] == "bf16"
    casts = [n for n, a in g.nodes(data=True) if a["name"] == "fp8_cast"]
    assert {"L0.proj_cast", "L0.qkv.dY_cast"} <= set(casts)
    pb = crossflow.predict(workload=bf16, system="dgx-h100")
    pf = crossflow.predict(workload=fp8, system="dgx-h100")
    assert pf.breakdown["compute_s"] < 0.7 * pb.breakdown["compute_s"]
    assert pf.breakdown["memory_bound_s"] > pb.breakdown["memory_bound_s"]  # the casts


def test_gpt3_175b_on_6144_h100s_needs_no_edited_system_file():
    par = {"tensor_parallel": 8, "pipeline_parallel": 16, "data_parallel": 48,
           "virtual_pipeline_stages": 3, "sequence_parallel": True,
           "use_distributed_optimizer": True}
    p = crossflow.predict(workload="gpt3-175b", system=MCORE, parallelism=par)
    assert p.feasible and p.details["devices"] == 6144 > 32 * 8
    assert 0.1 < p.details["model_flops_utilization"] < 0.7


def test_overlap_hides_communication_and_reports_it():
    spec = load_spec("llama3-70b", "workloads").model_copy(update={"precision": "fp8"})
    par = {"tensor_parallel": 4, "pipeline_parallel": 8, "data_parallel": 2,
           "virtual_pipeline_stages": 5, "sequence_parallel": True,
           "use_distributed_optimizer": True}
    on = crossflow.predict(workload=spec, system=MCORE, parallelism=par)
    mcore = load_spec(MCORE, "systems")
    off_sys = mcore.model_copy(update={"software": mcore.software.model_copy(
        update={"overlap": mcore.software.overlap.model_copy(update={
            "grad_reduce": False, "param_gather": False, "p2p": False, "tp_comm": 0.0})})})
    off = crossflow.predict(workload=spec, system=off_sys, parallelism=par)
    hidden = on.details["hidden_comm_s"]
    assert hidden["tp_comm_s"] > 0 and hidden["pp_p2p_s"] > 0 and hidden["dp_allreduce_s"] > 0
    assert off.details["hidden_comm_s"] == {"tp_comm_s": 0.0, "cp_comm_s": 0.0,
                                            "pp_p2p_s": 0.0, "dp_allreduce_s": 0.0}
    assert on.time_s < off.time_s
    # exposed + hidden is the communication of the run without overlap
    for k in ("tp_comm_s", "pp_p2p_s"):
        assert on.breakdown[k] + hidden[k] == pytest.approx(off.breakdown[k], rel=1e-9)


def test_megatron_parallelism_names():
    par = parse_parallelism({"data_parallel": 8, "use_distributed_optimizer": True,
                             "recompute_granularity": "full"})
    assert par.sharded_optimizer and par.recompute_granularity == "full"
    with pytest.raises(ConfigError, match="use_distributed_optimizer"):
        parse_parallelism({"zero1": False, "use_distributed_optimizer": True})
    spec = _spec(activation_recompute="none", global_batch_size=64)
    base = {"data_parallel": 8}
    plain = crossflow.predict(workload=spec, system="dgx-h100", parallelism=base)
    sharded = crossflow.predict(workload=spec, system="dgx-h100",
                                parallelism={**base, "use_distributed_optimizer": True})
    full = crossflow.predict(workload=spec, system="dgx-h100",
                             parallelism={**base, "recompute_granularity": "full"})
    mem = lambda p: p.details["memory_breakdown"]  # noqa: E731
    assert mem(sharded)["optimizer_state_bytes"] == pytest.approx(
        mem(plain)["optimizer_state_bytes"] / 8)
    assert mem(full)["activations_bytes"] < mem(plain)["activations_bytes"]
    assert full.time_s > plain.time_s  # the recomputed forward


def test_megatron_keeps_an_fp32_gradient_buffer():
    spec = _spec(num_layers=4)
    m = transformer_memory(spec, tp=1, pp=1, dp=1)
    states = m["weights_bytes"] + m["gradients_bytes"] + m["optimizer_state_bytes"]
    assert states / (m["weights_bytes"] / 2) == pytest.approx(18)


def test_context_parallelism_splits_each_sequence():
    spec = _spec(num_layers=4, seq_length=8192, global_batch_size=8,
                 attention_backend="flash")
    base = {"tensor_parallel": 2, "data_parallel": 2, "use_distributed_optimizer": True}
    one = crossflow.predict(workload=spec, system=MCORE, parallelism=base)
    two = crossflow.predict(workload=spec, system=MCORE,
                            parallelism={**base, "context_parallel": 2})
    assert two.details["devices"] == 2 * one.details["devices"] == 8
    assert two.details["context_parallel"] == 2
    # the same micro-batches per replica, each rank with half of every sequence
    assert two.details["microbatches"] == one.details["microbatches"]
    act = lambda p: p.details["memory_breakdown"]["activations_bytes"]  # noqa: E731
    assert act(two) == pytest.approx(act(one) / 2)
    assert 0.4 < two.breakdown["compute_s"] / one.breakdown["compute_s"] < 0.6
    assert two.details["hidden_comm_s"]["cp_comm_s"] > 0
    with pytest.raises(ConfigError, match="context_parallel"):
        crossflow.predict(workload=_spec(seq_length=4098, global_batch_size=2),
                          system=MCORE, parallelism={"context_parallel": 2})


def test_predict_prints_the_hidden_communication(cli):
    code, out, err = cli("predict", "--workload", "gpt3-175b", "--system", MCORE,
                         "--parallelism", "t8-p16-d48")
    assert code == 0, err
    assert "6144 devices" in out
    hidden = out.split("hidden behind computation")[1]
    assert "tp_comm" in hidden and "dp_allreduce" in hidden
