"""The git revision a launch records (crossflow.search.locations.git_revision) when CrossFlow
is installed with ``pip install .``: the package then lives in site-packages, no git tree,
and the revision used to be recorded as ``unknown``.  The source is the one pip records in
the distribution's ``direct_url.json`` (PEP 610)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from crossflow.search.locations import revision_of_source

REPO = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]


def _repo(folder: Path) -> str:
    folder.mkdir()
    subprocess.run([*GIT, "init", "-q", str(folder)], check=True)
    (folder / "a.txt").write_text("one\n")
    subprocess.run([*GIT, "-C", str(folder), "add", "a.txt"], check=True)
    subprocess.run([*GIT, "-C", str(folder), "commit", "-qm", "one"], check=True)
    return subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()


def test_a_local_folder_install_is_asked_with_git(tmp_path):
    head = _repo(tmp_path / "src")
    recorded = {"url": (tmp_path / "src").as_uri(), "dir_info": {}}
    assert revision_of_source(recorded) == (head, False)
    (tmp_path / "src" / "a.txt").write_text("two\n")
    assert revision_of_source(recorded) == (head, True)


def test_a_git_install_names_its_commit_and_an_archive_is_unknown(tmp_path):
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert revision_of_source({"url": "https://github.com/o/crossflow.git",
                               "vcs_info": {"vcs": "git", "commit_id": commit}}) \
        == (commit, False)
    assert revision_of_source({"url": "https://example.com/crossflow-0.1.tar.gz",
                               "archive_info": {"hashes": {}}}) == ("unknown", None)
    # a folder that is no git tree, or is gone
    (tmp_path / "plain").mkdir()
    for folder in (tmp_path / "plain", tmp_path / "gone"):
        assert revision_of_source({"url": folder.as_uri(), "dir_info": {}}) \
            == ("unknown", None)


def test_pip_install_of_a_checkout_records_its_commit(tmp_path):
    """End to end: ``pip install --target`` of a clone of this repository (~4 s), then
    git_revision() in the installed copy names the clone's HEAD."""
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not run from a git checkout")
    clone, target = tmp_path / "clone", tmp_path / "site"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    # the package as it is here (committed in the clone), not as this checkout's HEAD has it
    shutil.copytree(REPO / "crossflow", clone / "crossflow", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([*GIT, "-C", str(clone), "add", "-A", "crossflow"], check=True)
    subprocess.run([*GIT, "-C", str(clone), "commit", "-q", "--allow-empty", "-m", "here"],
                   check=True)
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    built = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                            "--no-compile", "--target", str(target), str(clone)],
                           capture_output=True, text=True, timeout=300)
    if built.returncode != 0:  # no build backend to be had (an offline machine)
        pytest.skip(f"pip could not build the package: {built.stderr[-300:]}")
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = ("import crossflow.search.locations as l; print(l.__file__); "
            "print(*l.git_revision())")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True,
                         capture_output=True, text=True).stdout.split("\n")
    assert out[0].startswith(str(target))  # the installed copy, not this checkout
    assert out[1] == f"{head} False"
