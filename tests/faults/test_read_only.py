"""Read-only places (issue 21): a command that writes refuses an unwritable output folder
before any work, in one paragraph naming the folder (exit 2, nothing written); a command
that only reads a study works where nothing can be written."""

from __future__ import annotations

import os

import pytest


def _refused(code: int, err: str, *said: str) -> None:
    assert code == 2, err
    assert err.startswith("crossflow: error: ") and "Traceback" not in err, err
    assert err.strip().count("\n") == 0, err
    for text in said:
        assert text in err, (text, err)


@pytest.fixture
def ro_cwd(tmp_path, read_only, monkeypatch):
    """The working directory, empty and read-only (so mlruns/ cannot be made)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    read_only(folder)
    monkeypatch.chdir(folder)
    return folder


# --- finding 13: outputs in a read-only folder ------------------------------------------------


def test_compare_in_a_read_only_folder_is_refused_before_the_best_known_search(
        cli, ro_cwd, monkeypatch):
    from crossflow.search import compare

    def searched(*args, **kwargs):
        raise AssertionError("the best-known search ran before the folder was checked")

    monkeypatch.setattr(compare, "best_known", searched)
    code, _, err = cli("compare", "quickstart", "--samplers", "random", "--seeds", "1",
                       "--budget", "5")
    _refused(code, err, "--root", str(ro_cwd / "mlruns"), "nothing was written")
    assert os.listdir(ro_cwd) == []


def test_compare_with_a_writable_root_and_a_read_only_tracking_store_is_refused(
        cli, ro_cwd, tmp_path, monkeypatch):
    from crossflow.search import compare

    monkeypatch.setattr(compare, "best_known", lambda *a, **k: pytest.fail("searched"))
    code, _, err = cli("compare", "quickstart", "--samplers", "random", "--seeds", "1",
                       "--budget", "5", "--root", tmp_path / "root",
                       "--tracking-uri", f"sqlite:///{ro_cwd / 'mlflow.db'}")
    _refused(code, err, "--tracking-uri", "cannot be written")
    assert not (tmp_path / "root").exists()


def test_a_report_in_a_read_only_folder_is_refused_before_its_work(cli, ro_cwd, monkeypatch):
    from crossflow import reports

    def work(out, quick):
        raise AssertionError("the report's work began before its folder was checked")

    monkeypatch.setattr(reports, "_function", lambda name: work)
    code, _, err = cli("report", "fig1-gemm-64k", "--quick")
    _refused(code, err, "--out", str(ro_cwd / "mlruns" / "reports" / "fig1-gemm-64k"))
    assert os.listdir(ro_cwd) == []


def test_a_report_whose_tracking_store_is_read_only_is_refused_before_its_work(
        cli, ro_cwd, tmp_path):
    code, _, err = cli("report", "fig1-gemm-64k", "--quick", "--out", tmp_path / "out")
    _refused(code, err, "--tracking-uri", str(ro_cwd / "mlruns"), "cannot be written")
    assert "--no-tracking" not in err  # report has no such option
    assert not (tmp_path / "out").exists()


# --- finding 22: reading a study where nothing can be written ---------------------------------


@pytest.fixture
def journal(tmp_path):
    """A quickstart study of 3 trials in ``tmp_path/j/q.journal``."""
    from crossflow.search.study import load_study, run_study

    path = tmp_path / "j" / "q.journal"
    run_study(load_study("quickstart"), n_trials=3, storage=str(path), track=False,
              progress=False)
    return path


@pytest.mark.parametrize("torn", [False, True], ids=["whole", "torn tail"])
def test_study_show_and_best_read_a_read_only_journal(cli, journal, read_only, torn):
    if torn:  # a writer killed mid-record: skipped when read, left for a writer to cut
        with open(journal, "ab") as fh:
            fh.write(b'{"op_code":5,"worker_id":"x","trial_id":1,"user_att')
    before = journal.read_bytes()
    read_only(journal.parent)
    code, out, err = cli("study", "show", "quickstart", "--storage", journal)
    assert code == 0, err
    assert "3 finished of 3" in out
    code, out, err = cli("study", "best", "quickstart", "--storage", journal, "--json")
    assert code == 0, err
    assert '"trial"' in out
    assert journal.read_bytes() == before
    assert sorted(p.name for p in journal.parent.iterdir()) == ["q.journal"]  # no lock


def test_study_run_on_a_read_only_journal_is_refused(cli, journal, read_only):
    before = journal.read_bytes()
    read_only(journal.parent)
    code, _, err = cli("study", "run", "quickstart", "--storage", journal, "--trials", "5",
                       "--no-tracking", "--quiet")
    _refused(code, err, str(journal), "--storage")
    assert journal.read_bytes() == before


def test_study_list_counts_the_trials_of_a_read_only_journal(cli, tmp_path, read_only,
                                                              monkeypatch):
    from crossflow.search.study import load_study, run_study

    here = tmp_path / "here"
    monkeypatch.chdir(here.parent)
    run_study(load_study("quickstart"), n_trials=2, storage="here/mlruns/optuna/"
              "quickstart.journal", track=False, progress=False)
    monkeypatch.chdir(here)

    def listed() -> str:
        code, out, err = cli("study", "list")
        assert code == 0, err
        return next(line for line in out.splitlines() if line.startswith("quickstart "))

    writable = listed()
    assert "  2 run  " in writable, writable
    monkeypatch.chdir(tmp_path)
    read_only(here)
    monkeypatch.chdir(here)  # (after the mount: a working directory keeps what it was)
    assert listed() == writable
