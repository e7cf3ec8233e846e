"""Timing: the core clock (a dependent add chain run as machine code) and how GEMM calls
are timed (:class:`Timing`, :func:`time_matmul`)."""

from __future__ import annotations

import ctypes
import math
import mmap
import platform
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

# --- core clock -------------------------------------------------------------------------------

_ADDS = 100  # dependent adds per loop iteration


class _AddChain:
    """x86-64 machine code: ``for (i = n; i; --i) { rax += rdx; ×100 }; return rax``.

    ``add rax, rdx`` with rdx = 1 is a register-register add, 1 cycle of latency on
    current x86-64 cores and not eliminated at rename (as ``add reg, imm`` can be on recent Intel
    cores), so the chain runs at exactly one add per clock.
    """

    def __init__(self) -> None:
        body = b"\x48\x01\xd0" * _ADDS + b"\x48\xff\xc9"  # add rax, rdx (x100); dec rcx
        jnz = b"\x0f\x85" + struct.pack("<i", -(len(body) + 6))  # jnz back to the first add
        code = (
            b"\x48\x89\xf9"  # mov rcx, rdi   (n, first argument in the SysV ABI)
            + b"\x31\xc0"  # xor eax, eax
            + b"\xba\x01\x00\x00\x00"  # mov edx, 1
            + body + jnz
            + b"\xc3"  # ret
        )
        self._page = mmap.mmap(
            -1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC
        )
        self._page.write(code)
        address = ctypes.addressof(ctypes.c_char.from_buffer(self._page))
        # CFUNCTYPE releases the GIL during the call, so threads run it on all cores at once.
        self.run: Callable[[int], int] = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(address)
        if self.run(10) != 10 * _ADDS:
            raise OSError("the add chain returned a wrong sum")


_CHAIN: _AddChain | None = None
_CHAIN_LOCK = threading.Lock()


def _add_chain() -> _AddChain | None:
    global _CHAIN
    if platform.machine().lower() not in ("x86_64", "amd64") or not hasattr(mmap, "PROT_EXEC"):
        return None
    with _CHAIN_LOCK:
        if _CHAIN is None:
            try:
                _CHAIN = _AddChain()
            except (OSError, ValueError, AttributeError):  # W^X policy, no executable pages
                return None
    return _CHAIN


def measure_clock_Hz(threads: int = 1, *, cycles: float = 2e8, repeats: int = 5) -> float | None:
    """Sustained core clock (Hz) with ``threads`` cores busy; None where it cannot be measured.

    Each thread runs ``repeats`` chains of ``cycles`` dependent adds and keeps its best time;
    the result is the slowest thread's clock (all-core clock when ``threads`` = cores).
    """
    chain = _add_chain()
    if chain is None:
        return None
    iterations = max(1, int(cycles / _ADDS))
    chain.run(iterations // 10 + 1)  # wake the core up

    def one(_: int) -> float:
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            chain.run(iterations)
            best = min(best, time.perf_counter() - t0)
        return iterations * _ADDS / best

    if threads <= 1:
        return one(0)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return min(pool.map(one, range(threads)))


# --- GEMM timing -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """How each shape is timed: ``min_runs`` … ``max_runs`` timed runs after one warm-up
    call, stopping once ``min_time_s`` of timed runs is spent; a run repeats the call until
    it lasts about ``run_s``."""

    min_runs: int = 3
    max_runs: int = 7
    min_time_s: float = 0.5
    run_s: float = 0.02

    def describe(self) -> str:
        return (
            f"one warm-up call, then {self.min_runs} to {self.max_runs} timed runs (stopping "
            f"once {self.min_time_s:g} s of runs is spent), each run repeating the call until "
            f"it lasts ~{self.run_s * 1e3:g} ms; best_s = the fastest run's time per call "
            "(time.perf_counter); output C preallocated (numpy.matmul(A, B, out=C)), so no "
            "allocation is timed; inputs standard-normal (seed 0), C-contiguous; caches are not "
            "flushed between calls, so operands that fit in the L2/L3 stay there (warm)"
        )


FULL_TIMING = Timing()
QUICK_TIMING = Timing(min_runs=2, max_runs=3, min_time_s=0.05, run_s=0.005)


def time_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray, timing: Timing) -> float:
    """Best per-call seconds of ``numpy.matmul(a, b, out=out)``."""
    t0 = time.perf_counter()
    np.matmul(a, b, out=out)  # warm-up: BLAS threads, first touch of C, caches
    first = time.perf_counter() - t0
    calls = max(1, int(timing.run_s / max(first, 1e-7)))
    best, spent = math.inf, 0.0
    for run in range(timing.max_runs):
        t0 = time.perf_counter()
        for _ in range(calls):
            np.matmul(a, b, out=out)
        dt = time.perf_counter() - t0
        best = min(best, dt / calls)
        spent += dt
        if run + 1 >= timing.min_runs and spent >= timing.min_time_s:
            break
    return best

