"""A study file that changed under an existing study: refused at run, show and best with
what changed and how to go on (a fingerprint of the resolved study is stored with it); and
an export always reproduces its trial's value."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from crossflow.search.study import fingerprint as fp
from crossflow.search.study import load_study, open_study, run_study

SHADOW = """\
kind: study
name: quickstart
description: a local study that shadows the shipped quickstart with another space
workload: gemm-8192
hardware: deepflow-case-study
search_space:
  simplexes:
    area: [core, registers, L1, L2]
    power: [core, registers, L1, L2, dram_ctrl]
  params:
    logic_node: [N7, N5]
    dram: [HBM2, HBM2e]
n_trials: 10
"""
JOURNAL = Path("mlruns/optuna/quickstart.journal")


def test_a_changed_study_file_is_refused_saying_what_changed(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("study", "run", "quickstart", "--trials", "4", "--no-tracking",
                       "--quiet")
    assert code == 0, err
    before = JOURNAL.read_bytes()
    Path("studies").mkdir()
    Path("studies/quickstart.yaml").write_text(SHADOW)
    for argv in (["run", "quickstart", "--no-tracking", "--quiet"], ["show", "quickstart"],
                 ["best", "quickstart", "--export", "d.yaml"]):
        code, out, err = cli("study", *argv)
        assert code == 2, (argv, out, err)
        assert err.startswith("crossflow: error: studies/quickstart.yaml") and \
            err.strip().count("\n") == 0 and "Traceback" not in err, err
        for said in ("dimension area.dram_ctrl removed", "dimension dram added",
                     "logic_node choices changed", "another 'name:'", "--storage",
                     "delete ", f"{JOURNAL} to start this one over"):
            assert said in err, (said, err)
    assert JOURNAL.read_bytes() == before           # nothing written to the old study
    assert not Path("d.yaml").exists()
    # a new name is a new study, beside the old one
    Path("studies/quickstart.yaml").write_text(SHADOW.replace("name: quickstart",
                                                              "name: quickstart-b"))
    Path("studies/quickstart-b.yaml").write_text(Path("studies/quickstart.yaml").read_text())
    Path("studies/quickstart.yaml").unlink()
    code, _, err = cli("study", "run", "quickstart-b", "--trials", "3", "--no-tracking",
                       "--quiet")
    assert code == 0, err
    assert cli("study", "show", "quickstart")[0] == 0  # the preset's study, as it was


def test_changes_name_every_part():
    setup = load_study("gemm-64k")
    old = fp.fingerprint(setup)
    assert fp.changes(old, fp.fingerprint(load_study("gemm-64k"))) == []
    new = json.loads(json.dumps(old))
    new["search_space"]["dimensions"]["strategy"] = ["RC-16-32-d1-p1"]
    new["workload"] = {"name": "gemm-8192", "digest": "0"}
    new["system"]["digest"] = "0"
    new["devices"] = 256
    new["mapping_order"] = "dp-lp-kp1-kp2"
    said = "; ".join(fp.changes(old, new))
    for part in ("search space: strategy choices changed", "workload: gemm-64k -> gemm-8192",
                 "has other contents", "devices: 512 -> 256", "mapping order"):
        assert part in said, said


def test_a_study_without_a_fingerprint_gets_one_silently(tmp_path, monkeypatch, capsys):
    """A study stored before fingerprints: its next launch stores one and says nothing."""
    setup = load_study("quickstart")
    storage = str(tmp_path / "q.journal")
    monkeypatch.setattr(fp, "check", lambda *a, **k: None)  # an older CrossFlow
    run_study(setup, n_trials=3, storage=storage, track=False, progress=False)
    monkeypatch.undo()
    assert fp.ATTR not in open_study(setup, storage, create=False).user_attrs
    result = run_study(setup, n_trials=5, storage=storage, track=False, progress=False)
    assert result.trials_run == 2
    assert "fingerprint" not in capsys.readouterr().err
    stored = open_study(setup, storage, create=False).user_attrs[fp.ATTR]
    assert stored == fp.fingerprint(setup)


@pytest.mark.parametrize("name", ["quickstart", "gemm-64k"])
def test_an_export_reproduces_its_trial(name, tmp_path, monkeypatch, cli):
    """The exported command predicts the trial's value (relative 1e-9)."""
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("study", "run", name, "--trials", "8", "--no-tracking", "--quiet")
    assert code == 0, err
    code, _, err = cli("study", "best", name, "--export", "out/d.yaml")
    assert code == 0, err
    design = yaml.safe_load(Path("out/d.yaml").read_text())
    argv = shlex.split(design["command"])
    assert argv[:2] == ["crossflow", "predict"]
    code, out, err = cli(*argv[1:], "--json")
    assert code == 0, err
    value = design["objectives"]["iteration_time_s"]
    assert json.loads(out)["time_s"] == pytest.approx(value, rel=1e-9)
    setup = load_study(name)
    study = open_study(setup, str(JOURNAL.parent / f"{name}.journal"), create=False)
    trial = next(t for t in study.trials if t.number == design["trial"])
    assert trial.values[0] == pytest.approx(value, rel=1e-9)
