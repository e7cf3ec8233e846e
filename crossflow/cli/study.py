"""``crossflow study list | run | worker | show | best``: the handler of the study commands
and the lines they print (the best design, a Pareto point, the summary).  Optuna and MLflow
are imported by :mod:`crossflow.search` only when a study is opened."""

from __future__ import annotations

import argparse
import json
import os
import sys

from crossflow.cli.status import EXIT_INFEASIBLE, EXIT_OK
from crossflow.errors import ConfigError


def _cmd_study(args: argparse.Namespace) -> int:
    # optuna / mlflow are imported by crossflow.search only when a study is opened
    from crossflow.search import study as studies
    from crossflow.search.locations import redact

    if args.study_command == "list":
        rows = studies.list_studies()
        if args.json:
            print(json.dumps(rows, indent=2))
            return EXIT_OK
        head = {"name": "study", "sampler": "sampler", "n_trials": "trials",
                "state": "state", "description": "what it searches"}
        good = [head, *(r for r in rows if "error" not in r)]
        width = {k: max(len(str(r[k])) for r in good) for k in ("name", "sampler",
                                                                 "n_trials", "state")}
        for row in good:  # the file's sampler and trials; the state of its storage
            print(f"{row['name']:<{width['name']}}  {row['sampler']:<{width['sampler']}}  "
                  f"{row['n_trials']:>{width['n_trials']}}  {row['state']:<{width['state']}}"
                  f"  {row['description']}".rstrip())
        for row in rows:
            if "error" in row:
                print(f"{row['name']:<{width['name']}}  ERROR {row['error']}")
        return EXIT_OK
    if args.study_command == "worker" and args.storage is None:
        from crossflow.search.workers import STORAGE_ENV

        args.storage = os.environ.get(STORAGE_ENV) or None
        if args.storage is None:
            raise ConfigError(f"the study's storage is needed: give --storage URL, or set "
                              f"{STORAGE_ENV}", file="command line", key="--storage")
    setup = studies.load_study(args.name)
    # every argument checked before anything is created (a journal, tables, a study)
    if args.study_command == "run":
        if args.seed is not None:
            studies.check_seed(args.seed, key="--seed")
        if args.trials is not None and args.trials < 1:
            raise ConfigError("must be >= 1", key="--trials", value=args.trials)
        if args.workers < 1:
            raise ConfigError("must be >= 1", key="--workers", value=args.workers)
        try:
            studies.check_launch(args.storage if args.storage is not None else setup.storage,
                                 None if args.no_tracking else
                                 args.tracking_uri or setup.tracking_uri,
                                 storage_key="--storage" if args.storage is not None
                                 else "storage", tracking_key="--tracking-uri"
                                 if args.tracking_uri else "tracking_uri")
        except ConfigError as exc:
            if exc.key in ("storage", "tracking_uri") and setup.file:  # the study file's
                raise ConfigError(exc.problem, file=setup.file, key=exc.key, value=exc.value,
                                  allowed=exc.allowed) from None
            raise
    elif args.storage is not None:
        from crossflow.search.storage import check_storage

        check_storage(args.storage, key="--storage", for_reading=True)  # show, best
    if args.study_command in ("run", "worker"):
        from crossflow.search.storage import check_heartbeat

        check_heartbeat(args.heartbeat, key="--heartbeat")
    if args.study_command in ("run", "worker"):
        from crossflow.search.workers import interrupts_as_ctrl_c

        with interrupts_as_ctrl_c():
            return _launch(args, setup)
    study = studies.open_study(setup, args.storage, create=False, for_reading=True)
    if args.study_command == "show":
        summary = studies.study_summary(setup, study)
        summary["storage"] = redact(args.storage or setup.storage)
        if args.json:
            print(json.dumps(summary, indent=2, default=str))
            return EXIT_OK
        _print_summary(summary)
        return EXIT_OK
    trial = None
    if args.trial is not None:
        trial = next((t for t in study.get_trials(deepcopy=False) if t.number == args.trial),
                     None)
        if trial is None or not studies.is_feasible(trial):
            raise ConfigError("no such finished, feasible trial in the study",
                              file="command line", key="--trial", value=args.trial)
    design = studies.best_design(setup, study, trial)
    if design is None:
        print(f"{setup.name}: no feasible trial yet", file=sys.stderr)
        why = studies.infeasibility(study.get_trials(deepcopy=False))
        print("\n".join(studies.infeasibility_lines(why)), file=sys.stderr)
        return EXIT_INFEASIBLE
    if args.export:
        written = studies.export_design(design, args.export, overwrite=args.force)
        for part, path in written.items():
            print(f"wrote {path} ({part})")
        print(f"  {_exported_command(args.export)}")
    elif args.json:
        where = studies.pareto_position(setup, study, design["trial"])
        print(json.dumps(design if where is None else {**design, "pareto_front": where},
                         indent=2, default=str))
    else:
        ref = args.name + (f" --storage {redact(args.storage)}" if args.storage else "")
        _print_best(setup, design, full=True, study=study, picked=trial is not None,
                    ref=ref)
    return EXIT_OK


def _launch(args: argparse.Namespace, setup) -> int:
    """``study run`` / ``study worker``, their arguments checked."""
    from crossflow.search import study as studies
    from crossflow.search.locations import redact

    if args.study_command == "worker":
        result = studies.join_study(
            setup, storage=args.storage, launch=args.launch, worker_index=args.worker_index,
            tracking_uri=args.tracking_uri, track=not args.no_tracking,
            progress=not args.quiet, heartbeat_s=args.heartbeat)
        print(f"{setup.name}: this worker ran {result.trials_run} trials in "
              f"{result.elapsed_s:.1f} s; {result.total} in the study")
        # 1: finished trials lack an MLflow run (said on stderr), so scripts notice
        return 130 if result.interrupted else 1 if result.untracked else EXIT_OK
    if args.study_command == "run":
        result = studies.run_study(
            setup, n_trials=args.trials, sampler=args.sampler,
            seed=args.seed if args.seed is not None else "study", storage=args.storage,
            tracking_uri=args.tracking_uri, track=not args.no_tracking,
            progress=not args.quiet, workers=args.workers, heartbeat_s=args.heartbeat)
        if result.was_complete:  # nothing ran and nothing was recorded: one line says so
            print(f"{setup.name}: "
                  f"{studies.complete_line(args.name, result, storage=args.storage)}")
            return 1 if result.untracked else EXIT_OK
        run = f"{result.trials_run} trial{'' if result.trials_run == 1 else 's'}"
        print(f"{setup.name}: {run} run in {result.elapsed_s:.1f} s, "
              f"{result.total} in the study ({redact(args.storage or setup.storage)})")
        _print_best(setup, result.best, study=result.study)
        if result.interrupted:
            again = studies.resume_command(args.name, args.trials, sampler=args.sampler,
                                           storage=args.storage)
            print(f"crossflow: interrupted; run '{again}' again to resume", file=sys.stderr)
            return 130
        print("\n".join(studies.next_steps(
            args.name, result, tracking_uri=args.tracking_uri, storage=args.storage,
            budgets_only=studies.searches_budgets_only(setup))))
        return 1 if result.untracked else EXIT_OK  # trials without an MLflow run (stderr)
    raise AssertionError(args.study_command)


def _exported_command(path: str) -> str:
    """The predict command an exported design file holds."""
    import yaml

    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)["command"]


def _print_best(setup, design, full: bool = False, *, study=None, picked: bool = False,
                ref: str | None = None) -> None:
    """The best design (or trial ``--trial N``'s when ``picked``); of a study of several
    objectives, said to be one point of its Pareto front (given ``study``), with the
    commands that show the rest of the front (given ``ref``, the study as the user named
    it, ``--storage`` included)."""
    if design is None:
        print("  no feasible design yet")
        if study is not None:
            from crossflow.search.study import infeasibility, infeasibility_lines

            why = infeasibility(study.get_trials(deepcopy=False))
            print("\n".join(infeasibility_lines(why, indent="    ")))
        return
    from crossflow.search.study import design_lines, pareto_position

    values = ", ".join(f"{k} {v:.6g}" for k, v in design["objectives"].items())
    where = pareto_position(setup, study, design["trial"]) if study is not None else None
    if where is None:
        print(f"  {'trial' if picked else 'best: trial'} {design['trial']}: {values}")
    else:
        print(_pareto_line(setup, where, picked))
        print(f"  trial {design['trial']}: {values}")
    print("\n".join(design_lines(design["design"], full=full)))
    if where is not None and ref is not None:
        lines = [(f"crossflow study show {ref}", "the front"
                  + (", its first 10 points" if where["points"] > 10 else ""))]
        if where["points"] > 10:  # study show lists ten; optuna-dashboard plots them all
            lines.append((f"crossflow dashboard {ref}", "the whole front, plotted"))
        lines.append((f"crossflow study best {ref} --trial N", "another point's design"))
        width = max(len(command) for command, _ in lines)
        print("\n".join(f"  {command:<{width}}  {what}" for command, what in lines))


def _pareto_line(setup, where: dict, picked: bool) -> str:
    """``one point of the Pareto front ...``: the line ``study best`` and ``study run``
    print above the design of a study of several objectives."""
    size = f"{where['points']} point{'' if where['points'] == 1 else 's'}"
    if where["designs"] != where["points"]:
        size += f", {where['designs']} designs"
    front = f"the Pareto front of {' and '.join(setup.objectives)} ({size})"
    if not where["on_front"]:
        return f"  a design not on {front}:"
    if picked:
        return f"  one point of {front}:"
    return f"  one point of {front}, the one with the lowest {where['lowest']}:"


def _print_summary(s: dict) -> None:
    from crossflow.search.study import summary_lines

    print("\n".join(summary_lines(s)))
