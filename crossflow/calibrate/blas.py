"""numpy's BLAS: which library it loaded, and the GEMM sweep timed through it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from crossflow.calibrate.timing import FULL_TIMING, Timing, time_matmul
from crossflow.errors import CrossflowError

# --- BLAS and numpy ---------------------------------------------------------------------------


def _threadpoolctl():
    try:
        import threadpoolctl
    except ImportError:
        raise CrossflowError(
            "measuring the CPU needs the 'threadpoolctl' package to set the number of BLAS "
            "threads; install it with 'pip install threadpoolctl' (it is in crossflow[test])."
        ) from None
    return threadpoolctl


def blas_info() -> list[dict[str, Any]]:
    """threadpoolctl's description of the BLAS libraries numpy loaded."""
    tpc = _threadpoolctl()
    return [
        {k: v for k, v in lib.items() if k != "filepath"}
        for lib in tpc.threadpool_info()
        if lib.get("user_api") == "blas"
    ]


def _numpy_blas_build() -> str:
    try:
        cfg = np.show_config(mode="dicts")  # numpy >= 1.26
        blas = cfg["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')} ({blas.get('openblas configuration', '')})"
    except Exception:  # noqa: BLE001 - older numpy: not worth failing a measurement over
        return "unknown"


# --- GEMM -------------------------------------------------------------------------------------

Shape = tuple[int, int, int]


def _squares(sizes: Iterable[int]) -> list[Shape]:
    return [(s, s, s) for s in sizes]


#: The recorded sweep: 49 shapes.  C[m, n] = A[m, k] @ B[k, n].
GEMM_SHAPES: tuple[Shape, ...] = tuple(
    [(8, 8, 8)]  # a tiny call: its time is the numpy/BLAS call overhead
    + _squares((64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096))
    # skinny: few rows against a large weight (M small, K = N large) — inference-like
    + [(m, 2048, 2048) for m in (1, 4, 16, 64, 256)]
    + [(m, 4096, 4096) for m in (1, 16, 128)]
    # small K (outer-product-like, memory-bound on C)
    + [(2048, k, 2048) for k in (1, 8, 32, 128)]
    + [(4096, 64, 4096)]
    # small N
    + [(2048, 2048, n) for n in (1, 16, 64, 256)]
    # tall: many rows, small K = N
    + [(16384, 256, 256), (65536, 256, 256), (32768, 64, 64), (65536, 32, 32)]
    # rectangular, transformer-like projections (tokens x hidden x 4*hidden and back)
    + [(512, 1024, 4096), (512, 4096, 1024), (2048, 1024, 4096), (2048, 4096, 1024),
       (1024, 4096, 4096), (4096, 1024, 1024), (256, 8192, 256), (128, 128, 8192),
       (8192, 128, 128), (1024, 512, 2048), (300, 700, 500), (1000, 1000, 1000),
       (2000, 3000, 1000), (4096, 4096, 256)]
)

#: ``calibrate_cpu(quick=True)``: enough for the three fitted constants, in a few seconds.
QUICK_SHAPES: tuple[Shape, ...] = ((8, 8, 8), (256, 256, 256), (1024, 1024, 1024),
                                   (16, 1024, 1024))

DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class GemmRow:
    m: int
    k: int
    n: int
    dtype: str
    threads: int
    best_s: float

    @property
    def gflops(self) -> float:
        return 2.0 * self.m * self.k * self.n / self.best_s / 1e9



def measure_gemm(
    shapes: Sequence[Shape] = GEMM_SHAPES,
    dtypes: Sequence[str] = DTYPES,
    thread_counts: Sequence[int] = (1,),
    timing: Timing = FULL_TIMING,
    progress: Callable[[GemmRow], None] | None = None,
) -> list[GemmRow]:
    """Time every shape x dtype x BLAS-thread count."""
    tpc = _threadpoolctl()
    rng = np.random.default_rng(0)
    rows: list[GemmRow] = []
    for threads in thread_counts:
        with tpc.threadpool_limits(limits=threads, user_api="blas"):
            for dtype in dtypes:
                for m, k, n in shapes:
                    a = rng.standard_normal((m, k)).astype(dtype)
                    b = rng.standard_normal((k, n)).astype(dtype)
                    c = np.empty((m, n), dtype=dtype)
                    row = GemmRow(m, k, n, dtype, threads, time_matmul(a, b, c, timing))
                    rows.append(row)
                    if progress:
                        progress(row)
                    del a, b, c
    return rows

