"""Help that reads like git's: bare ``crossflow`` and ``crossflow help``, a description and
examples for every command, a help text (with its default) for every option."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from crossflow import cli as cli_module
from crossflow.search.samplers import NAMES as SAMPLERS


def _commands(parser, prefix=()):
    """(words, parser) of every command and sub-command."""
    for name, sub in cli_module._subcommands(parser).items():
        yield (*prefix, name), sub
        yield from _commands(sub, (*prefix, name))


PARSER = cli_module._parser()
COMMANDS = list(_commands(PARSER))


def test_bare_crossflow_prints_the_help_and_exits_0():
    run = subprocess.run([sys.executable, "-m", "crossflow"], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: crossflow")
    for name in ("predict", "check", "study", "presets", "help"):
        assert f"\n    {name}" in run.stdout
    assert "examples:" in run.stdout and "exit status:" in run.stdout


def test_help_command_shows_a_command_or_sub_command(cli):
    code, out, _ = cli("help")
    assert code == 0 and out.startswith("usage: crossflow [-h]")
    code, out, _ = cli("help", "study", "run")
    assert code == 0 and out.startswith("usage: crossflow study run")
    assert "--sampler" in out
    code, out, _ = cli("study")  # a command group alone shows its help
    assert code == 0 and out.startswith("usage: crossflow study") and "worker" in out


def test_help_on_a_value_of_a_commands_argument_shows_that_command(cli):
    """``crossflow help calibrate cpu``: ``cpu`` is a value of calibrate's argument, not a
    sub-command; the help of ``calibrate`` says what it does."""
    code, out, _ = cli("help", "calibrate", "cpu")
    assert code == 0 and out.startswith("usage: crossflow calibrate")


@pytest.mark.parametrize("topic,listed", [(["nope"], "predict, check"),
                                          (["study", "nope"], "list, run, worker"),
                                          (["calibrate", "nope"], "cpu, software")])
def test_help_on_an_unknown_command_is_exit_2(cli, topic, listed):
    code, out, err = cli("help", *topic)
    assert code == 2 and not out
    assert "has no command 'nope'" in err and listed in err


@pytest.mark.parametrize("words,parser", COMMANDS, ids=[" ".join(w) for w, _ in COMMANDS])
def test_every_command_has_a_description_examples_and_option_help(words, parser):
    assert parser.description and len(parser.description) > 40
    text = parser.format_help()
    assert "\nexamples:\n  crossflow " in text
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        assert action.help, f"crossflow {' '.join(words)} {action.dest} has no help"
        if action.default not in (None, False, argparse.SUPPRESS) and action.dest != "help":
            shown = parser._get_formatter()._get_help_string(action) % {"default": "X"}
            assert "default" in shown, f"crossflow {' '.join(words)} {action.dest}"


@pytest.mark.parametrize("words,parser", COMMANDS, ids=[" ".join(w) for w, _ in COMMANDS])
def test_every_example_parses(words, parser):
    examples = parser.epilog.split("examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert examples
    ran = set()
    for line in examples:
        for command in line.split("&&"):
            argv = shlex.split(command)
            assert argv[0] == "crossflow"
            args = PARSER.parse_args(argv[1:])  # a usage error raises ConfigError
            ran.add((args.command, getattr(args, "study_command", None)))
    if words[0] != "crossflow":
        assert any(c == words[0] and (len(words) == 1 or s == words[1]) for c, s in ran)


def test_defaults_and_undocumented_options_are_documented(cli):
    code, out, _ = cli("help", "study", "run")
    for name in SAMPLERS:
        assert name in out
    assert "(default: 1)" in out  # --workers
    code, out, _ = cli("help", "ui")
    assert "--port PORT" in out and "(default: 5000)" in out
    code, out, _ = cli("help", "predict")
    assert "strategy" in out and "lstm-rc-4-2-d32-p2" in out  # --parallelism takes more than YAML
    code, out, _ = cli("help", "calibrate")
    assert "(default: cpu-this-machine.yaml)" in out


def test_an_example_from_the_help_runs(cli):
    code, out, err = cli("predict", "--hardware", "deepflow-case-study", "--workload", "gemm-64k",
                         "--system", "deepflow-case-study-512", "--parallelism", "RC-16-32",
                         "--mapping-order", "best")
    assert code == 0, err
    assert "RC-16-32" in out and "512 devices" in out


README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_commands() -> list[str]:
    """The ``crossflow`` command lines of the README's bash blocks (comments cut)."""
    text = README.read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for command in line.split("#", 1)[0].split("&&"):
                if command.strip().startswith("crossflow "):
                    out.append(command.strip())
    return out


def test_the_readme_is_short_and_its_commands_parse():
    """A newcomer reads it in five minutes (issue 20 found 837 lines of lab notes): the
    rest lives in docs/, and every command it shows is one the CLI takes as written."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300
    commands = _readme_commands()
    assert len(commands) >= 10
    for command in commands:
        PARSER.parse_args(shlex.split(command)[1:])  # a usage error raises ConfigError
