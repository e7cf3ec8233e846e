"""The prediction facade: specs in, one `Prediction` out (DESIGN.md §7).

    >>> import crossflow
    >>> p = crossflow.predict(workload={"kind": "gemm", "m": 8192, "k": 8192, "n": 8192},
    ...                       hardware="a100-sxm4-80gb")
    >>> p.feasible, p.bottleneck
    (True, 'compute')
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from crossflow.arch.microarch import BYTES_PER_ELEMENT, MicroArch
from crossflow.config.base import Spec
from crossflow.config.loader import load_spec
from crossflow.errors import ConfigError, InfeasibleDesignError

Source = str | Path | Mapping[str, Any] | Spec


@dataclass(frozen=True)
class Prediction:
    """The outcome of one prediction.

    Attributes:
        time_s: seconds per kernel (GEMM workloads) or per training iteration; ``inf`` when
            the design is infeasible.
        feasible: False when the design cannot run (see ``reason``).
        memory_per_device_bytes: bytes resident on one device.
        bottleneck: what limits the time (``"compute"``, a memory level, a link, …).
        breakdown: seconds per component of ``time_s``.
        details: everything else worth showing (kernel tiles, bytes per level, the chip).
    """

    workload: str
    hardware: str
    time_s: float
    feasible: bool
    memory_per_device_bytes: float
    bottleneck: str
    breakdown: Mapping[str, float]
    achieved_flops_per_s: float = 0.0
    energy_J: float = 0.0
    reason: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``crossflow predict --json`` prints (inf becomes null)."""
        return {
            "workload": self.workload,
            "hardware": self.hardware,
            "time_s": self.time_s if math.isfinite(self.time_s) else None,
            "feasible": self.feasible,
            "reason": self.reason,
            "memory_per_device_bytes": self.memory_per_device_bytes,
            "bottleneck": self.bottleneck,
            "achieved_flops_per_s": self.achieved_flops_per_s,
            "energy_J": self.energy_J,
            "breakdown": dict(self.breakdown),
            **self.details,
        }


def load_hardware(hardware: Source | MicroArch) -> MicroArch:
    """A MicroArch from a preset name, a path or dict (a preset or an AGE template)."""
    if isinstance(hardware, MicroArch):
        return hardware
    if isinstance(hardware, str | Path):
        return _load_named_hardware(str(hardware))
    return _microarch(hardware if isinstance(hardware, Spec)
                      else load_spec(hardware, "hardware", "templates"))


@lru_cache(maxsize=64)
def _load_named_hardware(source: str) -> MicroArch:
    """One MicroArch per preset name or path, so kernel prices cached per device are reused
    across predictions (a search calls predict thousands of times)."""
    return _microarch(load_spec(source, "hardware", "templates"))


def _microarch(spec: Spec) -> MicroArch:
    if hasattr(spec, "to_microarch"):
        return spec.to_microarch()
    from crossflow.arch.age import generate  # AGE: template + technology + budgets

    try:
        return generate(spec)
    except ConfigError as exc:  # e.g. a technology name the library does not have
        raise exc.with_file(spec.source_file) if spec.source_file else exc from None


def predict(
    workload: Source,
    hardware: Source | MicroArch,
    system: Source | None = None,
    parallelism: Source | None = None,
    mapping_order: str | None = None,
) -> Prediction:
    """Predict ``workload`` on ``hardware`` (and, for distributed workloads, ``system``).

    Bad input raises :class:`~crossflow.errors.ConfigError`.  A design that cannot run
    (memory over capacity, no tiling fits, an impossible budget) is returned with
    ``feasible=False`` and the reason, so searches can record it and go on.
    """
    try:
        arch = load_hardware(hardware)
    except InfeasibleDesignError as exc:
        spec = load_spec(workload, "workloads")
        return infeasible(spec, str(getattr(hardware, "name", hardware)), str(exc), None)
    spec = load_spec(workload, "workloads")
    if spec.kind == "gemm" and parallelism is None:
        if system is not None or mapping_order is not None:
            raise ConfigError(
                "a single GEMM runs on one device; --system and --mapping-order apply with "
                "a --parallelism strategy",
                key="kind", value=spec.kind,
            )
        return _predict_gemm(spec, arch)
    from crossflow.distributed import predict_distributed

    return predict_distributed(spec, arch, system=system, parallelism=parallelism,
                               mapping_order=mapping_order)


def infeasible(spec, hardware_name: str, reason: str, memory: float | None) -> Prediction:
    return Prediction(
        workload=spec.name, hardware=hardware_name, time_s=math.inf, feasible=False,
        memory_per_device_bytes=memory or 0.0, bottleneck="infeasible", breakdown={},
        reason=reason,
    )


def _predict_gemm(spec, arch: MicroArch) -> Prediction:
    from crossflow.kernels.gemm import check_precision, gemm

    check_precision(arch, spec.precision)
    b = BYTES_PER_ELEMENT[spec.precision]
    memory = float((spec.m * spec.k + spec.k * spec.n + spec.m * spec.n) * b)
    capacity = arch.main_memory.total_capacity_B
    if memory > capacity:
        return infeasible(
            spec, arch.name,
            f"A, B and C need {memory:.4g} B but {arch.main_memory.name} holds {capacity:.4g} B",
            memory,
        )
    try:
        result = gemm(arch, spec.m, spec.k, spec.n, spec.precision, spec.count)
    except InfeasibleDesignError as exc:
        return infeasible(spec, arch.name, str(exc), memory)
    breakdown = {"compute_s": result.compute_time_s, "launch_s": result.launch_s}
    breakdown.update({f"{name}_s": t for name, t in result.time_per_level_s.items()})
    return Prediction(
        workload=spec.name,
        hardware=arch.name,
        time_s=result.time_s,
        feasible=True,
        memory_per_device_bytes=memory,
        bottleneck=result.bottleneck,
        breakdown=breakdown,
        achieved_flops_per_s=result.achieved_flops,
        energy_J=result.energy_J,
        details={
            "flops": result.flops,
            "bytes_per_level": dict(result.bytes_per_level),
            "time_per_level_s": dict(result.time_per_level_s),
            "kernel": dict(result.detail),
            "microarch": arch.to_dict(),
        },
    )
