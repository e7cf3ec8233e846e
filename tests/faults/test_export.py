"""``study best --export``: every file of one export is written together or not at all, the
destination is checked before anything is written, and no file that exists — the named one
or a side file never named on the command line — is replaced without ``--force``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from crossflow.errors import ConfigError
from crossflow.search.study import best_design, export_design, load_study, open_study


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    """quickstart run for a few trials in a folder of its own (journal storage)."""
    from crossflow.cli import main

    folder = tmp_path_factory.mktemp("export")
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        assert main(["study", "run", "quickstart", "--trials", "6", "--no-tracking",
                     "--quiet"]) == 0
    finally:
        os.chdir(cwd)
    return folder


@pytest.fixture
def here(study_dir, monkeypatch):
    monkeypatch.chdir(study_dir)
    for p in study_dir.iterdir():  # what an earlier test exported
        if p.is_file() and p.suffix == ".yaml":
            p.unlink()
    return study_dir


def _paragraph(err: str) -> None:
    assert err.startswith("crossflow: error: ") and "Traceback" not in err, err
    assert err.strip().count("\n") == 0, err


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_side_file_that_exists_is_not_replaced_without_force(here, cli):
    side = here / "mine.hardware.yaml"
    side.write_text("# my own hardware file\n")
    code, _, err = cli("study", "best", "quickstart", "--export", "mine.yaml")
    assert code == 2
    _paragraph(err)
    assert "--export" in err and "mine.hardware.yaml" in err and "--force" in err
    assert side.read_text() == "# my own hardware file\n"      # untouched
    assert not (here / "mine.yaml").exists() and not _leftovers(here)
    code, out, err = cli("study", "best", "quickstart", "--export", "mine.yaml", "--force")
    assert code == 0, err
    assert yaml.safe_load(side.read_text())["kind"] == "architecture"
    assert yaml.safe_load((here / "mine.yaml").read_text())["files"] == {
        "hardware": "mine.hardware.yaml"}


def test_a_second_export_lists_every_file_that_exists(here, cli):
    assert cli("study", "best", "quickstart", "--export", "d.yaml")[0] == 0
    before = {p: p.read_bytes() for p in (here / "d.yaml", here / "d.hardware.yaml")}
    code, _, err = cli("study", "best", "quickstart", "--export", "d.yaml")
    assert code == 2
    _paragraph(err)
    assert "d.yaml" in err and "d.hardware.yaml" in err and "these files exist" in err
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.parametrize("case", ["directory", "device", "under a file", "side directory"])
def test_a_destination_that_cannot_take_a_file_is_refused_before_writing(here, cli, case):
    if case == "directory":
        (here / "folder.yaml").mkdir(exist_ok=True)
        target, why = "folder.yaml", "is a directory"
    elif case == "device":
        target, why = "/dev/null", "is a character device"
    elif case == "under a file":
        (here / "plain").write_text("x")
        target, why = "plain/d.yaml", "is not a directory"
    else:  # the named file is fine, its side file's path is a directory
        (here / "s.hardware.yaml").mkdir(exist_ok=True)
        target, why = "s.yaml", "is a directory"
    code, _, err = cli("study", "best", "quickstart", "--export", target, "--force")
    assert code == 2
    _paragraph(err)
    assert "--export" in err and why in err and "nothing was written" in err
    assert not (here / "s.yaml").exists() and not (here / "folder.hardware.yaml").exists()
    assert not (Path("/dev") / "null.hardware.yaml").exists()
    assert not _leftovers(here)


def test_a_failure_half_way_leaves_no_file(here, monkeypatch):
    """A write that fails after the first file (a full disk, say): nothing is left, not the
    side file, not a temporary file; an existing export stays as it was."""
    setup = load_study("quickstart")
    study = open_study(setup, str(here / "mlruns/optuna/quickstart.journal"), create=False)
    design = best_design(setup, study)
    calls = {"n": 0}
    real = Path.write_text

    def full_disk(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(ConfigError, match="No space left on device.*nothing was written"):
        export_design(design, here / "x.yaml")
    monkeypatch.setattr(Path, "write_text", real)
    assert calls["n"] == 2
    assert not (here / "x.yaml").exists() and not (here / "x.hardware.yaml").exists()
    assert not _leftovers(here)
    written = export_design(design, here / "x.yaml")
    assert set(written) == {"hardware", "design"} and all(p.is_file() for p in written.values())


@pytest.mark.parametrize("target", ["file", "/dev/null", "under a file"])
def test_report_out_that_is_not_a_folder_is_refused_before_any_work(tmp_path, cli, target):
    (tmp_path / "plain").write_text("x")
    out = {"file": tmp_path / "plain", "/dev/null": Path("/dev/null"),
           "under a file": tmp_path / "plain" / "r"}[target]
    code, _, err = cli("report", "fig1-gemm-64k", "--quick", "--out", str(out))
    assert code == 2
    _paragraph(err)
    assert "--out" in err and str(out) in err and "nothing was written" in err
    assert (tmp_path / "plain").read_text() == "x"


@pytest.mark.parametrize("failing", ["x.hardware.yaml", "x.yaml"])
def test_a_failed_write_names_the_file_that_failed(here, monkeypatch, failing):
    """(issue 21, finding 24) The message names the file whose write failed — a side file
    as such — not always the design file."""
    setup = load_study("quickstart")
    study = open_study(setup, str(here / "mlruns/optuna/quickstart.journal"), create=False)
    design = best_design(setup, study)
    real = Path.write_text

    def full_disk(self, *args, **kwargs):
        if self.name.startswith(f".{failing}."):  # the temporary file beside it
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(ConfigError) as info:
        export_design(design, here / "x.yaml")
    text = str(info.value)
    assert f"{here / failing} (" in text and "No space left on device" in text, text
    if failing == "x.hardware.yaml":
        assert "the design's hardware" in text and f"{here / 'x.yaml'} (" not in text, text
    assert not (here / "x.yaml").exists() and not (here / "x.hardware.yaml").exists()
    assert not _leftovers(here)
