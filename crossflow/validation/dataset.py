"""Data sets of predicted vs measured values: rows, tolerances, rank correlation, and the
shipped measurement files they are read from (:mod:`crossflow.validation`).

Each data set is a measurement file shipped verbatim under
``crossflow/presets/measurements/`` (published measurements, each file's source in its header,
plus what this project measured itself, each with the script that measured it).  A data set has a
tolerance: its MAPE must stay at or under it and its rank correlation at or over its floor.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np


def measurements_dir() -> Path:
    return Path(str(resources.files("crossflow") / "presets" / "measurements"))


def read_measurements(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """Header comment lines (without '#') and the data rows of a measurement CSV."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    header = [ln.lstrip("#").strip() for ln in lines if ln.startswith("#")]
    body = [ln for ln in lines if ln.strip() and not ln.startswith("#")]
    return header, list(csv.DictReader(body))


def read_preset_measurements(path: Path) -> tuple[str, list[dict[str, str]]]:
    """The hardware preset a file of this project's own measurements names in its header
    (``# preset: NAME``), and its rows."""
    header, rows = read_measurements(path)
    for line in header:
        if line.lower().startswith("preset:"):
            return line.split(":", 1)[1].strip(), rows
    raise ValueError(f"{path} has no '# preset: NAME' header line naming its hardware preset")


@dataclass(frozen=True)
class Row:
    label: str
    predicted: float
    measured: float

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured


def spearman(a: Iterable[float], b: Iterable[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    x, y = _ranks(np.asarray(list(a), float)), _ranks(np.asarray(list(b), float))
    if x.size < 2 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def _ranks(v: np.ndarray) -> np.ndarray:
    order = np.argsort(v, kind="mergesort")
    ranks = np.empty(v.size)
    ranks[order] = np.arange(v.size, dtype=float)
    for value in np.unique(v):  # average the ranks of ties
        tie = v == value
        if tie.sum() > 1:
            ranks[tie] = ranks[tie].mean()
    return ranks


@dataclass(frozen=True)
class DataSet:
    """Rows of one measurement file against the model, with the tolerance they must meet."""

    name: str
    source: str
    quantity: str
    rows: tuple[Row, ...]
    max_mape: float
    min_spearman: float
    #: row label -> group name, for data sets whose tolerance holds per group too: the mean
    #: signed error of every group must stay within ``max_group_bias``
    group_of: tuple[tuple[str, str], ...] = ()
    max_group_bias: float | None = None

    @property
    def mape(self) -> float:
        return float(np.mean([abs(r.error) for r in self.rows]))

    @property
    def spearman(self) -> float:
        return spearman([r.predicted for r in self.rows], [r.measured for r in self.rows])

    @property
    def group_bias(self) -> dict[str, float]:
        """Mean signed error per group (empty without groups)."""
        groups: dict[str, list[float]] = {}
        names = dict(self.group_of)
        for r in self.rows:
            if r.label in names:
                groups.setdefault(names[r.label], []).append(r.error)
        return {g: float(np.mean(e)) for g, e in groups.items()}

    @property
    def passed(self) -> bool:
        rho = self.spearman
        biased = self.max_group_bias is not None and any(
            abs(b) > self.max_group_bias for b in self.group_bias.values())
        return (self.mape <= self.max_mape and (math.isnan(rho) or rho >= self.min_spearman)
                and not biased)

    def _groups_line(self) -> str:
        if not self.group_of:
            return ""
        bias = ", ".join(f"{g} {b * 100:+.1f}%" for g, b in self.group_bias.items())
        bound = (f" (tolerance ±{self.max_group_bias * 100:.0f}%)"
                 if self.max_group_bias is not None else "")
        return f"; mean signed error by group: {bias}{bound}"

    def _rank_text(self) -> str:
        """The rank correlation and its floor; "n/a" where it is undefined (every row the
        same prediction: runs of one setting)."""
        rho = self.spearman
        value = "n/a (one prediction)" if math.isnan(rho) else f"{rho:.3f}"
        return f"Spearman {value} (floor {self.min_spearman})"

    def summary(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{self.name}: MAPE {self.mape * 100:.1f}% (tolerance {self.max_mape * 100:.0f}%),"
                f" {self._rank_text()}, {len(self.rows)} rows{self._groups_line()} -> {verdict}")

    def render(self) -> str:
        width = max(len(r.label) for r in self.rows)
        lines = [
            f"== {self.name}",
            f"   source: {self.source}",
            f"   {'case':<{width}}  {'predicted':>12}  {'measured':>12}  {'error':>8}",
        ]
        for r in self.rows:
            lines.append(
                f"   {r.label:<{width}}  {r.predicted:>12.5g}  {r.measured:>12.5g}  "
                f"{r.error * 100:>+7.1f}%"
            )
        verdict = "PASS" if self.passed else "FAIL"
        lines.append(
            f"   {self.quantity}: MAPE {self.mape * 100:.1f}% (tolerance {self.max_mape * 100:.0f}%),"
            f" {self._rank_text()}, {len(self.rows)} rows{self._groups_line()} -> {verdict}"
        )
        return "\n".join(lines)
