"""Paths that are not config files: every one is a one-paragraph error (exit 2) that names
the path and says why — never a traceback, never a hang."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from crossflow import cli
from crossflow.search.workers import child_env


def _bad_paths(tmp_path):
    loop = tmp_path / "loop.yaml"
    os.symlink(loop, loop)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:
        fh.truncate(17 * 2**20)
    under_file = tmp_path / "binary.yaml" / "x.yaml"
    return {
        "symlink loop": (str(loop), "cannot read the file"),
        "name too long": (str(tmp_path / ("x" * 300 + ".yaml")), "cannot read the file"),
        "fifo": (str(fifo), "not a regular file"),
        "device": ("/dev/zero", "not a regular file"),
        "directory": (str(folder), "is a directory"),
        "binary": (str(binary), "not UTF-8"),
        "too large": (str(big), "too large"),
        "under a file": (str(under_file), "cannot read the file"),
        "missing": (str(tmp_path / "none.yaml"), "file not found"),
        "empty name": ("", "empty name"),
    }


CASES = ["symlink loop", "name too long", "fifo", "device", "directory", "binary",
         "too large", "under a file", "missing", "empty name"]


@pytest.mark.parametrize("case", CASES)
def test_check_and_predict_refuse_a_path_that_is_not_a_config(case, tmp_path, capsys):
    path, why = _bad_paths(tmp_path)[case]
    for argv in (["check", path],
                 ["predict", "--hardware", "a100-sxm4-80gb", "--workload", path]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("crossflow: error: ") and why in err, err
        assert "Traceback" not in err and err.count("\n") <= 2


def test_a_fifo_does_not_block_a_study(tmp_path):
    """The FIFO as a study's workload: refused at once (nothing opens it), exit 2."""
    fifo = tmp_path / "w.yaml"
    os.mkfifo(fifo)
    study = tmp_path / "s.yaml"
    study.write_text(f"kind: study\nname: s\nworkload: {fifo}\nhardware: a100-sxm4-80gb\n"
                     "search_space: {dimensions: []}\nn_trials: 1\n")
    proc = subprocess.run([sys.executable, "-m", "crossflow", "study", "run", str(study),
                           "--no-tracking"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=child_env())
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "not a regular file" in proc.stderr and "Traceback" not in proc.stderr
