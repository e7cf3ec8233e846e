"""``crossflow calibrate cpu``'s outputs: only regular files or new paths, checked before
anything is measured or written; the preset and its CSVs appear together or not at all."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import crossflow.calibrate as calibrate
from crossflow.calibrate import OutputFiles, calibrate_cpu, check_output
from crossflow.errors import ConfigError, CrossflowError


@pytest.fixture
def no_measuring(monkeypatch):
    """A refused output must be refused before the (seconds-long) measurement starts."""

    def measure(**_kw):
        raise AssertionError("measured although the output is unusable")

    monkeypatch.setattr(calibrate, "measure", measure)


def _refused(cli, output, *fragments, shown=None):
    code, out, err = cli("calibrate", "cpu", "--output", output, "--quick")
    assert code == 2, (out, err)
    assert "--output" in err and str(shown or output) in err
    for fragment in fragments:
        assert fragment in err
    assert err.count("\n") == 1  # one paragraph
    return err


def test_a_fifo_is_refused_without_blocking_on_it(tmp_path, cli, no_measuring):
    fifo = tmp_path / "preset.yaml"
    os.mkfifo(fifo)
    _refused(cli, fifo, "FIFO")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preset.yaml"]  # no CSV beside it


def test_a_character_device_is_refused(cli, no_measuring):
    _refused(cli, "/dev/null", "character device")
    assert not Path("/dev/numpy_gemm_null.csv").exists()


def test_a_directory_where_a_file_goes_is_refused(tmp_path, cli, no_measuring):
    # the output itself may be a folder (the preset is named after the machine), but a CSV
    # path beside the preset that is a directory cannot be replaced by a file
    (tmp_path / "numpy_gemm_mine.csv").mkdir()
    err = _refused(cli, tmp_path / "mine.yaml", "a directory",
                   shown=tmp_path / "numpy_gemm_mine.csv")
    assert "GEMM CSV" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["numpy_gemm_mine.csv"]


def test_a_folder_output_whose_preset_path_is_a_directory_is_refused(tmp_path, no_measuring):
    (tmp_path / f"{calibrate.machine().preset_name}.yaml").mkdir()
    with pytest.raises(ConfigError, match="is a directory") as info:
        calibrate_cpu(tmp_path, quick=True)
    assert info.value.key == "output"


def test_a_read_only_directory_is_refused(tmp_path, cli, no_measuring):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as a user (root) that may write to a read-only directory")
        _refused(cli, folder / "preset.yaml", "not writable")
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


def test_a_path_under_a_regular_file_is_refused(tmp_path, cli, no_measuring):
    (tmp_path / "file").write_text("x")
    _refused(cli, tmp_path / "file" / "preset.yaml", "is not a directory")
    assert (tmp_path / "file").read_text() == "x"


def test_an_unwritable_place_is_refused_even_for_root(cli, no_measuring):
    # /proc takes no new files whoever asks: the temporary file cannot be created
    _refused(cli, "/proc/crossflow-calibrate-test/preset.yaml", "cannot")


def test_check_output_accepts_regular_and_new_files(tmp_path):
    existing = tmp_path / "old.yaml"
    existing.write_text("old")
    check_output(existing, "--output")
    check_output(tmp_path / "new" / "deeper" / "x.yaml", "--output")
    with pytest.raises(ConfigError, match="key '--output': /dev/null"):
        check_output(Path("/dev/null"), "--output")


def test_output_files_replace_together_or_not_at_all(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.csv"
    a.write_text("old a")
    with pytest.raises(RuntimeError), OutputFiles([(a, "--output", "a"), (b, "--output", "b")]) \
            as files:
        files.temp(a).write_text("new a")
        files.temp(b).write_text("new b")
        raise RuntimeError("the measurement failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml"]  # no temporary left
    assert a.read_text() == "old a"
    with OutputFiles([(a, "--output", "a"), (b, "--output", "b")]) as files:
        files.temp(a).write_text("new a")
        files.temp(b).write_text("new b")
        assert a.read_text() == "old a" and not b.exists()  # nothing until commit
        files.commit()
    assert (a.read_text(), b.read_text()) == ("new a", "new b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml", "b.csv"]
    assert stat.S_IMODE(os.stat(b).st_mode) == 0o644


def test_a_failed_measurement_leaves_the_old_preset(tmp_path, monkeypatch):
    old = tmp_path / "mine.yaml"
    old.write_text("kind: microarch\n")

    def measure(**_kw):
        raise CrossflowError("cannot tell this CPU's clock")

    monkeypatch.setattr(calibrate, "measure", measure)
    with pytest.raises(CrossflowError, match="clock"):
        calibrate_cpu(old, quick=True)
    assert old.read_text() == "kind: microarch\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml"]


@pytest.mark.parametrize("existing", ["numpy_gemm_mine.csv", "stream_mine.csv", "mine.yaml"])
def test_an_existing_file_is_replaced_only_with_force(tmp_path, cli, no_measuring, existing):
    """(issue 21, finding 24) The CSVs beside the preset are replaced no more silently than
    the preset: without --force any of the three that exists is refused, before measuring,
    naming it and --force; nothing is touched."""
    (tmp_path / existing).write_text("mine\n")
    err = _refused(cli, tmp_path / "mine.yaml", "would be replaced", "--force",
                   str(tmp_path / existing))
    assert (tmp_path / existing).read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing], err


def test_calibrate_cpu_with_force_goes_on_to_measure(tmp_path, cli, monkeypatch):
    for name in ("mine.yaml", "numpy_gemm_mine.csv", "stream_mine.csv"):
        (tmp_path / name).write_text("old\n")
    seen = []

    def measure(**_kw):
        seen.append(True)
        raise CrossflowError("stop after the check")

    monkeypatch.setattr(calibrate, "measure", measure)
    code, _, err = cli("calibrate", "cpu", "--output", tmp_path / "mine.yaml", "--quick",
                       "--force")
    assert seen and code == 2 and "stop after the check" in err
