"""``crossflow`` command line (docs/architecture.md, "Command line").

(Over 600 lines, one job: the parsers with their help texts and examples, and a thin
``_cmd_*`` per command that calls the layers below; no model or search logic lives here.)

Exit status: 0 success, 1 a validation data set missed its tolerance, 2 bad input (one
paragraph on stderr, no traceback unless ``--debug``), 3 the design is infeasible.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from crossflow import __version__
from crossflow.errors import ConfigError, CrossflowError, one_paragraph

EXIT_OK, EXIT_TOLERANCE, EXIT_BAD_INPUT, EXIT_INFEASIBLE = 0, 1, 2, 3


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions and examples as written; an option's default after its help, unless the
    help says it already or there is none worth showing (None, a flag's False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) \
                or (not action.option_strings and action.nargs not in ("?", "*")):
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as ConfigError (exit 2, one paragraph)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{message} (see '{self.prog} --help')", file="command line")


#: Per command: what it does (its --help's description) and examples (the epilog).
_ABOUT: dict[str, tuple[str, tuple[str, ...]]] = {
    "crossflow": (
        "CrossFlow predicts how long a deep-learning kernel or training iteration takes on "
        "hardware that may not exist yet (technology -> chip -> system -> workload), and "
        "co-optimises hardware and parallelism in Optuna studies tracked in MLflow.",
        ("crossflow study run quickstart",
         "crossflow predict --hardware a100-sxm4-80gb --workload gemm-8192",
         "crossflow presets workload",
         "crossflow help study run")),
    "predict": (
        "Predict the time, memory per device, energy and bottleneck of a workload on a "
        "device: a single GEMM on one device, or one training iteration of a distributed "
        "workload on a system with a parallelism strategy.  Exit status 3 when the design "
        "cannot run (the reason names the numbers).",
        ("crossflow predict --hardware a100-sxm4-80gb --workload gemm-8192",
         "crossflow predict --hardware deepflow-case-study --workload gemm-8192 --json",
         "crossflow predict --hardware a100-sxm4-80gb --workload gpt3-175b --system dgx-a100 "
         "--parallelism gpt3-175b-t8-p8-d24",
         "crossflow predict --hardware deepflow-case-study --workload gemm-64k "
         "--system deepflow-case-study-512 --parallelism RC-16-32 --mapping-order best")),
    "check": (
        "Validate config files without predicting anything: each file's kind is read from "
        "its 'kind:' key (hardware, template, technology, workload, system, parallelism, "
        "search space, study), and a design written by 'crossflow study best NAME --export' "
        "is checked with every file it references; a study is resolved as 'study run' will "
        "resolve it.  Prints 'FILE: ok (KIND)' per file, else every error found in it, one "
        "paragraph each; exit status 2 when any is wrong.",
        ("crossflow check my-chip.yaml my-gemm.yaml",
         "crossflow check design.yaml")),
    "validate": (
        "Predict every row of the shipped measurement data sets (GEMMs, collectives, "
        "operators, training iterations measured on real hardware) and compare: MAPE and "
        "Spearman rank correlation per data set.  Exit status 1 when a data set misses its "
        "tolerance.",
        ("crossflow validate --summary",
         "crossflow validate gemm --csv gemm.csv")),
    "calibrate": (
        "'cpu' measures this machine (core clock, a numpy GEMM sweep, STREAM bandwidth) and "
        "writes a 'kind: microarch' preset with its GEMM and STREAM CSVs beside it; "
        "'software' re-fits the software-stack constants of the system presets from the "
        "shipped measurements and prints them.",
        ("crossflow calibrate cpu --quick --output my-cpu.yaml",
         "crossflow predict --hardware my-cpu.yaml --workload gemm-8192",
         "crossflow calibrate software")),
    "study": (
        "Run and inspect named co-optimisation studies: Optuna samples designs (budgets, "
        "technology, parallelism), CrossFlow predicts each, MLflow records every trial.  "
        "NAME is a shipped study ('crossflow presets study'), one in ./studies/, or a study "
        "YAML file.",
        ("crossflow study list",
         "crossflow study run quickstart",
         "crossflow study show quickstart",
         "crossflow study best quickstart --export design.yaml")),
    "study list": (
        "List the studies in ./studies/ and the shipped ones: sampler, number of trials, "
        "how many have run (in the default storage), description.",
        ("crossflow study list", "crossflow study list --json")),
    "study run": (
        "Run a study up to its number of trials.  Re-running resumes it from its storage; "
        "--trials raises the total.  Progress and every trial go to MLflow unless "
        "--no-tracking.",
        ("crossflow study run quickstart",
         "crossflow study run quickstart --trials 400 --sampler tpe --seed 1",
         "crossflow study run gpt3-175b-a100 --workers 2 --storage postgresql://u@db/studies")),
    "study worker": (
        "Join a running study from this machine: the study's storage must be a database "
        "(PostgreSQL) or a journal file both machines reach; the worker runs the launch's "
        "sampler, options and budget.",
        ("crossflow study worker gpt3-175b-a100 --storage postgresql://u@db/studies",)),
    "study show": (
        "Show a study: the best design so far, trials by state, sampler and launches, and "
        "the size of the Pareto front of a multi-objective study.",
        ("crossflow study show quickstart", "crossflow study show quickstart --json")),
    "study best": (
        "Print the best feasible design (or trial N's); of a study of several objectives, "
        "the point of the Pareto front with the lowest first objective, said so ('study "
        "show' lists the front).  --export writes it as files "
        "'crossflow predict' and 'crossflow check' accept: FILE holds the whole design and "
        "the predict command, the inline parts go beside it (FILE's stem.hardware.yaml, ...).",
        ("crossflow study best quickstart",
         "crossflow study best quickstart --export design.yaml && crossflow check design.yaml")),
    "report": (
        "Regenerate one of the paper's case-study reports (report.md and its plots) and log "
        "it to the MLflow experiment 'reports'.",
        ("crossflow report fig9-technology --quick",)),
    "compare": (
        "Compare samplers on a study at equal budgets: each sampler runs once per seed with "
        "the same number of model evaluations; prints the best value each reached.",
        ("crossflow compare quickstart --samplers structured,tpe,random --seeds 2 --budget 100",)),
    "ui": (
        "Start the MLflow UI on 127.0.0.1 to browse the tracked studies, trials and reports.",
        ("crossflow ui", "crossflow ui --port 5001")),
    "dashboard": (
        "Serve optuna-dashboard on 127.0.0.1 for the studies' Optuna storages, read-only: "
        "without NAME every study run here (each journal in mlruns/optuna/ and the storages "
        "study files name), with NAME that study.  Each trial shows its decoded design "
        "(design.area_fractions.core = 43.7 %, strategy, technologies) and whether it is "
        "feasible (Optuna constraints).",
        ("crossflow dashboard", "crossflow dashboard quickstart --port 8081",
         "crossflow dashboard --storage postgresql://USER@HOST/DB")),
    "presets": (
        "List the shipped presets by kind, each with its one-line description; with KIND, "
        "that kind only.  A preset's name is what --hardware, --workload, --system, "
        "--parallelism and the study commands take.",
        ("crossflow presets", "crossflow presets hardware", "crossflow presets --json")),
    "help": (
        "Show the help of crossflow, of a command or of a sub-command.",
        ("crossflow help", "crossflow help predict", "crossflow help study run")),
}


def _about(command: str) -> dict[str, str]:
    """``description`` and ``epilog`` (examples) keyword arguments of ``command``'s parser."""
    description, examples = _ABOUT[command]
    width = min(90, shutil.get_terminal_size().columns - 2)  # as argparse wraps options
    description = textwrap.fill(description, width=width)
    epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples)
    if command == "crossflow":
        epilog += ("\n\nexit status: 0 success, 1 a validation data set missed its tolerance, "
                   "2 bad input\n(one paragraph on stderr; --debug for a traceback), 3 the "
                   "design is infeasible,\n130 interrupted (Ctrl-C, SIGTERM or SIGHUP).\n\n'crossflow help COMMAND' or 'crossflow COMMAND "
                   "--help' shows a command's options.")
    return {"description": description, "epilog": epilog}


def _parser() -> argparse.ArgumentParser:
    from crossflow.config.loader import preset_names
    from crossflow.reports import REPORTS
    from crossflow.search.locations import default_storage
    from crossflow.search.samplers import ALIASES, COMPARED
    from crossflow.search.samplers import NAMES as SAMPLERS

    p = _Parser(prog="crossflow", **_about("crossflow"))
    p.add_argument("--version", action="version", version=f"crossflow {__version__}")
    p.add_argument("--debug", action="store_true",
                   help="show a traceback instead of the one-paragraph error")
    sub = p.add_subparsers(dest="command", parser_class=_Parser, title="commands",
                           metavar="COMMAND")

    pr = sub.add_parser("predict", help="predict a kernel or training iteration",
                        **_about("predict"))
    pr.add_argument("--hardware",
                    help="hardware preset name, preset YAML, or architecture template YAML "
                    "(default: the device --system names; given with --system, it overrides "
                    "that device and the output says so)")
    pr.add_argument("--workload", required=True,
                    help="workload preset name ('crossflow presets workload') or YAML file")
    pr.add_argument("--system", help="system preset or YAML (distributed workloads); its "
                    "device is used unless --hardware is given")
    pr.add_argument("--parallelism", metavar="PRESET|YAML|STRATEGY",
                    help="distributed workloads: a parallelism preset ("
                    + ", ".join(preset_names("parallelism")) + "), a YAML file, or a strategy "
                    "string such as RC-4-2-d32-p2 or t8-d24-p8-v3-sp")
    pr.add_argument("--mapping-order", metavar="ORDER|best",
                    help="device-mapping order, a permutation of kp1-kp2-dp-lp (the first on "
                    "adjacent devices), or 'best' to try all 24 (default: kp1-kp2-dp-lp)")
    pr.add_argument("--json", action="store_true", help="print one JSON object")

    ck = sub.add_parser("check", help="validate config files and exported designs",
                        **_about("check"))
    ck.add_argument("files", nargs="+", metavar="FILE",
                    help="a config YAML file of any kind, or an exported design")

    va = sub.add_parser("validate", help="predicted vs measured on real hardware",
                        **_about("validate"))
    va.add_argument("what", nargs="?", default="all",
                    choices=["gemm", "collectives", "ops", "training", "all"],
                    help="which data sets")
    va.add_argument("--csv", metavar="FILE", help="also write every row to this CSV file")
    va.add_argument("--summary", action="store_true",
                    help="one line per data set (MAPE, Spearman) instead of every row")

    ca = sub.add_parser("calibrate", help="measure this machine and write a hardware preset; "
                        "or re-fit the software-stack constants of the system presets",
                        **_about("calibrate"))
    ca.add_argument("what", choices=["cpu", "software"],
                    help="cpu: measure this machine; software: re-fit the system presets")
    ca.add_argument("--output", default="cpu-this-machine.yaml", metavar="FILE|DIR",
                    help="cpu: the preset YAML to write, or an existing folder (the preset is "
                    "then named after the machine); the CSVs are written beside it")
    ca.add_argument("--quick", action="store_true",
                    help="cpu: fewer shapes and repetitions (seconds instead of minutes)")
    ca.add_argument("--force", action="store_true",
                    help="cpu: replace files that exist (the preset and the CSVs beside it)")

    st = sub.add_parser("study", help="run and inspect co-optimisation studies (Optuna)",
                        **_about("study"))
    ss = st.add_subparsers(dest="study_command", parser_class=_Parser, title="commands",
                           metavar="COMMAND")
    sl = ss.add_parser("list", help="the studies in ./studies/ and the shipped ones",
                       **_about("study list"))
    sl.add_argument("--json", action="store_true", help="print one JSON object")
    sr = ss.add_parser("run", help="run a study (re-running resumes it)", **_about("study run"))
    sr.add_argument("name", help="study name or YAML file")
    sr.add_argument("--trials", type=int, metavar="N",
                    help="the study's total number of trials (default: the study's n_trials)")
    sr.add_argument("--sampler", choices=(*SAMPLERS, *ALIASES), metavar="SAMPLER",
                    help="one of " + ", ".join(SAMPLERS) + " (structured: the structure-aware "
                    "driver; gd: the paper's gradient descent; nsga2 for several objectives) "
                    "(default: the study's sampler)")
    sr.add_argument("--seed", type=int, help="sampler seed (default: the study's)")
    sr.add_argument("--storage", metavar="URL|FILE",
                    help="Optuna storage URL or journal file (default: the study's, else "
                    + default_storage("NAME") + ")")
    sr.add_argument("--tracking-uri", metavar="URI",
                    help="MLflow tracking URI (default: sqlite:///mlruns/mlflow.db)")
    sr.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    sr.add_argument("--quiet", action="store_true", help="no progress bar")
    sr.add_argument("--workers", type=int, default=1, metavar="K",
                    help="run K worker processes on this launch (see also "
                    "'study worker' to add workers on other machines)")
    sr.add_argument("--heartbeat", type=float, metavar="SECONDS",
                    help="heartbeat of running trials on an RDB storage (default 10; a dead "
                    "worker's trial is retried after about 3 heartbeats)")
    sw = ss.add_parser("worker", help="join a running study from this machine (RDB storage)",
                       **_about("study worker"))
    sw.add_argument("name", help="study name or YAML file")
    sw.add_argument("--storage", metavar="URL|FILE",
                    help="the study's Optuna storage URL (postgresql://...) or journal file "
                    "(default: the environment variable CROSSFLOW_STORAGE, which keeps a "
                    "password off the command line)")
    sw.add_argument("--launch", help="the launch to join (default: the study's latest)")
    sw.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
    sw.add_argument("--tracking-uri", metavar="URI", help="MLflow tracking URI (default: the "
                    "launch's server or database, else mlruns/mlflow.db here)")
    sw.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    sw.add_argument("--quiet", action="store_true", help="no progress bar")
    sw.add_argument("--heartbeat", type=float, metavar="SECONDS",
                    help="heartbeat of running trials on an RDB storage (default 10)")
    for name, text in (("show", "best so far, trials by state, sampler"),
                       ("best", "the best design; --export writes it for crossflow predict")):
        sp = ss.add_parser(name, help=text, **_about(f"study {name}"))
        sp.add_argument("name", help="study name or YAML file")
        sp.add_argument("--storage", metavar="URL|FILE",
                        help="Optuna storage URL or journal file (default: the study's)")
        sp.add_argument("--json", action="store_true", help="print one JSON object")
        if name == "best":
            sp.add_argument("--export", metavar="FILE", help="write the design (YAML) here, "
                            "and its inline parts beside it")
            sp.add_argument("--trial", type=int, metavar="N",
                            help="trial N's design instead of the best")
            sp.add_argument("--force", action="store_true",
                            help="with --export: replace files that exist (the named one "
                            "and the side files beside it)")

    rp = sub.add_parser("report", help="regenerate one of the paper's case-study reports",
                        **_about("report"))
    rp.add_argument("name", help="report name: " + ", ".join(REPORTS))
    rp.add_argument("--quick", action="store_true", help="a few points only (seconds)")
    rp.add_argument("--out", metavar="DIR", help="output folder (default mlruns/reports/NAME)")
    rp.add_argument("--tracking-uri", help="MLflow tracking URI (default: mlruns/mlflow.db)")

    cp = sub.add_parser("compare", help="compare samplers on a study at equal budgets",
                        **_about("compare"))
    cp.add_argument("name", help="study name or YAML file")
    cp.add_argument("--samplers", default=",".join(COMPARED),
                    help="comma-separated samplers, of " + ", ".join(COMPARED))
    cp.add_argument("--seeds", type=int, default=3, metavar="N",
                    help="seeds per sampler (0 .. N-1)")
    cp.add_argument("--budget", type=int, default=200, metavar="N",
                    help="model evaluations per run")
    cp.add_argument("--workers", type=int, default=1, metavar="K",
                    help="processes over the runs")
    cp.add_argument("--storage", help="Optuna storage URL (default: a journal file per run "
                    "under mlruns/optuna/compare/)")
    cp.add_argument("--root", metavar="DIR", default="mlruns",
                    help="folder for the report, best-known cache, journals and MLflow "
                    "store (DIR/compare/NAME/<time>/ and latest/, DIR/optuna/compare/, DIR/mlflow.db)")
    cp.add_argument("--tracking-uri", help="MLflow tracking URI (default: mlruns/mlflow.db)")
    cp.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    cp.add_argument("--quiet", action="store_true", help="no progress lines")

    ui = sub.add_parser("ui", help="MLflow UI on 127.0.0.1 for mlruns/", **_about("ui"))
    ui.add_argument("--tracking-uri", help="MLflow tracking URI (default: mlruns/mlflow.db)")
    ui.add_argument("--port", type=int, default=5000, help="port on 127.0.0.1 to serve on")

    db = sub.add_parser("dashboard", help="optuna-dashboard on 127.0.0.1 for the studies",
                        **_about("dashboard"))
    db.add_argument("name", nargs="?", metavar="NAME",
                    help="a study's name or YAML file (default: every study run here)")
    db.add_argument("--storage", metavar="URL|FILE",
                    help="Optuna storage URL or journal file (default: the study's, or "
                    "every journal in mlruns/optuna/ and the storages study files name)")
    db.add_argument("--port", type=int, default=8080, help="port on 127.0.0.1 to serve on")

    ps = sub.add_parser("presets", help="list the shipped presets by kind",
                        **_about("presets"))
    ps.add_argument("kind", nargs="?", metavar="KIND",
                    help="only this kind: " + ", ".join(_preset_kinds()))
    ps.add_argument("--json", action="store_true", help="print one JSON object")

    hp = sub.add_parser("help", help="show the help of a command", **_about("help"))
    hp.add_argument("topic", nargs="*", metavar="COMMAND",
                    help="a command, and a sub-command of 'study'")
    return p


def _preset_kinds() -> list[str]:
    from crossflow.catalogue import KINDS

    return list(KINDS)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        parser = _parser()
        args = parser.parse_args(argv)
        if args.command is None:  # bare 'crossflow': the help, as git does
            parser.print_help()
            return EXIT_OK
        if args.command == "help":
            return _cmd_help(parser, args.topic)
        if args.command == "study" and args.study_command is None:
            return _cmd_help(parser, ["study"])
        _check_cwd()
        _check_options(parser, args)
        return _COMMANDS[args.command](args)
    except CrossflowError as exc:
        if debug:
            raise
        text = str(exc)
        if isinstance(exc, ConfigError):
            if not exc.file:
                exc = exc.with_file("command line")  # a value given as an argument
            text = str(exc) + _more_errors(exc)
        print(f"crossflow: error: {one_paragraph(text)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("crossflow: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (crossflow ... | head)
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _options(parser: argparse.ArgumentParser) -> dict[str, str]:
    """dest -> its option string (``--tracking-uri``), over every (sub-)command."""
    out: dict[str, str] = {}
    for action in parser._actions:
        if action.option_strings:
            out.setdefault(action.dest, max(action.option_strings, key=len))
    for sub in _subcommands(parser).values():
        for dest, option in _options(sub).items():
            out.setdefault(dest, option)
    return out


def _check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every option's text names something (a file, a folder, a URI, a preset): an empty
    one is refused, not read as the current folder or the default; and ``--no-tracking``
    with ``--tracking-uri`` is a contradiction, not a silent choice."""
    options = _options(parser)
    for dest, value in vars(args).items():
        if dest in options and isinstance(value, str) and not value.strip():
            label = options[dest].lstrip("-").replace("-", " ")
            raise ConfigError(f"an empty {label}: an empty name is no file, folder, preset or "
                              f"URI", file="command line", key=options[dest], value=value,
                              allowed="leave the option out for its default")
    if getattr(args, "no_tracking", False) and getattr(args, "tracking_uri", None) is not None:
        raise ConfigError("--no-tracking and --tracking-uri contradict each other: nothing is "
                          "logged with --no-tracking", file="command line",
                          key="--tracking-uri", value=args.tracking_uri,
                          allowed="one of the two")


def _check_cwd() -> None:
    """Commands resolve relative paths (``mlruns/``, ``studies/``, the files given) against
    the working directory: one that was deleted under the shell is said up front, not met as
    a FileNotFoundError deep inside."""
    try:
        os.getcwd()
    except OSError as exc:
        raise ConfigError(f"the current directory cannot be read ({exc.strerror or exc}; was "
                          f"it deleted?): relative paths such as mlruns/ and studies/ are "
                          f"resolved against it", file="working directory",
                          allowed="run crossflow from an existing directory (cd there first)"
                          ) from None


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((a.choices for a in parser._actions
                 if isinstance(a, argparse._SubParsersAction)), {})


def _cmd_help(parser: argparse.ArgumentParser, topic: Sequence[str]) -> int:
    """``crossflow help [COMMAND [SUB-COMMAND]]``: that parser's --help."""
    for i, word in enumerate(topic):
        commands = _subcommands(parser)
        if word not in commands and any(word in (a.choices or ()) for a in parser._actions
                                        if not a.option_strings):
            break  # a value of the command's own argument (`calibrate cpu`): its help says it
        if word not in commands:
            what = " ".join(["crossflow", *topic[:i]])
            values = [c for a in parser._actions if not a.option_strings
                      for c in (a.choices or ()) if c != "help"]
            raise ConfigError(f"'{what}' has no command {word!r}", file="command line",
                              allowed=", ".join(values) or "none (it has no sub-commands)")
        parser = commands[word]
    parser.print_help()
    return EXIT_OK


def _cmd_presets(args: argparse.Namespace) -> int:
    from crossflow.catalogue import catalogue

    groups = catalogue(args.kind)
    if args.json:
        print(json.dumps(groups, indent=2))
        return EXIT_OK
    columns = shutil.get_terminal_size((100, 24)).columns
    for i, (kind, entries) in enumerate(groups.items()):
        if i:
            print()
        print(f"{kind} ({len(entries)}):")
        width = max((len(e["name"]) for e in entries), default=0)
        room = max(40, columns - width - 5)  # one line each; --json has the whole text
        for e in entries:
            text = e["description"] + ("" if e["origin"] == "shipped" else f" [{e['origin']}]")
            if len(text) > room:
                text = text[: room - 1].rstrip() + "…"
            print(f"  {e['name']:<{width}}  {text}".rstrip())
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
    from crossflow.units import fmt_bytes, fmt_energy, fmt_rate, fmt_time

    print(f"{p.workload} on {p.hardware}")
    for note in p.notes:
        print(f"  note: {note}")
    if not p.feasible:
        print(f"  INFEASIBLE: {p.reason}")
        return
    d = p.details
    if "strategy" in d:
        print(f"  strategy      {d['strategy']} on {d['devices']} devices"
              + (f", mapping order {d['mapping_order']}" if "mapping_order" in d else ""))
    print(f"  time          {fmt_time(p.time_s)}")
    if "activation_recompute" in d:
        print(f"  recompute     {d['activation_recompute']}")
    # the achieved rate counts the FLOPs the device runs, recomputed ones included; MFU
    # counts the model's FLOPs only (Megatron's convention), so the two differ by the
    # recomputation
    recomputes = d.get("activation_recompute", "none") != "none"
    print(f"  achieved      {fmt_rate(p.achieved_flops_per_s)}"
          + (" per device" if "strategy" in d else "")
          + (" (hardware FLOPs: recomputation included)" if recomputes else ""))
    if "model_flops_utilization" in d:
        print(f"  MFU           {d['model_flops_utilization'] * 100:.1f} %"
              + (" (model FLOPs only)" if recomputes else ""))
    print(f"  bottleneck    {p.bottleneck}")
    print(f"  memory/device {fmt_bytes(p.memory_per_device_bytes)}")
    print(f"  energy        {fmt_energy(p.energy_J)}")
    moved = p.details.get("bytes_per_level", {})
    print("  breakdown (roofline: compute and memory times overlap; total = slowest + launch):"
          if "breakdown_overlap" in p.details else "  breakdown:")
    for key, seconds in p.breakdown.items():
        level = key.removesuffix("_s")
        extra = f"  ({fmt_bytes(moved[level])})" if level in moved else ""
        print(f"    {level:<22} {fmt_time(seconds):>10}{extra}")
    hidden = {k: v for k, v in d.get("hidden_comm_s", {}).items() if v > 0}
    if hidden:  # communication overlapped with computation: not in the time above
        print("  communication hidden behind computation (not in the time; the breakdown "
              "has what stays exposed):")
        for key, seconds in hidden.items():
            print(f"    {key.removesuffix('_s'):<22} {fmt_time(seconds):>10}")


def _more_errors(exc: ConfigError) -> str:
    """The end of the paragraph of an error found with others: how many, and the command
    that lists them all (check reads files; a preset is checked by its name's file)."""
    if not exc.more:
        return ""
    n = len(exc.more)
    where = (f"crossflow check {exc.file}" if exc.file and exc.file != "command line"
             and Path(exc.file).is_file() else "crossflow check on the file")
    return f" ({n} more error{'s' if n > 1 else ''} in this input: {where} lists them all)"


def _cmd_check(args: argparse.Namespace) -> int:
    from crossflow.checks import check_file

    errors = []
    for file in args.files:
        try:
            print(f"{file}: ok ({check_file(file)})")
        except ConfigError as exc:
            if args.debug:
                raise
            errors.append(exc)
            for one in exc.every():  # every error found in the file, one paragraph each
                print(f"crossflow: error: {one_paragraph(str(one))}", file=sys.stderr)
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

    path = calibrate_cpu(Path(args.output), quick=args.quick, option="--output",
                         overwrite=args.force, force="--force")
    print(f"wrote {path}")
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
            print(f"{setup.name}: {studies.complete_line(args.name, result)}")
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
        print("\n".join(studies.next_steps(args.name, result, tracking_uri=args.tracking_uri)))
        return 1 if result.untracked else EXIT_OK  # trials without an MLflow run (stderr)
    raise AssertionError(args.study_command)


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


def _cmd_report(args: argparse.Namespace) -> int:
    import time

    from crossflow.reports import run_report

    t0 = time.perf_counter()
    path = run_report(args.name, args.out, quick=args.quick, tracking_uri=args.tracking_uri)
    print(f"{path} ({time.perf_counter() - t0:.1f} s; logged to MLflow experiment 'reports')")
    return EXIT_OK


def _cmd_compare(args: argparse.Namespace) -> int:
    from crossflow.search.compare import compare, main_table
    from crossflow.search.study import load_study

    setup = load_study(args.name)
    if args.storage is not None:  # before the best-known search and any run
        from crossflow.search.storage import check_storage

        check_storage(args.storage, key="--storage")
    for option, value in (("--seeds", args.seeds), ("--budget", args.budget),
                          ("--workers", args.workers)):
        if value < 1:
            raise ConfigError("must be >= 1", file="command line", key=option, value=value)
    samplers = [s.strip() for s in args.samplers.split(",") if s.strip()]
    try:
        result = compare(setup, samplers=samplers, seeds=args.seeds, budget=args.budget,
                         workers=args.workers, storage=args.storage,
                         tracking_uri=args.tracking_uri, track=not args.no_tracking,
                         root=args.root, progress=not args.quiet)
    except ConfigError as exc:  # compare's arguments are this command's options
        if exc.key in ("samplers", "budget") and not exc.file:
            raise ConfigError(exc.problem, file="command line", key=f"--{exc.key}",
                              value=exc.value, allowed=exc.allowed) from None
        raise
    print(main_table(result))
    return EXIT_OK


def _cmd_ui(args: argparse.Namespace) -> int:
    from crossflow.search.tracking import launch_ui

    return launch_ui(args.tracking_uri, host="127.0.0.1", port=args.port)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    # optuna and optuna_dashboard are imported when the dashboard starts, not before
    from crossflow.search.tracking.dashboard import serve_dashboard

    return serve_dashboard(args.name, args.storage, host="127.0.0.1", port=args.port)


_COMMANDS = {
    "predict": _cmd_predict,
    "check": _cmd_check,
    "validate": _cmd_validate,
    "calibrate": _cmd_calibrate,
    "study": _cmd_study,
    "ui": _cmd_ui,
    "dashboard": _cmd_dashboard,
    "compare": _cmd_compare,
    "report": _cmd_report,
    "presets": _cmd_presets,
}


if __name__ == "__main__":
    sys.exit(main())
