"""``crossflow ui`` in a real browser: a small study's trials in the MLflow UI.

Runs ``crossflow study run quickstart`` in a temporary folder, starts ``crossflow ui`` there
and drives Debian's Chromium (``/usr/bin/chromium``, installed by ``.ci/run``; Playwright
never downloads a browser here) through the UI as a user would: switch to the model-training
view, open the experiment list, click the study's experiment, follow the study's link that
``crossflow ui`` printed (the runs table with the objective and the design as columns) and
expand the launch's parent run to show the trials' child runs.  The
page must list every trial with its parameter and ``iteration_time_s`` values (compared with
what MLflow stored); a full-page screenshot goes to ``test-artifacts/mlflow-ui.png``
(``$CROSSFLOW_TEST_ARTIFACTS`` overrides the folder).

Without Chromium or Playwright the test skips, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Debian's Chromium (``$CROSSFLOW_TEST_CHROMIUM`` overrides it)
CHROMIUM = os.environ.get("CROSSFLOW_TEST_CHROMIUM") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--no-proxy-server"]  # the server is local, whatever *_proxy says
TRIALS = 12
# MLflow's own SQLAlchemy models trigger this when its store is first used
pytestmark = pytest.mark.filterwarnings("ignore:.*noload.*:DeprecationWarning")
PARAM = "logic_node"            # a searched parameter of the quickstart study
PARAM2 = "area_fractions.core"  # a decoded one
METRIC = "iteration_time_s"


#: urllib without proxies (the servers are on 127.0.0.1, whatever *_proxy says)
LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def artifacts_dir() -> Path:
    path = Path(os.environ.get("CROSSFLOW_TEST_ARTIFACTS") or REPO / "test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def need(reason: str):
    """Skip for ``reason``; under CI=true fail instead."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {reason} (.ci/run installs chromium and pip installs "
                    "'.[test]')", pytrace=False)
    pytest.skip(f"{reason} (apt-get install chromium fonts-dejavu-core; "
                "pip install -e '.[test]')")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    # the checkout under test, also when another one is pip-installed
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    env.setdefault("DO_NOT_TRACK", "true")
    return env


@contextlib.contextmanager
def crossflow_server(cwd: Path, command: str, args: tuple[str, ...], health: str,
                     timeout_s: float):
    """``crossflow COMMAND ARGS --port P`` running in ``cwd`` until ``health`` answers 200;
    yields its base URL.  The server (and its workers) run in their own process group,
    killed at exit; its output is in ``cwd/COMMAND.log``."""
    port = free_port()
    log = open(cwd / f"{command}.log", "w+b")  # noqa: SIM115 - closed in the finally
    proc = subprocess.Popen([sys.executable, "-m", "crossflow.cli", command, *args,
                             "--port", str(port)], cwd=cwd, env=server_env(),
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"crossflow {command} exited with {proc.returncode}:\n{tail(log)}")
            try:
                with LOCAL.open(url + health, timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"crossflow {command} did not answer on {url} in "
                            f"{timeout_s:.0f} s:\n{tail(log)}")
            time.sleep(0.25)
        yield url
    finally:
        stop_group(proc)
        log.close()


def ui_server(cwd: Path, *args: str, timeout_s: float = 90):
    """``crossflow ui ARGS`` running in ``cwd`` (:func:`crossflow_server`)."""
    return crossflow_server(cwd, "ui", args, "/health", timeout_s)


def study_link(cwd: Path, url: str, name: str = "quickstart", timeout_s: float = 30) -> str:
    """The link to ``name``'s runs that ``crossflow ui`` (started in ``cwd``) printed."""
    pattern = re.compile(rf"^\s+{re.escape(name)}: ({re.escape(url)}/\S+)$", re.M)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = pattern.search((cwd / "ui.log").read_text(errors="replace"))
        if found:
            return found[1]
        time.sleep(0.25)
    raise AssertionError(f"crossflow ui printed no link to {name}'s runs:\n"
                         + (cwd / "ui.log").read_text(errors="replace")[-2000:])


def tail(log, n: int = 4000) -> str:
    log.flush()
    log.seek(0)
    return log.read().decode(errors="replace")[-n:]


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # the group's other members (MLflow's workers) may outlive the leader briefly
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return


def stored_trials(cwd: Path) -> dict[str, dict]:
    """{run name: {"params": ..., "metrics": ...}} of the child runs MLflow stored."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{cwd / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("quickstart")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    return {r.info.run_name: {"params": r.data.params, "metrics": r.data.metrics}
            for r in runs if "mlflow.parentRunId" in r.data.tags}


# The runs table (ag-grid) as {row index: {column id: text}}; a row is split between the
# pinned-left and the scrolling containers, joined by its row-index.
GRID_JS = """() => {
  const rows = {};
  for (const row of document.querySelectorAll('.ag-row[row-index]')) {
    const i = row.getAttribute('row-index');
    rows[i] = rows[i] || {};
    for (const cell of row.querySelectorAll('[role="gridcell"][col-id]')) {
      rows[i][cell.getAttribute('col-id')] = cell.innerText.trim();
    }
  }
  return rows;
}"""


def playwright_or_skip():
    """Playwright's ``sync_playwright`` where it and Debian's Chromium are installed (else
    the test is skipped, or fails in CI: :func:`need`)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        need("playwright is not installed")
    if not os.access(CHROMIUM, os.X_OK):
        need(f"{CHROMIUM} is not installed")
    return sync_playwright


@contextlib.contextmanager
def chromium_page(playwright, *, width: int, height: int, failure_shot: Path):
    """A page of Debian's Chromium (headless, a throwaway profile); a screenshot of the whole
    page goes to ``failure_shot`` when the test fails inside."""
    profile = tempfile.mkdtemp(prefix="crossflow-chromium-")
    try:
        ctx = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": width, "height": height})
        try:
            ctx.set_default_timeout(20_000)
            page = ctx.new_page()
            try:
                yield page
            except BaseException:
                with contextlib.suppress(Exception):
                    page.screenshot(path=str(failure_shot), full_page=True)
                raise
        finally:
            ctx.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def cell(row: dict[str, str], name: str) -> str | None:
    """The text of the column whose id names ``name`` (``params.`logic_node``` etc.)."""
    for col, text in row.items():
        if re.search(rf"(^|[.`]){re.escape(name)}(`|$)", col):
            return text
    return None


def test_mlflow_ui_shows_trials_in_chromium(cli, tmp_path, monkeypatch):
    sync_playwright = playwright_or_skip()

    work = tmp_path / "study"
    work.mkdir()
    monkeypatch.chdir(work)
    code, out, err = cli("study", "run", "quickstart", "--trials", TRIALS, "--quiet")
    assert code == 0, out + err
    stored = stored_trials(work)
    assert len(stored) == TRIALS, sorted(stored)

    shot = artifacts_dir() / "mlflow-ui.png"
    with (
        ui_server(work) as url,
        sync_playwright() as p,
        chromium_page(p, width=1600, height=1000,
                      failure_shot=shot.with_name("mlflow-ui-failure.png")) as page,
    ):
        # a study's link opens its runs in the classic view, which this new browser
        # profile has never chosen
        page.goto(study_link(work, url), wait_until="load")
        page.get_by_text("matching runs").first.wait_for()
        page.get_by_role("link", name="Model registry").first.wait_for()
        # MLflow 3 opens in its GenAI view (traces, no runs); crossflow ui says to choose
        # 'Model training', the classic view, whose sidebar has the model registry
        assert "'Model training'" in (work / "ui.log").read_text(errors="replace")
        page.goto(url, wait_until="load")
        page.get_by_text("Model training", exact=True).first.click()
        page.get_by_role("link", name="Model registry").first.wait_for()
        page.get_by_role("link", name="Experiments", exact=True).first.click()
        page.get_by_role("link", name="quickstart", exact=True).first.click()
        page.get_by_text("matching runs").first.wait_for()
        assert "/experiments/" in page.url and "/runs" in page.url, page.url
        # the study's link that crossflow ui prints opens the runs table with the
        # objective and the design as columns (MLflow's default: dataset, source,
        # models), none picked by hand
        page.goto(study_link(work, url), wait_until="load")
        page.get_by_text("matching runs").first.wait_for()
        close = page.get_by_role("button", name="Close", exact=True)
        if close.count():  # the assistant side panel takes a third of the width
            close.first.click()
        # the launch's parent run: expand it to show the trials' child runs
        launch = page.locator(".ag-row").filter(
            has=page.get_by_role("link", name=re.compile(r"^launch-")))
        launch.first.wait_for()
        launch.first.locator("button").first.click()
        page.get_by_role("link", name=f"trial-{TRIALS - 1:05d}").wait_for()
        page.get_by_role("link", name="trial-00000", exact=True).wait_for()
        page.wait_for_timeout(500)  # let the grid settle for the screenshot
        page.screenshot(path=str(shot), full_page=True)

        headers = page.locator(".ag-header-cell").all_inner_texts()
        text = " ".join(headers)
        for name in (METRIC, PARAM, PARAM2):
            assert name in text, f"column {name} not in the header {headers}"
        assert "Dataset" not in text and "Source" not in text, headers
        rows = page.evaluate(GRID_JS)

    shown: dict[str, dict[str, str]] = {}
    for row in rows.values():
        names = [v for k, v in row.items() if "Run Name" in k]
        if names:
            shown[names[0].splitlines()[-1].strip()] = row
    trial_rows = {k: v for k, v in shown.items() if k.startswith("trial-")}
    assert set(trial_rows) == set(stored), (sorted(shown), sorted(stored))
    assert any(k.startswith("launch-") for k in shown), sorted(shown)
    for name, row in trial_rows.items():
        want = stored[name]
        assert cell(row, PARAM) == want["params"][PARAM], (name, row)
        assert math.isclose(float(cell(row, PARAM2)), float(want["params"][PARAM2]),
                            rel_tol=1e-6), (name, row)
        if METRIC in want["metrics"]:
            assert math.isclose(float(cell(row, METRIC)), want["metrics"][METRIC],
                                rel_tol=1e-6), (name, row)
        else:  # an infeasible design: no time (its penalty is penalty.iteration_time_s)
            assert cell(row, METRIC) in ("-", ""), (name, row)
    assert sum(METRIC in w["metrics"] for w in stored.values()) >= len(stored) // 2
    assert shot.stat().st_size > 10_000
