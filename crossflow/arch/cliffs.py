"""Cliffs of the AGE: a design's integer quantities and the budget fractions where they step.

The micro-architecture generator (:mod:`crossflow.arch.age`) is analytic, but every component
is built from whole units — bundles of MCUs, SRAM banks, DRAM devices, link ports — so a
design's performance is piecewise smooth in the budget fractions, with **cliffs** where one
of those integer counts changes.  This module reports

* :func:`quantities` — a design's integer quantities, from ``MicroArch.report``;
* :func:`steps` — for one budget coordinate (a simplex and a component), every fraction at
  which any of those quantities changes, with its value on either side;
* :func:`edges` — the step thresholds nearest a given fraction, nudged so that the AGE
  really builds the unit they buy: the points a search should evaluate instead of stepping
  blindly over a cliff.

(Over 600 lines, one module on purpose: :class:`_Coordinate` holds one closed form per AGE
quantity along a coordinate, and the step search, the edge nudging and :class:`_Transfer`
are built on its private state; they change together whenever the AGE does.)

**The coordinate convention ("fraction held, slack absorbs").**  A coordinate is one
component's share ``f`` in one budget simplex (``"area"``, ``"power"`` or ``"perimeter"``).
Along it every *other* fraction of that simplex keeps its value (the template's, merged with
``overrides``), and so do the other two simplexes; the simplex's slack ``1 − Σ fractions``
absorbs the change (it grows when ``f`` falls and shrinks when ``f`` rises).  ``f`` is
therefore valid on ``[0, f_max]`` with ``f_max = 1 − Σ_{other components} fractions``, and
a requested range ``[lo, hi]`` is clipped to it.  This is the default,
``convention="held"``.  With ``convention="proportional"`` the other fractions of the
simplex *and its slack* scale by ``(1 − f) / (1 − f₀)`` (``f₀`` the component's fraction
in ``overrides``), which is what moving one logit of the searches' softmax encoding does;
``f`` is then valid on ``[0, 1]`` and every component's units step along the coordinate.
:func:`coordinate_overrides` gives the AGE overrides of the design at any ``f``.

A step at ``t`` means: every ``f`` in the plateau just below ``t`` builds ``below`` and
``f = t`` (up to ~1e-15 of float rounding, see :func:`edges`) up to the next step builds
``above``.  Reported steps lie in ``lo < t <= hi``.

**Infeasible designs.**  Where the AGE raises
:class:`~crossflow.errors.InfeasibleDesignError` (a component that cannot build or run one
unit), a design has no quantities.  The boundary of such a region is a step of the
pseudo-quantity ``"feasible"`` (0 → 1 where the design becomes feasible as ``f`` grows,
1 → 0 where it stops being feasible, e.g. when more bundles leave less than one register
bank per MCU).  Quantity steps are reported only between two feasible plateaus.

How steps are found: each quantity is a floor of a budget that is linear in ``f`` (closed
forms in ``docs/age-cliffs.md``), so the candidate thresholds are known in closed form; the
integer part of the AGE is then evaluated once, vectorised, on one point inside every
plateau between candidates (an exact replica of the AGE's integer arithmetic, same
floating-point operations), and a step is reported where two neighbouring plateaus differ.
No bisection, no ``generate()`` call: a held coordinate costs about 5–10 ``generate()``
calls, plus ~1.5 µs per reported step (numbers in ``docs/age-cliffs.md``).

This module is in the arch layer: it imports nothing from :mod:`crossflow.search`.  It is
one job — the names of the AGE's integer quantities and the closed forms of their steps,
which share one replica of the AGE's arithmetic — so it stays one file past 600 lines.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from crossflow.arch.age import _as_template, _inputs, generate
from crossflow.arch.microarch import MicroArch
from crossflow.config.template import PERIMETER_KEYS, ArchitectureTemplateSpec
from crossflow.errors import ConfigError, InfeasibleDesignError
from crossflow.tech.library import TechLibrary, library

__all__ = ["SIMPLEXES", "CONVENTIONS", "FEASIBLE", "Step", "quantities", "quantities_at",
           "unit_quantity", "steps", "thresholds", "edges", "coordinate_range",
           "coordinate_overrides", "transfer_amount"]

#: Budget simplexes and the override key that holds each one's fractions.
SIMPLEXES: Mapping[str, str] = {"area": "area_fractions", "power": "power_fractions",
                                "perimeter": "perimeter_fractions"}
#: How the other fractions of the moving simplex follow the coordinate (module docstring).
CONVENTIONS: tuple[str, ...] = ("held", "proportional")
#: Name of the pseudo-quantity whose steps mark where a design becomes (in)feasible.
FEASIBLE = "feasible"

_EPS = 1e-9        # the AGE's _floor() slack: floor(x + 1e-9)
_SCOPES = ("mcu", "bundle", "global")

Template = ArchitectureTemplateSpec | str | Path | Mapping[str, Any]


class Step(NamedTuple):
    """One cliff on a coordinate: ``quantity`` is ``below`` for fractions just under
    ``fraction`` and ``above`` from ``fraction`` on (until the next step).  A named tuple
    (cheap to build by the thousand); tuples sort by fraction, then quantity."""

    fraction: float
    quantity: str
    below: int
    above: int


# --- quantities of a design -------------------------------------------------------------------


def quantities(arch: MicroArch, *, tech: TechLibrary | None = None) -> dict[str, int]:
    """The integer quantities of an AGE design, from ``arch.report["components"]``.

    Keys (``<level>`` is the template's memory-level name, e.g. ``registers``, ``L1``,
    ``L2``, ``DRAM``; ``<kind>`` is ``intra`` or ``inter``):

    * ``core.bundles``, ``core.mcus``;
    * per on-chip (SRAM) level: ``<level>.banks_per_instance``,
      ``<level>.capacity_per_instance_B`` (bytes of one instance: one MCU's registers, one
      bundle's L1, the chip's L2) and ``<level>.instances``;
    * main memory: ``<level>.devices`` (e.g. HBM stacks) and ``<level>.pins`` (data pins);
    * per link kind the template uses: ``<kind>_links.ports`` and ``<kind>_links.lanes``
      (lanes in use: ports × lanes per port).

    Raises ``ValueError`` for a MicroArch that does not come from the AGE (no report).
    """
    report = arch.report or {}
    comps = report.get("components")
    if report.get("source") != "age" or not comps:
        raise ValueError(f"{arch.name}: not an AGE design (no AGE report)")
    lib = tech if tech is not None else library()
    q: dict[str, int] = {"core.bundles": int(comps["core"]["bundles"]),
                         "core.mcus": int(comps["core"]["mcus"])}
    for name, c in comps.items():
        if "banks_per_instance" in c:
            q[f"{name}.banks_per_instance"] = int(c["banks_per_instance"])
            q[f"{name}.capacity_per_instance_B"] = int(c["capacity_per_instance_B"])
            q[f"{name}.instances"] = int(c["instances"])
        elif "devices" in c:
            q[f"{name}.devices"] = int(c["devices"])
            q[f"{name}.pins"] = int(c["links"])
        elif "ports" in c:
            q[f"{name}.ports"] = int(c["ports"])
            q[f"{name}.lanes"] = int(c["ports"]) * lib.link(c["technology"]).lanes_per_port
    return q


def unit_quantity(template: ArchitectureTemplateSpec, component: str) -> str | None:
    """The :func:`quantities` name of the units a budget component buys: ``core.bundles``,
    ``<level>.banks_per_instance`` for an on-chip level, ``<main>.devices`` for
    ``dram_ctrl`` (area, power) and ``dram`` (perimeter), ``<kind>_links.ports`` for
    ``<kind>_links`` (area, power) and ``<kind>`` (perimeter); None for anything else."""
    levels = [m.name for m in template.memory]
    if component == "core":
        return "core.bundles"
    if component in levels[:-1]:
        return f"{component}.banks_per_instance"
    if component in ("dram_ctrl", "dram"):
        return f"{levels[-1]}.devices"
    kind = component.removesuffix("_links")
    if kind in ("intra", "inter"):
        return f"{kind}_links.ports"
    return None


def quantities_at(template: Template, overrides: Mapping[str, Any] | None = None, *,
                  tech: TechLibrary | None = None) -> dict[str, int]:
    """:func:`quantities` of ``generate(template, overrides=overrides)`` plus
    ``"feasible": 1``, or ``{"feasible": 0}`` where the AGE raises InfeasibleDesignError."""
    try:
        arch = generate(template, overrides=overrides, tech=tech)
    except InfeasibleDesignError:
        return {FEASIBLE: 0}
    return {**quantities(arch, tech=tech), FEASIBLE: 1}


# --- the coordinate and a vectorised replica of the AGE's integer arithmetic ------------------


def _floor(x: np.ndarray) -> np.ndarray:
    """age._floor on arrays (same operations: max(0, floor(x + 1e-9)))."""
    return np.maximum(0.0, np.floor(x + _EPS))


def _fit_units(units_max: np.ndarray, unit_dynamic_W: float, unit_static_W: float,
               budget_W: np.ndarray | float, r_min: float) -> tuple[np.ndarray, np.ndarray]:
    """age._fit_power's unit count (and whether the budget runs one unit), vectorised."""
    one = unit_static_W + unit_dynamic_W * r_min
    ok = np.logical_not(np.asarray(budget_W) < one)
    safe = np.maximum(units_max, 1.0)
    ratio = (budget_W - safe * unit_static_W) / (safe * unit_dynamic_W)
    shed = np.minimum(units_max, np.maximum(1.0, np.floor(budget_W / one)))
    return np.where(ratio < r_min, shed, units_max), ok


def _crossings_each(g: tuple[float, float], alpha: np.ndarray, a: np.ndarray,
                    b: np.ndarray) -> np.ndarray:
    """Where alpha_i·(g0 + g1·f) crosses an integer (less the AGE's 1e-9) on [a_i, b_i],
    for every plateau i at once (a superset: one more crossing at each end)."""
    g0, g1 = g
    va, vb = alpha * (g0 + g1 * a), alpha * (g0 + g1 * b)
    m_lo = np.maximum(1.0, np.floor(np.minimum(va, vb)))
    m_hi = np.minimum(np.ceil(np.maximum(va, vb)) + 1.0, 5e6)
    counts = np.maximum(0, (m_hi - m_lo + 1.0)).astype(np.int64)
    if not counts.sum():
        return np.empty(0)
    idx = np.repeat(np.arange(alpha.size), counts)
    start = np.repeat(np.cumsum(counts) - counts, counts)
    m = m_lo[idx] + (np.arange(idx.size) - start)
    return ((m - _EPS) / alpha[idx] - g0) / g1


class _Coordinate:
    """One template + overrides, resolved once; evaluates the integer quantities for an
    array of values of one coordinate (simplex, component)."""

    def __init__(self, template: Template, overrides: Mapping[str, Any] | None,
                 simplex: str, component: str, tech: TechLibrary | None,
                 convention: str = "held") -> None:
        if convention not in CONVENTIONS:
            raise ConfigError("unknown coordinate convention", key="convention",
                              value=convention, allowed=", ".join(CONVENTIONS))
        if simplex not in SIMPLEXES:
            raise ConfigError("unknown budget simplex", key="simplex", value=simplex,
                              allowed=", ".join(SIMPLEXES))
        spec = _as_template(template)
        allowed = PERIMETER_KEYS if simplex == "perimeter" else spec.budget_keys
        if component not in allowed:
            raise ConfigError(f"unknown {simplex} component", key="component", value=component,
                              allowed=", ".join(allowed))
        self.spec, self.simplex, self.component = spec, simplex, component
        self.overrides = dict(overrides or {})
        self.lib = lib = tech if tech is not None else library()
        self.tech = tech
        inp = _inputs(spec, overrides)
        self.inp = inp
        node = lib.logic(inp.logic_node)
        self.levels = spec.memory
        self.srams = [lib.sram(inp.memory_tech[i], node.name) for i in range(len(self.levels) - 1)]
        self.dram = lib.dram(inp.memory_tech[-1])
        self.links = {kind: lib.link(name) for kind, name in inp.links.items() if name is not None}
        rows, cols = spec.mcu.array
        scale = rows * cols / (node.mcu_array[0] * node.mcu_array[1])
        self.mcu_area = node.mcu_area_mm2 * scale
        self.mcu_power = node.mcu_power_W * scale
        self.k = spec.mcus_per_bundle
        self.core_vf = node.vf
        self.A = inp.chip_area_mm2
        self.T = inp.tdp_W
        self.perimeter_mm = 4.0 * math.sqrt(inp.chip_area_mm2)
        fractions = {"area": inp.area, "power": inp.power, "perimeter": inp.perimeter}[simplex]
        keys = PERIMETER_KEYS if simplex == "perimeter" else spec.budget_keys
        self.fractions = {key: float(fractions.get(key, 0.0)) for key in keys}
        self.base = self.fractions[component]
        others = sum(v for key, v in self.fractions.items() if key != component)
        # proportional with the component at 1 already: the others are 0, as when held
        self.proportional = convention == "proportional" and self.base < 1.0
        self.f_max = 1.0 if self.proportional else min(1.0, max(0.0, 1.0 - others))

    def simplex_at(self, f: Any) -> dict[str, Any]:
        """The moving simplex's fractions at coordinate value(s) ``f``."""
        if not self.proportional:
            return {**self.fractions, self.component: f}
        scale = (1.0 - f) / (1.0 - self.base)
        return {key: f if key == self.component else v * scale
                for key, v in self.fractions.items()}

    def overrides_at(self, x: float) -> dict[str, Any]:
        """AGE overrides that build the design at coordinate value ``x``."""
        key = SIMPLEXES[self.simplex]
        return {**self.overrides, key: {k: float(v) for k, v in self.simplex_at(x).items()}}

    def linear(self, simplex: str, key: str) -> tuple[float, float]:
        """(g0, g1): fraction ``key`` of ``simplex`` is g0 + g1·f along the coordinate."""
        if simplex != self.simplex:
            inp = self.inp
            return float({"area": inp.area, "power": inp.power,
                          "perimeter": inp.perimeter}[simplex].get(key, 0.0)), 0.0
        if key == self.component:
            return 0.0, 1.0
        v = self.fractions.get(key, 0.0)
        if not self.proportional:
            return v, 0.0
        return v / (1.0 - self.base), -v / (1.0 - self.base)

    # -- the model ---------------------------------------------------------------------------

    def evaluate(self, f: np.ndarray) -> dict[str, np.ndarray]:
        """Integer quantities (float arrays holding integers) and ``feasible`` (bool) at the
        coordinate values ``f`` — the AGE's integer arithmetic, operation for operation."""
        inp, A, T = self.inp, self.A, self.T
        f = np.asarray(f, dtype=float)
        area, power, perim = dict(inp.area), dict(inp.power), dict(inp.perimeter)
        {"area": area, "power": power, "perimeter": perim}[self.simplex].update(self.simplex_at(f))
        out: dict[str, np.ndarray] = {}
        with np.errstate(divide="ignore", invalid="ignore"):
            # core (age._core)
            a = area.get("core", 0.0) * A
            budget = power.get("core", 0.0) * T
            b_area = _floor(a / self.mcu_area) // self.k
            vf = self.core_vf
            bundles, ok_power = _fit_units(b_area, self.k * self.mcu_power, 0.0, budget,
                                           vf.power_ratio(vf.min_V))
            feasible = (b_area > 0) & ok_power
            bundles = np.where(feasible, bundles, 0.0)
            mcus = bundles * self.k
            out["core.bundles"], out["core.mcus"] = bundles, mcus
            # SRAM levels (age._sram)
            instances_of = {"mcu": mcus, "bundle": bundles}
            inner = mcus
            for level, sram in zip(self.levels[:-1], self.srams, strict=True):
                n = instances_of.get(level.scope, np.ones_like(mcus))
                n_safe = np.maximum(n, 1.0)
                clients = np.maximum(1.0, inner // n_safe)
                per_bank = sram.bank_area_mm2 + clients * sram.crossbar_area_per_port_mm2
                banks = _floor(area.get(level.name, 0.0) * A / n_safe / per_bank)
                static = banks * n * sram.bank_static_power_W
                feasible &= (banks > 0) & np.logical_not(power.get(level.name, 0.0) * T <= static)
                out[f"{level.name}.banks_per_instance"] = banks
                out[f"{level.name}.capacity_per_instance_B"] = banks * sram.bank_capacity_B
                out[f"{level.name}.instances"] = n * np.ones_like(banks)
                inner = n
            # main memory (age._dram)
            d = self.dram
            name = self.levels[-1].name
            limits = (
                _floor(np.asarray((inp.node_area_mm2 - A) / d.device_area_mm2)),
                _floor(area.get("dram_ctrl", 0.0) * A / d.controller_area_mm2),
                _floor(perim.get("dram", 0.0) * self.perimeter_mm * d.link_density_per_mm
                       / d.links_per_device),
            )
            units = np.minimum(np.minimum(limits[0], limits[1]), limits[2])
            devices, ok = _fit_units(units, d.device_power_W, d.device_static_power_W,
                                     power.get("dram_ctrl", 0.0) * T, d.vf.power_ratio(d.vf.min_V))
            feasible &= (units > 0) & ok
            out[f"{name}.devices"] = devices
            out[f"{name}.pins"] = devices * d.links_per_device
            # links (age._link)
            for kind, lt in self.links.items():
                key = f"{kind}_links"
                by_area = _floor(area.get(key, 0.0) * A / lt.lane_area_mm2)
                by_edge = _floor(perim.get(kind, 0.0) * self.perimeter_mm * lt.lane_density_per_mm)
                ports = np.minimum(by_area, by_edge) // lt.lanes_per_port
                used, ok = _fit_units(ports, lt.port_power_W, 0.0, power.get(key, 0.0) * T,
                                      lt.vf.power_ratio(lt.vf.min_V))
                feasible &= (ports > 0) & ok
                out[f"{key}.ports"] = used
                out[f"{key}.lanes"] = used * lt.lanes_per_port
        shape = f.shape
        out = {q: v if np.shape(v) == shape else np.broadcast_to(v, shape)
               for q, v in out.items()}
        out[FEASIBLE] = np.broadcast_to(feasible, shape)
        return out

    # -- candidate thresholds ----------------------------------------------------------------

    def candidates(self, hi: float) -> np.ndarray:
        """A superset of the fractions in (0, hi] where a quantity or feasibility can change
        (closed forms; see docs/age-cliffs.md)."""
        if self.proportional:
            return self._candidates_proportional(0.0, hi)
        s, c, A, T = self.simplex, self.component, self.A, self.T
        none = np.empty(0)

        def upto(n: float) -> np.ndarray:       # 1, 2, ..., n (n capped for safety)
            return np.arange(1.0, max(0.0, min(n, 5e6)) + 1.0)

        d = self.dram
        if s == "area" and c == "core":
            vf = self.core_vf
            one = self.k * self.mcu_power * vf.power_ratio(vf.min_V)
            p = self.inp.power.get("core", 0.0) * T
            jmax = min(math.floor(hi * A / self.mcu_area) // self.k, math.floor(p / one)) + 1
            return (upto(jmax) * self.k - _EPS) * self.mcu_area / A
        if s == "power" and c == "core":
            vf = self.core_vf
            one = self.k * self.mcu_power * vf.power_ratio(vf.min_V)
            b_area = math.floor(self.inp.area.get("core", 0.0) * A / self.mcu_area + _EPS) // self.k
            return upto(min(b_area + 1, math.floor(hi * T / one) + 1)) * one / T
        levels = {lv.name: (lv, t) for lv, t in zip(self.levels[:-1], self.srams, strict=True)}
        if c in levels and s in ("area", "power"):
            at = {q: float(v[0]) for q, v in self.evaluate(np.array([self.base])).items()}
            if not at["core.bundles"]:
                return none                      # the core is infeasible on the whole range
            level, sram = levels[c]
            n = at[f"{c}.instances"]
            inner = at["core.mcus"]
            for lv in self.levels[:-1]:          # clients = instances of the level before
                if lv.name == c:
                    break
                inner = at[f"{lv.name}.instances"]
            clients = max(1.0, inner // n)
            per_bank = sram.bank_area_mm2 + clients * sram.crossbar_area_per_port_mm2
            if s == "area":
                return (upto(math.floor(hi * A / n / per_bank) + 1) - _EPS) * per_bank * n / A
            banks = at[f"{c}.banks_per_instance"]
            return np.array([banks * n * sram.bank_static_power_W / T]) if banks else none
        if c in ("dram_ctrl", "dram"):
            pkg = math.floor((self.inp.node_area_mm2 - A) / d.device_area_mm2 + _EPS)
            ctrl = math.floor(self.inp.area.get("dram_ctrl", 0.0) * A / d.controller_area_mm2 + _EPS)
            edge = math.floor(self.inp.perimeter.get("dram", 0.0) * self.perimeter_mm
                              * d.link_density_per_mm / d.links_per_device + _EPS)
            if s == "area":
                return (upto(min(pkg, edge) + 1) - _EPS) * d.controller_area_mm2 / A
            if s == "perimeter":
                return ((upto(min(pkg, ctrl) + 1) - _EPS) * d.links_per_device
                        / (self.perimeter_mm * d.link_density_per_mm))
            one = d.device_static_power_W + d.device_power_W * d.vf.power_ratio(d.vf.min_V)
            return upto(min(pkg, ctrl, edge) + 1) * one / T
        kind = c[:-len("_links")] if c.endswith("_links") else c
        if kind in self.links and (c.endswith("_links") or s == "perimeter"):
            lt = self.links[kind]
            key = f"{kind}_links"
            by_area = math.floor(self.inp.area.get(key, 0.0) * A / lt.lane_area_mm2 + _EPS)
            by_edge = math.floor(self.inp.perimeter.get(kind, 0.0) * self.perimeter_mm
                                 * lt.lane_density_per_mm + _EPS)
            one = lt.port_power_W * lt.vf.power_ratio(lt.vf.min_V)
            p_units = math.floor(self.inp.power.get(key, 0.0) * T / one)
            lpp = lt.lanes_per_port
            if s == "area":
                j = upto(min(by_edge // lpp, p_units) + 1)
                return (j * lpp - _EPS) * lt.lane_area_mm2 / A
            if s == "perimeter":
                j = upto(min(by_area // lpp, p_units) + 1)
                return (j * lpp - _EPS) / (self.perimeter_mm * lt.lane_density_per_mm)
            return upto(min(by_area, by_edge) // lpp + 1) * one / T
        return none                              # a component the template does not use

    def _candidates_proportional(self, lo: float, hi: float) -> np.ndarray:
        """Candidates when every fraction of the simplex moves (linearly in f): each floor
        site's integer crossings, the SRAM sites per bundle plateau."""
        A, T, Pm = self.A, self.T, self.perimeter_mm
        inp = self.inp
        found: list[np.ndarray] = []

        def crossings(g: tuple[float, float], alpha: float, eps: float, step: int = 1,
                      cap: float = 5e6, a: float = lo, b: float = hi) -> None:
            g0, g1 = g
            if g1 == 0.0 or not alpha > 0.0 or not b > a:
                return
            va, vb = alpha * (g0 + g1 * a), alpha * (g0 + g1 * b)
            m_lo = max(1, math.floor(min(va, vb) / step))
            m_hi = min(math.ceil(max(va, vb) / step) + 1, math.floor(cap / step) + 1)
            if m_hi < m_lo:
                return
            m = np.arange(m_lo, m_hi + 1, dtype=float) * step
            found.append(((m - eps) / alpha - g0) / g1)

        def ends(g: tuple[float, float], alpha: float) -> float:
            return max(alpha * (g[0] + g[1] * lo), alpha * (g[0] + g[1] * hi))

        # core: MCUs by area (bundles at multiples of k), bundles by power
        vf = self.core_vf
        one = self.k * self.mcu_power * vf.power_ratio(vf.min_V)
        core_a = self.linear("area", "core")
        crossings(core_a, A / self.mcu_area, _EPS, self.k)
        crossings(self.linear("power", "core"), T / one, 0.0,
                  cap=ends(core_a, A / self.mcu_area) / self.k + 1)
        # SRAM levels, per bundle plateau (instances and clients are constant on one)
        cuts = np.unique(np.concatenate([lo, hi, *found], axis=None))
        cuts = cuts[(cuts >= lo) & (cuts <= hi)]
        if cuts.size >= 2:
            mids = 0.5 * (cuts[:-1] + cuts[1:])
            at = self.evaluate(mids)
            inner = np.asarray(at["core.mcus"])
            for level, sram in zip(self.levels[:-1], self.srams, strict=True):
                n = np.maximum(np.asarray(at[f"{level.name}.instances"]), 1.0)
                clients = np.maximum(1.0, inner // n)
                per_bank = sram.bank_area_mm2 + clients * sram.crossbar_area_per_port_mm2
                banks = np.asarray(at[f"{level.name}.banks_per_instance"])
                g_area, g_power = self.linear("area", level.name), self.linear("power", level.name)
                static_T = banks * n * sram.bank_static_power_W / T
                a, b = cuts[:-1], cuts[1:]
                if g_area[1] != 0.0:
                    found.append(_crossings_each(g_area, A / n / per_bank, a, b))
                if g_power[1] != 0.0:
                    t = (static_T - g_power[0]) / g_power[1]
                    found.append(t[(a <= t) & (t <= b)])
                inner = np.asarray(at[f"{level.name}.instances"])
        # main memory: controller area, perimeter and power sites
        d = self.dram
        pkg = math.floor((inp.node_area_mm2 - A) / d.device_area_mm2 + _EPS)
        crossings(self.linear("area", "dram_ctrl"), A / d.controller_area_mm2, _EPS, cap=pkg)
        crossings(self.linear("perimeter", "dram"), Pm * d.link_density_per_mm / d.links_per_device,
                  _EPS, cap=pkg)
        one = d.device_static_power_W + d.device_power_W * d.vf.power_ratio(d.vf.min_V)
        crossings(self.linear("power", "dram_ctrl"), T / one, 0.0, cap=pkg + 1)
        # links: lanes by area and by edge (ports at multiples of lanes per port), power
        for kind, lt in self.links.items():
            key, lpp = f"{kind}_links", lt.lanes_per_port
            g_a, a_alpha = self.linear("area", key), A / lt.lane_area_mm2
            g_e, e_alpha = self.linear("perimeter", kind), Pm * lt.lane_density_per_mm
            crossings(g_a, a_alpha, _EPS, lpp, cap=ends(g_e, e_alpha) + lpp)
            crossings(g_e, e_alpha, _EPS, lpp, cap=ends(g_a, a_alpha) + lpp)
            one = lt.port_power_W * lt.vf.power_ratio(lt.vf.min_V)
            crossings(self.linear("power", key), T / one, 0.0,
                      cap=min(ends(g_a, a_alpha), ends(g_e, e_alpha)) / lpp + 1)
        return np.concatenate(found) if found else np.empty(0)

    def clip(self, lo: float, hi: float) -> tuple[float, float]:
        return max(0.0, float(lo)), min(self.f_max, float(hi))

    def plateaus(self, lo: float, hi: float) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Sorted thresholds t_1 < … < t_n in (lo, hi] and the quantities on the n + 1
        plateaus [lo, t_1), [t_1, t_2), …, [t_n, hi]."""
        cand = self.candidates(hi)
        cand = np.unique(cand[(cand > lo) & (cand <= hi)])
        bounds = np.concatenate(([lo], cand, [hi]))
        reps = 0.5 * (bounds[:-1] + bounds[1:])
        if cand.size and cand[-1] == hi:
            reps[-1] = hi
        return cand, self.evaluate(reps)


# --- public API -------------------------------------------------------------------------------


def coordinate_range(template: Template, overrides: Mapping[str, Any] | None, simplex: str,
                     component: str, *, convention: str = "held") -> tuple[float, float]:
    """``(0, f_max)``: the range of the coordinate's fraction that keeps its simplex valid:
    ``f_max = 1 − Σ other fractions`` when they are held, 1 when they scale."""
    return 0.0, _Coordinate(template, overrides, simplex, component, None, convention).f_max


def coordinate_overrides(template: Template, overrides: Mapping[str, Any] | None,
                         simplex: str, component: str, fraction: float, *,
                         convention: str = "held") -> dict[str, Any]:
    """The AGE overrides of the design at ``fraction`` on the coordinate: ``overrides``
    with the simplex's fractions as the convention moves them (all of that simplex's
    keys written out)."""
    coord = _Coordinate(template, overrides, simplex, component, None, convention)
    return coord.overrides_at(float(fraction))


def steps(template: Template, overrides: Mapping[str, Any] | None, simplex: str,
          component: str, lo: float = 0.0, hi: float = 1.0, *,
          convention: str = "held", tech: TechLibrary | None = None) -> list[Step]:
    """Every step of an integer quantity of the AGE's design along one budget coordinate.

    Args:
        template: an architecture template (spec, preset name, path or dict).
        overrides: AGE overrides (:data:`crossflow.arch.age.OVERRIDE_KEYS`) fixing every
            other input — the other fractions of all three simplexes, logic node, DRAM, …
        simplex: ``"area"``, ``"power"`` or ``"perimeter"``.
        component: a key of that simplex (``core``, a memory level such as ``registers``,
            ``dram_ctrl``, ``intra_links``, ``inter_links``; for perimeter ``dram``,
            ``intra``, ``inter``).
        lo, hi: the range of the component's fraction, clipped to ``[0, f_max]``.
        convention: how the other fractions of the simplex move (module docstring):
            ``"held"`` (default: they keep their values, the slack absorbs the change) or
            ``"proportional"`` (they and the slack scale by ``(1 − f) / (1 − f₀)``, as a
            move of one logit of the searches' softmax encoding does).

    Returns:
        The steps with ``lo < fraction <= hi``, sorted by fraction (then quantity name), one
        :class:`Step` per quantity that changes; where the design becomes feasible or
        infeasible, one step of ``"feasible"`` (0/1) instead.  Thresholds are exact to the
        float rounding of the AGE's own arithmetic (~1e-15); :func:`edges` returns
        fractions verified against ``generate()``.
    """
    coord = _Coordinate(template, overrides, simplex, component, tech, convention)
    return _steps(coord, *coord.clip(lo, hi))


def thresholds(template: Template, overrides: Mapping[str, Any] | None, simplex: str,
               component: str, only: tuple[str, ...], *,
               convention: str = "held") -> list[float]:
    """The fractions of :func:`steps` over the coordinate's whole range, sorted and each
    once, of the quantities whose names start with one of ``only`` (``"feasible"`` among
    them for the feasibility steps): what a search that snaps its moves to step edges
    needs, without building the thousands of :class:`Step` records of every quantity."""
    coord = _Coordinate(template, overrides, simplex, component, None, convention)
    lo, hi = coord.clip(0.0, 1.0)
    if not hi > lo:
        return []
    cand, vals = coord.plateaus(lo, hi)
    keep = np.zeros(cand.size, dtype=bool)
    for _, idx in _changes(vals, only):
        keep[idx] = True
    return cand[keep].tolist()


def _steps(coord: _Coordinate, lo: float, hi: float) -> list[Step]:
    if not hi > lo:
        return []
    cand, vals = coord.plateaus(lo, hi)
    return _diff(cand, vals)


def _changes(vals: Mapping[str, np.ndarray], only: tuple[str, ...] | None = None):
    """``(quantity, i)`` for each quantity and the indices ``i`` where it differs between
    plateaus ``i`` and ``i + 1``: feasibility wherever it flips, any other quantity only
    where both plateaus are feasible; only the quantities whose names start with one of
    ``only`` (None: all)."""
    feas = np.asarray(vals[FEASIBLE])
    if only is None or FEASIBLE.startswith(only):
        yield FEASIBLE, np.nonzero(feas[1:] != feas[:-1])[0]
    both = feas[1:] & feas[:-1]
    for q, v in vals.items():
        if q != FEASIBLE and (only is None or q.startswith(only)):
            v = np.asarray(v)
            yield q, np.nonzero(both & (v[1:] != v[:-1]))[0]


def _diff(cand: np.ndarray, vals: Mapping[str, np.ndarray]) -> list[Step]:
    """Steps between neighbouring plateaus (:func:`_changes`)."""
    if not cand.size:
        return []
    ts = cand.tolist()
    out: list[Step] = []
    for q, idx in _changes(vals):
        v = np.asarray(vals[q])
        below, above = v[idx].astype(np.int64).tolist(), v[idx + 1].astype(np.int64).tolist()
        out.extend(map(Step, [ts[i] for i in idx.tolist()], [q] * len(idx), below, above))
    out.sort()
    return out


def edges(template: Template, overrides: Mapping[str, Any] | None, simplex: str,
          component: str, fraction: float, k: int = 2, *, both_sides: bool = False,
          hair: float = 1e-10, convention: str = "held", only: Collection[str] | None = None,
          tech: TechLibrary | None = None) -> list[float]:
    """The fractions a search should evaluate around ``fraction`` on one coordinate.

    Takes the ``k`` nearest step thresholds ``t <= fraction`` and the ``k`` nearest
    ``t > fraction`` (any quantity, feasibility included) over the coordinate's whole valid
    range ``[0, f_max]``, and returns, sorted, for each the fraction ``t + hair`` (clipped to
    ``f_max``): the smallest share that buys the next unit plus a hair against float
    rounding in an encoding.  Each returned fraction is checked with ``generate()`` to build
    the plateau above ``t`` (the hair is grown tenfold, up to 1e-6, until it does).  With
    ``both_sides`` also ``t − hair``, checked to build the plateau below ``t`` (the most of
    the lower unit count: on a power coordinate, the highest voltage before the next unit).
    ``only`` restricts the thresholds to steps of those quantities (a name ending in ``.``,
    e.g. ``"core."``, matches every quantity with that prefix; ``"feasible"`` may be named);
    useful with ``convention="proportional"``, where every component's units step.
    """
    if k < 1:
        return []
    coord = _Coordinate(template, overrides, simplex, component, tech, convention)
    lo, hi = coord.clip(0.0, 1.0)
    if not hi > lo:
        return []
    cand, vals = coord.plateaus(lo, hi)
    found = _diff(cand, vals)
    if only is not None:
        names = tuple(only)
        found = [s for s in found if s.quantity in names
                 or any(n.endswith(".") and s.quantity.startswith(n) for n in names)]
    thresholds = np.unique([s.fraction for s in found])
    i = int(np.searchsorted(thresholds, fraction, side="right"))
    picked = thresholds[max(0, i - k):i + k].tolist()
    want: list[tuple[float, int, dict[str, int]]] = []
    for t in picked:
        p = int(np.searchsorted(cand, t))          # cand[p] == t: plateau p + 1 starts at t
        want.append((t, +1, _row(vals, p + 1)))
        if both_sides:
            want.append((t, -1, _row(vals, p)))
    return sorted({_settle(coord, t, side, row, hair, lo, hi) for t, side, row in want})


def _row(vals: Mapping[str, np.ndarray], i: int) -> dict[str, int]:
    """Plateau i's quantities ({"feasible": 0} when infeasible)."""
    if not vals[FEASIBLE][i]:
        return {FEASIBLE: 0}
    return {q: int(v[i]) for q, v in vals.items()}


def _settle(coord: _Coordinate, t: float, side: int, want: dict[str, int], hair: float,
            lo: float, hi: float) -> float:
    """``t ± hair`` (clipped to [lo, hi]), the hair grown tenfold (up to 1e-6) until the
    model and then ``generate()`` build ``want``."""
    hairs = hair * 10.0 ** np.arange(0, max(1, math.ceil(math.log10(1e-6 / hair)) + 1))
    xs = np.clip(t + side * hairs, lo, hi)
    vals = coord.evaluate(xs)
    for j, x in enumerate(xs.tolist()):
        if _row(vals, j) == want and _generates(coord, x) == want:
            return x
    return float(xs[-1])


def _generates(coord: _Coordinate, x: float) -> dict[str, int]:
    return quantities_at(coord.spec, coord.overrides_at(x), tech=coord.tech)


# --- pairwise transfers -----------------------------------------------------------------------


class _Transfer(_Coordinate):
    """A pairwise transfer: ``component`` grows by ``t`` and ``donor`` gives up the same
    ``t`` (the other fractions and the slack held); the coordinate is ``t``."""

    def __init__(self, template: Template, overrides: Mapping[str, Any] | None, simplex: str,
                 component: str, donor: str, tech: TechLibrary | None) -> None:
        super().__init__(template, overrides, simplex, component, tech, "held")
        if donor not in self.fractions or donor == component:
            raise ConfigError(f"unknown {simplex} donor", key="donor", value=donor,
                              allowed=", ".join(k for k in self.fractions if k != component))
        self.donor = donor
        self.f_max = self.fractions[donor]

    def simplex_at(self, t: Any) -> dict[str, Any]:
        return {**self.fractions, self.component: self.base + t,
                self.donor: self.fractions[self.donor] - t}


def transfer_amount(template: Template, overrides: Mapping[str, Any] | None, simplex: str,
                    component: str, donor: str, quantity: str, units: int = 1, *,
                    tech: TechLibrary | None = None) -> float | None:
    """The smallest fraction ``t`` that, moved from ``donor`` to ``component`` (the other
    fractions held), makes ``quantity`` grow by ``units`` over its value at ``t = 0``
    with the design feasible, nudged so that ``generate()`` builds it; None when even all
    of the donor's fraction does not (or the design at ``t = 0`` cannot be built).  With
    ``units < 0`` (a quantity of the donor), the largest ``t`` that keeps ``quantity`` at
    its value plus ``units`` (one unit fewer for ``-1``: all the donor can give while it
    keeps that many).

    This is the cost of a *unit exchange*: one more register bank per MCU paid for by the
    core, say, where the core's share going down also leaves fewer MCUs to share the
    registers — both coordinates move, so the step is not a threshold of either alone.
    Found by bisection on the vectorised replica of the AGE (``quantity`` need not be
    monotone in ``t``: the bracket is the first grid point that reaches it)."""
    coord = _Transfer(template, overrides, component=component, donor=donor, simplex=simplex,
                      tech=tech)
    at0 = coord.evaluate(np.array([0.0]))
    if quantity not in at0 or not at0[FEASIBLE][0]:
        return None
    want = float(at0[quantity][0]) + units
    down = units < 0

    def reached(v: Mapping[str, np.ndarray]) -> np.ndarray:
        q = np.asarray(v[quantity])
        feasible = np.asarray(v[FEASIBLE])
        return (q < want) | ~feasible if down else feasible & (q >= want)

    grid = np.linspace(0.0, coord.f_max, 513)[1:]
    ok = np.nonzero(reached(coord.evaluate(grid)))[0]
    if not ok.size:
        if not down:
            return None
        lo = hi = coord.f_max          # the donor can give everything and keep ``want``
    else:
        hi = float(grid[ok[0]])
        lo = float(grid[ok[0] - 1]) if ok[0] > 0 else 0.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if reached(coord.evaluate(np.array([mid])))[0]:
                hi = mid
            else:
                lo = mid
            if hi - lo <= 1e-13 * max(1.0, hi):
                break
    for hair in (1e-10, 1e-9, 1e-8, 1e-7, 1e-6):
        t = max(0.0, lo - hair) if down else min(coord.f_max, hi + hair)
        got = _generates(coord, t)
        if got.get(FEASIBLE) and (got.get(quantity, -1) == want if down
                                  else got.get(quantity, -1) >= want):
            return t
    return None
