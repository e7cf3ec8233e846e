"""Units: SI inside, unit-suffixed keys outside (docs/architecture.md, "Units and conventions").

Every quantity in a config file carries its unit in the key (``bandwidth_GBps``,
``capacity_GiB``, ``latency_us``).  The loader converts each such key once, to the SI
*canonical* suffix of its dimension (``bandwidth_Bps``, ``capacity_B``, ``latency_s``), and
model code only ever sees SI values.  Decimal prefixes are decimal (GB = 1e9 bytes) and binary
prefixes are binary (GiB = 2**30 bytes), always.
"""

from __future__ import annotations

from dataclasses import dataclass

# Bytes -------------------------------------------------------------------------------------
B = 1.0
KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12
KiB, MiB, GiB, TiB = 2.0**10, 2.0**20, 2.0**30, 2.0**40
# Time --------------------------------------------------------------------------------------
s, ms, us, ns = 1.0, 1e-3, 1e-6, 1e-9
# Frequency ---------------------------------------------------------------------------------
Hz, kHz, MHz, GHz = 1.0, 1e3, 1e6, 1e9
# Energy ------------------------------------------------------------------------------------
J, mJ, nJ, pJ, fJ = 1.0, 1e-3, 1e-9, 1e-12, 1e-15
# Rates -------------------------------------------------------------------------------------
GFLOPS, TFLOPS, PFLOPS = 1e9, 1e12, 1e15


@dataclass(frozen=True, slots=True)
class Dimension:
    """A physical dimension: its name, the SI suffix used internally, and accepted suffixes."""

    name: str
    canonical: str
    factors: dict[str, float]

    def describe(self) -> str:
        return f"{self.name} ({', '.join(self.factors)})"


def _d(name: str, canonical: str, **factors: float) -> Dimension:
    # Python identifiers cannot start with a digit or contain '/', so suffixes are
    # written plainly; the dictionary keeps the user-facing spelling.
    return Dimension(name, canonical, dict(factors))


DIMENSIONS: tuple[Dimension, ...] = (
    _d("bytes", "B", B=B, KB=KB, MB=MB, GB=GB, TB=TB, KiB=KiB, MiB=MiB, GiB=GiB, TiB=TiB),
    _d(
        "bandwidth",
        "Bps",
        Bps=1.0, KBps=KB, MBps=MB, GBps=GB, TBps=TB, KiBps=KiB, MiBps=MiB, GiBps=GiB,
        TiBps=TiB, Gbps=GB / 8, Tbps=TB / 8,
    ),
    _d("time", "s", s=s, ms=ms, us=us, ns=ns),
    _d("frequency", "Hz", Hz=Hz, kHz=kHz, MHz=MHz, GHz=GHz),
    _d("power", "W", W=1.0, mW=1e-3, kW=1e3),
    _d("energy", "J", J=J, mJ=mJ, nJ=nJ, pJ=pJ, fJ=fJ),
    _d(
        "energy per bit",
        "J_per_bit",
        J_per_bit=1.0, nJ_per_bit=nJ, pJ_per_bit=pJ, fJ_per_bit=fJ,
    ),
    _d("energy per FLOP", "J_per_FLOP", J_per_FLOP=1.0, pJ_per_FLOP=pJ, fJ_per_FLOP=fJ),
    _d(
        "static power per bit",
        "W_per_bit",
        W_per_bit=1.0, nW_per_bit=1e-9, pW_per_bit=1e-12,
    ),
    _d("area", "mm2", mm2=1.0, um2=1e-6, cm2=100.0),
    _d("area per bit", "mm2_per_bit", mm2_per_bit=1.0, um2_per_bit=1e-6),
    _d("length", "mm", mm=1.0, um=1e-3, cm=10.0),
    _d("voltage", "V", V=1.0, mV=1e-3),
    _d("compute rate", "FLOPS", FLOPS=1.0, GFLOPS=GFLOPS, TFLOPS=TFLOPS, PFLOPS=PFLOPS),
    _d("link density", "per_mm", per_mm=1.0),
)

#: suffix -> (dimension, factor to SI)
_SUFFIX: dict[str, tuple[Dimension, float]] = {
    suffix: (dim, factor) for dim in DIMENSIONS for suffix, factor in dim.factors.items()
}
#: canonical SI suffix -> dimension
CANONICAL: dict[str, Dimension] = {dim.canonical: dim for dim in DIMENSIONS}
# Longest suffix first so that "pJ_per_bit" wins over "bit"-less "J" style matches.
_SUFFIXES_BY_LENGTH = sorted(_SUFFIX, key=len, reverse=True)


def split_unit(key: str) -> tuple[str, str] | None:
    """Split ``"bandwidth_GBps"`` into ``("bandwidth", "GBps")``; None if no unit suffix."""
    for suffix in _SUFFIXES_BY_LENGTH:
        if key.endswith("_" + suffix) and len(key) > len(suffix) + 1:
            return key[: -len(suffix) - 1], suffix
    return None


def dimension_of(suffix: str) -> Dimension:
    return _SUFFIX[suffix][0]


def to_si(value: float, suffix: str) -> float:
    """Convert ``value`` given in unit ``suffix`` to SI (the dimension's canonical unit)."""
    return value * _SUFFIX[suffix][1]


def canonical_key(key: str) -> str | None:
    """The SI spelling of a unit-suffixed key: ``"latency_us"`` -> ``"latency_s"``."""
    parts = split_unit(key)
    if parts is None:
        return None
    base, suffix = parts
    return f"{base}_{dimension_of(suffix).canonical}"


# --- human formatting at the edge (CLI, reports) ----------------------------------------------


def fmt_plain(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, never in exponent form at or above 1:
    349, 2099 (not 2.1e+03), 4.83, 0.205 — numbers printed side by side stay comparable."""
    if abs(value) >= 10 ** digits:
        return f"{value:.0f}"
    return f"{value:.{digits}g}"


def _scaled(value: float, steps: tuple[tuple[float, str], ...], unit: str) -> str:
    if value == 0:
        return f"0 {unit}"
    for factor, prefix in steps:
        if abs(value) >= factor:
            return f"{fmt_plain(value / factor)} {prefix}{unit}"
    factor, prefix = steps[-1]
    return f"{fmt_plain(value / factor)} {prefix}{unit}"


def fmt_time(seconds: float) -> str:
    return _scaled(seconds, ((1.0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n")), "s")


def fmt_bytes(n: float) -> str:
    return _scaled(n, ((TB, "T"), (GB, "G"), (MB, "M"), (KB, "k"), (1.0, "")), "B")


def fmt_rate(flops: float) -> str:
    return _scaled(flops, ((PFLOPS, "P"), (TFLOPS, "T"), (GFLOPS, "G"), (1.0, "")), "FLOP/s")


def fmt_energy(joules: float) -> str:
    return _scaled(joules, ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (mJ, "m"),
                            (1e-6, "µ"), (nJ, "n")), "J")


def fmt_gb(n: float) -> str:
    """Bytes in GB, whatever the size (a list of memory terms reads in one unit)."""
    return f"{fmt_plain(n / GB)} GB"
