"""``crossflow dashboard``: its errors, and the read-only view of the studies it serves
(decoded designs, constraints in optuna-dashboard's form, several journals as one storage).

The page itself, in a real browser, is ``tests/test_dashboard_browser.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest

from crossflow.cli import main
from crossflow.errors import ConfigError
from crossflow.search.keys import DESIGN_PREFIX, FEASIBLE, FRACTIONS_SUFFIX
from crossflow.search.tracking import dashboard as dash

TRIALS = 8


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> Path:
    """A folder where the quickstart study ran TRIALS trials (no MLflow) with TPE, whose
    first trials include infeasible designs (the driver makes no trial of a split that
    builds no chip), which the dashboard shows as constraints."""
    work = tmp_path_factory.mktemp("dash")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        assert main(["study", "run", "quickstart", "--trials", str(TRIALS), "--no-tracking",
                     "--sampler", "tpe", "--quiet"]) == 0
    return work


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def journal(work: Path, name: str = "quickstart") -> Path:
    return work / "mlruns" / "optuna" / f"{name}.journal"


# --- the command's errors: exit 2, one paragraph, no server -----------------------------------


@pytest.mark.parametrize("args, says", [
    (["nope"], "no study 'nope': no study file has this name and "
               "mlruns/optuna/nope.journal does not exist; allowed: the studies run here: "
               "quickstart"),
    (["gemm-64k"], "study 'gemm-64k' has not been run here"),
    (["--storage", "missing.journal"], "key '--storage' = 'missing.journal': the journal "
                                       "file does not exist"),
    (["quickstart", "--storage", "sqlite:///empty.db"], "no Optuna studies in this database"),
    (["--storage", "mlruns/optuna"], "the journal file is not a file"),
    (["--port", "0"], "key '--port' = 0: not a TCP port"),
])
def test_errors_are_one_paragraph(ran, monkeypatch, capsys, args, says):
    monkeypatch.chdir(ran)
    assert main(["dashboard", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("crossflow: error: command line: ") and says in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_nothing_run_here(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["dashboard"]) == 2
    err = capsys.readouterr().err
    assert "no study has been run here" in err and "crossflow study run quickstart" in err


def test_a_study_missing_from_its_storage(ran, monkeypatch, capsys):
    monkeypatch.chdir(ran)
    assert main(["dashboard", "gemm-64k", "--storage", str(journal(ran))]) == 2
    err = capsys.readouterr().err
    assert "no study 'gemm-64k' in " in err and "crossflow study run gemm-64k" in err


def test_a_port_in_use(ran, monkeypatch, capsys):
    import socket

    monkeypatch.chdir(ran)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["dashboard", "quickstart", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is already in use" in err and "--port" in err


def test_without_optuna_dashboard(ran, monkeypatch, capsys):
    import builtins

    real = builtins.__import__

    def no_dashboard(name, *args, **kwargs):
        if name.startswith("optuna_dashboard"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.chdir(ran)
    monkeypatch.setattr(builtins, "__import__", no_dashboard)
    assert main(["dashboard", "quickstart", "--port", str(free_port())]) == 2
    assert "optuna-dashboard is not installed: pip install optuna-dashboard" in \
        capsys.readouterr().err


def test_the_command_does_not_import_the_dashboard_early():
    """``crossflow`` starts without optuna_dashboard (imported by the command only)."""
    import subprocess
    import sys

    code = ("import sys, crossflow.cli as c; c._parser(); "
            "print(any(m.startswith('optuna_dashboard') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


# --- where the studies are ------------------------------------------------------------------


def test_sources(ran, monkeypatch):
    monkeypatch.chdir(ran)
    assert dash.sources_for("quickstart") == [
        ("mlruns/optuna/quickstart.journal", frozenset({"quickstart"}))]
    assert dash.sources_for() == [("mlruns/optuna/quickstart.journal", None)]
    assert dash.sources_for(None, "mlruns/optuna/quickstart.journal") == [
        ("mlruns/optuna/quickstart.journal", None)]


def test_every_study_here(ran, tmp_path, monkeypatch):
    """Without NAME: each journal in mlruns/optuna/ and each storage a study file names
    (once, however it is spelled); one that cannot be opened is a ConfigError."""
    import shutil

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlruns" / "optuna").mkdir(parents=True)
    shutil.copy(journal(ran), tmp_path / "mlruns" / "optuna" / "quickstart.journal")
    (tmp_path / "studies").mkdir()
    text = (Path(__file__).parents[1] / "studies" / "quickstart.yaml").read_text()
    for name, storage in (("elsewhere", journal(ran)), ("again", journal(ran)),
                          ("same", "mlruns/optuna/quickstart.journal"),
                          ("remote", "postgresql://u@127.0.0.1:1/x")):
        (tmp_path / "studies" / f"{name}.yaml").write_text(
            text.replace("name: quickstart", f"name: {name}") + f"storage: {storage}\n")
    assert dash.sources_for() == [("mlruns/optuna/quickstart.journal", None),
                                  (str(journal(ran)), None),
                                  ("postgresql://u@127.0.0.1:1/x", None)]
    with pytest.raises(ConfigError, match="cannot read the database"):
        dash.open_source("postgresql://u@127.0.0.1:1/x")


# --- the view -------------------------------------------------------------------------------


def _view(*paths: Path, names=None):
    return dash.studies_view([(dash.open_source(str(p)), names) for p in paths])


def test_each_trial_shows_its_decoded_design_and_constraints(ran):
    before = journal(ran).read_bytes()
    view = _view(journal(ran))
    (study,) = view.get_all_studies()
    assert study.study_name == "quickstart"
    # the objective named in the plots, not "Objective 0"
    assert study.system_attrs[dash.METRIC_NAMES] == ["iteration_time_s"]
    assert view.get_study_system_attrs(0)[dash.METRIC_NAMES] == ["iteration_time_s"]
    trials = view.get_all_trials(study._study_id, deepcopy=False)
    assert len(trials) == TRIALS
    stored = optuna.load_study(study_name="quickstart",
                               storage=dash.open_source(str(journal(ran)))).trials
    for shown, raw in zip(trials, stored, strict=True):
        design = {k: v for k, v in shown.user_attrs.items() if k.startswith(DESIGN_PREFIX)}
        # first in the list, then what is stored, unchanged
        assert list(shown.user_attrs)[:len(design)] == list(design)
        assert {k: v for k, v in shown.user_attrs.items() if k not in design} == raw.user_attrs
        assert shown.params == raw.params and shown.values == raw.values
        for comp, frac in raw.user_attrs[f"area{FRACTIONS_SUFFIX}"].items():
            text = design[f"{DESIGN_PREFIX}area_fractions.{comp}"]
            assert text.endswith(" %") and math.isclose(float(text[:-2]), 100 * frac,
                                                        rel_tol=0.06, abs_tol=0.05)
        assert design[f"{DESIGN_PREFIX}logic_node"] == raw.params["logic_node"]
        assert not any(k.startswith(f"{DESIGN_PREFIX}area.") for k in design)  # no logits
        feasible = raw.user_attrs[FEASIBLE]
        assert shown.system_attrs["constraints"] == [raw.constraints["infeasibility"]]
        assert (shown.system_attrs["constraints"][0] <= 0) == feasible
        assert "constraints" not in raw.system_attrs  # the stored trial is not touched
        assert shown._trial_id == raw._trial_id  # one source: ids unchanged
        assert view.get_trial(shown._trial_id).user_attrs == shown.user_attrs
    assert any(not t.user_attrs[FEASIBLE] for t in trials), "the study had no infeasible trial"
    best = view.get_best_trial(study._study_id)
    assert best.user_attrs[FEASIBLE] is True
    assert best.value == min(t.value for t in trials if t.user_attrs[FEASIBLE])
    # what optuna-dashboard serves: the design and the constraints, as JSON text
    from optuna_dashboard._serializer import serialize_frozen_trial

    data = json.loads(json.dumps(serialize_frozen_trial(study._study_id, trials[0],
                                                        study.system_attrs)))
    assert {a["key"] for a in data["user_attrs"]} >= {f"{DESIGN_PREFIX}area_fractions.core"}
    assert data["constraints"] == trials[0].system_attrs["constraints"]
    assert journal(ran).read_bytes() == before  # read-only


def test_writes_are_refused(ran):
    """As HTTP 403 with the reason (optuna-dashboard's API shows it; no traceback logged)."""
    from bottle import HTTPError

    view = _view(journal(ran))
    for call in (lambda: view.set_trial_user_attr(0, "k", 1),
                 lambda: view.set_study_system_attr(0, "note", "x"),
                 lambda: view.delete_study(0),
                 lambda: view.create_new_study([optuna.study.StudyDirection.MINIMIZE], "x")):
        with pytest.raises(HTTPError) as refused:
            call()
        assert refused.value.status_code == 403 and refused.value.body == dash.READ_ONLY


def test_old_and_unevaluated_trials():
    """A trial stored before constraints were recorded shows its feasibility from its
    attribute; a trial never evaluated (running, failed early) shows no design."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    dist = {"area.core": FloatDistribution(-4, 4), "area.slack": FloatDistribution(-4, 4)}
    old = create_trial(params={"area.core": 1.0, "area.slack": 0.0}, distributions=dist,
                       value=2e12, user_attrs={FEASIBLE: False,
                                               f"area{FRACTIONS_SUFFIX}": {"core": 0.5}})
    assert dash.constraint_list(old) == [1.0]
    assert dash.design_attrs(old) == {f"{DESIGN_PREFIX}area_fractions.core": "50.0 %"}
    early = create_trial(params={"area.core": 1.0, "area.slack": 0.0}, distributions=dist,
                         state=TrialState.FAIL)
    assert dash.design_attrs(early) == {} and dash.constraint_list(early) is None
    shown = dash.present(early, 7)
    assert shown._trial_id == 7 and shown.user_attrs == {} and shown.system_attrs == {}
    assert dash._percent(0.0004) == "0.04 %" and dash._percent(0.437) == "43.7 %"


def test_several_journals_are_one_storage(ran, tmp_path):
    """Two studies in two journals: both listed, ids apart, each trial found by its id."""
    other = tmp_path / "other.journal"
    storage = dash.open_source(str(journal(ran)))
    study = optuna.load_study(study_name="quickstart", storage=storage)
    copy = optuna.create_study(study_name="copy", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(other))))
    copy.add_trials(study.trials[:3])
    view = _view(journal(ran), other)
    studies = view.get_all_studies()
    assert [s.study_name for s in studies] == ["quickstart", "copy"]
    assert [s._study_id for s in studies] == [0, 1]
    ids = set()
    for s in studies:
        for t in view.get_all_trials(s._study_id):
            assert view.get_trial(t._trial_id).number == t.number
            assert view.get_trial_id_from_study_id_trial_number(s._study_id, t.number) \
                == t._trial_id
            ids.add(t._trial_id)
    assert len(ids) == TRIALS + 3
    assert view.get_study_id_from_name("copy") == 1
    assert view.get_n_trials(1) == 3
    # a name filter shows that study only
    assert [s.study_name for s in _view(journal(ran), other, names=frozenset({"copy"}))
            .get_all_studies()] == ["copy"]
    with pytest.raises(KeyError):
        view.get_study_name_from_id(5)


def test_a_damaged_journal_is_a_config_error(tmp_path):
    bad = tmp_path / "bad.journal"
    bad.write_text('{"op_code": 0, "worker_id": "x", "study_name": "s", '
                   '"directions": [1]}\nnot json\n{"op_code": 0}\n')
    with pytest.raises(ConfigError, match="cannot read the journal .*crossflow study show"):
        dash.open_source(str(bad))
