"""``crossflow ui`` on a tracking database MLflow cannot open (issue 21, finding 16): a
schema MLflow must migrate first, a migration left half-done, a file that is no database,
a new store in a read-only folder.  Each is refused before any server starts — exit 2, one
paragraph naming ``--tracking-uri`` and MLflow's reason — instead of MLflow's tracebacks;
a store that opens still gets its server, read-only ones included."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from crossflow import cli


@pytest.fixture
def servers(monkeypatch):
    """The servers ``crossflow ui`` would start (none is: the attempt ends the command)."""
    import crossflow.search.children as children

    started = []

    def spawn(cmd, *args, **kwargs):
        started.append(cmd)
        raise RuntimeError("a server would start here")

    monkeypatch.setattr(children, "spawn_group", spawn)
    return started


@pytest.fixture(scope="module")
def made_store(tmp_path_factory):
    """An MLflow SQLite store as MLflow makes it (copied by each test)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    folder = tmp_path_factory.mktemp("store")
    SqlAlchemyStore(f"sqlite:///{folder / 'mlflow.db'}", (folder / "artifacts").as_uri())
    return folder / "mlflow.db"


def _store(made_store, tmp_path, damage: str | None):
    db = tmp_path / "mlflow.db"
    if damage == "not a database":
        db.write_text("hello, I am no database\n" * 10)
        return db
    shutil.copy(made_store, db)
    with sqlite3.connect(db) as conn:
        if damage == "older schema":
            conn.execute("UPDATE alembic_version SET version_num = '0a8213491aaa'")
        elif damage in ("half migrated", "half created"):  # a later revision's table
            conn.execute("DROP TABLE spans")       # missing, the revision recorded
            if damage == "half migrated":          # ... in a store holding data
                conn.execute("INSERT INTO experiments (experiment_id, name, "
                             "artifact_location, lifecycle_stage, creation_time, "
                             "last_update_time, workspace) VALUES (1, 'quickstart', '/tmp/a', "
                             "'active', 0, 0, 'default')")
    return db


def _ui(tmp_path, capsys, uri: str) -> tuple[int, str]:
    code = cli.main(["ui", "--tracking-uri", uri, "--port", "5999"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("damage, said", [
    ("older schema", "out-of-date database schema"),
    ("half migrated", "MLflow cannot open the tracking database: the MLflow tracking "
                      "database"),
    ("not a database", "file is not a database"),
])
def test_a_tracking_database_mlflow_cannot_open_is_refused_before_the_server(
        made_store, tmp_path, capsys, servers, damage, said):
    db = _store(made_store, tmp_path, damage)
    code, err = _ui(tmp_path, capsys, f"sqlite:///{db}")
    assert code == 2, err
    assert err.startswith("crossflow: error: ") and "Traceback" not in err, err
    assert err.strip().count("\n") == 0, err
    assert "--tracking-uri" in err and str(db) in err and said in err, err
    assert servers == []


def test_a_half_created_store_holding_nothing_is_made_anew_and_served(
        made_store, tmp_path, capsys, servers):
    """A store whose creation was cut short (a full disk) and that holds nothing a new
    store does not is made anew, as a launch does, and served (issue 21, finding 6)."""
    from crossflow.search.tracking import store

    db = _store(made_store, tmp_path, "half created")
    assert store.store_state(f"sqlite:///{db}").half_created
    with pytest.raises(RuntimeError, match="a server would start"):
        _ui(tmp_path, capsys, f"sqlite:///{db}")
    assert len(servers) == 1 and store.store_state(f"sqlite:///{db}").current


def test_a_half_created_store_holding_data_says_what_to_do(made_store, tmp_path, capsys,
                                                           servers):
    db = _store(made_store, tmp_path, "half migrated")
    code, err = _ui(tmp_path, capsys, f"sqlite:///{db}")
    assert code == 2 and err.strip().count("\n") == 0, err
    assert "half-created" in err and f"mlflow db upgrade sqlite:///{db}" in err, err
    assert servers == []


def test_a_new_store_in_a_read_only_folder_is_refused(tmp_path, capsys, servers,
                                                      read_only):
    folder = tmp_path / "ro"
    folder.mkdir()
    read_only(folder)
    code, err = _ui(tmp_path, capsys, f"sqlite:///{folder / 'mlflow.db'}")
    assert code == 2, err
    assert "cannot be created" in err and str(folder) in err, err
    assert servers == [] and list(folder.iterdir()) == []


def test_a_store_that_opens_gets_its_server_read_only_too(made_store, tmp_path, capsys,
                                                          servers, read_only):
    folder = tmp_path / "ro"
    folder.mkdir()
    shutil.copy(made_store, folder / "mlflow.db")
    read_only(folder)
    with pytest.raises(RuntimeError, match="a server would start"):
        _ui(tmp_path, capsys, f"sqlite:///{folder / 'mlflow.db'}")
    assert len(servers) == 1


def test_a_database_server_that_does_not_answer_is_refused_naming_no_password(
        tmp_path, capsys, servers):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: connections are refused
    code, err = _ui(tmp_path, capsys, f"postgresql://bob:secret@127.0.0.1:{port}/mlflow")
    assert code == 2, err
    assert "cannot be reached" in err and "secret" not in err and "--no-tracking" not in err
    assert servers == []
