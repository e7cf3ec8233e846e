"""GEMM data sets: the published A100 M-sweep and GEMMs timed by this project itself.

* ``gemm_a100_fp16_msweep.csv`` (LLMCompass, real A100 80GB, fp16) on the A100 preset.
* ``cpu/numpy_gemm_*.csv``: numpy matmuls timed on a CPU by ``cpu/measure_numpy_gemm.py``,
  1 thread and all cores, fp32 and fp64, on the CPU preset the file names in its header.
* ``gpu/torch_matmul_*.csv``: torch matmuls timed on a GPU by ``gpu/measure_torch_matmul.py``
  (present when a session had a GPU), on the preset its header names.
* ``gpu/torch_linear_*.csv``: a transformer block's linear layers — forward, input and
  weight gradient, and the forward as a bare matmul — timed by
  ``gpu/measure_torch_linear.py``; each row's kernels' device time (``kernel_s``, torch's
  profiler) is checked, as the kernel layer prices the device alone.
"""

from __future__ import annotations

from crossflow.arch.microarch import MicroArch
from crossflow.kernels.gemm import gemm
from crossflow.predict import FRAMEWORK_FLOOR_S, load_hardware
from crossflow.validation.dataset import (
    DataSet,
    Row,
    measurements_dir,
    read_measurements,
    read_preset_measurements,
)

#: Tolerances (issue #2, "Accuracy, asserted in tests").
A100_MAX_MAPE, A100_MIN_SPEARMAN = 0.10, 0.9
CPU_MAX_MAPE, CPU_MIN_SPEARMAN = 0.25, 0.9
GPU_MAX_MAPE, GPU_MIN_SPEARMAN = 0.15, 0.9

NUMPY_DTYPES = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def a100_msweep() -> DataSet:
    path = measurements_dir() / "gemm_a100_fp16_msweep.csv"
    _, rows = read_measurements(path)
    arch = load_hardware("a100-sxm4-80gb")
    out = []
    for r in rows:
        m, k, n = int(r["M"]), int(r["K"]), int(r["N"])
        predicted = gemm(arch, m, k, n, "fp16").time_s
        out.append(Row(f"{m}x{k}x{n} fp16", predicted, float(r["latency_ms"]) * 1e-3))
    return DataSet(
        name="gemm: A100 SXM4 80GB fp16 M-sweep (LLMCompass)",
        source=f"{path.name} on preset a100-sxm4-80gb",
        quantity="time_s",
        rows=tuple(out),
        max_mape=A100_MAX_MAPE,
        min_spearman=A100_MIN_SPEARMAN,
    )


def _timed_sets(pattern: str, label: str, max_mape: float, min_rho: float,
                floor_s: float = 0.0, measured: str = "best_s") -> list[DataSet]:
    """One data set per measurement file, each row's ``measured`` column against the
    prediction (at least ``floor_s``); a file's ``threads`` and ``layer``/``pass`` columns,
    where it has them, name the row too."""
    sets = []
    for path in sorted(measurements_dir().glob(pattern)):
        preset, rows = read_preset_measurements(path)
        arch = load_hardware(preset)
        by_threads: dict[int, MicroArch] = {}
        out = []
        for r in rows:
            threads = int(r.get("threads") or arch.num_bundles)
            if threads not in by_threads:
                by_threads[threads] = arch.with_bundles(min(threads, arch.num_bundles))
            precision = NUMPY_DTYPES.get(r["dtype"], r["dtype"])
            m, k, n = int(r["m"]), int(r["k"]), int(r["n"])
            predicted = max(gemm(by_threads[threads], m, k, n, precision).time_s, floor_s)
            tag = f" {threads}t" if "threads" in r else ""
            where = f"{r['layer']} {r['pass']} " if "layer" in r else ""
            out.append(Row(f"{where}{m}x{k}x{n} {precision}{tag}", predicted,
                           float(r[measured])))
        sets.append(DataSet(
            name=f"gemm: {label} ({path.stem})",
            source=f"{path.relative_to(measurements_dir())} on preset {preset}",
            quantity="time_s",
            rows=tuple(out),
            max_mape=max_mape,
            min_spearman=min_rho,
        ))
    return sets


def cpu_sets() -> list[DataSet]:
    return _timed_sets("cpu/numpy_gemm_*.csv", "numpy on CPU", CPU_MAX_MAPE, CPU_MIN_SPEARMAN)


def gpu_sets() -> list[DataSet]:
    # Each row times one eager torch matmul, its dispatch included, which is what `crossflow
    # predict` gives a GEMM on bare hardware: at least the framework floor.
    return _timed_sets("gpu/torch_matmul_*.csv", "torch on GPU", GPU_MAX_MAPE, GPU_MIN_SPEARMAN,
                       floor_s=FRAMEWORK_FLOOR_S)


def linear_sets() -> list[DataSet]:
    # the kernels' device time: the kernel layer prices the device alone
    return _timed_sets("gpu/torch_linear_*.csv", "transformer linear layers, torch on GPU, "
                       "kernel time", GPU_MAX_MAPE, GPU_MIN_SPEARMAN, measured="kernel_s")


def gemm_datasets() -> list[DataSet]:
    return [a100_msweep(), *cpu_sets(), *gpu_sets(), *linear_sets()]
