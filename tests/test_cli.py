"""The command line and the Python facade, end to end."""

from __future__ import annotations

import json
import math

import pytest

import crossflow
from crossflow.config.loader import preset_dir


def test_predict_json_has_the_public_keys(cli):
    code, out, _ = cli("predict", "--hardware", "a100-sxm4-80gb", "--workload", "gemm-8192",
                       "--json")
    assert code == 0
    d = json.loads(out)
    for key in ("time_s", "feasible", "memory_per_device_bytes", "bottleneck", "breakdown",
                "bytes_per_level", "time_per_level_s", "microarch"):
        assert key in d
    assert d["feasible"] is True
    assert set(d["bytes_per_level"]) == {"registers", "L1", "L2", "DRAM"}
    # the breakdown's largest term is the time (plus launch)
    assert d["time_s"] == pytest.approx(
        max(v for k, v in d["breakdown"].items() if k != "launch_s") + d["breakdown"]["launch_s"])


def test_predict_on_a_template_shows_the_generated_microarch(cli):
    path = preset_dir("templates") / "deepflow-case-study.yaml"
    code, out, _ = cli("predict", "--hardware", path, "--workload", "gemm-8192", "--json")
    assert code == 0
    arch = json.loads(out)["microarch"]
    assert arch["report"]["source"] == "age"
    assert arch["peak_flops_per_s"]["fp16"] > 0
    assert "components" in arch["report"]


def test_a_gemm_larger_than_memory_is_infeasible_exit_3(cli):
    code, out, _ = cli("predict", "--hardware", "deepflow-case-study", "--workload", "gemm-64k")
    assert code == 3
    assert "INFEASIBLE" in out and "holds" in out


def test_python_facade_matches_the_cli(cli):
    p = crossflow.predict(workload="gemm-8192", hardware="a100-sxm4-80gb")
    code, out, _ = cli("predict", "--hardware", "a100-sxm4-80gb", "--workload", "gemm-8192",
                       "--json")
    assert json.loads(out)["time_s"] == pytest.approx(p.time_s)
    assert p.to_dict()["feasible"] is True


def test_infeasible_prediction_serialises_without_infinity():
    p = crossflow.predict(workload="gemm-64k", hardware="deepflow-case-study")
    assert not p.feasible and math.isinf(p.time_s)
    assert p.to_dict()["time_s"] is None
    json.dumps(p.to_dict(), allow_nan=False)


def test_distributed_options_on_a_single_gemm_are_rejected(cli):
    code, _, err = cli("predict", "--hardware", "a100-sxm4-80gb", "--workload", "gemm-8192",
                       "--mapping-order", "best")
    assert code == 2 and "--parallelism" in err


def test_every_shipped_yaml_passes_check(cli):
    files = sorted(p for fam in ("hardware", "templates", "tech", "workloads")
                   for p in preset_dir(fam).glob("*.yaml"))
    code, out, err = cli("check", *files)
    assert code == 0, err
    assert out.count(": ok (") == len(files)


def test_human_output_names_the_bottleneck(cli):
    code, out, _ = cli("predict", "--hardware", "h100-sxm5-80gb", "--workload", "gemm-8192")
    assert code == 0 and "bottleneck" in out and "TFLOP/s" in out


def test_a_design_over_memory_lists_the_options_that_make_it_fit(cli):
    """Llama 3 70B at t4 p4 c2 (NeMo's published setting without its distributed optimizer)
    is refused for memory; predict lists what would fit, each verified by the model."""
    args = ("predict", "--workload", "llama3-70b", "--system", "dgx-h100-megatron-core",
            "--parallelism", "t4-p4-d4-v5-sp-c2")
    code, out, _ = cli(*args)
    assert code == 3 and "INFEASIBLE: memory per device" in out
    assert "fits with" in out and "use_distributed_optimizer: true" in out
    code, out, _ = cli(*args, "--json")
    fits = json.loads(out)["fits_with"]
    assert {"use_distributed_optimizer": True} in [f["options"] for f in fits]
    assert {"use_megatron_fsdp": True} in [f["options"] for f in fits]
    for f in fits:
        p = crossflow.predict(workload="llama3-70b", system="dgx-h100-megatron-core",
                              parallelism={"tensor_parallel": 4, "pipeline_parallel": 4,
                                           "data_parallel": 2, "context_parallel": 2,
                                           "virtual_pipeline_stages": 5,
                                           "sequence_parallel": True, **f["options"]})
        assert p.feasible and p.time_s == pytest.approx(f["time_s"])
        assert p.memory_per_device_bytes == f["memory_per_device_bytes"] <= 80e9
    code, out, _ = cli("predict", "--workload", "gemm-64k", "--hardware", "v100-sxm2-32gb",
                       "--json")
    assert "fits_with" not in json.loads(out)


def test_a_design_no_single_option_fits_gets_a_sharding_with_a_recomputation(cli):
    """Llama 3 70B whole on each of 64 H100s: no option alone fits it; Megatron-FSDP with
    full recomputation does (the weights, gradients and optimizer state sharded 64 ways)."""
    code, out, _ = cli("predict", "--workload", "llama3-70b", "--system",
                       "dgx-h100-megatron-core", "--parallelism", "{data_parallel: 64}",
                       "--json")
    assert code == 3
    fits = [f["options"] for f in json.loads(out)["fits_with"]]
    assert fits == [{"use_megatron_fsdp": True, "recompute_granularity": "full"}]


def test_the_fastest_fix_runs_as_printed(cli, tmp_path):
    """The line after the options says how to pass the fastest one; given back inline as it
    says, the design fits (an inline mapping takes the strategy name and its degrees)."""
    base = ("predict", "--workload", "llama3-70b", "--system", "dgx-h100-megatron-core",
            "--parallelism")
    code, out, _ = cli(*base, "t4-p4-d4-v5-sp-c2")
    line = out.splitlines()[-1]
    assert code == 3 and line == ("  to use the fastest: --parallelism '{strategy: "
                                  "t4-p4-d4-v5-sp-c2, use_distributed_optimizer: true}'")
    code, out, _ = cli(*base, line.split("--parallelism ")[1].strip("'"))
    assert code == 0 and "strategy      t4-d4-p4-v5-sp-c2" in out
    # from a file (its strategy name with the same degrees): the option goes into it
    path = tmp_path / "par.yaml"
    path.write_text("strategy: t4-p4-d4-v5-sp-c2\n")
    code, out, _ = cli(*base, str(path))
    assert out.splitlines()[-1] == (f"  to use the fastest: add `use_distributed_optimizer: "
                                    f"true` to {path}")
    # an inline value that is not a mapping, or a strategy that is none, names the key
    code, _, err = cli(*base, "{t4-p4")
    assert code == 2 and "key 'parallelism'" in err and "malformed YAML" in err
    code, _, err = cli(*base, "{strategy: x4-e2}")
    assert code == 2 and "key 'strategy' = 'x4-e2': not a strategy name" in err
    # a file's strategy name carries the same degrees; one given twice, differently, is
    # refused
    path.write_text("strategy: t4-p4-d4-v5-sp-c2\ncontext_parallel: 4\n")
    code, _, err = cli(*base, str(path))
    assert code == 2 and "gives context_parallel other than the key does" in err


def test_the_fix_line_of_a_preset_gives_its_keys_inline():
    """A preset name is no strategy name: the line spells out the preset's keys, and what it
    prints reads back as the preset with the option added."""
    from crossflow.cli.commands import _with_options
    from crossflow.parallel import parse_parallelism

    line = _with_options("gpt3-175b-t8-p8-d24-v3-sp", {"use_distributed_optimizer": True})
    assert line.startswith("--parallelism '{tensor_parallel: 8, ")
    got = parse_parallelism(line.split(" ", 1)[1].strip("'"))
    preset = parse_parallelism("gpt3-175b-t8-p8-d24-v3-sp")
    assert got.model_dump(exclude={"name"}) == {
        **preset.model_dump(exclude={"name"}), "use_distributed_optimizer": True}
