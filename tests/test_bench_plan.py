"""benchmarks/bench_plan.py, the tool the driver's settings are chosen with: its runs are
the driver's (a study makes the same evaluations), and ``--jitter`` samples the schedule."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

bench_plan = pytest.importorskip("bench_plan")


def test_a_jittered_start_is_another_run_and_the_same_one_again():
    """Seed 0 starts from the template's split whatever the jitter; a seed above 0 starts
    elsewhere, and the same seed from the same place (the runs are reproducible)."""
    plain = bench_plan.run("quickstart", 40, 0, {})
    assert bench_plan.run("quickstart", 40, 0, {}, jitter=0.05) == plain
    # the seed alone changes nothing this early: what differs below is the start
    assert bench_plan.run("quickstart", 40, 1, {}) == plain
    shaken = bench_plan.run("quickstart", 40, 1, {}, jitter=0.05)
    assert len(shaken) == len(plain) == 40
    assert shaken != plain
    assert bench_plan.run("quickstart", 40, 1, {}, jitter=0.05) == shaken
    assert any(math.isfinite(v) for v in shaken)


def test_references_come_from_the_suite_table_or_a_json_object(tmp_path):
    """``--references`` reads the committed suite.csv (one reference per study, repeated on
    its rows) or a JSON object, to the same values."""
    table = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "suite.csv"
    refs = bench_plan.references(table)
    assert len(refs) == 28 and all(v > 0 for v in refs.values())
    again = tmp_path / "refs.json"
    again.write_text(__import__("json").dumps(refs))
    assert bench_plan.references(again) == refs


def test_a_trace_accounts_for_every_local_search_turn_and_changes_nothing():
    """``--trace`` records the local searches' turns without changing the run: the turns
    lie inside the run in order, none overlaps another, each ends no worse than it began,
    and the best turn's value is the run's best after the race."""
    plain = bench_plan.run("quickstart", 400, 0, {})
    turns: list[dict] = []
    traced = bench_plan.run("quickstart", 400, 0, {}, searches=turns)
    assert traced == plain
    # the compass (a run of its own) won the race here, the local search took over after it
    assert turns and {t["phase"] for t in turns} >= {"race", "compass", "search"}
    for a, b in zip(turns, turns[1:], strict=False):
        assert a["last"] <= b["first"]
    for t in turns:
        assert 0 <= t["first"] < t["last"] <= len(plain)
        assert t["value"] <= t["start"]
        # a turn's best is among the values up to its last evaluation
        assert min(plain[:t["last"]]) <= t["value"]
    assert min(t["value"] for t in turns) == min(plain[turns[0]["first"]:])
    # untraced again in the same process: the local search is the plan's own once more
    assert bench_plan.run("quickstart", 400, 0, {}) == plain
    from crossflow.search.samplers.structured import _plan
    assert _plan._Local.advance is _plan._Local._untraced_advance


@pytest.mark.parametrize("variants, said", [
    ('{"off": {"plan": {"SIDE_COMPASS": false}}}', ("'off'", "SIDE_COMPASS", "COMPASS_RACE")),
    ('{"pso": {"scipy_alone": {"method": "pso"}}}', ("'pso'", "'pso'", "de, nelder-mead"))])
def test_a_variant_the_benchmark_cannot_run_is_refused(monkeypatch, capsys, variants, said):
    """A constant the plan has no longer (or a misspelt one) would be set and never read, so
    the variant would measure the default under another name; a scipy method it does not
    run would fail in every worker: both refused before anything runs, naming the variant,
    the value and what is allowed."""
    monkeypatch.setattr(sys, "argv", [
        "bench_plan.py", "--shipped", "quickstart", "--budgets", "10", "--seeds", "1",
        "--variants", variants])
    with pytest.raises(SystemExit) as exit_:
        bench_plan.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert all(s in err for s in said)


def test_a_selection_with_no_study_is_refused_not_a_traceback(monkeypatch, capsys):
    """A table with no study of the kind asked for (fresh5 has no budgets-only study) says
    so and exits 2, instead of running nothing and failing on an empty median."""
    table = Path(bench_plan.__file__).parent / "suite" / "fresh5.yaml"
    monkeypatch.setattr(sys, "argv", [
        "bench_plan.py", "--study-table", str(table), "--half", "all", "--kind", "budgets",
        "--budgets", "10"])
    with pytest.raises(SystemExit) as exit_:
        bench_plan.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "no study of" in err and "fresh5.yaml" in err and "budgets" in err


def test_cma_alone_is_a_reproducible_baseline_after_the_same_baseline_trials():
    """``{"cma_alone": SIGMA}`` runs CMA-ES alone instead of the plan: the study's baseline
    trials first (the same values as the plan's run), then whole generations cut to the
    budget; the same seed gives the same run, another seed another."""
    from crossflow.search.study import load_study

    first = len(load_study("quickstart").baseline_trials())
    plain = bench_plan.run("quickstart", 60, 0, {})
    alone = bench_plan.run("quickstart", 60, 0, {"cma_alone": 1.0})
    assert len(alone) == 60 and alone[:first] == plain[:first]
    assert alone[first:] != plain[first:]
    assert any(math.isfinite(v) for v in alone[first:])
    assert bench_plan.run("quickstart", 60, 0, {"cma_alone": 1.0}) == alone
    assert bench_plan.run("quickstart", 60, 1, {"cma_alone": 1.0}) != alone
    # the mapping form is the same run, and passes its other keys to cmaes.CMA
    assert bench_plan.run("quickstart", 60, 0, {"cma_alone": {"sigma": 1.0}}) == alone
    adapted = bench_plan.run("quickstart", 60, 0, {"cma_alone": {"sigma": 1.0,
                                                                 "lr_adapt": True}})
    assert adapted[:first] == alone[:first] and adapted[first:] != alone[first:]


def test_turbo_alone_is_a_reproducible_baseline_that_starts_from_the_template():
    """``{"turbo_alone": {...}}`` runs TuRBO-1 instead of the plan: the baseline trials,
    then TuRBO's batches around the template's split (a baseline trial, told to it, not
    evaluated again); the same seed gives the same run, another seed another."""
    from crossflow.search.study import load_study

    first = len(load_study("quickstart").baseline_trials())
    plain = bench_plan.run("quickstart", 40, 0, {})
    turbo = bench_plan.run("quickstart", 40, 0, {"turbo_alone": {"n_init": 4}})
    assert len(turbo) == 40 and turbo[:first] == plain[:first]
    assert turbo[first:] != plain[first:]
    assert turbo[0] not in turbo[first:]  # the template is not priced twice
    assert any(math.isfinite(v) for v in turbo[first:])
    assert bench_plan.run("quickstart", 40, 0, {"turbo_alone": {"n_init": 4}}) == turbo
    assert bench_plan.run("quickstart", 40, 1, {"turbo_alone": {"n_init": 4}}) != turbo


@pytest.mark.parametrize("options", [{"popsize": 2}, {"method": "nelder-mead"}])
def test_scipy_alone_fills_the_budget_reproducibly_from_the_template(options):
    """``{"scipy_alone": {...}}`` runs differential evolution or Nelder-Mead instead of the
    plan: the baseline trials, then the optimiser's points cut to the budget exactly
    (restarted when it converges first), the template's split among the first; the same
    seed gives the same run, another seed another (Nelder-Mead, deterministic, the same)."""
    from crossflow.search.study import load_study

    first = len(load_study("quickstart").baseline_trials())
    plain = bench_plan.run("quickstart", 300, 0, {})
    alone = bench_plan.run("quickstart", 300, 0, {"scipy_alone": dict(options)})
    assert len(alone) == 300 and alone[:first] == plain[:first]
    # the template's split (clipped inside the bounds) is among its first points
    assert any(v == pytest.approx(alone[0], rel=1e-6) for v in alone[first:first + 16])
    assert min(v for v in alone[first:] if math.isfinite(v)) < 0.9 * alone[0]
    assert bench_plan.run("quickstart", 300, 0, {"scipy_alone": dict(options)}) == alone
    other = bench_plan.run("quickstart", 300, 1, {"scipy_alone": dict(options)})
    assert (other == alone) == (options.get("method") == "nelder-mead")
    if "popsize" in options:  # two generations a run: restarted until the budget is spent
        short = bench_plan.run("quickstart", 300, 0, {"scipy_alone": {**options,
                                                                      "maxiter": 2}})
        assert len(short) == 300 and short[:first + 16] == alone[:first + 16]
        assert short[first + 16:] != alone[first + 16:]


def test_turbo_gp_gradient_matches_finite_differences_and_its_fit_predicts():
    """The marginal likelihood's analytic gradient (what Adam fits the length-scales by)
    agrees with central differences, and the fitted GP's posterior mean interpolates a
    smooth function at points it has not seen better than the data's mean does."""
    import numpy as np
    import turbo

    rng = np.random.default_rng(0)
    X = rng.random((40, 3))
    y = np.sin(3 * X[:, 0]) + X[:, 1] ** 2
    gp = turbo.GP(X, y)
    theta = gp.theta + 0.05
    _, grad = gp.nll(theta)
    for i in range(len(theta)):
        step = np.zeros_like(theta)
        step[i] = 1e-5
        numeric = (gp.nll(theta + step)[0] - gp.nll(theta - step)[0]) / 2e-5
        assert abs(numeric - grad[i]) <= 1e-4 * max(1.0, abs(numeric))
    Z = rng.random((20, 3))
    truth = np.sin(3 * Z[:, 0]) + Z[:, 1] ** 2
    draws = gp.sample(Z, 64, rng)
    assert np.abs(draws.mean(0) - truth).mean() < 0.25 * np.abs(y.mean() - truth).mean()
