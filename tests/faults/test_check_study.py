"""``crossflow check study.yaml`` validates what ``study run`` will use: the sampler's
options (names and types, against its constructor), the overrides' types, the seed, and a
system whose device is a file outside the presets (loaded) — and creates nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

BASE = """\
kind: study
name: s1
workload: gemm-8192
hardware: deepflow-case-study
search_space: quickstart
n_trials: 3
"""
CASES = {
    "unknown sampler option": ("sampler: tpe\nsampler_options: {n_startup: 3}\n",
                               ["sampler_options.n_startup", "not an option of the tpe",
                                "n_startup_trials"]),
    "sampler option of the wrong type": ("sampler: tpe\nsampler_options: "
                                         "{n_startup_trials: many}\n",
                                         ["sampler_options.n_startup_trials", "wrong type",
                                          "int"]),
    "driver option of the wrong type": ("sampler: structured\nsampler_options: "
                                        "{top_k: 1.5}\n",
                                        ["sampler_options.top_k", "wrong type"]),
    "sampler options not a mapping": ("sampler: random\nsampler_options: [1, 2]\n",
                                      ["sampler_options"]),
    "override not a mapping": ("overrides: {area_fractions: 0.5}\n",
                               ["overrides.area_fractions", "must be a mapping"]),
    "override of the wrong type": ("overrides: {tdp_W: lots}\n",
                                   ["overrides.tdp_W", "must be a number"]),
    "override memory not a mapping": ("overrides: {memory: 3}\n",
                                      ["overrides.memory", "must be a mapping"]),
    "override node not a name": ("overrides: {logic_node: 5}\n",
                                 ["overrides.logic_node", "technology name"]),
    "negative seed": ("seed: -1\n", ["seed"]),
}


def _paragraph(err: str) -> None:
    assert err.startswith("crossflow: error: ") and "Traceback" not in err, err
    assert err.strip().count("\n") == 0, err


@pytest.mark.parametrize("case", list(CASES))
def test_check_reports_what_run_would_choke_on(case, tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    extra, said = CASES[case]
    Path("s.yaml").write_text(BASE + extra)
    code, out, err = cli("check", "s.yaml")
    assert code == 2, (out, err)
    _paragraph(err)
    assert err.startswith("crossflow: error: s.yaml")
    for text in said:
        assert text in err, (text, err)
    # and run refuses the same, before anything is created
    code, _, err = cli("study", "run", "s.yaml", "--no-tracking", "--quiet")
    assert code == 2
    _paragraph(err)
    assert said[0] in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["s.yaml"]


def test_a_system_device_outside_the_presets_is_loaded(tmp_path, monkeypatch, cli):
    """A study without 'hardware' runs on its system's device: a path there is loaded by
    check, so a broken device file is reported now, naming it."""
    monkeypatch.chdir(tmp_path)
    from crossflow.config.base import read_yaml
    from crossflow.config.loader import load_spec

    system = read_yaml(load_spec("deepflow-case-study-512", "systems").source_file)
    device = read_yaml(load_spec("deepflow-case-study", "templates", "hardware").source_file)
    Path("dev.yaml").write_text(__import__("yaml").safe_dump(device))
    system["device"] = "dev.yaml"
    Path("sys.yaml").write_text(__import__("yaml").safe_dump(system))
    Path("s.yaml").write_text(
        "kind: study\nname: s2\nworkload: gemm-64k\nsystem: sys.yaml\n"
        "search_space: budgets-parallelism\nn_trials: 3\n")
    code, out, err = cli("check", "s.yaml")
    assert code == 0, err
    assert "s.yaml: ok (study)" in out
    broken = dict(device)
    broken["tdp_W"] = "hot"
    Path("dev.yaml").write_text(__import__("yaml").safe_dump(broken))
    code, _, err = cli("check", "s.yaml")
    assert code == 2
    _paragraph(err)
    assert "tdp_W" in err
    Path("dev.yaml").unlink()
    code, _, err = cli("check", "s.yaml")
    assert code == 2
    _paragraph(err)
    assert "dev.yaml" in err and "not found" in err
    assert not Path("mlruns").exists()
