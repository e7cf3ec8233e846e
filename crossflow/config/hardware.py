"""Micro-architecture presets: a real device described directly from its datasheet.

File shape (``presets/hardware/*.yaml``)::

    kind: microarch
    name: a100-sxm4-80gb
    compute: {num_bundles, mcus_per_bundle, mcu_array, frequency_GHz, peak_TFLOPS: {fp16: …},
              efficiency, precision_efficiency: {fp8: …}, dataflow, energy_pJ_per_FLOP: {…}}
    memory:  [{name, scope, capacity_<bytes unit>, bandwidth_<bandwidth unit>, efficiency,
               latency_<time unit>, energy_pJ_per_bit}, …]   # innermost first
    links:   {intra: {count, bandwidth_GBps, latency_us, energy_pJ_per_bit}, inter: {…}}
    kernel_launch_us: …
    attention: {forward_efficiency, backward_efficiency, forward_row_ns, backward_row_ns}
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from crossflow.config.base import Spec
from crossflow.config.device import (
    PRECISIONS,
    SCOPES,
    AttentionKernel,
    Link,
    MemoryLevel,
    MicroArch,
    Precision,
)
from crossflow.errors import ConfigError

Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
Count = Annotated[int, Field(ge=1)]


class ComputeSpec(Spec):
    num_bundles: Count
    mcus_per_bundle: Count
    mcu_array: tuple[Count, Count]
    frequency_Hz: Positive
    peak_FLOPS: dict[Precision, Positive]
    efficiency: Fraction = 1.0
    #: GEMM efficiency of a precision whose kernels sustain a different share of its peak
    #: (Hopper's fp8 matmuls: a lower one); the others use ``efficiency``.
    precision_efficiency: dict[Precision, Fraction] = Field(default_factory=dict)
    dataflow: Literal["ws", "os", "as", "best"] = "best"
    accumulator_fraction: Fraction = 0.5
    energy_J_per_FLOP: dict[Precision, NonNegative] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _has_a_precision(self) -> ComputeSpec:
        if not self.peak_FLOPS:
            raise ValueError(f"peak_TFLOPS must name at least one of {', '.join(PRECISIONS)}")
        return self


class MemoryLevelSpec(Spec):
    name: str
    scope: Literal["mcu", "bundle", "global"]
    capacity_B: Positive
    bandwidth_Bps: Positive
    efficiency: Fraction = 1.0
    latency_s: NonNegative = 0.0
    energy_J_per_bit: NonNegative = 0.0
    loop_orders: tuple[Literal["ws", "os", "as"], ...] = Field(
        default=("ws", "os", "as"), min_length=1
    )


class LinkSpec(Spec):
    count: Count
    bandwidth_Bps: Positive  # per direction, all links of this kind together
    latency_s: NonNegative
    energy_J_per_bit: NonNegative = 0.0
    efficiency: Fraction = 1.0


class AttentionSpec(Spec):
    """Measured fused attention kernels (:class:`~crossflow.config.device.AttentionKernel`)."""

    forward_efficiency: Fraction
    backward_efficiency: Fraction
    forward_row_s: NonNegative
    backward_row_s: NonNegative
    #: head dimension -> [forward, backward] multipliers of the two efficiencies
    head_dim_efficiency: dict[Annotated[int, Field(gt=0)],
                              Annotated[list[Annotated[float, Field(gt=0)]],
                                        Field(min_length=2, max_length=2)]] = Field(
        default_factory=dict)


class MicroArchSpec(Spec):
    kind: Literal["microarch"]
    name: str
    description: str = ""
    compute: ComputeSpec
    memory: tuple[MemoryLevelSpec, ...] = Field(min_length=2)
    links: dict[Literal["intra", "inter"], LinkSpec] = Field(default_factory=dict)
    kernel_launch_s: NonNegative = 0.0
    attention: AttentionSpec | None = None
    tdp_W: Positive | None = None

    @model_validator(mode="after")
    def _scopes_widen_outwards(self) -> MicroArchSpec:
        names = [level.name for level in self.memory]
        for i, name in enumerate(names):
            if names.index(name) != i:  # levels are keyed by name in every breakdown
                raise ConfigError(
                    f"memory level name {name!r} is also memory[{names.index(name)}]'s: each "
                    "level is reported (time, traffic, energy) under its name, so names must "
                    "be unique", key=f"memory[{i}].name", value=name,
                    allowed=f"a name other than {', '.join(repr(n) for n in names[:i])}")
        order = [SCOPES.index(level.scope) for level in self.memory]
        if order != sorted(order):
            raise ValueError(
                "memory levels must go from the innermost (scope mcu) to the outermost "
                f"(scope global), but the scopes are {[m.scope for m in self.memory]}"
            )
        if self.memory[-1].scope != "global":
            raise ValueError("the last memory level (main memory) must have scope 'global'")
        return self

    def to_microarch(self) -> MicroArch:
        c = self.compute
        instances = {"mcu": c.num_bundles * c.mcus_per_bundle, "bundle": c.num_bundles, "global": 1}
        return MicroArch(
            name=self.name,
            num_bundles=c.num_bundles,
            mcus_per_bundle=c.mcus_per_bundle,
            mcu_rows=c.mcu_array[0],
            mcu_cols=c.mcu_array[1],
            frequency_Hz=c.frequency_Hz,
            peak_flops=dict(c.peak_FLOPS),
            compute_efficiency=c.efficiency,
            precision_efficiency=dict(c.precision_efficiency),
            memory=tuple(
                MemoryLevel(
                    name=m.name,
                    scope=m.scope,
                    capacity_B=m.capacity_B,
                    instances=instances[m.scope],
                    bandwidth_Bps=m.bandwidth_Bps,
                    efficiency=m.efficiency,
                    latency_s=m.latency_s,
                    energy_J_per_B=m.energy_J_per_bit * 8,
                    loop_orders=tuple(m.loop_orders),
                )
                for m in self.memory
            ),
            links={
                k: Link(
                    name=k,
                    count=v.count,
                    bandwidth_Bps=v.bandwidth_Bps,
                    latency_s=v.latency_s,
                    energy_J_per_B=v.energy_J_per_bit * 8,
                    efficiency=v.efficiency,
                )
                for k, v in self.links.items()
            },
            kernel_launch_s=self.kernel_launch_s,
            attention_kernel=(None if self.attention is None else AttentionKernel(
                **self.attention.model_dump(exclude={"head_dim_efficiency"}),
                head_dims=tuple(sorted((d, *f) for d, f in
                                       self.attention.head_dim_efficiency.items())))),
            energy_J_per_flop=dict(c.energy_J_per_FLOP),
            dataflow=c.dataflow,
            accumulator_fraction=c.accumulator_fraction,
            tdp_W=self.tdp_W,
            report={"source": "preset", "description": self.description},
        )
