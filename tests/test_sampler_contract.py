"""The sampler contract, in Optuna's terms: every sampler a study can name runs through the
five things a user does with a study (issue 18, item 4).

* **reproducible**: one worker and one seed give the same trials (parameters and values).
* **resume**: a launch stopped after N of its 2N trials and run again ends with 2N
  finished trials.  ``structured`` and ``gd`` keep their whole state in the storage (the
  plan's points and seed; the chains' seeds and steps), so the resumed study equals an
  uninterrupted 2N run.  Optuna's own samplers keep their random stream in the process,
  and launch k is seeded ``seed + k`` on purpose (a resumed launch must not replay the
  first one's draws, :func:`crossflow.search.study.launch.run_study`), so after a resume
  their trials differ from a 2N run's: for them the first N trials are the 2N run's, the
  total adds up, nothing is left running and the best is never worse.
* **extend**: ``--trials M`` on a finished study of N adds exactly M - N trials and the best
  never gets worse (a two-objective study: its old front stays weakly dominated).
* **switch**: a study run with TPE and continued with another sampler adds up and its best
  never gets worse; the ``structured`` driver starts from TPE's incumbent and improves on it.
* **two workers**: ``workers=2`` ends with exactly N finished trials, nothing left running.

``nsga2`` (several objectives) runs on a two-objective variant of quickstart; the others on
quickstart itself.  Budgets are tiny (quickstart prices a trial in ~30 ms).
"""

from __future__ import annotations

import shutil

import pytest
from optuna.trial import TrialState

from crossflow.search import workers
from crossflow.search.study import is_feasible, load_study, open_study, run_study

SAMPLERS = ("structured", "gd", "tpe", "cmaes", "random", "nsga2")
#: Samplers whose whole state is in the study's storage: a resumed study is an
#: uninterrupted one.
EXACT_RESUME = ("structured", "gd")
N = 20

TWO_OBJECTIVES = """\
kind: study
name: quickstart-energy
workload: gemm-8192
hardware: deepflow-case-study
search_space: quickstart
objectives: [iteration_time_s, energy_J]
sampler: nsga2
seed: 0
n_trials: 40
"""


@pytest.fixture(scope="module")
def setups(tmp_path_factory):
    """quickstart, and its two-objective variant (a file, so that workers can load it)."""
    path = tmp_path_factory.mktemp("studies") / "quickstart-energy.yaml"
    path.write_text(TWO_OBJECTIVES)
    return {1: load_study("quickstart"), 2: load_study(path)}


def _setup(setups, sampler):
    return setups[2 if sampler == "nsga2" else 1]


def _run(setup, sampler, storage, n, **kw):
    kw.setdefault("seed", 0)
    return run_study(setup, n_trials=n, sampler=sampler, storage=str(storage), track=False,
                     progress=False, **kw)


def _history(study):
    return [(t.number, t.state.name, t.params, t.values)
            for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)]


def _states(study):
    out: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name] = out.get(t.state.name, 0) + 1
    return out


def _front(trials) -> list[tuple[float, ...]]:
    """The values of the best feasible trials (of a study, or a list of them): the best
    one, or the Pareto front."""
    if not isinstance(trials, list):
        trials = trials.get_trials(deepcopy=False)
    feasible = [tuple(t.values) for t in trials if is_feasible(t)]
    return [v for v in feasible
            if not any(all(a <= b for a, b in zip(w, v, strict=True)) and w != v
                       for w in feasible)]


def _never_worse(before, after) -> bool:
    """Every point of the old front is weakly dominated by a point of the new one."""
    return bool(after) and all(any(all(a <= b for a, b in zip(w, v, strict=True))
                                   for w in after) for v in before)


def _reported_best(result) -> float:
    return result.best["objectives"][result.launch["objectives"][0]]


@pytest.fixture(scope="module")
def reference(setups, tmp_path_factory):
    """One uninterrupted run of 2N trials per sampler (seed 0), by sampler."""
    cache: dict[str, list] = {}

    def get(sampler):
        if sampler not in cache:
            path = tmp_path_factory.mktemp(f"ref-{sampler}") / "s.journal"
            cache[sampler] = _history(_run(_setup(setups, sampler), sampler, path, 2 * N).study)
        return cache[sampler]

    return get


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_one_worker_and_one_seed_reproduce_the_trials(sampler, setups, reference, tmp_path):
    again = _run(_setup(setups, sampler), sampler, tmp_path / "s.journal", 2 * N).study
    assert _history(again) == reference(sampler)
    assert _states(again) == {"COMPLETE": 2 * N}


class _StopAfter(workers.GracefulStop):
    """Ctrl-C as the launch sees it, once the study has ``N`` complete trials."""

    def __call__(self, study, trial) -> None:
        if sum(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)) >= N:
            self.requested = True
        super().__call__(study, trial)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_stopped_launch_resumes_to_its_total(sampler, setups, reference, tmp_path,
                                               monkeypatch):
    setup, path = _setup(setups, sampler), tmp_path / "s.journal"
    with monkeypatch.context() as m:
        m.setattr(workers, "GracefulStop", _StopAfter)
        stopped = _run(setup, sampler, path, 2 * N)
    assert stopped.interrupted and _states(stopped.study) == {"COMPLETE": N}
    front = _front(stopped.study)
    # up to the stop, the launch is the uninterrupted one
    assert _history(stopped.study) == reference(sampler)[:N]
    resumed = _run(setup, sampler, path, 2 * N)
    assert not resumed.interrupted and resumed.trials_run == N
    assert _states(resumed.study) == {"COMPLETE": 2 * N}
    assert _never_worse(front, _front(resumed.study))
    if sampler in EXACT_RESUME:
        assert _history(resumed.study) == reference(sampler)
    else:  # launch 1 is seeded seed + 1 (see the module docstring)
        assert resumed.launch["seed"] == 1
        history = _history(resumed.study)
        assert history[:N] == reference(sampler)[:N]
        # and it does not replay the first launch's draws
        first = [repr(sorted(p.items())) for _, _, p, _ in history[:N]]
        assert not {repr(sorted(p.items())) for _, _, p, _ in history[N:]} & set(first)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_more_trials_extend_a_finished_study(sampler, setups, tmp_path):
    setup, path = _setup(setups, sampler), tmp_path / "s.journal"
    first = _run(setup, sampler, path, N)
    front = _front(first.study)
    again = _run(setup, sampler, path, N)                     # complete: nothing to run
    assert again.was_complete and again.trials_run == 0
    extended = _run(setup, sampler, path, N + 7)
    assert extended.trials_run == 7 and not extended.was_complete
    assert _states(extended.study) == {"COMPLETE": N + 7}
    assert _never_worse(front, _front(extended.study))
    if sampler != "nsga2":
        assert _reported_best(extended) <= _reported_best(first)


@pytest.fixture(scope="module")
def tpe_study(setups, tmp_path_factory):
    """A TPE study of 30 trials, per number of objectives: its journal file."""
    cache: dict[int, object] = {}

    def get(objectives):
        if objectives not in cache:
            path = tmp_path_factory.mktemp(f"tpe{objectives}") / "s.journal"
            _run(setups[objectives], "tpe", path, 30)
            cache[objectives] = path
        return cache[objectives]

    return get


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_tpe_study_switched_to_another_sampler_goes_on(sampler, setups, tpe_study,
                                                         tmp_path):
    setup = _setup(setups, sampler)
    path = tmp_path / "s.journal"
    shutil.copy(tpe_study(len(setup.objectives)), path)
    before = open_study(setup, str(path), create=False).get_trials()   # (a copy)
    front = _front(before)
    switched = _run(setup, sampler, path, 30 + N)
    assert switched.trials_run == N and switched.launch["sampler"] == sampler
    assert _states(switched.study) == {"COMPLETE": 30 + N}
    after = _front(switched.study)
    assert _never_worse(front, after)
    if sampler == "structured":
        from crossflow.search.samplers.structured._sampler import SLOT, START

        incumbent = min((t for t in before if is_feasible(t)),
                        key=lambda t: (t.values[0], t.number))
        # TPE's best point, or the plan's own start when the best is the baseline (the
        # template's split under each technology, which the plan's screen prices again)
        expected = None if "fixed_params" in incumbent.system_attrs else incumbent.params
        assert switched.study.user_attrs[START] == expected
        driver = [t for t in switched.study.trials if SLOT in t.system_attrs]
        assert len(driver) == N
        assert min(t.value for t in driver if is_feasible(t)) < incumbent.value


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_two_workers_finish_exactly_the_budget(sampler, setups, tmp_path):
    setup = _setup(setups, sampler)
    result = _run(setup, sampler, tmp_path / "s.journal", N, workers=2)
    assert result.launch["workers"] == 2 and not result.interrupted
    states = _states(result.study)
    assert states.get("COMPLETE") == N, states
    assert not states.get("RUNNING") and not states.get("WAITING"), states
    # a trial that lost the race for the last slot is FAIL "surplus", never evaluated
    for t in result.study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        assert t.user_attrs.get(workers.SURPLUS), t
    assert _front(result.study)
