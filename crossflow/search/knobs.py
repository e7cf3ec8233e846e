"""The hardware knobs a study can search or fix, in one place: their names (the search
space checks dimensions against them), how to read them off an architecture template (the
study's baseline trial) and how to write them back into one (the exported design).  AGE
overrides by the same names are applied by :func:`crossflow.arch.age.generate`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Named dimensions that pick a technology from the library, by library category (besides
#: ``memory.<level>``, one per memory level of the template).
TECHNOLOGY_CATEGORY = {"logic_node": "logic", "dram": "dram", "intra_link": "links",
                       "inter_link": "links"}
TECHNOLOGY_DIMS = tuple(TECHNOLOGY_CATEGORY)
#: Named dimensions that are numbers of the template (its power and areas).
SCALAR_DIMS = ("tdp_W", "chip_area_mm2", "node_area_mm2")
#: Named dimensions that become AGE overrides (need an architecture template).
HARDWARE_PARAMS = (*TECHNOLOGY_DIMS, *SCALAR_DIMS)


def template_hardware(template, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The value of every hardware knob of an architecture template with AGE ``overrides``
    applied: :data:`HARDWARE_PARAMS` and ``memory.<level>`` (technology names, numbers)."""
    o = overrides or {}
    current = {"logic_node": template.logic_node, "dram": template.memory[-1].technology,
               "intra_link": template.links.intra, "inter_link": template.links.inter,
               **{k: getattr(template, k) for k in SCALAR_DIMS}}
    current = {k: o.get(k, v) for k, v in current.items()}
    for m in template.memory:
        current[f"memory.{m.name}"] = (o.get("memory") or {}).get(m.name, m.technology)
    return current


def write_hardware(doc: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` (a template dumped to JSON) with the hardware knobs of ``overrides`` written
    in: the inverse of :func:`template_hardware`, for an exported design."""
    o = overrides
    memory = doc["memory"]
    if "dram" in o:
        memory[-1]["technology"] = o["dram"]
    for level, tech in (o.get("memory") or {}).items():
        next(m for m in memory if m["name"] == level)["technology"] = tech
    if "logic_node" in o:
        doc["logic_node"] = o["logic_node"]
    for kind in ("intra", "inter"):
        if f"{kind}_link" in o:
            doc["links"][kind] = o[f"{kind}_link"]
    for key in SCALAR_DIMS:
        if key in o:
            doc[key] = float(o[key])
    return doc
