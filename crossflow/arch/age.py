"""The micro-architecture generator (AGE): template + technology + budgets → MicroArch (paper §4.4).

Budgets are fractions of the chip area, the TDP and the chip perimeter (4·sqrt(chip area),
a square die) per component (paper §4.3).  Each component gets the most throughput its share
allows:

* **Core** (§4.4.1): MCUs = area / MCU area, in whole bundles; the operating voltage solves
  the V/f law P ∝ V(V−Vt)² for the power budget (:mod:`crossflow.tech.vf`, physical root),
  clamped to [Vmin, Vmax]; if even Vmin is over budget, bundles are dropped until it fits
  and V is re-solved for them.  Peak = N · FLOP/cycle · f (eq. 1).
* **SRAM levels** (§4.4.2): per instance of the level's scope, banks + a crossbar from every
  bank to every client in scope (clients = instances of the next inner level: MCUs for an L1,
  bundles for an L2) must fit the area; capacity = banks · bank capacity; static power =
  bits · static power per bit (eq. 2); bandwidth = (power − static) / energy per bit (eq. 3),
  capped by the bank ports (banks · bytes per bank per clock · the logic node's nominal
  clock: SRAM has its own power budget, so the core's V/f operating point does not set it).
* **DRAM** (§4.4.3): devices = min(package area left / device area, controller area budget /
  controller area, perimeter share · pins per mm / pins per device) (eq. 4); capacity =
  devices · device capacity; bandwidth = pins · pin rate, V/f-scaled under the power budget
  (clamped at Vmax; devices dropped if over budget at Vmin).
* **Links** (§4.4.4), intra and inter separately: lanes = min(area / lane area, perimeter
  share · lanes per mm), in whole ports; V/f-scaled under the power budget; bandwidth per
  direction = ports · lanes · lane rate.

A component the template uses whose budget cannot run one unit (a bundle, a bank, a device, a
port) — a 0 W or 0 mm² share included — raises :class:`~crossflow.errors.InfeasibleDesignError`
with the numbers.  ``MicroArch.report`` records, per component, the area and power budget and
use, the operating point and which limit was binding.

``generate`` does no file I/O: the technology library is loaded once per process.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossflow.arch.microarch import Link, MemoryLevel, MicroArch
from crossflow.config.loader import load_spec
from crossflow.config.template import (
    COMPONENT_KEYS,
    PERIMETER_KEYS,
    ArchitectureTemplateSpec,
    check_fractions,
)
from crossflow.errors import ConfigError, InfeasibleDesignError
from crossflow.tech.library import DramTech, LinkTech, LogicNode, SramTech, TechLibrary, library
from crossflow.tech.vf import VoltageFrequency

#: Keys ``generate(..., overrides=...)`` accepts (SI values, canonical key names).
OVERRIDE_KEYS: tuple[str, ...] = (
    "logic_node",           # logic node name, e.g. "N5"
    "dram",                 # technology of the main-memory level, e.g. "HBM3"
    "memory",               # {level name: technology name} for any level
    "intra_link",           # link technology name, or None for no intra-node links
    "inter_link",           # link technology name, or None
    "area_fractions",       # {component: fraction}, merged into the template's
    "power_fractions",      # {component: fraction}, merged
    "perimeter_fractions",  # {dram|intra|inter: fraction}, merged
    "tdp_W",
    "chip_area_mm2",
    "node_area_mm2",
)
_SCOPE_INDEX = {"mcu": 0, "bundle": 1, "global": 2}


def _floor(x: float) -> int:
    """floor() that does not lose a unit to rounding (243.2 / 0.38 = 639.9999…)."""
    return max(0, math.floor(x + 1e-9))


# --- inputs after overrides -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Inputs:
    logic_node: str
    memory_tech: tuple[str, ...]
    links: dict[str, str | None]
    node_area_mm2: float
    chip_area_mm2: float
    tdp_W: float
    area: dict[str, float]
    power: dict[str, float]
    perimeter: dict[str, float]


def _positive(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError("must be a number > 0", key=f"overrides.{key}", value=value)
    return float(value)


def _inputs(spec: ArchitectureTemplateSpec, overrides: Mapping[str, Any] | None) -> _Inputs:
    memory = [m.technology for m in spec.memory]
    links = {"intra": spec.links.intra, "inter": spec.links.inter}
    node_area, chip_area, tdp = spec.node_area_mm2, spec.chip_area_mm2, spec.tdp_W
    area, power, perimeter = spec.area_fractions, spec.power_fractions, spec.perimeter_fractions
    logic_node = spec.logic_node
    if overrides:
        unknown = [k for k in overrides if k not in OVERRIDE_KEYS]
        if unknown:
            raise ConfigError(f"unknown override '{unknown[0]}'", key=f"overrides.{unknown[0]}",
                              value=overrides[unknown[0]], allowed=", ".join(OVERRIDE_KEYS))
        o = overrides
        logic_node = o.get("logic_node", logic_node)
        if "dram" in o:
            memory[-1] = o["dram"]
        level_index = {m.name: i for i, m in enumerate(spec.memory)}
        for level, tech in (o.get("memory") or {}).items():
            if level not in level_index:
                raise ConfigError("unknown memory level", key=f"overrides.memory.{level}",
                                  value=tech, allowed=", ".join(level_index))
            memory[level_index[level]] = tech
        for kind in ("intra", "inter"):
            if f"{kind}_link" in o:
                links[kind] = o[f"{kind}_link"]
        node_area = _positive("node_area_mm2", o.get("node_area_mm2", node_area))
        chip_area = _positive("chip_area_mm2", o.get("chip_area_mm2", chip_area))
        tdp = _positive("tdp_W", o.get("tdp_W", tdp))
        if chip_area > node_area:
            raise ConfigError(f"the processor chip ({chip_area:g} mm2) must fit in the node "
                              f"area budget ({node_area:g} mm2)", key="overrides.chip_area_mm2",
                              value=chip_area)
        if "area_fractions" in o:
            area = {**area, **o["area_fractions"]}
            check_fractions("area_fractions", area, spec.budget_keys)
        if "power_fractions" in o:
            power = {**power, **o["power_fractions"]}
            check_fractions("power_fractions", power, spec.budget_keys)
        if "perimeter_fractions" in o:
            perimeter = {**perimeter, **o["perimeter_fractions"]}
            check_fractions("perimeter_fractions", perimeter, PERIMETER_KEYS)
    return _Inputs(logic_node, tuple(memory), links, node_area, chip_area, tdp,
                   dict(area), dict(power), dict(perimeter))


# --- power fitting (shared by core, DRAM and links) -------------------------------------------


@dataclass(frozen=True, slots=True)
class _Fit:
    units: int
    voltage_V: float
    count_limit: str     # what bounds the number of units: area, perimeter, …, or power
    voltage_limit: str   # max_voltage | power | min_voltage
    power_W: float


def _fit_power(component: str, unit: str, units_max: int, count_limit: str, unit_dynamic_W: float,
               unit_static_W: float, budget_W: float, vf: VoltageFrequency) -> _Fit:
    """Operating point of ``units_max`` identical units under ``budget_W`` (paper §4.4.1).

    Dynamic power scales with the V/f law; static power does not.  If even the minimum
    voltage is over budget, the unit count drops to what the budget runs at Vmin, and the
    voltage is re-solved for the remaining units (using the budget left by the rounding).
    """
    r_min = vf.power_ratio(vf.min_V)
    one = unit_static_W + unit_dynamic_W * r_min
    if budget_W < one:
        raise InfeasibleDesignError(
            f"{component}: the power budget of {budget_W:.4g} W cannot run one {unit} "
            f"({one:.4g} W at the minimum voltage {vf.min_V:g} V)")
    units = units_max
    ratio = (budget_W - units * unit_static_W) / (units * unit_dynamic_W)
    if ratio < r_min:
        units = min(units_max, max(1, math.floor(budget_W / one)))
        count_limit = "power"
        ratio = (budget_W - units * unit_static_W) / (units * unit_dynamic_W)
    voltage, why = vf.voltage_for(ratio)
    used = units * (unit_static_W + unit_dynamic_W * vf.power_ratio(voltage))
    return _Fit(units, voltage, count_limit, why, used)


# --- components ---------------------------------------------------------------------------------


def _core(spec: ArchitectureTemplateSpec, node: LogicNode, inp: _Inputs) -> tuple[dict, dict]:
    rows, cols = spec.mcu.array
    scale = rows * cols / (node.mcu_array[0] * node.mcu_array[1])
    mcu_area, mcu_power = node.mcu_area_mm2 * scale, node.mcu_power_W * scale
    fpc = dict(spec.mcu.flops_per_cycle) or {
        p: v * scale for p, v in node.mcu_flops_per_cycle.items()}
    k = spec.mcus_per_bundle
    area = inp.area.get("core", 0.0) * inp.chip_area_mm2
    budget = inp.power.get("core", 0.0) * inp.tdp_W
    mcus_by_area = _floor(area / mcu_area)
    bundles_by_area = mcus_by_area // k
    if bundles_by_area == 0:
        raise InfeasibleDesignError(
            f"core: the area budget of {area:.4g} mm2 (area_fractions.core "
            f"{inp.area.get('core', 0.0):g} of {inp.chip_area_mm2:g} mm2) fits {mcus_by_area} "
            f"MCUs of {mcu_area:.4g} mm2 at {node.name}, fewer than one bundle of {k}")
    fit = _fit_power("core", f"bundle of {k} MCUs", bundles_by_area, "area", k * mcu_power, 0.0,
                     budget, node.vf)
    mcus = fit.units * k
    freq = node.frequency_Hz * node.vf.frequency_ratio(fit.voltage_V)
    mcu_power_op = mcu_power * node.vf.power_ratio(fit.voltage_V)
    core = {
        "bundles": fit.units,
        "mcus": mcus,
        "frequency_Hz": freq,
        "peak_flops": {p: mcus * v * freq for p, v in fpc.items()},
        "energy_J_per_flop": {p: mcu_power_op / (v * freq) for p, v in fpc.items()},
    }
    report = {
        "area_budget_mm2": area,
        "area_used_mm2": mcus * mcu_area,
        "power_budget_W": budget,
        "power_used_W": fit.power_W,
        "mcu_area_mm2": mcu_area,
        "mcu_power_nominal_W": mcu_power,
        "mcus_by_area": bundles_by_area * k,
        "mcus": mcus,
        "bundles": fit.units,
        "count_limit": fit.count_limit,
        "voltage_V": fit.voltage_V,
        "voltage_limit": fit.voltage_limit,
        "frequency_Hz": freq,
    }
    return core, report


def _sram(name: str, tech: SramTech, scope: str, instances: int, clients: int, area_frac: float,
          power_frac: float, inp: _Inputs, clock_Hz: float) -> tuple[dict, dict]:
    area = area_frac * inp.chip_area_mm2
    budget = power_frac * inp.tdp_W
    per_bank = tech.bank_area_mm2 + clients * tech.crossbar_area_per_port_mm2
    banks = _floor(area / instances / per_bank)
    if banks == 0:
        raise InfeasibleDesignError(
            f"{name}: the area budget of {area:.4g} mm2 (area_fractions.{name} {area_frac:g}) "
            f"over {instances} {scope}-scope instance(s) is {area / instances:.4g} mm2 each, "
            f"less than one {tech.name} bank with its crossbar to {clients} client(s) "
            f"({per_bank:.4g} mm2)")
    total_banks = banks * instances
    static = total_banks * tech.bank_static_power_W          # eq. 2
    if budget <= static:
        raise InfeasibleDesignError(
            f"{name}: the power budget of {budget:.4g} W (power_fractions.{name} {power_frac:g}"
            f" of {inp.tdp_W:g} W) does not exceed the static power of its {total_banks} banks, "
            f"{static:.4g} W (eq. 2), so no bandwidth is left")
    bw_power = (budget - static) / (8.0 * tech.dynamic_energy_J_per_bit)    # eq. 3
    bw_ports = total_banks * tech.port_bytes_per_cycle * clock_Hz
    bandwidth = min(bw_power, bw_ports)
    level = {"capacity_B": banks * tech.bank_capacity_B, "bandwidth_Bps": bandwidth}
    report = {
        "technology": tech.name,
        "area_budget_mm2": area,
        "area_used_mm2": total_banks * per_bank,
        "power_budget_W": budget,
        "power_used_W": static + bandwidth * 8.0 * tech.dynamic_energy_J_per_bit,
        "instances": instances,
        "clients_per_instance": clients,
        "banks_per_instance": banks,
        "crossbar_area_mm2": total_banks * clients * tech.crossbar_area_per_port_mm2,
        "capacity_per_instance_B": level["capacity_B"],
        "capacity_limit": "area",
        "static_power_W": static,
        "bandwidth_by_power_Bps": bw_power,
        "bandwidth_by_bank_ports_Bps": bw_ports,
        "bandwidth_limit": "power" if bw_power <= bw_ports else "bank_ports",
    }
    return level, report


def _dram(name: str, tech: DramTech, inp: _Inputs, perimeter_mm: float) -> tuple[dict, dict]:
    ctrl_area = inp.area.get("dram_ctrl", 0.0) * inp.chip_area_mm2
    budget = inp.power.get("dram_ctrl", 0.0) * inp.tdp_W
    edge = inp.perimeter.get("dram", 0.0) * perimeter_mm
    limits = {                                                          # eq. 4
        "package_area": _floor((inp.node_area_mm2 - inp.chip_area_mm2) / tech.device_area_mm2),
        "controller_area": _floor(ctrl_area / tech.controller_area_mm2),
        "perimeter": _floor(edge * tech.link_density_per_mm / tech.links_per_device),
    }
    binding = min(limits, key=limits.__getitem__)
    if limits[binding] == 0:
        raise InfeasibleDesignError(
            f"{name}: no {tech.name} device fits (eq. 4): package area left "
            f"{inp.node_area_mm2 - inp.chip_area_mm2:.4g} mm2 / {tech.device_area_mm2:g} mm2 "
            f"= {limits['package_area']}, controller area {ctrl_area:.4g} mm2 / "
            f"{tech.controller_area_mm2:g} mm2 = {limits['controller_area']}, perimeter "
            f"{edge:.4g} mm x {tech.link_density_per_mm:g} pins/mm / {tech.links_per_device} "
            f"pins = {limits['perimeter']}")
    fit = _fit_power(name, f"{tech.name} device", limits[binding], binding, tech.device_power_W,
                     tech.device_static_power_W, budget, tech.vf)
    devices = fit.units
    f_ratio = tech.vf.frequency_ratio(fit.voltage_V)
    level = {
        "capacity_B": devices * tech.capacity_B,
        "bandwidth_Bps": devices * tech.device_bandwidth_Bps * f_ratio,
        "energy_J_per_B": 8.0 * tech.energy_J_per_bit * tech.vf.energy_ratio(fit.voltage_V),
    }
    pins = devices * tech.links_per_device
    report = {
        "technology": tech.name,
        "area_budget_mm2": ctrl_area,
        "area_used_mm2": devices * tech.controller_area_mm2,
        "package_area_used_mm2": devices * tech.device_area_mm2,
        "power_budget_W": budget,
        "power_used_W": fit.power_W,
        "perimeter_budget_mm": edge,
        "perimeter_used_mm": pins / tech.link_density_per_mm,
        "device_limits": limits,
        "devices": devices,
        "count_limit": fit.count_limit,
        "links": pins,
        "voltage_V": fit.voltage_V,
        "voltage_limit": fit.voltage_limit,
        "link_rate_Bps": tech.link_rate_Bps * f_ratio,
    }
    return level, report


def _link(kind: str, tech: LinkTech, inp: _Inputs, perimeter_mm: float) -> tuple[Link, dict]:
    key = f"{kind}_links"
    component = f"{kind} links"
    area = inp.area.get(key, 0.0) * inp.chip_area_mm2
    budget = inp.power.get(key, 0.0) * inp.tdp_W
    edge = inp.perimeter.get(kind, 0.0) * perimeter_mm
    by_area = _floor(area / tech.lane_area_mm2)
    by_edge = _floor(edge * tech.lane_density_per_mm)
    lanes = min(by_area, by_edge)
    ports = lanes // tech.lanes_per_port
    count_limit = "area" if by_area <= by_edge else "perimeter"
    if ports == 0:
        raise InfeasibleDesignError(
            f"{component}: no {tech.name} port of {tech.lanes_per_port} lane(s) fits: area "
            f"{area:.4g} mm2 / {tech.lane_area_mm2:g} mm2 = {by_area} lanes, perimeter "
            f"{edge:.4g} mm x {tech.lane_density_per_mm:g} lanes/mm = {by_edge} lanes")
    fit = _fit_power(component, f"{tech.name} port", ports, count_limit, tech.port_power_W, 0.0,
                     budget, tech.vf)
    f_ratio = tech.vf.frequency_ratio(fit.voltage_V)
    link = Link(
        name=kind,
        count=fit.units,
        bandwidth_Bps=fit.units * tech.port_bandwidth_Bps * f_ratio,
        latency_s=tech.latency_s,
        energy_J_per_B=8.0 * tech.energy_J_per_bit * tech.vf.energy_ratio(fit.voltage_V),
        efficiency=tech.efficiency,
    )
    used_lanes = fit.units * tech.lanes_per_port
    report = {
        "technology": tech.name,
        "area_budget_mm2": area,
        "area_used_mm2": used_lanes * tech.lane_area_mm2,
        "power_budget_W": budget,
        "power_used_W": fit.power_W,
        "perimeter_budget_mm": edge,
        "perimeter_used_mm": used_lanes / tech.lane_density_per_mm,
        "lanes_by_area": by_area,
        "lanes_by_perimeter": by_edge,
        "ports": fit.units,
        "count_limit": fit.count_limit,
        "voltage_V": fit.voltage_V,
        "voltage_limit": fit.voltage_limit,
        "lane_rate_Bps": tech.lane_rate_Bps * f_ratio,
        "bandwidth_Bps": link.bandwidth_Bps,
    }
    return link, report


# --- entry point --------------------------------------------------------------------------------


def _as_template(template: ArchitectureTemplateSpec | str | Path | Mapping[str, Any]
                 ) -> ArchitectureTemplateSpec:
    if isinstance(template, ArchitectureTemplateSpec):
        return template

    spec = load_spec(template, "templates")
    if not isinstance(spec, ArchitectureTemplateSpec):
        raise ConfigError("not an architecture template", key="kind",
                          value=getattr(spec, "kind", None), allowed="architecture")
    return spec


def generate(
    template: ArchitectureTemplateSpec | str | Path | Mapping[str, Any],
    *,
    overrides: Mapping[str, Any] | None = None,
    tech: TechLibrary | None = None,
) -> MicroArch:
    """Generate the micro-architecture of ``template`` under its budgets (paper §4.4).

    Args:
        template: a loaded :class:`~crossflow.config.template.ArchitectureTemplateSpec`
            (fast path), or a preset name / path / dict, which is loaded first.
        overrides: changes applied on top of the template without re-reading it, for
            searches; keys in :data:`OVERRIDE_KEYS` (SI values).  Fraction mappings are merged
            into the template's and re-checked (each in [0, 1], each set sums to <= 1).
        tech: technology library; the shipped one (loaded once per process) by default.

    Raises:
        ConfigError: unknown technology name or override, or fractions out of range.
        InfeasibleDesignError: a budget cannot build or run one unit of a component the
            template uses (the message has the numbers).
    """
    spec = _as_template(template)
    lib = tech if tech is not None else library()
    inp = _inputs(spec, overrides)
    o = overrides or {}
    levels = spec.memory

    def where(i: int) -> str:  # the key that named memory level i's technology
        if i == len(levels) - 1 and "dram" in o:
            return "overrides.dram"
        if levels[i].name in (o.get("memory") or {}):
            return f"overrides.memory.{levels[i].name}"
        return f"memory[{i}].technology"

    node = lib.logic(inp.logic_node,
                     key="overrides.logic_node" if "logic_node" in o else "logic_node")
    srams = [lib.sram(inp.memory_tech[i], node.name, key=where(i)) for i in range(len(levels) - 1)]
    dram = lib.dram(inp.memory_tech[-1], key=where(len(levels) - 1))
    link_techs = {
        kind: lib.link(name, key=f"overrides.{kind}_link" if f"{kind}_link" in o
                       else f"links.{kind}")
        for kind, name in inp.links.items() if name is not None}

    perimeter_mm = 4.0 * math.sqrt(inp.chip_area_mm2)
    core, core_report = _core(spec, node, inp)
    mcus, bundles = core["mcus"], core["bundles"]
    instances_of = {"mcu": mcus, "bundle": bundles, "global": 1}
    components: dict[str, Any] = {"core": core_report}

    memory: list[MemoryLevel] = []
    inner = mcus   # clients of the first level: the MCUs themselves
    for level, sram in zip(levels[:-1], srams, strict=True):
        instances = instances_of[level.scope]
        clients = max(1, inner // instances)
        values, report = _sram(level.name, sram, level.scope, instances, clients,
                               inp.area.get(level.name, 0.0), inp.power.get(level.name, 0.0),
                               inp, node.frequency_Hz)
        components[level.name] = report
        memory.append(MemoryLevel(
            name=level.name, scope=level.scope, capacity_B=values["capacity_B"],
            instances=instances, bandwidth_Bps=values["bandwidth_Bps"],
            efficiency=level.efficiency, latency_s=sram.latency_s,
            energy_J_per_B=8.0 * sram.dynamic_energy_J_per_bit,
            loop_orders=tuple(level.loop_orders)))
        inner = instances
    main = levels[-1]
    values, report = _dram(main.name, dram, inp, perimeter_mm)
    components[main.name] = report
    memory.append(MemoryLevel(
        name=main.name, scope="global", capacity_B=values["capacity_B"], instances=1,
        bandwidth_Bps=values["bandwidth_Bps"], efficiency=main.efficiency,
        latency_s=dram.latency_s, energy_J_per_B=values["energy_J_per_B"],
        loop_orders=tuple(main.loop_orders)))

    links: dict[str, Link] = {}
    for kind, link_tech in link_techs.items():
        links[kind], components[f"{kind}_links"] = _link(kind, link_tech, inp, perimeter_mm)
    for key in COMPONENT_KEYS[2:]:
        if key not in components and (inp.area.get(key) or inp.power.get(key)):
            components[key] = {"unused": "the template names no link technology for it",
                               "area_budget_mm2": inp.area.get(key, 0.0) * inp.chip_area_mm2,
                               "power_budget_W": inp.power.get(key, 0.0) * inp.tdp_W}

    report = {
        "source": "age",
        "template": spec.name,
        "technology": {
            "logic_node": node.name,
            "memory": {lv.name: t for lv, t in zip(levels, inp.memory_tech, strict=True)},
            "links": dict(inp.links),
        },
        "budgets": {
            "node_area_mm2": inp.node_area_mm2,
            "chip_area_mm2": inp.chip_area_mm2,
            "perimeter_mm": perimeter_mm,
            "tdp_W": inp.tdp_W,
        },
        "components": components,
        "area_used_mm2": sum(c.get("area_used_mm2", 0.0) for c in components.values()),
        "power_used_W": sum(c.get("power_used_W", 0.0) for c in components.values()),
    }
    return MicroArch(
        name=spec.name,
        num_bundles=bundles,
        mcus_per_bundle=spec.mcus_per_bundle,
        mcu_rows=spec.mcu.array[0],
        mcu_cols=spec.mcu.array[1],
        frequency_Hz=core["frequency_Hz"],
        peak_flops=core["peak_flops"],
        compute_efficiency=spec.mcu.max_utilization,
        memory=tuple(memory),
        links=links,
        kernel_launch_s=spec.kernel_launch_s,
        energy_J_per_flop=core["energy_J_per_flop"],
        dataflow=spec.mcu.dataflow,
        accumulator_fraction=spec.mcu.accumulator_fraction,
        tdp_W=inp.tdp_W,
        report=report,
    )
