"""MLflow tracking of studies (crossflow.search.tracking): every finished trial exactly once
as a child run, with its parameters, metrics and state, also after Ctrl-C and on resume."""

from __future__ import annotations

import csv
import importlib
import math
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from crossflow.search import _plots
from crossflow.search.tracking import (
    StudyTracker,
    duplicates,
    is_logged,
    resolve_locations,
    trial_record,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)
REPO = Path(__file__).resolve().parents[1]
# MLflow's own SQLAlchemy models trigger this when its store is first used
pytestmark = pytest.mark.filterwarnings("ignore:.*noload.*:DeprecationWarning")

SPACE = {"x": {"type": "float", "low": -4.0, "high": 4.0},
         "strategy": {"type": "categorical", "choices": ["RC-4-2", "CR-8"]}}


def objective(trial: optuna.Trial) -> float:
    """Toy objective: a pruned 'infeasible' design for x > 2.5, a failure for x < -2.5."""
    x = trial.suggest_float("x", -4.0, 4.0)
    strategy = trial.suggest_categorical("strategy", ["RC-4-2", "CR-8"])
    trial.set_user_attr("area_fractions", {"core": 1 / (1 + math.exp(-x))})  # the design
    trial.set_user_attr("mapping_order", "kp1-kp2-dp-lp")
    trial.set_user_attr("gd:chain", trial.number % 2)
    if x > 2.5:
        trial.set_user_attr("infeasible_reason", f"memory over capacity at x={x:.2f}")
        raise optuna.TrialPruned()
    if x < -2.5:
        raise ValueError("model error")
    t = (x - 1.0) ** 2 + (0.5 if strategy == "CR-8" else 0.0)
    trial.set_user_attr("iteration_time_s", t)
    trial.set_user_attr("energy_J", 3.0 * t)
    return t


def new_study(name: str = "toy", seed: int = 0) -> optuna.Study:
    return optuna.create_study(study_name=name, sampler=optuna.samplers.RandomSampler(seed=seed))


def uri_of(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"


def tracker(tmp_path, study_name: str = "toy", mode: str = "thread", **kw) -> StudyTracker:
    return StudyTracker(study_name, uri_of(tmp_path), {"sampler": "random", "seed": 0,
                                                       "n_trials": 10}, SPACE, mode=mode, **kw)


def runs(tmp_path, study_name: str = "toy"):
    """(child runs, parent runs) of the study's experiment, active ones."""
    from mlflow import MlflowClient

    client = MlflowClient(uri_of(tmp_path))
    exp = client.get_experiment_by_name(study_name)
    every = client.search_runs([exp.experiment_id], max_results=10000)
    children = [r for r in every if "trial_number" in r.data.tags]
    parents = [r for r in every if "trial_number" not in r.data.tags]
    return children, parents


def check_exactly_once(tmp_path, study: optuna.Study, study_name: str = "toy"):
    children, parents = runs(tmp_path, study_name)
    finished = [t for t in study.trials if t.state.is_finished()]
    numbers = sorted(int(r.data.tags["trial_number"]) for r in children)
    assert numbers == sorted(t.number for t in finished)
    parent_ids = {p.info.run_id for p in parents}
    by_number = {int(r.data.tags["trial_number"]): r for r in children}
    for t in finished:
        run = by_number[t.number]
        assert run.data.tags["mlflow.parentRunId"] in parent_ids
        assert run.data.tags["state"] == t.state.name
        assert run.data.tags["sampler"] == "random"
        assert run.data.params["x"] == repr(t.params["x"])
        assert run.data.params["strategy"] == t.params["strategy"]
        assert float(run.data.params["area_fractions.core"]) \
            == pytest.approx(t.user_attrs["area_fractions"]["core"])
        assert run.data.params["mapping_order"] == "kp1-kp2-dp-lp"
        assert run.data.tags["chain"] == str(t.number % 2)
        assert run.info.status == ("FAILED" if t.state == TrialState.FAIL else "FINISHED")
        if t.state == TrialState.COMPLETE:
            assert run.data.metrics["iteration_time_s"] == pytest.approx(t.value)
            assert run.data.metrics["energy_J"] == pytest.approx(3 * t.value)
            assert run.data.metrics["value"] == pytest.approx(t.value)
        if t.state == TrialState.PRUNED:
            assert run.data.tags["infeasible_reason"] == t.user_attrs["infeasible_reason"]
            assert run.data.tags["infeasible_reason"].startswith("memory over capacity")
            assert run.data.tags["feasible"] == "false"
            assert "iteration_time_s" not in run.data.metrics
    return children, parents


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_every_trial_once_with_params_metrics_state_and_reason(tmp_path, mode):
    study = new_study()
    with tracker(tmp_path, mode=mode) as tr:
        study.optimize(objective, n_trials=25, callbacks=[tr], catch=(ValueError,))
        tr.finish(study, None)
    states = {t.state for t in study.trials}
    assert {TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL} <= states
    children, parents = check_exactly_once(tmp_path, study)
    assert len(children) == 25 and len(parents) == 1
    assert tr.stats["worker"]["errors"] == [] and tr.stats["worker"]["runs_logged"] == 25
    assert parents[0].info.run_id == tr.parent_run_id
    assert parents[0].info.status == "FINISHED"


def test_the_logging_process_warms_up_before_a_quick_study_ends(tmp_path):
    """Trials that come faster than a batch is written leave the logging process no idle
    moment: it imports what the summary needs (matplotlib, Optuna's importance) once the
    parent run exists anyway, so that the summary, on the study's critical path, does not."""
    study = new_study()
    with tracker(tmp_path, mode="process") as tr:
        study.optimize(objective, n_trials=40, callbacks=[tr], catch=(ValueError,))
        tr.finish(study, None)
    worker = tr.stats["worker"]
    assert worker["errors"] == [] and worker["runs_logged"] == 40
    assert worker["op_s"]["warm_up"] > 0 and worker["summary_warm"] is True


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_ctrl_c_in_a_callback_after_k_trials_leaves_k_runs(tmp_path, mode):
    k = 7

    def stop_after_k(study, trial):
        if trial.number == k - 1:
            raise KeyboardInterrupt

    study = new_study()
    with pytest.raises(KeyboardInterrupt), tracker(tmp_path, mode=mode) as tr:
        study.optimize(objective, n_trials=50, callbacks=[tr, stop_after_k],
                       catch=(ValueError,))
    assert len(study.trials) == k
    children, parents = check_exactly_once(tmp_path, study)
    assert len(children) == k
    assert parents[0].info.status == "KILLED"


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_batches_smaller_than_the_launch_log_every_trial_once(tmp_path, mode):
    """23 trials in batches of at most 5 (23 is no multiple of 5): 23 runs, each with its
    params, metrics and tags, written in several transactions none larger than 5."""
    study = new_study()
    with tracker(tmp_path, mode=mode, batch_size=5) as tr:
        study.optimize(objective, n_trials=23, callbacks=[tr], catch=(ValueError,))
        tr.finish(study, None)
    children, parents = check_exactly_once(tmp_path, study)
    assert len(children) == 23 and len(parents) == 1
    worker = tr.stats["worker"]
    assert worker["errors"] == [] and worker["runs_logged"] == 23
    assert worker["batches"] >= 5 and 1 <= worker["largest_batch"] <= 5
    with pytest.raises(ValueError, match="batch_size"):
        tracker(tmp_path, batch_size=0)


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_sigint_while_a_batch_waits_loses_no_trial(tmp_path, mode):
    """A real SIGINT (Ctrl-C) at trial 11 of 50, in batches of 4: the trials waiting in an
    unwritten batch, and the interrupted trial (FAIL), all get their run."""
    import signal

    def interrupted(trial):
        if trial.number == 11:
            os.kill(os.getpid(), signal.SIGINT)  # KeyboardInterrupt inside the objective
        return objective(trial)

    study = new_study()
    with pytest.raises(KeyboardInterrupt), tracker(tmp_path, mode=mode, batch_size=4) as tr:
        study.optimize(interrupted, n_trials=50, callbacks=[tr], catch=(ValueError,))
    assert len(study.trials) == 12 and study.trials[-1].state == TrialState.FAIL
    children, parents = runs(tmp_path)
    assert sorted(int(r.data.tags["trial_number"]) for r in children) == list(range(12))
    assert parents[0].info.status == "KILLED"
    assert tr.missing_runs == [] and tr.stats["worker"]["largest_batch"] <= 4


@pytest.mark.parametrize(("k", "give_study"), [(5, False), (0, True)])
def test_ctrl_c_inside_the_objective_logs_the_interrupted_trial_as_failed(tmp_path, k,
                                                                          give_study):
    def interrupted(trial):
        if trial.number == k:
            raise KeyboardInterrupt  # Optuna records the trial FAIL without callbacks
        return objective(trial)

    study = new_study()
    # interrupted in the first trial, the tracker never had a callback: it needs the study
    kw = {"study": study} if give_study else {}
    with pytest.raises(KeyboardInterrupt), tracker(tmp_path, mode="process", **kw) as tr:
        study.optimize(interrupted, n_trials=50, catch=(ValueError,), callbacks=[tr])
    children, _ = runs(tmp_path)
    assert len(children) == k + 1
    last = next(r for r in children if r.data.tags["trial_number"] == str(k))
    assert last.data.tags["state"] == "FAIL" and last.info.status == "FAILED"


def test_resume_logs_only_new_trials_and_backfills_missing_ones(tmp_path):
    from mlflow import MlflowClient

    study = new_study()
    with tracker(tmp_path) as tr:
        study.optimize(objective, n_trials=6, callbacks=[tr], catch=(ValueError,))
    # trials run without a tracker, and a run lost (deleted) since
    study.optimize(objective, n_trials=3, catch=(ValueError,))
    children, _ = runs(tmp_path)
    lost = next(r for r in children if r.data.tags["trial_number"] == "2")
    MlflowClient(uri_of(tmp_path)).delete_run(lost.info.run_id)

    with tracker(tmp_path) as tr2:
        study.optimize(objective, n_trials=4, callbacks=[tr2], catch=(ValueError,))
    children, parents = check_exactly_once(tmp_path, study)
    assert len(children) == 13 and len(parents) == 2
    backfilled = sorted(int(r.data.tags["trial_number"]) for r in children
                        if r.data.tags.get("backfilled") == "true")
    assert backfilled == [2, 6, 7, 8]
    assert tr2.stats["worker"]["runs_logged"] == 8  # 4 back-filled + 4 new

    # a third launch given the study up front back-fills nothing and runs nothing new
    with tracker(tmp_path, study=study) as tr3:
        tr3.finish(study, None)
    children, parents = check_exactly_once(tmp_path, study)
    assert len(children) == 13 and len(parents) == 3
    assert tr3.stats["worker"]["runs_logged"] == 0


def test_a_study_created_again_under_the_same_name_is_logged_anew(tmp_path):
    first = new_study()
    with tracker(tmp_path) as tr:
        first.optimize(objective, n_trials=3, callbacks=[tr], catch=(ValueError,))
    again = new_study(seed=1)  # same name, new storage: its trial 0 is another trial
    later = datetime.now() + timedelta(hours=1)
    trial = optuna.trial.create_trial(
        params={"x": 1.0}, value=0.5, user_attrs={"iteration_time_s": 0.5},
        distributions={"x": optuna.distributions.FloatDistribution(-4, 4)})
    trial.datetime_start, trial.datetime_complete = later, later + timedelta(seconds=1)
    again.add_trial(trial)
    with tracker(tmp_path, study=again) as tr2:
        pass
    assert tr2.stats["worker"]["runs_logged"] == 1
    assert sorted(r.data.tags["trial_number"] for r in runs(tmp_path)[0]) == ["0", "0", "1", "2"]


def test_parent_run_artifacts_params_and_metrics(tmp_path):
    from mlflow import MlflowClient

    study = new_study()
    design = {"workload": "gemm-8192", "hardware": {"area_fractions": {"core": 0.4}}}
    with tracker(tmp_path) as tr:
        study.optimize(objective, n_trials=12, callbacks=[tr], catch=(ValueError,))
        tr.finish(study, design)
    client = MlflowClient(uri_of(tmp_path))
    parent = client.get_run(tr.parent_run_id)
    root = parent.info.artifact_uri.removeprefix("file://")
    names = {a.path for a in client.list_artifacts(tr.parent_run_id)}
    assert {"best_design.yaml", "trials.csv", "optimization_history.png",
            "param_importances.png", "launch"} <= names
    assert str(tmp_path / "mlruns" / "artifacts") in root
    with open(f"{root}/best_design.yaml") as fh:
        assert yaml.safe_load(fh) == design
    with open(f"{root}/launch/search_space.yaml") as fh:
        assert yaml.safe_load(fh) == SPACE
    with open(f"{root}/trials.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["number"]) for r in rows] == list(range(12))
    assert {"x", "strategy", "area_fractions.core", "iteration_time_s", "state"} <= set(rows[0])
    for png in ("optimization_history.png", "param_importances.png"):
        with open(f"{root}/{png}", "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    data = parent.data
    assert data.params["sampler"] == "random" and data.params["seed"] == "0"
    assert data.params["space.x.low"] == "-4.0"
    assert data.tags["sampler"] == "random" and data.tags["seed"] == "0"
    assert data.tags["git_revision"] and data.tags["crossflow_version"]
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert data.metrics["best_value"] == pytest.approx(study.best_value)
    assert data.metrics["n_trials_complete"] == len(complete)
    assert data.metrics["n_trials"] == 12
    assert data.tags["best_trial_number"] == str(study.best_trial.number)
    assert data.tags["importance_method"] == _plots.IMPORTANCE_METHOD


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_finish_with_too_few_trials_and_multi_objective(tmp_path):
    from mlflow import MlflowClient

    study = optuna.create_study(study_name="mo", directions=["minimize", "minimize"],
                                sampler=optuna.samplers.RandomSampler(seed=0))
    study.set_metric_names(["iteration_time_s", "energy_J"])
    with tracker(tmp_path, "mo") as tr:
        study.optimize(lambda t: (t.suggest_float("x", 0, 1), 1 - t.suggest_float("y", 0, 1)),
                       n_trials=1, callbacks=[tr])
        tr.finish(study, None)
    client = MlflowClient(uri_of(tmp_path))
    parent = client.get_run(tr.parent_run_id)
    assert parent.data.tags["importance_method"] == "none"  # one complete trial: a note
    assert parent.data.metrics["n_pareto_trials"] == 1
    child, = runs(tmp_path, "mo")[0]
    assert set(child.data.metrics) == {"iteration_time_s", "energy_J"}
    names = {a.path for a in client.list_artifacts(tr.parent_run_id)}
    assert {"param_importances.png", "optimization_history.png", "best_design.yaml"} <= names


def test_batched_runs_read_back_like_runs_made_through_the_public_api(tmp_path):
    """The batched path writes MLflow's tables directly: its runs must be indistinguishable
    (through MLflow's API) from create_run + log_batch + set_terminated ones."""
    from mlflow import MlflowClient

    study = new_study()
    study.optimize(objective, n_trials=10, catch=(ValueError,))
    for name, bulk in (("batched", True), ("api", False)):
        with tracker(tmp_path, name, study=study, bulk=bulk) as tr:
            pass
        assert tr.stats["worker"]["runs_logged_in_batches"] == (10 if bulk else 0)
        assert tr.stats["worker"]["runs_logged"] == 10
    client = MlflowClient(uri_of(tmp_path))
    got = {}
    for name in ("batched", "api"):
        children, _ = runs(tmp_path, name)
        got[name] = {r.data.tags["trial_number"]: r for r in children}
    assert set(got["batched"]) == set(got["api"]) == {str(i) for i in range(10)}
    for n, a in got["batched"].items():
        b = got["api"][n]
        assert a.data.params == b.data.params
        assert a.data.metrics == b.data.metrics
        strip = {"mlflow.parentRunId"}
        assert ({k: v for k, v in a.data.tags.items() if k not in strip}
                == {k: v for k, v in b.data.tags.items() if k not in strip})
        for field in ("status", "start_time", "end_time", "lifecycle_stage", "run_name",
                      "user_id"):
            assert getattr(a.info, field) == getattr(b.info, field), field
        assert a.info.artifact_uri.endswith(f"/{a.info.run_id}/artifacts")
        for key in a.data.metrics:
            hist = client.get_metric_history(a.info.run_id, key)
            assert [(m.value, m.step) for m in hist] == [(a.data.metrics[key], 0)]
    exp = client.get_experiment_by_name("batched")
    best = client.search_runs([exp.experiment_id], "metrics.iteration_time_s < 100",
                              order_by=["metrics.iteration_time_s ASC"], max_results=1)
    assert best[0].data.tags["trial_number"] == str(study.best_trial.number)


def test_default_and_given_tracking_locations(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri, artifacts = resolve_locations(None)
    assert uri == f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    assert artifacts == (tmp_path / "mlruns" / "artifacts").as_uri()
    assert (tmp_path / "mlruns" / "artifacts").is_dir()
    given = tmp_path / "elsewhere" / "track.db"
    uri, artifacts = resolve_locations(f"sqlite:///{given}")
    assert artifacts == (tmp_path / "elsewhere" / "artifacts").as_uri()
    assert resolve_locations("http://127.0.0.1:5000") == ("http://127.0.0.1:5000", None)

    study = new_study()
    with StudyTracker("toy", f"sqlite:///{given}", {"sampler": "random"}, SPACE,
                      mode="thread") as tr:
        study.optimize(objective, n_trials=3, callbacks=[tr], catch=(ValueError,))
    assert given.exists()
    from mlflow import MlflowClient

    assert len(MlflowClient(f"sqlite:///{given}").search_runs(
        [tr.experiment_id], filter_string="tags.trial_number != ''")) == 3

    with StudyTracker("toy", None, {"sampler": "random"}, SPACE, mode="thread") as tr:
        study.optimize(objective, n_trials=2, callbacks=[tr], catch=(ValueError,))
    assert (tmp_path / "mlruns" / "mlflow.db").exists()
    assert tr.stats["worker"]["runs_logged"] == 5  # 3 back-filled + 2 new, in this store


def test_trial_record_decodes_and_filters():
    start = datetime(2026, 1, 1, 12, 0, 0)
    t = optuna.trial.create_trial(
        params={"area.core": 1.5, "strategy": "RC-4-2"},
        distributions={"area.core": optuna.distributions.FloatDistribution(-4, 4),
                       "strategy": optuna.distributions.CategoricalDistribution(["RC-4-2"])},
        value=2.0,
        user_attrs={"area.core": 0.25, "power_fractions": {"core": 0.5, "L2": 0.1},
                    "iteration_time_s": 2.0, "memory_per_device_bytes": 1e9,
                    "achieved_flops_per_s": math.inf, "bottleneck": "compute",
                    "gd:chain": 3, "infeasible_reason": "x", "worker": "h:1"},
        system_attrs={})
    t.datetime_start, t.datetime_complete = start, start + timedelta(seconds=2)
    rec = trial_record(t, "gd", ["iteration_time_s"])
    # params: the design only; the raw value it replaces and the outcomes are tags
    assert rec["params"] == {"area.core": "0.25", "power_fractions.core": "0.5",
                             "power_fractions.L2": "0.1", "strategy": "RC-4-2"}
    assert rec["tags"]["encoding.area.core"] == "1.5"
    assert rec["tags"]["bottleneck"] == "compute" and rec["tags"]["worker"] == "h:1"
    assert rec["metrics"] == {"iteration_time_s": 2.0, "memory_per_device_bytes": 1e9}
    assert rec["tags"]["chain"] == "3" and rec["tags"]["sampler"] == "gd"
    assert rec["tags"]["infeasible_reason"] == "x"
    assert rec["end_ms"] - rec["start_ms"] == 2000


def test_a_trial_run_shows_the_design_and_keeps_the_simplex_logits_as_tags():
    """The objective's simplex logits (Optuna's parameters) used to be the run's first
    params, before the fractions they decode to; now the params are the design."""
    from crossflow.search import encoding

    logits = dict(zip(encoding.param_names("area", ["core", "L1"]), [1.0, -0.5, 0.25],
                      strict=True))
    dists = {k: optuna.distributions.FloatDistribution(-4, 4) for k in logits}
    dists["logic_node"] = optuna.distributions.CategoricalDistribution(["N5", "N7"])
    t = optuna.trial.create_trial(
        params={**logits, "logic_node": "N7"}, distributions=dists, value=1.0,
        user_attrs={"area_fractions": {"core": 0.5, "L1": 0.2}, "feasible": True,
                    "baseline": True, "iteration_time_s": 1.0})
    rec = trial_record(t, "tpe", ["iteration_time_s"])
    assert rec["params"] == {"area_fractions.core": "0.5", "area_fractions.L1": "0.2",
                             "logic_node": "N7"}
    assert {k: v for k, v in rec["tags"].items() if k.startswith("encoding.")} == {
        "encoding.area.core": "1.0", "encoding.area.L1": "-0.5", "encoding.area.slack": "0.25"}
    assert rec["tags"]["baseline"] == "true" and rec["tags"]["feasible"] == "true"
    assert rec["metrics"] == {"iteration_time_s": 1.0}


def test_runs_view_shows_the_objectives_and_the_design():
    from crossflow.search.tracking.records import runs_view

    space = {"simplexes": {"area": {"components": ["core", "L1", "L2", "dram_ctrl"]}},
             "dimensions": {"logic_node": {}, "strategy": {}}}
    assert runs_view(["iteration_time_s", "energy_J"], space)["selectedColumns"] == [
        "metrics.`iteration_time_s`", "metrics.`energy_J`", "params.`logic_node`",
        "params.`strategy`", "params.`area_fractions.core`", "params.`area_fractions.L1`",
        "params.`area_fractions.L2`", "tags.`feasible`"]


def test_passwords_in_urls_are_not_logged():
    from crossflow.search.tracking import flatten

    got = flatten({"storage": "postgresql://alice:s3cret@db:5432/optuna", "seed": 1})
    assert got == {"storage": "postgresql://alice:***@db:5432/optuna", "seed": "1"}


def test_duplicate_resolution_is_deterministic():
    runs_ = [(1000, "b"), (1500, "a"), (900_000, "c"), (900_400, "d")]
    assert duplicates(runs_) == ["b", "d"]
    assert duplicates(list(reversed(runs_))) == ["b", "d"]
    assert is_logged({3: [1000]}, 3, 1800) and not is_logged({3: [1000]}, 3, 5000)
    assert not is_logged({3: [1000]}, 4, 1000)


def test_importing_the_tracker_does_not_import_mlflow():
    code = ("import sys, crossflow, crossflow.search.tracking; "
            "assert 'mlflow' not in sys.modules, 'mlflow imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_the_summary_importances_need_no_scikit_learn(tmp_path):
    """The logging process keeps scikit-learn out (2 s of CPU a launch): the importance
    plot must come out of PED-ANOVA, not the fallback, with it refused."""
    code = f"""
import sys
sys.modules["sklearn"] = None
import optuna
from pathlib import Path
from crossflow.search import _plots
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
study.optimize(lambda t: (t.suggest_float("x", -4, 4) - 1) ** 2
               + t.suggest_float("y", 0, 1) * 0.01, n_trials=40)
method = _plots.importance_png(Path({str(tmp_path)!r}) / "i.png", study.trials, ["value"], "t")
assert method == _plots.IMPORTANCE_METHOD, method
scores, _, _ = _plots.importance_scores([t.params for t in study.trials],
                                        [t.value for t in study.trials], "minimize")
assert max(scores, key=scores.get) == "x", scores
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    assert (tmp_path / "i.png").read_bytes()[:4] == b"\x89PNG"


def test_importance_falls_back_clearly_when_optuna_cannot_compute_it(tmp_path, monkeypatch):
    study = new_study()
    study.optimize(objective, n_trials=15, catch=(ValueError,))

    def broken(*args, **kwargs):
        raise RuntimeError("cannot evaluate")

    real = importlib.import_module("optuna.importance")  # not optuna's lazy proxy
    monkeypatch.setattr(real, "get_param_importances", broken)
    method = _plots.importance_png(tmp_path / "imp.png", study.trials, ["value"], "toy")
    assert method.startswith("fallback")
    assert (tmp_path / "imp.png").read_bytes()[:4] == b"\x89PNG"
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    scores = _plots.fallback_importances([(t.params, t.value) for t in complete])
    assert set(scores) == {"x", "strategy"} and all(0 <= v <= 1 for v in scores.values())
    assert max(scores, key=scores.get) == "x"  # the value is (x - 1)^2 (+ 0.5 for CR-8)


WORKER = """
import sys, optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
sys.path.insert(0, {tests!r})
from test_tracking import objective
from crossflow.search.tracking import StudyTracker
optuna.logging.set_verbosity(optuna.logging.WARNING)
storage = JournalStorage(JournalFileBackend({journal!r}))
study = optuna.load_study(study_name="shared", storage=storage,
                          sampler=optuna.samplers.RandomSampler())
with StudyTracker("shared", {uri!r}, {{"sampler": "random"}}, {{}}) as tr:
    study.optimize(objective, n_trials=15, callbacks=[tr], catch=(ValueError,))
"""


def test_two_worker_processes_on_one_study_log_each_trial_once(tmp_path):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    journal = str(tmp_path / "journal.log")
    storage = JournalStorage(JournalFileBackend(journal))
    study = optuna.create_study(study_name="shared", storage=storage)
    study.optimize(objective, n_trials=4, catch=(ValueError,))  # a resumed study
    script = WORKER.format(tests=str(REPO / "tests"), journal=journal, uri=uri_of(tmp_path))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, cwd=tmp_path)
             for _ in range(2)]
    assert [p.wait(timeout=240) for p in procs] == [0, 0]
    study = optuna.load_study(study_name="shared", storage=storage)
    assert len(study.trials) == 34
    children, parents = runs(tmp_path, "shared")
    assert len(parents) == 2
    assert sorted(int(r.data.tags["trial_number"]) for r in children) == list(range(34))


def test_the_experiment_carries_the_studys_description(tmp_path):
    """MLflow shows an experiment's ``mlflow.note.content`` tag as its description: set when
    the experiment is made, and on a store an older launch made without it."""
    from mlflow import MlflowClient

    study = new_study()
    with tracker(tmp_path) as t:  # an older launch: no description
        study.optimize(objective, n_trials=2, callbacks=[t])
    client = MlflowClient(uri_of(tmp_path))
    assert "mlflow.note.content" not in client.get_experiment_by_name("toy").tags
    with tracker(tmp_path, description="A toy study of x") as t:
        study.optimize(objective, n_trials=1, callbacks=[t])
    assert client.get_experiment_by_name("toy").tags["mlflow.note.content"] == \
        "A toy study of x"
