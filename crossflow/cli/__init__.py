"""``crossflow`` command line (docs/architecture.md, "Command line").

One module per job, each under 600 lines:

* this package: :func:`main` — parse, check the options, dispatch, and turn a
  :class:`~crossflow.errors.CrossflowError` into one paragraph on stderr and its exit status;
* :mod:`~crossflow.cli.parser` — the parsers, every command's help text and examples;
* :mod:`~crossflow.cli.commands` — a thin ``_cmd_*`` per command (``predict``, ``check``,
  ``validate``, ``calibrate``, ``presets``, ``report``, ``compare``, ``ui``, ``dashboard``,
  ``help``) that calls the layers below;
* :mod:`~crossflow.cli.study` — the ``study`` commands and the lines they print;
* :mod:`~crossflow.cli.status` — the exit statuses.

No model or search logic lives here.  Exit status: 0 success, 1 a validation data set missed
its tolerance, 2 bad input (one paragraph on stderr, no traceback unless ``--debug``), 3 the
design is infeasible, 130 interrupted.  Every name the single ``cli.py`` module had is
importable from here (``from crossflow.cli import main, _parser``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from crossflow.cli.commands import (
    _cmd_calibrate,
    _cmd_check,
    _cmd_compare,
    _cmd_dashboard,
    _cmd_help,
    _cmd_predict,
    _cmd_presets,
    _cmd_report,
    _cmd_ui,
    _cmd_validate,
    _print_prediction,
)
from crossflow.cli.parser import (
    _ABOUT,
    _about,
    _Formatter,
    _Parser,
    _parser,
    _preset_kinds,
    _subcommands,
)
from crossflow.cli.status import EXIT_BAD_INPUT, EXIT_INFEASIBLE, EXIT_OK, EXIT_TOLERANCE
from crossflow.cli.study import (
    _cmd_study,
    _exported_command,
    _launch,
    _pareto_line,
    _print_best,
    _print_summary,
)
from crossflow.errors import ConfigError, CrossflowError, one_paragraph

__all__ = [
    "EXIT_BAD_INPUT", "EXIT_INFEASIBLE", "EXIT_OK", "EXIT_TOLERANCE", "main",
    # the private names the single cli.py module had (tests and the fuzzer use _parser and
    # _subcommands), still importable from here
    "_ABOUT", "_Formatter", "_Parser", "_about", "_check_cwd", "_check_options",
    "_cmd_calibrate", "_cmd_check", "_cmd_compare", "_cmd_dashboard", "_cmd_help",
    "_cmd_predict", "_cmd_presets", "_cmd_report", "_cmd_study", "_cmd_ui", "_cmd_validate",
    "_exported_command", "_launch", "_more_errors", "_options", "_pareto_line", "_parser",
    "_preset_kinds", "_print_best", "_print_prediction", "_print_summary", "_subcommands",
]


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
        from crossflow.outputs import silence

        silence(sys.stdout)
        return EXIT_OK


def _more_errors(exc: ConfigError) -> str:
    """The end of the paragraph of an error found with others: how many, and the command
    that lists them all (check reads files; a preset is checked by its name's file)."""
    if not exc.more:
        return ""
    n = len(exc.more)
    where = (f"crossflow check {exc.file}" if exc.file and exc.file != "command line"
             and Path(exc.file).is_file() else "crossflow check on the file")
    return f" ({n} more error{'s' if n > 1 else ''} in this input: {where} lists them all)"


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
