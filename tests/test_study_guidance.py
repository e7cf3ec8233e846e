"""What a new user reads around a study run: the progress line, ``study show``, the next
steps after a run and the resume hint after Ctrl-C (crossflow.search.study)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from crossflow.search import study as studies
from crossflow.search.study import Progress, RunResult, load_study, run_study, summary_lines
from crossflow.search.study.guidance import SECOND_OPINION_STORAGE, SECOND_OPINION_TRIALS
from crossflow.search.study.results import settled


def _trial(value: float, feasible: bool):
    return create_trial(values=[value], user_attrs={"feasible": feasible})


def test_progress_counts_every_launch_of_the_study(capsys):
    """Finished trials, the best value and the infeasible count all include the trials of
    earlier launches (the infeasible count used to start from 0 at each launch)."""
    study = optuna.create_study()
    for value, feasible in ((5.0, True), (3.0, True), (1.0, False), (9.0, False)):
        study.add_trial(_trial(value, feasible))
    bar = Progress("s", study, 10, enabled=True)
    assert "4/10 trials, best 3, 2 infeasible" in bar.line(bar.t0 + 1)
    study.add_trial(_trial(0.5, False))
    bar(study, study.trials[-1])
    study.add_trial(_trial(2.0, True))
    bar(study, study.trials[-1])
    line = bar.line(bar.t0 + 1)
    assert "6/10 trials, best 2, 3 infeasible" in line
    bar.poll(study)  # the storage recount (workers) agrees with the callback's
    assert bar.line(bar.t0 + 1) == line


def test_progress_line_of_a_resumed_run_is_study_wide(tmp_path, capsys):
    setup = load_study("quickstart")
    storage = str(tmp_path / "q.journal")
    run_study(setup, n_trials=15, sampler="random", storage=storage, track=False,
              progress=False)
    capsys.readouterr()
    result = run_study(setup, n_trials=25, sampler="random", storage=storage, track=False,
                       progress=True)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    trials = result.study.get_trials(states=(TrialState.COMPLETE,))
    infeasible = sum(1 for t in trials if not t.user_attrs["feasible"])
    best = min(t.values[0] for t in trials if t.user_attrs["feasible"])
    assert f"25/25 trials, best {best:.6g}, {infeasible} infeasible" in last
    assert infeasible > sum(1 for t in trials[15:] if not t.user_attrs["feasible"])


def test_show_reads_as_words(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    assert cli("study", "run", "quickstart", "--trials", "8", "--no-tracking",
               "--sampler", "random")[0] == 0
    code, out, err = cli("study", "show", "quickstart")
    assert code == 0, err
    assert "random (1 launch)" in out  # not "1 launches"
    assert "complete, feasible" in out and "COMPLETE" not in out
    assert "worker processes" not in out  # never run with --workers
    assert cli("study", "run", "quickstart", "--trials", "10", "--no-tracking")[0] == 0
    out = cli("study", "show", "quickstart")[1]
    assert "structured (2 launches)" in out and "10 finished of 10" in out


def test_summary_names_workers_only_when_a_launch_started_several():
    summary = {"study": "s", "description": "d", "storage": "x.journal", "sampler": "tpe",
               "launches": [{"workers": 1}, {"workers": 1}], "objectives": ["iteration_time_s"],
               "finished": 3, "n_trials": 3,
               "states": {"complete, feasible": 2, "complete, infeasible": 1}, "best": [],
               "pareto_size": None, "workers": 1, "processes": 2}
    lines = "\n".join(summary_lines(summary))
    assert "tpe (2 launches)" in lines and "worker" not in lines
    assert "3 finished of 3; complete, feasible: 2; complete, infeasible: 1" in lines
    summary["workers"] = 4
    assert "up to 4 worker processes on a launch" in "\n".join(summary_lines(summary))


def test_run_names_the_next_commands_and_a_complete_study_says_how_to_extend(
        tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("study", "run", "quickstart", "--trials", "6", "--no-tracking")
    assert code == 0, err
    assert "crossflow study best quickstart --export design.yaml" in out
    assert "crossflow study show quickstart" in out
    assert "crossflow ui" not in out  # nothing was logged to MLflow
    assert "complete" not in out
    code, out, err = cli("study", "run", "quickstart", "--trials", "6", "--no-tracking")
    assert code == 0, err
    assert out == ("quickstart: the study is complete (6 of 6 trials finished); to extend "
                   "it, give a larger total: crossflow study run quickstart --trials N, "
                   "with N > 6\n"), out


def test_next_steps_name_the_ui_when_the_run_was_tracked():
    result = RunResult(None, 5, 5, False, 1.0, None, n_trials=5, finished=5, tracked=True)
    lines = "\n".join(studies.next_steps("q", result, tracking_uri="postgresql://u:pw@h/db"))
    assert "crossflow ui --tracking-uri postgresql://u:***@h/db" in lines
    assert "--export" not in lines  # no feasible design to export


def test_resume_hint_keeps_the_launchs_trials(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)

    def interrupted(setup, **kwargs):
        return RunResult(None, 3, 3, True, 0.1, None, n_trials=kwargs["n_trials"] or 200)

    monkeypatch.setattr(studies, "run_study", interrupted)
    code, _, err = cli("study", "run", "quickstart", "--trials", "50", "--no-tracking")
    assert code == 130
    assert "run 'crossflow study run quickstart --trials 50' again to resume" in err
    code, _, err = cli("study", "run", "quickstart", "--no-tracking")
    assert code == 130 and "run 'crossflow study run quickstart' again to resume" in err
    # the sampler and the storage it ran with (not the file's), a password masked
    code, _, err = cli("study", "run", "quickstart", "--sampler", "structured", "--storage",
                       "q.journal", "--no-tracking")
    assert code == 130
    assert ("run 'crossflow study run quickstart --sampler structured --storage q.journal' "
            "again to resume") in err
    assert studies.resume_command("q", 9, storage="postgresql://u:pw@h/db") == \
        "crossflow study run q --trials 9 --storage postgresql://u:***@h/db"


def test_commands_printed_after_a_run_on_another_storage_reach_the_same_study(
        tmp_path, monkeypatch, cli):
    """A study run with --storage is another study than the file's default: every command
    printed after it (show, best, the extension of a complete study) carries the storage,
    or it would show, export or extend the other one."""
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("study", "run", "quickstart", "--trials", "4", "--storage",
                         "cmaes.journal", "--sampler", "cmaes", "--no-tracking", "--quiet")
    assert code == 0, err
    assert "crossflow study show quickstart --storage cmaes.journal" in out
    assert "crossflow study best quickstart --storage cmaes.journal --export design.yaml" in out
    code, best, err = cli("study", "best", "quickstart", "--storage", "cmaes.journal")
    assert code == 0 and "best: trial" in best, err
    code, out, err = cli("study", "run", "quickstart", "--trials", "4", "--storage",
                         "cmaes.journal", "--no-tracking")
    assert code == 0, err
    assert "crossflow study run quickstart --trials N --storage cmaes.journal, with N > 4" \
        in out
    # the study's own storage: no option to repeat
    result = RunResult(None, 5, 5, False, 1.0, {"number": 3}, n_trials=5, finished=5)
    assert "--storage" not in "\n".join(studies.next_steps("q", result))
    assert studies.next_steps("q", result, storage="postgresql://u:pw@h/db")[-1].startswith(
        "  crossflow study best q --storage postgresql://u:***@h/db --export design.yaml")


def test_a_long_structured_search_of_a_split_suggests_cma_es_as_a_second_study():
    """From SECOND_OPINION_TRIALS finished trials of a structured launch on a study that
    searches the budget split only, the next steps offer plain CMA-ES as a study of its own
    (on a storage of its own, the trials of this one); not below it, not after another
    sampler, not where a strategy is searched too, not when this run used that storage."""
    n = SECOND_OPINION_TRIALS

    def steps(finished=n, sampler="structured", budgets_only=True, storage=None):
        result = RunResult(None, finished, finished, False, 1.0, {"number": 3},
                           n_trials=finished, finished=finished,
                           launch={"sampler": sampler})
        return "\n".join(studies.next_steps("q", result, budgets_only=budgets_only,
                                             storage=storage))

    line = (f"crossflow study run q --sampler cmaes --trials {n} "
            f"--storage {SECOND_OPINION_STORAGE}")
    assert line in steps() and "a second opinion" in steps()
    assert f"--trials {n + 500} " in steps(finished=n + 500)
    assert "--sampler cmaes" not in steps(finished=n - 1)
    assert "--sampler cmaes" not in steps(sampler="tpe")
    assert "--sampler cmaes" not in steps(budgets_only=False)
    assert "--sampler cmaes" not in steps(storage=SECOND_OPINION_STORAGE)
    # on another storage of its own, the first study's commands keep theirs
    assert line in steps(storage="q.journal")
    assert "crossflow study show q --storage q.journal" in steps(storage="q.journal")


@pytest.mark.parametrize("study, offered", [("quickstart", True), ("paper-lstm-512", False),
                                            ("gpt3-175b-a100", False)])
def test_the_cli_offers_the_second_study_where_only_the_budget_split_is_searched(
        study, offered, tmp_path, monkeypatch, cli):
    """What ``study run`` prints after a 1000-trial structured launch: quickstart searches
    the split and the logic node (offered); the paper's LSTM the split with the strategy and
    mapping order, where the driver's own next trials do better (not); GPT-3 175B only the
    parallelism (not)."""
    monkeypatch.chdir(tmp_path)
    n = SECOND_OPINION_TRIALS

    def ran(setup, **kwargs):
        return RunResult(None, n, n, False, 1.0, None, n_trials=n, finished=n,
                         launch={"sampler": "structured"})

    monkeypatch.setattr(studies, "run_study", ran)
    code, out, err = cli("study", "run", study, "--trials", str(n), "--no-tracking")
    assert code == 0, err
    assert (f"crossflow study run {study} --sampler cmaes --trials {n}" in out) is offered


def test_budgets_only_is_the_benchmark_tables_kind_of_every_study():
    """searches_budgets_only reads the suite's ``budgets`` kind off a study's space, for
    every study of every table (technology and integer ranges beside the split included)."""
    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(bench))
    import suite

    seen = {}
    for table in sorted((bench / "suite").glob("*.yaml")):
        for e in suite.load_table(table):
            got = studies.searches_budgets_only(load_study(e["spec"]))
            assert got is (e["kind"] == "budgets"), (table.stem, e["name"], e["kind"])
            seen[e["kind"]] = seen.get(e["kind"], 0) + 1
    assert set(seen) == {"budgets", "budgets+strategy+order", "strategy"}
    assert sum(seen.values()) >= 150


def test_next_steps_stay_in_one_column_for_a_long_study_name():
    result = RunResult(None, 5, 5, False, 1.0, {"number": 3}, n_trials=5, finished=5,
                       tracked=True)
    lines = studies.next_steps("qwen3-30b-a3b-h100-with-a-long-name", result)
    steps = lines[lines.index("next steps:") + 1:]
    assert len(steps) == 3
    columns = {line.index(what) for line, what in zip(steps, (
        "browse the trials", "the study's summary", "the best design"), strict=True)}
    assert len(columns) == 1


def test_a_precision_the_chip_lacks_is_refused_by_check_and_by_run(tmp_path, monkeypatch, cli):
    """check = run: a bf16 GEMM on the case-study template (fp16 and fp32 only) is refused
    before any trial, by both, naming the study file, the workload and the chip's
    precisions; no journal is created."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.yaml").write_text("kind: gemm\nname: g\nm: 4096\nn: 4096\nk: 4096\n"
                                     "precision: bf16\n")
    study = (Path(studies.__file__).parents[3] / "studies" / "quickstart.yaml").read_text()
    (tmp_path / "s.yaml").write_text(study.replace("workload: gemm-8192", "workload: g.yaml")
                                     .replace("name: quickstart", "name: q-bf16"))
    for args in (("check", "s.yaml"), ("study", "run", "s.yaml", "--trials", "3",
                                       "--no-tracking")):
        code, out, err = cli(*args)
        assert code == 2 and not out, (args, out)
        assert "s.yaml: key 'workload'" in err and "no bf16 arithmetic" in err
        assert "allowed: fp16, fp32" in err
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize("line,key", [("tracking_uri: foo://x", "tracking_uri"),
                                      ("storage: sqlite://", "storage")])
def test_a_study_files_own_bad_location_is_refused_by_check_and_run_naming_the_file(
        tmp_path, monkeypatch, cli, line, key):
    """check = run for the study file's storage and tracking URI, and the message names
    the file that holds them, not the command line."""
    monkeypatch.chdir(tmp_path)
    study = (Path(studies.__file__).parents[3] / "studies" / "quickstart.yaml").read_text()
    (tmp_path / "s.yaml").write_text(study.replace("name: quickstart", "name: q-loc")
                                     + line + "\n")
    for args in (("check", "s.yaml"), ("study", "run", "s.yaml", "--trials", "2")):
        code, out, err = cli(*args)
        assert code == 2 and not out, (args, out)
        assert err.startswith(f"crossflow: error: s.yaml: key '{key}'"), (args, err)
    assert not (tmp_path / "mlruns").exists()


def _launches(storage: Path) -> list[dict]:
    study = optuna.load_study(study_name="quickstart",
                              storage=studies.make_storage(str(storage)))
    return [v for k, v in sorted(study.user_attrs.items()) if k.startswith("launch.")]


def _mlflow_runs(tmp_path: Path) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("quickstart")
    return client.search_runs([exp.experiment_id], max_results=1000)


@pytest.mark.filterwarnings("ignore:.*noload.*:DeprecationWarning")
def test_rerunning_a_complete_study_records_no_launch_and_logs_no_run(tmp_path, monkeypatch,
                                                                       cli):
    """A re-run of a complete study used to record a launch (so the launch that extends
    the study got seed + 2, not seed + 1) and log an empty MLflow parent run."""
    monkeypatch.chdir(tmp_path)
    storage = tmp_path / "mlruns" / "optuna" / "quickstart.journal"
    assert cli("study", "run", "quickstart", "--trials", "4", "--quiet")[0] == 0
    runs = {r.info.run_id for r in _mlflow_runs(tmp_path)}
    assert len(runs) == 5  # a parent and 4 trials
    code, out, err = cli("study", "run", "quickstart", "--trials", "4", "--quiet")
    assert code == 0, err
    assert len(out.splitlines()) == 1 and "--trials N, with N > 4" in out, out
    assert {r.info.run_id for r in _mlflow_runs(tmp_path)} == runs
    assert len(_launches(storage)) == 1
    assert cli("study", "run", "quickstart", "--trials", "5", "--no-tracking",
               "--quiet")[0] == 0
    seed = load_study("quickstart").spec.seed
    assert [launch["seed"] for launch in _launches(storage)] == [seed, seed + 1]


@pytest.mark.filterwarnings("ignore:.*noload.*:DeprecationWarning")
def test_rerunning_a_complete_study_logs_only_trials_without_a_run(tmp_path, monkeypatch,
                                                                   cli):
    """Trials run with --no-tracking (or while the store was down) are logged by the next
    launch, also when it finds the study complete; still no launch is recorded."""
    monkeypatch.chdir(tmp_path)
    storage = tmp_path / "mlruns" / "optuna" / "quickstart.journal"
    assert cli("study", "run", "quickstart", "--trials", "3", "--no-tracking",
               "--quiet")[0] == 0
    code, out, err = cli("study", "run", "quickstart", "--trials", "3", "--quiet")
    assert code == 0, err
    assert "logged the 3 finished trials that had no MLflow run" in out, out
    runs = _mlflow_runs(tmp_path)
    assert sorted(int(r.data.tags["trial_number"]) for r in runs
                  if "trial_number" in r.data.tags) == [0, 1, 2]
    assert len(_launches(storage)) == 1
    code, out, err = cli("study", "run", "quickstart", "--trials", "3", "--quiet")
    assert code == 0 and "logged" not in out, out
    assert len(_mlflow_runs(tmp_path)) == len(runs)  # nothing new: no parent run either


def test_study_list_shows_each_studys_state_in_columns(tmp_path, monkeypatch, cli):
    """Under a header: the file's sampler and trials, then the state of the study's
    storage (not run, how many run, complete, or a journal that cannot be read), each
    column starting where its header does however long the names."""
    monkeypatch.chdir(tmp_path)
    Path("studies").mkdir()
    base = load_study("quickstart").spec
    for name, n in (("a-study-with-a-long-name", 3), ("short", 2), ("broken", 5)):
        Path(f"studies/{name}.yaml").write_text(
            f"kind: study\nname: {name}\nworkload: gemm-8192\nhardware: deepflow-case-study\n"
            f"search_space: quickstart\nn_trials: {n}\ndescription: {base.description}\n")
    assert cli("study", "run", "short", "--no-tracking", "--quiet")[0] == 0
    assert cli("study", "run", "a-study-with-a-long-name", "--trials", "1", "--no-tracking",
               "--quiet")[0] == 0
    Path("mlruns/optuna/broken.journal").write_bytes(b"\x00not a journal\xff\n")
    code, out, err = cli("study", "list")
    assert code == 0, err
    lines = out.splitlines()
    head = lines[0]
    assert head.split() == ["study", "sampler", "trials", "state", "what", "it", "searches"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert "  1 run  " in rows["a-study-with-a-long-name"]
    assert "  complete  " in rows["short"] and "  unreadable  " in rows["broken"]
    assert "  not run  " in rows["quickstart"]
    for column in ("sampler", "state", "what"):  # left-aligned under the header
        at = head.index(column)
        assert all(row[at - 2:at] == "  " and row[at] != " " for row in rows.values()), out
    at = head.index("trials") + len("trials")  # counts right-aligned
    assert all(row[at - 1].isdigit() and row[at] == " " for row in rows.values()), out


def test_a_pareto_point_of_several_designs_is_one_line_naming_the_others():
    """Designs of equal values (equivalent mapping orders) are one point of the front: the
    issue saw a front whose first ten lines were identical."""
    best = [{"trial": 3, "values": {"iteration_time_s": 13.2, "energy_J": 2.7e6},
             "design": {"strategy": "t8-d24-p8"}, "same_values": [7, 9]},
            {"trial": 5, "values": {"iteration_time_s": 13.4, "energy_J": 2.6e6},
             "design": {"strategy": "t4-d48-p8"}, "same_values": []}]
    summary = {"study": "s", "description": "d", "storage": "x.journal", "sampler": "nsga2",
               "launches": [{}], "objectives": ["iteration_time_s", "energy_J"],
               "finished": 9, "n_trials": 9, "states": {}, "best": best,
               "pareto_size": 2, "pareto_designs": 4, "workers": 1, "processes": 1}
    lines = summary_lines(summary)
    assert lines[-1] == "  Pareto front: 2 points (4 designs)"
    assert lines[-2].endswith("trial 5: iteration_time_s 13.4, energy_J 2.6e+06")
    assert "trial 3: iteration_time_s 13.2, energy_J 2.7e+06 (also trials 7, 9: other " \
        "designs, the same values)" in "\n".join(lines)


def test_a_study_whose_progress_reader_goes_away_runs_to_its_trials(tmp_path):
    """``crossflow study run … 2>&1 | head -2``: the reader of the progress line leaves
    early; the study still runs its --trials (it stopped short before, exit 0), and the
    command ends with exit 0 and no traceback anywhere."""
    import os
    import subprocess
    import sys

    from crossflow.search.workers import child_env

    read, write = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "crossflow", "study", "run", "quickstart", "--trials", "40",
         "--no-tracking", "--storage", str(tmp_path / "q.journal")],
        cwd=tmp_path, env=child_env(), stdin=subprocess.DEVNULL, stdout=write, stderr=write)
    os.close(write)
    os.read(read, 1)      # the first progress bytes, then the reader goes away
    os.close(read)
    assert proc.wait(timeout=300) == 0
    from crossflow.search.storage import make_storage

    study = optuna.load_study(study_name="quickstart",
                              storage=make_storage(str(tmp_path / "q.journal")))
    assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 40


def test_a_study_with_no_feasible_design_says_why(tmp_path, monkeypatch, cli):
    """A 1.2B-parameter transformer on one case-study chip (over its DRAM at every split,
    the DRAM devices being bound by the perimeter): ``study run``, ``show`` and ``best``
    each say what every trial ran into, grouped by reason, and the trial nearest to
    feasible with its numbers — not only that there is no feasible design."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "big.yaml").write_text("""\
kind: study
name: big-on-one-chip
workload: {kind: transformer, name: gpt-1792, num_layers: 24, hidden_size: 1792,
           num_attention_heads: 16, seq_length: 1024, vocab_size: 51200,
           global_batch_size: 8, micro_batch_size: 1, precision: fp16,
           activation_recompute: full}
hardware: deepflow-case-study
overrides: {logic_node: N5}
search_space: {simplexes: {area: [core, L1, L2, dram_ctrl]}}
objectives: [iteration_time_s]
sampler: structured
seed: 0
n_trials: 12
""")
    code, out, err = cli("study", "run", "big.yaml", "--no-tracking")
    assert code == 0, err
    assert "every one of the 12 finished trials is infeasible:" in out
    assert "12 × memory per device … GB exceeds the … GB of DRAM" in out
    assert "nearest to feasible: trial " in out and "18.61 GB exceeds the 17.18 GB" in out
    code, out, err = cli("study", "show", "big.yaml")
    assert code == 0 and "no feasible trial yet" in out and "nearest to feasible" in out
    code, out, err = cli("study", "best", "big.yaml")
    assert code == 3 and "12 × memory per device" in err


def test_the_infeasibility_digest_is_only_for_a_study_with_no_feasible_trial():
    """One feasible trial is enough for a best design: then no digest."""
    infeasible = create_trial(values=[1.0], user_attrs={"feasible": False,
                                                        "infeasible_reason": "memory per "
                                                        "device 3 GB exceeds the 2 GB"},
                              constraints={"infeasibility": 0.5})
    assert studies.infeasibility([infeasible])["reasons"] == [
        {"reason": "memory per device … GB exceeds the … GB", "trials": 1}]
    assert studies.infeasibility([infeasible, _trial(2.0, True)]) is None
    assert studies.infeasibility([]) is None


def test_show_says_since_when_the_search_has_been_within_a_tenth_of_a_percent_of_its_best(
        tmp_path, monkeypatch, cli):
    """Whether a search is still finding better designs decides between extending a study,
    switching its sampler and stopping: ``show`` names the first trial within 0.1 % of the
    best and counts the finished trials since (a gain of 0.01 % later is no new basin)."""
    monkeypatch.chdir(tmp_path)
    assert cli("study", "run", "quickstart", "--trials", "12", "--no-tracking",
               "--sampler", "random", "--seed", "3")[0] == 0
    code, out, err = cli("study", "show", "quickstart", "--json")
    assert code == 0, err
    s = json.loads(out)
    best = s["best"][0]
    assert s["settled"]["trial"] <= best["trial"]
    assert s["settled"]["since"] == s["finished"] - 1 - s["settled"]["trial"]
    lines = summary_lines(s)
    since = [ln for ln in lines if "% of it since trial" in ln]
    assert len(since) == (1 if s["settled"]["since"] else 0)
    if since:
        assert lines[lines.index(since[0]) - 1].startswith("  best        trial")


def test_settled_is_the_first_trial_within_a_tenth_of_a_percent_of_the_best():
    trials = [_numbered(0, 2.0), _numbered(1, 1.0005), _numbered(2, 0.5, feasible=False),
              _numbered(3, 1.0), _numbered(4, 1.3)]
    got = settled(trials, trials[3])
    assert got == {"trial": 1, "since": 3, "within": 1e-3}
    # a gain of more than 0.1 % after it moves the settled trial to the best itself
    trials[1] = _numbered(1, 1.002)
    assert settled(trials, trials[3])["trial"] == 3


def _numbered(number: int, value: float, feasible: bool = True):
    t = _trial(value, feasible)
    t.number = number
    return t


def test_the_trials_since_the_search_settled_are_not_shown_when_there_are_none():
    summary = {"study": "s", "description": "d", "storage": "x.journal", "sampler": "tpe",
               "launches": [{}], "objectives": ["iteration_time_s"], "finished": 5,
               "n_trials": 5, "states": {}, "pareto_size": None, "workers": 1,
               "processes": 1, "settled": {"trial": 4, "since": 0, "within": 1e-3},
               "best": [{"trial": 4, "values": {"iteration_time_s": 1.5},
                         "design": {"strategy": "t8"}, "same_values": []}]}
    assert "of it since" not in "\n".join(summary_lines(summary))
    summary["settled"] = {"trial": 2, "since": 1, "within": 1e-3}
    assert "  within 0.1 % of it since trial 2, 1 trial ago" in "\n".join(summary_lines(summary))
