"""`MicroArch`: what the performance model knows about one accelerator (all SI).

A `MicroArch` comes either from a datasheet preset (``presets/hardware/*.yaml``,
:meth:`crossflow.config.hardware.MicroArchSpec.to_microarch`) or from the
micro-architecture generator (the AGE, in the arch layer) applied to a template, technology
and budgets.  The kernel model prices operations against it and never looks at configs.

These value types live in the config layer because the hardware and template configs
validate against them (precisions, scopes) and build them; everything else imports them
through the arch layer, which re-exports them (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Literal

Precision = Literal["fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "fp4"]
PRECISIONS: tuple[str, ...] = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "fp4")
#: Bytes per element as stored in memory.  TF32 is an fp32 storage format computed on
#: tensor cores at reduced mantissa (NVIDIA A100 whitepaper, "TF32"), so it moves 4 bytes.
#: fp4 is NVFP4, the only 4-bit format Megatron-Core trains with (``--fp4-format e2m1``,
#: recipe ``nvfp4``): E2M1 elements with one E4M3 scale per block of 16 (NVIDIA,
#: "Pretraining Large Language Models with NVFP4", arXiv:2509.25149, §2), so an element and
#: its share of the scale move 4/8 + 1/16 = 0.5625 bytes.
BYTES_PER_ELEMENT: Mapping[str, float] = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2,
                                          "fp8": 1, "fp4": 0.5625}
#: Accumulator bytes: all listed formats accumulate GEMMs in fp32 on current hardware
#: (A100 / H100 whitepapers, "FP32 accumulate"); fp64 accumulates in fp64.
ACCUMULATOR_BYTES: Mapping[str, int] = {p: 8 if p == "fp64" else 4 for p in PRECISIONS}

Scope = Literal["mcu", "bundle", "global"]
SCOPES: tuple[str, ...] = ("mcu", "bundle", "global")


@dataclass(frozen=True, slots=True)
class AttentionKernel:
    """A device's fused (flash) attention kernels, measured: the products run at a share
    of the precision's peak, and every query row (per batch element and head) costs a fixed
    time on top, which the kernel spends whatever the row's length (loading its query tile,
    the softmax's final rescale, writing its output): short sequences and small heads reach
    less of the peak.  Forward (QKᵀ, PV) and backward (scores recomputed, dV, dP, dQ, dK)
    each have their own pair.
    """

    forward_efficiency: float
    backward_efficiency: float
    forward_row_s: float
    backward_row_s: float
    #: (head dim, forward, backward): the efficiencies' multipliers at the head dimensions
    #: measured, sorted — a library picks its kernel's tiles per head dimension, and its
    #: backward especially reaches less of the peak off the dimension it is tuned for
    head_dims: tuple[tuple[int, float, float], ...] = ()

    def head_dim_factor(self, head_dim: int, forward: bool) -> float:
        """The efficiency's multiplier at ``head_dim``: a measured dimension's own,
        interpolated in log(head dim) between the two measured around it, the nearest
        one's beyond them (1 where nothing was measured)."""
        table = self.head_dims
        if not table:
            return 1.0
        col = 1 if forward else 2
        if head_dim <= table[0][0]:
            return table[0][col]
        for lo, hi in zip(table, table[1:], strict=False):
            if head_dim <= hi[0]:
                w = math.log(head_dim / lo[0]) / math.log(hi[0] / lo[0])
                return lo[col] + w * (hi[col] - lo[col])
        return table[-1][col]


@dataclass(frozen=True, slots=True, eq=False)
class MemoryLevel:
    """One level of the memory hierarchy.

    Attributes:
        name: e.g. ``"registers"``, ``"L1"``, ``"L2"``, ``"DRAM"``.
        scope: who shares one instance: one MCU, one bundle (SM / core) or the whole chip.
        capacity_B: bytes of *one* instance.
        instances: how many instances the chip has (MCUs, bundles or 1).
        bandwidth_Bps: peak bandwidth of all instances together.
        efficiency: sustained fraction of ``bandwidth_Bps`` (a fitted or datasheet number).
        latency_s: access latency added once to a kernel that is bound by this level.
        energy_J_per_B: dynamic energy per byte read or written.
        loop_orders: dataflows a tile held in this level may use (``ws``, ``os``, ``as``;
            paper §4.2.1); hardware that only accumulates output-stationary says so here.
    """

    name: str
    scope: Scope
    capacity_B: float
    instances: int
    bandwidth_Bps: float
    efficiency: float = 1.0
    latency_s: float = 0.0
    energy_J_per_B: float = 0.0
    loop_orders: tuple[str, ...] = ("ws", "os", "as")

    @property
    def total_capacity_B(self) -> float:
        return self.capacity_B * self.instances

    @property
    def effective_bandwidth_Bps(self) -> float:
        return self.bandwidth_Bps * self.efficiency


@dataclass(frozen=True, slots=True, eq=False)
class Link:
    """The off-chip links of one kind on one device (e.g. all NVLinks, all IB ports).

    ``bandwidth_Bps`` is per direction, all links of this kind together.
    """

    name: str
    count: int
    bandwidth_Bps: float
    latency_s: float
    energy_J_per_B: float = 0.0
    efficiency: float = 1.0


@dataclass(frozen=True, slots=True, eq=False)
class MicroArch:
    """An accelerator as the performance model sees it.

    Attributes:
        name: preset name or a generated label.
        num_bundles: compute bundles (SMs, CPU cores) that share nothing below global scope.
        mcus_per_bundle: minimal compute units (tensor cores, SIMD FMA pipes) per bundle.
        mcu_rows, mcu_cols: the MCU's systolic / MMA array, the N_x and N_y of paper eq. 5.
        frequency_Hz: operating clock.
        peak_flops: dense peak FLOP/s of the whole chip per precision; a precision missing
            here is not supported by the device.
        compute_efficiency: sustained fraction of peak (paper §4.2.1 "maximum utilization").
        memory: levels from the innermost (registers) to main memory, outermost last.
        links: off-chip links by kind (``"intra"`` within a node, ``"inter"`` between nodes).
        kernel_launch_s: fixed cost of launching one kernel.
        energy_J_per_flop: dynamic compute energy per FLOP per precision.
        dataflow: MCU dataflow: ``"ws"``, ``"os"``, ``"as"`` or ``"best"`` (paper §6.3).
        accumulator_fraction: share of the register file an output-stationary tile may fill
            with accumulators (the rest holds operand fragments).
        memory_bound_efficiency: sustained fraction of a level's peak bandwidth that
            streaming (elementwise, softmax, …) kernels reach; None: the level's own
            ``efficiency``.  A software stack's kernels set it (system presets).
        kernel_min_s: the shortest time any kernel runs on the device (a software
            profile's ``kernel_min``; 0: the roofline alone).
        memory_passes: op name (layernorm, softmax, elementwise, embedding) -> bytes moved
            as a multiple of one fused pass (a software profile's ``memory_passes``).
        attention_efficiency: sustained fraction of peak of a fused (flash) attention
            kernel; None: the kernel layer's default fraction (FLASH_RELATIVE_EFFICIENCY) of
            ``compute_efficiency``.  A software profile sets it.
        precision_efficiency: precision -> GEMM efficiency where it differs from
            ``compute_efficiency``: the device's own (a hardware preset's measured fp8
            matmul rate), replaced by a software profile's (its FP8 GEMMs) under a system.
        attention_kernel: the device's own fused attention kernels, measured (a hardware
            preset's ``attention``); used where no software profile gives an
            ``attention_efficiency``.
        report: how the chip was derived (AGE area/power use, datasheet sources) for output.
    """

    name: str
    num_bundles: int
    mcus_per_bundle: int
    mcu_rows: int
    mcu_cols: int
    frequency_Hz: float
    peak_flops: Mapping[str, float]
    compute_efficiency: float
    memory: tuple[MemoryLevel, ...]
    links: Mapping[str, Link] = field(default_factory=dict)
    kernel_launch_s: float = 0.0
    energy_J_per_flop: Mapping[str, float] = field(default_factory=dict)
    dataflow: str = "best"
    accumulator_fraction: float = 0.5
    memory_bound_efficiency: float | None = None
    kernel_min_s: float = 0.0
    memory_passes: Mapping[str, float] = field(default_factory=dict)
    attention_efficiency: float | None = None
    precision_efficiency: Mapping[str, float] = field(default_factory=dict)
    attention_kernel: AttentionKernel | None = None
    tdp_W: float | None = None
    report: Mapping[str, object] = field(default_factory=dict)

    @property
    def num_mcus(self) -> int:
        return self.num_bundles * self.mcus_per_bundle

    @property
    def main_memory(self) -> MemoryLevel:
        return self.memory[-1]

    def with_bundles(self, bundles: int) -> MicroArch:
        """The same chip using only ``bundles`` of its bundles (e.g. one CPU core).

        Peak FLOP/s and the bandwidth of bundle- and MCU-scope levels scale with the bundles
        used; chip-global levels keep their bandwidth.
        """
        if not 1 <= bundles <= self.num_bundles:
            raise ValueError(f"1 <= bundles <= {self.num_bundles} must hold, got {bundles}")
        share = bundles / self.num_bundles
        memory = tuple(
            level if level.scope == "global" else replace(
                level,
                instances=level.instances * bundles // self.num_bundles,
                bandwidth_Bps=level.bandwidth_Bps * share,
            )
            for level in self.memory
        )
        return replace(
            self,
            name=f"{self.name}[{bundles} of {self.num_bundles} bundles]",
            num_bundles=bundles,
            peak_flops={p: v * share for p, v in self.peak_flops.items()},
            memory=memory,
        )

    def supports(self, precision: str) -> bool:
        return self.peak_flops.get(precision, 0.0) > 0.0

    def model_key(self) -> str:
        """Every field the performance model reads, as one string: two chips with equal
        keys give every workload the same prediction.  Leaves out ``name`` and
        ``report`` (how the chip was derived), so two budget splits that the AGE turns
        into the same whole units are one chip."""
        return repr([getattr(self, f.name) for f in fields(self)
                     if f.name not in ("name", "report")])

    def to_dict(self) -> dict[str, object]:
        """JSON-ready description (SI units, unit-suffixed keys)."""
        return {
            "name": self.name,
            "num_bundles": self.num_bundles,
            "mcus_per_bundle": self.mcus_per_bundle,
            "num_mcus": self.num_mcus,
            "mcu_array": [self.mcu_rows, self.mcu_cols],
            "frequency_Hz": self.frequency_Hz,
            "peak_flops_per_s": dict(self.peak_flops),
            "compute_efficiency": self.compute_efficiency,
            "precision_efficiency": dict(self.precision_efficiency),
            "attention_kernel": (None if self.attention_kernel is None else {
                "forward_efficiency": self.attention_kernel.forward_efficiency,
                "backward_efficiency": self.attention_kernel.backward_efficiency,
                "forward_row_s": self.attention_kernel.forward_row_s,
                "backward_row_s": self.attention_kernel.backward_row_s,
                "head_dims": [list(t) for t in self.attention_kernel.head_dims]}),
            "memory": [
                {
                    "name": m.name,
                    "scope": m.scope,
                    "capacity_per_instance_bytes": m.capacity_B,
                    "instances": m.instances,
                    "bandwidth_Bps": m.bandwidth_Bps,
                    "efficiency": m.efficiency,
                    "latency_s": m.latency_s,
                    "energy_J_per_byte": m.energy_J_per_B,
                    "loop_orders": list(m.loop_orders),
                }
                for m in self.memory
            ],
            "links": {
                k: {
                    "count": v.count,
                    "bandwidth_per_direction_Bps": v.bandwidth_Bps,
                    "latency_s": v.latency_s,
                    "energy_J_per_byte": v.energy_J_per_B,
                }
                for k, v in self.links.items()
            },
            "kernel_launch_s": self.kernel_launch_s,
            "energy_J_per_flop": dict(self.energy_J_per_flop),
            "dataflow": self.dataflow,
            "accumulator_fraction": self.accumulator_fraction,
            "memory_bound_efficiency": self.memory_bound_efficiency,
            "kernel_min_s": self.kernel_min_s,
            "memory_passes": dict(self.memory_passes),
            "tdp_W": self.tdp_W,
            "report": dict(self.report),
        }
