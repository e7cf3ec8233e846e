"""The technology library: every ``presets/tech/*.yaml`` merged, in SI, looked up by name.

Logic nodes not listed in a file are derived from the node before them in
``logic_scaling.order`` (paper §9: MCU area ÷ ``area_divisor_per_node`` and MCU power ÷
``power_divisor_per_node`` per node at the same frequency and voltages, i.e. iso-performance).
SRAM is described at one node and scaled to the node it is built in by its own divisors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from crossflow.config.base import build, read_yaml
from crossflow.config.loader import preset_dir
from crossflow.config.technology import (
    DramSpec,
    LinkTechSpec,
    LogicNodeSpec,
    LogicScalingSpec,
    SramSpec,
    TechnologySpec,
)
from crossflow.errors import ConfigError
from crossflow.tech.vf import VoltageFrequency

CATEGORIES = ("logic", "sram", "dram", "links")
_LABEL = {"logic": "logic node", "sram": "SRAM technology", "dram": "DRAM technology",
          "links": "link technology"}


def _vf(spec: LogicNodeSpec | DramSpec | LinkTechSpec) -> VoltageFrequency:
    return VoltageFrequency(spec.nominal_voltage_V, spec.threshold_voltage_V,
                            spec.min_voltage_V, spec.max_voltage_V)


@dataclass(frozen=True, slots=True)
class LogicNode:
    """A logic node's minimal compute unit (MCU) at nominal V/f (SI units)."""

    name: str
    mcu_array: tuple[int, int]
    mcu_flops_per_cycle: Mapping[str, float]
    mcu_area_mm2: float
    mcu_power_W: float
    frequency_Hz: float
    vf: VoltageFrequency
    #: node this one was derived from by the scaling rule (None: given in a file)
    derived_from: str | None = None


@dataclass(frozen=True, slots=True)
class SramTech:
    """An SRAM macro family at one logic node (SI units)."""

    name: str
    node: str
    bank_capacity_B: float
    cell_area_mm2_per_bit: float
    periphery_overhead: float
    static_power_W_per_bit: float
    dynamic_energy_J_per_bit: float
    crossbar_area_per_port_mm2: float
    port_bytes_per_cycle: float
    latency_s: float

    @property
    def bank_area_mm2(self) -> float:
        """Cells plus periphery of one bank: bits · cell area / (1 − periphery share)."""
        return self.bank_capacity_B * 8.0 * self.cell_area_mm2_per_bit / (1.0 - self.periphery_overhead)

    @property
    def bank_static_power_W(self) -> float:
        return self.bank_capacity_B * 8.0 * self.static_power_W_per_bit


@dataclass(frozen=True, slots=True)
class DramTech:
    """One off-chip memory device and its on-chip controller/PHY (SI units)."""

    name: str
    capacity_B: float
    device_area_mm2: float
    controller_area_mm2: float
    links_per_device: int
    link_rate_Bps: float
    link_density_per_mm: float
    energy_J_per_bit: float
    static_power_W_per_bit: float
    latency_s: float
    vf: VoltageFrequency

    @property
    def device_bandwidth_Bps(self) -> float:
        """Nominal bandwidth of one device: links × per-link rate."""
        return self.links_per_device * self.link_rate_Bps

    @property
    def device_power_W(self) -> float:
        """Nominal I/O power of one device streaming at its nominal bandwidth."""
        return self.device_bandwidth_Bps * 8.0 * self.energy_J_per_bit

    @property
    def device_static_power_W(self) -> float:
        return self.capacity_B * 8.0 * self.static_power_W_per_bit


@dataclass(frozen=True, slots=True)
class LinkTech:
    """An off-chip link technology per full-duplex lane (SI units)."""

    name: str
    lane_rate_Bps: float
    lanes_per_port: int
    energy_J_per_bit: float
    lane_area_mm2: float
    lane_density_per_mm: float
    latency_s: float
    efficiency: float
    vf: VoltageFrequency

    @property
    def port_bandwidth_Bps(self) -> float:
        """Nominal bandwidth of one port in each direction."""
        return self.lanes_per_port * self.lane_rate_Bps

    @property
    def port_power_W(self) -> float:
        """Nominal power of one port with both directions busy (the TDP case)."""
        return 2.0 * self.port_bandwidth_Bps * 8.0 * self.energy_J_per_bit


@dataclass(slots=True)
class TechLibrary:
    """All technologies by name.  Build with :func:`library` (presets) or :func:`load_library`."""

    scaling: LogicScalingSpec
    logic_nodes: dict[str, LogicNode]
    srams: dict[str, SramSpec]
    drams: dict[str, DramTech]
    link_techs: dict[str, LinkTech]
    _sram_cache: dict[tuple[str, str], SramTech] = field(default_factory=dict)

    # --- lookups ---------------------------------------------------------------------------

    def names(self, category: str) -> tuple[str, ...]:
        """Names in ``category`` (logic nodes in scaling order, the others sorted)."""
        if category == "logic":
            return tuple(self.scaling.order)
        table = {"sram": self.srams, "dram": self.drams, "links": self.link_techs}
        if category not in table:
            raise ConfigError("unknown technology category", value=category,
                              allowed=", ".join(CATEGORIES))
        return tuple(sorted(table[category]))

    def _unknown(self, category: str, name: object, key: str | None) -> ConfigError:
        return ConfigError(f"unknown {_LABEL[category]} {name!r}", key=key, value=name,
                           allowed=", ".join(self.names(category)))

    def logic(self, name: str, *, key: str | None = None) -> LogicNode:
        node = self.logic_nodes.get(name)
        if node is None:
            raise self._unknown("logic", name, key)
        return node

    def sram(self, name: str, node: str, *, key: str | None = None) -> SramTech:
        """SRAM ``name`` built in logic node ``node`` (scaled from the node it is given at)."""
        cached = self._sram_cache.get((name, node))
        if cached is not None:
            return cached
        spec = self.srams.get(name)
        if spec is None:
            raise self._unknown("sram", name, key)
        steps = self.node_steps(spec.node, node)
        area = spec.area_divisor_per_node ** -steps
        power = spec.power_divisor_per_node ** -steps
        tech = SramTech(
            name=name,
            node=node,
            bank_capacity_B=spec.bank_capacity_B,
            cell_area_mm2_per_bit=spec.cell_area_mm2_per_bit * area,
            periphery_overhead=spec.periphery_overhead,
            static_power_W_per_bit=spec.static_power_W_per_bit * power,
            dynamic_energy_J_per_bit=spec.dynamic_energy_J_per_bit * power,
            crossbar_area_per_port_mm2=spec.crossbar_area_per_port_mm2 * area,
            port_bytes_per_cycle=spec.port_bytes_per_cycle,
            latency_s=spec.latency_s,
        )
        self._sram_cache[(name, node)] = tech
        return tech

    def dram(self, name: str, *, key: str | None = None) -> DramTech:
        tech = self.drams.get(name)
        if tech is None:
            raise self._unknown("dram", name, key)
        return tech

    def link(self, name: str, *, key: str | None = None) -> LinkTech:
        tech = self.link_techs.get(name)
        if tech is None:
            raise self._unknown("links", name, key)
        return tech

    # --- node scaling ----------------------------------------------------------------------

    def node_steps(self, from_node: str, to_node: str) -> int:
        """Node generations from ``from_node`` to ``to_node`` (negative: to an older node)."""
        order = self.scaling.order
        for name in (from_node, to_node):
            if name not in order:
                raise self._unknown("logic", name, None)
        return order.index(to_node) - order.index(from_node)

    def area_factor(self, from_node: str, to_node: str) -> float:
        """Multiply an area at ``from_node`` by this to get it at ``to_node`` (paper §9)."""
        return self.scaling.area_divisor_per_node ** -self.node_steps(from_node, to_node)

    def power_factor(self, from_node: str, to_node: str) -> float:
        """Multiply a power at ``from_node`` by this for ``to_node`` at iso-performance."""
        return self.scaling.power_divisor_per_node ** -self.node_steps(from_node, to_node)


# --- building ---------------------------------------------------------------------------------


def _derive_logic(scaling: LogicScalingSpec, given: dict[str, tuple[LogicNodeSpec, str]]
                  ) -> dict[str, LogicNode]:
    for name, (_, file) in given.items():
        if name not in scaling.order:
            raise ConfigError(
                f"logic node {name!r} is not in logic_scaling.order", file=file,
                key=f"logic.{name}", allowed=", ".join(scaling.order))
    first = scaling.order[0]
    if first not in given:
        raise ConfigError(
            f"the first node of logic_scaling.order ({first!r}) must be given under 'logic' "
            "(the others can be derived from it)", key="logic_scaling.order")
    nodes: dict[str, LogicNode] = {}
    previous: LogicNode | None = None
    for name in scaling.order:
        if name in given:
            s = given[name][0]
            node = LogicNode(name, s.mcu_array, dict(s.mcu_flops_per_cycle), s.mcu_area_mm2,
                             s.mcu_power_W, s.frequency_Hz, _vf(s))
        else:
            assert previous is not None
            node = LogicNode(
                name,
                previous.mcu_array,
                previous.mcu_flops_per_cycle,
                previous.mcu_area_mm2 / scaling.area_divisor_per_node,
                previous.mcu_power_W / scaling.power_divisor_per_node,
                previous.frequency_Hz,
                previous.vf,
                derived_from=previous.name,
            )
        nodes[name] = node
        previous = node
    return nodes


def load_library(files: Iterable[str | Path]) -> TechLibrary:
    """Merge technology files into a library; a name defined twice is a ConfigError."""
    scaling: tuple[LogicScalingSpec, str] | None = None
    seen: dict[str, dict[str, tuple[object, str]]] = {c: {} for c in CATEGORIES}
    for path in files:
        file = str(path)
        spec = build(TechnologySpec, read_yaml(file), file=file)
        assert isinstance(spec, TechnologySpec)
        if spec.logic_scaling is not None:
            if scaling is not None:
                raise ConfigError(f"logic_scaling is also given in {scaling[1]}", file=file,
                                  key="logic_scaling")
            scaling = (spec.logic_scaling, file)
        for category in CATEGORIES:
            for name, item in getattr(spec, category).items():
                if name in seen[category]:
                    raise ConfigError(
                        f"{_LABEL[category]} {name!r} is also defined in "
                        f"{seen[category][name][1]}", file=file, key=f"{category}.{name}")
                seen[category][name] = (item, file)
    if scaling is None:
        raise ConfigError("no technology file gives logic_scaling (the node order)",
                          value=[str(f) for f in files])
    logic = _derive_logic(scaling[0], seen["logic"])  # type: ignore[arg-type]
    for name, (sram, file) in seen["sram"].items():
        if sram.node not in logic:  # type: ignore[attr-defined]
            raise ConfigError("unknown logic node", file=file, key=f"sram.{name}.node",
                              value=sram.node, allowed=", ".join(scaling[0].order))  # type: ignore[attr-defined]
    drams = {
        name: DramTech(name, s.capacity_B, s.device_area_mm2, s.controller_area_mm2,
                       s.links_per_device, s.link_rate_Bps, s.link_density_per_mm,
                       s.energy_J_per_bit, s.static_power_W_per_bit, s.latency_s, _vf(s))
        for name, (s, _) in seen["dram"].items()  # type: ignore[misc]
    }
    links = {
        name: LinkTech(name, s.lane_rate_Bps, s.lanes_per_port, s.energy_J_per_bit,
                       s.lane_area_mm2, s.lane_density_per_mm, s.latency_s, s.efficiency, _vf(s))
        for name, (s, _) in seen["links"].items()  # type: ignore[misc]
    }
    srams = {name: s for name, (s, _) in seen["sram"].items()}
    return TechLibrary(scaling[0], logic, srams, drams, links)  # type: ignore[arg-type]


def preset_files() -> tuple[Path, ...]:
    return tuple(sorted(preset_dir("tech").glob("*.yaml")))


@cache
def library() -> TechLibrary:
    """The shipped technology library (``presets/tech/*.yaml``), loaded once per process."""
    return load_library(preset_files())
