"""Shared test helpers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crossflow.cli import main

REPO = Path(__file__).resolve().parents[1]
SHARED_MEASUREMENTS = REPO.parent / "shared" / "reference" / "measurements"


@pytest.fixture
def cli(capsys):
    """Run the CLI in-process: returns (exit status, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.fixture(scope="session")
def a100():
    from crossflow.predict import load_hardware

    return load_hardware("a100-sxm4-80gb")


def assert_numbers_have_sources(path: Path) -> None:
    """The preset style: a comment beside every number, or beside the mapping holding it
    (``peak_TFLOPS:  # dense, whole chip [csv]`` covers the peaks listed under it)."""
    parents: list[tuple[int, bool]] = []  # (indent, has a comment) of the enclosing keys
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        code = line.split("#", 1)[0]
        if not code.strip():
            continue
        indent = len(code) - len(code.lstrip(" -"))
        while parents and parents[-1][0] >= indent:
            parents.pop()
        commented = "#" in line
        if re.search(r":\s*\[?[0-9]", code) and not commented and not any(c for _, c in parents):
            pytest.fail(f"{path.name}:{lineno} has a number without a source comment: {line!r}")
        parents.append((indent, commented))
