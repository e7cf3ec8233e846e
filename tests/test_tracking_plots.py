"""The summary figures of a study's MLflow parent run, checked on their inputs (not pixels):
the history plots feasible values only, in readable units; importance is computed on the
decoded design (budget fractions, strategy), not on the sampler's encoded coordinates."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState

from crossflow.search import _plots, encoding
from crossflow.search.objective import PENALTY
from crossflow.search.tracking.records import decoded_params

optuna.logging.set_verbosity(optuna.logging.WARNING)
COMPONENTS = ["core", "L1", "dram_ctrl"]
SPACE = {"simplexes": {"area": {"components": COMPONENTS, "fixed": {"inter_links": 0.1},
                                "share": 0.9, "span": encoding.SPAN}},
         "dimensions": {"strategy": ["RC-4-2", "CR-8"]}}


def trial(number: int, fractions: list[float], strategy: str, *, feasible: bool = True,
          state: TrialState = TrialState.COMPLETE, record: bool = True):
    """A CrossFlow-like trial: encoded simplex parameters; the objective's decoded user
    attributes (``record``); an infeasible design valued by the penalty."""
    raw = dict(zip(encoding.param_names("area", COMPONENTS), encoding.encode(fractions),
                   strict=True))
    dists = {k: FloatDistribution(-encoding.SPAN, encoding.SPAN) for k in raw}
    dists["strategy"] = CategoricalDistribution(["RC-4-2", "CR-8"])
    shares = dict(zip(COMPONENTS, [f * 0.9 for f in fractions[:-1]], strict=True))
    user = {"feasible": feasible}
    if record:
        user.update({"area_fractions": {**shares, "inter_links": 0.1}, "strategy": strategy,
                     "mapping_order": "kp1-dp"})
    t_s = 0.004 + 0.01 * (1 - shares["core"]) + (0.002 if strategy == "CR-8" else 0.0)
    value = None
    if state == TrialState.COMPLETE:
        value = t_s if feasible else PENALTY * 1.5
        if feasible:
            user["iteration_time_s"] = t_s
    t = optuna.trial.create_trial(params={**raw, "strategy": strategy}, distributions=dists,
                                  value=value, state=state, user_attrs=user)
    t.number = number
    t.datetime_start = datetime(2026, 1, 1) + timedelta(seconds=number)
    return t


def trials():
    out = []
    for n in range(24):
        core = 0.1 + 0.03 * n
        rest = 1.0 - core
        fr = [core, rest * 0.3, rest * 0.2, rest * 0.5]
        out.append(trial(n, fr, "CR-8" if n % 3 == 0 else "RC-4-2", feasible=n % 5 != 4,
                         state=TrialState.PRUNED if n == 7 else
                         TrialState.FAIL if n == 11 else TrialState.COMPLETE))
    return out


def test_history_series_leave_the_penalties_out_and_carry_units():
    ts = trials()
    s, = _plots.history_series(ts, ["minimize"], ["iteration_time_s"])
    feasible = sorted(t.number for t in ts if t.state == TrialState.COMPLETE
                      and t.user_attrs["feasible"])
    assert list(s["x"]) == feasible
    assert max(s["y"]) < 1.0 and PENALTY * 1.5 not in list(s["y"])  # no penalty plotted
    assert s["infeasible"] == [4, 9, 14, 19] and s["pruned"] == [7] and s["failed"] == [11]
    assert all(b2 <= b1 for b1, b2 in zip(s["best"], s["best"][1:], strict=False))
    assert s["best"][-1] == min(s["y"])
    assert (s["scale"], s["unit"], s["ylabel"]) == (1e-3, "ms", "iteration time (ms)")
    assert s["log"] is False


def test_history_png_hands_matplotlib_the_feasible_values_only(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    drawn = []
    real = Axes.scatter

    def spy(self, x, y, *args, **kwargs):
        drawn.append(list(y))
        return real(self, x, y, *args, **kwargs)

    monkeypatch.setattr(Axes, "scatter", spy)
    _plots.history_png(tmp_path / "h.png", trials(), ["minimize"], ["iteration_time_s"], "t")
    (ys,) = drawn
    assert len(ys) == 18 and max(ys) < 20  # milliseconds, no 1.5e12
    assert (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"


def test_history_of_a_maximised_objective_in_prefixed_units():
    t = [optuna.trial.create_trial(value=v, state=TrialState.COMPLETE)
         for v in (2e14, 3e14, 2.5e14)]
    for i, x in enumerate(t):
        x.number = i
    s, = _plots.history_series(t, ["maximize"], ["achieved_flops_per_s"])
    assert list(s["best"]) == [2e14, 3e14, 3e14]
    assert (s["scale"], s["unit"], s["ylabel"]) == (1e12, "TFLOP/s", "achieved (TFLOP/s)")


def test_decoded_params_replace_the_encoded_simplex_by_its_fractions():
    t = trials()[0]
    got = decoded_params(t)
    assert not any(k.startswith("area.") for k in got)  # no logits, no slack
    assert got["area_fractions.core"] == pytest.approx(0.1 * 0.9)
    assert got["area_fractions.inter_links"] == 0.1 and got["strategy"] == "CR-8"
    # a trial without the objective's record: decoded from the search space
    bare = trial(3, [0.4, 0.1, 0.2, 0.3], "RC-4-2", record=False)
    fr = decoded_params(bare, SPACE)
    assert {k for k in fr if k.startswith("area")} == {
        "area_fractions.core", "area_fractions.L1", "area_fractions.dram_ctrl",
        "area_fractions.inter_links"}
    assert fr["area_fractions.core"] == pytest.approx(0.4 * 0.9, rel=1e-9)
    assert fr["area_fractions.dram_ctrl"] == pytest.approx(0.2 * 0.9, rel=1e-9)


def test_importance_is_computed_on_decoded_parameters_of_feasible_designs():
    ts = trials()
    params, values, constant = _plots.importance_inputs(ts, SPACE)
    assert len(params) == len(values) == 18  # complete and feasible
    assert set(params[0]) == {"area_fractions.core", "area_fractions.L1",
                              "area_fractions.dram_ctrl", "strategy"}
    assert "area_fractions.inter_links" in constant and "mapping_order" in constant
    assert all(v[0] < 1 for v in values)  # no penalty in the target
    scores, method, _ = _plots.importance_scores(params, [v[0] for v in values], "minimize")
    assert method == _plots.IMPORTANCE_METHOD
    assert set(scores) == set(params[0])
    assert max(scores, key=scores.get) in ("area_fractions.core", "area_fractions.L1",
                                           "area_fractions.dram_ctrl")
    assert math.isclose(sum(scores.values()), 1.0, rel_tol=1e-6)


def test_importance_figure_labels_are_an_architects(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    bars = []
    real = Axes.barh

    def spy(self, y, width, *args, **kwargs):
        bars.append(list(y))
        return real(self, y, width, *args, **kwargs)

    monkeypatch.setattr(Axes, "barh", spy)
    method = _plots.importance_png(tmp_path / "i.png", trials(), ["iteration_time_s"], "t",
                                   directions=["minimize"], space=SPACE)
    assert method == _plots.IMPORTANCE_METHOD
    (labels,) = bars
    assert set(labels) == {"area fraction: core", "area fraction: L1",
                           "area fraction: DRAM controller", "parallelism strategy"}


def test_labels():
    assert _plots.label("area_fractions.dram_ctrl") == "area fraction: DRAM controller"
    assert _plots.label("power_fractions.core") == "power fraction: core"
    assert _plots.label("iteration_time_s") == "iteration time (s)"
    assert _plots.label("energy_J") == "energy (J)"
    assert _plots.label("tdp_W") == "TDP (W)" and _plots.label("logic_node").startswith("logic")
    assert _plots.si_scale([0.004, 0.006], "s") == (1e-3, "ms")
    assert _plots.si_scale([3.0e5], "J") == (1e3, "kJ")
    assert _plots.si_scale([2e14], "FLOP/s") == (1e12, "TFLOP/s")


def test_the_constant_parameters_are_all_named_not_cut():
    """The importance plot's heading named the first few constant parameters and an
    ellipsis; it names each, grouped by simplex, on as many lines as they need."""
    constant = ["area_fractions.inter_links", "area_fractions.intra_links",
                "power_fractions.inter_links", "power_fractions.intra_links", "logic_node"]
    note = _plots.constant_note(constant, width=60)
    flat = " ".join(note.split())
    assert "…" not in note and all(len(line) <= 60 for line in note.splitlines())
    assert flat.startswith("constant, not shown: area fraction: inter-node links, "
                           "intra-node links; power fraction: inter-node links, intra-node "
                           "links; ")
    assert flat.endswith(_plots.label("logic_node"))


def _summary_msg():
    from crossflow.search.tracking.records import _serialize

    return {"study_name": "plots", "directions": ["minimize"],
            "metric_names": ["iteration_time_s"], "sampler": "tpe", "best_design": None,
            "space": SPACE, "trials": [_serialize(t) for t in trials()]}


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork here")
def test_the_logging_process_draws_the_figures_in_children_to_the_same_summary(
        tmp_path, monkeypatch):
    import os

    from crossflow.search.tracking.summary import render_summary

    drawn_by = tmp_path / "drawn_by"
    drawn_by.mkdir()

    def recorded(name):
        real = getattr(_plots, name)

        def draw(*args, **kwargs):
            (drawn_by / f"{name}.{os.getpid()}").touch()
            return real(*args, **kwargs)
        return draw

    for name in ("history_png", "importance_png"):
        monkeypatch.setattr(_plots, name, recorded(name))
    got, msg = {}, _summary_msg()
    for fork in (False, True):
        out = tmp_path / str(fork)
        out.mkdir()
        got[fork] = render_summary(out, msg, fork=fork)
        assert sorted(p.name for p in out.iterdir()) == [
            "best_design.yaml", "optimization_history.png", "param_importances.png",
            "trials.csv"]
        assert all(p.stat().st_size > 0 for p in out.iterdir())
    assert got[True] == got[False]
    assert got[True][1]["importance_method"] == _plots.IMPORTANCE_METHOD
    assert (tmp_path / "True" / "trials.csv").read_text() == (
        tmp_path / "False" / "trials.csv").read_text()
    # each figure drawn once here (serial) and once in a child of its own (forked)
    pids = sorted((p.suffix[1:], p.stem) for p in drawn_by.iterdir())
    here = [name for pid, name in pids if pid == str(os.getpid())]
    away = {pid: name for pid, name in pids if pid != str(os.getpid())}
    assert sorted(here) == ["history_png", "importance_png"]
    assert sorted(away.values()) == ["history_png", "importance_png"]


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork here")
def test_a_figure_whose_child_fails_is_drawn_again_here(tmp_path):
    import os

    from crossflow.search.children import forked

    parent = os.getpid()
    calls = []

    def in_child_only_fails() -> str:
        calls.append(os.getpid())
        if os.getpid() != parent:
            raise RuntimeError("the child's figure failed")
        return "drawn here"

    assert forked(in_child_only_fails, 60)() == "drawn here"
    assert calls == [parent]  # the child's attempt is not seen here; this one's is
    assert forked(lambda: "drawn in the child", 60)() == "drawn in the child"


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork here")
def test_a_figure_whose_child_hangs_is_stopped_and_drawn_here():
    import os
    import time

    from crossflow.search.children import forked

    parent = os.getpid()

    def hangs_in_the_child() -> str:
        if os.getpid() != parent:
            time.sleep(60)
        return "drawn here"

    t0 = time.monotonic()
    assert forked(hangs_in_the_child, timeout_s=0.5)() == "drawn here"
    assert time.monotonic() - t0 < 10
