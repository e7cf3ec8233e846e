"""Measure the CPU this runs on and write a hardware preset for it (``crossflow calibrate cpu``).

docs/architecture.md, "Layers" (tools: validation, calibrate): a measurement taken on the
machine you run on is real hardware.  This package holds the measurements; ``presets/measurements/cpu/measure_numpy_gemm.py`` is a thin command
line around them that records the CSVs shipped beside it, and :func:`calibrate_cpu` turns the
same measurements into a ``kind: microarch`` preset.

What is measured, and how:

* **core clock** — a chain of dependent 64-bit integer adds (1 cycle each on x86-64 cores of the last
  two decades) run as machine code from an executable page, timed with ``perf_counter``; once
  on one core and at once on all cores.  A VM guest hides the clock (``/proc/cpuinfo`` shows
  the TSC), so it is measured rather than read.  Other architectures fall back to the
  ``cpu MHz`` line.
* **GEMM** — ``numpy.matmul(A, B, out=C)`` over a sweep of shapes, float32 and float64, with
  1 BLAS thread and with one per physical core (``threadpoolctl`` limits the BLAS pool); the
  best per-call time of several timed runs after a warm-up call, each run repeating the call
  often enough to last ~20 ms.
* **memory bandwidth** — STREAM's copy / scale / add / triad kernels written with numpy ufuncs
  on float64 arrays several times the last-level cache, on 1 thread and on one thread per
  core (numpy releases the GIL inside ufuncs, so Python threads run the array slices in
  parallel).  Bytes are counted as STREAM counts them (no write-allocate traffic).

The preset keeps the fitted constants to three: compute efficiency (best GEMM rate over the
peak), kernel launch (the numpy call overhead of a tiny matmul) and the DRAM bandwidth (the
STREAM add rate, see :data:`DRAM_KERNEL`).  Everything else comes from the CPU's description
and is labelled so.

The package, by job: :mod:`~crossflow.calibrate.host` (/proc, /sys: what the CPU is),
:mod:`~crossflow.calibrate.timing` (the clock, how a call is timed),
:mod:`~crossflow.calibrate.blas` (numpy's BLAS and the GEMM sweep),
:mod:`~crossflow.calibrate.stream` (memory bandwidth), :mod:`~crossflow.calibrate.measure`
(all of it in one go), :mod:`~crossflow.calibrate.write` (the CSVs, and output files written
together) and :mod:`~crossflow.calibrate.preset` (the preset's text).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from crossflow.calibrate.blas import (
    DTYPES,
    GEMM_SHAPES,
    QUICK_SHAPES,
    GemmRow,
    Shape,
    blas_info,
    measure_gemm,
)
from crossflow.calibrate.host import CacheLevel, Machine, machine
from crossflow.calibrate.measure import Measurement, measure
from crossflow.calibrate.preset import (
    DRAM_KERNEL,
    GENERIC_FMA_PIPES,
    GENERIC_L2_B_PER_CYCLE,
    GENERIC_L3_B_PER_CYCLE,
    preset_yaml,
)
from crossflow.calibrate.stream import StreamRow, measure_stream, stream_elements
from crossflow.calibrate.timing import (
    FULL_TIMING,
    QUICK_TIMING,
    Timing,
    measure_clock_Hz,
    time_matmul,
)
from crossflow.calibrate.write import (
    BLAS_ENVIRONMENT,
    OutputFiles,
    check_output,
    environment_header,
    gemm_csv_name,
    stream_csv_name,
    write_gemm_csv,
    write_stream_csv,
)

__all__ = [
    "BLAS_ENVIRONMENT", "DRAM_KERNEL", "DTYPES", "FULL_TIMING", "GEMM_SHAPES",
    "GENERIC_FMA_PIPES", "GENERIC_L2_B_PER_CYCLE", "GENERIC_L3_B_PER_CYCLE", "QUICK_SHAPES",
    "QUICK_TIMING", "CacheLevel", "GemmRow", "Machine", "Measurement", "OutputFiles", "Shape",
    "StreamRow", "Timing", "blas_info", "calibrate_cpu", "check_output", "environment_header",
    "gemm_csv_name", "machine", "measure", "measure_clock_Hz", "measure_gemm",
    "measure_stream", "preset_yaml", "stream_csv_name", "stream_elements", "time_matmul",
    "write_gemm_csv", "write_stream_csv",
]


def calibrate_cpu(output: Path, *, quick: bool = False, fma_pipes: int = GENERIC_FMA_PIPES,
                  progress: Callable[[str], None] | None = None,
                  option: str = "output", overwrite: bool = True,
                  force: str = "overwrite=True") -> Path:
    """Measure this machine and write a hardware preset for it; returns the preset's path.

    ``output`` is the preset YAML to write (or an existing folder, which gets
    ``<preset name>.yaml``).  The GEMM and STREAM CSVs the preset cites are written beside it
    as ``numpy_gemm_<preset name>.csv`` and ``stream_<preset name>.csv``.

    Before anything is measured, the three paths are checked: each must be a regular file
    (replaced) or a new path in a folder this process can write to; a FIFO, a device, a
    directory or an unwritable place raises a :class:`~crossflow.errors.ConfigError` naming
    ``option`` (``--output`` from the command line) and the path.  All three files are then
    written to temporary files and renamed into place together once everything has been
    measured and the preset validates, so nothing is ever left half-written.
    ``overwrite=False`` refuses, before anything is measured, when any of the three exists
    (the message lists them and names ``force``, the option that allows replacing them).
    """
    import yaml

    from crossflow.config import build
    from crossflow.config.hardware import MicroArchSpec

    output = Path(output)
    if output.is_dir():
        output = output / f"{machine().preset_name}.yaml"
    gemm_path = output.parent / gemm_csv_name(output.stem)
    stream_path = output.parent / stream_csv_name(output.stem)
    files = OutputFiles([
        (output, option, "the preset"),
        (gemm_path, option, "the GEMM CSV written beside the preset"),
        (stream_path, option, "the STREAM CSV written beside the preset"),
    ], overwrite=overwrite, force=force)
    with files:
        meas = measure(quick=quick, command=f"crossflow.calibrate.calibrate_cpu("
                       f"{str(output)!r}, quick={quick})", progress=progress)
        text = preset_yaml(meas, gemm_path.name, stream_path.name, fma_pipes=fma_pipes,
                           name=output.stem)
        build(MicroArchSpec, yaml.safe_load(text), file=str(output))  # raises if not valid
        write_gemm_csv(files.temp(gemm_path), meas, output.stem)
        write_stream_csv(files.temp(stream_path), meas, output.stem)
        files.temp(output).write_text(text, encoding="utf-8")
        files.commit()
    return output
