"""Property-based fuzzing of every config kind through ``crossflow check``.

Each example takes a shipped preset of one kind and breaks it the way a user (or a
careless script) would — a value replaced by a non-finite, denormal, negative, huge,
wrongly typed or deeply nested one, a key removed, an unknown key added — or writes YAML
that is valid but odd.  Whatever the document, ``crossflow check`` must answer with exit
status 0 (valid), 2 (a one-paragraph error) or 3 (infeasible design), never a traceback,
and within a time bound.
"""

from __future__ import annotations

import math
import time
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crossflow import cli

PRESETS = Path(str(resources.files("crossflow") / "presets"))
FAMILIES = ("hardware", "templates", "tech", "systems", "workloads", "parallelism",
            "search_spaces", "studies")
#: Seconds one ``check`` may take (the slowest shipped study resolves in about 2 s).
BOUND_S = 20.0

ODD_VALUES = [math.inf, -math.inf, math.nan, 1e-320, -1, 0, -0.0, 1e308, 10**30, "",
              "abc", "1 GHz", [], {}, None, True, [1, [2, [3]]], {"a": {"b": {"c": 1}}},
              "x" * 5000, 0.5, 2, 1.5e-9, "N7", "../../etc/passwd", "/dev/zero"]


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path in a YAML document (mappings and lists)."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(doc: Any, path: tuple, how: str, value: Any) -> Any:
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    last = path[-1]
    if how == "replace":
        parent[last] = value
    elif how == "delete":
        if isinstance(parent, dict):
            del parent[last]
        else:
            parent.pop(last)
    elif how == "add" and isinstance(parent, dict):
        parent[f"unknown_{last}"] = value
    return doc


def _files(family: str) -> list[Path]:
    return sorted((PRESETS / family).glob("*.yaml"))


def _check(tmp_path: Path, text: str) -> int:
    path = tmp_path / "doc.yaml"
    path.write_text(text)
    t0 = time.perf_counter()
    code = cli.main(["check", str(path)])  # any exception fails the test
    assert time.perf_counter() - t0 < BOUND_S
    return code


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_a_broken_preset_gives_a_clear_answer(family, data, tmp_path, capsys):
    source = data.draw(st.sampled_from(_files(family)), label="preset")
    doc = yaml.safe_load(source.read_text())
    paths = _paths(doc)
    path = data.draw(st.sampled_from(paths), label="path")
    how = data.draw(st.sampled_from(["replace", "replace", "delete", "add"]), label="how")
    value = data.draw(st.sampled_from(ODD_VALUES), label="value")
    doc = _mutate(doc, path, how, value)
    code = _check(tmp_path, yaml.safe_dump(doc, sort_keys=False))
    assert code in (0, 2, 3)
    if how == "replace" and isinstance(value, float) and (
            not math.isfinite(value) or 0 < abs(value) < 1e-300):
        assert code == 2, f"{path} = {value!r} accepted"  # no physical quantity is that
    err = capsys.readouterr().err
    if code == 2:
        assert err.startswith("crossflow: error: ") and "Traceback" not in err
        # one paragraph per error found (a list of odd items has one per item)
        assert all(line.startswith("crossflow: error: ")
                   for line in err.strip().splitlines()), err


ODD_YAML = [
    "? [a, b]\n: 1\n",                                # a complex key
    "? {kind: hardware}\n: x\n",                      # a mapping as a key
    "kind: hardware\n" + "x: " + "[" * 5000 + "]" * 5000 + "\n",  # deep nesting
    "[" * 100_000 + "]" * 100_000,
    "a: &a [*a]\n",                                   # a recursive alias
    "kind: !!python/object/apply:os.system ['true']\n",
    "kind: hardware\nkind: workload\n",               # a duplicate key
    "\x00\x01\x02",
    "kind: [hardware]\n",
    "- 1\n- 2\n",
    "",
    "kind: hardware\nname: x\ncompute: {frequency_GHz: .inf}\n",
    "kind: workload\n" + "".join(f"k{i}: {i}\n" for i in range(20000)),
]


@pytest.mark.parametrize("text", ODD_YAML, ids=range(len(ODD_YAML)))
def test_odd_yaml_gives_a_clear_answer(text, tmp_path, capsys):
    assert _check(tmp_path, text) == 2
    err = capsys.readouterr().err
    assert err.startswith("crossflow: error: ") and "Traceback" not in err


def test_check_goes_on_after_a_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: nonsense\n")
    good = PRESETS / "hardware" / "a100-sxm4-80gb.yaml"
    assert cli.main(["check", str(bad), str(good)]) == 2
    out = capsys.readouterr()
    assert "bad.yaml" in out.err and "a100-sxm4-80gb.yaml: ok" in out.out
