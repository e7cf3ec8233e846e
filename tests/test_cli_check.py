"""``crossflow check`` of a design exported by ``crossflow study best NAME --export``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

pytest.importorskip("optuna")


@pytest.fixture
def exported(tmp_path, monkeypatch, cli):
    """A tiny quickstart study run here and its best design exported to out/design.yaml."""
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("study", "run", "quickstart", "--trials", "4", "--no-tracking",
                       "--quiet")
    assert code == 0, err
    code, _, err = cli("study", "best", "quickstart", "--export", "out/design.yaml")
    assert code == 0, err
    return tmp_path / "out" / "design.yaml"


def test_an_export_passes_check(exported, cli):
    code, out, err = cli("check", "out/design.yaml")
    assert code == 0, err
    assert out.startswith("out/design.yaml: ok (design of study quickstart, trial ")
    assert "hardware out/design.hardware.yaml (architecture)" in out
    assert "workload gemm-8192 (gemm)" in out
    # the export's other file checks on its own, and the pair moved elsewhere still checks
    code, out, err = cli("check", "out/design.hardware.yaml")
    assert code == 0 and "ok (architecture)" in out, err
    moved = exported.parent.parent / "moved"
    shutil.copytree(exported.parent, moved)
    shutil.rmtree(exported.parent)
    code, out, err = cli("check", moved / "design.yaml")
    assert code == 0, err
    assert f"hardware {moved / 'design.hardware.yaml'}" in out


def test_a_distributed_export_passes_check(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("study", "run", "gemm-64k", "--trials", "6", "--no-tracking", "--quiet")
    assert code == 0, err
    code, _, err = cli("study", "best", "gemm-64k", "--export", "d.yaml")
    assert code == 0, err
    code, out, err = cli("check", "d.yaml")
    assert code == 0, err
    for part in ("hardware d.hardware.yaml (architecture)", "system deepflow-case-study-512",
                 "parallelism d.parallelism.yaml (parallelism)"):
        assert part in out


def _edit(path: Path, change) -> None:
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_a_broken_export_is_exit_2_with_a_clear_message(exported, cli):
    side = exported.with_name("design.hardware.yaml")
    original = side.read_text()
    side.unlink()
    code, out, err = cli("check", "out/design.yaml")
    assert code == 2 and not out
    assert "out/design.yaml: key 'files.hardware'" in err and "missing" in err

    side.write_text(original)
    _edit(side, lambda d: d.update(logic_node="N99"))
    code, _, err = cli("check", "out/design.yaml")
    assert code == 2
    assert "design.hardware.yaml: key 'logic_node' = 'N99'" in err and "N12" in err
    side.write_text(original)

    _edit(exported, lambda d: d["predict"].update(workload="no-such-workload"))
    code, _, err = cli("check", "out/design.yaml")
    assert code == 2
    assert "out/design.yaml: key 'predict.workload' = 'no-such-workload'" in err
    assert "gemm-8192" in err  # what is allowed

    _edit(exported, lambda d: d["predict"].update(workload="gemm-8192", mapping_order="kp1-xx"))
    code, _, err = cli("check", "out/design.yaml")
    assert code == 2 and "predict.mapping_order" in err

    _edit(exported, lambda d: (d["predict"].pop("mapping_order"),
                               d["predict"].update(hardwar="x")))
    code, _, err = cli("check", "out/design.yaml")
    assert code == 2 and "key 'predict.hardwar'" in err and "hardware" in err


def test_an_inline_part_is_checked_with_its_key_path(tmp_path, cli):
    doc = {"study": "s", "trial": 0,
           "predict": {"workload": {"kind": "gemm", "m": -8, "k": 8, "n": 8},
                       "hardware": "a100-sxm4-80gb"}}
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(doc))
    code, _, err = cli("check", tmp_path / "d.yaml")
    assert code == 2 and "key 'predict.workload.m' = -8" in err
    doc["predict"]["workload"]["m"] = 8
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(doc))
    code, out, err = cli("check", tmp_path / "d.yaml")
    assert code == 0, err
    assert "workload inline (gemm); hardware a100-sxm4-80gb (microarch)" in out
