"""``crossflow ui``: the MLflow UI on a tracking store, as a child that goes with us."""

from __future__ import annotations

import signal
import sys

from crossflow.search.tracking.paths import resolve_locations


def ui_command(tracking_uri: str | None = None, host: str = "127.0.0.1", port: int = 5000,
               workers: int = 1) -> list[str]:
    """The ``mlflow ui`` command line for a store (default: ``mlruns/mlflow.db`` here, its
    artifacts in ``mlruns/artifacts``)."""
    uri, artifacts = resolve_locations(tracking_uri)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
           "--host", host, "--port", str(port), "--workers", str(workers)]
    if artifacts is not None and tracking_uri is None:
        cmd += ["--default-artifact-root", artifacts]
    return cmd


def launch_ui(tracking_uri: str | None = None, host: str = "127.0.0.1", port: int = 5000,
              workers: int = 1) -> int:
    """Run ``mlflow ui`` (:func:`ui_command`) until it exits or this process is stopped;
    returns its exit status (0 after Ctrl-C; 128 + the signal after SIGTERM or SIGHUP).
    One server worker by default (MLflow's default, 4, is a lot for a laptop).

    The server and every process it starts go with this process
    (:func:`crossflow.search.children.spawn_group`): SIGINT, SIGTERM and SIGHUP are
    forwarded and the server's process group is killed on the way out, and on Linux a
    crash of this process (even SIGKILL) takes the server down too."""
    from crossflow.search.children import forward_signals, spawn_group

    proc = spawn_group(ui_command(tracking_uri, host, port, workers))
    with forward_signals(proc) as received:
        code = proc.wait()
    if received:
        return 0 if received[0] == signal.SIGINT else 128 + received[0]
    return code
