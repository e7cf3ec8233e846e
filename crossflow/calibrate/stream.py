"""Memory bandwidth: STREAM's copy / scale / add / triad kernels with numpy ufuncs."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from crossflow.calibrate.host import Machine

# --- memory bandwidth (STREAM with numpy) -------------------------------------------------------

_TRIAD_BLOCK = 2**16  # elements: triad's temporary stays in L2 (512 KiB of float64)


@dataclass(frozen=True)
class StreamRow:
    kernel: str
    threads: int
    elements: int
    bytes_per_pass: int
    best_s: float

    @property
    def GBps(self) -> float:
        return self.bytes_per_pass / self.best_s / 1e9


def _stream_kernels(a: np.ndarray, b: np.ndarray, c: np.ndarray, q: float):
    """STREAM's four kernels on one slice; (name, words moved per element, function)."""

    def copy(lo: int, hi: int) -> None:
        np.copyto(c[lo:hi], a[lo:hi])

    def scale(lo: int, hi: int) -> None:
        np.multiply(c[lo:hi], q, out=b[lo:hi])

    def add(lo: int, hi: int) -> None:
        np.add(a[lo:hi], b[lo:hi], out=c[lo:hi])

    def triad(lo: int, hi: int) -> None:
        # a = b + q*c in L2-sized blocks, so the temporary q*c never goes to DRAM and the
        # DRAM traffic is STREAM's 3 words per element.
        tmp = np.empty(min(_TRIAD_BLOCK, hi - lo))
        for s in range(lo, hi, _TRIAD_BLOCK):
            e = min(s + _TRIAD_BLOCK, hi)
            t = tmp[: e - s]
            np.multiply(c[s:e], q, out=t)
            np.add(b[s:e], t, out=a[s:e])

    return (("copy", 2, copy), ("scale", 2, scale), ("add", 3, add), ("triad", 3, triad))


def stream_elements(m: Machine, *, quick: bool = False) -> int:
    """Array length: at least 4x (quick) or 8x (full) the last-level cache, and at least
    2^24 (quick) / 2^25 (full) float64 elements, but no more than 1/16 of RAM per array."""
    llc = max((c.size_B * c.instances for c in m.caches), default=32 * 2**20)
    n = max((4 if quick else 8) * llc // 8, 2**24 if quick else 2**25)
    if m.mem_total_B:
        n = min(n, m.mem_total_B // 16 // 8)
    return int(n)


def _one_pass(fn: Callable[[int, int], None], pool: ThreadPoolExecutor,
              slices: list[tuple[int, int]]) -> None:
    """One kernel pass over the whole array: each slice on its own thread (if more than one)."""
    if len(slices) == 1:
        fn(*slices[0])
    else:
        list(pool.map(lambda s: fn(*s), slices))


def measure_stream(
    elements: int, thread_counts: Sequence[int] = (1,), repeats: int = 10
) -> list[StreamRow]:
    """Best-of-``repeats`` bandwidth of each STREAM kernel at each thread count."""
    a = np.full(elements, 1.0)
    b = np.full(elements, 2.0)
    c = np.zeros(elements)
    kernels = _stream_kernels(a, b, c, 3.0)
    rows: list[StreamRow] = []
    for threads in thread_counts:
        bounds = np.linspace(0, elements, threads + 1).astype(int)
        slices = [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for name, words, fn in kernels:
                _one_pass(fn, pool, slices)  # warm-up (STREAM drops its first iteration too)
                best = math.inf
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    _one_pass(fn, pool, slices)
                    best = min(best, time.perf_counter() - t0)
                rows.append(StreamRow(name, threads, elements, words * 8 * elements, best))
    return rows

