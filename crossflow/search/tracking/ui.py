"""``crossflow ui``: the MLflow UI on a tracking store, as a child that goes with us."""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import sys

from crossflow.errors import ConfigError
from crossflow.search.locations import default_tracking_uri, redact
from crossflow.search.tracking.paths import remove_stale_lock, resolve_locations


def check_port(port: int, host: str = "127.0.0.1") -> None:
    """Refuse (:class:`ConfigError`, exit 2) a port outside 1–65535 or one that cannot be
    bound on ``host`` now (in use, or reserved), before any server is started."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError("not a TCP port", file="command line", key="--port", value=port,
                          allowed="an integer from 1 to 65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # as the server will bind: a port in TIME_WAIT is free, one listened on is not
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            why = ("already in use" if exc.errno == errno.EADDRINUSE
                   else f"cannot be bound ({exc.strerror or exc})")
            raise ConfigError(
                f"port {port} on {host} is {why}; stop what serves there or choose another "
                f"port with --port (e.g. --port {port + 1 if port < 65535 else 5000})",
                file="command line", key="--port", value=port) from None


#: Tracking stores that are databases MLflow opens itself (a server is asked, not opened).
_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")


def check_store(tracking_uri: str | None) -> None:
    """Refuse (:class:`ConfigError`, exit 2) a tracking database MLflow cannot open — not
    readable, not a database, a schema MLflow must migrate, a migration left half-done —
    before the server starts, which would print MLflow's traceback per worker and exit.
    Opened as the server opens it (a new store's tables are made, as the server would)."""
    from crossflow.search.tracking.check import _reachable, local_path, scheme_of

    uri = tracking_uri or default_tracking_uri()
    kind = scheme_of(uri)
    if kind not in _DATABASES:
        return
    shown = redact(uri)

    def refuse(problem: str) -> ConfigError:
        return ConfigError(problem, file="command line", key="--tracking-uri", value=shown,
                           allowed="a tracking database MLflow can open (--tracking-uri), "
                           "e.g. the sqlite:///.../mlflow.db a study run made")

    path = local_path(uri) if kind == "sqlite" else None
    if path is not None and path.exists():
        if not path.is_file():
            raise refuse(f"{path} is not a regular file")
        if not os.access(path, os.R_OK):
            raise refuse(f"{path} cannot be read by this user (permission denied)")
        _half_created(uri, refuse)
    elif path is not None:  # a new, empty store, as the server would make it
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise refuse(f"{path} does not exist and its folder cannot be made "
                         f"({exc.strerror or exc})") from None
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise refuse(f"{path} does not exist and cannot be created: its folder "
                         f"{path.parent} is read-only for this user")
    if kind != "sqlite":
        try:
            _reachable(uri, 5.0)
        except ConfigError as exc:  # (its advice names --no-tracking, which ui lacks)
            raise refuse(exc.problem) from None
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    what = f"the tracking database {path}" if path is not None else "this tracking database"
    engine = None
    quiet = logging.getLogger("mlflow")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL + 1)  # MLflow logs each failure with its traceback
    try:
        # the store is opened on an engine that connected once (_engine_once), as the
        # server opens it (a new store's tables made, an existing one's schema verified)
        engine = _engine_once(uri)
        SqlAlchemyStore._engine_map[uri] = engine
        SqlAlchemyStore(uri, resolve_locations(uri, create=False)[1])
    except Exception as exc:  # noqa: BLE001 - whatever MLflow raises, said in one line
        raise refuse(f"MLflow cannot open {what}: {_first(exc)}") from None
    finally:
        quiet.setLevel(level)
        if engine is not None:
            SqlAlchemyStore._engine_map.pop(uri, None)
            engine.dispose()


def _half_created(uri: str, refuse) -> None:
    """A half-created SQLite store (:attr:`~.store.StoreState.half_created`, a creation cut
    short by a full disk, say) is made anew when it holds nothing a new store does not
    (under the store's lock, as a launch does), and refused with what to do when it holds
    data: MLflow would run its migrations over it again and fail."""
    from crossflow.search.tracking import store
    from crossflow.search.tracking.check import store_advice
    from crossflow.search.tracking.paths import _db_lock

    state = store.store_state(uri)
    if state is None or not state.half_created:
        return
    if not state.holds_data:
        try:
            with _db_lock(uri):
                store.rebuild_half_created(uri)
            return
        except OSError as exc:
            raise refuse(f"MLflow cannot open the tracking database {state.path}: it is "
                         f"half-created ({state.describe()}) and holds no run, but it "
                         f"cannot be made anew here ({exc.strerror or exc}); delete it "
                         "where it can be written") from None
    raise refuse(f"MLflow cannot open the tracking database: {store_advice(state)}")


def _first(exc: BaseException) -> str:
    """An error's text in one line: MLflow's advice kept, its small print and SQLAlchemy's
    statement and background link dropped."""
    text = " ".join(str(exc).split())
    for marker in (" NOTE: ", " [SQL: ", " (Background on this error"):
        cut = text.find(marker)
        text = text[:cut] if cut > 0 else text
    return text if len(text) <= 300 else text[:299] + "…"


#: MLflow 3 opens in its GenAI view (traces, prompts), where an experiment shows no run; a
#: study's trials are runs of its classic "Model training" view, which this query parameter
#: selects for the page it is on (the UI's own switch, which it remembers, is the
#: "Model training" button at the top left; a URL cannot set that).
CLASSIC_VIEW = "workflowType=machine_learning"


def server_env(secret_uri: str) -> dict[str, str]:
    """The MLflow server's environment: the store's URL (which may hold a password) by the
    environment, which `ps` does not show to other users; MLflow's job runner off unless the
    user asked for it (it serves GenAI jobs a study never makes, its consumer processes print
    a KeyboardInterrupt traceback each on Ctrl-C, and it slows the start); the deprecation
    warnings of the server's own imports off (they are MLflow's to fix, not the user's;
    Starlette's is a UserWarning, matched by the start of its text)."""
    env = {**os.environ, "MLFLOW_BACKEND_STORE_URI": secret_uri}
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    env.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning,"
                                     "ignore:starlette.middleware.wsgi is deprecated")
    return env


def ui_command(tracking_uri: str | None = None, host: str = "127.0.0.1", port: int = 5000,
               workers: int = 1) -> list[str]:
    """The ``mlflow ui`` command line for a store (default: ``mlruns/mlflow.db`` here, its
    artifacts in ``mlruns/artifacts``)."""
    # (created by MLflow when an artifact is first logged: a read-only store can be browsed)
    uri, artifacts = resolve_locations(tracking_uri, create=False)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
           "--host", host, "--port", str(port), "--workers", str(workers)]
    if artifacts is not None and tracking_uri is None:
        cmd += ["--default-artifact-root", artifacts]
    return cmd


def _engine_once(uri: str):
    """A SQLAlchemy engine of the tracking database ``uri`` that has connected and read its
    tables once, for MLflow's store to use (``SqlAlchemyStore._engine_map``): MLflow's own
    engine retries a refused login, an unopenable file or a database that does not answer
    with exponential back-off for about an hour (15 attempts).  Raises what the one attempt
    raised, the engine disposed."""
    import sqlalchemy

    from crossflow.search.storage_check import _engine_kwargs

    engine = sqlalchemy.create_engine(uri, **_engine_kwargs(uri))
    try:
        sqlalchemy.inspect(engine).get_table_names()
    except BaseException:
        engine.dispose()
        raise
    return engine


def study_links(tracking_uri: str, base_url: str) -> list[tuple[str, str]]:
    """(study, URL) of each experiment in the store that has CrossFlow's runs-table view
    (:data:`.records.VIEW_TAG`): the runs page opened with that view.  Reads only: a
    local store that does not exist has none."""
    from crossflow.search.tracking.check import local_path, scheme_of
    from crossflow.search.tracking.records import VIEW_KEY, VIEW_TAG

    path = local_path(tracking_uri)
    if path is not None and not path.exists():
        return []
    import logging

    from mlflow import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    if scheme_of(tracking_uri) in _DATABASES:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        if tracking_uri not in SqlAlchemyStore._engine_map:
            try:  # a store that cannot be read now has no links (nor an hour of retries)
                SqlAlchemyStore._engine_map[tracking_uri] = _engine_once(tracking_uri)
            except Exception:  # noqa: BLE001 - any failure to read: no links
                return []
    experiments = MlflowClient(tracking_uri=tracking_uri).search_experiments(max_results=1000)
    return [(e.name, f"{base_url}/#/experiments/{e.experiment_id}/runs"
                     f"?viewStateShareKey={VIEW_KEY}&{CLASSIC_VIEW}")
            for e in sorted(experiments, key=lambda e: e.name) if VIEW_TAG in e.tags]


def launch_ui(tracking_uri: str | None = None, host: str = "127.0.0.1", port: int = 5000,
              workers: int = 1) -> int:
    """Run ``mlflow ui`` (:func:`ui_command`) until it exits or this process is stopped;
    returns its exit status (0 after Ctrl-C; 128 + the signal after SIGTERM or SIGHUP).
    One server worker by default (MLflow's default, 4, is a lot for a laptop).

    The server and every process it starts go with this process
    (:func:`crossflow.search.children.spawn_group`): SIGINT, SIGTERM and SIGHUP are
    forwarded (as SIGTERM) and the server's process group is killed on the way out, and on Linux a
    crash of this process (even SIGKILL) takes the server down too.

    The port is checked first (:func:`check_port`): one outside 1–65535 or already in use
    is a :class:`ConfigError` (exit 2) and no server is started."""
    from crossflow.search.children import forward_signals, spawn_group

    check_port(port, host)
    check_store(tracking_uri)
    cmd = ui_command(tracking_uri, host, port, workers)
    at = cmd.index("--backend-store-uri")  # (by the environment: server_env)
    secret = cmd[at + 1]
    cmd = cmd[:at] + cmd[at + 2:]
    env = server_env(secret)
    uri = redact(secret)
    # the server's own banner is buried in its log lines: say where to look, first
    print(f"crossflow ui: the MLflow UI of {uri} at http://{host}:{port} (Ctrl-C stops it)\n"
          "  MLflow opens in its GenAI view: 'Model training', top left, shows the runs\n"
          f"  the same with MLflow alone: mlflow ui --backend-store-uri {uri}",
          file=sys.stderr, flush=True)
    proc = spawn_group(cmd, env=env)
    # Ctrl-C reaches the server as SIGTERM: the same graceful stop, but uvicorn re-raises
    # the signal it caught once it has stopped, and a re-raised SIGINT is a KeyboardInterrupt
    # traceback (from wherever the server's event loop then is) where SIGTERM just ends it
    with forward_signals(proc, send=signal.SIGTERM) as received:
        try:  # read while the server starts; a store it cannot read yet has no links
            links = study_links(secret, f"http://{host}:{port}")
        except Exception:
            links = []
        if links:
            print("  each study's trials, with its objectives and design as columns:\n"
                  + "\n".join(f"    {name}: {url}" for name, url in links),
                  file=sys.stderr, flush=True)
        code = proc.wait()
    # the store's lock file (ours, crossflow.search.tracking.paths: MLflow's server makes
    # none) is deleted by whoever held it last; one a killed launch left goes with the UI
    remove_stale_lock(secret)
    if received:
        return 0 if received[0] == signal.SIGINT else 128 + received[0]
    return code
