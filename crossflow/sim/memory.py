"""Memory per device against capacity."""

from __future__ import annotations

from collections.abc import Mapping

from crossflow.arch.microarch import MicroArch
from crossflow.errors import InfeasibleDesignError
from crossflow.units import fmt_gb


def capacity_problem(arch: MicroArch, breakdown: Mapping[str, float],
                     where: str | None = None) -> str | None:
    """Why ``breakdown`` (bytes per device; on the device ``where`` names, e.g. "last
    pipeline stage") does not fit ``arch``'s main memory, or None."""
    used = sum(breakdown.values())
    capacity = arch.main_memory.total_capacity_B
    if used > capacity:
        shown = ", ".join(f"{_label(k)} {fmt_gb(v)}" for k, v in breakdown.items())
        return (f"memory per device {used / 1e9:.4g} GB exceeds the {capacity / 1e9:.4g} GB "
                f"of {arch.main_memory.name} on {arch.name} "
                f"({f'{where}: ' if where else ''}{shown})")
    return None


def _label(key: str) -> str:
    """A breakdown key as a reader says it: ``optimizer_state_bytes`` -> ``optimizer state``."""
    return key.removesuffix("_bytes").replace("_", " ")


def check_capacity(arch: MicroArch, breakdown: Mapping[str, float],
                   where: str | None = None) -> float:
    """Total bytes per device; InfeasibleDesignError (with the numbers) if over capacity."""
    problem = capacity_problem(arch, breakdown, where)
    used = sum(breakdown.values())
    if problem is not None:
        raise InfeasibleDesignError(problem, memory_bytes=used)
    return used
