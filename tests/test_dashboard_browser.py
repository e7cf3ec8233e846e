"""``crossflow dashboard`` in a real browser: a trial's decoded design in optuna-dashboard.

Runs ``crossflow study run quickstart`` (a few trials, no MLflow) in a temporary folder,
starts ``crossflow dashboard quickstart`` there and drives Debian's Chromium (the same
browser, options and skip rules as ``tests/test_ui_browser.py``) as a user would: open the
study's best feasible trial in the trial list and read its decoded design
(``design.area_fractions.core 43.7 %``, ``design.logic_node N5``; the parameters are the
samplers' logits), then the study's history page, whose timeline marks the infeasible
trials (Optuna constraints).  The trial's page is saved as ``test-artifacts/dashboard.png``
(``$CROSSFLOW_TEST_ARTIFACTS`` overrides the folder).
"""

from __future__ import annotations

from pathlib import Path

from test_ui_browser import (
    artifacts_dir,
    chromium_page,
    crossflow_server,
    playwright_or_skip,
)

TRIALS = 12


def dashboard_server(cwd: Path, *args: str, timeout_s: float = 60):
    """``crossflow dashboard ARGS`` running in ``cwd`` (:func:`crossflow_server`)."""
    return crossflow_server(cwd, "dashboard", args, "/api/studies", timeout_s)


def best_feasible(work: Path):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(work / "mlruns/optuna/quickstart.journal")))
    trials = optuna.load_study(study_name="quickstart", storage=storage).trials
    feasible = [t for t in trials if t.user_attrs.get("feasible")]
    assert feasible and len(feasible) < len(trials), "want feasible and infeasible trials"
    return min(feasible, key=lambda t: t.value)


def test_dashboard_shows_decoded_designs_in_chromium(cli, tmp_path, monkeypatch):
    sync_playwright = playwright_or_skip()

    work = tmp_path / "study"
    work.mkdir()
    monkeypatch.chdir(work)
    # TPE: its first trials include infeasible designs, which the driver never makes
    code, out, err = cli("study", "run", "quickstart", "--trials", TRIALS, "--no-tracking",
                         "--sampler", "tpe", "--quiet")
    assert code == 0, out + err
    best = best_feasible(work)
    core = best.user_attrs["area_fractions"]["core"]
    assert core >= 0.001
    want = f"design.area_fractions.core {100 * core:.1f} %"
    logic = f"design.logic_node {best.params['logic_node']}"

    shot = artifacts_dir() / "dashboard.png"
    with (
        dashboard_server(work, "quickstart") as url,
        sync_playwright() as p,
        chromium_page(p, width=1400, height=900,
                      failure_shot=shot.with_name("dashboard-failure.png")) as page,
    ):
        page.goto(f"{url}/dashboard/studies/0/trials?numbers={best.number}",
                  wait_until="load")
        page.get_by_text(f"Trial {best.number} (trial_id=").wait_for()
        # the decoded design, first among the user attributes; the logits stay
        # the parameters
        page.get_by_text(want, exact=True).wait_for()
        assert page.get_by_text(logic, exact=True).is_visible()
        assert page.get_by_text("Best Trial", exact=True).first.is_visible()
        page.wait_for_timeout(300)
        page.screenshot(path=str(shot))
        # infeasible trials are Optuna constraints: the timeline marks them
        page.goto(f"{url}/dashboard/studies/0", wait_until="load")
        page.locator("svg text", has_text="Infeasible").first.wait_for(
            state="attached")
        page.get_by_text("iteration_time_s").first.wait_for(state="attached")
    assert shot.stat().st_size > 10_000
