"""``crossflow dashboard``: optuna-dashboard on the studies' storages, read-only and readable.

Users who know Optuna expect optuna-dashboard.  Pointed at a journal file by hand it shows
the softmax logits the samplers see (``area.core = 0.39``, in [-4, 4], see
:mod:`crossflow.search.encoding`) and no infeasible trial (Optuna 5 stores constraints as
``constraints:<name>`` system attributes, optuna-dashboard reads only the older
``constraints`` list).  This module serves optuna-dashboard's own app
(``optuna_dashboard.create_app``, in this process) on a :class:`StudiesView`:

* **One view of every study.**  Studies live one journal file each
  (``mlruns/optuna/<study>.journal``) or in a database; optuna-dashboard takes one storage.
  The view is a read-only Optuna storage over several: each source is opened as Optuna
  opens it (a journal file by ``JournalStorage`` on a plain ``JournalFileBackend``, which
  never writes to an existing file; a database URL by the resilient RDB storage), and the
  view renumbers their studies and trials so that they do not collide.  Why not an
  in-memory copy made at start: the copy costs the same journal replay, then a second copy
  of every trial, and is frozen at start — a running study's new trials would never show.
  The view reads each journal incrementally (Optuna's replay of the lines added since the
  last read), so a study running beside the dashboard updates live.  Writes (notes, a
  deleted study, a trial told from the page) are refused: a dashboard must not race the
  study's workers on its journal.  Studies created after the start in a *new* journal file
  appear on the next start.
* **Readable trials.**  Each evaluated trial shows its decoded design as user attributes
  ``design.<name>`` (:data:`~crossflow.search.keys.DESIGN_PREFIX`), first in its list:
  budget fractions as percentages (``design.area_fractions.core = 43.7 %``), ``strategy``,
  ``mapping_order``, technology choices and the other dimensions, named as in MLflow and
  ``crossflow study best`` (:func:`~crossflow.search.tracking.records.decoded_params`).
  They are made when shown from what every CrossFlow trial already stores (the
  ``<simplex>_fractions``, ``strategy`` and ``mapping_order`` attributes, the parameters):
  nothing new is written per trial, and old studies show them too.
* **Feasibility as Optuna constraints.**  Each trial's constraints (``infeasibility``, 0
  when feasible, see :mod:`crossflow.search.objective`) are shown in the list form
  optuna-dashboard reads, so it marks infeasible trials (greyed in the history plot, left
  out of the Pareto front, "Constraints" in the trial's page).  They are not written in
  that form at trial time: Optuna 5 reads both forms, and every sampler that reads
  ``trial.constraints`` (TPE, NSGA-II, GP, the ``gd`` ledger) would then see each
  constraint twice.  The best trial of a one-objective study is the best feasible one.

Start time, a 1000-trial quickstart study (6.6 MB journal, 2-core VM): the journal's replay
0.4 s, importing optuna-dashboard 1.1 s (scikit-learn, for its importances), the server
answering 1.6 s after launch and the study's 1000 trials served 2.6 s after launch.  optuna
and optuna_dashboard are imported only when the command runs.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from crossflow.errors import ConfigError
from crossflow.search.keys import DESIGN_PREFIX, FEASIBLE, FRACTIONS_SUFFIX, OBJECTIVES
from crossflow.search.locations import MLRUNS, default_storage, is_url, redact
from crossflow.search.tracking.records import decoded_params

#: optuna-dashboard's own default port.
DEFAULT_PORT = 8080
#: Seconds a database URL is retried at start before the dashboard gives up on it.
CONNECT_S = 10.0
#: optuna-dashboard's name of the list of constraint values (a system attribute).
CONSTRAINTS_LIST = "constraints"
#: Optuna's study system attribute of the objectives' names (``Study.set_metric_names``),
#: which optuna-dashboard shows instead of "Objective 0".
METRIC_NAMES = "study:metric_names"
_CONSTRAINT_PREFIX = "constraints:"
_INSTALL = "pip install optuna-dashboard (or pip install -e . in the CrossFlow checkout)"


# --- what to show ----------------------------------------------------------------------------


def _percent(fraction: float) -> str:
    pct = 100.0 * fraction
    return f"{pct:.1f} %" if abs(pct) >= 0.1 or pct == 0 else f"{pct:.2g} %"


def _shown(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.6g}")
    return value


def design_attrs(trial: Any) -> dict[str, Any]:
    """The readable design of an evaluated trial, ``design.<name>`` -> value: budget
    fractions as percentages (text), the other decoded parameters as they are.  Empty for a
    trial the objective never recorded (running, or failed before it was evaluated): its
    simplex parameters are logits, not a design."""
    if FEASIBLE not in trial.user_attrs:
        return {}
    out = {}
    for name, value in decoded_params(trial).items():
        simplex = name.split(".", 1)[0]
        if simplex.endswith(FRACTIONS_SUFFIX) and isinstance(value, int | float):
            out[DESIGN_PREFIX + name] = _percent(float(value))
        else:
            out[DESIGN_PREFIX + name] = _shown(value)
    return out


def constraint_list(trial: Any) -> list[float] | None:
    """The trial's constraint values in optuna-dashboard's list form (names sorted); for a
    trial recorded before constraints were, 1.0 when it says it is infeasible, 0.0 when
    feasible.  None when nothing is known (a running trial)."""
    system = trial.system_attrs
    if isinstance(system.get(CONSTRAINTS_LIST), list):
        return list(system[CONSTRAINTS_LIST])
    named = sorted((k, v) for k, v in system.items() if k.startswith(_CONSTRAINT_PREFIX))
    if named:
        return [float(v) for _, v in named]
    feasible = trial.user_attrs.get(FEASIBLE)
    if isinstance(feasible, bool):
        return [0.0 if feasible else 1.0]
    return None


def study_system_attrs(user_attrs: Mapping[str, Any],
                       system_attrs: Mapping[str, Any]) -> dict[str, Any]:
    """A study's system attributes as the dashboard shows them: the objectives named
    (``iteration_time_s`` rather than "Objective 0") from the study's ``objectives``."""
    out = dict(system_attrs)
    names = user_attrs.get(OBJECTIVES)
    if METRIC_NAMES not in out and isinstance(names, list) and names:
        out[METRIC_NAMES] = [str(n) for n in names]
    return out


def present(trial: Any, trial_id: int) -> Any:
    """A copy of the FrozenTrial ``trial`` as the dashboard shows it: id ``trial_id``,
    the readable design first among the user attributes, the constraint list.  The stored
    trial is not changed."""
    shown = copy.copy(trial)
    shown._trial_id = trial_id
    design = design_attrs(trial)
    if design:
        shown._user_attrs = {**design, **trial.user_attrs}
    constraints = constraint_list(trial)
    if constraints is not None and CONSTRAINTS_LIST not in trial.system_attrs:
        shown._system_attrs = {**trial.system_attrs, CONSTRAINTS_LIST: constraints}
    return shown


# --- the view --------------------------------------------------------------------------------


#: Why a write through the dashboard is refused.
READ_ONLY = "crossflow dashboard is read-only: change a study with the crossflow study commands"


def _view_class():
    from optuna.storages import BaseStorage
    from optuna.study import StudyDirection
    from optuna.study._frozen import FrozenStudy
    from optuna.trial import TrialState

    try:  # optuna-dashboard's API answers a bottle HTTPError with its status and reason,
        from bottle import HTTPError  # any other error with 500 and a logged traceback
    except ImportError:  # (the view without optuna-dashboard: tests, scripts)
        HTTPError = None  # noqa: N806

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        if HTTPError is None:
            raise PermissionError(READ_ONLY)
        raise HTTPError(403, READ_ONLY)

    class StudiesView(BaseStorage):
        """Read-only union of Optuna storages, presented for the dashboard (see the module
        docstring).  ``sources``: (storage, study names to show or None for all).  Study
        ids are given in the order studies are first seen; trial ``t`` of source ``k`` of
        ``n`` is trial ``t * n + k``."""

        def __init__(self, sources: Sequence[tuple[Any, frozenset[str] | None]]) -> None:
            self._sources = list(sources)
            self._ids: dict[tuple[int, int], int] = {}   # (source, study id) -> view id
            self._studies: list[tuple[int, int]] = []    # view id -> (source, study id)
            #: finished trials already presented: (source, trial id) -> presented
            self._done: dict[tuple[int, int], Any] = {}
            self.get_all_studies()  # number the studies now, in the sources' order

        # ids ------------------------------------------------------------------------------
        def _study(self, study_id: int) -> tuple[Any, int, int]:
            if not 0 <= study_id < len(self._studies):
                raise KeyError(f"no study with id {study_id}")
            k, sid = self._studies[study_id]
            return self._sources[k][0], k, sid

        def _trial(self, trial_id: int) -> tuple[Any, int, int]:
            n = len(self._sources)
            return self._sources[trial_id % n][0], trial_id % n, trial_id // n

        def _show(self, k: int, trial: Any) -> Any:
            key = (k, trial._trial_id)
            done = self._done.get(key)
            if done is not None and done.state == trial.state:
                return done
            shown = present(trial, trial._trial_id * len(self._sources) + k)
            if trial.state.is_finished():
                self._done[key] = shown
            return shown

        # studies --------------------------------------------------------------------------
        def get_all_studies(self) -> list:
            out = []
            for k, (storage, names) in enumerate(self._sources):
                for study in storage.get_all_studies():
                    if names is not None and study.study_name not in names:
                        continue
                    key = (k, study._study_id)
                    if key not in self._ids:
                        self._ids[key] = len(self._studies)
                        self._studies.append(key)
                    out.append(FrozenStudy(
                        study.study_name, None, dict(study.user_attrs),
                        study_system_attrs(study.user_attrs, study.system_attrs),
                        self._ids[key],
                        directions=list(study.directions)))
            return sorted(out, key=lambda s: s._study_id)

        def get_study_id_from_name(self, study_name: str) -> int:
            for study in self.get_all_studies():
                if study.study_name == study_name:
                    return study._study_id
            raise KeyError(f"no study named {study_name!r}")

        def get_study_name_from_id(self, study_id: int) -> str:
            storage, _, sid = self._study(study_id)
            return storage.get_study_name_from_id(sid)

        def get_study_directions(self, study_id: int) -> list:
            storage, _, sid = self._study(study_id)
            return storage.get_study_directions(sid)

        def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
            storage, _, sid = self._study(study_id)
            return storage.get_study_user_attrs(sid)

        def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
            storage, _, sid = self._study(study_id)
            return study_system_attrs(storage.get_study_user_attrs(sid),
                                      storage.get_study_system_attrs(sid))

        # trials ---------------------------------------------------------------------------
        def get_trial(self, trial_id: int) -> Any:
            storage, k, tid = self._trial(trial_id)
            return self._show(k, storage.get_trial(tid))

        def get_all_trials(self, study_id: int, deepcopy: bool = True,
                           states: Sequence[Any] | None = None) -> list:
            storage, k, sid = self._study(study_id)
            trials = storage.get_all_trials(sid, deepcopy=False, states=states)
            shown = [self._show(k, t) for t in trials]
            return copy.deepcopy(shown) if deepcopy else shown

        def get_trial_id_from_study_id_trial_number(self, study_id: int,
                                                    trial_number: int) -> int:
            storage, k, sid = self._study(study_id)
            tid = storage.get_trial_id_from_study_id_trial_number(sid, trial_number)
            return tid * len(self._sources) + k

        def get_best_trial(self, study_id: int) -> Any:
            """The best feasible COMPLETE trial (all trials when none is feasible)."""
            trials = self.get_all_trials(study_id, deepcopy=False,
                                         states=[TrialState.COMPLETE])
            if not trials:
                raise ValueError("No trials are completed yet.")
            directions = self.get_study_directions(study_id)
            if len(directions) > 1:
                raise RuntimeError("Best trial can be obtained only for single-objective "
                                   "optimization.")
            feasible = [t for t in trials
                        if all(c <= 0 for c in t.system_attrs.get(CONSTRAINTS_LIST) or [])]
            pick = max if directions[0] == StudyDirection.MAXIMIZE else min
            return pick(feasible or trials, key=lambda t: t.value)

        # writes: refused ------------------------------------------------------------------
        create_new_study = delete_study = set_study_user_attr = set_study_system_attr = refuse
        create_new_trial = set_trial_param = set_trial_state_values = refuse
        set_trial_intermediate_value = set_trial_user_attr = set_trial_system_attr = refuse

    StudiesView.__module__ = __name__
    return StudiesView


def studies_view(sources: Sequence[tuple[Any, frozenset[str] | None]]):
    """A :class:`StudiesView` over (Optuna storage, study names or None) pairs."""
    return _view_class()(sources)


# --- where the studies are -------------------------------------------------------------------


def _known_studies() -> dict[str, str]:
    """Study name -> its storage, for every study file here and shipped (broken files
    skipped: ``crossflow study list`` reports them)."""
    from crossflow.config.loader import load_spec, local_names, preset_names

    out: dict[str, str] = {}
    for name in sorted(set(local_names("studies")) | set(preset_names("studies"))):
        try:
            spec = load_spec(name, "studies")
        except ConfigError:
            continue
        out[spec.name] = spec.storage or default_storage(spec.name)
    return out


def _journals(root: str | Path = MLRUNS) -> list[str]:
    """The journal files of ``<root>/optuna/`` (not the compare runs' folder below it)."""
    folder = Path(root) / "optuna"
    return sorted(str(p) for p in folder.glob("*.journal") if p.is_file())


def _run_first(name: str) -> str:
    return f"run it first ('crossflow study run {name}')"


def sources_for(name: str | None = None, storage: str | None = None
                ) -> list[tuple[str, frozenset[str] | None]]:
    """(location, study names to show or None for all) of what the dashboard serves:

    * ``name`` and ``storage``: that study in that storage;
    * ``name``: that study in its storage (its study file's ``storage``, else
      ``mlruns/optuna/<name>.journal``); ``name`` may be a study file's path;
    * ``storage``: every study in it;
    * neither: every study here: each journal in ``mlruns/optuna/``, and the storage of
      each study file that names one of its own (a database URL, another journal) when it
      exists.

    A :class:`ConfigError` when there is nothing to show (checked again when opened)."""
    if storage is not None:
        _check_location(storage, "--storage")
        return [(storage, frozenset({_study_name(name)}) if name else None)]
    if name is not None:
        study = _study_name(name)
        known = _known_studies()
        where = known.get(study) or default_storage(study)
        if not is_url(where) and not Path(where).is_file():
            ran = sorted(n for n, s in known.items() if is_url(s) or Path(s).is_file())
            ran += [Path(j).stem for j in _journals() if Path(j).stem not in known]
            if study in known:
                problem = f"study {study!r} has not been run here: {where} does not exist; " \
                          + _run_first(study)
            else:
                problem = f"no study {study!r}: no study file has this name and {where} " \
                          "does not exist"
            raise ConfigError(problem, file="command line", key="NAME", value=name,
                              allowed=("the studies run here: " + ", ".join(sorted(set(ran))))
                              if ran else f"none has been run here yet; {_run_first('NAME')}")
        return [(where, frozenset({study}))]
    found: dict[str, str] = {}  # the same file named twice (relative, absolute) is one
    for where in [*_journals(), *_known_studies().values()]:
        if is_url(where) or Path(where).is_file():
            found.setdefault(where if is_url(where) else str(Path(where).resolve()), where)
    if not found:
        raise ConfigError(f"no study has been run here: {Path(MLRUNS) / 'optuna'} has no "
                          f"journal file and no study file names a storage of its own; "
                          f"run one first ('crossflow study run quickstart'), change to the "
                          f"folder you ran studies in, or give --storage", file="command line")
    return [(where, None) for where in found.values()]


def _study_name(name: str) -> str:
    """A study's name from NAME (a study file's path gives the name inside it)."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        from crossflow.config.loader import load_spec

        return load_spec(name, "studies").name
    return name


def _check_location(location: str, key: str) -> None:
    if not isinstance(location, str) or not location.strip():
        raise ConfigError("an empty storage", file="command line", key=key, value=location)
    if is_url(location):
        from crossflow.search.storage import check_storage

        try:
            check_storage(location, key=key)
        except ConfigError as exc:
            raise exc.with_file("command line") from None
        return
    path = Path(location)
    if not path.is_file():
        why = "is not a file" if path.exists() else "does not exist"
        raise ConfigError(f"the journal file {why}", file="command line", key=key,
                          value=location, allowed="a study's journal file "
                          f"({default_storage('NAME')}) or a database URL")


def open_source(location: str, key: str = "storage"):
    """An Optuna storage reading ``location`` (a journal file: never written to; a database
    URL: retried for :data:`CONNECT_S` seconds), or a :class:`ConfigError`."""
    if is_url(location):
        from crossflow.search.storage import make_storage

        if "studies" not in _tables(location, key):  # else Optuna would create its tables
            raise ConfigError("no Optuna studies in this database", key=key,
                              value=redact(location))
        return make_storage(location, reconnect_s=CONNECT_S)
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    _check_location(location, key)
    try:
        return JournalStorage(JournalFileBackend(location))
    except (OSError, ValueError) as exc:  # unreadable, or a damaged record inside
        raise ConfigError(f"cannot read the journal ({exc}); 'crossflow study show NAME' "
                          "repairs a record left torn by a writer that died",
                          key=key, value=location) from None


def _tables(url: str, key: str) -> set[str]:
    """The tables of the database at ``url`` (nothing is created; a SQLite file that does
    not exist has none), or a ConfigError when it cannot be reached."""
    from crossflow.search.storage import existing_tables

    try:
        return existing_tables(url)
    except Exception as exc:  # noqa: BLE001 - any driver's error: said in one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"cannot read the database ({first})", key=key,
                          value=redact(url)) from None


# --- the server ------------------------------------------------------------------------------


def _app(view):
    try:
        from optuna_dashboard import __version__ as version
        from optuna_dashboard._app import create_app
    except ImportError:
        raise ConfigError(f"optuna-dashboard is not installed: {_INSTALL}",
                          file="command line") from None
    return create_app(view), version


def _server(app, host: str, port: int):
    """A threaded WSGI server for ``app`` that logs no request (the page polls)."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
            pass

    return make_server(host, port, app, server_class=Server, handler_class=Quiet)


def serve_dashboard(name: str | None = None, storage: str | None = None,
                    host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> int:
    """Serve optuna-dashboard on :class:`StudiesView` of :func:`sources_for` until Ctrl-C,
    SIGTERM or SIGHUP (exit status 0, no traceback).  The port is checked first
    (:func:`crossflow.search.tracking.ui.check_port`); every error before the server starts
    is a :class:`ConfigError` (exit 2)."""
    import warnings

    from crossflow.search.tracking.ui import check_port
    from crossflow.search.workers import interrupts_as_ctrl_c

    check_port(port, host)
    t0 = time.perf_counter()
    wanted = sources_for(name, storage)
    opened = []
    for location, names in wanted:
        try:
            opened.append((open_source(location, "--storage" if storage else "storage"),
                           names))
        except ConfigError as exc:
            if storage is not None or name is not None:
                raise
            print(f"crossflow dashboard: skipped {redact(location)}: {exc}", file=sys.stderr)
    if not opened:
        raise ConfigError("none of the studies' storages could be opened (see above)",
                          file="command line")
    view = studies_view(opened)
    studies = view.get_all_studies()
    if name is not None and not studies:
        location = wanted[0][0]
        raise ConfigError(f"no study {_study_name(name)!r} in {redact(location)}; "
                          + _run_first(_study_name(name)), file="command line", key="NAME",
                          value=name)
    with warnings.catch_warnings():  # optuna-dashboard's own import-time notices
        warnings.simplefilter("ignore")
        app, version = _app(view)
    server = _server(app, host, port)
    url = f"http://{host}:{port}"
    page = f"{url}/dashboard/studies/{studies[0]._study_id}" if name is not None \
        else f"{url}/dashboard"
    places = ", ".join(redact(w) for w, _ in wanted) if len(wanted) <= 3 else \
        f"{len(wanted)} storages"
    print(f"crossflow dashboard: optuna-dashboard {version} of {len(studies)} "
          f"stud{'y' if len(studies) == 1 else 'ies'} ({places}), read-only, at {page} "
          f"(Ctrl-C stops it; started in {time.perf_counter() - t0:.1f} s)",
          file=sys.stderr, flush=True)
    try:
        with interrupts_as_ctrl_c():
            server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        print("crossflow dashboard: stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0
