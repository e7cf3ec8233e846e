"""The ``structured`` driver (and ``gd`` inside it): screening, cliffs, resume, workers,
tracking, and convergence of the inner methods on a toy problem with a cliff."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from optuna.trial import TrialState

from crossflow.search.samplers.structured._inner import METHODS
from crossflow.search.samplers.structured._problem import Cont, Problem
from crossflow.search.samplers.structured._sampler import BUDGET, MEMORY, PHASE, SLOT
from crossflow.search.space import SearchSpace, Simplex
from crossflow.search.study import is_feasible, load_study, run_study
from crossflow.system import order_classes, order_representative


def _run(setup, tmp_path, n, name=None, **kw):
    if name is not None:
        setup = dataclasses.replace(setup, spec=setup.spec.model_copy(update={"name": name}))
    kw.setdefault("storage", str(tmp_path / f"{setup.name}.journal"))
    kw.setdefault("track", False)
    return run_study(setup, n_trials=n, progress=False, sampler="structured", seed=0, **kw)


@pytest.fixture(scope="module")
def lstm_screen(tmp_path_factory):
    """paper-lstm-512 with a budget just past its screening phases."""
    setup = load_study("paper-lstm-512")
    result = _run(setup, tmp_path_factory.mktemp("lstm"), 150)
    return setup, result.study


def test_screen_skips_memory_infeasible_strategies_and_records_them(lstm_screen):
    setup, study = lstm_screen
    strategies = set(setup.space.dimension("strategy").values())
    rejected = study.user_attrs[MEMORY]
    rejected_names = {r["strategy"] for r in rejected}
    assert all(r["need_bytes"] > r["capacity_bytes"] > 0 for r in rejected)
    evaluated = {t.params["strategy"] for t in study.trials if SLOT in t.system_attrs}
    assert evaluated and not evaluated & rejected_names       # never evaluated in full
    assert evaluated | rejected_names == strategies            # every strategy accounted for
    # a rejected strategy really is over memory at the template's split
    bad = next(iter(rejected_names))
    trial = next(t for t in study.trials if SLOT in t.system_attrs)
    from crossflow.search.objective import evaluate

    ev = evaluate(setup, setup.design({**trial.params, "strategy": bad}))
    assert not ev.feasible and ev.memory_only
    assert study.user_attrs[BUDGET] == 150 - len(setup.baseline_trials())


def test_screen_covers_every_order_class_of_the_best_strategies(lstm_screen):
    setup, study = lstm_screen
    screened = [t for t in study.trials if t.user_attrs.get(PHASE) in ("screen", "orders")]
    assert {t.user_attrs.get(PHASE) for t in study.trials} >= {"screen", "orders", "search"}
    best = sorted((t for t in screened if is_feasible(t)), key=lambda t: t.value)
    top = []
    for t in best:
        if t.params["strategy"] not in top:
            top.append(t.params["strategy"])
    for strategy in top[:3]:
        seen = {order_representative(strategy, t.params["mapping_order"])
                for t in screened if t.params["strategy"] == strategy}
        assert seen == {rep for rep, _ in order_classes(strategy)}, strategy
    # and one order per class: no two evaluations of one strategy in the same class
    for strategy in top[:3]:
        orders = [order_representative(strategy, t.params["mapping_order"])
                  for t in screened if t.params["strategy"] == strategy]
        assert len(orders) == len(set(orders))


def test_search_improves_on_the_screen_and_on_the_template(lstm_screen):
    setup, study = lstm_screen
    feasible = [t for t in study.trials if is_feasible(t)]
    template = next(t for t in study.trials if t.user_attrs.get("baseline"))
    best = min(t.value for t in feasible)
    screened = min(t.value for t in feasible if t.user_attrs.get(PHASE) == "screen")
    assert best < screened < template.value


def test_resume_replays_the_plan(tmp_path):
    """A launch stopped after 30 trials and run again to 60 gives the trials of 60 at once:
    the plan is rebuilt from the storage (its budget is stored with the study)."""
    setup = load_study("quickstart")
    plan = {"budget": 57}
    once = _run(setup, tmp_path / "a", 60, name="q-once", sampler_options=plan).study
    _run(setup, tmp_path / "b", 30, name="q-twice", sampler_options=plan)
    twice = _run(setup, tmp_path / "b", 60, name="q-twice", sampler_options=plan).study
    a = [(t.params, t.values) for t in sorted(once.trials, key=lambda t: t.number)]
    b = [(t.params, t.values) for t in sorted(twice.trials, key=lambda t: t.number)]
    assert len(a) == 60 and a == b


def test_extending_a_study_polishes_past_its_budget(tmp_path):
    setup = load_study("quickstart")
    first = _run(setup, tmp_path, 30, name="q-extend").study
    assert first.user_attrs[BUDGET] == 27                # 30 less the baseline trials
    more = _run(setup, tmp_path, 50, name="q-extend").study
    assert more.user_attrs[BUDGET] == 27                 # the plan keeps its budget
    phases = [t.user_attrs.get(PHASE) for t in sorted(more.trials, key=lambda t: t.number)]
    assert set(phases[30:]) == {"polish"}
    assert min(t.value for t in more.trials if is_feasible(t)) <= min(
        t.value for t in first.trials if is_feasible(t))


def test_two_workers_share_one_plan(tmp_path):
    setup = load_study("quickstart")
    result = _run(setup, tmp_path, 40, workers=2)
    finished = [t for t in result.study.trials if t.state == TrialState.COMPLETE]
    assert len(finished) == 40
    slots = [t.system_attrs[SLOT] for t in finished if SLOT in t.system_attrs]
    assert len(slots) == len(set(slots))                       # no point evaluated twice
    assert sorted(slots) == list(range(len(slots)))            # the plan's points, in order
    assert result.study.trials[0].user_attrs.get("baseline")
    best = min(t.value for t in finished if is_feasible(t))
    assert best < result.study.trials[0].value                 # beats the template


def test_every_evaluation_is_a_trial_with_one_mlflow_run(tmp_path):
    from mlflow import MlflowClient

    setup = load_study("quickstart")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = _run(setup, tmp_path, 25, name="q-tracked", track=True, tracking_uri=uri)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("q-tracked")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    numbers = sorted(int(r.data.tags["trial_number"]) for r in runs
                     if "trial_number" in r.data.tags)
    assert numbers == sorted(t.number for t in result.study.trials) == list(range(25))
    samplers = {r.data.tags.get("sampler") for r in runs if "trial_number" in r.data.tags}
    assert samplers == {"structured"}


# ---- the inner methods on a toy problem with a cliff ------------------------------------

class _ToySetup:
    """A study-like object for :class:`Problem`: one budget simplex of three components and
    no discrete dimension."""

    def __init__(self) -> None:
        self.space = SearchSpace("toy", (Simplex("area", ("core", "sram", "io"), {},
                                                 ("core", "sram", "io")),), ())
        self.template = "toy"

    def baseline_params(self):
        return {}


class _ToyProblem(Problem):
    """The toy's steps, as the AGE's cliffs module reports a chip's: the core buys whole
    units of 5 % of the area, the SRAM is useful from 15 % on."""

    def _edges(self, cont, coord, discrete, donor=None):
        if coord.name == "core":
            return [0.05 * k for k in range(1, 20)]
        return [0.15] if coord.name == "sram" else []


def _toy(cont: Cont) -> float:
    """Time of a toy chip: compute in whole units of 5 % of the area (a cliff at every
    unit), SRAM that must hold 15 % (a cliff at 0.15: below it, everything spills), and I/O
    with diminishing returns.  Its optimum over the simplex is found by a grid below."""
    core, sram, io, _ = cont.simplexes["area"]
    units = math.floor(core / 0.05 + 1e-9)
    if units == 0:
        return math.inf
    spill = 3.0 if sram < 0.15 else 1.0
    return spill / units + 0.02 / max(io, 1e-6)


def _toy_optimum() -> float:
    best = math.inf
    for core in np.arange(0.05, 0.951, 0.0025):
        for sram in np.arange(0.0, 1.0 - core, 0.0025):
            io = 1.0 - core - sram
            if io > 0:
                best = min(best, _toy(Cont({"area": np.array([core, sram, io, 0.0])})))
    return best


@pytest.mark.parametrize("method", ["exchange", "gd", "compass"])
def test_inner_method_crosses_a_cliff_on_a_toy_problem(method):
    P = _ToyProblem(_ToySetup())
    start = Cont({"area": np.array([0.3, 0.05, 0.3, 0.35])})   # under the SRAM cliff
    f0 = _toy(start)
    gen = METHODS[method](P, {}, start, f0, 400, np.random.default_rng(0))
    best, used = f0, 0
    try:
        batch = next(gen)
        while True:
            values = [_toy(x) for x in batch]
            used += len(values)
            best = min([best, *values])
            batch = gen.send(values)
    except StopIteration as end:
        x, fx = end.value
    assert used <= 400
    assert fx == best and x.simplexes["area"][1] >= 0.15          # over the cliff
    optimum = _toy_optimum()
    assert fx <= optimum * 1.05, (fx, optimum)


class _ToySetup2(_ToySetup):
    """The toy with a second simplex, ``pins`` (a, b), that matters only until a holds 30 %."""

    def __init__(self) -> None:
        super().__init__()
        self.space = SearchSpace("toy", (*self.space.simplexes,
                                         Simplex("pins", ("a", "b"), {}, ("a", "b"))), ())


def _toy2(cont: Cont) -> float:
    return _toy(cont) + 0.5 * max(0.0, 0.3 - cont.simplexes["pins"][0])


@pytest.mark.parametrize("flat_limit", [0, 2])
def test_exchange_freezes_a_coordinate_whose_moves_change_nothing(flat_limit):
    """Once ``a`` has its 30 %, moving either pin share changes nothing: with the rule, two
    such moves freeze it; without it, the search keeps paying for them."""
    P = _ToyProblem(_ToySetup2())
    start = Cont({"area": np.array([0.3, 0.05, 0.3, 0.35]), "pins": np.array([0.1, 0.5, 0.4])})
    f0 = _toy2(start)
    gen = METHODS["exchange"](P, {}, start, f0, 300, np.random.default_rng(0),
                              flat_limit=flat_limit)
    best, fbest, wasted = start, f0, 0
    try:
        batch = next(gen)
        while True:
            values = [_toy2(x) for x in batch]
            for x, v in zip(batch, values, strict=True):
                pins_only = (np.array_equal(x.simplexes["area"], best.simplexes["area"])
                             and not np.array_equal(x.simplexes["pins"], best.simplexes["pins"]))
                if pins_only and best.simplexes["pins"][0] >= 0.3 and v == fbest:
                    wasted += 1
            for x, v in zip(batch, values, strict=True):
                if v < fbest:
                    best, fbest = x, v
            batch = gen.send(values)
    except StopIteration as end:
        _, fx = end.value
    assert fx <= _toy_optimum() * 1.05
    if flat_limit:
        assert wasted <= 10, wasted        # measured 8: a few moves of each pin share
    else:
        assert wasted > 30, wasted         # measured 49 in 300 evaluations


def test_gd_probes_land_on_the_next_step_edge_when_it_is_nearer():
    from crossflow.search.samplers.structured._eq6 import _direction, _probe

    P = _ToyProblem(_ToySetup())
    core = next(c for c in P.coords if c.name == "core")
    x = Cont({"area": np.array([0.31, 0.2, 0.29, 0.2])})
    near = _probe(P, x, core, 0.1, {})                   # the mix would reach 0.379
    assert near.simplexes["area"][0] == pytest.approx(0.35, rel=1e-6)
    far = _probe(P, x, core, 0.05, {})                   # the mix (0.3445) is nearer
    assert far.simplexes["area"][0] == pytest.approx(0.31 + 0.05 * 0.69)
    # each difference is divided by its own mixing weight: on a linear objective both
    # probes give the same direction
    def linear(c):
        return float(np.dot(c.simplexes["area"], [-1.0, 0.5, 0.2, 0.0]))
    others = [c for c in P.coords if c.name != "core"]
    probes = [core, *others]
    d = []
    for first in (near, far):
        pts = [first, *(_probe(P, x, c, 0.05) for c in others)]
        d.append(_direction(P, x, probes, linear(x), [linear(p) for p in pts], 0.05,
                            pts)["area"])
    assert np.allclose(d[0], d[1])


def test_a_run_stops_when_it_stalls_and_never_repeats_a_point():
    from crossflow.search.samplers.structured._plan import _Run

    class _Params:
        def params(self, cont, discrete):
            return {"x": float(cont.simplexes["area"][0])}

    def method():
        values = yield [Cont({"area": np.array([0.5, 0.5])})]
        k = 0
        while True:   # a point every time, every third one seen before, nothing better
            k += 1
            x = 0.5 if k % 3 == 0 else 0.5 + 1e-3 * k
            values = yield [Cont({"area": np.array([x, 1 - x])})]
            assert values[0] >= 1.0

    run = _Run(method(), _Params(), {}, Cont({"area": np.array([0.5, 0.5])}), 1.0)
    gen = run.until(500, patience=20, gain=1e-3)
    asked = []
    try:
        phase, batch = next(gen)
        while True:
            asked += [b["x"] for b in batch]
            phase, batch = gen.send([1.0] * len(batch))
    except StopIteration as end:
        used = end.value
    assert run.stalled and used == len(asked) == 20
    assert len(set(asked)) == len(asked)                  # repeats answered from the memo


def test_plan_restarts_a_stalled_search_with_the_compass(monkeypatch):
    """quickstart (one combination per node): the winner's exchange stalls and a compass
    search from the template's split races it; the plan yields no point twice."""
    from crossflow.search.objective import evaluate_many
    from crossflow.search.samplers.structured import _inner, _plan

    calls = []
    real = _inner.compass

    def spy(*args, **kw):
        calls.append(args[4])
        return real(*args, **kw)

    monkeypatch.setitem(_plan.METHODS, "compass", spy)
    setup = load_study("quickstart")
    gen = _plan.plan(Problem(setup), budget=700, seed=0, records=[])
    seen, n = set(), 0
    phase, batch = next(gen)
    while n < 700:
        for p in batch:
            key = tuple(sorted(p.items()))
            assert key not in seen
            seen.add(key)
        got = [e.values(setup.objectives)[0] if e.feasible else math.inf
               for e in evaluate_many(setup, [setup.design(p) for p in batch])]
        n += len(batch)
        phase, batch = gen.send(got)
    assert calls and all(c >= 100 for c in calls)


def test_contenders_far_behind_are_dropped_and_a_stalled_search_scans_the_lattice(
        monkeypatch):
    """quickstart at 1000 evaluations: the N7 and N12 nodes, far behind N5 after half of
    their first installment, get no more; the search that has stalled for good scans the
    whole-unit lattice around its best point."""
    from crossflow.search.objective import evaluate_many
    from crossflow.search.samplers.structured import _inner, _plan

    scans = []
    real = _inner.lattice

    def spy(P, discrete, start, f0, budget, rng, **kw):
        scans.append(f0)
        return (yield from real(P, discrete, start, f0, budget, rng, **kw))

    monkeypatch.setitem(_plan.METHODS, "lattice", spy)
    setup = load_study("quickstart")
    budget = 1000 - len(setup.baseline_trials())
    gen = _plan.plan(Problem(setup), budget=budget, seed=0, records=[])
    per_node: dict[str, int] = {}
    best, n = math.inf, 0
    phase, batch = next(gen)
    while n < budget:
        got = [e.values(setup.objectives)[0] if e.feasible else math.inf
               for e in evaluate_many(setup, [setup.design(p) for p in batch])]
        if phase == "search":
            for p in batch:
                per_node[p["logic_node"]] = per_node.get(p["logic_node"], 0) + 1
        best = min([best, *got])
        n += len(batch)
        phase, batch = gen.send(got)
    share = (budget - 3) * 2 // (5 * 3)          # a contender's whole first installment
    assert per_node["N12"] <= share // 2 and per_node["N7"] <= share // 2
    assert per_node["N5"] > 600
    assert scans and all(v >= best for v in scans)


def test_a_batch_that_does_not_fit_an_installment_waits_for_the_next():
    from crossflow.search.samplers.structured._plan import _Run

    class _Params:
        def params(self, cont, discrete):
            return {"x": float(cont.simplexes["area"][0])}

    def method():
        k = 0
        while True:     # batches of five new points
            values = yield [Cont({"area": np.array([0.1 + 1e-3 * (k + i), 0.5])})
                            for i in range(5)]
            assert len(values) == 5
            k += 5

    run = _Run(method(), _Params(), {}, Cont({"area": np.array([0.5, 0.5])}), 1.0)
    asked = []

    def installment(limit):
        gen = run.until(limit)
        try:
            phase, batch = next(gen)
            while True:
                asked.extend(b["x"] for b in batch)
                phase, batch = gen.send([2.0] * len(batch))
        except StopIteration as end:
            return end.value

    assert installment(7) == 5 and not run.done        # the second batch waits
    assert installment(7) == 5 and not run.done
    assert len(asked) == len(set(asked)) == 10


def test_a_multi_objective_study_is_refused_before_anything_is_created(tmp_path):
    from crossflow.errors import ConfigError

    setup = load_study("gpt3-175b-a100")               # time and energy
    journal = tmp_path / "gpt3.journal"
    for sampler in ("structured", "gd", "gd-paper"):
        with pytest.raises(ConfigError, match="optimises one objective"):
            run_study(setup, n_trials=3, sampler=sampler, storage=str(journal),
                      track=False, progress=False)
    assert not journal.exists()
