"""Shared test helpers."""

from __future__ import annotations

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
