"""Predicted vs measured on real hardware (docs/architecture.md, "Layers").

Each data set is a measurement file shipped verbatim under
``crossflow/presets/measurements/`` (published measurements, each file's source in its header,
plus what this project measured itself, each with the script that measured it).  A data set has a
tolerance: its MAPE must stay at or under it and its rank correlation at or over its floor.
"""

from __future__ import annotations

import csv
from collections.abc import Callable

from crossflow.validation.collectives import collective_datasets
from crossflow.validation.dataset import (
    DataSet,
    Row,
    measurements_dir,
    read_measurements,
    spearman,
)
from crossflow.validation.gemm import gemm_datasets
from crossflow.validation.megatron_bridge import cp_dataset as megatron_bridge_cp_dataset
from crossflow.validation.megatron_bridge import dataset as megatron_bridge_dataset
from crossflow.validation.megatron_bridge import moe_all_dataset as megatron_bridge_moe_all
from crossflow.validation.megatron_bridge import moe_dataset as megatron_bridge_moe_dataset
from crossflow.validation.ops import ops_datasets
from crossflow.validation.training import training_datasets
from crossflow.validation.vtrain import vtrain_dataset

__all__ = ["SUITES", "DataSet", "Row", "collect", "measurements_dir", "read_measurements",
           "run_validation", "spearman"]


def _training_sets() -> list[DataSet]:
    return [*training_datasets(), vtrain_dataset(), megatron_bridge_dataset(),
            megatron_bridge_cp_dataset(), megatron_bridge_moe_dataset(),
            megatron_bridge_moe_all()]


SUITES: dict[str, Callable[[], list[DataSet]]] = {
    "gemm": gemm_datasets,
    "collectives": collective_datasets,
    "ops": ops_datasets,
    "training": _training_sets,
}


def collect(what: str) -> list[DataSet]:
    names = list(SUITES) if what == "all" else [what]
    return [ds for name in names for ds in SUITES[name]()]


def run_validation(what: str = "all", csv_path: str | None = None,
                   summary: bool = False) -> bool:
    """Print every data set of ``what`` (each row, or with ``summary`` one line each) and
    return whether all met their tolerance."""
    sets = collect(what)
    for ds in sets:
        print(ds.summary() if summary else ds.render())
        if not summary:
            print()
    if csv_path:
        with open(csv_path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["dataset", "case", "quantity", "predicted", "measured", "error"])
            for ds in sets:
                for r in ds.rows:
                    w.writerow([ds.name, r.label, ds.quantity, r.predicted, r.measured, r.error])
    failed = [ds.name for ds in sets if not ds.passed]
    print(f"{len(sets) - len(failed)} of {len(sets)} data sets within tolerance"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return not failed
