"""Running studies: the objective, infeasible trials, resuming, several workers, the CLI."""

from __future__ import annotations

import json
import multiprocessing
import re
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

import crossflow
from crossflow.search import objective as objective_module
from crossflow.search.objective import CONSTRAINT, PENALTY
from crossflow.search.study import best_design, is_feasible, load_study, run_study


def _run(setup, tmp_path, n, **kw):
    kw.setdefault("storage", str(tmp_path / f"{setup.name}.journal"))
    return run_study(setup, n_trials=n, track=False, progress=False, **kw)


def test_objective_records_feasible_and_infeasible_trials(tmp_path):
    setup = load_study("quickstart")
    result = _run(setup, tmp_path, 40, sampler="random")
    trials = result.study.trials
    assert len(trials) == 40 and all(t.state == TrialState.COMPLETE for t in trials)
    feasible = [t for t in trials if t.user_attrs["feasible"]]
    infeasible = [t for t in trials if not t.user_attrs["feasible"]]
    assert feasible and infeasible                        # the study went on past them
    for t in feasible:
        assert t.value == t.user_attrs["iteration_time_s"] < PENALTY
        assert t.constraints == {CONSTRAINT: 0.0}
        assert set(t.user_attrs["area_fractions"]) == set(setup.template.budget_keys)
        assert sum(t.user_attrs["power_fractions"].values()) <= 1 + 1e-12
        assert t.user_attrs["eval_time_s"] > 0 and t.user_attrs["bottleneck"]
    for t in infeasible:
        assert t.user_attrs["infeasible_reason"]            # the AGE's message, with numbers
        assert t.constraints[CONSTRAINT] > 0 and t.value >= PENALTY
        assert "iteration_time_s" not in t.user_attrs
    # the first trial of a fresh study is the template's own design
    assert trials[0].user_attrs.get("baseline") is True and trials[0].user_attrs["feasible"]
    # the best design skips infeasible trials, and predicts what the trial recorded
    best = result.best
    assert best["objectives"]["iteration_time_s"] == min(t.value for t in feasible)
    assert crossflow.predict(**best["predict"]).time_s == best["objectives"]["iteration_time_s"]


def test_memory_infeasibility_is_graded(tmp_path):
    setup = load_study("gpt3-175b-a100-pareto")
    result = _run(setup, tmp_path, 40, sampler="random", seed=3)
    trials = result.study.trials
    memory = [t for t in trials if "memory per device" in t.user_attrs.get(
        "infeasible_reason", "")]
    invalid = [t for t in trials if t.user_attrs.get("infeasible_reason", "").startswith(
        "invalid combination")]
    assert memory and invalid and any(t.user_attrs["feasible"] for t in trials)
    for t in memory:  # need / capacity - 1 > 0, and the penalty grows with it
        assert t.constraints[CONSTRAINT] > 0
        assert t.values[0] == pytest.approx(PENALTY * (1 + t.constraints[CONSTRAINT]))
    for t in invalid:
        assert t.constraints[CONSTRAINT] == 1.0
    front = [t for t in trials if is_feasible(t)]
    assert all(len(t.values) == 2 for t in front)


@pytest.mark.parametrize("sampler", ["tpe", "cmaes", "nsga2"])
def test_samplers_run_a_study(tmp_path, sampler, recwarn):
    setup = load_study("gemm-64k")
    result = _run(setup, tmp_path, 25, sampler=sampler)
    assert len(result.study.trials) == 25 and result.best is not None
    assert not [w for w in recwarn if "CmaEs" in str(w.message)]


def test_gd_sampler_runs_a_study(tmp_path):
    setup = load_study("quickstart")
    result = _run(setup, tmp_path, 30, sampler="gd")
    assert len([t for t in result.study.trials if t.state == TrialState.COMPLETE]) >= 30


def test_rerunning_resumes_without_repeating(tmp_path):
    setup = load_study("quickstart")
    first = _run(setup, tmp_path, 15)
    before = {t.number: (t.params, t.values) for t in first.study.trials}
    second = _run(setup, tmp_path, 25)
    assert second.trials_run == 10
    trials = second.study.trials
    assert [t.number for t in trials] == list(range(25))
    assert {t.number: (t.params, t.values) for t in trials[:15]} == before
    assert _run(setup, tmp_path, 25).trials_run == 0      # already complete: nothing to do
    # each launch that ran trials is recorded, with its own seed (the first keeps the
    # study's); the one that found the study complete is not, so the next seed is 2
    launches = [v for k, v in sorted(second.study.user_attrs.items())
                if k.startswith("launch.")]
    assert [launch["seed"] for launch in launches] == [0, 1]


def test_a_total_below_the_baseline_trials_runs_that_many(tmp_path):
    """--trials is the study's total: the template's baseline trials count in it."""
    setup = load_study("quickstart")
    assert len(setup.baseline_trials()) > 1
    result = _run(setup, tmp_path, 1)
    assert result.trials_run == 1 and len(result.study.trials) == 1
    assert result.study.trials[0].user_attrs.get("baseline") is True


def test_interrupted_study_resumes(tmp_path, monkeypatch):
    setup = load_study("quickstart")
    calls = {"n": 0}
    real = objective_module.evaluate

    def flaky(setup_, design):
        calls["n"] += 1
        if calls["n"] == 8:
            raise KeyboardInterrupt
        return real(setup_, design)

    monkeypatch.setattr(objective_module, "evaluate", flaky)
    # designs another test's driver priced ahead and left untaken are not evaluate() calls
    monkeypatch.setattr(objective_module, "_PREFETCHED", {})
    # one trial at a time (the driver evaluates its batches with evaluate_many)
    stopped = _run(setup, tmp_path, 20, sampler="tpe")
    assert stopped.interrupted and stopped.trials_run == 7
    states = [t.state for t in stopped.study.trials]
    assert states.count(TrialState.COMPLETE) == 7 and states.count(TrialState.FAIL) == 1
    done = {t.number: t.params for t in stopped.study.trials if t.state == TrialState.COMPLETE}
    monkeypatch.setattr(objective_module, "evaluate", real)
    resumed = _run(setup, tmp_path, 20, sampler="tpe")
    assert not resumed.interrupted and resumed.trials_run == 13
    complete = [t for t in resumed.study.trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 20
    assert {t.number: t.params for t in complete if t.number in done} == done


def test_ctrl_c_stops_after_the_trial_in_progress(tmp_path, monkeypatch):
    import os
    import signal

    setup = load_study("quickstart")
    calls = {"n": 0}
    real = objective_module.evaluate

    def interrupting(setup_, design):
        calls["n"] += 1
        if calls["n"] == 8:
            os.kill(os.getpid(), signal.SIGINT)      # Ctrl-C while trial 7 runs
        return real(setup_, design)

    monkeypatch.setattr(objective_module, "evaluate", interrupting)
    # designs another test's driver priced ahead and left untaken are not evaluate() calls
    monkeypatch.setattr(objective_module, "_PREFETCHED", {})
    stopped = _run(setup, tmp_path, 20, sampler="tpe")  # one evaluate() per trial
    assert stopped.interrupted and stopped.trials_run == 8
    assert [t.state for t in stopped.study.trials] == [TrialState.COMPLETE] * 8
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # restored


def test_a_signal_the_process_ignores_stays_ignored():
    """``nohup crossflow study run …`` ignores SIGHUP so that the study outlives its
    terminal: the graceful stop must not take it back (nor SIGINT in a background job)."""
    import signal

    from crossflow.search.workers import GracefulStop, interrupts_as_ctrl_c

    before = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGINT)}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with GracefulStop() as stop, interrupts_as_ctrl_c():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGINT) == stop._handle
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def _worker(path: str, n: int, seed: int, out) -> None:
    setup = load_study("quickstart")
    result = run_study(setup, n_trials=n, storage=path, seed=seed, track=False,
                       progress=False)
    out.put(result.trials_run)


def _check_shared_trials(trials, ran: list[int], n: int) -> None:
    """What workers sharing one storage leave: trials numbered without gap, exactly ``n``
    COMPLETE ones, each run by one worker.  The one other outcome allowed is the documented
    race for the last slot (:mod:`crossflow.search.workers`): the loser's trial is FAIL with
    the ``surplus`` user attribute and was never evaluated (no value, no result recorded),
    at most one per worker; it counts in no worker's ``ran``."""
    from crossflow.search.keys import SURPLUS, WORKER

    numbers = [t.number for t in trials]
    assert numbers == list(range(len(trials)))           # no duplicate, no gap
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    surplus = [t for t in trials if t.state == TrialState.FAIL and t.user_attrs.get(SURPLUS)]
    assert len(complete) + len(surplus) == len(trials), \
        [(t.number, t.state.name) for t in trials if t not in complete + surplus]
    for t in surplus:                                    # never evaluated
        assert t.values is None and "feasible" not in t.user_attrs \
            and "eval_time_s" not in t.user_attrs, t
    by_worker = [t.user_attrs.get(WORKER) for t in surplus]
    assert None not in by_worker and len(set(by_worker)) == len(by_worker) <= len(ran)
    # every finished trial was run (and reported) by exactly one worker; each stops once
    # the study has n trials finished or in flight, so the total overshoots by at most one
    assert sum(ran) == len(complete) == n
    assert n <= len(trials) <= n + 1
    assert all(r > 0 for r in ran)


def test_shared_trials_check_accepts_only_an_unevaluated_surplus():
    """The check of :func:`test_two_workers_share_one_journal`, on made-up trials: the
    race's surplus FAIL passes; a surplus that was evaluated, two from one worker, or any
    other FAIL does not."""
    import optuna

    from crossflow.search.keys import SURPLUS, WORKER

    def trial(number, state=TrialState.COMPLETE, worker="h:1", **attrs):
        return optuna.trial.FrozenTrial(
            number=number, trial_id=number, state=state,
            value=1.0 if state == TrialState.COMPLETE else None, datetime_start=None,
            datetime_complete=None, params={}, distributions={},
            user_attrs={WORKER: worker, **attrs}, system_attrs={}, intermediate_values={})

    def numbered(trials):
        for i, t in enumerate(trials):
            t.number = i
        return trials

    done = [trial(i, worker=f"h:{1 + i % 2}") for i in range(4)]
    surplus = trial(4, TrialState.FAIL, worker="h:2", **{SURPLUS: True})
    _check_shared_trials(numbered(done), [2, 2], 4)
    _check_shared_trials(numbered(done + [surplus]), [2, 2], 4)
    bad = [
        trial(4, TrialState.FAIL, worker="h:2", **{SURPLUS: True, "feasible": True}),
        trial(4, TrialState.FAIL, worker="h:2"),          # a FAIL that is no surplus
    ]
    for extra in bad:
        with pytest.raises(AssertionError):
            _check_shared_trials(numbered(done + [extra]), [2, 2], 4)
    with pytest.raises(AssertionError):                   # two surplus trials of one worker
        _check_shared_trials(numbered(done[:3] + [surplus, trial(4, TrialState.FAIL,
                                      worker="h:2", **{SURPLUS: True})]), [2, 1], 3)


def test_two_workers_share_one_journal(tmp_path):
    path = str(tmp_path / "shared.journal")
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    n = 60
    procs = [ctx.Process(target=_worker, args=(path, n, seed, out)) for seed in (0, 100)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    ran = [out.get(timeout=5) for _ in procs]
    setup = load_study("quickstart")
    from crossflow.search.study import open_study

    _check_shared_trials(open_study(setup, path, create=False).trials, ran, n)


def test_cli_quickstart_show_best_export_and_predict(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("study", "run", "quickstart")
    assert code == 0, err
    assert "200 trials run" in out and "best: trial" in out
    assert (tmp_path / "mlruns" / "optuna" / "quickstart.journal").is_file()
    assert (tmp_path / "mlruns" / "mlflow.db").is_file()
    assert not (tmp_path / "mlruns" / "mlflow.db.lock").exists()  # the launch's, let go
    code, out, err = cli("study", "show", "quickstart")
    assert code == 0, err
    assert "200 finished of 200" in out and "best" in out and "structured" in out
    code, out, err = cli("study", "best", "quickstart", "--export", "out/design.yaml")
    assert code == 0, err
    design = yaml.safe_load(Path("out/design.yaml").read_text())
    assert design["files"] == {"hardware": "out/design.hardware.yaml"}
    hardware = yaml.safe_load(Path("out/design.hardware.yaml").read_text())
    assert hardware["kind"] == "architecture"
    assert hardware["area_fractions"] == design["design"]["area_fractions"]
    # the exported design predicts back what the study found, from the shell and Python
    code, out, err = cli("predict", "--workload", "gemm-8192", "--hardware",
                         "out/design.hardware.yaml", "--json")
    assert code == 0, err
    import json

    assert json.loads(out)["time_s"] == design["objectives"]["iteration_time_s"]
    assert crossflow.predict(**design["predict"]).time_s == json.loads(out)["time_s"]
    code, out, _ = cli("study", "list")
    assert code == 0
    assert re.search(r"^quickstart +structured +200  complete  ", out, re.M), out
    # MLflow holds the study's experiment with one child run per trial
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    exp = client.get_experiment_by_name("quickstart")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    numbers = [r.data.tags.get("trial_number") for r in runs]
    trial_numbers = sorted(int(x) for x in numbers if x is not None)
    assert trial_numbers == list(range(200))


def test_cli_distributed_export_round_trips(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("study", "run", "gemm-64k", "--trials", "20", "--no-tracking",
                       "--quiet")
    assert code == 0, err
    code, _, err = cli("study", "best", "gemm-64k", "--export", "d.yaml")
    assert code == 0, err
    design = yaml.safe_load(Path("d.yaml").read_text())
    args = design["predict"]
    code, out, err = cli("predict", "--workload", args["workload"], "--hardware",
                         "d.hardware.yaml", "--system", args["system"], "--parallelism",
                         "d.parallelism.yaml", "--mapping-order", args["mapping_order"],
                         "--json")
    assert code == 0, err
    import json

    assert json.loads(out)["time_s"] == design["objectives"]["iteration_time_s"]


def test_rdb_storage(tmp_path):
    setup = load_study("quickstart")
    url = f"sqlite:///{tmp_path}/db/studies.db"
    result = _run(setup, tmp_path, 12, storage=url)
    assert len(result.study.trials) == 12
    assert _run(setup, tmp_path, 15, storage=url).trials_run == 3


def test_cli_errors(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("study", "show", "quickstart")
    assert code == 2 and "run it first" in err
    code, _, err = cli("study", "run", "no-such-study")
    assert code == 2 and "unknown study preset" in err and "quickstart" in err


def test_cli_ui_starts_mlflow_on_localhost(monkeypatch, cli):
    import crossflow.search.tracking as tracking

    seen = {}

    def fake(uri, host, port):
        seen.update(uri=uri, host=host, port=port)
        return 0

    monkeypatch.setattr(tracking, "launch_ui", fake)
    code, _, _ = cli("ui", "--port", "5055")
    assert code == 0 and seen == {"uri": None, "host": "127.0.0.1", "port": 5055}


def test_best_design_of_a_multi_objective_study(tmp_path):
    setup = load_study("gpt3-175b-a100-pareto")
    result = _run(setup, tmp_path, 30)
    best = best_design(setup, result.study)
    assert set(best["objectives"]) == {"iteration_time_s", "energy_J"}
    p = crossflow.predict(**best["predict"])
    assert p.time_s == best["objectives"]["iteration_time_s"]
    assert p.energy_J == best["objectives"]["energy_J"]


def test_study_best_of_a_two_objective_study_says_it_is_one_point_of_the_front(tmp_path,
                                                                             cli):
    """Issue 20: ``study best`` on a time-and-energy study printed one design as if it were
    the only best one; it says which point of the Pareto front it is, and how to see the
    rest (``study show``, ``--trial N``); so do ``--trial N``, ``--json`` and ``study run``."""
    from crossflow.search.study import best_trials

    setup = load_study("gpt3-175b-a100-pareto")
    journal = str(tmp_path / "p.journal")
    result = _run(setup, tmp_path, 40, sampler="random", storage=journal)
    front = best_trials(result.study)
    assert len(front) >= 2  # the seeded random sampler's 40 trials: a front of several
    points = len({tuple(t.values) for t in front})
    code, out, err = cli("study", "best", setup.name, "--storage", journal)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == (f"  one point of the Pareto front of iteration_time_s and energy_J "
                        f"({points} points), the one with the lowest iteration_time_s:")
    assert lines[1].startswith(f"  trial {front[0].number}: iteration_time_s ")
    assert "best:" not in out
    assert f"crossflow study show {setup.name} --storage {journal}" in out
    assert f"crossflow study best {setup.name} --storage {journal} --trial N" in out
    # another point, picked: a point of the front, not "the lowest"
    code, out, err = cli("study", "best", setup.name, "--storage", journal,
                         "--trial", front[1].number)
    assert code == 0, err
    assert out.splitlines()[0] == (f"  one point of the Pareto front of iteration_time_s and "
                                   f"energy_J ({points} points):")
    assert out.splitlines()[1].startswith(f"  trial {front[1].number}: ")
    # a feasible trial off the front is said to be off it
    off = next(t for t in result.study.trials
               if t.user_attrs.get("feasible") and t.number not in {f.number for f in front})
    code, out, _ = cli("study", "best", setup.name, "--storage", journal, "--trial", off.number)
    assert code == 0 and out.startswith("  a design not on the Pareto front")
    code, out, err = cli("study", "best", setup.name, "--storage", journal, "--json")
    assert code == 0, err
    assert json.loads(out)["pareto_front"] == {"points": points, "designs": len(front),
                                               "on_front": True, "lowest": "iteration_time_s"}
    # one objective: unchanged, no Pareto words
    quick = load_study("quickstart")
    _run(quick, tmp_path, 5, sampler="random")
    code, out, err = cli("study", "best", "quickstart", "--storage",
                         str(tmp_path / "quickstart.journal"))
    assert code == 0, err
    assert out.startswith("  best: trial ") and "Pareto" not in out


def test_study_run_of_a_two_objective_study_says_its_best_is_a_point_of_the_front(tmp_path,
                                                                                 cli):
    journal = str(tmp_path / "p.journal")
    code, out, err = cli("study", "run", "gpt3-175b-a100-pareto", "--trials", "30",
                         "--sampler", "random", "--storage", journal, "--no-tracking",
                         "--quiet")
    assert code == 0, err
    assert "  one point of the Pareto front of iteration_time_s and energy_J (" in out
    assert "best: trial" not in out
    assert "--export design.yaml  the design above, for crossflow predict" in out


def test_baseline_trials_cover_every_technology_choice():
    from crossflow.search import load_study

    setup = load_study("quickstart")
    trials = setup.baseline_trials()
    nodes = [t["logic_node"] for t in trials]
    assert nodes[0] == "N12"  # the template's own design first
    assert sorted(nodes) == sorted(setup.space.dimension("logic_node").choices)
    simplex = {k: v for k, v in trials[0].items() if k != "logic_node"}
    assert all({k: v for k, v in t.items() if k != "logic_node"} == simplex for t in trials)


def test_the_pareto_front_lists_each_design_once():
    """A design proposed twice (NSGA-II's offspring often equal a parent) is one point of
    the front, shown by its first trial."""
    import optuna

    from crossflow.search.study import best_trials

    study = optuna.create_study(directions=["minimize", "minimize"])
    for x, values in ((1, (1.0, 3.0)), (1, (1.0, 3.0)), (2, (2.0, 2.0)), (3, (3.0, 3.0)),
                      (2, (2.0, 2.0))):
        study.enqueue_trial({"x": x})
        trial = study.ask()
        trial.suggest_int("x", 0, 5)
        study.tell(trial, values)
    front = best_trials(study)
    assert [(t.params["x"], t.number) for t in front] == [(1, 0), (2, 2)]


def _nsga2_designs(sampler_class, n: int) -> list[tuple]:
    """The designs ``sampler_class`` proposes in ``n`` trials of a space of 16 designs
    (population 4), whose two objectives make every design a Pareto point."""
    import optuna

    study = optuna.create_study(directions=["minimize", "minimize"],
                                sampler=sampler_class(population_size=4, seed=3))

    def objective(trial):
        x = trial.suggest_categorical("x", [0, 1, 2, 3])
        y = trial.suggest_int("y", 0, 3)
        return x + y, 6 - x - y

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study.optimize(objective, n_trials=n)
    return [(t.params["x"], t.params["y"]) for t in study.trials]


def test_nsga2_does_not_spend_a_trial_on_a_design_the_study_holds():
    """Optuna's NSGA-II re-proposes parents and earlier children (gpt3-175b-a100-pareto:
    423 distinct designs in 639 trials); the study's nsga2 draws again instead, and once
    every design is held it accepts a repeat rather than stall."""
    import optuna

    from crossflow.search.samplers import sampler_class

    plain = _nsga2_designs(optuna.samplers.NSGAIISampler, 16)
    assert len(set(plain)) < 16  # what the issue saw
    ours = _nsga2_designs(sampler_class("nsga2"), 20)
    assert len(set(ours[:16])) == 16 and set(ours[16:]) <= set(ours[:16])


def test_the_pareto_study_evaluates_distinct_designs(tmp_path):
    result = _run(load_study("gpt3-175b-a100-pareto"), tmp_path, 80)
    designs = [tuple(sorted(t.params.items())) for t in result.study.trials]
    assert len(designs) == 80 and len(set(designs)) == 80


def test_a_design_prints_its_values_as_a_parallelism_file_takes_them():
    from crossflow.search.study import design_lines

    lines = design_lines({"strategy": "t2-d16-p2-sp", "area_fractions": {"core": 0.47312},
                          "parallelism_options": {"expert_parallel": 16,
                                                  "use_distributed_optimizer": True,
                                                  "sequence_parallel": False}})
    assert lines[0].split() == ["strategy", "t2-d16-p2-sp"]
    assert "core 0.473" in lines[1]
    assert lines[2].endswith("expert_parallel 16, use_distributed_optimizer true, "
                             "sequence_parallel false")
    # a size searched as a float range reads as the number it is, not a fraction
    sizes = design_lines({"technology": {"tdp_W": 450.0, "chip_area_mm2": 712.5,
                                         "logic_node": "N5"}})
    assert sizes[0].endswith("tdp_W 450, chip_area_mm2 712.5, logic_node N5")
