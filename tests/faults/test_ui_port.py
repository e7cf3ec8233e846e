"""``crossflow ui`` with a port it cannot serve on: a port outside 1–65535 or one already in
use is refused (exit 2, one paragraph naming the port and ``--port``) before any MLflow
server is started — nothing is left running."""

from __future__ import annotations

import os
import socket
import time

import pytest

from crossflow import cli


@pytest.fixture
def no_server(monkeypatch):
    """Fails the test if a server process would be started; records the attempts."""
    import crossflow.search.children as children

    started = []

    def refuse(cmd, *args, **kwargs):
        started.append(cmd)
        raise AssertionError(f"a server was started: {cmd}")

    monkeypatch.setattr(children, "spawn_group", refuse)
    return started


@pytest.fixture
def busy_port():
    """A port on 127.0.0.1 that something already listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _one_paragraph(err: str) -> None:
    assert err.startswith("crossflow: error: "), err
    assert "Traceback" not in err and err.strip().count("\n") == 0, err


@pytest.mark.parametrize("port", ["-1", "0", "70000", "65536"])
def test_a_port_outside_the_range_is_refused(port, no_server, capsys, tmp_path,
                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["ui", "--port", port]) == 2
    err = capsys.readouterr().err
    _one_paragraph(err)
    assert "--port" in err and port in err and "1 to 65535" in err
    assert no_server == [] and not (tmp_path / "mlruns").exists()


def test_a_port_in_use_is_refused_naming_it(busy_port, no_server, capsys, tmp_path,
                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["ui", "--port", str(busy_port)]) == 2
    err = capsys.readouterr().err
    _one_paragraph(err)
    assert f"port {busy_port}" in err and "already in use" in err and "--port" in err
    assert no_server == []


def test_a_free_port_starts_the_server(no_server, monkeypatch):
    """The check passes a free port on to the server (so it does not refuse everything)."""
    import crossflow.search.children as children
    from crossflow.search.tracking import ui

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ui.check_port(port)  # free: no error

    class Done(Exception):
        pass

    def record(cmd, *args, **kwargs):
        no_server.append(cmd)
        raise Done

    monkeypatch.setattr(children, "spawn_group", record)
    with pytest.raises(Done):
        ui.launch_ui(None, port=port)
    assert no_server and str(port) in no_server[0]


def test_the_command_exits_at_once_with_no_process_left(busy_port, tmp_path, cli_process):
    """The real command line, in a child process: exit 2 within seconds, one paragraph,
    and no child of it survives (no MLflow server was started)."""
    start = time.monotonic()
    code, out, err, pid = cli_process("ui", "--port", busy_port, cwd=tmp_path)
    assert code == 2, (out, err)
    _one_paragraph(err)
    assert f"port {busy_port}" in err
    assert time.monotonic() - start < 120
    with pytest.raises(ProcessLookupError):  # nothing of its process group is left
        os.killpg(pid, 0)


def test_the_ui_says_its_url_and_the_plain_mlflow_command(monkeypatch, capsys):
    """Before the server's own log lines: where to browse, and the equivalent ``mlflow ui``
    (a password in the store's URL redacted)."""
    from crossflow.search import children
    from crossflow.search.tracking import ui

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    class Server:
        def wait(self):
            return 0

    spawned = []

    def spawn(cmd, *args, **kwargs):
        spawned.append((cmd, kwargs.get("env") or {}))
        return Server()

    monkeypatch.setattr(children, "spawn_group", spawn)
    monkeypatch.setattr(children, "kill_group", lambda proc, *a, **k: 0)  # no group to end
    monkeypatch.setattr(ui, "check_store", lambda uri: None)  # no database behind the URL
    assert ui.launch_ui("postgresql://bob:secret@127.0.0.1:5432/mlflow", port=port) == 0
    err = capsys.readouterr().err
    assert f"http://127.0.0.1:{port}" in err and "Ctrl-C" in err
    assert "'Model training'" in err  # MLflow 3's GenAI view shows no run
    assert "mlflow ui --backend-store-uri postgresql://bob:" in err and "secret" not in err
    # the password is on no command line (`ps` shows those to every user): the environment
    cmd, env = spawned[0]
    assert not any("secret" in part for part in cmd) and "--backend-store-uri" not in cmd
    assert env["MLFLOW_BACKEND_STORE_URI"] == "postgresql://bob:secret@127.0.0.1:5432/mlflow"
    # no job runner: its consumers print a traceback each on Ctrl-C
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"


def test_a_job_runner_the_user_asked_for_is_kept(monkeypatch):
    from crossflow.search.tracking import ui

    monkeypatch.setenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "true")
    assert ui.server_env("sqlite:///x.db")["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "true"


def test_links_of_a_database_that_does_not_answer_come_back_at_once():
    """MLflow's own engine retries a database that refuses the connection with exponential
    back-off for about an hour; the ui's study links try once and have none."""
    import time

    from crossflow.search.tracking import ui

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]        # closed again: nothing listens there
    t0 = time.monotonic()
    assert ui.study_links(f"postgresql://bob:secret@127.0.0.1:{port}/mlflow",
                          "http://127.0.0.1:5000") == []
    assert time.monotonic() - t0 < 10
