"""The prediction facade's inputs and outputs as a new user meets them: the device a system
names, an explicit override of it, a strategy smaller than a fixed-shape system, and a GEMM's
utilisation and overlapping breakdown."""

from __future__ import annotations

import json

import pytest

import crossflow
from crossflow.config.loader import load_spec
from crossflow.errors import ConfigError
from crossflow.predict import GEMM_BREAKDOWN_OVERLAP, load_hardware

MODEL = "megatron-sc21-1.7b"  # one device by default: a fast transformer prediction


# --- the device a system names -------------------------------------------------------------


def test_a_system_alone_names_the_device():
    assert load_spec("dgx-a100", "systems").device == "a100-sxm4-80gb"
    implicit = crossflow.predict(workload=MODEL, system="dgx-a100")
    explicit = crossflow.predict(workload=MODEL, system="dgx-a100", hardware="a100-sxm4-80gb")
    assert implicit.feasible and implicit.hardware == "a100-sxm4-80gb"
    assert implicit.time_s == explicit.time_s
    assert not implicit.device_overrides_system and not explicit.device_overrides_system
    assert implicit.notes == ("device a100-sxm4-80gb from system dgx-a100",)
    assert explicit.notes == ()  # the system's own device, named: nothing to say
    d = implicit.to_dict()
    assert d["device_overrides_system"] is False and d["notes"] == list(implicit.notes)


def test_the_system_device_as_a_loaded_microarch_is_no_override():
    p = crossflow.predict(workload=MODEL, system="dgx-a100",
                          hardware=load_hardware("a100-sxm4-80gb"))
    assert not p.device_overrides_system and p.notes == ()


def test_cli_predict_with_system_only(cli):
    code, out, err = cli("predict", "--workload", MODEL, "--system", "dgx-a100")
    assert code == 0, err
    assert out.splitlines()[0] == f"{MODEL} on a100-sxm4-80gb"
    assert "note: device a100-sxm4-80gb from system dgx-a100" in out
    code, out, _ = cli("predict", "--workload", MODEL, "--system", "dgx-a100", "--json")
    d = json.loads(out)
    assert code == 0 and d["hardware"] == "a100-sxm4-80gb"
    assert d["device_overrides_system"] is False


def test_hardware_other_than_the_systems_device_is_an_explicit_override(cli):
    p = crossflow.predict(workload=MODEL, system="dgx-a100", hardware="h100-sxm5-80gb")
    base = crossflow.predict(workload=MODEL, system="dgx-a100")
    assert p.feasible and p.hardware == "h100-sxm5-80gb"
    assert p.device_overrides_system
    assert p.time_s < base.time_s  # it really ran on the H100
    (note,) = p.notes
    assert "h100-sxm5-80gb overrides" in note and "a100-sxm4-80gb" in note
    assert "dgx-a100" in note
    code, out, _ = cli("predict", "--workload", MODEL, "--system", "dgx-a100",
                       "--hardware", "h100-sxm5-80gb")
    assert code == 0
    assert f"note: {note}" in out
    code, out, _ = cli("predict", "--workload", MODEL, "--system", "dgx-a100",
                       "--hardware", "h100-sxm5-80gb", "--json")
    d = json.loads(out)
    assert d["device_overrides_system"] is True and d["notes"] == [note]


def _a100_copy(tmp_path, frequency: str | None = None):
    from crossflow.config.loader import preset_dir

    text = (preset_dir("hardware") / "a100-sxm4-80gb.yaml").read_text(encoding="utf-8")
    if frequency is not None:
        old = next(line for line in text.splitlines() if "frequency_GHz:" in line)
        text = text.replace(old, f"  frequency_GHz: {frequency}")
    path = tmp_path / "mine.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_file_with_the_systems_device_name_and_other_numbers_is_an_override(cli, tmp_path):
    """(issue 21, finding 24) The name alone does not make it the system's device: a file
    that keeps ``name: a100-sxm4-80gb`` with another clock gets the override note, naming
    the file and that its numbers differ."""
    mine = _a100_copy(tmp_path, frequency="2.5")
    p = crossflow.predict(workload=MODEL, system="dgx-a100", hardware=str(mine))
    assert p.hardware == "a100-sxm4-80gb" and p.device_overrides_system
    (note,) = p.notes
    assert str(mine) in note and "other numbers" in note and "dgx-a100" in note, note
    code, out, _ = cli("predict", "--workload", MODEL, "--system", "dgx-a100",
                       "--hardware", mine)
    assert code == 0 and f"note: {note}" in out


def test_a_copy_of_the_systems_device_file_is_no_override(tmp_path):
    p = crossflow.predict(workload=MODEL, system="dgx-a100", hardware=str(_a100_copy(tmp_path)))
    assert not p.device_overrides_system and p.notes == ()


def test_no_hardware_and_no_system_is_a_config_error(cli):
    with pytest.raises(ConfigError, match="no device to predict on"):
        crossflow.predict(workload="gemm-8192")
    code, _, err = cli("predict", "--workload", "gemm-8192")
    assert code == 2
    assert "--hardware" in err and "--system" in err
    assert len(err.strip().splitlines()) == 1  # one paragraph, no traceback


# --- a strategy smaller than a system of fixed shape ----------------------------------------


def test_a_small_strategy_on_the_512_torus_says_how_many_devices_it_uses(cli):
    code, _, err = cli("predict", "--hardware", "deepflow-case-study", "--workload", "gemm-64k",
                       "--system", "deepflow-case-study-512", "--parallelism", "gemm-rc-4-2")
    assert code == 2
    assert "key 'parallelism'" in err  # the strategy, not the shipped system file, is named
    assert "uses 8 of the 512 devices of system deepflow-case-study-512" in err
    assert "a strategy for all 512 devices" in err
    assert "num_nodes: 8" in err  # the other way out: a copy of the system for 8 devices
    assert "deepflow-case-study-512.yaml: key 'inter.dims'" not in err


# --- a GEMM's utilisation and breakdown ----------------------------------------------------


def test_gemm_json_has_model_flops_utilization(cli):
    code, out, _ = cli("predict", "--hardware", "a100-sxm4-80gb", "--workload", "gemm-8192",
                       "--json")
    assert code == 0
    d = json.loads(out)
    peak = d["microarch"]["peak_flops_per_s"]["fp16"]
    assert 0 < d["model_flops_utilization"] <= 1
    assert d["model_flops_utilization"] == pytest.approx(d["achieved_flops_per_s"] / peak)
    assert d["model_flops_utilization"] == pytest.approx(
        d["flops"] / (d["time_s"] * peak))


def test_gemm_breakdown_says_its_times_overlap(cli):
    p = crossflow.predict(workload="gemm-64k", hardware="a100-sxm4-80gb")
    # why the note is needed: the per-level times add up to far more than the total
    assert sum(p.breakdown.values()) > 1.5 * p.time_s
    assert p.details["breakdown_overlap"] == GEMM_BREAKDOWN_OVERLAP
    code, out, _ = cli("predict", "--hardware", "a100-sxm4-80gb", "--workload", "gemm-64k")
    assert code == 0
    assert "breakdown (roofline: compute and memory times overlap; total = slowest + launch)" \
        in out
    # a training iteration's breakdown adds up, and says nothing of overlap
    code, out, _ = cli("predict", "--workload", MODEL, "--system", "dgx-a100")
    assert "  breakdown:" in out and "overlap" not in out
