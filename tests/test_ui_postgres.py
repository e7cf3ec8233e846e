"""``crossflow ui`` on an MLflow tracking store in PostgreSQL (issue 6).

A study logs to a fresh PostgreSQL database (``postgres_url``, see conftest: skipped without
``CROSSFLOW_TEST_POSTGRES``, failed under ``CI=true``), then ``crossflow ui --tracking-uri``
serves it: over the server's REST API, the study's experiment holds the launch's parent run
and exactly one child run per trial, each with its parameters and ``iteration_time_s``.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

import pytest
from test_ui_browser import LOCAL, ui_server  # tests/ is on sys.path, as for conftest

pytestmark = pytest.mark.filterwarnings("ignore:.*noload.*:DeprecationWarning")
TRIALS = 10


def api(base: str, path: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data,
                                 headers={"Content-Type": "application/json"},
                                 method="GET" if body is None else "POST")
    with LOCAL.open(req, timeout=30) as resp:
        return json.loads(resp.read().decode())


def all_runs(base: str, experiment_id: str) -> list[dict]:
    runs: list[dict] = []
    body = {"experiment_ids": [experiment_id], "max_results": 1000}
    while True:
        page = api(base, "/api/2.0/mlflow/runs/search", body)
        runs += page.get("runs", [])
        if not page.get("next_page_token"):
            return runs
        body["page_token"] = page["next_page_token"]


def kv(items: list[dict] | None) -> dict[str, object]:
    return {i["key"]: i["value"] for i in items or []}


def test_ui_serves_a_study_tracked_in_postgres(cli, postgres_url, tmp_path, monkeypatch):
    work = tmp_path / "study"
    work.mkdir()
    monkeypatch.chdir(work)
    code, out, err = cli("study", "run", "quickstart", "--trials", TRIALS, "--quiet",
                         "--tracking-uri", postgres_url)
    assert code == 0, out + err
    assert "MLflow logging had errors" not in err, err
    assert not (work / "mlruns" / "mlflow.db").exists()  # the runs went to PostgreSQL

    with ui_server(work, "--tracking-uri", postgres_url) as base:
        name = urllib.parse.quote("quickstart")
        exp = api(base, f"/api/2.0/mlflow/experiments/get-by-name?experiment_name={name}")
        experiment_id = exp["experiment"]["experiment_id"]
        runs = all_runs(base, experiment_id)

    parents = [r for r in runs if "mlflow.parentRunId" not in kv(r["data"].get("tags"))]
    children = [r for r in runs if "mlflow.parentRunId" in kv(r["data"].get("tags"))]
    assert len(parents) == 1, [r["info"].get("run_name") for r in parents]
    parent_id = parents[0]["info"]["run_id"]
    assert len(children) == TRIALS, [r["info"].get("run_name") for r in children]
    numbers = set()
    for run in children:
        tags = kv(run["data"].get("tags"))
        params = kv(run["data"].get("params"))
        metrics = kv(run["data"].get("metrics"))
        assert tags["mlflow.parentRunId"] == parent_id
        numbers.add(int(tags["trial_number"]))
        assert run["info"]["run_name"] == f"trial-{int(tags['trial_number']):05d}"
        assert params.get("logic_node"), params
        # an infeasible design's value is its penalty, kept apart from real times
        key = ("penalty." if tags.get("feasible") == "false" else "") + "iteration_time_s"
        assert float(metrics[key]) > 0, metrics
    assert numbers == set(range(TRIALS))


def test_workers_log_to_a_tracking_server_on_postgres(postgres_url, tmp_path):
    """``--tracking-uri http://…``: a study with 2 workers logs through a tracking server
    (``crossflow ui`` on a PostgreSQL store, MLflow's REST API, no direct SQL): one run per
    trial."""
    import subprocess
    import sys

    from test_ui_browser import server_env

    server_dir, work = tmp_path / "server", tmp_path / "study"
    server_dir.mkdir()
    work.mkdir()
    with ui_server(server_dir, "--tracking-uri", postgres_url) as base:
        run = subprocess.run(
            [sys.executable, "-m", "crossflow", "study", "run", "quickstart", "--trials", "30",
             "--workers", "2", "--quiet", "--tracking-uri", base],
            cwd=work, env=server_env(), capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "MLflow logging had errors" not in run.stderr, run.stderr
        exp = api(base, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=quickstart")
        runs = all_runs(base, exp["experiment"]["experiment_id"])
    children = [r for r in runs if "mlflow.parentRunId" in kv(r["data"].get("tags"))]
    numbers = sorted(int(kv(r["data"]["tags"])["trial_number"]) for r in children)
    assert numbers == list(range(30))
    assert all({"iteration_time_s", "penalty.iteration_time_s"} & set(kv(r["data"].get(
        "metrics"))) for r in children)
