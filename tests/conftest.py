"""Shared test helpers."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from crossflow.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cli(capsys):
    """Run the CLI in-process: returns (exit status, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.fixture
def refuses(cli, tmp_path):
    """``crossflow predict`` of a workload mapping (written to a file) must exit 2 with
    nothing on stdout and one error naming where the bad value is (the workload's file, or
    ``source``: "command line" for the parallelism), ``key`` and ``pattern``; returns the
    error."""

    def check(workload: dict, key: str, pattern: str, parallelism: str = "t1-d8",
              system: str = "dgx-h100-megatron-core", source: str | None = None) -> str:
        import yaml

        path = tmp_path / "w.yaml"
        path.write_text(yaml.safe_dump(workload))
        code, out, err = cli("predict", "--workload", path, "--system", system,
                             "--parallelism", parallelism)
        assert code == 2 and not out
        assert (source or str(path)) in err and f"key '{key}'" in err and pattern in err
        return err

    return check


@pytest.fixture
def cli_process():
    """Run ``python -m crossflow`` in a child process in its own session, with the test
    environment (:func:`crossflow.search.workers.child_env`): returns (exit status, stdout,
    stderr, process id = its group).  A process still running after ``timeout`` seconds
    has its whole group killed, and the test then fails on its exit status."""
    import subprocess
    import sys

    from crossflow.search.workers import child_env

    def run(*args: str, cwd: Path, timeout: float = 120) -> tuple[int, str, str, int]:
        proc = subprocess.Popen([sys.executable, "-m", "crossflow", *map(str, args)],
                                cwd=cwd, env=child_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out = err = ""
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
        return proc.returncode, out, err, proc.pid

    return run


def pytest_configure(config):
    """The tests press Ctrl-C (SIGINT) in this process and in the commands they start, as
    from a terminal.  A shell starts a background job, pytest included, with SIGINT
    ignored, and CrossFlow leaves an ignored signal ignored (``nohup`` relies on that for
    SIGHUP; crossflow.search.children.take_signal): give the tests Python's own handler,
    which the commands they start inherit as the default."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def a100():
    from crossflow.predict import load_hardware

    return load_hardware("a100-sxm4-80gb")


def assert_numbers_have_sources(path: Path) -> None:
    """The preset style: a comment beside every number, or beside the mapping holding it
    (``peak_TFLOPS:  # dense, whole chip [csv]`` covers the peaks listed under it)."""
    parents: list[tuple[int, bool]] = []  # (indent, has a comment) of the enclosing keys
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        code = line.split("#", 1)[0]
        if not code.strip():
            continue
        indent = len(code) - len(code.lstrip(" -"))
        while parents and parents[-1][0] >= indent:
            parents.pop()
        commented = "#" in line
        if re.search(r":\s*\[?[0-9]", code) and not commented and not any(c for _, c in parents):
            pytest.fail(f"{path.name}:{lineno} has a number without a source comment: {line!r}")
        parents.append((indent, commented))


# --- PostgreSQL (issue 6) ----------------------------------------------------------------

#: A libpq URL of a PostgreSQL server the tests may create databases on (a superuser or a
#: role with CREATEDB), e.g. ``postgresql://crossflow@127.0.0.1:54329/postgres``.
#: ``.ci/run`` starts a throwaway cluster and sets it; without it the PostgreSQL tests skip,
#: except under ``CI=true``, where they fail.
POSTGRES_ENV = "CROSSFLOW_TEST_POSTGRES"


def _no_postgres(reason: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {reason}: .ci/run installs and starts PostgreSQL "
                    f"(.ci/postgres.sh) and sets {POSTGRES_ENV}", pytrace=False)
    pytest.skip(f"{reason} (set {POSTGRES_ENV}=postgresql://USER@HOST:PORT/DB, or run "
                "'eval \"$(bash .ci/postgres.sh start)\"')")


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """The admin URL of the test PostgreSQL server (see :data:`POSTGRES_ENV`)."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        _no_postgres(f"{POSTGRES_ENV} is not set")
    try:
        import psycopg
    except ImportError:
        _no_postgres("psycopg is not installed (pip install -e '.[test]')")
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as exc:
        _no_postgres(f"PostgreSQL at {url} does not answer: {exc}".strip())
    return url


@pytest.fixture
def postgres_url(postgres_server):
    """A fresh, empty database on the test server (dropped afterwards): its URL."""
    import uuid
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    name = f"crossflow_test_{uuid.uuid4().hex[:12]}"

    def admin(sql: str) -> None:
        with psycopg.connect(postgres_server, connect_timeout=5, autocommit=True) as conn:
            conn.execute(sql)

    admin(f'CREATE DATABASE "{name}"')
    yield urlunsplit(urlsplit(postgres_server)._replace(path=f"/{name}"))
    admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- read-only places (issue 21) -----------------------------------------------------------


@pytest.fixture
def read_only():
    """``make(folder)`` turns an existing folder, with what it holds, read-only for this
    process: permissions for an ordinary user; a read-only bind mount for root (whom
    permissions do not stop), skipped where mounting is not allowed.  Undone afterwards."""
    import stat
    import subprocess

    undo = []

    def make(folder: Path) -> Path:
        folder = Path(folder)
        if os.geteuid() != 0:
            for path in [folder, *folder.rglob("*")]:
                mode = path.stat().st_mode
                undo.append(lambda p=path, m=mode: p.chmod(stat.S_IMODE(m)))
                path.chmod(0o555 if path.is_dir() else 0o444)
            return folder
        for command in (["mount", "--bind", str(folder), str(folder)],
                        ["mount", "-o", "remount,bind,ro", str(folder), str(folder)]):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                if command[1] == "-o":
                    subprocess.run(["umount", str(folder)], capture_output=True)
                pytest.skip(f"root, and a read-only bind mount fails here: {done.stderr}")
        undo.append(lambda: subprocess.run(["umount", str(folder)], capture_output=True))
        return folder

    yield make
    for step in reversed(undo):
        step()
