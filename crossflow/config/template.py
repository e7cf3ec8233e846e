"""Architecture templates + budgets: the input of the micro-architecture generator (paper §4.2–4.3).

File shape (``presets/templates/*.yaml``, ``kind: architecture``)::

    kind: architecture
    name: case-study
    logic_node: N12                          # a name in the technology library (tech layer)
    mcu: {array: [8, 8], flops_per_cycle: {fp16: 128}, dataflow: best, max_utilization: 0.85}
    mcus_per_bundle: 8
    memory:                                  # innermost first; the last is main memory (DRAM)
      - {name: registers, technology: sram-rf, scope: mcu}
      - {name: L1, technology: sram-l1, scope: bundle}
      - {name: L2, technology: sram-l2, scope: global}
      - {name: DRAM, technology: HBM2, scope: global}
    links: {intra: deepflow-onpkg, inter: NDR-x8}   # null: the chip has no link of that kind
    node_area_mm2: 1230                      # package: chip + DRAM devices (eq. 4)
    chip_area_mm2: 815                       # processor die; perimeter = 4·sqrt(area)
    tdp_W: 300
    area_fractions:  {core, <on-chip level names>, dram_ctrl, intra_links, inter_links}  # of chip area
    power_fractions: {same keys}                                                         # of TDP
    perimeter_fractions: {dram, intra, inter}                                            # of perimeter
    kernel_launch_us: 9

Each fraction is in [0, 1] and each set sums to at most 1; a key left out is 0.  Technology
names are resolved by the generator (the AGE, in the arch layer), which can also
switch them (``overrides``) so that studies can search nodes, memories and links.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from numbers import Real
from typing import Annotated, Literal

from pydantic import Field, model_validator

from crossflow.config.base import Spec
from crossflow.config.device import SCOPES, Precision
from crossflow.errors import ConfigError

Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Unit = Annotated[float, Field(ge=0, le=1)]
Utilization = Annotated[float, Field(gt=0, le=1)]
Count = Annotated[int, Field(ge=1)]
LoopOrder = Literal["ws", "os", "as"]

#: Area / power budget keys besides the on-chip memory levels (named by the template).
COMPONENT_KEYS: tuple[str, ...] = ("core", "dram_ctrl", "intra_links", "inter_links")
PERIMETER_KEYS: tuple[str, ...] = ("dram", "intra", "inter")
#: Slack allowed on a fraction sum (decoded simplexes may round to 1 + a few ulp).
SUM_TOLERANCE = 1e-9


def check_fractions(key: str, fractions: Mapping[str, float], allowed: Iterable[str]) -> None:
    """Raise ConfigError unless every fraction is a known key in [0, 1] and they sum ≤ 1."""
    allowed = tuple(allowed)
    for name, value in fractions.items():
        if name not in allowed:
            raise ConfigError(f"unknown budget component '{name}'", key=f"{key}.{name}",
                              value=value, allowed=", ".join(allowed))
        if isinstance(value, bool) or not isinstance(value, Real) or not 0 <= value <= 1:
            raise ConfigError("a fraction must be a number in [0, 1]", key=f"{key}.{name}",
                              value=value)
    total = sum(fractions.values())
    if total > 1.0 + SUM_TOLERANCE:
        shown = ", ".join(f"{k}={v:g}" for k, v in fractions.items())
        raise ConfigError(f"the fractions sum to {total:.6g}, but must sum to at most 1 ({shown})",
                          key=key, allowed="fractions in [0, 1] with sum <= 1")


class McuSpec(Spec):
    """The minimal compute unit (paper §4.2.1)."""

    #: N_x × N_y multiply–accumulate array (eq. 5); area and power scale with rows·cols
    #: relative to the logic node's MCU
    array: tuple[Count, Count]
    #: FLOP per clock per precision; empty: the logic node's, scaled by the array size
    flops_per_cycle: dict[Precision, Positive] = Field(default_factory=dict)
    dataflow: Literal["ws", "os", "as", "best"] = "best"
    #: sustained fraction of peak (paper §4.2.1 "maximum utilization")
    max_utilization: Utilization = 1.0
    accumulator_fraction: Utilization = 0.5


class TemplateMemoryLevelSpec(Spec):
    name: str = Field(min_length=1)
    technology: str = Field(min_length=1)
    scope: Literal["mcu", "bundle", "global"]
    efficiency: Utilization = 1.0
    loop_orders: tuple[LoopOrder, ...] = Field(default=("ws", "os", "as"), min_length=1)


class TemplateLinksSpec(Spec):
    intra: str | None = None
    inter: str | None = None


class ArchitectureTemplateSpec(Spec):
    kind: Literal["architecture"]
    name: str
    description: str = ""
    logic_node: str
    mcu: McuSpec
    mcus_per_bundle: Count
    memory: tuple[TemplateMemoryLevelSpec, ...] = Field(min_length=2)
    links: TemplateLinksSpec = Field(default_factory=TemplateLinksSpec)
    node_area_mm2: Positive
    chip_area_mm2: Positive
    tdp_W: Positive
    area_fractions: dict[str, Unit]
    power_fractions: dict[str, Unit]
    perimeter_fractions: dict[Literal["dram", "intra", "inter"], Unit] = Field(
        default_factory=dict)
    kernel_launch_s: NonNegative = 0.0

    @property
    def onchip_levels(self) -> tuple[TemplateMemoryLevelSpec, ...]:
        return self.memory[:-1]

    @property
    def budget_keys(self) -> tuple[str, ...]:
        """Keys of area_fractions / power_fractions: core, the on-chip levels, DRAM, links."""
        return ("core", *(m.name for m in self.onchip_levels), *COMPONENT_KEYS[1:])

    @model_validator(mode="after")
    def _consistent(self) -> ArchitectureTemplateSpec:
        names = [m.name for m in self.memory]
        for i, name in enumerate(names):
            if name in COMPONENT_KEYS or names.index(name) != i:
                raise ConfigError(
                    "memory level names must be unique and differ from the budget components "
                    f"{', '.join(COMPONENT_KEYS)}", key=f"memory[{i}].name", value=name)
        order = [SCOPES.index(level.scope) for level in self.memory]
        if order != sorted(order):
            raise ConfigError(
                "memory levels must go from the innermost (scope mcu) to the outermost "
                f"(scope global), but the scopes are {[m.scope for m in self.memory]}",
                key="memory")
        if self.memory[-1].scope != "global":
            raise ConfigError("the last memory level (main memory, DRAM) must have scope "
                              "'global'", key=f"memory[{len(self.memory) - 1}].scope",
                              value=self.memory[-1].scope)
        if self.chip_area_mm2 > self.node_area_mm2:
            raise ConfigError(
                f"the processor chip ({self.chip_area_mm2:g} mm2) must fit in the node area "
                f"budget ({self.node_area_mm2:g} mm2)", key="chip_area_mm2",
                value=self.chip_area_mm2)
        check_fractions("area_fractions", self.area_fractions, self.budget_keys)
        check_fractions("power_fractions", self.power_fractions, self.budget_keys)
        check_fractions("perimeter_fractions", self.perimeter_fractions, PERIMETER_KEYS)
        return self
