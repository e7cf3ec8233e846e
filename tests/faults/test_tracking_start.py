"""A tracking store that cannot take a study's runs is refused when the launch starts —
before the Optuna study is created, before trial 1: exit 2, one paragraph naming
``--tracking-uri``, nothing created, the wait bounded (``tracking/check.py``)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from crossflow import cli
from crossflow.search.tracking import check


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again: connections are refused


@pytest.fixture
def silent_port():
    """A port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


def _read_only_dir(tmp_path: Path) -> Path:
    """A directory no file can be created in, for root too (a read-only file system)."""
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        return ro
    for candidate in ("/sys/fs", "/sys/kernel", "/proc/self"):
        try:
            fd = os.open(os.path.join(candidate, ".crossflow-test"),
                         os.O_CREAT | os.O_WRONLY | os.O_EXCL)
        except OSError:
            return Path(candidate)
        os.close(fd)
        os.unlink(os.path.join(candidate, ".crossflow-test"))
    pytest.skip("no read-only directory on this machine")


def _launch(tmp_path, capsys, uri: str, storage: str) -> tuple[int, str, float]:
    t0 = time.monotonic()
    code = cli.main(["study", "run", "quickstart", "--trials", "2", "--quiet",
                     "--storage", storage, "--tracking-uri", uri])
    return code, capsys.readouterr().err, time.monotonic() - t0


def _refused(code: int, err: str, *words: str) -> None:
    """Exit 2, one paragraph naming the option and having each of ``words`` (a word may
    be alternatives separated by '|': the storage side may see a shared file first)."""
    assert code == 2, err
    assert err.startswith("crossflow: error: ") and "Traceback" not in err, err
    assert "--tracking-uri" in err or "key '--storage'" in err, err
    assert err.strip().count("\n") == 0, err
    for word in words:
        assert any(w in err for w in word.split("|")), (word, err)


#: the launch's storage check or the tracking check, whichever sees the shared file first
SHARED = "the study's own Optuna storage|the same database"


def _cases(tmp_path: Path, silent: int) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    journal = str(tmp_path / "q.journal")
    shared = tmp_path / "shared.db"
    folder = tmp_path / "folder.db"
    folder.mkdir()
    ro = _read_only_dir(tmp_path)
    return {
        # name: (tracking URI, --storage, words the message has)
        "unknown scheme": ("foo://bar", journal, ("unknown tracking URI scheme", "foo://")),
        "refused server": (f"http://127.0.0.1:{_closed_port()}", journal,
                           ("does not answer", "refused")),
        "silent server": (f"http://127.0.0.1:{silent}", journal,
                          ("does not answer", f"within {check.CHECK_S:g} s")),
        "refused database": (f"postgresql://u:secret@127.0.0.1:{_closed_port()}/db", journal,
                             ("cannot be reached", "u:***@")),
        "sqlite shared with the storage": (f"sqlite:///{shared}", f"sqlite:///{shared}",
                                           (SHARED,)),
        "journal shared with the store": (f"sqlite:///{tmp_path / 'j.db'}",
                                          str(tmp_path / "j.db"),
                                          (SHARED,)),
        "in-memory sqlite": ("sqlite://", journal, ("in-memory",)),
        "a directory as database": (f"sqlite:///{folder}", journal, ("not a regular file",)),
        "read-only mlruns": (f"sqlite:///{ro / 'mlruns' / 'mlflow.db'}", journal,
                             ("cannot be written",)),
    }


CASES = ["unknown scheme", "refused server", "silent server", "refused database",
         "sqlite shared with the storage", "journal shared with the store",
         "in-memory sqlite", "a directory as database", "read-only mlruns"]


@pytest.mark.parametrize("case", CASES)
def test_a_tracking_store_that_cannot_take_runs_is_refused_before_anything_is_made(
        case, tmp_path, capsys, monkeypatch, silent_port):
    monkeypatch.chdir(tmp_path)
    uri, storage, words = _cases(tmp_path, silent_port)[case]
    before = set(os.listdir(tmp_path))
    code, err, took = _launch(tmp_path, capsys, uri, storage)
    _refused(code, err, *words)
    assert set(os.listdir(tmp_path)) == before, "a launch refused at start created files"
    assert took < check.CHECK_S + 30  # bounded: one wait of CHECK_S at most, plus start-up


def test_the_same_database_for_storage_and_tracking_is_refused():
    """Optuna and MLflow both keep an ``alembic_version`` table: one database for both
    breaks one of them — refused whatever the driver or a default port."""
    with pytest.raises(Exception) as info:
        check.check_tracking("postgresql://u:pw@db.example:5432/shared",
                             "postgresql+psycopg2://u:pw@db.example/shared")
    assert "own Optuna database" in str(info.value) and "pw" not in str(info.value)
    # another database on the same server is fine as far as sharing goes (then: reachable?)
    assert not check._same_database("postgresql://u@db.example/mlflow",
                                    "postgresql://u@db.example/optuna")


def test_a_read_only_default_mlruns_is_refused(tmp_path, capsys, monkeypatch):
    """No --tracking-uri: the default ``mlruns/mlflow.db`` in a directory that cannot be
    written is refused too, the message pointing at --tracking-uri and --no-tracking."""
    ro = _read_only_dir(tmp_path)
    monkeypatch.chdir(ro)
    code = cli.main(["study", "run", "quickstart", "--trials", "2", "--quiet",
                     "--storage", str(tmp_path / "q.journal")])
    err = capsys.readouterr().err
    _refused(code, err, "cannot be written", "--no-tracking")
    assert not (tmp_path / "q.journal").exists()


def test_no_tracking_skips_the_check(tmp_path, capsys, monkeypatch):
    """``--no-tracking`` with a study file whose tracking URI is unusable: the study runs
    (exit 0).  (``--no-tracking`` with ``--tracking-uri`` is a contradiction, refused:
    tests/faults/test_hostile_input.py.)"""
    import shutil

    monkeypatch.chdir(tmp_path)
    (tmp_path / "studies").mkdir()
    shutil.copy(Path(__file__).resolve().parents[2] / "studies" / "quickstart.yaml",
                tmp_path / "studies")
    with (tmp_path / "studies" / "quickstart.yaml").open("a") as fh:
        fh.write("tracking_uri: foo://bar\n")
    code = cli.main(["study", "run", "quickstart", "--trials", "2", "--quiet", "--no-tracking",
                     "--storage", str(tmp_path / "q.journal")])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "q.journal").exists() and not (tmp_path / "mlruns").exists()


def test_a_usable_store_passes(tmp_path):
    """The check lets a usable store through and creates nothing for it."""
    uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    assert check.check_tracking(uri, str(tmp_path / "q.journal")) == uri
    assert list(tmp_path.iterdir()) == []
