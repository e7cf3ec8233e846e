"""Technology library: logic nodes, SRAM, DRAM and link technologies by name
(docs/architecture.md, "Layers").

>>> from crossflow.tech import library
>>> lib = library()                 # presets/tech/*.yaml, loaded once
>>> lib.logic("N7").mcu_area_mm2    # derived from N12 by the paper's §9 rule
>>> lib.sram("sram-l2", node="N5"), lib.dram("HBM3"), lib.link("NVLink4")

An unknown name is a :class:`~crossflow.errors.ConfigError` that lists the names that exist.
"""

from crossflow.tech.library import (
    DramTech,
    LinkTech,
    LogicNode,
    SramTech,
    TechLibrary,
    library,
    load_library,
)
from crossflow.tech.vf import VoltageFrequency, solve_voltage

__all__ = [
    "DramTech",
    "LinkTech",
    "LogicNode",
    "SramTech",
    "TechLibrary",
    "VoltageFrequency",
    "library",
    "load_library",
    "solve_voltage",
]
