"""Fused attention kernels timed on a GPU, against :func:`crossflow.kernels.ops.fused_attention`.

* ``gpu/torch_attention_*.csv``: torch's ``scaled_dot_product_attention`` timed by
  ``gpu/measure_torch_attention.py``, forward and backward, on the preset its header names.
  The cuDNN rows are checked (the backend Transformer Engine and recent PyTorch choose on
  Hopper); the FlashAttention-2 rows are recorded beside them.  Each row's kernels' device
  time (``kernel_s``, from torch's profiler) is what is checked and fitted: the kernel layer
  prices the device, and a software profile's host layer the dispatch.

``python -m crossflow.validation.attention [FILE ...]`` fits the preset's ``attention`` block
to the files (default: every one): per pass, the share of peak and the time per query row
that minimise the squared relative error over the rows at :data:`REFERENCE_HEAD_DIM` (a
linear least-squares problem: time = FLOPs / (peak · share) + rows · t), then the
head-dimension table from a file of several head dimensions (:func:`fit_head_dims`).  The
share is bounded by the device's GEMM efficiency: a kernel made of matrix products does not
sustain more of the peak than the device's best matmul.  Sequences of 2K-8K tokens alone
put too much of the rate's rise in the row term and carry a share too high to longer ones
(0.718 forward, 128K tokens priced 21 % too fast), so the fit takes 2K-128K together.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from crossflow.kernels.ops import attention_flops, fused_attention
from crossflow.predict import load_hardware
from crossflow.validation.dataset import DataSet, Row, measurements_dir, read_preset_measurements

#: Tolerances: the fit's own worst row is 13 % (six shapes per pass, two parameters).
ATTENTION_MAX_MAPE, ATTENTION_MIN_SPEARMAN = 0.12, 0.9
BACKEND = "cudnn"
PASSES = {"fwd": 2, "bwd": 5}  # products per pass (ops.fused_attention's ``gemms``)
#: The head dimension of the rows the preset's shares and row times are fitted to (all but
#: four of them): a head-dimension table is relative to it.
REFERENCE_HEAD_DIM = 128


def _rows(path: Path) -> tuple[str, list[dict[str, str]]]:
    preset, rows = read_preset_measurements(path)
    return preset, [r for r in rows if r["backend"] == BACKEND]


def _measured(r: dict[str, str]) -> float:
    """A row's device time: the kernels' own (``kernel_s``, profiled) where the file has it,
    else the event-timed call (``median_s``, which includes the host's dispatch)."""
    return float(r.get("kernel_s") or r["median_s"])


def _shape(r: dict[str, str]) -> tuple[int, int, int, int, int]:
    """(batch × heads, seq, head dim, products, causal) as fused_attention takes them."""
    return (int(r["batch"]) * int(r["heads"]), int(r["seq"]), int(r["head_dim"]),
            PASSES[r["pass"]], int(r["causal"]))


def attention_datasets() -> list[DataSet]:
    sets = []
    for path in sorted(measurements_dir().glob("gpu/torch_attention_*.csv")):
        preset, rows = _rows(path)
        arch = load_hardware(preset)
        out = [Row(f"{r['batch']}x{r['heads']}/{r['kv_heads']} heads s={r['seq']} "
                   f"d={r['head_dim']}{' causal' if r['causal'] == '1' else ''} {r['pass']}",
                   fused_attention(arch, *_shape(r), r["dtype"]).time_s, _measured(r))
               for r in rows]
        sets.append(DataSet(
            name=f"attention: torch SDPA ({BACKEND}) on GPU ({path.stem})",
            source=f"{path.relative_to(measurements_dir())} on preset {preset}",
            quantity="time_s", rows=tuple(out),
            max_mape=ATTENTION_MAX_MAPE, min_spearman=ATTENTION_MIN_SPEARMAN))
    return sets


def _files(preset: str | None = None) -> list[Path]:
    """Every attention measurement file (of ``preset``'s device, when given)."""
    paths = sorted(measurements_dir().glob("gpu/torch_attention_*.csv"))
    return [p for p in paths if preset is None or _rows(p)[0] == preset]


def fit(paths: Path | Sequence[Path] | None = None) -> dict[str, float]:
    """The preset's ``attention`` shares and row times, fitted to the rows at
    :data:`REFERENCE_HEAD_DIM` of ``paths`` (one file or several, all of one preset;
    default: every attention file, which today are all the H200's).  The other head
    dimensions are the head-dimension table's (:func:`fit_head_dims`)."""
    if paths is None:
        paths = _files()
    loaded = [_rows(p) for p in ([paths] if isinstance(paths, Path) else paths)]
    presets = {preset for preset, _ in loaded}
    if len(presets) != 1:
        raise ValueError(f"one device's files at a time, got presets {sorted(presets)}")
    arch = load_hardware(presets.pop())
    rows = [r for _, file_rows in loaded for r in file_rows
            if int(r["head_dim"]) == REFERENCE_HEAD_DIM]
    out: dict[str, float] = {}
    for pass_, name in (("fwd", "forward"), ("bwd", "backward")):
        mine = [r for r in rows if r["pass"] == pass_]
        heads, seq = np.array([_shape(r)[:2] for r in mine], float).T
        flops = np.array([attention_flops(*_shape(r)) for r in mine])
        peak = np.array([arch.peak_flops[r["dtype"]] for r in mine])
        measured = np.array([_measured(r) for r in mine])
        product, rows_ = flops / peak / measured, heads * seq / measured
        (inv_share, row_s), *_ = np.linalg.lstsq(np.stack([product, rows_], axis=1),
                                                 np.ones(len(mine)), rcond=None)
        share = 1.0 / inv_share
        if not 0 < share <= arch.compute_efficiency:
            share = arch.compute_efficiency
            row_s = float(rows_ @ (1.0 - product / share) / (rows_ @ rows_))
        out[f"{name}_efficiency"] = share
        out[f"{name}_row_ns"] = row_s * 1e9
    return out


def fit_head_dims(path: Path) -> dict[int, tuple[float, float]]:
    """Head dimension -> (forward, backward) multipliers of the preset's two efficiencies
    (its ``attention.head_dim_efficiency``), fitted to a file of several head dimensions
    (``measure_torch_attention.py --set head-dims``) with the preset's shares and row times
    as they are: per dimension and pass, the one multiplier m that minimises the squared
    relative error of FLOPs / (peak · share · m) + rows · t, in closed form in 1/m, divided
    by the multiplier of the file's :data:`REFERENCE_HEAD_DIM` rows."""
    preset, rows = _rows(path)
    arch = load_hardware(preset)
    kernel = replace(arch.attention_kernel, head_dims=())
    out: dict[int, list[float]] = {}
    for i, pass_ in enumerate(("fwd", "bwd")):
        share, row_s = ((kernel.forward_efficiency, kernel.forward_row_s) if pass_ == "fwd"
                        else (kernel.backward_efficiency, kernel.backward_row_s))
        for d in sorted({int(r["head_dim"]) for r in rows}):
            mine = [r for r in rows if r["pass"] == pass_ and int(r["head_dim"]) == d]
            measured = np.array([_measured(r) for r in mine])
            products = np.array([attention_flops(*_shape(r)) / arch.peak_flops[r["dtype"]]
                                 / share for r in mine]) / measured
            rest = np.array([heads * seq * row_s for heads, seq, *_ in map(_shape, mine)]
                            ) / measured
            inverse = float(products @ (1.0 - rest) / (products @ products))
            out.setdefault(d, [1.0, 1.0])[i] = 1.0 / inverse
    # relative to the file's own 128-wide rows, which the preset's shares were fitted at:
    # the table carries the head dimension's effect, not the runs' drift between files
    ref = out.get(REFERENCE_HEAD_DIM, [1.0, 1.0])
    return {d: (f / ref[0], b / ref[1]) for d, (f, b) in out.items()}


def _main() -> None:  # pragma: no cover - a maintenance script
    paths = [Path(a) for a in sys.argv[1:]] or _files()
    print("attention:  # fitted to " + ", ".join(p.name for p in paths))
    for key, value in fit(paths).items():
        print(f"  {key}: {value:.4g}")
    for path in paths:
        if "head_dims" in path.stem:
            print(f"  head_dim_efficiency:  # {path.name}")
            for d, (f, b) in fit_head_dims(path).items():
                print(f"    {d}: [{f:.3f}, {b:.3f}]")


if __name__ == "__main__":
    _main()
