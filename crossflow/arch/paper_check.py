"""The case-study chip against the DeepFlow paper's §9 technology numbers.

The paper names its §9 technologies with one bandwidth each: HBM2 1 TB/s, HBM2e 2 TB/s,
HBM3 2.6 TB/s, HBM4 3.3 TB/s (per accelerator: 4 stacks), InfiniBand NDR-x8 100 GB/s,
XDR-x8 200 GB/s, GDR-x8 3.3 TB/s (per x8 port), and 2 TB/s for the intra-package links of
its multi-node packages (§9.2, Fig. 11).  The technology library is calibrated so that those
numbers are the *nominal* bandwidth of 4 stacks and of one x8 port; the AGE then builds as
many devices / ports as the template's area, perimeter and power budgets allow and runs them
at the voltage the power budget pays for.  :func:`paper_check` puts the two side by side;
``docs/paper-section9.md`` explains the differences with these numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crossflow.arch.age import generate
from crossflow.config.template import ArchitectureTemplateSpec
from crossflow.errors import InfeasibleDesignError
from crossflow.tech.library import TechLibrary, library

#: (technology, what the paper's number is for, the paper's number in B/s), deepflow §9.
PAPER_SECTION9: tuple[tuple[str, str, float], ...] = (
    ("HBM2", "dram", 1.0e12),
    ("HBM2e", "dram", 2.0e12),
    ("HBM3", "dram", 2.6e12),
    ("HBM4", "dram", 3.3e12),
    ("NDR-x8", "inter", 100e9),
    ("XDR-x8", "inter", 200e9),
    ("GDR-x8", "inter", 3.3e12),
)
#: §9.2 (Fig. 11): "2TB/s link bandwidth for the intra-package links".
PAPER_INTRA_Bps = 2.0e12


def paper_check(template: ArchitectureTemplateSpec | str | Path | Mapping[str, Any]
                = "deepflow-case-study", *, overrides: Mapping[str, Any] | None = None,
                tech: TechLibrary | None = None) -> list[dict[str, Any]]:
    """Per §9 technology, the paper's number next to what the AGE builds at the template's
    budget split (``overrides`` on top, the technology swapped in as a §9 sweep does).

    Each row (all bandwidths in B/s, per direction for links):

    * ``technology``, ``kind`` (``dram`` | ``inter`` | ``intra``), ``paper_Bps``;
    * ``units`` (DRAM devices or link ports the AGE builds) and ``unit_nominal_Bps`` (one
      device / one port at nominal voltage: equal to the paper's per-x8 figure for links,
      a quarter of it for DRAM, whose figure is for 4 stacks);
    * ``nominal_Bps`` = units × unit_nominal_Bps, ``age_Bps`` (what the AGE gives: V/f-scaled
      under the power budget), ``age_unit_Bps`` = age_Bps / units;
    * ``ratio`` = age_Bps / paper_Bps, ``unit_ratio`` = age_unit_Bps / unit_nominal_Bps
      (the V/f frequency ratio);
    * ``count_limit`` (what bounds the unit count: area, perimeter, package_area,
      controller_area, power), ``voltage_V``, ``voltage_limit``, ``power_budget_W`` and
      ``unit_nominal_power_W`` (one unit at nominal voltage, both link directions busy);
    * ``infeasible``: the AGE's message, instead of the numbers, where it cannot build it.
    """
    lib = tech if tech is not None else library()
    base = dict(overrides or {})
    rows: list[dict[str, Any]] = []
    for name, kind, paper in (*PAPER_SECTION9, (None, "intra", PAPER_INTRA_Bps)):
        o = dict(base)
        if kind == "dram":
            o["dram"] = name
        elif kind == "inter":
            o["inter_link"] = name
        row: dict[str, Any] = {"technology": name, "kind": kind, "paper_Bps": paper}
        try:
            arch = generate(template, overrides=o, tech=tech)
        except InfeasibleDesignError as exc:
            rows.append({**row, "infeasible": str(exc)})
            continue
        comps = arch.report["components"]
        if kind == "dram":
            level = arch.memory[-1]
            rep = comps[level.name]
            d = lib.dram(rep["technology"])
            units, nominal_unit = rep["devices"], d.device_bandwidth_Bps
            unit_power = d.device_power_W + d.device_static_power_W
            age = level.bandwidth_Bps
        else:
            rep = comps.get(f"{kind}_links")
            if rep is None or "ports" not in rep:
                rows.append({**row, "infeasible": f"the template has no {kind}-node link"})
                continue
            units = rep["ports"]
            nominal_unit = lib.link(rep["technology"]).port_bandwidth_Bps
            unit_power = lib.link(rep["technology"]).port_power_W
            age = rep["bandwidth_Bps"]
        row.update({
            "technology": rep["technology"],
            "units": units,
            "unit_nominal_Bps": nominal_unit,
            "nominal_Bps": units * nominal_unit,
            "age_Bps": age,
            "age_unit_Bps": age / units,
            "ratio": age / paper,
            "unit_ratio": age / units / nominal_unit,
            "count_limit": rep["count_limit"],
            "voltage_V": rep["voltage_V"],
            "voltage_limit": rep["voltage_limit"],
            "power_budget_W": rep["power_budget_W"],
            "unit_nominal_power_W": unit_power,
        })
        rows.append(row)
    return rows
