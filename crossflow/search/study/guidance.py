"""What ``crossflow study run`` prints around a launch besides its progress: the command that
resumes an interrupted one, the line for a study that already had its trials, and the next
steps after a finished one (the second study with plain CMA-ES among them where the
benchmark tables say it pays).  Each command carries the ``--storage`` the run was given,
so that it reaches the same study."""

from __future__ import annotations

from typing import TYPE_CHECKING

from crossflow.search.locations import redact
from crossflow.search.space import MAPPING_ORDER, STRATEGY

if TYPE_CHECKING:
    from crossflow.search.study.launch import RunResult
    from crossflow.search.study.setup import StudySetup


def _stored(storage: str | None) -> str:
    """The ``--storage`` option a printed command needs to reach the same study (none for
    the study's own storage; a password in a URL masked)."""
    return f" --storage {redact(storage)}" if storage else ""


def resume_command(ref: str, n_trials: int | None = None, *, sampler: str | None = None,
                   storage: str | None = None) -> str:
    """The command that resumes an interrupted ``crossflow study run REF`` (with the
    ``--trials`` it was given, or the resumed launch would stop at the study file's; the
    ``--sampler`` and ``--storage`` it was given, or it would resume another sampler, or
    another study; a password in the storage URL masked)."""
    return (f"crossflow study run {ref}" + (f" --sampler {sampler}" if sampler else "")
            + (f" --trials {n_trials}" if n_trials else "")
            + _stored(storage))


def complete_line(ref: str, result: RunResult, *, storage: str | None = None) -> str:
    """What ``crossflow study run REF`` says of a study that already had its trials
    (``storage``: the ``--storage`` it was given, which the command it prints repeats)."""
    logged = (f"; logged the {result.backfilled} finished trials that had no MLflow run"
              if result.backfilled else "")
    return (f"the study is complete ({result.finished} of {result.n_trials} trials finished"
            f"{logged}); to extend it, give a larger total: crossflow study run {ref} "
            f"--trials N{_stored(storage)}, with N > {max(result.finished, result.n_trials)}")


#: From this many finished trials of a study that searches the budget split and no
#: parallelism (:func:`searches_budgets_only`), the steps after a ``structured`` launch
#: include a second study of as many trials with plain CMA-ES, the better best design to be
#: kept.  On the benchmark tables' 61 such studies that pair ends with a median gap of 0.67 %
#: against 0.55 % for the driver run to 2000 trials, but a worst of 3.7 % against 10.9 %:
#: CMA-ES reaches a basin of the chip's whole units the driver's local searches do not.
#: Where the strategy is searched too the driver's own second 1000 trials do far better
#: (median 0.72 % against the pair's 2.26 %), and below 1000 trials the driver's lead over
#: CMA-ES is large (docs/search-history.md, "A second study with plain CMA-ES").
SECOND_OPINION_TRIALS = 1000
#: Where that second study is stored (another study of the same name, beside the first).
SECOND_OPINION_STORAGE = "cmaes.journal"


def searches_budgets_only(setup: StudySetup) -> bool:
    """Whether a study searches a budget split (technology and integer ranges beside it, if
    any) and no parallelism strategy or mapping order: the benchmark suite's budgets-only
    kind of study."""
    names = {d.name for d in setup.space.dimensions}
    return bool(setup.space.simplex_components()) and not names & {STRATEGY, MAPPING_ORDER}


def next_steps(ref: str, result: RunResult, *, tracking_uri: str | None = None,
               storage: str | None = None, budgets_only: bool = False) -> list[str]:
    """What to do after a finished ``crossflow study run REF`` (lines to print): extend a
    study that was already complete, browse the trials, export the best design, and (the
    launch's sampler ``structured``, the study searching the budget split only,
    ``budgets_only``, and :data:`SECOND_OPINION_TRIALS` finished) run plain CMA-ES as a
    second study; with the ``--storage`` the run was given, so that each command reaches
    the same study."""
    lines = []
    if result.was_complete and result.trials_run == 0:
        lines.append(complete_line(ref, result, storage=storage))
    steps = []
    if result.tracked:
        ui = "crossflow ui" + (f" --tracking-uri {redact(tracking_uri)}" if tracking_uri else "")
        steps.append((ui, "browse the trials in MLflow"))
    steps.append((f"crossflow study show {ref}{_stored(storage)}", "the study's summary"))
    if result.best is not None:
        steps.append((f"crossflow study best {ref}{_stored(storage)} --export design.yaml",
                      "the design above, for crossflow predict"
                      if len(result.best.get("objectives", ())) > 1
                      else "the best design, for crossflow predict"))
    width = max(len(command) for command, _ in steps)  # one column, however long the name
    lines += ["next steps:", *(f"  {c:<{width}}  {what}" for c, what in steps)]
    if (budgets_only and result.launch.get("sampler") == "structured"
            and result.finished >= SECOND_OPINION_TRIALS
            and storage != SECOND_OPINION_STORAGE):
        lines += ["a second opinion (plain CMA-ES ends lower on some long searches; keep the "
                  "better best):",
                  f"  crossflow study run {ref} --sampler cmaes --trials {result.finished} "
                  f"--storage {SECOND_OPINION_STORAGE}"]
    return lines
