"""Technology library files (``presets/tech/*.yaml``, ``kind: technology``; paper §4.1, Table 2).

One file may hold any of four sections, each a mapping from a technology name to its numbers::

    kind: technology
    logic_scaling: {order: [N12, N7, …], area_divisor_per_node, power_divisor_per_node}
    logic: {N12: {mcu_array, mcu_flops_per_cycle, mcu_area_mm2, mcu_power_W, frequency_GHz,
                  nominal_voltage_V, threshold_voltage_V, min_voltage_V, max_voltage_V}}
    sram:  {sram-l2: {node, bank_capacity_KiB, cell_area_um2_per_bit, periphery_overhead,
                      static_power_pW_per_bit, dynamic_energy_fJ_per_bit,
                      crossbar_area_per_port_mm2, port_bytes_per_cycle, latency_ns,
                      area_divisor_per_node, power_divisor_per_node}}
    dram:  {HBM3: {capacity_GiB, device_area_mm2, controller_area_mm2, links_per_device,
                   link_rate_Gbps, link_density_per_mm, energy_pJ_per_bit,
                   static_power_pW_per_bit, latency_ns, <voltages>}}
    links: {NVLink4: {lane_rate_Gbps, lanes_per_port, energy_pJ_per_bit, lane_area_mm2,
                      lane_density_per_mm, latency_us, efficiency, <voltages>}}

Numbers are at the technology's nominal voltage and frequency; the technology library (the tech layer) merges
all files, derives the logic nodes not listed from the scaling rule and scales SRAM to a node.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from crossflow.config.base import Spec
from crossflow.config.device import Precision

Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
Overhead = Annotated[float, Field(ge=0, lt=1)]
Count = Annotated[int, Field(ge=1)]
Divisor = Annotated[float, Field(ge=1)]


class VoltageRangeSpec(Spec):
    """The voltage–frequency law of a component (paper §4.4.1): P ∝ f·V², f ∝ (V−Vt)²/V."""

    nominal_voltage_V: Positive
    threshold_voltage_V: NonNegative
    min_voltage_V: Positive
    max_voltage_V: Positive

    @model_validator(mode="after")
    def _ordered(self) -> VoltageRangeSpec:
        vt, vmin = self.threshold_voltage_V, self.min_voltage_V
        vnom, vmax = self.nominal_voltage_V, self.max_voltage_V
        if not vt < vmin <= vnom <= vmax:
            raise ValueError(
                "threshold_voltage < min_voltage <= nominal_voltage <= max_voltage must hold, "
                f"but got ({vt} V, {vmin} V, {vnom} V, {vmax} V)"
            )
        return self


class LogicScalingSpec(Spec):
    """Node order and the per-node scaling rule (paper §9: area ÷1.8, power ÷1.3)."""

    order: tuple[str, ...] = Field(min_length=1)
    area_divisor_per_node: Divisor
    power_divisor_per_node: Divisor

    @model_validator(mode="after")
    def _unique(self) -> LogicScalingSpec:
        if len(set(self.order)) != len(self.order):
            raise ValueError(f"node names in 'order' must be unique, but got {list(self.order)}")
        return self


class LogicNodeSpec(VoltageRangeSpec):
    """The minimal compute unit (MCU) a logic node builds, at nominal V/f."""

    mcu_array: tuple[Count, Count]
    mcu_flops_per_cycle: dict[Precision, Positive] = Field(min_length=1)
    mcu_area_mm2: Positive
    mcu_power_W: Positive
    frequency_Hz: Positive
    description: str = ""


class SramSpec(Spec):
    """An on-chip SRAM macro family, described per bank at the logic node ``node``."""

    node: str
    bank_capacity_B: Positive
    cell_area_mm2_per_bit: Positive
    #: share of a bank's area spent on periphery (decoders, sense amplifiers)
    periphery_overhead: Overhead
    static_power_W_per_bit: NonNegative
    dynamic_energy_J_per_bit: Positive
    #: crossbar area per (bank, client) crosspoint: one bank's port to one client
    crossbar_area_per_port_mm2: NonNegative
    #: bytes one bank can read or write per clock: the bank-port bandwidth limit
    port_bytes_per_cycle: Positive
    latency_s: NonNegative = 0.0
    area_divisor_per_node: Divisor
    power_divisor_per_node: Divisor
    description: str = ""


class DramSpec(VoltageRangeSpec):
    """An off-chip memory device (e.g. one HBM stack) and its controller/PHY on the chip."""

    capacity_B: Positive
    device_area_mm2: Positive
    controller_area_mm2: Positive
    links_per_device: Count
    #: data rate of one link (pin) at nominal voltage
    link_rate_Bps: Positive
    #: links (pins) per mm of chip edge
    link_density_per_mm: Positive
    energy_J_per_bit: Positive
    static_power_W_per_bit: NonNegative = 0.0
    latency_s: NonNegative = 0.0
    description: str = ""


class LinkTechSpec(VoltageRangeSpec):
    """An off-chip link technology, described per full-duplex lane (one TX and one RX pair)."""

    #: data rate of one lane in each direction at nominal voltage
    lane_rate_Bps: Positive
    #: lanes that form one port (an NVLink, an InfiniBand x8 port); counts are whole ports
    lanes_per_port: Count
    energy_J_per_bit: Positive
    lane_area_mm2: Positive
    #: lanes per mm of chip edge
    lane_density_per_mm: Positive
    latency_s: NonNegative
    efficiency: Fraction = 1.0
    description: str = ""


class TechnologySpec(Spec):
    kind: Literal["technology"]
    description: str = ""
    logic_scaling: LogicScalingSpec | None = None
    logic: dict[str, LogicNodeSpec] = Field(default_factory=dict)
    sram: dict[str, SramSpec] = Field(default_factory=dict)
    dram: dict[str, DramSpec] = Field(default_factory=dict)
    links: dict[str, LinkTechSpec] = Field(default_factory=dict)
