"""What pricing one kernel returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class KernelResult:
    """Time and traffic of one kernel on one device.

    Attributes:
        name: the kernel ("gemm", "softmax", …).
        time_s: predicted wall time, launch overhead and repetitions included.
        flops: floating-point operations (2 per multiply-add), all repetitions.
        compute_time_s: time the arithmetic alone needs (after tile and wave quantisation).
        bytes_per_level: bytes read or written at each memory level (by level name).
        time_per_level_s: bytes / sustained bandwidth + latency, per level.
        bottleneck: ``"compute"``, a memory level's name, or ``"launch"``.
        launch_s: launch overhead included in ``time_s``.
        energy_J: dynamic energy (arithmetic + data movement).
        detail: how the time was reached (tiles, loop orders, waves …), for reports.
    """

    name: str
    time_s: float
    flops: float
    compute_time_s: float
    bytes_per_level: Mapping[str, float]
    time_per_level_s: Mapping[str, float]
    bottleneck: str
    launch_s: float
    energy_J: float
    detail: Mapping[str, object] = field(default_factory=dict)

    @property
    def achieved_flops(self) -> float:
        return self.flops / self.time_s if self.time_s > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "kernel": self.name,
            "time_s": self.time_s,
            "flops": self.flops,
            "achieved_flops_per_s": self.achieved_flops,
            "compute_time_s": self.compute_time_s,
            "bytes_per_level": dict(self.bytes_per_level),
            "time_per_level_s": dict(self.time_per_level_s),
            "bottleneck": self.bottleneck,
            "launch_s": self.launch_s,
            "energy_J": self.energy_J,
            "detail": dict(self.detail),
        }
