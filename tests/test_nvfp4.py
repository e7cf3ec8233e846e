"""NVFP4 training (Transformer Engine's 4-bit recipe, Megatron-LM's ``--fp4-format e2m1``):
the Linear GEMMs at the FP4 peak, the recipe's quantization passes, the memory it saves,
Blackwell's FP4 peaks, and the published GB200 runs it is checked on."""

from __future__ import annotations

import pytest
import yaml

import crossflow
from crossflow.arch.microarch import BYTES_PER_ELEMENT
from crossflow.config.loader import load_spec
from crossflow.config.workload import TransformerSpec
from crossflow.errors import ConfigError
from crossflow.kernels.gemm import gemm
from crossflow.predict import load_hardware
from crossflow.validation import megatron_bridge as mb
from crossflow.workloads import transformer_graph

GB200 = "gb200-nvl72-megatron-core"


def _spec(precision: str = "fp4", **kw) -> TransformerSpec:
    base = dict(kind="transformer", num_layers=2, hidden_size=4096, num_attention_heads=32,
                num_query_groups=8, ffn_hidden_size=14336, gated_linear_unit=True,
                seq_length=4096, vocab_size=32000, global_batch_size=8, precision=precision)
    return TransformerSpec(**{**base, **kw})


def test_an_nvfp4_element_moves_half_a_byte_and_its_share_of_the_block_scale():
    assert BYTES_PER_ELEMENT["fp4"] == 0.5 + 1 / 16  # E2M1 + one E4M3 scale per 16


def test_blackwell_runs_fp4_gemms_at_twice_the_fp8_rate_and_hopper_refuses_them():
    gb200 = load_hardware("gb200-186gb")
    assert gb200.peak_flops["fp4"] == 2 * gb200.peak_flops["fp8"]
    fp8, fp4 = (gemm(gb200, 8192, 8192, 8192, p).time_s for p in ("fp8", "fp4"))
    assert 0.45 * fp8 < fp4 < 0.7 * fp8
    with pytest.raises(ConfigError, match="h100-sxm5-80gb has no fp4 arithmetic"):
        gemm(load_hardware("h100-sxm5-80gb"), 128, 128, 128, "fp4")


def test_nvfp4_quantizes_the_norm_outputs_too_reading_twice_and_writing_two_copies():
    g4, g8 = transformer_graph(_spec("fp4")), transformer_graph(_spec("fp8"))
    assert g4.nodes["L0.qkv"]["precision"] == "fp4" and g4.nodes["L0.qk"]["precision"] == "bf16"
    casts = {n: a for n, a in g4.nodes(data=True) if a["name"] == "fp4_cast"}
    # FP8's layernorm writes the quantized tensor itself; NVFP4's cannot (TE's unfused path)
    assert {"L0.ln1_cast", "L0.ln2_cast", "L0.proj_cast", "L0.qkv.dY_cast"} <= set(casts)
    assert not any(n.endswith(("ln1_cast", "ln2_cast")) for n in g8)
    a = casts["L0.proj_cast"]
    b4 = BYTES_PER_ELEMENT["fp4"]
    # the amax pass and the quantization each read the bf16 tensor; rows and columns written
    assert a["inputs"] * b4 == pytest.approx(2 * 2) and a["outputs"] == 2
    assert g4.has_edge("L0.ln1_cast", "L0.qkv") and g4.has_edge("L0.ln2_cast", "L0.mlp1")
    fp8_cast = g8.nodes["L0.proj_cast"]
    assert fp8_cast["inputs"] * BYTES_PER_ELEMENT["fp8"] == 2 and fp8_cast["outputs"] == 1


def test_nvfp4_is_faster_than_fp8_on_gb200_but_not_twice_and_keeps_fewer_bytes():
    par = {"tensor_parallel": 2, "data_parallel": 4, "sequence_parallel": True,
           "use_distributed_optimizer": True}
    big = dict(num_layers=8, hidden_size=8192, num_attention_heads=64, ffn_hidden_size=28672,
               seq_length=8192, global_batch_size=16, attention_backend="flash")
    p8, p4 = (crossflow.predict(workload=_spec(p, **big), system=GB200, parallelism=par)
              for p in ("fp8", "fp4"))
    assert p4.breakdown["compute_s"] < 0.7 * p8.breakdown["compute_s"]
    assert p4.breakdown["memory_bound_s"] > p8.breakdown["memory_bound_s"]  # the passes
    assert 0.5 * p8.time_s < p4.time_s < 0.9 * p8.time_s  # 0.82 when written
    assert p4.memory_per_device_bytes < p8.memory_per_device_bytes  # saved GEMM inputs


def test_an_fp4_workload_on_hopper_is_refused_naming_the_precision(tmp_path, cli):
    spec = load_spec("llama3-8b", "workloads").model_dump(exclude_none=True)
    path = tmp_path / "llama3-8b-nvfp4.yaml"
    path.write_text(yaml.safe_dump({**spec, "precision": "fp4", "num_layers": 2}))
    # refused before any pricing: a strategy that would not fit in memory either is not
    # reported as a memory problem (exit 3) but as the precision the device lacks
    for strategy in ("{strategy: t8, recompute_granularity: full}", "d8"):
        code, out, err = cli("predict", "--workload", path, "--system",
                             "dgx-h100-megatron-core", "--parallelism", strategy)
        assert code == 2, out + err
        assert f"{path}: key 'precision' = 'fp4'" in err and "no fp4 arithmetic" in err
        assert "allowed: fp64, fp32, tf32, fp16, bf16, fp8" in err


def test_the_published_gb200_nvfp4_runs_are_held_out_and_within_their_tolerance():
    rows = mb._blackwell_rows("GB200", moe=False, nvfp4=True)
    assert len(rows) == 9 and {r["precision"] for r in rows} == {"NVFP4"}
    assert not any(r["precision"] == "NVFP4" for r in mb.blackwell_fit_rows())
    ds = mb.blackwell_dataset("GB200", nvfp4=True)
    assert "held out" in ds.name and ds.passed
    assert ds.mape < 0.15  # 10.7 % when written; the earliest releases are the slowest


def test_first_last_layers_bf16_prices_those_layers_at_bf16_on_their_stages():
    from crossflow.sim.training import BF16_MARK, layer_kinds

    big = dict(num_layers=8, hidden_size=8192, num_attention_heads=64, ffn_hidden_size=28672,
               seq_length=8192, global_batch_size=16, attention_backend="flash")
    keep = dict(first_last_layers_bf16=True, num_layers_at_start_in_bf16=1,
                num_layers_at_end_in_bf16=2)
    spec = _spec("fp4", **big, **keep)
    assert spec.bf16_layers == (True, False, False, False, False, False, True, True)
    assert layer_kinds(spec) == ("*-" + BF16_MARK,) + ("*-",) * 5 + ("*-" + BF16_MARK,) * 2
    # without the flag Megatron's counts do nothing
    assert not any(_spec("fp4", **big, num_layers_at_end_in_bf16=3).bf16_layers)
    par = {"tensor_parallel": 2, "pipeline_parallel": 2, "data_parallel": 2,
           "sequence_parallel": True, "use_distributed_optimizer": True}
    fp4, mixed, bf16 = (crossflow.predict(workload=w, system=GB200, parallelism=par)
                        for w in (_spec("fp4", **big), spec, _spec("bf16", **big)))
    assert fp4.time_s < mixed.time_s < bf16.time_s
    assert fp4.memory_per_device_bytes < mixed.memory_per_device_bytes


@pytest.mark.parametrize("update, key", [
    ({"precision": "bf16"}, "first_last_layers_bf16"),
    ({"num_layers_at_start_in_bf16": 2, "num_layers_at_end_in_bf16": 7},
     "num_layers_at_end_in_bf16")])
def test_first_last_layers_bf16_is_refused_where_it_cannot_apply(update, key):
    base = dict(precision="fp8", first_last_layers_bf16=True) | update
    with pytest.raises(ConfigError) as info:
        _spec(**{"num_layers": 8, **base})
    assert info.value.key == key


def test_the_nemotron_3_super_nvfp4_runs_keep_their_last_14_layers_in_bf16():
    rows = [r for r in mb._blackwell_rows("GB200", moe=True) if r["precision"] == "NVFP4"]
    assert rows and {r["model_key"] for r in rows} == {"nemotron_3_super"}
    spec, _ = mb.case(rows[0])
    assert spec.precision == "fp4" and sum(spec.bf16_layers) == 14
    assert spec.bf16_layers[-14:] == (True,) * 14
