"""Predicted vs measured on real hardware (docs/architecture.md, "Layers").

Each data set is a measurement file shipped verbatim under
``crossflow/presets/measurements/`` (published measurements, each file's source in its header,
plus what this project measured itself, each with the script that measured it).  A data set has a
tolerance: its MAPE must stay at or under it and its rank correlation at or over its floor.
"""

from __future__ import annotations

import csv
import importlib
from collections.abc import Callable

from crossflow.validation.dataset import (
    DataSet,
    Row,
    measurements_dir,
    read_measurements,
    spearman,
)

__all__ = ["SUITES", "DataSet", "Row", "collect", "measurements_dir", "read_measurements",
           "run_validation", "spearman"]

# The data-set modules are imported when first used, not by this package: several are also
# scripts (``python -m crossflow.validation.vtrain`` and the like, docs/validation.md), and
# a package that imported them would make Python warn that the script's module was already
# in ``sys.modules`` before it ran (tests/test_validation.py runs each documented command).
#: name this package re-exports -> (submodule, its name there)
_LAZY: dict[str, tuple[str, str]] = {
    "attention_datasets": ("attention", "attention_datasets"),
    "block_datasets": ("blocks", "block_datasets"),
    "collective_datasets": ("collectives", "collective_datasets"),
    "gemm_datasets": ("gemm", "gemm_datasets"),
    "lstm_datasets": ("lstm", "lstm_datasets"),
    "megatron_bridge_blackwell": ("megatron_bridge", "blackwell_datasets"),
    "megatron_bridge_cp_dataset": ("megatron_bridge", "cp_dataset"),
    "megatron_bridge_dataset": ("megatron_bridge", "dataset"),
    "megatron_bridge_fsdp": ("megatron_bridge", "fsdp_dataset"),
    "megatron_bridge_hybrid": ("megatron_bridge", "hybrid_dataset"),
    "megatron_bridge_moe_all": ("megatron_bridge", "moe_all_dataset"),
    "megatron_bridge_moe_dataset": ("megatron_bridge", "moe_dataset"),
    "megatron_bridge_tokendrop": ("megatron_bridge", "tokendrop_dataset"),
    "megatron_lm_datasets": ("megatron_lm", "datasets"),
    "ops_datasets": ("ops", "ops_datasets"),
    "training_datasets": ("training", "training_datasets"),
    "vtrain_dataset": ("vtrain", "vtrain_dataset"),
}


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _lazy(name: str) -> Callable[[], list[DataSet]]:
    def datasets() -> list[DataSet]:
        return __getattr__(name)()

    datasets.__name__ = datasets.__qualname__ = name
    return datasets


def _training_sets() -> list[DataSet]:
    from crossflow.validation import megatron_bridge as mb
    from crossflow.validation import megatron_lm
    from crossflow.validation.blocks import block_datasets
    from crossflow.validation.lstm import lstm_datasets
    from crossflow.validation.training import training_datasets
    from crossflow.validation.vtrain import vtrain_dataset

    return [*training_datasets(), vtrain_dataset(), mb.dataset(), mb.cp_dataset(), mb.fsdp_dataset(),
            mb.moe_dataset(), mb.moe_all_dataset(), mb.tokendrop_dataset(), mb.hybrid_dataset(),
            *mb.blackwell_datasets(), *megatron_lm.datasets(), *lstm_datasets(),
            *block_datasets()]


def _ops_sets() -> list[DataSet]:
    return [*__getattr__("ops_datasets")(), *__getattr__("attention_datasets")()]


SUITES: dict[str, Callable[[], list[DataSet]]] = {
    "gemm": _lazy("gemm_datasets"),
    "collectives": _lazy("collective_datasets"),
    "ops": _ops_sets,
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
