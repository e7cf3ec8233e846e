"""Multi-token prediction (Megatron-LM's ``--mtp-num-layers``: DeepSeek-V3, Nemotron 3) and
Megatron-LM's ``--pipeline-model-parallel-layout``: the MTP depths' kernels on the last
chunk, their parameters, memory and model FLOPs, the layouts CrossFlow prices and those
it refuses, and the published runs that train with MTP."""

from __future__ import annotations

import pytest
import yaml

import crossflow
from crossflow.config.loader import load_spec
from crossflow.config.workload import TransformerSpec
from crossflow.errors import ConfigError
from crossflow.parallel.spec import ParallelismSpec, parse_pipeline_layout
from crossflow.sim.model_flops import mtp_model_flops, spec_model_flops
from crossflow.sim.training import BF16_MARK, mtp_kinds
from crossflow.sim.training_memory import stage_parameter_split
from crossflow.validation import megatron_bridge as mb
from crossflow.workloads import transformer_graph
from crossflow.workloads.transformer import moe_block_params, mtp_params

H100 = "dgx-h100-megatron-core"
GB200 = "gb200-nvl72-megatron-core"


def _gpt(**kw) -> TransformerSpec:
    base = dict(kind="transformer", num_layers=8, hidden_size=4096, num_attention_heads=32,
                num_query_groups=8, ffn_hidden_size=14336, gated_linear_unit=True,
                seq_length=4096, vocab_size=128256, global_batch_size=16,
                attention_backend="flash", precision="bf16")
    return TransformerSpec(**{**base, **kw})


def _nano(**kw) -> TransformerSpec:
    base = load_spec("nemotron-3-nano", "workloads").model_dump()
    return TransformerSpec(**{**base, "global_batch_size": 64, **kw})


def test_an_mtp_depth_is_a_layer_of_the_decoders_last_kind_or_the_hybrid_mtp_pattern():
    assert _gpt().mtp_layer_kinds == ()
    assert _gpt(mtp_num_layers=2).mtp_layer_kinds == ("*-",)
    assert load_spec("deepseek-v3", "workloads").mtp_layer_kinds == ("*E",)
    spec = _nano(mtp_num_layers=2, mtp_hybrid_override_pattern="*E")
    assert spec.mtp_layer_kinds == ("*", "E")
    # NVFP4 runs keep MTP layers in BF16 (Megatron-Core gives them the FP8 context only)
    assert mtp_kinds(spec.model_copy(update={"precision": "fp4"})) == ("*" + BF16_MARK,
                                                                       "E" + BF16_MARK)
    assert mtp_kinds(spec) == ("*", "E")


@pytest.mark.parametrize("update, key, words", [
    ({"mtp_hybrid_override_pattern": "*E"}, "mtp_hybrid_override_pattern",
     "no hybrid_override_pattern"),
    ({"hybrid": True, "mtp_num_layers": 1}, "mtp_hybrid_override_pattern", "needs its layers"),
    ({"hybrid": True, "mtp_num_layers": 1, "mtp_hybrid_override_pattern": "*X"},
     "mtp_hybrid_override_pattern", "'X' is no layer symbol")])
def test_mtp_keys_that_cannot_apply_are_refused_naming_the_key(update, key, words):
    hybrid = update.pop("hybrid", False)
    with pytest.raises(ConfigError) as info:
        (_nano if hybrid else _gpt)(**update)
    assert info.value.key == key and words in str(info.value)


def test_a_negative_mtp_depth_count_is_refused_from_a_workload_file():
    spec = _gpt().model_dump(exclude_none=True) | {"mtp_num_layers": -1}
    with pytest.raises(ConfigError) as info:
        load_spec(spec, "workloads")
    assert info.value.key == "mtp_num_layers"


def test_an_mtp_pattern_with_an_moe_layer_needs_experts():
    dense = _nano().model_dump() | {"num_moe_experts": None,
                                    "hybrid_override_pattern": "M*M-" * 13}
    with pytest.raises(ConfigError, match="the model has no experts"):
        TransformerSpec(**dense | {"mtp_num_layers": 1, "mtp_hybrid_override_pattern": "*E"})


def test_the_mtp_projection_is_in_the_graph_only_with_mtp():
    nodes = set(transformer_graph(_gpt(mtp_num_layers=1)))
    assert {"mtp.enorm", "mtp.hnorm", "mtp.eh_proj", "mtp.eh_proj.dW"} <= nodes
    assert not any(n.startswith("mtp.") for n in transformer_graph(_gpt()))
    proj = transformer_graph(_gpt(mtp_num_layers=1)).nodes["mtp.eh_proj"]
    assert (proj["m"], proj["k"], proj["n"]) == (4096, 2 * 4096, 4096)


def test_mtp_parameters_are_one_depths_when_the_layer_is_repeated():
    h = 7168
    ds = load_spec("deepseek-v3", "workloads")
    dense, expert = moe_block_params(ds)
    assert mtp_params(ds) == (dense + 3 * h + 2 * h * h, expert)
    two = ds.model_copy(update={"mtp_num_layers": 2})
    assert mtp_params(two) == tuple(2 * p for p in mtp_params(ds))
    shared = two.model_copy(update={"mtp_use_repeated_layer": True})
    assert mtp_params(shared) == mtp_params(ds)
    assert mtp_params(_gpt()) == (0, 0)


def test_mtp_model_flops_follow_megatron_lms_count():
    spec = _gpt(mtp_num_layers=2)
    h, V, tokens = 4096, 128256, 16 * 4096
    base = spec_model_flops(_gpt())
    layer = (base / 3 - tokens * 2 * h * V) / 8  # one decoder layer's forward
    expected = 3 * 2 * tokens * (layer / tokens + 2 * (3 * h + 2 * h * h) + 2 * h * V)
    assert mtp_model_flops(spec) == pytest.approx(expected)
    assert spec_model_flops(spec) == pytest.approx(base + expected)


def test_each_mtp_depth_adds_the_same_time_to_the_last_chunk():
    par = {"tensor_parallel": 2, "data_parallel": 4, "sequence_parallel": True,
           "use_distributed_optimizer": True}
    times = [crossflow.predict(workload=_gpt(mtp_num_layers=d, mtp_use_repeated_layer=True),
                               system=H100, parallelism=par).time_s for d in (0, 1, 2)]
    step = times[1] - times[0]
    assert step > 0 and times[2] - times[1] == pytest.approx(step, rel=0.02)
    # a depth is a decoder layer, an embedding, the projection and another head: more than
    # one eighth of the 8-layer model's time, less than a third
    assert times[0] / 8 < step < times[0] / 3


def test_mtp_on_a_pipeline_loads_the_last_stage():
    par = {"tensor_parallel": 2, "pipeline_parallel": 2, "data_parallel": 2,
           "sequence_parallel": True, "use_distributed_optimizer": True}
    off, on = (crossflow.predict(workload=_gpt(mtp_num_layers=d), system=H100,
                                 parallelism=par) for d in (0, 1))
    assert on.time_s > off.time_s
    assert on.memory_per_device_bytes > off.memory_per_device_bytes
    # the last stage holds the block and, where the output layer is untied, an embedding of
    # its own for the shifted inputs (tied, the output layer's weight is that embedding);
    # the first stage holds none of it
    block = mtp_params(_gpt(mtp_num_layers=1))[0] / 2
    for untied, table in ((False, 0), (True, 128256 * 4096 / 2)):
        first, last = ([stage_parameter_split(
            _gpt(mtp_num_layers=d, untie_embeddings_and_output_weights=untied), tp=2, pp=2,
            stage=r)[0] for d in (0, 1)] for r in (0, 1))
        assert first[1] == first[0]
        assert last[1] - last[0] == pytest.approx(block + table)
    one = {"tensor_parallel": 2, "data_parallel": 4, "sequence_parallel": True}
    off, on = (crossflow.predict(workload=_gpt(mtp_num_layers=d), system=H100,
                                 parallelism=one) for d in (0, 1))
    assert on.memory_per_device_bytes > off.memory_per_device_bytes


def test_pipeline_layouts_parse_as_megatron_lm_unrolls_them():
    layout = parse_pipeline_layout("Et|(tt|)*30mL")  # DeepSeek-V3, 8 x 4 chunks
    assert layout.decoder == (1,) + (2,) * 30 + (0,) and layout.mtp == 1
    assert parse_pipeline_layout("Et*4|(t*4|)*14,tmL").decoder == (4,) * 15 + (1,)
    assert parse_pipeline_layout("Ettt|t|ttttt|tL").decoder == (3, 1, 5, 1)


@pytest.mark.parametrize("layout, words", [
    ("Ett|tXL", "'X' is no layer"),
    ("tE|ttL", "the embedding comes first"),
    ("Et|tm|tL", "MTP depths on the last chunk")])
def test_layouts_crossflow_cannot_price_are_refused(layout, words):
    with pytest.raises(ConfigError) as info:
        parse_pipeline_layout(layout)
    assert info.value.key == "pipeline_model_parallel_layout" and words in str(info.value)


def test_uneven_first_and_last_stages_split_as_megatron_core_builds_them():
    def split(layers, **par):
        return ParallelismSpec(**par).chunk_split(layers)

    assert split(14, pipeline_parallel=4, num_layers_in_first_pipeline_stage=2,
                 num_layers_in_last_pipeline_stage=2) == (2, 5, 5, 2)
    # with virtual stages each stage's layers are shared by its chunks (chunk c on c mod pp)
    assert split(12, pipeline_parallel=2, virtual_pipeline_stages=2,
                 num_layers_in_first_pipeline_stage=4) == (2, 4, 2, 4)
    assert split(12, pipeline_parallel=3, num_layers_in_first_pipeline_stage=0) == (0, 6, 6)
    assert split(14, pipeline_parallel=4, account_for_embedding_in_pipeline_split=True,
                 account_for_loss_in_pipeline_split=True) == (3, 4, 4, 3)
    assert split(16, pipeline_parallel=4) is None  # the even split


@pytest.mark.parametrize("layers, par, key", [
    (14, {"pipeline_parallel": 4, "num_layers_in_first_pipeline_stage": 3},
     "num_layers_in_first_pipeline_stage"),
    (12, {"pipeline_parallel": 2, "virtual_pipeline_stages": 2,
          "num_layers_in_last_pipeline_stage": 5}, "num_layers_in_last_pipeline_stage"),
    (14, {"pipeline_parallel": 4, "account_for_loss_in_pipeline_split": True},
     "account_for_loss_in_pipeline_split")])
def test_uneven_splits_that_cannot_hold_the_layers_are_refused(layers, par, key):
    with pytest.raises(ConfigError) as info:
        ParallelismSpec(**par).chunk_split(layers)
    assert info.value.key == key
    with pytest.raises(ConfigError, match="places every layer itself"):
        ParallelismSpec(pipeline_parallel=2, num_layers_in_first_pipeline_stage=0,
                        pipeline_model_parallel_layout="E|tttL")
    with pytest.raises(ConfigError, match="does not split with both"):
        ParallelismSpec(pipeline_parallel=2, num_layers_in_last_pipeline_stage=2,
                        account_for_loss_in_pipeline_split=True)


def test_a_layout_must_fit_the_grid_and_the_workload():
    with pytest.raises(ConfigError, match="4 model chunks"):
        ParallelismSpec(pipeline_parallel=2, pipeline_model_parallel_layout="Et|tt|tt|tL")
    with pytest.raises(ConfigError, match="the layout places every layer itself"):
        ParallelismSpec(pipeline_parallel=2, account_for_loss_in_pipeline_split=True,
                        pipeline_model_parallel_layout="Ettt|tttL")
    par = {"pipeline_parallel": 2, "data_parallel": 4,
           "pipeline_model_parallel_layout": "Ettt|tttmL"}
    with pytest.raises(ConfigError, match=r"6 decoder layer\(s\) .* and 1 MTP depth\(s\)"):
        crossflow.predict(workload=_gpt(), system=H100, parallelism=par)


def test_a_layout_predicts_as_the_options_that_split_the_same_way():
    spec = _gpt(num_layers=14)
    base = {"tensor_parallel": 2, "pipeline_parallel": 4, "data_parallel": 2,
            "sequence_parallel": True}

    def predict(**options):
        return crossflow.predict(workload=spec, system=H100, parallelism=base | options)

    accounted = predict(account_for_embedding_in_pipeline_split=True,
                        account_for_loss_in_pipeline_split=True)
    laid_out = predict(pipeline_model_parallel_layout="Ettt|(tttt|)*2tttL")
    assert laid_out.time_s == pytest.approx(accounted.time_s, rel=1e-12)
    assert laid_out.memory_per_device_bytes == accounted.memory_per_device_bytes
    uneven = predict(num_layers_in_first_pipeline_stage=2, num_layers_in_last_pipeline_stage=2)
    assert uneven.time_s == pytest.approx(
        predict(pipeline_model_parallel_layout="Ett|t*5|t*5|ttL").time_s, rel=1e-12)
    # a lighter first stage holds fewer parameters and activations (2 layers against 3);
    # an odd split is priced as it is
    assert uneven.memory_per_device_bytes < accounted.memory_per_device_bytes
    act = [p.details["memory_breakdown"]["activations_bytes"] for p in (uneven, accounted)]
    assert act[0] == pytest.approx(act[1] * 2 / 3)
    lopsided = predict(pipeline_model_parallel_layout="Et|t*11|t|tL")
    assert lopsided.time_s > accounted.time_s


def test_a_workload_file_with_mtp_and_a_layout_predicts_from_the_command_line(tmp_path, cli):
    spec = _gpt(num_layers=6, mtp_num_layers=1).model_dump(exclude_none=True)
    work = tmp_path / "gpt-mtp.yaml"
    work.write_text(yaml.safe_dump(spec))
    par = tmp_path / "layout.yaml"
    par.write_text(yaml.safe_dump({"tensor_parallel": 2, "pipeline_parallel": 2,
                                   "data_parallel": 2, "sequence_parallel": True,
                                   "pipeline_model_parallel_layout": "Ettt|tttmL"}))
    code, out, err = cli("predict", "--workload", work, "--system", H100, "--parallelism", par)
    assert code == 0, out + err
    par.write_text(yaml.safe_dump({"pipeline_parallel": 2, "data_parallel": 4,
                                   "pipeline_model_parallel_layout": "Ettt|tttL"}))
    code, out, err = cli("predict", "--workload", work, "--system", H100, "--parallelism", par)
    assert code == 2 and f"{par}: key 'pipeline_model_parallel_layout'" in err
    assert "0 MTP depth(s) (m); the workload has num_layers 6 and mtp_num_layers 1" in err


def test_nemotron_3_5_lightning_is_nano_with_two_mtp_depths_and_its_run_is_held_out():
    lightning = load_spec("nemotron-3.5-lightning", "workloads")
    nano = load_spec("nemotron-3-nano", "workloads")
    assert lightning.hybrid_override_pattern == nano.hybrid_override_pattern
    assert (lightning.mtp_num_layers, lightning.mtp_use_repeated_layer,
            lightning.mtp_hybrid_override_pattern) == (2, True, "*E")
    rows = [r for r in mb._blackwell_rows("GB200", moe=True)
            if r["model_key"] in ("nemotron_3_5_lightning", "nemotron_3_nano")
            and r["release"] in ("26.08", "26.06.01")]
    system = mb.BLACKWELL["GB200"][1]
    got = {r["model_key"]: mb.predict_row(r, system)[0] / float(r["tokens_per_s_per_gpu"])
           for r in rows}
    assert set(got) == {"nemotron_3_5_lightning", "nemotron_3_nano"}
    # the two MTP depths cost Lightning 16-18 % of Nano's throughput, predicted as measured
    assert abs(got["nemotron_3_5_lightning"] - 1) < 0.10  # -4.3 % when written
    assert abs(got["nemotron_3_5_lightning"] - got["nemotron_3_nano"]) < 0.05


def test_deepseek_v3_rows_run_the_recipes_layout_with_its_mtp_depth():
    rows = [r for r in mb._blackwell_rows("GB200", moe=True) if r["model_key"] == "deepseek_v3"]
    labelled = {r["model"]: mb.case(r) for r in rows}
    spec, par = labelled["DeepSeekV3"]
    assert spec.mtp_num_layers == 1 and spec.num_layers == 61
    assert par["pipeline_model_parallel_layout"] == "Etttt|(tttt|)*14tmL"
    spec, par = labelled["DeepSeekV3 (w/o MTP)"]
    assert spec.mtp_num_layers == 0 and "m" not in par["pipeline_model_parallel_layout"]
