"""The CSV files of a measurement (GEMM rows, STREAM rows, a ``#`` header describing the
machine and how it was measured).  The preset and the CSVs are written together by
:class:`crossflow.outputs.OutputFiles` (re-exported here)."""

from __future__ import annotations

import csv
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

from crossflow.calibrate.blas import _numpy_blas_build
from crossflow.calibrate.host import Machine
from crossflow.calibrate.measure import Measurement
from crossflow.calibrate.stream import _TRIAD_BLOCK

# the calibrate package exports these from here (one helper for every user-named output)
from crossflow.outputs import OutputFiles, check_output  # noqa: F401


def _fmt_B(n: float) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= f:
            return f"{n / f:.4g} {unit}"
    return f"{n:g} B"


#: Environment variables that change what numpy's BLAS does; recorded when set.
BLAS_ENVIRONMENT = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_ENABLE_INSTRUCTIONS",
                    "MKL_DEBUG_CPU_TYPE", "BLIS_NUM_THREADS", "NPY_DISABLE_CPU_FEATURES")


def environment_header(meas: Measurement) -> list[str]:
    """The ``#`` header lines both CSVs share: command, date, CPU, caches, clock, BLAS."""
    m = meas.machine
    caches = "; ".join(
        f"L{c.level} {_fmt_B(c.size_B)} x{c.instances}"
        + (f" (each shared by {c.cores_sharing} cores)" if c.cores_sharing > 1 else " (per core)")
        for c in m.caches
    ) or "unknown"
    ident = ", ".join(
        f"{k} {v}" for k, v in (("vendor", m.vendor), ("family", m.family), ("model", m.model),
                                ("stepping", m.stepping)) if v not in (None, "")
    )
    clock = "not measurable here"
    if meas.clock_1_Hz:
        clock = (f"{meas.clock_1_Hz / 1e9:.3f} GHz on 1 core, "
                 f"{(meas.clock_all_Hz or 0) / 1e9:.3f} GHz on all {m.cores} cores at once "
                 f"(dependent 64-bit integer add chain, 1 add per cycle, best of several "
                 f"{meas.clock_cycles:.0e}-add runs)")
    blas = "; ".join(
        f"{b.get('internal_api')} {b.get('version')} (kernels for {b.get('architecture')}, "
        f"{b.get('threading_layer')} threading, default {b.get('num_threads')} threads)"
        for b in meas.blas
    ) or "none found by threadpoolctl"
    env = " ".join(f"{k}={os.environ[k]}" for k in BLAS_ENVIRONMENT if k in os.environ)
    return [
        f"command: {meas.command}",
        f"environment: {env or 'none of ' + ', '.join(BLAS_ENVIRONMENT[:3]) + ', … set'}",
        f"date: {meas.date}",
        f"host: {platform.platform()}; Python {platform.python_version()}",
        f"cpu: {m.model_name!r} ({ident}) -> core generation {m.uarch or 'unknown'}"
        + (f"; {m.hypervisor}" if m.hypervisor else ""),
        f"cores: {m.cores} physical cores, {m.logical_cpus} logical CPUs in this process's "
        "affinity",
        f"simd flags: {' '.join(m.simd_flags) or 'none'} (widest vector {m.vector_bits} bit)",
        f"caches: {caches}",
        f"memory: MemTotal {_fmt_B(m.mem_total_B)}",
        f"clock: {clock}; /proc/cpuinfo 'cpu MHz' = {m.cpuinfo_MHz} (the TSC rate in a VM guest)",
        f"numpy {np.__version__}; BLAS at run time: {blas}; numpy built against "
        f"{_numpy_blas_build()}",
    ]


def _write_csv(path: Path, header: list[str], columns: list[str], rows: list[list[Any]]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        for line in header:
            fh.write(f"# {line}\n")
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(columns)
        w.writerows(rows)


def gemm_csv_name(m: Machine | str) -> str:
    """``numpy_gemm_<machine slug or preset name>.csv``."""
    return f"numpy_gemm_{m.slug if isinstance(m, Machine) else m}.csv"


def stream_csv_name(m: Machine | str) -> str:
    """``stream_<machine slug or preset name>.csv``."""
    return f"stream_{m.slug if isinstance(m, Machine) else m}.csv"


def _preset_line(preset: str | None) -> list[str]:
    """``# preset: NAME``: the hardware preset ``crossflow validate`` predicts these rows on."""
    return [f"preset: {preset}"] if preset else []


def write_gemm_csv(path: Path, meas: Measurement, preset: str | None = None) -> None:
    """The GEMM CSV; ``preset`` names the hardware preset its rows validate (header line)."""
    header = [
        "numpy GEMM C[m,n] = A[m,k] @ B[k,n] timed on the machine below (docs/architecture.md, Layers); "
        "written by crossflow/presets/measurements/cpu/measure_numpy_gemm.py "
        "(crossflow.calibrate)",
        *_preset_line(preset),
        *environment_header(meas),
        f"threads: BLAS threads set with threadpoolctl.threadpool_limits(user_api='blas'): 1 and "
        f"one per physical core ({meas.machine.cores})",
        f"timing: {meas.timing.describe()}",
        "columns: m,k,n (C[m,n] = A[m,k] @ B[k,n]); dtype; threads; best_s = seconds per call; "
        "gflops = 2*m*k*n / best_s / 1e9",
    ]
    rows = [[r.m, r.k, r.n, r.dtype, r.threads, f"{r.best_s:.6e}", f"{r.gflops:.4f}"]
            for r in meas.gemm]
    _write_csv(path, header, ["m", "k", "n", "dtype", "threads", "best_s", "gflops"], rows)


def write_stream_csv(path: Path, meas: Measurement, preset: str | None = None) -> None:
    """The STREAM CSV; ``preset`` names the hardware preset it sources (header line)."""
    n = meas.stream[0].elements if meas.stream else 0
    llc = max((c.size_B * c.instances for c in meas.machine.caches), default=0)
    header = [
        "STREAM-like memory bandwidth with numpy ufuncs on the machine below; written by "
        "crossflow/presets/measurements/cpu/measure_numpy_gemm.py (crossflow.calibrate)",
        *_preset_line(preset),
        *environment_header(meas),
        f"arrays: 3 float64 arrays of {n} elements ({_fmt_B(8 * n)} each"
        + (f", {8 * n / llc:.0f}x the last-level cache" if llc else "") + ")",
        "kernels: copy c=a (np.copyto), scale b=q*c (np.multiply), add c=a+b (np.add), "
        f"triad a=b+q*c (np.multiply into an L2-resident {_TRIAD_BLOCK}-element temporary, "
        "then np.add, block by block)",
        "threads: 1, and one Python thread per physical core each running the ufunc on a "
        "contiguous slice (numpy releases the GIL in ufuncs); time = wall time of the whole pass",
        "timing: one warm-up pass, then the best of the timed passes (time.perf_counter)",
        "bytes: counted as STREAM counts them, 2 (copy, scale) or 3 (add, triad) words of 8 B "
        "per element, no write-allocate traffic",
        "columns: kernel,threads,elements,bytes_per_pass,best_s,GBps (GBps = bytes_per_pass / "
        "best_s / 1e9)",
    ]
    rows = [[r.kernel, r.threads, r.elements, r.bytes_per_pass, f"{r.best_s:.6e}",
             f"{r.GBps:.3f}"] for r in meas.stream]
    _write_csv(path, header,
               ["kernel", "threads", "elements", "bytes_per_pass", "best_s", "GBps"], rows)
