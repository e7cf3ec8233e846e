"""Recomputation as Megatron-LM's options choose it: selective recomputation by module
(``recompute_modules``: what each module frees, what its rerun costs, the refusals of
modules a model does not have) and which layers full recomputation reruns
(``recompute_method``, ``recompute_num_layers``)."""

from __future__ import annotations

import json

import pytest
import yaml

import crossflow
from crossflow.config.loader import load_spec
from crossflow.config.workload import TransformerSpec
from crossflow.errors import ConfigError
from crossflow.sim.training_memory import transformer_memory
from crossflow.workloads.transformer import transformer_graph

A100 = "a100-sxm4-80gb"
ONE = {"tp": 1, "pp": 1, "dp": 1}


def _gpt(**update) -> dict:
    return {"kind": "transformer", "name": "small-gpt", "num_layers": 4, "hidden_size": 1024,
            "num_attention_heads": 16, "seq_length": 2048, "vocab_size": 32768,
            "global_batch_size": 8, "micro_batch_size": 2, "precision": "bf16",
            "activation_recompute": "selective", **update}


def _moe(**update) -> dict:
    return _gpt(num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=1536,
                moe_shared_expert_intermediate_size=1024, gated_linear_unit=True, **update)


def _mla(**update) -> dict:
    return _gpt(multi_latent_attention=True, q_lora_rank=512, kv_lora_rank=256,
                qk_head_dim=64, qk_pos_emb_head_dim=32, v_head_dim=64, **update)


def _spec(d: dict, *modules: str) -> TransformerSpec:
    return TransformerSpec.model_validate({**d, "recompute_modules": modules})


def _activations(d: dict, *modules: str) -> float:
    return transformer_memory(_spec(d, *modules), **ONE)["activations_bytes"]


def _time(d: dict, *modules: str) -> float:
    return crossflow.predict(workload=_spec(d, *modules), hardware=A100).time_s


def test_megatron_default_is_the_attention_core():
    default = TransformerSpec.model_validate(_gpt())
    assert default.recomputed_modules == {"core_attn"}
    core = _spec(_gpt(), "core_attn")
    assert transformer_memory(default, **ONE) == transformer_memory(core, **ONE)
    assert (crossflow.predict(workload=default, hardware=A100).time_s
            == crossflow.predict(workload=core, hardware=A100).time_s)


def test_an_empty_list_keeps_the_unfused_attention_scores():
    # Korthikanti's 5·a·s/h bytes per token and hidden unit come back without core_attn
    d = _gpt()
    s, b, a, L = d["seq_length"], d["micro_batch_size"], d["num_attention_heads"], 4
    extra = _activations(d) - _activations(d, "core_attn")
    assert extra == pytest.approx(L * 5 * a * s * s * b)
    assert _time(d) < _time(d, "core_attn")  # and nothing is rerun


def test_mlp_frees_the_dense_mlp_and_its_fused_norm_output():
    # fc1's and GeLU's outputs (2 bytes each per ffn unit) and the fused norm's (2 per
    # hidden unit), per token of every layer
    d = _gpt()
    h, s, b, L = 1024, 2048, 2, 4
    freed = _activations(d, "core_attn") - _activations(d, "core_attn", "mlp")
    assert freed == pytest.approx(L * s * b * (2 * h + 4 * 4 * h))
    assert _time(d, "core_attn", "mlp") > _time(d, "core_attn")
    names = {a["name"] for _, a in transformer_graph(_spec(d, "mlp")).nodes(data=True)
             if a["phase"] == "recompute"}
    assert names == {"ln2", "mlp1", "gelu", "mlp2"}


def test_moe_modules_free_what_they_rerun():
    d = _moe()
    s, b, L, k, f = 2048, 2, 4, 2, 1536
    base = _activations(d)
    act = base - _activations(d, "moe_act")
    assert act == pytest.approx(L * s * b * 2 * k * f)  # the experts' SwiGLU outputs
    shared = base - _activations(d, "shared_experts")
    assert shared == pytest.approx(L * s * b * 6 * 1024)  # fc1 (2 × 1024) and SwiGLU
    whole = base - _activations(d, "moe")
    assert whole > act + shared
    # "moe" reruns what "moe_act" and "shared_experts" would, so adding them frees nothing
    assert _activations(d, "moe", "moe_act", "shared_experts") == _activations(d, "moe")
    # every layer of an MoE model has a separate pre-MLP norm: its output goes too
    assert base - _activations(d, "layernorm") == pytest.approx(L * s * b * 2 * 1024)
    t_act, t_moe = _time(d, "moe_act"), _time(d, "moe")
    assert _time(d) < t_act < t_moe


def test_recomputing_the_whole_moe_layer_repeats_its_all_to_alls():
    d = _moe(global_batch_size=64)
    par = {"tensor_parallel": 1, "pipeline_parallel": 1, "data_parallel": 8,
           "expert_parallel": 8}
    spec_act, spec_moe = _spec(d, "moe_act"), _spec(d, "moe")
    act = crossflow.predict(workload=spec_act, system="dgx-h100-megatron-core",
                            parallelism=par)
    moe = crossflow.predict(workload=spec_moe, system="dgx-h100-megatron-core",
                            parallelism=par)
    backward = moe.details["block_backward_s"], act.details["block_backward_s"]
    assert backward[0]["ep_comm"] == pytest.approx(2 * backward[1]["ep_comm"])
    assert backward[0]["collectives"] == 2 * backward[1]["collectives"]


def test_recomputing_a_whole_mlp_repeats_its_tensor_parallel_collectives():
    d = _gpt(global_batch_size=16)
    par = {"tensor_parallel": 8, "sequence_parallel": True}
    runs = [crossflow.predict(workload=_spec(d, *m), system="dgx-h100-megatron-core",
                              parallelism=par).details["block_backward_s"]
            for m in (("core_attn",), ("core_attn", "mlp"))]
    # forward: an all-gather and a reduce-scatter per sublayer; backward those and a
    # gather for the weight gradient, and the MLP's pair again when it is rerun
    assert [r["collectives"] for r in runs] == [6, 8]


def test_mla_up_proj_frees_the_queries_keys_and_values():
    d = _mla()
    spec = _spec(d)
    s, b, L = 2048, 2, 4
    freed = _activations(d) - _activations(d, "mla_up_proj")
    assert freed == pytest.approx(L * s * b * 2 * spec.qkv_width)
    names = {a["name"] for _, a in transformer_graph(_spec(d, "mla_up_proj")).nodes(data=True)
             if a["phase"] == "recompute"}
    assert names == {"q_up", "kv_up", "rope"}
    # MLA's input norm is no linear layer's: "layernorm" frees it, and reruns it
    assert _activations(d) - _activations(d, "layernorm") == pytest.approx(L * s * b * 2 * 1024)


def test_deepseek_v3_fits_an_h100_with_its_recipes_recomputation():
    # Megatron-Bridge's H100 recipe for DeepSeek-V3 recomputes mla_up_proj and mlp
    # (perf_recipes/deepseek/h100/deepseek_v3.py); its 25.09 run trained in 80 GB.  Without
    # dropout (its bridge's) the run fits by 0.1 GB without them; with Megatron's default
    # dropout, whose masks it keeps, only with them
    from crossflow.validation import megatron_bridge as mb

    row = next(r for r in mb.moe_rows() if r["model_key"] == "deepseek_v3")
    spec, par = mb.case(row)
    recipe = {**par, "recompute_granularity": "selective",
              "recompute_modules": ("mla_up_proj", "mlp")}
    for dropout, plain_fits in ((0.0, True), (0.1, False)):
        work = spec.model_copy(update={"hidden_dropout": dropout})
        plain = crossflow.predict(workload=work, system=mb.SYSTEM, parallelism=par)
        fits = crossflow.predict(workload=work, system=mb.SYSTEM, parallelism=recipe)
        assert plain.feasible is plain_fits and fits.feasible
        assert fits.memory_per_device_bytes < 0.8 * plain.memory_per_device_bytes
        if plain_fits:  # a light recomputation: 1 % more time
            assert fits.time_s < 1.02 * plain.time_s


def test_the_parallelism_overrides_the_workloads_modules():
    d = {**_gpt(), "recompute_modules": ("core_attn", "mlp")}
    workload = crossflow.predict(workload=d, hardware=A100)
    mine = crossflow.predict(workload=d, hardware=A100,
                             parallelism={"recompute_modules": ("core_attn",)})
    assert mine.memory_per_device_bytes > workload.memory_per_device_bytes
    # under another granularity the workload's modules do not apply (and are no error)
    full = crossflow.predict(workload=d, hardware=A100,
                             parallelism={"recompute_granularity": "full"})
    assert full.memory_per_device_bytes < workload.memory_per_device_bytes
    with pytest.raises(ConfigError, match="recompute_modules"):
        crossflow.predict(workload=d, hardware=A100,
                          parallelism={"recompute_granularity": "none",
                                       "recompute_modules": ("mlp",)})


@pytest.mark.parametrize("update, pattern", [
    ({"activation_recompute": "full", "recompute_modules": ("mlp",)},
     "activation_recompute is full"),
    ({"recompute_modules": ("attention",)}, "'attention' is no module"),
    ({"recompute_modules": ("moe_act",)}, "'moe_act' recomputes the routed experts'"),
    ({"recompute_modules": ("mla_up_proj",)}, "'mla_up_proj' recomputes MLA's"),
    ({"recompute_modules": ("layernorm",)}, "'layernorm' recomputes the norms"),
])
def test_modules_a_model_cannot_recompute_exit_2(cli, tmp_path, update, pattern):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump({**_gpt(), **update}))
    code, out, err = cli("predict", "--workload", path, "--hardware", A100)
    assert code == 2 and not out
    assert str(path) in err and "recompute_modules" in err and pattern in err


def test_an_moe_mla_model_over_memory_is_offered_its_light_recomputation(cli, tmp_path):
    """DeepSeek-V3 with Megatron's default dropout at NVIDIA's 25.09 H100 setting (without
    the recipe's recomputation) does not fit; predict offers the modules Megatron-Bridge's
    guidance starts from, the fastest fix, and the line it prints runs."""
    work = load_spec("deepseek-v3", "workloads").model_dump(exclude_none=True, mode="json")
    path = tmp_path / "deepseek-v3-dropout.yaml"
    path.write_text(yaml.safe_dump(work | {"hidden_dropout": 0.1}))
    par = ("{tensor_parallel: 2, pipeline_parallel: 8, data_parallel: 64, "
           "virtual_pipeline_stages: 4, sequence_parallel: true, "
           "use_distributed_optimizer: true, expert_parallel: 64, "
           "pipeline_model_parallel_layout: Et|(tt|)*30mL}")
    base = ("predict", "--workload", str(path), "--system", "dgx-h100-megatron-core")
    code, out, _ = cli(*base, "--parallelism", par)
    assert code == 3
    line = out.splitlines()[-1]
    assert line.startswith("  to use the fastest: --parallelism")
    assert line.endswith("recompute_granularity: selective, recompute_modules: "
                         "[layernorm, moe_act, mla_up_proj]}'")
    code, out, _ = cli(*base, "--parallelism", line.split("--parallelism ")[1].strip("'"))
    assert code == 0


def _full(d: dict, **method) -> TransformerSpec:
    return TransformerSpec.model_validate({**d, "activation_recompute": "full", **method})


def _none(d: dict) -> TransformerSpec:
    return TransformerSpec.model_validate({**d, "activation_recompute": "none"})


@pytest.mark.parametrize("pp", [1, 2])
def test_the_block_method_reruns_the_first_layers_of_each_chunk(pp):
    """Of each chunk's layers the first recompute_num_layers keep only their input, the
    others all their activations: on a stage of 1F1B with pp micro-batches in flight the
    difference from no recomputation is in_flight · N · (kept − input) bytes."""
    # a small vocabulary: the first stage (the most in flight) is the fuller in every mode
    d = _gpt(num_layers=16, vocab_size=1024, global_batch_size=16)
    opts = {"tp": 1, "pp": pp, "dp": 1}
    acts = {name: transformer_memory(spec, **opts)["activations_bytes"]
            for name, spec in (("none", _none(d)), ("full", _full(d)),
                               ("block", _full(d, recompute_method="block",
                                               recompute_num_layers=3)))}
    per_layer = (acts["none"] - acts["full"]) / (16 // pp)  # × in flight, first stage
    assert acts["none"] - acts["block"] == pytest.approx(3 * per_layer)
    # and as many layers as a chunk holds is full recomputation
    every = _full(d, recompute_method="block", recompute_num_layers=16 // pp)
    assert transformer_memory(every, **opts) == transformer_memory(_full(d), **opts)


def test_the_block_method_prices_its_rerun_layers_only():
    d = _gpt(num_layers=8)
    times = [crossflow.predict(workload=spec, hardware=A100).time_s
             for spec in (_none(d), _full(d, recompute_method="block", recompute_num_layers=2),
                          _full(d, recompute_method="block", recompute_num_layers=6),
                          _full(d))]
    assert times == sorted(times) and len(set(times)) == 4
    # each rerun layer costs the same forward: the steps are proportional
    assert (times[2] - times[1]) == pytest.approx(2 * (times[1] - times[0]), rel=1e-6)
    assert (times[3] - times[2]) == pytest.approx(times[1] - times[0], rel=1e-6)


def test_the_uniform_method_keeps_one_input_per_group_and_reruns_a_group_at_once():
    d = _gpt(num_layers=8)
    full, grouped = _full(d), _full(d, recompute_method="uniform", recompute_num_layers=4)
    acts = [transformer_memory(s, **ONE)["activations_bytes"] for s in (_none(d), full, grouped)]
    s, b, h = 2048, 2, 1024
    layer_input = 2 * s * b * h
    loss = acts[1] - 8 * layer_input  # the loss's logits and inputs, the same in all
    kept = (acts[0] - loss) / 8
    assert acts[2] == pytest.approx(loss + 2 * layer_input + 3 * kept)
    assert (crossflow.predict(workload=grouped, hardware=A100).time_s
            == crossflow.predict(workload=full, hardware=A100).time_s)


@pytest.mark.parametrize("update, key, pattern", [
    ({"activation_recompute": "selective", "recompute_method": "uniform"},
     "recompute_method", "activation_recompute is selective"),
    ({"activation_recompute": "none", "recompute_num_layers": 2},
     "recompute_num_layers", "activation_recompute is none"),
    ({"activation_recompute": "full", "recompute_method": "block"},
     "recompute_method", "recompute_num_layers is not set"),
])
def test_a_recompute_method_without_full_recomputation_exits_2(cli, tmp_path, update, key,
                                                                pattern):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump({**_gpt(), **update}))
    code, out, err = cli("predict", "--workload", path, "--hardware", A100)
    assert code == 2 and not out
    assert str(path) in err and f"key '{key}'" in err and pattern in err


def test_the_parallelism_sets_the_method_as_megatron_does():
    d = _gpt(num_layers=8, activation_recompute="none")
    block = {"recompute_granularity": "full", "recompute_method": "block",
             "recompute_num_layers": 2}
    p = crossflow.predict(workload=d, hardware=A100, parallelism=block)
    q = crossflow.predict(workload=_full(d, recompute_method="block", recompute_num_layers=2),
                          hardware=A100)
    assert p.time_s == q.time_s and p.memory_per_device_bytes == q.memory_per_device_bytes
    # a workload's method is dropped under the parallelism's selective granularity
    w = _full(d, recompute_method="block", recompute_num_layers=2)
    sel = crossflow.predict(workload=w, hardware=A100,
                            parallelism={"recompute_granularity": "selective"})
    assert sel.time_s == crossflow.predict(workload=_gpt(num_layers=8), hardware=A100).time_s
    with pytest.raises(ConfigError, match="recompute_method"):
        crossflow.predict(workload=d, hardware=A100,
                          parallelism={"recompute_method": "uniform"})


def test_predict_says_what_the_recomputation_reruns(cli, tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(_gpt(num_layers=8, recompute_modules=["core_attn", "mlp"])))
    base = ("predict", "--workload", path, "--hardware", A100, "--parallelism")
    code, out, _ = cli(*base, "{}")
    assert code == 0 and "recompute     selective (core_attn, mlp)" in out
    code, out, _ = cli(*base, "{recompute_granularity: full, recompute_method: block, "
                              "recompute_num_layers: 2}")
    assert code == 0
    assert "recompute     full (block: the first 2 layers of each pipeline chunk)" in out
    code, out, _ = cli(*base, "{recompute_granularity: full}", "--json")
    details = json.loads(out)
    assert (details["recompute_method"], details["recompute_num_layers"]) == ("uniform", 1)


def test_a_design_over_memory_is_offered_the_fewest_block_layers_that_fit(cli):
    """GPT-3 175B at t8 p8 without recomputation does not fit an 80 GiB A100; predict
    offers full recomputation of the first N layers of each 12-layer chunk, N the fewest
    that fit, and N − 1 does not."""
    code, out, _ = cli("predict", "--workload", "gpt3-175b", "--system", "dgx-a100",
                       "--parallelism", "{strategy: t8-p8-d24, recompute_granularity: none}",
                       "--json")
    assert code == 3
    fits = json.loads(out)["fits_with"]
    block = next(f for f in fits if f["options"].get("recompute_method") == "block")
    n = block["options"]["recompute_num_layers"]
    assert 1 <= n < 12
    assert block["time_s"] < next(f["time_s"] for f in fits
                                  if f["options"] == {"recompute_granularity": "full"})
    par = {"strategy": "t8-p8-d24", "recompute_granularity": "full",
           "recompute_method": "block"}
    assert crossflow.predict(workload="gpt3-175b", system="dgx-a100",
                             parallelism=par | {"recompute_num_layers": n}).feasible
    assert not crossflow.predict(workload="gpt3-175b", system="dgx-a100",
                                 parallelism=par | {"recompute_num_layers": n - 1}).feasible
