"""Measure the CPU this runs on and write a hardware preset for it (``crossflow calibrate cpu``).

A measurement on this machine is real hardware (docs/architecture.md, "Layers").  This module
holds the measurements; ``presets/measurements/cpu/measure_numpy_gemm.py`` is a thin command
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
"""

from __future__ import annotations

import csv
import ctypes
import datetime as _dt
import math
import mmap
import os
import platform
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crossflow.errors import CrossflowError

# --- the machine ------------------------------------------------------------------------------

#: AMD family (cpuid, decimal) -> core generation.  Family 25 covers Zen 3 and Zen 4, told
#: apart by model ranges (AMD PPR for family 19h models); Intel names its parts in the model
#: name, so it needs no table.
_AMD_FAMILIES = {23: "zen2", 25: "zen3", 26: "zen5"}
_ZEN4_MODELS = (range(0x10, 0x20), range(0x60, 0x80), range(0xA0, 0xB0))


@dataclass(frozen=True)
class CacheLevel:
    """One data (or unified) cache as the OS describes it."""

    level: int
    size_B: int  # one instance
    cores_sharing: int  # physical cores of this process's affinity that share one instance
    instances: int  # instances reachable from this process's CPUs


@dataclass(frozen=True)
class Machine:
    """What the OS says about the CPU (Linux /proc and /sys; fallbacks elsewhere)."""

    model_name: str
    vendor: str
    family: int | None
    model: int | None
    stepping: int | None
    uarch: str | None
    cores: int  # physical cores in this process's affinity
    logical_cpus: int
    flags: frozenset[str]
    caches: tuple[CacheLevel, ...]
    mem_total_B: int
    cpuinfo_MHz: float | None
    hypervisor: str | None
    arch: str = field(default_factory=platform.machine)

    @property
    def simd_flags(self) -> list[str]:
        wanted = ("sse2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
                  "avx512_fp16", "amx_tile", "asimd", "sve", "sve2")
        return [f for f in wanted if f in self.flags]

    @property
    def vector_bits(self) -> int:
        """Widest SIMD register the ISA offers (what an FMA instruction works on)."""
        if "avx512f" in self.flags:
            return 512
        if "avx2" in self.flags or "avx" in self.flags:
            return 256
        return 128

    @property
    def fma_datapath_bits(self) -> int:
        """Width of one FMA pipe: the ISA width, except Zen 4 which runs 512-bit ops on
        256-bit pipes in two passes (AMD Zen 4 optimisation guide, pub. 57647)."""
        if self.uarch == "zen4":
            return min(self.vector_bits, 256)
        return self.vector_bits

    @property
    def vector_registers(self) -> int:
        """Architectural SIMD registers: 32 with AVX-512 and on AArch64, else 16."""
        return 32 if ("avx512f" in self.flags or self.arch in ("aarch64", "arm64")) else 16

    def cache(self, level: int) -> CacheLevel | None:
        return next((c for c in self.caches if c.level == level), None)

    @property
    def slug(self) -> str:
        """A file-name-safe name: ``amd-epyc-zen5_2c``."""
        name = self.model_name.lower()
        name = re.sub(r"\((r|tm)\)|\bprocessor\b|\bcpu\b|@.*$|\b\d+-core\b", " ", name)
        parts = re.findall(r"[a-z0-9]+", name) or ["cpu"]
        if self.uarch and self.uarch not in parts:
            parts.append(self.uarch)
        return f"{'-'.join(parts)}_{self.cores}c"

    @property
    def preset_name(self) -> str:
        """``cpu-amd-epyc-zen5-2c``."""
        return "cpu-" + self.slug.replace("_", "-")


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _cpu_list(text: str) -> set[int]:
    """Parse a Linux CPU list such as ``0-3,8``."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _size_B(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not m:
        return 0
    return int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2).upper()]


def _lscpu() -> str:
    """``lscpu``'s output, or '' where it is missing."""
    try:
        return subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10,
                              check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def machine() -> Machine:
    """Describe the CPU this process runs on."""
    cpuinfo = _read("/proc/cpuinfo") or ""
    first = cpuinfo.split("\n\n", 1)[0]
    fields: dict[str, str] = {}
    for line in first.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = frozenset((fields.get("flags") or fields.get("Features") or "").split())

    def _int(key: str) -> int | None:
        text = fields.get(key, "")
        for base in (10, 16):  # cpuinfo numbers are decimal, ARM's IDs are 0x-prefixed hex
            try:
                return int(text, base)
            except ValueError:
                continue
        return None

    vendor = fields.get("vendor_id", fields.get("CPU implementer", ""))
    family, model = _int("cpu family"), _int("model")
    uarch = None
    if vendor == "AuthenticAMD" and family in _AMD_FAMILIES:
        uarch = _AMD_FAMILIES[family]
        if family == 23 and model is not None and model < 0x30:
            uarch = "zen"
        if family == 25 and model is not None and any(model in r for r in _ZEN4_MODELS):
            uarch = "zen4"
    model_name = fields.get("model name") or platform.processor() or platform.machine() or "cpu"

    cpus = _affinity()
    core_of: dict[int, tuple[str, str]] = {}  # logical CPU -> (package, core): SMT siblings share
    for c in cpus:
        topo = f"/sys/devices/system/cpu/cpu{c}/topology"
        pkg = (_read(f"{topo}/physical_package_id") or "0").strip()
        core_of[c] = (pkg, (_read(f"{topo}/core_id") or str(c)).strip())
    n_cores = max(1, len(set(core_of.values())))

    caches: dict[int, CacheLevel] = {}
    base = Path(f"/sys/devices/system/cpu/cpu{cpus[0]}/cache")
    for index in sorted(base.glob("index*")) if base.is_dir() else []:
        ctype = (_read(index / "type") or "").strip()
        if ctype not in ("Data", "Unified"):
            continue
        level = int((_read(index / "level") or "0").strip() or 0)
        size = _size_B(_read(index / "size") or "")
        shared = _cpu_list(_read(index / "shared_cpu_list") or str(cpus[0]))
        sharing = len({core_of[c] for c in shared if c in core_of}) or 1
        # Instances reachable from our CPUs: distinct sharing sets among them.
        seen: set[frozenset[int]] = set()
        for c in cpus:
            for other in Path(f"/sys/devices/system/cpu/cpu{c}/cache").glob("index*"):
                if (_read(other / "level") or "").strip() == str(level) and (
                    (_read(other / "type") or "").strip() == ctype
                ):
                    seen.add(frozenset(_cpu_list(_read(other / "shared_cpu_list") or str(c))))
        if level and size:
            caches[level] = CacheLevel(level, size, sharing, max(1, len(seen)))

    mem = 0
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) * 1024
    if not mem and hasattr(os, "sysconf"):
        try:
            mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            mem = 0
    mhz = fields.get("cpu MHz")
    hypervisor = None
    if "hypervisor" in flags:
        hypervisor = "a virtual machine guest"
        vendor_line = re.search(r"Hypervisor vendor:\s*(.+)", _lscpu())
        if vendor_line:
            hypervisor = f"a {vendor_line.group(1).strip()} virtual machine guest (lscpu)"
    return Machine(
        model_name=model_name,
        vendor=vendor,
        family=family,
        model=model,
        stepping=_int("stepping"),
        uarch=uarch,
        cores=n_cores,
        logical_cpus=len(cpus),
        flags=flags,
        caches=tuple(caches[k] for k in sorted(caches)),
        mem_total_B=mem,
        cpuinfo_MHz=float(mhz) if mhz else None,
        hypervisor=hypervisor,
    )


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


# --- one whole measurement ----------------------------------------------------------------------


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


# --- CSV files --------------------------------------------------------------------------------


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
        "numpy GEMM C[m,n] = A[m,k] @ B[k,n] timed on the machine below (docs/architecture.md); "
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


# --- the preset ---------------------------------------------------------------------------------

#: Bytes per cycle per core each cache level can deliver, as assumed for a CPU that
#: ``calibrate_cpu`` knows nothing more about.  These are AMD Zen 5's figures (Software
#: Optimization Guide for the AMD Zen5 Microarchitecture, pub. 58455 rev 1.00, 2024): L1D two
#: vector loads per cycle, L2 -> L1 64 B/cycle, L3 -> L2 32 B/cycle.
GENERIC_L2_B_PER_CYCLE = 64
GENERIC_L3_B_PER_CYCLE = 32
GENERIC_FMA_PIPES = 2  # two FMA pipes per core: every Intel core since Haswell, AMD since Zen
#: The STREAM kernel whose all-core rate becomes the DRAM bandwidth: ``add`` (c = a + b) moves
#: STREAM triad's three words per element in one ufunc; numpy's triad needs a second pass over
#: a temporary, which costs it ~20% on one core without moving any more DRAM bytes.
DRAM_KERNEL = "add"


def _num(x: float, sig: int = 4) -> str:
    """A YAML float without an exponent (PyYAML reads '1e+04' as a string)."""
    if x == 0:
        return "0"
    decimals = max(0, sig - 1 - int(math.floor(math.log10(abs(x)))))
    text = f"{x:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _line(text: str, comment: str, width: int = 32) -> str:
    return f"{text:<{width}}# {comment}" if comment else text


def preset_yaml(
    meas: Measurement, gemm_csv: str, stream_csv: str, *,
    fma_pipes: int = GENERIC_FMA_PIPES, name: str | None = None,
) -> str:
    """The ``kind: microarch`` preset text for the measured machine, a comment on every number."""
    m = meas.machine
    f = meas.frequency_Hz
    f_src = ("[measured] all-core sustained clock, dependent-add chain (" + gemm_csv + " header)"
             if meas.clock_all_Hz else "[cpuinfo] 'cpu MHz' (could not measure the clock here)")
    bits = m.fma_datapath_bits
    lanes32, lanes64 = bits // 32, bits // 64
    peak32 = m.cores * fma_pipes * lanes32 * 2 * f
    peak64 = m.cores * fma_pipes * lanes64 * 2 * f
    threads = m.cores
    best32 = meas.best_gflops("float32", threads) * 1e9
    best64 = meas.best_gflops("float64", threads) * 1e9
    eff = min(1.0, best32 / peak32)
    eff_note = (f"[fit] best fp32 GEMM {best32 / 1e9:.1f} GFLOP/s on {threads} threads / peak "
                f"{peak32 / 1e9:.1f} ({gemm_csv}); fp64: {best64 / peak64:.2f}")
    if best32 > peak32:
        eff_note += "; measured exceeds the assumed peak: check fma pipes / vector width"
    l1, l2, l3 = m.cache(1), m.cache(2), m.cache(3)
    vec_B = m.vector_bits // 8
    reg_B = m.vector_registers * vec_B / fma_pipes
    dram = meas.stream_GBps(DRAM_KERNEL, threads)
    dram_1 = meas.stream_GBps(DRAM_KERNEL, 1)
    overhead = meas.call_overhead_s
    out = [
        f"# {m.model_name} ({m.uarch or 'unknown core'}), {m.cores} cores: written by "
        "crossflow.calibrate.calibrate_cpu",
        f"#   on {meas.date} ({'quick' if meas.timing is QUICK_TIMING else 'full'} measurement).",
        "# Sources: [measured]/[fit] the CSVs written beside this file "
        f"({gemm_csv}, {stream_csv});",
        "#   [os] /proc/cpuinfo, /proc/meminfo and /sys/devices/system/cpu (cpuid flags, cache sizes);",
        "#   [assumed] generic x86 figures (crossflow/calibrate.py: two FMA pipes per core, two vector",
        "#   loads per cycle from L1, 64 B/cycle L2 -> L1, 32 B/cycle L3 -> L2 per core; AMD Zen 5 values).",
        "# Fitted constants: compute efficiency, kernel launch, DRAM bandwidth.",
        "kind: microarch",
        f"name: {name or m.preset_name}",
        f"description: {m.model_name} ({m.uarch or 'unknown core'}), {m.cores} cores, numpy BLAS",
        "compute:",
        _line(f"  num_bundles: {m.cores}", "physical cores [os]"),
        _line(f"  mcus_per_bundle: {fma_pipes}", f"{bits}-bit FMA pipes per core [assumed]"),
        _line(f"  mcu_array: [1, {lanes32}]",
              f"one FMA instruction: a broadcast element times a {lanes32}-lane fp32 vector"),
        _line(f"  frequency_GHz: {_num(f / 1e9)}", f_src),
        "  peak_GFLOPS:                  # cores x pipes x lanes x 2 FLOP/FMA x clock",
        _line(f"    fp64: {_num(peak64 / 1e9)}",
              f"{m.cores} x {fma_pipes} x {lanes64} x 2 x {f / 1e9:.3f} GHz"),
        _line(f"    fp32: {_num(peak32 / 1e9)}",
              f"{m.cores} x {fma_pipes} x {lanes32} x 2 x {f / 1e9:.3f} GHz"),
        _line(f"  efficiency: {_num(eff, 3)}", eff_note),
        "  dataflow: best",
        "memory:",
        "  - name: registers",
        "    scope: mcu",
        _line(f"    capacity_B: {_num(reg_B)}",
              f"{m.vector_registers} x {vec_B} B vector registers per core / {fma_pipes} pipes [os]"),
        _line(f"    bandwidth_TBps: {_num(m.cores * fma_pipes * 4 * bits / 8 * f / 1e12)}",
              "3 source operands + 1 result per FMA per pipe per cycle"),
        _line("    loop_orders: [os]",
              "BLAS micro-kernels accumulate the C tile in registers (Goto & van de Geijn 2008)"),
    ]
    if l1:
        out += [
            "  - name: L1d",
            "    scope: bundle",
            _line(f"    capacity_KiB: {_num(l1.size_B / l1.cores_sharing / 2**10)}", "[os]"),
            _line(f"    bandwidth_GBps: {_num(m.cores * 2 * vec_B * f / 1e9)}",
                  f"2 x {vec_B} B loads/cycle/core [assumed] x {m.cores} cores x clock"),
        ]
    if l2:  # a core's share when several cores share one L2 (e.g. Intel E-core clusters)
        share = "" if l2.cores_sharing == 1 else f" (1/{l2.cores_sharing} of a shared L2)"
        out += [
            "  - name: L2",
            "    scope: bundle",
            _line(f"    capacity_KiB: {_num(l2.size_B / l2.cores_sharing / 2**10)}", f"[os]{share}"),
            _line(f"    bandwidth_GBps: {_num(m.cores * GENERIC_L2_B_PER_CYCLE * f / 1e9)}",
                  f"{GENERIC_L2_B_PER_CYCLE} B/cycle/core [assumed] x {m.cores} cores x clock"),
        ]
    if l3:
        out += [
            "  - name: L3",
            "    scope: global",
            _line(f"    capacity_MiB: {_num(l3.size_B * l3.instances / 2**20)}", "[os]"),
            _line(f"    bandwidth_GBps: {_num(m.cores * GENERIC_L3_B_PER_CYCLE * f / 1e9)}",
                  f"{GENERIC_L3_B_PER_CYCLE} B/cycle/core [assumed] x {m.cores} cores x clock"),
        ]
    out += [
        "  - name: DRAM",
        "    scope: global",
        _line(f"    capacity_GiB: {_num(m.mem_total_B / 2**30)}", "MemTotal [os]"),
        _line(f"    bandwidth_GBps: {_num(dram)}",
              f"[fit] STREAM {DRAM_KERNEL} on {threads} threads ({stream_csv}; 1 thread: "
              f"{dram_1:.1f}); sustained, so efficiency 1"),
        _line("    latency_ns: 100", "[ref] DeepFlow DRAM latency (shared/reference/deepflow)"),
        _line(f"kernel_launch_us: {_num(overhead * 1e6, 3)}",
              f"[fit] numpy call overhead: the 8x8x8 matmul ({gemm_csv})"),
    ]
    return "\n".join(out) + "\n"


# --- calibrate ----------------------------------------------------------------------------------


def _temp_beside(path: Path) -> Path:
    """An empty temporary file in ``path``'s folder (so the final rename is atomic)."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(name, 0o644)  # mkstemp makes it 0600; the result is an ordinary shared file
    return Path(name)


def calibrate_cpu(output: Path, *, quick: bool = False, fma_pipes: int = GENERIC_FMA_PIPES,
                  progress: Callable[[str], None] | None = None) -> Path:
    """Measure this machine and write a hardware preset for it; returns the preset's path.

    ``output`` is the preset YAML to write (or a folder, which gets ``<preset name>.yaml``).
    The GEMM and STREAM CSVs the preset cites are written beside it as
    ``numpy_gemm_<preset name>.csv`` and ``stream_<preset name>.csv``.  All three files are
    written to temporary files first and renamed into place only once everything has been
    measured and the preset validates, so nothing is ever left half-written.
    """
    from crossflow.config import build
    from crossflow.config.hardware import MicroArchSpec

    output = Path(output)
    meas = measure(quick=quick, command=f"crossflow.calibrate.calibrate_cpu({str(output)!r}, "
                   f"quick={quick})", progress=progress)
    if output.is_dir():
        output = output / f"{meas.machine.preset_name}.yaml"
    output.parent.mkdir(parents=True, exist_ok=True)
    gemm_path = output.parent / gemm_csv_name(output.stem)
    stream_path = output.parent / stream_csv_name(output.stem)
    text = preset_yaml(meas, gemm_path.name, stream_path.name, fma_pipes=fma_pipes,
                       name=output.stem)

    import yaml

    build(MicroArchSpec, yaml.safe_load(text), file=str(output))  # raises if it is not valid

    writers = ((gemm_path, lambda p: write_gemm_csv(p, meas, output.stem)),
               (stream_path, lambda p: write_stream_csv(p, meas, output.stem)),
               (output, lambda p: p.write_text(text, encoding="utf-8")))
    temps: list[tuple[Path, Path]] = []
    try:
        for final, write in writers:
            tmp = _temp_beside(final)
            temps.append((tmp, final))
            write(tmp)
        for tmp, final in temps:
            os.replace(tmp, final)
    finally:
        for tmp, _ in temps:
            tmp.unlink(missing_ok=True)
    return output
