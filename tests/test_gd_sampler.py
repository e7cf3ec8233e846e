"""The ``gd`` sampler (DeepFlow §7, eq. 6): projection, step and momentum arithmetic,
convergence on toy quadratics over simplexes, categorical neighbour moves, determinism,
resume from storage, several workers on one journal, and Optuna's sampler contract tests."""

from __future__ import annotations

import itertools
import math
import pickle
import subprocess
import sys
import textwrap
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.testing.pytest_samplers import (
    BasicSamplerTestCase,
    RelativeSamplerTestCase,
    SingleOnlySamplerTestCase,
)
from optuna.trial import TrialState

from crossflow.search import encoding
from crossflow.search.samplers.gd import GDSampler
from crossflow.search.samplers.gd._moves import neighbour
from crossflow.search.samplers.gd._simplex import mix_towards_vertex, project_onto_simplex
from crossflow.search.samplers.gd._update import eq6_step, simplex_gradient, tiered_gradient

REPO = Path(__file__).resolve().parents[1]
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _fractions(params, simplex, components):
    return np.array(encoding.decode([params[n] for n in
                                     encoding.param_names(simplex, components)]))


def _quadratic(simplex, components, target):
    """‖x − target‖² over the decoded fractions (slack last); its minimum over the
    simplex is the projection of ``target``."""
    names = encoding.param_names(simplex, components)
    target = np.asarray(target, dtype=float)

    def objective(trial):
        x = np.array(encoding.decode(
            [trial.suggest_float(n, -encoding.SPAN, encoding.SPAN) for n in names]))
        return float(((x - target) ** 2).sum())

    return objective


def _trajectory(study):
    return [(t.number, t.state, t.params, t.system_attrs.get("gd:chain"),
             t.system_attrs.get("gd:step"), t.system_attrs.get("gd:role"))
            for t in study.get_trials(deepcopy=False)]


# --- projection onto the simplex --------------------------------------------------------


def _brute_force_projection(v):
    """Exact, by enumeration: the projection is the closest of the feasible projections of
    v onto the affine hulls of the faces {x_S: Σx_S = 1, x_rest = 0}."""
    best, best_d = None, math.inf
    for k in range(1, len(v) + 1):
        for support in itertools.combinations(range(len(v)), k):
            x = np.zeros(len(v))
            idx = list(support)
            x[idx] = v[idx] - (v[idx].sum() - 1.0) / k
            if x.min() >= -1e-12 and np.linalg.norm(x - v) < best_d:
                best, best_d = x, np.linalg.norm(x - v)
    return best


vectors = st.lists(st.floats(-5, 5, allow_nan=False, allow_infinity=False),
                   min_size=1, max_size=6).map(np.array)


@given(vectors)
@settings(max_examples=200, deadline=None)
def test_projection_is_on_the_simplex_idempotent_and_closest(v):
    x = project_onto_simplex(v)
    assert x.min() >= 0 and math.isclose(x.sum(), 1.0, abs_tol=1e-12)
    np.testing.assert_allclose(project_onto_simplex(x), x, atol=1e-12)
    np.testing.assert_allclose(x, _brute_force_projection(v), atol=1e-9)


def test_projection_by_hand():
    np.testing.assert_allclose(project_onto_simplex(np.array([0.6, 0.5, -0.1, 0.0])),
                               [0.55, 0.45, 0.0, 0.0])
    np.testing.assert_allclose(project_onto_simplex(np.array([0.2, 0.3, 0.5])), [0.2, 0.3, 0.5])
    np.testing.assert_allclose(project_onto_simplex(np.array([3.0, 0.0])), [1.0, 0.0])
    with pytest.raises(ValueError):
        project_onto_simplex(np.array([np.nan, 1.0]))


def test_probe_stays_on_the_simplex_and_can_grow_a_zero():
    x = mix_towards_vertex(np.array([0.7, 0.3, 0.0]), 2, 0.1)
    np.testing.assert_allclose(x, [0.63, 0.27, 0.1])
    assert math.isclose(x.sum(), 1.0)


# --- gradient, step and momentum by hand ------------------------------------------------


def test_gradient_step_and_momentum_by_hand():
    w = np.array([0.5, 0.3, 0.2])
    # d = (f_i − f_0)/h = [1, −1, 0]; mean 0, so g = d.
    g = simplex_gradient(1.0, [1.1, 0.9, 1.0], 0.1)
    np.testing.assert_allclose(g, [1.0, -1.0, 0.0], atol=1e-12)
    m = np.array([0.4, 0.4, 0.2])
    w_new, m_new = eq6_step(w, m, g, learning_rate=0.2, beta=0.9)
    stepped = w - 0.2 * np.array([1, -1, 0]) / math.sqrt(2)  # W' = W − η·g/‖g‖
    np.testing.assert_allclose(m_new, 0.9 * m + 0.1 * stepped)  # M = βM + (1 − β)W'
    np.testing.assert_allclose(w_new, m_new)  # inside the simplex: the projection is M
    np.testing.assert_allclose(m_new, [0.4 - 0.02 / math.sqrt(2) + 0.01,
                                       0.4 + 0.02 / math.sqrt(2) - 0.01, 0.2])
    # Outside: projected.
    w_new, m_new = eq6_step(np.array([0.0, 1.0]), np.array([0.0, 1.0]),
                            np.array([1.0, -1.0]), learning_rate=1.0, beta=0.0)
    np.testing.assert_allclose(w_new, [0.0, 1.0])
    # Zero gradient: no step, the average still moves.
    w_new, _ = eq6_step(w, m, np.zeros(3), learning_rate=0.2, beta=0.5)
    np.testing.assert_allclose(w_new, 0.5 * m + 0.5 * w)


def test_gradient_centres_the_directional_derivatives():
    # Linear f = c·x: probe i moves by h(e_i − w), so d_i = c_i − c·w and g = c − mean(c).
    c, w, h = np.array([3.0, 1.0, 2.0, 0.0]), np.array([0.1, 0.2, 0.3, 0.4]), 0.05
    probes = [c @ mix_towards_vertex(w, i, h) for i in range(4)]
    np.testing.assert_allclose(simplex_gradient(c @ w, probes, h), c - c.mean(), atol=1e-12)


def test_gradient_with_infeasible_trials():
    inf = math.inf
    # From a feasible base the infeasible probes set the direction (step away from them).
    np.testing.assert_allclose(simplex_gradient(1.0, [inf, 0.5, 2.0], 0.1),
                               [2 / 3, -1 / 3, -1 / 3])
    # From an infeasible base the feasible probes do (step towards them).
    np.testing.assert_allclose(simplex_gradient(inf, [inf, 0.5, inf], 0.1),
                               [1 / 3, -2 / 3, 1 / 3])
    np.testing.assert_allclose(simplex_gradient(inf, [inf, inf], 0.1), [0.0, 0.0])
    # Equal up to float noise: no direction.
    np.testing.assert_allclose(simplex_gradient(1.0, [1.0 + 1e-16, 1.0], 0.01), [0.0, 0.0])


def test_tiered_losses():
    feasible, violated, unknown = 0, 1, 2
    # Same tier: ordinary differences (here of the constraint violation).
    np.testing.assert_allclose(
        tiered_gradient((violated, 0.5), [(violated, 0.6), (violated, 0.4)], 0.1),
        [1.0, -1.0], atol=1e-12)
    # A feasible probe from a violated base: towards it.
    np.testing.assert_allclose(
        tiered_gradient((violated, 0.5), [(feasible, 9.0), (violated, 0.4), (unknown, 0.0)],
                        0.1), [-1.0, 0.0, 1.0])
    np.testing.assert_allclose(tiered_gradient((unknown, 0.0), [(unknown, 0.0)] * 3, 0.1),
                               [0.0, 0.0, 0.0])


def test_first_step_through_the_storage_matches_the_hand_computation():
    # A linear objective over a 3-component simplex: after the base and its 4 probes, the
    # next base's state is eq. 6 applied to g = c − mean(c).
    components, c = ["a", "b", "c"], np.array([3.0, 1.0, 2.0, 0.0])
    names = encoding.param_names("s", components)

    def objective(trial):
        return float(c @ encoding.decode([trial.suggest_float(n, -4, 4) for n in names]))

    sampler = GDSampler(simplexes={"s": components}, seed=3, learning_rate=0.3, beta=0.8)
    study = optuna.create_study(sampler=sampler)
    study.optimize(objective, n_trials=6)
    trials = study.get_trials()
    assert [t.system_attrs["gd:role"] for t in trials] == \
        ["base"] + [f"probe:{n}" for n in names] + ["base"]
    w0 = np.array(trials[0].system_attrs["gd:state"]["fractions"]["s"])
    np.testing.assert_allclose(_fractions(trials[0].params, "s", components), w0, atol=1e-9)
    g = c - c.mean()
    stepped = w0 - 0.3 * g / np.linalg.norm(g)
    m1 = 0.8 * w0 + 0.2 * stepped
    state = trials[5].system_attrs["gd:state"]
    np.testing.assert_allclose(state["momentum"]["s"], m1, atol=1e-9)
    np.testing.assert_allclose(state["fractions"]["s"], project_onto_simplex(m1), atol=1e-9)
    np.testing.assert_allclose(_fractions(trials[5].params, "s", components),
                               project_onto_simplex(m1), atol=1e-6)


# --- convergence on toy quadratics ------------------------------------------------------


@pytest.mark.parametrize(("components", "target", "steps", "tolerance"), [
    (["a", "b", "c"], [0.4, 0.3, 0.2, 0.1], 60, 0.02),                      # interior
    (["a", "b", "c"], [0.6, 0.5, -0.1, 0.0], 60, 0.01),                     # on an edge
    (list("abcdef"), [0.25, 0.2, 0.15, 0.12, 0.1, 0.08, 0.1], 80, 0.02),    # interior
    (list("abcdef"), [0.5, 0.4, 0.3, -0.1, -0.2, 0.0, 0.1], 80, 0.01),      # on a face
], ids=["3-interior", "3-edge", "6-interior", "6-face"])
def test_converges_to_the_optimum_of_a_quadratic(components, target, steps, tolerance):
    optimum = project_onto_simplex(np.array(target))
    budget = steps * (len(components) + 2)  # a base and one probe per coordinate per step
    for seed in (0, 1):
        sampler = GDSampler(simplexes={"s": components}, seed=seed, steps=steps, restarts=1)
        study = optuna.create_study(sampler=sampler)
        study.optimize(_quadratic("s", components, target), n_trials=budget)
        best = _fractions(study.best_params, "s", components)
        assert np.abs(best - optimum).max() < tolerance, (seed, best, optimum)
        assert all(t.system_attrs["gd:chain"] == 0 for t in study.trials)


def test_maximisation_converges_too():
    components, target = ["a", "b"], [0.2, 0.5, 0.3]
    minimise = _quadratic("s", components, target)
    study = optuna.create_study(direction="maximize", sampler=GDSampler(
        simplexes={"s": components}, seed=0, steps=60, restarts=1))
    study.optimize(lambda t: -minimise(t), n_trials=240)
    np.testing.assert_allclose(_fractions(study.best_params, "s", components), target,
                               atol=0.02)


def test_infeasible_designs_steer_the_chain_and_never_stop_it():
    # The optimum (0.8, 0.1, slack 0.1) is infeasible: a > 0.6 is pruned with a reason, as
    # the study runner records infeasible designs. The chain finds the feasible optimum on
    # the boundary a = 0.6.
    components = ["a", "b"]
    quadratic = _quadratic("s", components, [0.8, 0.1, 0.1])

    def objective(trial):
        value = quadratic(trial)
        if _fractions(trial.params, "s", components)[0] > 0.6:
            trial.set_user_attr("infeasible_reason", "a over its budget")
            raise optuna.TrialPruned()
        return value

    study = optuna.create_study(sampler=GDSampler(simplexes={"s": components}, seed=1,
                                                  steps=80, restarts=1))
    study.optimize(objective, n_trials=320)
    states = Counter(t.state for t in study.trials)
    assert states[TrialState.PRUNED] > 0 and states[TrialState.COMPLETE] > 0
    np.testing.assert_allclose(_fractions(study.best_params, "s", components),
                               [0.6, 0.2, 0.2], atol=0.03)


def test_a_failed_trial_is_claimed_once_more_then_counts_as_infeasible():
    quadratic = _quadratic("s", ["a", "b"], [0.3, 0.3, 0.4])

    def objective(trial):
        if trial.number in (1, 2):
            raise RuntimeError("the model crashed")
        return quadratic(trial)

    study = optuna.create_study(sampler=GDSampler(simplexes={"s": ["a", "b"]}, seed=0))
    study.optimize(objective, n_trials=6, catch=(RuntimeError,))
    roles = [t.system_attrs["gd:role"] for t in study.trials]
    assert roles == ["base", "probe:s.a", "probe:s.a", "probe:s.b", "probe:s.slack", "base"]
    # +inf at probe a: the step moves away from a.
    w0 = study.trials[0].system_attrs["gd:state"]["fractions"]["s"]
    w1 = study.trials[5].system_attrs["gd:state"]["fractions"]["s"]
    assert w1[0] < w0[0]


def test_a_retried_trial_keeps_its_role():
    study = optuna.create_study(sampler=GDSampler(simplexes={"s": ["a", "b"]}, seed=0))
    quadratic = _quadratic("s", ["a", "b"], [0.3, 0.3, 0.4])
    study.optimize(quadratic, n_trials=1)
    lost = study.ask()  # its worker dies: the heartbeat fails it and re-enqueues it
    quadratic(lost)
    study.tell(lost, state=TrialState.FAIL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.RetryHeartbeatStaleTrialCallback()(study, study.trials[-1])
    study.optimize(quadratic, n_trials=3)
    roles = [t.system_attrs["gd:role"] for t in study.trials]
    assert roles == ["base", "probe:s.a", "probe:s.a", "probe:s.b", "probe:s.slack"]
    assert study.trials[2].params == study.trials[1].params


def test_a_simplex_the_objective_does_not_suggest_is_dropped_after_step_0():
    sampler = GDSampler(simplexes={"s": ["a", "b"], "unused": ["x", "y"]}, seed=0)
    study = optuna.create_study(sampler=sampler)
    study.optimize(_quadratic("s", ["a", "b"], [0.3, 0.3, 0.4]), n_trials=12)
    roles = [t.system_attrs["gd:role"] for t in study.trials]
    assert roles[:7] == ["base", "probe:s.a", "probe:s.b", "probe:s.slack", "probe:unused.x",
                         "probe:unused.y", "probe:unused.slack"]
    assert roles[7:11] == roles[:4]


def test_graded_constraint_violations_lead_a_chain_into_the_feasible_region():
    # Feasible only where a >= 0.7 (a Dirichlet start is there with probability 0.09), as
    # the study runner records it: complete, constraint > 0, a large graded value.
    components = ["a", "b"]
    quadratic = _quadratic("s", components, [0.5, 0.3, 0.2])

    def objective(trial):
        value = quadratic(trial)
        violation = max(0.7 - _fractions(trial.params, "s", components)[0], 0.0)
        trial.set_constraint("infeasibility", violation)
        return 1e9 * (1 + violation) if violation > 0 else value

    for seed in (0, 2):  # starts at a = 0.00 and 0.04
        study = optuna.create_study(sampler=GDSampler(simplexes={"s": components},
                                                      seed=seed, steps=150, restarts=1))
        study.optimize(objective, n_trials=600)
        assert study.trials[0].constraints["infeasibility"] > 0.6
        np.testing.assert_allclose(_fractions(study.best_params, "s", components),
                                   [0.7, 0.2, 0.1], atol=0.02)


# --- dimensions outside the simplexes ---------------------------------------------------


STRATEGIES = [f"s{i}" for i in range(10)]


def _with_categorical(trial):
    x = _quadratic("s", ["a", "b"], [0.5, 0.3, 0.2])(trial)
    strategy = trial.suggest_categorical("strategy", STRATEGIES)
    batch = trial.suggest_int("micro_batch_size", 1, 64, log=True)
    return x + 0.1 * abs(STRATEGIES.index(strategy) - 7) + 0.05 * abs(math.log2(batch) - 3)


def test_neighbour_moves_improve_a_toy_objective_with_a_categorical():
    sampler = GDSampler(simplexes={"s": ["a", "b"]}, seed=1, steps=40, restarts=1)
    study = optuna.create_study(sampler=sampler)
    study.optimize(_with_categorical, n_trials=240)
    bases = [t for t in study.trials if t.system_attrs["gd:role"] == "base"]
    # Chain values of the strategy at successive bases never get worse, and reach s7.
    distance = [abs(STRATEGIES.index(t.params["strategy"]) - 7) for t in bases]
    assert distance == sorted(distance, reverse=True) and distance[0] > 0
    assert study.best_params["strategy"] == "s7"
    assert study.best_params["micro_batch_size"] == 8
    assert study.best_value < 0.01
    moves = [t for t in study.trials if t.system_attrs["gd:role"].startswith("move:")]
    assert {t.system_attrs["gd:role"] for t in moves} == {"move:strategy",
                                                          "move:micro_batch_size"}
    # Probes hold the categoricals at the base's values.
    for t in study.trials:
        if t.system_attrs["gd:role"].startswith("probe:"):
            base = next(b for b in bases if b.system_attrs["gd:step"] ==
                        t.system_attrs["gd:step"])
            assert t.params["strategy"] == base.params["strategy"]


def test_without_categorical_moves_the_start_is_kept():
    sampler = GDSampler(simplexes={"s": ["a", "b"]}, seed=2, steps=10, restarts=1,
                        categorical_moves=False)
    study = optuna.create_study(sampler=sampler)
    study.optimize(_with_categorical, n_trials=40)
    assert len({t.params["strategy"] for t in study.trials}) == 1


def test_a_categorical_only_search_does_not_repeat_its_base():
    # With nothing to probe, a step is its moves; the kept move is the next base.
    def objective(trial):
        i = STRATEGIES.index(trial.suggest_categorical("strategy", STRATEGIES))
        return abs(i - 7) + 0.01 * abs(trial.suggest_int("k", 0, 10) - 4)

    study = optuna.create_study(sampler=GDSampler(simplexes={}, seed=0, steps=30,
                                                  restarts=2))
    study.optimize(objective, n_trials=60)
    assert study.best_params == {"strategy": "s7", "k": 4}
    per_chain = Counter((t.system_attrs.get("gd:chain"), tuple(sorted(t.params.items())))
                        for t in study.trials)
    assert sum(n - 1 for n in per_chain.values()) <= 4  # a few repeats when moves alternate


@pytest.mark.parametrize(("distribution", "value", "direction", "expected"), [
    (CategoricalDistribution(["a", "b", "c"]), "a", 1, ("b", "+")),
    (CategoricalDistribution(["a", "b", "c"]), "a", -1, ("c", "-")),  # list order wraps
    (IntDistribution(1, 10), 10, 1, (9, "-")),                         # an end: turns
    (IntDistribution(0, 100), 50, 1, (55, "+")),                        # ~20-point grid
    (IntDistribution(1, 64, log=True), 1, 1, (2, "+")),
    (IntDistribution(1, 64, log=True), 32, -1, (28, "-")),  # 2^4.8 on the grid
    (FloatDistribution(0.0, 10.0, step=0.5), 5.0, 1, (5.5, "+")),
    (FloatDistribution(0.0, 1.0), 0.5, -1, (0.45, "-")),
    (CategoricalDistribution(["only"]), "only", 1, None),
])
def test_neighbour(distribution, value, direction, expected):
    move = neighbour(distribution, value, direction, 1, np.random.default_rng(0))
    if expected is None:
        assert move is None
    else:
        assert move[1] == expected[1]
        assert move[0] == pytest.approx(expected[0]) if isinstance(expected[0], float) \
            else move[0] == expected[0]


def test_categorical_jumps_every_third_step():
    distribution = CategoricalDistribution([f"o{i}" for i in range(24)])
    value, kind = neighbour(distribution, "o5", 1, 2, np.random.default_rng(0))
    assert kind == "jump" and value != "o5"


# --- determinism, resume, several workers ----------------------------------------------


def test_same_seed_same_trials_and_a_different_seed_differs():
    def run(seed):
        study = optuna.create_study(sampler=GDSampler(simplexes={"s": ["a", "b"]},
                                                      seed=seed, steps=5, restarts=3))
        study.optimize(_with_categorical, n_trials=60)
        return [(t.params, t.system_attrs["gd:role"]) for t in study.trials]

    assert run(7) == run(7)
    assert run(7) != run(8)


def _journal(path):
    return JournalStorage(JournalFileBackend(str(path)))


def test_resume_in_a_new_process_continues_the_chain_exactly(tmp_path):
    def sampler():
        return GDSampler(simplexes={"s": ["a", "b"]}, seed=5, steps=4, restarts=5)

    whole = optuna.create_study(study_name="w", storage=_journal(tmp_path / "whole.log"),
                                sampler=sampler())
    whole.optimize(_with_categorical, n_trials=70)

    first = optuna.create_study(study_name="r", storage=_journal(tmp_path / "resumed.log"),
                                sampler=sampler())
    first.optimize(_with_categorical, n_trials=30)
    # A new sampler and a new storage object: nothing survives but the file.
    resumed = optuna.load_study(study_name="r", storage=_journal(tmp_path / "resumed.log"),
                                sampler=sampler())
    resumed.optimize(_with_categorical, n_trials=40)
    assert _trajectory(resumed) == _trajectory(whole)


def test_resume_after_an_interrupted_trial_redoes_only_that_trial(tmp_path):
    def sampler():
        return GDSampler(simplexes={"s": ["a", "b"]}, seed=5, steps=4, restarts=5)

    whole = optuna.create_study(sampler=sampler())
    whole.optimize(_with_categorical, n_trials=40)

    storage = _journal(tmp_path / "interrupted.log")
    study = optuna.create_study(study_name="i", storage=storage, sampler=sampler())

    def interrupted(trial):
        if trial.number == 17:
            raise KeyboardInterrupt
        return _with_categorical(trial)

    with pytest.raises(KeyboardInterrupt):
        study.optimize(interrupted, n_trials=40)
    resumed = optuna.load_study(study_name="i", storage=_journal(tmp_path / "interrupted.log"),
                                sampler=sampler())
    resumed.optimize(_with_categorical, n_trials=23)
    done = [t for t in resumed.trials if t.state == TrialState.COMPLETE]
    assert [t.state for t in resumed.trials].count(TrialState.FAIL) == 1
    # The failed trial's role was claimed again; the rest is the uninterrupted run.
    assert [(t.params, t.system_attrs["gd:role"]) for t in done] == \
        [(t.params, t.system_attrs["gd:role"]) for t in whole.trials[:40]]


_WORKER = textwrap.dedent("""
    import os, sys, time
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    sys.path.insert(0, {repo!r})
    sys.path.insert(0, {tests!r})
    from crossflow.search.samplers.gd import GDSampler
    from test_gd_sampler import _with_categorical
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = JournalStorage(JournalFileBackend({path!r}))
    study = optuna.load_study(study_name="shared", storage=storage,
                              sampler=GDSampler(simplexes={{"s": ["a", "b"]}}, seed=0,
                                                steps=4, restarts=4))
    def objective(trial):
        trial.set_user_attr("worker", sys.argv[1])
        time.sleep(0.005)
        return _with_categorical(trial)
    open(sys.argv[2] + sys.argv[1], "w").close()  # start together
    while not all(os.path.exists(sys.argv[2] + w) for w in "01"):
        time.sleep(0.01)
    study.optimize(objective, n_trials=40)
""")


def test_two_worker_processes_never_claim_the_same_role(tmp_path):
    path = tmp_path / "shared.log"
    optuna.create_study(study_name="shared", storage=_journal(path))
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(repo=str(REPO), tests=str(REPO / "tests"), path=str(path)))
    workers = [subprocess.Popen([sys.executable, str(script), str(i), str(tmp_path / "ready")],
                                stderr=subprocess.PIPE) for i in range(2)]
    for w in workers:
        _, err = w.communicate(timeout=120)
        assert w.returncode == 0, err.decode()
    trials = optuna.load_study(study_name="shared", storage=_journal(path)).trials
    assert len(trials) == 80 and all(t.state == TrialState.COMPLETE for t in trials)
    claims = [(t.system_attrs["gd:chain"], t.system_attrs["gd:step"],
               t.system_attrs["gd:role"]) for t in trials
              if t.system_attrs["gd:role"] != "independent"]
    assert len(claims) == len(set(claims))
    workers = [t.user_attrs["worker"] for t in trials]
    assert sum(a != b for a, b in itertools.pairwise(workers)) >= 4  # they did interleave
    # The chains are the ones one worker would have run, interleaved differently.
    single = optuna.create_study(sampler=GDSampler(simplexes={"s": ["a", "b"]}, seed=0,
                                                   steps=4, restarts=4))
    single.optimize(_with_categorical, n_trials=80)
    assert {c[0] for c in claims} <= {t.system_attrs["gd:chain"] for t in single.trials}


def test_threads_in_one_process_never_claim_the_same_role():
    study = optuna.create_study(sampler=GDSampler(simplexes={"s": ["a", "b"]}, seed=0,
                                                  steps=5, restarts=4))
    study.optimize(_with_categorical, n_trials=60, n_jobs=4)
    claims = [(t.system_attrs["gd:chain"], t.system_attrs["gd:step"],
               t.system_attrs["gd:role"]) for t in study.trials
              if t.system_attrs["gd:role"] != "independent"]
    assert len(claims) == len(set(claims)) and len(study.trials) == 60


# --- the rest of the contract -----------------------------------------------------------


def test_after_the_last_chain_trials_go_to_the_independent_sampler():
    study = optuna.create_study(sampler=GDSampler(simplexes={"s": ["a", "b"]}, seed=0,
                                                  steps=2, restarts=2))
    study.optimize(_quadratic("s", ["a", "b"], [0.3, 0.3, 0.4]), n_trials=20)
    roles = [t.system_attrs["gd:role"] for t in study.trials]
    assert roles[:16] == ["base", "probe:s.a", "probe:s.b", "probe:s.slack"] * 4
    assert [t.system_attrs["gd:chain"] for t in study.trials[:16]] == [0] * 8 + [1] * 8
    assert roles[16:] == ["independent"] * 4


def test_enqueued_trials_are_evaluated_as_given_and_stay_out_of_the_chains():
    study = optuna.create_study(sampler=GDSampler(simplexes={"s": ["a", "b"]}, seed=0))
    study.enqueue_trial({"s.a": 1.0, "s.b": 0.0, "s.slack": -1.0, "strategy": "s3"})
    study.optimize(_with_categorical, n_trials=4)
    first = study.trials[0]
    assert first.params["strategy"] == "s3" and first.params["s.a"] == 1.0
    assert first.system_attrs["gd:role"] == "fixed"
    assert [t.system_attrs["gd:role"] for t in study.trials[1:]] == \
        ["base", "probe:s.a", "probe:s.b"]


def test_multi_objective_studies_are_rejected():
    study = optuna.create_study(directions=["minimize", "minimize"],
                                sampler=GDSampler(simplexes={}))
    with pytest.raises(ValueError, match="single objective"):
        study.optimize(lambda t: (t.suggest_float("x", 0, 1), 0.0), n_trials=1)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"steps": 0}, "steps >= 1"),
    ({"restarts": 0}, "restarts >= 1"),
    ({"learning_rate": 0.0}, "learning_rate > 0"),
    ({"beta": 1.0}, "0 <= beta < 1"),
    ({"probe": 0.0}, "0 < probe <= 1"),
    ({"simplexes": {"s": []}}, "distinct components"),
    ({"simplexes": {"s": ["slack"]}}, "distinct components"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GDSampler(**{"simplexes": {"s": ["a"]}, **kwargs})


def test_pickles_and_reseeding_keeps_the_chains():
    sampler = pickle.loads(pickle.dumps(GDSampler(simplexes={"s": ["a", "b"]}, seed=4,
                                                  steps=3)))
    sampler.reseed_rng()
    study = optuna.create_study(sampler=sampler)
    study.optimize(_with_categorical, n_trials=30)
    again = optuna.create_study(sampler=GDSampler(simplexes={"s": ["a", "b"]}, seed=4,
                                                  steps=3))
    again.optimize(_with_categorical, n_trials=30)
    assert [t.params for t in study.trials] == [t.params for t in again.trials]


# Optuna's reusable sampler contract tests (optuna.testing.pytest_samplers).


class TestGDSamplerContract(BasicSamplerTestCase, RelativeSamplerTestCase,
                            SingleOnlySamplerTestCase):
    @pytest.fixture
    def sampler(self):
        return lambda: GDSampler(simplexes={"s": ["a", "b"]}, seed=0, steps=3, restarts=2)
