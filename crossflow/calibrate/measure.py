"""One whole measurement of this machine: clock, GEMM sweep and STREAM (:func:`measure`)."""

from __future__ import annotations

import datetime as _dt
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossflow.calibrate.blas import (
    DTYPES,
    GEMM_SHAPES,
    QUICK_SHAPES,
    GemmRow,
    blas_info,
    measure_gemm,
)
from crossflow.calibrate.host import Machine, machine
from crossflow.calibrate.stream import StreamRow, measure_stream, stream_elements
from crossflow.calibrate.timing import FULL_TIMING, QUICK_TIMING, Timing, measure_clock_Hz
from crossflow.errors import CrossflowError


@dataclass
class Measurement:
    """Everything measured on one machine in one go."""

    machine: Machine
    command: str
    date: str
    clock_1_Hz: float | None
    clock_all_Hz: float | None
    gemm: list[GemmRow]
    stream: list[StreamRow]
    timing: Timing
    blas: list[dict[str, Any]]
    clock_cycles: float = 3e8

    @property
    def frequency_Hz(self) -> float:
        """All-core sustained clock, else the one-core clock, else /proc/cpuinfo's figure."""
        for f in (self.clock_all_Hz, self.clock_1_Hz):
            if f:
                return f
        if self.machine.cpuinfo_MHz:
            return self.machine.cpuinfo_MHz * 1e6
        raise CrossflowError(
            "cannot tell this CPU's clock: the add-chain timer needs x86-64 and executable "
            "memory, and /proc/cpuinfo has no 'cpu MHz' line"
        )

    def best_gflops(self, dtype: str, threads: int) -> float:
        return max(r.gflops for r in self.gemm if r.dtype == dtype and r.threads == threads)

    @property
    def call_overhead_s(self) -> float:
        """Time per call of the smallest matmul in the sweep (8x8x8: ~1 kFLOP, all overhead)."""
        smallest = min(r.m * r.k * r.n for r in self.gemm)
        return min(r.best_s for r in self.gemm if r.m * r.k * r.n == smallest)

    def stream_GBps(self, kernel: str, threads: int) -> float:
        return next(r.GBps for r in self.stream if r.kernel == kernel and r.threads == threads)


def measure(
    *, quick: bool = False, command: str | None = None, stream: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Measurement:
    """Run the clock, GEMM and (unless ``stream`` is False) STREAM measurements here."""
    m = machine()
    say = progress or (lambda _msg: None)
    all_threads = m.cores
    counts = (1,) if all_threads == 1 else (1, all_threads)
    say(f"{m.model_name}: {m.cores} cores, {m.vector_bits}-bit SIMD")
    cycles = 5e7 if quick else 3e8
    clock_1 = measure_clock_Hz(1, cycles=cycles, repeats=3 if quick else 5)
    clock_all = measure_clock_Hz(all_threads, cycles=cycles, repeats=3 if quick else 5)
    say(f"clock: 1 core {clock_1 or 0:.4g} Hz, {all_threads} cores {clock_all or 0:.4g} Hz")
    timing = QUICK_TIMING if quick else FULL_TIMING
    gemm_rows = measure_gemm(
        QUICK_SHAPES if quick else GEMM_SHAPES, DTYPES, counts, timing,
        progress=lambda r: say(
            f"gemm {r.m}x{r.k}x{r.n} {r.dtype} {r.threads}t: {r.best_s:.3g} s {r.gflops:.4g} GFLOP/s"
        ),
    )
    stream_rows = (
        measure_stream(stream_elements(m, quick=quick), counts, 3 if quick else 10)
        if stream else []
    )
    for r in stream_rows:
        say(f"stream {r.kernel} {r.threads}t: {r.GBps:.4g} GB/s")
    return Measurement(
        machine=m,
        command=command or " ".join([Path(sys.executable).name, *sys.argv]),
        date=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        clock_1_Hz=clock_1,
        clock_all_Hz=clock_all,
        gemm=gemm_rows,
        stream=stream_rows,
        timing=timing,
        blas=blas_info(),
        clock_cycles=cycles,
    )

