"""The ``crossflow`` parsers: every command's options, its help text and examples
(:data:`_ABOUT`), and the argparse subclasses that make a usage error a one-paragraph
:class:`~crossflow.errors.ConfigError` (exit 2).  Building the parser imports no model or
search code beyond the preset and sampler names its choices list."""

from __future__ import annotations

import argparse
import shutil
import textwrap

from crossflow import __version__
from crossflow.errors import ConfigError


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
                    + ", ".join(preset_names("parallelism")) + "), a YAML file, a strategy "
                    "string such as RC-4-2-d32-p2, t8-d24-p8-v3-sp or t4-d4-sp-e8 (-c{cp} context, "
                    "-e{ep} expert, -et{etp} expert-tensor parallelism), or a YAML mapping of "
                    "a file's keys, e.g. '{strategy: t4-d4-sp-e8, "
                    "use_distributed_optimizer: true}'")
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


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((a.choices for a in parser._actions
                 if isinstance(a, argparse._SubParsersAction)), {})
