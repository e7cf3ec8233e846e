"""Faults injected into a study's journal: a torn tail, a torn record with others glued on,
a disk that fills up mid-study, a journal path that is not a regular file."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import optuna
import pytest

from crossflow.errors import ConfigError
from crossflow.search import journal as J
from crossflow.search.storage import make_storage
from crossflow.search.study import load_study, open_study, run_study
from crossflow.search.workers import child_env

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _run(path, n, **kw):
    return run_study(load_study("quickstart"), n_trials=n, storage=str(path), track=False,
                     progress=False, **kw)


def _complete(path) -> int:
    study = open_study(load_study("quickstart"), str(path), create=False)
    return len([t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE])


def test_a_torn_tail_is_cut_and_the_study_goes_on(tmp_path, capsys):
    path = tmp_path / "q.journal"
    _run(path, 8)
    good = path.read_bytes()
    with open(path, "ab") as fh:  # a writer killed mid-record
        fh.write(b'{"op_code":5,"worker_id":"x","trial_id":3,"user_att')
    assert _complete(path) == 8
    err = capsys.readouterr().err
    assert "torn bytes are saved" in err and str(path) in err
    assert path.read_bytes() == good  # every complete record kept, nothing else
    assert (tmp_path / "q.journal.torn").read_bytes().startswith(b'{"op_code":5')
    result = _run(path, 12)
    assert result.total == 12 and _complete(path) == 12


def test_a_record_glued_onto_a_torn_one_is_recovered(tmp_path, capsys):
    """A file damaged before the check existed: an append landed on the torn line."""
    path = tmp_path / "q.journal"
    _run(path, 6)
    lines = path.read_bytes().split(b"\n")[:-1]
    last, glued = lines.pop(), lines.pop()
    damaged = b"\n".join([*lines, b'{"op_code":4,"wor' + glued, last]) + b"\n"
    path.write_bytes(damaged)
    with pytest.raises(json.JSONDecodeError):  # what Optuna alone makes of it
        list(optuna.storages.journal.JournalFileBackend(str(path)).read_logs(0))
    assert _complete(path) == 6  # the glued record is recovered
    assert "torn bytes" in capsys.readouterr().err
    assert _run(path, 9).total == 9


def test_the_repair_is_said_once_per_journal(tmp_path, capsys):
    path = tmp_path / "q.journal"
    _run(path, 3)
    for _ in range(2):
        with open(path, "ab") as fh:
            fh.write(b'{"op_code":1')
        make_storage(str(path))
    assert capsys.readouterr().err.count("ended in a record that was not finished") == 1


def test_a_tail_torn_while_the_journal_is_open_is_cut_before_the_next_record(tmp_path,
                                                                             capsys):
    """Another writer dies mid-record after this process opened the journal: the next
    append cuts the torn bytes off (keeping them in ``.torn``) and writes after the last
    complete record, so the file stays readable by Optuna itself."""
    path = tmp_path / "q.journal"
    _run(path, 3)
    storage = make_storage(str(path))
    good = path.read_bytes()
    with open(path, "ab") as fh:
        fh.write(b'{"op_code":8,"worker_id":"x","trial_id":1,"user_att')
    study = optuna.load_study(study_name="quickstart", storage=storage)
    study.set_user_attr("after", 1)
    assert path.read_bytes().startswith(good) and path.read_bytes().endswith(b"\n")
    assert (tmp_path / "q.journal.torn").read_bytes().startswith(b'{"op_code":8')
    assert "torn bytes are saved" in capsys.readouterr().err
    logs = list(optuna.storages.journal.JournalFileBackend(str(path)).read_logs(0))
    assert logs[-1]["op_code"] == 2 and logs[-1]["user_attr"] == {"after": 1}


def test_records_of_a_running_trial_are_made_durable_with_its_result(tmp_path, monkeypatch):
    """One fsync for each record that creates or ends a trial or changes the study (it
    flushes every record before it); none for a running trial's parameters and attributes,
    which every reader sees at once all the same."""
    path = tmp_path / "q.journal"
    synced: list[int] = []
    real = os.fsync

    def counted(fd):
        synced.append(os.fstat(fd).st_size)
        real(fd)

    monkeypatch.setattr(J.os, "fsync", counted)
    _run(path, 4)
    records = [json.loads(line) for line in path.read_bytes().splitlines()]
    ends, durable = [], 0
    for r in records:
        durable += len(json.dumps(r, separators=(",", ":"))) + 1
        if r["op_code"] not in (5, 7, 8, 9):
            ends.append(durable)
    assert synced == ends  # every durable record synced as it was written, nothing else
    assert records[-1]["op_code"] == 6 and synced[-1] == path.stat().st_size
    assert len(records) > 3 * len(synced)  # most records are a running trial's
    assert _complete(path) == 4


def test_a_failed_write_leaves_no_torn_record(tmp_path, monkeypatch):
    """ENOSPC half-way through a record: the file is cut back to where it was, the error
    says what happened, and the study resumes once there is room."""
    path = tmp_path / "q.journal"
    _run(path, 5)
    before = path.read_bytes()
    real = J._write_all

    def half_then_full(fd, data):
        os.write(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(J, "_write_all", half_then_full)
    with pytest.raises(J.JournalWriteError, match="no space left on the device.*resume"):
        _run(path, 8)
    assert path.read_bytes().startswith(before) and path.read_bytes().endswith(b"\n")
    monkeypatch.setattr(J, "_write_all", real)
    assert _run(path, 8).total == 8 and _complete(path) == 8


def test_cli_full_disk_ends_with_a_message_and_resumes(tmp_path):
    """A real write limit (RLIMIT_FSIZE: writes past it fail with EFBIG, as on a full disk)
    on `crossflow study run`: exit 2 with one message, no traceback; the journal stays
    readable and the same command, with room, finishes the study."""
    journal = tmp_path / "q.journal"
    cmd = [sys.executable, "-m", "crossflow", "study", "run", "quickstart", "--trials", "40",
           "--storage", str(journal), "--no-tracking"]
    env = child_env()

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))

    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, preexec_fn=limited)
    assert proc.returncode in (1, 2), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "cannot write the study's journal" in proc.stderr
    assert journal.stat().st_size <= 40_000 and journal.read_bytes().endswith(b"\n")
    done = _complete(journal)
    assert 0 < done < 40
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _complete(journal) == 40


@pytest.mark.parametrize("kind", ["directory", "fifo", "device"])
def test_a_journal_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    if kind == "directory":
        target = tmp_path / "d"
        target.mkdir()
    elif kind == "fifo":
        target = tmp_path / "f"
        os.mkfifo(target)
    else:
        target = "/dev/full" if os.path.exists("/dev/full") else "/dev/null"
    with pytest.raises(ConfigError, match="storage") as err:
        make_storage(str(target))
    assert "journal" in str(err.value) or "regular file" in str(err.value)
    if kind == "device":
        assert not os.path.isfile(target)  # nothing replaced the device


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_in_memory_sqlite_is_refused(url):
    with pytest.raises(ConfigError, match="in-memory"):
        make_storage(url)
