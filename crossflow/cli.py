"""``crossflow`` command line (DESIGN.md §7).

Exit status: 0 success, 1 a validation data set missed its tolerance, 2 bad input (one
paragraph on stderr, no traceback unless ``--debug``), 3 the design is infeasible.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from crossflow import __version__
from crossflow.errors import ConfigError, CrossflowError

EXIT_OK, EXIT_TOLERANCE, EXIT_BAD_INPUT, EXIT_INFEASIBLE = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as ConfigError (exit 2, one paragraph)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{message} (see '{self.prog} --help')", file="command line")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="crossflow", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"crossflow {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    pr = sub.add_parser("predict", help="predict a kernel or training iteration")
    pr.add_argument("--hardware", required=True,
                    help="hardware preset name, preset YAML, or architecture template YAML")
    pr.add_argument("--workload", required=True, help="workload YAML or preset name")
    pr.add_argument("--system", help="system preset or YAML (distributed workloads)")
    pr.add_argument("--parallelism", help="parallelism YAML (distributed workloads)")
    pr.add_argument("--mapping-order", help="device-mapping order, or 'best'")
    pr.add_argument("--json", action="store_true", help="print one JSON object")

    ck = sub.add_parser("check", help="validate config files only")
    ck.add_argument("files", nargs="+", metavar="FILE")

    va = sub.add_parser("validate", help="predicted vs measured on real hardware")
    va.add_argument("what", nargs="?", default="all",
                    choices=["gemm", "collectives", "ops", "training", "all"])
    va.add_argument("--csv", help="also write every row to this CSV file")
    va.add_argument("--summary", action="store_true",
                    help="one line per data set (MAPE, Spearman) instead of every row")

    ca = sub.add_parser("calibrate", help="measure this machine and write a hardware preset; "
                        "or re-fit the software-stack constants of the system presets")
    ca.add_argument("what", choices=["cpu", "software"])
    ca.add_argument("--output", default="cpu-this-machine.yaml", help="preset YAML to write")
    ca.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")

    st = sub.add_parser("study", help="run and inspect co-optimisation studies (Optuna)")
    ss = st.add_subparsers(dest="study_command", required=True, parser_class=_Parser)
    sl = ss.add_parser("list", help="the studies in ./studies/ and the shipped ones")
    sl.add_argument("--json", action="store_true", help="print one JSON object")
    sr = ss.add_parser("run", help="run a study (re-running resumes it)")
    sr.add_argument("name", help="study name or YAML file")
    sr.add_argument("--trials", type=int, help="the study's total number of trials")
    sr.add_argument("--sampler", choices=["structured", "gd", "gd-paper", "tpe", "cmaes", "random", "nsga2"])
    sr.add_argument("--seed", type=int, help="sampler seed (default: the study's)")
    sr.add_argument("--storage", help="Optuna storage URL or journal file")
    sr.add_argument("--tracking-uri", help="MLflow tracking URI")
    sr.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    sr.add_argument("--quiet", action="store_true", help="no progress bar")
    sr.add_argument("--workers", type=int, default=1, metavar="K",
                    help="run K worker processes on this launch (default 1; see also "
                    "'study worker' to add workers on other machines)")
    sr.add_argument("--heartbeat", type=float, metavar="SECONDS",
                    help="heartbeat of running trials on an RDB storage (default 10; a dead "
                    "worker's trial is retried after about 3 heartbeats)")
    sw = ss.add_parser("worker", help="join a running study from this machine (RDB storage)")
    sw.add_argument("name", help="study name or YAML file")
    sw.add_argument("--storage", required=True,
                    help="the study's Optuna storage URL (postgresql://...) or journal file")
    sw.add_argument("--launch", help="the launch to join (default: the study's latest)")
    sw.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
    sw.add_argument("--tracking-uri", help="MLflow tracking URI (default: the launch's "
                    "server or database, else mlruns/mlflow.db here)")
    sw.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    sw.add_argument("--quiet", action="store_true", help="no progress bar")
    sw.add_argument("--heartbeat", type=float, metavar="SECONDS",
                    help="heartbeat of running trials on an RDB storage (default 10)")
    for name, text in (("show", "best so far, trials by state, sampler"),
                       ("best", "the best design; --export writes it for crossflow predict")):
        sp = ss.add_parser(name, help=text)
        sp.add_argument("name", help="study name or YAML file")
        sp.add_argument("--storage", help="Optuna storage URL or journal file")
        sp.add_argument("--json", action="store_true", help="print one JSON object")
        if name == "best":
            sp.add_argument("--export", metavar="FILE", help="write the design (YAML) here")
            sp.add_argument("--trial", type=int, help="a trial number instead of the best")

    rp = sub.add_parser("report", help="regenerate one of the paper's case-study reports")
    rp.add_argument("name", help="report name (fig1-gemm-64k, fig9-technology, ...)")
    rp.add_argument("--quick", action="store_true", help="a few points only (seconds)")
    rp.add_argument("--out", metavar="DIR", help="output folder (default mlruns/reports/NAME)")
    rp.add_argument("--tracking-uri", help="MLflow tracking URI (default: mlruns/mlflow.db)")

    cp = sub.add_parser("compare", help="compare samplers on a study at equal budgets")
    cp.add_argument("name", help="study name or YAML file")
    cp.add_argument("--samplers", default="gd,tpe,cmaes,random",
                    help="comma-separated samplers (default gd,tpe,cmaes,random)")
    cp.add_argument("--seeds", type=int, default=3, help="seeds per sampler (0 .. N-1)")
    cp.add_argument("--budget", type=int, default=200, help="model evaluations per run")
    cp.add_argument("--workers", type=int, default=1, help="processes over the runs")
    cp.add_argument("--storage", help="Optuna storage URL (default: a journal file per run "
                    "under mlruns/optuna/compare/)")
    cp.add_argument("--tracking-uri", help="MLflow tracking URI")
    cp.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    cp.add_argument("--quiet", action="store_true", help="no progress lines")

    ui = sub.add_parser("ui", help="MLflow UI on 127.0.0.1 for mlruns/")
    ui.add_argument("--tracking-uri", help="MLflow tracking URI (default: mlruns/mlflow.db)")
    ui.add_argument("--port", type=int, default=5000)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args = _parser().parse_args(argv)
        return _COMMANDS[args.command](args)
    except CrossflowError as exc:
        if debug:
            raise
        if isinstance(exc, ConfigError) and not exc.file:
            exc = exc.with_file("command line")  # a value given as an argument
        print(f"crossflow: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("crossflow: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (crossflow ... | head)
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _cmd_predict(args: argparse.Namespace) -> int:
    from crossflow.predict import predict

    p = predict(workload=args.workload, hardware=args.hardware, system=args.system,
                parallelism=args.parallelism, mapping_order=args.mapping_order)
    if args.json:
        print(json.dumps(p.to_dict(), indent=2, default=float))
    else:
        _print_prediction(p)
    return EXIT_OK if p.feasible else EXIT_INFEASIBLE


def _print_prediction(p) -> None:
    from crossflow.units import fmt_bytes, fmt_rate, fmt_time

    print(f"{p.workload} on {p.hardware}")
    if not p.feasible:
        print(f"  INFEASIBLE: {p.reason}")
        return
    d = p.details
    if "strategy" in d:
        print(f"  strategy      {d['strategy']} on {d['devices']} devices"
              + (f", mapping order {d['mapping_order']}" if "mapping_order" in d else ""))
    print(f"  time          {fmt_time(p.time_s)}")
    print(f"  achieved      {fmt_rate(p.achieved_flops_per_s)}"
          + (" per device" if "strategy" in d else ""))
    if "model_flops_utilization" in d:
        print(f"  MFU           {d['model_flops_utilization'] * 100:.1f} %")
    print(f"  bottleneck    {p.bottleneck}")
    print(f"  memory/device {fmt_bytes(p.memory_per_device_bytes)}")
    print(f"  energy        {p.energy_J:.4g} J")
    moved = p.details.get("bytes_per_level", {})
    print("  breakdown:")
    for key, seconds in p.breakdown.items():
        level = key.removesuffix("_s")
        extra = f"  ({fmt_bytes(moved[level])})" if level in moved else ""
        print(f"    {level:<22} {fmt_time(seconds):>10}{extra}")


def _cmd_check(args: argparse.Namespace) -> int:
    from crossflow.config.loader import load_spec
    from crossflow.errors import InfeasibleDesignError
    from crossflow.predict import load_hardware

    errors = []
    for file in args.files:
        try:
            spec = load_spec(Path(file))
            note = ""
            if spec.kind == "architecture":  # resolve its technology names too
                try:
                    load_hardware(spec)
                except InfeasibleDesignError as exc:
                    note = f"; as given the design is infeasible: {exc}"
            print(f"{file}: ok ({spec.kind}){note}")
        except ConfigError as exc:
            if args.debug:
                raise
            errors.append(exc)
            print(f"crossflow: error: {exc}", file=sys.stderr)
    return EXIT_BAD_INPUT if errors else EXIT_OK


def _cmd_validate(args: argparse.Namespace) -> int:
    from crossflow.validation import run_validation

    ok = run_validation(args.what, csv_path=args.csv, summary=args.summary)
    return EXIT_OK if ok else EXIT_TOLERANCE


def _cmd_calibrate(args: argparse.Namespace) -> int:
    if args.what == "software":
        from crossflow.validation.refit import refit_all

        refit_all()
        return EXIT_OK
    from crossflow.calibrate import calibrate_cpu

    path = calibrate_cpu(Path(args.output), quick=args.quick)
    print(f"wrote {path}")
    return EXIT_OK


def _cmd_study(args: argparse.Namespace) -> int:
    # optuna / mlflow are imported by crossflow.search only when a study is opened
    from crossflow.search import study as studies
    from crossflow.search.locations import redact

    if args.study_command == "list":
        rows = studies.list_studies()
        if args.json:
            print(json.dumps(rows, indent=2))
            return EXIT_OK
        for row in rows:
            if "error" in row:
                print(f"{row['name']:<20} ERROR {row['error']}")
                continue
            done = "not run" if row["trials"] is None else f"{row['trials']} trials"
            print(f"{row['name']:<20} {row['sampler']:<7} {row['n_trials']:>6} trials  "
                  f"[{done}]  {row['description']}")
        return EXIT_OK
    setup = studies.load_study(args.name)
    if args.study_command in ("run", "worker") and args.heartbeat is not None \
            and not args.heartbeat >= 1:
        raise ConfigError("must be at least 1 second", file="command line",
                          key="--heartbeat", value=args.heartbeat)
    if args.study_command == "worker":
        result = studies.join_study(
            setup, storage=args.storage, launch=args.launch, worker_index=args.worker_index,
            tracking_uri=args.tracking_uri, track=not args.no_tracking,
            progress=not args.quiet, heartbeat_s=args.heartbeat)
        print(f"{setup.name}: this worker ran {result.trials_run} trials in "
              f"{result.elapsed_s:.1f} s; {result.total} in the study")
        return 130 if result.interrupted else EXIT_OK
    if args.study_command == "run":
        result = studies.run_study(
            setup, n_trials=args.trials, sampler=args.sampler,
            seed=args.seed if args.seed is not None else "study", storage=args.storage,
            tracking_uri=args.tracking_uri, track=not args.no_tracking,
            progress=not args.quiet, workers=args.workers, heartbeat_s=args.heartbeat)
        print(f"{setup.name}: {result.trials_run} trials run in {result.elapsed_s:.1f} s, "
              f"{result.total} in the study ({redact(args.storage or setup.storage)})")
        _print_best(setup, result.best)
        if result.interrupted:
            print(f"crossflow: interrupted; run 'crossflow study run {args.name}' again to "
                  "resume", file=sys.stderr)
            return 130
        return EXIT_OK
    study = studies.open_study(setup, args.storage, create=False)
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
        return EXIT_INFEASIBLE
    if args.export:
        written = studies.export_design(design, args.export)
        for part, path in written.items():
            print(f"wrote {path} ({part})")
        print(f"  {_exported_command(args.export)}")
    elif args.json:
        print(json.dumps(design, indent=2, default=str))
    else:
        _print_best(setup, design, full=True)
    return EXIT_OK


def _exported_command(path: str) -> str:
    """The predict command an exported design file holds."""
    import yaml

    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)["command"]


def _print_best(setup, design, full: bool = False) -> None:
    if design is None:
        print("  no feasible design yet")
        return
    values = ", ".join(f"{k} {v:.6g}" for k, v in design["objectives"].items())
    print(f"  best: trial {design['trial']}: {values}")
    d = design["design"]
    for key in ("strategy", "mapping_order"):
        if key in d:
            print(f"    {key:<20} {d[key]}")
    for key, value in d.items():
        if key.endswith("_fractions") and (full or len(value) <= 8):
            shown = ", ".join(f"{c} {f:.3f}" for c, f in value.items())
            print(f"    {key:<20} {shown}")
        elif key in ("technology", "parallelism_options"):
            print(f"    {key:<20} " + ", ".join(f"{k}={v}" for k, v in value.items()))


def _print_summary(s: dict) -> None:
    print(f"{s['study']}: {s['description']}")
    print(f"  storage     {s['storage']}")
    workers = f", {s['workers']} worker processes" if s.get("workers", 0) > 1 else ""
    print(f"  sampler     {s['sampler']} ({len(s['launches'])} launches{workers})")
    print(f"  objectives  {', '.join(s['objectives'])}")
    print(f"  trials      {s['finished']} finished of {s['n_trials']}: "
          + ", ".join(f"{k} {v}" for k, v in s["states"].items() if v))
    if s.get("memory_rejected"):
        print(f"  screened    {s['memory_rejected']} combinations over memory at the template's "
              "split, rejected without an evaluation (structured.memory_rejected)")
    if s.get("phases"):
        print("  phases      " + ", ".join(f"{k} {v}" for k, v in s["phases"].items()))
    if not s["best"]:
        print("  best        no feasible trial yet")
    for i, b in enumerate(s["best"]):
        values = ", ".join(f"{k} {v:.6g}" for k, v in b["values"].items())
        head = "best" if i == 0 else ""
        print(f"  {head:<11} trial {b['trial']}: {values}")
        if i == 0:
            for key, value in b["design"].items():
                if isinstance(value, dict):
                    value = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                      for k, v in value.items())
                print(f"    {key:<20} {value}")
    if s["pareto_size"]:
        print(f"  Pareto front: {s['pareto_size']} designs")


def _cmd_report(args: argparse.Namespace) -> int:
    import time

    from crossflow.search.reports import run_report

    t0 = time.perf_counter()
    path = run_report(args.name, args.out, quick=args.quick, tracking_uri=args.tracking_uri)
    print(f"{path} ({time.perf_counter() - t0:.1f} s; logged to MLflow experiment 'reports')")
    return EXIT_OK


def _cmd_compare(args: argparse.Namespace) -> int:
    from crossflow.search.compare import compare, main_table
    from crossflow.search.study import load_study

    setup = load_study(args.name)
    samplers = [s.strip() for s in args.samplers.split(",") if s.strip()]
    result = compare(setup, samplers=samplers, seeds=args.seeds, budget=args.budget,
                     workers=args.workers, storage=args.storage,
                     tracking_uri=args.tracking_uri, track=not args.no_tracking,
                     progress=not args.quiet)
    print(main_table(result))
    return EXIT_OK


def _cmd_ui(args: argparse.Namespace) -> int:
    from crossflow.search.tracking import launch_ui

    return launch_ui(args.tracking_uri, host="127.0.0.1", port=args.port)


_COMMANDS = {
    "predict": _cmd_predict,
    "check": _cmd_check,
    "validate": _cmd_validate,
    "calibrate": _cmd_calibrate,
    "study": _cmd_study,
    "ui": _cmd_ui,
    "compare": _cmd_compare,
    "report": _cmd_report,
}


if __name__ == "__main__":
    sys.exit(main())
