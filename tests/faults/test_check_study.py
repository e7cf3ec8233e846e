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


def test_check_reports_every_error_and_run_says_how_many_more(tmp_path, monkeypatch, cli):
    """Several errors in one study file: check names each, one paragraph apiece (the
    schema's, then the study's own: an unknown sampler option and a precision the chip
    lacks); run refuses on the first and says how many more check would list."""
    monkeypatch.chdir(tmp_path)
    Path("s.yaml").write_text(BASE.replace("n_trials: 3", "n_trials: 0")
                              + "seed: -1\nobjectives: [iteration_time_s, speed]\n")
    code, _, err = cli("check", "s.yaml")
    assert code == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert [line.split("key ")[1].split(" =")[0] for line in lines] == [
        "'objectives[1]'", "'seed'", "'n_trials'"], err
    assert all(line.startswith("crossflow: error: s.yaml: ") for line in lines), err
    code, _, err = cli("study", "run", "s.yaml", "--no-tracking", "--quiet")
    assert code == 2
    _paragraph(err)
    assert "objectives[1]" in err and "(2 more errors in this input: crossflow check " \
        "s.yaml lists them all)" in err
    # once the schema holds: the study's independent checks, all of them
    Path("s.yaml").write_text(BASE.replace("gemm-8192", "{kind: gemm, m: 64, k: 64, n: 64, "
                                                       "precision: bf16}")
                              + "sampler: tpe\nsampler_options: {n_startup: 3}\n")
    code, _, err = cli("check", "s.yaml")
    assert code == 2 and len(err.strip().splitlines()) == 2, err
    assert "sampler_options.n_startup" in err and "no bf16 arithmetic" in err
    # a study that cannot be resolved still has its sampler's options checked
    Path("s.yaml").write_text(BASE.replace("deepflow-case-study", "a100-sxm4-80gb")
                              + "overrides: {logic_node: N7}\nsampler_options: {n_startup: 3}\n")
    code, _, err = cli("check", "s.yaml")
    assert code == 2 and len(err.strip().splitlines()) == 2, err
    assert "overrides apply to an architecture template" in err
    assert "sampler_options.n_startup" in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["s.yaml"]


def test_a_value_of_neither_type_a_key_takes_is_one_error_at_that_key(tmp_path, monkeypatch,
                                                                      cli):
    """'workload' takes a name or a mapping: a number is one error at 'workload', not one
    per type at 'workload.str' and 'workload.dict[str,any]'."""
    monkeypatch.chdir(tmp_path)
    Path("s.yaml").write_text(BASE.replace("workload: gemm-8192", "workload: 5"))
    code, _, err = cli("check", "s.yaml")
    assert code == 2
    _paragraph(err)
    assert "key 'workload' = 5: must be a valid string or a valid dictionary" in err, err
