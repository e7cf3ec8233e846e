"""Whether a storage can hold studies, checked before anything is created: a journal path
that can be a file, or a database URL whose scheme SQLAlchemy knows and whose driver is
installed, that is not an in-memory SQLite database and not MLflow's tracking database
(:func:`check_storage`, which ``study run``, ``worker``, ``show``, ``best``, ``compare``
and ``dashboard`` call on ``--storage`` and a study file's ``storage``).  Nothing here
imports optuna; opening a storage is :mod:`crossflow.search.storage`'s job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crossflow.errors import ConfigError
from crossflow.search.locations import check_userinfo, is_url, redact


def _engine_kwargs(url: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"pool_pre_ping": True}  # replace connections the server dropped
    if url.startswith(("postgresql", "postgres")):
        # fail a connection attempt in seconds (the retry loop waits), and notice a peer that
        # vanished without closing the socket
        kwargs["connect_args"] = {"connect_timeout": 5, "keepalives": 1,
                                  "keepalives_idle": 10, "keepalives_interval": 5,
                                  "keepalives_count": 3}
    return kwargs


def _check_driver(url: str) -> None:
    """A clear error when the database driver a URL needs is not installed."""
    driver = {"postgresql://": "psycopg", "postgres://": "psycopg",
              "postgresql+psycopg://": "psycopg", "postgresql+psycopg2://": "psycopg2"}
    module = next((m for prefix, m in driver.items() if url.startswith(prefix)), None)
    if module is not None:
        try:
            __import__(module)
        except ImportError:
            raise ConfigError(f"PostgreSQL needs the {module} driver: pip install "
                              "'crossflow[postgres]' (psycopg 3)", key="storage",
                              value=redact(url)) from None


#: What ``--storage`` may be (in messages).
STORAGES = ("a journal file path (created when missing), sqlite:///FILE.db, "
            "postgresql://USER@HOST/DB, or another SQLAlchemy database URL")
#: Tables that make a database MLflow's (its tracking store), not a place for studies.
_MLFLOW_TABLES = {"experiments", "runs", "metrics", "params"}


def check_storage(url: str, *, key: str = "storage", for_reading: bool = False) -> None:
    """A ConfigError, before anything is created, unless ``url`` can hold studies: a journal
    path that can be a file (:func:`~crossflow.search.journal.check_journal_path`), or a
    database URL whose scheme SQLAlchemy knows, whose driver is installed, that is not an
    in-memory SQLite database and not MLflow's tracking database.  Nothing is created (a
    SQLite file is only read, when it exists).  ``for_reading``: the caller only reads, so
    a journal file that can be read will do."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("an empty storage", key=key, value=url, allowed=STORAGES)
    if not is_url(url):
        from crossflow.search.journal import check_journal_path

        check_journal_path(url, key=key, for_reading=for_reading)
        return
    check_userinfo(url, key=key)
    shown = redact(url)
    if url.split("?")[0] in ("sqlite://", "sqlite:///", "sqlite:///:memory:"):
        raise ConfigError("an in-memory SQLite database lives in one process and one "
                          "connection: a study there is lost when the run ends, and "
                          "its heartbeat thread cannot reach it", key=key,
                          value=shown, allowed="a journal file path, sqlite:///FILE.db, "
                          "or a postgresql:// URL")
    import sqlalchemy.exc as sa
    from sqlalchemy.engine import make_url

    scheme = url.split("://", 1)[0]
    try:
        make_url(url).get_dialect()
    except sa.NoSuchModuleError:
        raise ConfigError(f"unknown storage scheme {scheme!r}", key=key, value=shown,
                          allowed=STORAGES) from None
    except (sa.ArgumentError, ValueError) as exc:
        raise ConfigError(f"not a database URL ({exc})", key=key, value=shown,
                          allowed=STORAGES) from None
    except ImportError as exc:
        raise ConfigError(f"the database driver is missing ({exc})", key=key,
                          value=shown) from None
    _check_driver(url)
    tables = _existing_tables(url)
    if tables >= _MLFLOW_TABLES:
        raise ConfigError("this is MLflow's tracking database (it has MLflow's tables "
                          "experiments and runs): Optuna's tables there would mix with "
                          "MLflow's, and its migrations could break both; give the studies "
                          "a storage of their own", key=key, value=shown, allowed=STORAGES)


def existing_tables(url: str) -> set[str]:
    """The tables of the database at ``url``, read without creating anything (none when a
    SQLite file does not exist); the driver's error when it cannot be read."""
    if url.startswith("sqlite:"):
        import contextlib
        import sqlite3

        from sqlalchemy.engine import make_url

        path = make_url(url).database
        if not path or not Path(path).is_file():
            return set()
        with contextlib.closing(sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro",
                                                uri=True, timeout=5)) as conn:
            return {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table'")}
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, **_engine_kwargs(url))
    try:
        return set(sqlalchemy.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _existing_tables(url: str) -> set[str]:
    """:func:`existing_tables`, empty when the database cannot be read (opening the storage
    then says why: make_storage retries and reports it)."""
    try:
        return existing_tables(url)
    except Exception:  # noqa: BLE001 - any driver's error
        return set()
