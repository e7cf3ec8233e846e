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
                    choices=["gemm", "collectives", "training", "all"])
    va.add_argument("--csv", help="also write every row to this CSV file")

    ca = sub.add_parser("calibrate", help="measure this machine and write a hardware preset")
    ca.add_argument("what", choices=["cpu"])
    ca.add_argument("--output", default="cpu-this-machine.yaml", help="preset YAML to write")
    ca.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
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
        print(f"crossflow: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("crossflow: interrupted", file=sys.stderr)
        return 130


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

    ok = run_validation(args.what, csv_path=args.csv)
    return EXIT_OK if ok else EXIT_TOLERANCE


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from crossflow.calibrate import calibrate_cpu

    path = calibrate_cpu(Path(args.output), quick=args.quick)
    print(f"wrote {path}")
    return EXIT_OK


_COMMANDS = {
    "predict": _cmd_predict,
    "check": _cmd_check,
    "validate": _cmd_validate,
    "calibrate": _cmd_calibrate,
}


if __name__ == "__main__":
    sys.exit(main())
