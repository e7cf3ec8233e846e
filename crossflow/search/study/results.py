"""What a study found: its best trials and design, the design exported for ``crossflow
predict``, and the summaries ``crossflow study show`` / ``study list`` print
(docs/architecture.md, Studies)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from crossflow.config.base import Spec, read_yaml
from crossflow.config.loader import load_spec, local_names, preset_names
from crossflow.errors import ConfigError
from crossflow.search import keys
from crossflow.search.keys import SURPLUS, WORKER
from crossflow.search.knobs import write_hardware
from crossflow.search.locations import default_storage, is_url
from crossflow.search.space import SIMPLEX_OVERRIDE
from crossflow.search.storage import make_storage
from crossflow.search.study.setup import StudySetup, _relative


def is_feasible(trial) -> bool:
    """A completed trial with a feasible design (see :func:`crossflow.search.keys.is_feasible`)."""
    from optuna.trial import TrialState

    return trial.state == TrialState.COMPLETE and keys.is_feasible(trial)


def best_trials(study) -> list:
    """The feasible trials that are best: one (single objective) or the Pareto front,
    ordered by the first objective."""
    from optuna.trial import TrialState

    trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if is_feasible(t)]
    if not trials:
        return []
    if len(study.directions) == 1:
        return [min(trials, key=lambda t: (t.values[0], t.number))]
    front = sorted((trials[i] for i in pareto_front([t.values for t in trials])),
                   key=lambda t: (t.values, t.number))
    # one trial per design: a sampler that proposes a design again (NSGA-II's offspring
    # often equal a parent) adds a trial, not a point of the front
    seen: set[str] = set()
    distinct = []
    for t in front:
        key = json.dumps(t.params, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            distinct.append(t)
    return distinct


def pareto_front(points: Sequence[Sequence[float]]) -> list[int]:
    """The indices of the non-dominated points, every objective minimised (a point is
    dominated by one no worse in every objective and better in one; equal points are all
    kept), in the order of ``points``.  The one Pareto front of studies and reports."""
    import numpy as np

    if not len(points):
        return []
    v = np.asarray(points, dtype=float)
    return [i for i, row in enumerate(v)
            if not np.any(np.all(v <= row, axis=1) & np.any(v < row, axis=1))]


def best_trial(study):
    """The feasible trial with the lowest first objective on the Pareto front (None if no
    trial is feasible yet)."""
    front = best_trials(study)
    return front[0] if front else None


def pareto_position(setup: StudySetup, study, trial: int) -> dict[str, Any] | None:
    """Where trial number ``trial`` stands on the Pareto front of a study of several
    objectives (None for one objective), for ``study best`` and ``study run`` to say that
    the design they print is one point of a front: ``points`` (distinct objective values,
    as ``study show`` counts them), ``designs`` (the front's distinct designs),
    ``on_front`` and ``lowest`` (the objective whose lowest value picks the default point,
    :func:`best_trial`)."""
    if len(setup.objectives) < 2:
        return None
    front = best_trials(study)
    return {"points": len({tuple(t.values) for t in front}), "designs": len(front),
            "on_front": any(t.number == trial for t in front),
            "lowest": setup.objectives[0]}


def _reference(value: Any, families: tuple[str, ...], base: Path | None) -> Any:
    """A preset name stays a name; a file becomes its mapping (self-contained export)."""
    if isinstance(value, str):
        names = {n for f in families for n in preset_names(f)}
        if value in names and not Path(value).exists():
            return value
        return read_yaml(_relative(value, base))
    return dict(value)


def template_document(template: Spec, overrides: Mapping[str, Any], name: str,
                      description: str) -> dict[str, Any]:
    """The architecture template of a design: the study's template with the design's
    technology choices and budget fractions written in (a ``kind: architecture`` file)."""
    doc = write_hardware(template.model_dump(mode="json"), overrides)
    doc["name"], doc["description"] = name, description
    for key in SIMPLEX_OVERRIDE.values():
        if key in overrides:
            doc[key] = {**doc[key], **{k: float(v) for k, v in overrides[key].items()}}
    return doc


def best_design(setup: StudySetup, study, trial=None) -> dict[str, Any] | None:
    """The design of ``trial`` (default: :func:`best_trial`) as the export writes it.

    Keys: ``study``, ``trial``, ``objectives`` (name -> value), ``design`` (decoded
    fractions, strategy, mapping order, technology and parallelism options) and ``predict``
    — exactly the keyword arguments of :func:`crossflow.predict` (``workload``, ``hardware``,
    ``system``, ``parallelism``, ``mapping_order``; preset names stay names, everything
    else is inline: the hardware of a template study is the generated chip's template with
    the design's fractions and technology written in).  None when no trial is feasible.
    """
    trial = trial if trial is not None else best_trial(study)
    if trial is None:
        return None
    design = setup.design(trial.params)
    base = Path(setup.file).parent if setup.file else None
    order = trial.user_attrs.get("mapping_order", design.mapping_order)
    if setup.template is not None:
        hardware: Any = template_document(
            setup.template, setup.overrides(design), f"{setup.name}-trial-{trial.number}",
            f"study {setup.name}, trial {trial.number}: {setup.template.name} with the "
            "searched budgets and technology")
    else:
        hardware = _reference(setup.spec.hardware or setup.system.device,
                              ("hardware", "templates"), base)
    predict_args: dict[str, Any] = {
        "workload": _reference(setup.spec.workload, ("workloads",), base),
        "hardware": hardware,
    }
    if setup.system is not None:
        predict_args["system"] = _reference(setup.spec.system, ("systems",), base)
    par = setup.parallelism(design)
    if par is not None:
        predict_args["parallelism"] = par
    if order is not None:
        predict_args["mapping_order"] = order
    values = trial.values or []
    return {
        "study": setup.name,
        "trial": trial.number,
        "objectives": dict(zip(setup.objectives, values, strict=False)),
        "design": {
            **{f"{s}_fractions": dict(fr) for s, fr in design.fractions.items()},
            **({"strategy": design.strategy} if design.strategy else {}),
            **({"mapping_order": order} if order else {}),
            **({"technology": dict(design.hardware)} if design.hardware else {}),
            **({"parallelism_options": dict(design.parallelism)}
               if design.parallelism else {}),
        },
        "predict": predict_args,
    }


def export_paths(design: Mapping[str, Any], path: str | Path) -> dict[str, Path]:
    """The files :func:`export_design` writes for ``design`` at ``path``, by part: each inline
    part of ``predict`` (``workload``, ``hardware``, ``system``, ``parallelism``) as
    ``<stem>.<part>.yaml`` beside ``path``, then ``design`` (``path`` itself)."""
    path = Path(path)
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    args = design["predict"]
    out = {part: path.with_name(f"{stem}.{part}.yaml")
           for part in ("workload", "hardware", "system", "parallelism")
           if isinstance(args.get(part), Mapping)}
    out["design"] = path
    return out


def export_design(design: Mapping[str, Any], path: str | Path, *, overwrite: bool = False,
                  option: str = "--export") -> dict[str, Path]:
    """Write ``design`` (from :func:`best_design`) for ``crossflow predict``.

    ``path`` (say ``design.yaml``) gets the whole design, and each inline part of
    ``predict`` goes to a file beside it that ``crossflow predict`` takes:
    ``design.hardware.yaml`` (``kind: architecture``, or the device), ``design.parallelism.yaml``
    and, when they are not preset names, ``design.workload.yaml`` / ``design.system.yaml``.
    ``design.yaml`` lists them under ``files`` with the ``command`` that predicts the design.
    Returns what was written, by part (``design`` for ``path``).

    Every path is checked before anything is written (a directory, a special file or an
    unwritable folder is a ConfigError naming ``option`` and the path); unless
    ``overwrite``, a file that exists — ``path`` or any side file — is refused, listing
    them.  The files are written to temporary files beside them and renamed into place
    together (:class:`crossflow.outputs.OutputFiles`): all of them or none.
    """
    from crossflow.outputs import OutputFiles, output_error

    paths = export_paths(design, path)
    labels = {"design": "the exported design"}
    outputs = [(p, option, labels.get(part, f"the design's {part}, written beside it"))
               for part, p in paths.items()]
    with OutputFiles(outputs, overwrite=overwrite) as files:
        def write(part: str, text: str) -> None:
            try:
                files.temp(paths[part]).write_text(text, encoding="utf-8")
            except OSError as exc:  # a full disk, say: the temporary files are removed
                what = next(w for p, _, w in outputs if p == paths[part])
                raise output_error(paths[part], option, what,
                                   f"could not be written ({exc.strerror or exc})") from None

        _write_export(write, design, paths)
        files.commit()
    return paths


def _write_export(write, design: Mapping[str, Any], paths: Mapping[str, Path]) -> None:
    """The export's files, each through ``write(part, text)``."""
    args = design["predict"]
    command = ["crossflow", "predict"]
    for part in ("workload", "hardware", "system", "parallelism"):
        value = args.get(part)
        if value is None:
            continue
        if part in paths:
            write(part, yaml.safe_dump(dict(value), sort_keys=False))
            value = str(paths[part])
        command += [f"--{part}", str(value)]
    if args.get("mapping_order"):
        command += ["--mapping-order", args["mapping_order"]]
    written = {k: str(v) for k, v in paths.items() if k != "design"}
    doc = {**design, "files": written, "command": " ".join(command)}
    header = (f"# Best design of study {design['study']} (trial {design['trial']}).\n"
              "# 'predict' holds the keyword arguments of crossflow.predict(**predict);\n"
              f"# from the shell:\n#   {doc['command']}\n")
    write("design", header + yaml.safe_dump(doc, sort_keys=False))


# --- summaries ------------------------------------------------------------------------------


#: How ``study show`` names the trials of each state (readable words, in this order).
STATE_LABELS = {
    "COMPLETE_feasible": "complete, feasible",
    "COMPLETE_infeasible": "complete, infeasible",
    "PRUNED": "pruned",
    "RUNNING": "running",
    "WAITING": "waiting",
    "FAIL": "failed (retried)",
    "FAIL_surplus": "not run (over the budget)",
}


def _state_label(trial) -> str:
    """The :data:`STATE_LABELS` entry of a trial.  A FAIL trial is a retried one (its
    worker died; a copy was enqueued) or a surplus one (no slot of the budget was left)."""
    from optuna.trial import TrialState

    state = trial.state.name
    if trial.state == TrialState.COMPLETE:
        state += "_feasible" if is_feasible(trial) else "_infeasible"
    elif trial.state == TrialState.FAIL and trial.user_attrs.get(SURPLUS):
        state = "FAIL_surplus"
    return STATE_LABELS[state]


def _plural(n: int, word: str, plural: str) -> str:
    return f"{n} {word if n == 1 else plural}"


def design_lines(design: Mapping[str, Any], *, full: bool = True) -> list[str]:
    """A decoded design as ``study run``, ``show`` and ``best`` print it, one part a line:
    the strategy and mapping order first, budget fractions to three decimals (a simplex of
    more than eight components only when ``full``), every other part as ``key value``."""
    first = [k for k in ("strategy", "mapping_order") if k in design]
    lines = []
    for key in [*first, *(k for k in design if k not in first)]:
        value = design[key]
        if isinstance(value, Mapping):
            if not full and key.endswith("_fractions") and len(value) > 8:
                continue
            value = ", ".join(f"{k} {_shown(v)}" for k, v in value.items())
        lines.append(f"    {key:<20} {value}")
    return lines


def _shown(v: Any) -> str:
    """A design value as a YAML file takes it: fractions to three decimals, sizes as they
    are, booleans as ``true`` / ``false`` (what a parallelism file or ``--parallelism``
    expects)."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and abs(v) >= 10:  # a size (450 W, 800 mm²), not a fraction
        return f"{v:g}"
    return f"{v:.3f}" if isinstance(v, float) else f"{v}"


def summary_lines(s: Mapping[str, Any]) -> list[str]:
    """The lines ``crossflow study show`` prints for a :func:`study_summary`."""
    lines = [f"{s['study']}: {s['description']}", f"  storage     {s['storage']}"]
    workers = (f", up to {s['workers']} worker processes on a launch"
               if s.get("workers", 0) > 1 else "")
    lines.append(f"  sampler     {s['sampler']} ({_plural(len(s['launches']), 'launch', 'launches')}"
                 f"{workers})")
    lines.append(f"  objectives  {', '.join(s['objectives'])}")
    lines.append(f"  trials      {s['finished']} finished of {s['n_trials']}"
                 + "".join(f"; {k}: {v}" for k, v in s["states"].items() if v))
    if s.get("memory_rejected") or s.get("invalid_rejected"):
        lines.append(f"  screened    {s['memory_rejected']} combinations over memory at the "
                     f"template's split and {s['invalid_rejected']} the configuration "
                     "refuses, rejected without an evaluation (structured.memory_rejected)")
    if s.get("phases"):
        lines.append("  phases      " + ", ".join(f"{k} {v}" for k, v in s["phases"].items()))
    if not s["best"]:
        lines.append("  best        no feasible trial yet")
        lines += infeasibility_lines(s.get("infeasible"), indent="              ")
    for i, b in enumerate(s["best"]):
        values = ", ".join(f"{k} {v:.6g}" for k, v in b["values"].items())
        head = "best" if i == 0 else ""
        same = b.get("same_values") or []
        also = (f" (also trial{'s' if len(same) > 1 else ''} {', '.join(map(str, same))}: "
                "other designs, the same values)" if same else "")
        lines.append(f"  {head:<11} trial {b['trial']}: {values}{also}")
        settle = s.get("settled")
        if i == 0 and settle and settle["since"]:
            # whether the search is still finding better designs: the fact a user needs to
            # decide between extending the study, switching its sampler, or stopping
            lines.append(f"{'':14}within {settle['within'] * 100:g} % of it since trial "
                         f"{settle['trial']}, {_plural(settle['since'], 'trial', 'trials')} "
                         "ago")
        if i == 0:
            lines += design_lines(b["design"])
    if s["pareto_size"]:
        designs = s.get("pareto_designs") or s["pareto_size"]
        lines.append(f"  Pareto front: {_plural(s['pareto_size'], 'point', 'points')}"
                     + (f" ({designs} designs)" if designs != s["pareto_size"] else "")
                     + (f", the first {len(s['best'])} above" if s["pareto_size"]
                        > len(s["best"]) else ""))
    return lines


def infeasibility(trials) -> dict[str, Any] | None:
    """Why a study's finished trials cannot run, for a study with no feasible one: its
    reasons grouped by their wording with the numbers left out (``memory per device … GB
    exceeds the … GB of DRAM``), most frequent first, and the trial nearest to feasible
    (the smallest :data:`~crossflow.search.keys.CONSTRAINT`: how far over memory) with its
    reason in full.  None when some trial is feasible or none has finished."""
    import re
    from collections import Counter

    done = [t for t in trials if keys.FEASIBLE in t.user_attrs]
    if not done or any(is_feasible(t) for t in done):  # the best design's own test
        return None

    def shape(reason: str) -> str:
        # the first clause; every number in it one ellipsis
        head = re.split(r" \(|; ", reason, maxsplit=1)[0]
        return re.sub(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", "…", head)

    reasons = Counter(shape(str(t.user_attrs.get(keys.REASON, "infeasible"))) for t in done)
    nearest = min(done, key=lambda t: (float((getattr(t, "constraints", None) or {}).get(
        keys.CONSTRAINT, 1.0)), t.number))
    return {"trials": len(done),
            "reasons": [{"reason": r, "trials": n} for r, n in reasons.most_common()],
            "nearest": {"trial": nearest.number,
                        "reason": str(nearest.user_attrs.get(keys.REASON, "infeasible"))}}


def infeasibility_lines(why: Mapping[str, Any] | None, indent: str = "  ") -> list[str]:
    """The lines that say why no trial is feasible (:func:`infeasibility`)."""
    if not why:
        return []
    lines = [f"{indent}every one of the {why['trials']} finished trials is infeasible:"]
    lines += [f"{indent}  {r['trials']:>6} × {r['reason']}" for r in why["reasons"][:5]]
    if len(why["reasons"]) > 5:
        lines.append(f"{indent}  ({len(why['reasons']) - 5} more kinds of reason)")
    near = why["nearest"]
    lines.append(f"{indent}nearest to feasible: trial {near['trial']}: {near['reason']}")
    return lines


def study_summary(setup: StudySetup, study) -> dict[str, Any]:
    """What ``crossflow study show`` prints: trials by state, launches, the best design."""
    from collections import Counter

    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    counts = Counter(_state_label(t) for t in trials)
    states = {label: counts[label] for label in STATE_LABELS.values() if counts[label]}
    launches = [v for k, v in sorted(study.user_attrs.items()) if k.startswith("launch.")]
    best = best_trials(study)
    # designs of equal values are one point of the front (equivalent mapping orders, say):
    # a point is listed once, by its first trial, with the others named
    points: dict[tuple, list] = {}
    for t in best:
        points.setdefault(tuple(t.values), []).append(t)
    return {
        "study": setup.name,
        "description": setup.spec.description,
        "storage": setup.storage,
        "objectives": list(setup.objectives),
        "n_trials": int(launches[-1].get("n_trials", setup.spec.n_trials)) if launches
        else setup.spec.n_trials,
        "finished": sum(1 for t in trials if t.state in (TrialState.COMPLETE,
                                                         TrialState.PRUNED)),
        "trials": len(trials),
        "states": states,
        "sampler": launches[-1].get("sampler") if launches else setup.spec.sampler,
        "launches": launches,
        "best": [{"trial": t.number,
                  "values": dict(zip(setup.objectives, t.values, strict=True)),
                  "design": best_design(setup, study, t)["design"],
                  "same_values": [o.number for o in others]}
                 for t, *others in list(points.values())[:10]],
        "settled": settled(trials, best[0]) if best and len(setup.objectives) == 1 else None,
        "pareto_size": len(points) if len(setup.objectives) > 1 else None,
        "pareto_designs": len(best) if len(setup.objectives) > 1 else None,
        # the most worker processes one launch started ('study run --workers K'; 1 when
        # every launch ran in its own process), and the processes that ever ran a trial
        "workers": max((int(v.get("workers") or 1) for v in launches), default=0),
        "processes": len({t.user_attrs[WORKER] for t in trials if WORKER in t.user_attrs}),
        # the structured driver's memory screen and the trials of each of its phases
        "memory_rejected": sum("reason" not in r
                               for r in study.user_attrs.get(keys.DRIVER_MEMORY, [])),
        "invalid_rejected": sum("reason" in r
                                for r in study.user_attrs.get(keys.DRIVER_MEMORY, [])),
        "phases": dict(Counter(t.user_attrs[keys.PHASE] for t in trials
                               if keys.PHASE in t.user_attrs)),
        "infeasible": infeasibility(trials) if not best else None,
    }


#: A design within this of the best (relative) counts as having found it: the gains a
#: search makes after that are the last whole units of one basin (on two budgets-only
#: studies the driver gained 0.01 points in its last 1400-1650 of 2000 trials;
#: docs/search-history.md, "A fifty-fourth round"), not the search still finding better
#: designs.
SETTLED = 1e-3


def settled(trials, best) -> dict[str, Any]:
    """When a one-objective search first came within :data:`SETTLED` of its ``best`` trial:
    that trial's number and how many trials have finished since."""
    from optuna.trial import TrialState

    done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    bound = best.values[0] * (1 + SETTLED)  # every objective is a time or an energy, > 0
    first = min((t.number for t in done if is_feasible(t) and t.values[0] <= bound),
                default=best.number)
    return {"trial": first, "since": sum(1 for t in done if t.number > first),
            "within": SETTLED}


def list_studies() -> list[dict[str, Any]]:
    """Every study by name (``./studies/`` and the shipped ones) with its state in its
    default storage: ``trials`` (how many it holds; None when it has none or they cannot be
    counted) and ``state`` — "not run", "N run" (of the file's ``n_trials``), "complete"
    (at least the file's ``n_trials``: ``study run NAME`` has nothing to do), "unreadable"
    (a journal that cannot be read) or "in a database" (not opened for a listing)."""
    out = []
    for name in sorted(set(local_names("studies")) | set(preset_names("studies"))):
        try:
            spec = load_spec(name, "studies")
        except ConfigError as exc:
            out.append({"name": name, "error": str(exc)})
            continue
        storage = spec.storage or default_storage(spec.name)
        row: dict[str, Any] = {"name": spec.name, "description": spec.description,
                               "sampler": spec.sampler, "n_trials": spec.n_trials,
                               "storage": storage, "trials": None, "state": "not run"}
        if is_url(storage):
            row["state"] = "in a database"
        elif Path(storage).is_file():
            try:
                row["trials"] = _count_trials(storage, spec.name)
            except Exception:  # noqa: BLE001 - a damaged file should not break the listing
                row["state"] = "unreadable"
            else:
                n = row["trials"] or 0
                row["state"] = ("not run" if n == 0 else "complete" if n >= spec.n_trials
                                else f"{n} run")
        out.append(row)
    return out


def _count_trials(path: str, name: str) -> int | None:
    import optuna

    summaries = optuna.get_all_study_summaries(make_storage(path, for_reading=True))
    return next((s.n_trials for s in summaries if s.study_name == name), None)
