"""Bad arguments to ``study run`` and ``compare`` are refused before anything is created:
after each failure there is no journal, no database file and no study (and a database that
was there has no Optuna tables added)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest


def _paragraph(err: str) -> None:
    assert err.startswith("crossflow: error: ") and "Traceback" not in err, err
    assert err.strip().count("\n") == 0, err


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


CASES = {
    "negative seed": (["--seed", "-1"], ["--seed", "-1", "0 to 4294967295"]),
    "seed too large": (["--seed", str(2**32)], ["--seed", "4294967296"]),
    "zero trials": (["--trials", "0"], ["--trials", "must be >= 1"]),
    "zero workers": (["--workers", "0"], ["--workers", "must be >= 1"]),
    "unknown storage scheme": (["--storage", "foo://bar"],
                               ["--storage", "unknown storage scheme 'foo'", "sqlite:///",
                                "postgresql://", "journal file"]),
    "empty storage": (["--storage", ""], ["--storage", "an empty storage"]),
    "storage is a folder": (["--storage", "."], ["--storage", "is a directory"]),
    "unknown tracking scheme": (["--tracking-uri", "bogus://x", "--trials", "2"],
                                ["--tracking-uri", "unknown tracking URI scheme 'bogus'",
                                 "http(s)://", "sqlite:///"]),
    # MLflow 3's file store refuses new runs: refused up front, the sqlite store suggested
    "tracking in a folder": (["--tracking-uri", "runs", "--trials", "2"],
                             ["--tracking-uri", "maintenance mode", "sqlite:///runs/mlflow.db"]),
    "tracking at file://": (["--tracking-uri", "file:///tmp/x", "--trials", "2"],
                            ["--tracking-uri", "maintenance mode"]),
    "storage is the tracking database": (
        ["--storage", "sqlite:///s.db", "--tracking-uri", "sqlite:///s.db"],
        ["--storage", "the same database"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_study_run_refuses_bad_arguments_before_creating_anything(case, tmp_path,
                                                                   monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    argv, said = CASES[case]
    tracking = [] if any(a == "--tracking-uri" for a in argv) else ["--no-tracking"]
    code, out, err = cli("study", "run", "quickstart", "--quiet", *tracking, *argv)
    assert code == 2, (out, err)
    _paragraph(err)
    for text in said:
        assert text in err, (text, err)
    assert "sampler_options" not in err
    assert _files(tmp_path) == []       # no journal, no database, no MLflow store


def test_storage_on_mlflows_database_is_refused(tmp_path, monkeypatch, cli, capsys):
    """--storage naming MLflow's own database: MLflow's tables are seen, nothing added."""
    monkeypatch.chdir(tmp_path)
    import mlflow

    Path("mlruns").mkdir()
    mlflow.MlflowClient(tracking_uri="sqlite:///mlruns/mlflow.db").search_experiments()
    capsys.readouterr()  # MLflow's log of creating its tables

    def tables() -> set[str]:
        with sqlite3.connect("mlruns/mlflow.db") as conn:
            return {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table'")}

    before = tables()
    assert {"experiments", "runs"} <= before
    for tracking in (["--no-tracking"], ["--tracking-uri", "sqlite:///elsewhere.db"]):
        code, _, err = cli("study", "run", "quickstart", "--quiet", "--storage",
                           "sqlite:///mlruns/mlflow.db", *tracking)
        assert code == 2
        _paragraph(err)
        assert "--storage" in err and "MLflow's tracking database" in err
        assert tables() == before                         # no Optuna tables
        assert not Path("mlruns/optuna").exists() and not Path("elsewhere.db").exists()


def test_sampler_options_the_sampler_rejects_create_nothing(tmp_path, monkeypatch, cli):
    """Options a sampler's constructor refuses: the launch ends before the study exists
    (no WAITING baseline trials left behind)."""
    monkeypatch.chdir(tmp_path)
    Path("s.yaml").write_text(
        "kind: study\nname: s1\nworkload: gemm-8192\nhardware: deepflow-case-study\n"
        "search_space: quickstart\nsampler: tpe\nsampler_options: {n_startup_trials: 2.5}\n"
        "n_trials: 3\n")
    code, _, err = cli("study", "run", "s.yaml", "--quiet", "--no-tracking")
    assert code == 2
    _paragraph(err)
    assert "sampler_options.n_startup_trials" in err
    assert _files(tmp_path) == ["s.yaml"]


def test_an_empty_study_name_is_not_a_directory(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("study", "run", "")
    assert code == 2
    _paragraph(err)
    assert "empty name" in err and "directory" not in err
    assert _files(tmp_path) == []


def test_compare_refuses_an_unknown_storage_scheme(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("compare", "quickstart", "--storage", "foo://bar", "--budget", "2",
                       "--seeds", "1", "--no-tracking", "--quiet")
    assert code == 2
    _paragraph(err)
    assert "--storage" in err and "unknown storage scheme 'foo'" in err
    assert _files(tmp_path) == []


def test_show_and_best_refuse_an_unknown_storage_scheme(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    for command in ("show", "best"):
        code, _, err = cli("study", command, "quickstart", "--storage", "foo://bar")
        assert code == 2
        _paragraph(err)
        assert "unknown storage scheme 'foo'" in err
    assert _files(tmp_path) == []
