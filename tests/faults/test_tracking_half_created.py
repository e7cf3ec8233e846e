"""A tracking store whose creation was cut short (issue 21, finding 6): a full disk while
MLflow first builds ``mlflow.db`` leaves tables without the revision record of the last
migration, and MLflow then runs its migrations again over them and fails ("table spans
already exists") at every launch, which promised a back-fill that never came.  Such a store
is made anew when it holds nothing a new store does not (the next launch back-fills every
finished trial), and refused before the study is created, naming the file and what to do,
when it holds data (``tracking/store.py``, ``tracking/check.py``)."""

from __future__ import annotations

import resource
import shutil
import sqlite3
import subprocess
import sys

import pytest

from crossflow import cli
from crossflow.search.tracking import store
from crossflow.search.workers import child_env


@pytest.fixture(scope="module")
def made_store(tmp_path_factory):
    """An MLflow SQLite store as MLflow makes it (copied by each test)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    folder = tmp_path_factory.mktemp("store")
    SqlAlchemyStore(f"sqlite:///{folder / 'mlflow.db'}", (folder / "artifacts").as_uri())
    return folder / "mlflow.db"


def _half_created(made_store, db, *, data: bool):
    """A copy of a new store with a later migration's table gone (as a creation cut short
    leaves it), and an experiment of a study when ``data``."""
    shutil.copy(made_store, db)
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE spans")
        if data:
            conn.execute("INSERT INTO experiments (experiment_id, name, artifact_location, "
                         "lifecycle_stage, creation_time, last_update_time, workspace) "
                         "VALUES (1, 'quickstart', '/tmp/a', 'active', 0, 0, 'default')")
    return db


def _runs(db) -> int:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("quickstart")
    return len([r for r in client.search_runs([exp.experiment_id], max_results=1000)
                if "trial_number" in r.data.tags])


def test_a_store_cut_short_by_a_full_disk_is_made_anew_and_back_filled(tmp_path):
    """A real write limit (RLIMIT_FSIZE: writes past it fail with EFBIG, as on a full disk)
    while MLflow builds a new store (no cached empty store: its ~60 migrations run): the
    launch's trials are kept and said to lack a run; the next launch, with room, makes the
    store anew and logs every finished trial, exit 0 (before: exit 1, "table spans already
    exists", at every launch)."""
    env = {**child_env(), "XDG_CACHE_HOME": str(tmp_path / "cache")}  # no cached store
    cmd = [sys.executable, "-m", "crossflow", "study", "run", "quickstart", "--quiet"]
    db = tmp_path / "mlruns" / "mlflow.db"

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))

    first = subprocess.run([*cmd, "--trials", "3"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300, preexec_fn=limited)
    assert "Traceback" not in first.stderr, first.stderr[-3000:]
    state = store.store_state(f"sqlite:///{db}")
    assert state is not None and state.half_created and not state.holds_data, state
    assert first.returncode == 1 and "3 of 3 finished trials have no MLflow run" \
        in first.stderr, first.stderr[-3000:]
    second = subprocess.run([*cmd, "--trials", "5"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stderr == ""
    assert store.store_state(f"sqlite:///{db}").current
    assert _runs(db) == 5                       # the 3 of the first launch back-filled


def test_a_half_created_store_holding_data_is_refused_before_the_study(made_store,
                                                                        tmp_path, capsys):
    db = _half_created(made_store, tmp_path / "mlflow.db", data=True)
    before = db.read_bytes()
    journal = tmp_path / "q.journal"
    code = cli.main(["study", "run", "quickstart", "--trials", "2", "--quiet",
                     "--storage", str(journal), "--tracking-uri", f"sqlite:///{db}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("crossflow: error: ") and err.strip().count("\n") == 0, err
    assert "Traceback" not in err and "--tracking-uri" in err
    assert f"{db} is half-created" in err and "spans" in err, err
    assert f"mlflow db upgrade sqlite:///{db}" in err and "move it away" in err, err
    assert not journal.exists() and db.read_bytes() == before   # nothing created, no change


def test_a_half_created_store_holding_nothing_is_made_anew(made_store, tmp_path, capsys):
    db = _half_created(made_store, tmp_path / "mlflow.db", data=False)
    code = cli.main(["study", "run", "quickstart", "--trials", "2", "--quiet",
                     "--storage", str(tmp_path / "q.journal"),
                     "--tracking-uri", f"sqlite:///{db}"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert store.store_state(f"sqlite:///{db}").current and _runs(db) == 2


def test_a_store_of_another_mlflow_schema_is_refused_before_the_study(made_store, tmp_path,
                                                                       capsys):
    db = tmp_path / "mlflow.db"
    shutil.copy(made_store, db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0a8213491aaa'")
    journal = tmp_path / "q.journal"
    code = cli.main(["study", "run", "quickstart", "--trials", "2", "--quiet",
                     "--storage", str(journal), "--tracking-uri", f"sqlite:///{db}"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().count("\n") == 0, err
    assert "another MLflow version's schema" in err and "0a8213491aaa" in err, err
    assert f"mlflow db upgrade sqlite:///{db}" in err and not journal.exists()
