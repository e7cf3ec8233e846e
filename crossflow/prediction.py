"""What a prediction returns: :class:`Prediction`, and :func:`infeasible` for a design that
cannot run.

The prediction facade's two modules, :mod:`crossflow.predict` (one device) and
:mod:`crossflow.distributed` (a strategy on a system), both build these; this module sits
below both (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Prediction:
    """The outcome of one prediction.

    Attributes:
        workload: the workload's name.
        hardware: the name of the device the prediction ran on.
        time_s: seconds per kernel (GEMM workloads) or per training iteration; ``inf`` when
            the design is infeasible.
        feasible: False when the design cannot run (see ``reason``).
        memory_per_device_bytes: bytes resident on one device.
        bottleneck: what limits the time (``"compute"``, a memory level, a link, …).
        breakdown: seconds per component of ``time_s``.
        details: everything else worth showing (kernel tiles, bytes per level, the chip).
        device_overrides_system: True when ``hardware`` was given with a system that names
            a different device: the system's links and software with this device.
        notes: sentences about how the inputs were read (where the device came from, an
            override), shown by ``crossflow predict``.
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
    device_overrides_system: bool = False
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``crossflow predict --json`` prints (inf becomes null)."""
        return {
            "workload": self.workload,
            "hardware": self.hardware,
            "device_overrides_system": self.device_overrides_system,
            "notes": list(self.notes),
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


def infeasible(spec, hardware_name: str, reason: str, memory: float | None) -> Prediction:
    """The Prediction of a design that cannot run: ``time_s`` inf and the reason."""
    return Prediction(
        workload=spec.name, hardware=hardware_name, time_s=math.inf, feasible=False,
        memory_per_device_bytes=memory or 0.0, bottleneck="infeasible", breakdown={},
        reason=reason,
    )
