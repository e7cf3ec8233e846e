"""The CPU as the OS describes it: /proc/cpuinfo, /proc/meminfo, /sys cache topology, lscpu.

:func:`machine` returns a :class:`Machine` (model, core generation, physical cores in this
process's affinity, SIMD flags, caches, memory); its :attr:`Machine.preset_name` names the
preset ``crossflow calibrate cpu`` writes.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

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

