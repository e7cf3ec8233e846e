"""Search spaces: what a study may change, as Optuna distributions
(docs/architecture.md, "Data flow of one study trial").

(Over 600 lines, one module on purpose: a dimension is checked in two halves that must
agree, alone in the file's schema and against the workload and template when resolved;
the hardware knobs themselves are in :mod:`crossflow.search.knobs`.)

File shape (``search_spaces/*.yaml``, ``kind: search_space``; a study may also give one
inline)::

    kind: search_space
    name: joint-budgets
    description: …
    simplexes:                 # budget splits, each encoded so that every sample is valid
      area: all                # or a list: [core, registers, L1, L2, dram_ctrl]
      power: [core, L2, dram_ctrl]
      perimeter: all           # over dram, intra, inter
    strategy:                  # a categorical over the valid strategies for the devices
      kernel_types: [RC, CR]   # default: RC, CR (gemm, lstm) or TP (transformer)
      max_tp: 8                # cap on kp1 * kp2
      virtual_stages: [1, 2]
      sequence_parallel: [false, true]
      # choices: [RC-4-2-d32-p2, …]   instead: an explicit list
    mapping_order: true        # all 24 orders; or a list such as [kp1-kp2-dp-lp, dp-lp-kp1-kp2]
    params:                    # other named dimensions (Optuna's short forms)
      logic_node: [N12, N7, N5]          # a list: categorical
      tdp_W: {low: 200, high: 400}       # low/high (step, log, type: int|float): a range
      micro_batch_size: [1, 2, 4]

Simplexes.  ``area`` and ``power`` split the chip area and the TDP over ``core``, the
template's on-chip memory levels (``registers``, ``L1``, ``L2`` for the shipped templates),
``dram_ctrl``, ``intra_links`` and ``inter_links``; ``perimeter`` splits the die edge over
``dram``, ``intra`` and ``inter``.  The components a simplex lists are searched; the others
keep the template's fractions, and the searched ones share what those leave
(1 − the fixed sum).  Each simplex is the softmax encoding of
:mod:`crossflow.search.encoding`: Optuna floats ``"{simplex}.{component}"`` and
``"{simplex}.slack"`` in [-SPAN, SPAN].

Named parameters: AGE overrides of :data:`crossflow.arch.age.OVERRIDE_KEYS`
(``logic_node``, ``dram``, ``intra_link``, ``inter_link``, ``memory.<level>``, ``tdp_W``,
``chip_area_mm2``, ``node_area_mm2``; these need an architecture template) and parallelism
options (``micro_batch_size``, ``schedule``, ``zero1`` or Megatron's
``use_distributed_optimizer``, ``use_megatron_fsdp`` (ZeRO-3, Megatron's default sharding),
``overlap_grad_reduce``, ``recompute_granularity``,
``expert_parallel`` and ``expert_tensor_parallel`` for MoE workloads, ``context_parallel``
for transformers: a degree that does not fit a strategy is an invalid combination, dropped
before any evaluation).

The file is checked on its own when loaded (:class:`SearchSpaceSpec`); what depends on the
study — template component names, technology names, the strategies of the device count —
when a study resolves it (:func:`resolve`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, model_validator

from crossflow.config.base import Spec, build
from crossflow.config.loader import register_kind
from crossflow.config.template import PERIMETER_KEYS
from crossflow.errors import ConfigError
from crossflow.parallel import Strategy, check_strategy, enumerate_strategies
from crossflow.search import encoding
from crossflow.search.knobs import HARDWARE_PARAMS, SCALAR_DIMS, TECHNOLOGY_CATEGORY
from crossflow.system import ORDERS, parse_order
from crossflow.tech.library import library

SIMPLEXES = ("area", "power", "perimeter")
#: The AGE override each simplex fills.
SIMPLEX_OVERRIDE = {s: f"{s}_fractions" for s in SIMPLEXES}
#: Named dimensions that go into the parallelism file.
PARALLELISM_PARAMS = ("micro_batch_size", "schedule", "zero1", "overlap_grad_reduce",
                      "recompute_granularity", "use_distributed_optimizer",
                      "use_megatron_fsdp", "expert_parallel", "expert_tensor_parallel",
                      "context_parallel")
_NUMERIC = (*SCALAR_DIMS, "micro_batch_size")
STRATEGY = "strategy"
MAPPING_ORDER = "mapping_order"

Choice = str | bool | int | float | None


class RangeSpec(Spec):
    """A numeric range: an Optuna int or float distribution."""

    low: int | float
    high: int | float
    step: int | float | None = None
    log: bool = False
    #: int or float; default: int when low, high (and step) are integers
    type: Literal["int", "float"] | None = None

    @model_validator(mode="after")
    def _ordered(self) -> RangeSpec:
        if not self.low < self.high:
            raise ConfigError("'low' must be below 'high'", key="high", value=self.high)
        if self.log and self.low <= 0:
            raise ConfigError("a log range needs low > 0", key="low", value=self.low)
        if self.step is not None and not self.step > 0:
            raise ConfigError("must be > 0", key="step", value=self.step)
        if self.step is not None:
            # Optuna would move 'high' down to the last step with a warning: say it here
            span = (self.high - self.low) / self.step
            if span < 1 - 1e-9 or abs(span - round(span)) > 1e-9 * max(1.0, span):
                last = self.low + math.floor(span + 1e-9) * self.step
                raise ConfigError(
                    f"must divide high - low = {self.high - self.low:g} (a range from "
                    f"{self.low:g} in steps of {self.step:g} ends at {last:g}, not at "
                    f"{self.high:g})", key="step", value=self.step,
                    allowed=f"a step that divides {self.high - self.low:g}, or high: {last:g}"
                    if span >= 1 else f"a step <= {self.high - self.low:g}")
        if self.log and self.step is not None and self.dtype == "float":
            raise ConfigError("a float range takes either 'step' or 'log', not both",
                              key="step", value=self.step)
        if self.dtype == "int" and not all(
                float(v).is_integer() for v in (self.low, self.high, self.step or 1)):
            raise ConfigError("an int range needs integer low, high and step", key="type",
                              value=self.type)
        return self

    @property
    def dtype(self) -> str:
        if self.type is not None:
            return self.type
        ints = all(isinstance(v, int) for v in (self.low, self.high))
        return "int" if ints and (self.step is None or isinstance(self.step, int)) else "float"


class StrategySpaceSpec(Spec):
    """The parallelism strategies to search (crossflow.parallel.enumerate_strategies)."""

    #: explicit strategy names; when given, nothing is enumerated
    choices: tuple[str, ...] | None = Field(default=None, min_length=1)
    kernel_types: tuple[Literal["RC", "CR", "TP"], ...] | None = Field(default=None,
                                                                       min_length=1)
    max_tp: int | None = Field(default=None, ge=1)
    #: interleaved virtual stages per pipeline stage; ``all``: every count Megatron allows
    #: (up to layers ÷ pipeline stages, dividing it)
    virtual_stages: tuple[int, ...] | Literal["all"] = Field(default=(1,), min_length=1)
    sequence_parallel: tuple[bool, ...] = Field(default=(False,), min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> StrategySpaceSpec:
        if self.choices is not None:
            given = sorted({"kernel_types", "max_tp", "virtual_stages", "sequence_parallel"}
                           & self.model_fields_set)
            if given:
                raise ConfigError("give either 'choices' or enumeration options, not both",
                                  key=given[0])
            _unique("choices", self.choices)
        for i, vp in enumerate(() if self.virtual_stages == "all" else self.virtual_stages):
            if vp < 1:
                raise ConfigError("must be >= 1", key=f"virtual_stages[{i}]", value=vp)
        return self


class SearchSpaceSpec(Spec):
    """A ``kind: search_space`` file (or a study's inline ``search_space`` mapping)."""

    kind: Literal["search_space"] = "search_space"
    name: str = "inline"
    description: str = ""
    #: simplex (area, power, perimeter) -> "all" or a list of components to search
    simplexes: dict[str, Any] = Field(default_factory=dict)
    #: true (enumerate with defaults) or a StrategySpaceSpec mapping
    strategy: bool | dict[str, Any] = False
    mapping_order: bool | tuple[str, ...] = False
    #: name -> a list of choices or a RangeSpec mapping
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> SearchSpaceSpec:
        for simplex, comps in self.simplexes.items():
            if simplex not in SIMPLEXES:
                raise ConfigError("unknown simplex", key=f"simplexes.{simplex}", value=comps,
                                  allowed=", ".join(SIMPLEXES))
            if comps == "all":
                continue
            if not isinstance(comps, list | tuple) or not all(isinstance(c, str)
                                                              for c in comps):
                raise ConfigError("give 'all' or a list of component names",
                                  key=f"simplexes.{simplex}", value=comps)
            if not comps:
                raise ConfigError("a simplex needs at least one component",
                                  key=f"simplexes.{simplex}", value=list(comps))
            _unique(f"simplexes.{simplex}", comps)
            if simplex == "perimeter":
                for i, c in enumerate(comps):
                    if c not in PERIMETER_KEYS:
                        raise ConfigError("unknown perimeter component",
                                          key=f"simplexes.perimeter[{i}]", value=c,
                                          allowed=", ".join(PERIMETER_KEYS))
        if isinstance(self.mapping_order, tuple):
            if not self.mapping_order:
                raise ConfigError("list at least one order (or true for all 24)",
                                  key="mapping_order", value=[])
            for i, order in enumerate(self.mapping_order):
                try:
                    parse_order(order)
                except ConfigError as exc:
                    raise ConfigError(exc.problem, key=f"mapping_order[{i}]", value=order,
                                      allowed=exc.allowed) from None
            _unique("mapping_order", ["-".join(parse_order(o)) for o in self.mapping_order])
        self.strategy_options  # noqa: B018 - parses and checks
        for name, dist in self.dimensions.items():
            _check_param(name, dist)
        return self

    @property
    def strategy_options(self) -> StrategySpaceSpec | None:
        """The strategy dimension's options (None: strategies are not searched)."""
        if self.strategy is False:
            return None
        if self.strategy is True:
            return StrategySpaceSpec()
        return _build(StrategySpaceSpec, self.strategy, "strategy")

    @property
    def dimensions(self) -> dict[str, tuple[Choice, ...] | RangeSpec]:
        """The named dimensions: choices (categorical) or a range."""
        out: dict[str, tuple[Choice, ...] | RangeSpec] = {}
        for name, dist in self.params.items():
            key = f"params.{name}"
            if isinstance(dist, Mapping):
                out[name] = _build(RangeSpec, dist, key)
            elif isinstance(dist, list | tuple):
                for i, v in enumerate(dist):
                    if not isinstance(v, str | bool | int | float | None):
                        raise ConfigError("a choice must be a string, number, boolean or "
                                          "null", key=f"{key}[{i}]", value=v)
                out[name] = tuple(dist)
            else:
                raise ConfigError("give a list of choices or a range {low, high}", key=key,
                                  value=dist)
        return out


def _build(model: type[Spec], data: Mapping[str, Any], prefix: str) -> Any:
    try:
        return build(model, dict(data))
    except ConfigError as exc:
        key = f"{prefix}.{exc.key}" if exc.key else prefix
        raise ConfigError(exc.problem, key=key, value=exc.value, allowed=exc.allowed) from None


def _unique(key: str, values: Sequence[Any]) -> None:
    seen: set[Any] = set()
    for i, v in enumerate(values):
        if v in seen:
            raise ConfigError("listed twice", key=f"{key}[{i}]", value=v)
        seen.add(v)


def _check_param(name: str, dist: tuple[Choice, ...] | RangeSpec) -> None:
    key = f"params.{name}"
    known = (*HARDWARE_PARAMS, *PARALLELISM_PARAMS)
    if name not in known and not (name.startswith("memory.") and len(name) > 7):
        raise ConfigError("unknown search dimension", key=key, value=name,
                          allowed=", ".join(known) + ", memory.<level>")
    if isinstance(dist, RangeSpec):
        if name not in _NUMERIC:
            raise ConfigError(f"'{name}' is categorical: give a list of choices", key=key)
        if dist.low <= 0:
            raise ConfigError("must be > 0", key=f"{key}.low", value=dist.low)
        if name == "micro_batch_size" and dist.dtype != "int":
            raise ConfigError("micro_batch_size is an integer range", key=f"{key}.type",
                              value=dist.type)
        return
    if not dist:
        raise ConfigError("list at least one choice", key=key, value=[])
    _unique(key, dist)
    for i, v in enumerate(dist):
        where = f"{key}[{i}]"
        if name in ("zero1", "overlap_grad_reduce", "use_distributed_optimizer",
                    "use_megatron_fsdp"):
            ok, allowed = isinstance(v, bool), "true, false"
        elif name == "recompute_granularity":
            ok, allowed = v in ("none", "selective", "full"), "none, selective, full"
        elif name == "schedule":
            ok, allowed = v in ("1f1b", "gpipe"), "1f1b, gpipe"
        elif name in ("micro_batch_size", "expert_parallel", "expert_tensor_parallel",
                      "context_parallel"):
            ok, allowed = isinstance(v, int) and not isinstance(v, bool) and v >= 1, \
                "integers >= 1"
        elif name in _NUMERIC:
            ok, allowed = (isinstance(v, int | float) and not isinstance(v, bool)
                           and v > 0), "numbers > 0"
        elif name in ("intra_link", "inter_link"):
            ok, allowed = v is None or isinstance(v, str), "link technology names or null"
        else:
            ok, allowed = isinstance(v, str), "technology names"
        if not ok:
            raise ConfigError("not an allowed value", key=where, value=v, allowed=allowed)


# --- resolved search space ----------------------------------------------------------------------


@dataclass(frozen=True)
class Simplex:
    """A budget simplex of a study: searched components + the template's fixed ones."""

    name: str
    components: tuple[str, ...]
    #: components the study does not search, at the template's fractions
    fixed: Mapping[str, float]
    #: every component in the template's order (how fractions are reported)
    order: tuple[str, ...] = ()

    @property
    def share(self) -> float:
        """What the fixed components leave to the searched ones."""
        return max(0.0, 1.0 - sum(self.fixed.values()))

    @property
    def param_names(self) -> list[str]:
        return encoding.param_names(self.name, self.components)

    def fractions(self, params: Mapping[str, float]) -> dict[str, float]:
        """Every component's fraction (the fixed ones too) from a trial's parameters."""
        decoded = encoding.decode_params(params, self.name, self.components)
        share = self.share
        out = {**self.fixed, **{c: f * share for c, f in decoded.items()}}
        return {c: out[c] for c in (*self.order, *out) if c in out}

    def params_for(self, fractions: Mapping[str, float]) -> dict[str, float]:
        """Parameter values that decode to ``fractions`` of the searched components (they
        must sum to at most the share; the rest is slack)."""
        share = self.share
        parts = [fractions[c] / share for c in self.components]
        parts.append(max(0.0, 1.0 - sum(parts)))
        total = sum(parts)
        return dict(zip(self.param_names, encoding.encode([p / total for p in parts]),
                        strict=True))


@dataclass(frozen=True)
class Dimension:
    """One named Optuna parameter besides the simplexes."""

    name: str
    kind: Literal["categorical", "int", "float"]
    choices: tuple[Choice, ...] = ()
    low: float = 0.0
    high: float = 0.0
    step: float | None = None
    log: bool = False

    def distribution(self):
        # optuna is imported here, not at the top: the config layer loads this module to
        # read a search_space file, and `crossflow check` / `predict` must not pay for it.
        from optuna.distributions import (
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        if self.kind == "categorical":
            return CategoricalDistribution(self.choices)
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log,
                                   step=int(self.step or 1))
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def on_grid(self, value: float) -> int | float:
        """A number as this range's parameter value: clipped to the range, an integer
        range's (or a stepped one's) on its grid."""
        v = min(self.high, max(self.low, float(value)))
        step = self.step or (1 if self.kind == "int" else None)
        if step:
            top = self.low + math.floor((self.high - self.low) / step + 1e-9) * step
            v = min(top, self.low + round((v - self.low) / step) * step)
        return int(round(v)) if self.kind == "int" else float(v)

    def values(self) -> tuple[Any, ...]:
        """Every value (categoricals and int ranges; empty for a float range)."""
        if self.kind == "categorical":
            return self.choices
        if self.kind == "int":
            return tuple(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        return ()

    def describe(self) -> Any:
        if self.kind == "categorical":
            return list(self.choices)
        out: dict[str, Any] = {"type": self.kind, "low": self.low, "high": self.high}
        if self.step is not None:
            out["step"] = self.step
        if self.log:
            out["log"] = True
        return out


@dataclass(frozen=True)
class Design:
    """A decoded point of a search space: what to build and run."""

    #: simplex name -> every component's fraction (searched and fixed)
    fractions: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    strategy: str | None = None
    mapping_order: str | None = None
    #: AGE overrides from named dimensions (logic_node, dram, memory, links, tdp_W, …)
    hardware: Mapping[str, Any] = field(default_factory=dict)
    #: parallelism options from named dimensions (micro_batch_size, schedule, …)
    parallelism: Mapping[str, Any] = field(default_factory=dict)

    def overrides(self) -> dict[str, Any]:
        """``crossflow.arch.age.generate`` overrides: technology and budget fractions."""
        out = dict(self.hardware)
        for simplex, fr in self.fractions.items():
            out[SIMPLEX_OVERRIDE[simplex]] = dict(fr)
        return out

    def chip_key(self) -> str:
        """Equal for designs that run on the same chip (the AGE is deterministic): their
        :meth:`overrides` as one string."""
        return json.dumps(self.overrides(), sort_keys=True, default=repr)


@dataclass(frozen=True)
class SearchSpace:
    """A search space resolved for a study: simplexes and dimensions, Optuna's view."""

    name: str
    simplexes: tuple[Simplex, ...]
    dimensions: tuple[Dimension, ...]

    def simplex_components(self) -> dict[str, list[str]]:
        """simplex name -> searched component names (the ``gd`` sampler's ``simplexes``)."""
        return {s.name: list(s.components) for s in self.simplexes}

    def dimension(self, name: str) -> Dimension | None:
        return next((d for d in self.dimensions if d.name == name), None)

    def distributions(self) -> dict[str, Any]:
        """Parameter name -> Optuna distribution, in suggestion order."""
        from optuna.distributions import FloatDistribution

        out: dict[str, Any] = {}
        for s in self.simplexes:
            for p in s.param_names:
                out[p] = FloatDistribution(-encoding.SPAN, encoding.SPAN)
        for d in self.dimensions:
            out[d.name] = d.distribution()
        return out

    def suggest(self, trial) -> dict[str, Any]:
        """Ask ``trial`` for every parameter; returns them by name."""
        params: dict[str, Any] = {}
        for s in self.simplexes:
            for p in s.param_names:
                params[p] = trial.suggest_float(p, -encoding.SPAN, encoding.SPAN)
        for d in self.dimensions:
            if d.kind == "categorical":
                params[d.name] = trial.suggest_categorical(d.name, d.choices)
            elif d.kind == "int":
                params[d.name] = trial.suggest_int(d.name, int(d.low), int(d.high),
                                                   step=int(d.step or 1), log=d.log)
            else:
                params[d.name] = trial.suggest_float(d.name, d.low, d.high, step=d.step,
                                                     log=d.log)
        return params

    def decode(self, params: Mapping[str, Any]) -> Design:
        """The design a trial's parameters stand for."""
        fractions = {s.name: s.fractions(params) for s in self.simplexes}
        hardware: dict[str, Any] = {}
        parallelism: dict[str, Any] = {}
        strategy = order = None
        for d in self.dimensions:
            value = params[d.name]
            if d.name == STRATEGY:
                strategy = value
            elif d.name == MAPPING_ORDER:
                order = value
            elif d.name.startswith("memory."):
                hardware.setdefault("memory", {})[d.name[7:]] = value
            elif d.name in PARALLELISM_PARAMS:
                parallelism[d.name] = value
            else:
                hardware[d.name] = float(value) if d.name in _NUMERIC else value
        return Design(fractions, strategy, order, hardware, parallelism)

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary (logged with each study launch)."""
        return {
            "name": self.name,
            "simplexes": {s.name: {"components": list(s.components), "fixed": dict(s.fixed),
                                   "share": s.share, "span": encoding.SPAN}
                          for s in self.simplexes},
            "dimensions": {d.name: d.describe() for d in self.dimensions},
        }


def resolve(spec: SearchSpaceSpec, *, workload: Spec, template: Spec | None,
            template_overrides: Mapping[str, Any], devices: int, distributed: bool,
            prefix: str = "search_space", file: str | None = None) -> SearchSpace:
    """Resolve ``spec`` for a study: check it against the workload, the architecture
    template (None for a fixed device) and the device count; enumerate the strategies.

    Errors are ConfigErrors whose key starts with ``prefix`` (the study's key).
    """
    def err(problem: str, key: str, value: Any = ..., allowed: str | None = None):
        return ConfigError(problem, file=file, key=f"{prefix}.{key}" if prefix else key,
                           value=value, allowed=allowed)

    simplexes: list[Simplex] = []
    if spec.simplexes and template is None:
        first = next(iter(spec.simplexes))
        raise err("budget simplexes need an architecture template as the study's hardware "
                  "(a datasheet preset has no budgets)", f"simplexes.{first}")
    for name in SIMPLEXES:  # a fixed order, whatever the file's
        if name not in spec.simplexes:
            continue
        allowed = PERIMETER_KEYS if name == "perimeter" else template.budget_keys
        comps = spec.simplexes[name]
        comps = tuple(allowed) if comps == "all" else comps
        for i, c in enumerate(comps):
            if c not in allowed:
                raise err(f"unknown {name} component for template {template.name!r}",
                          f"simplexes.{name}[{i}]", c, ", ".join(allowed))
        base = {**getattr(template, SIMPLEX_OVERRIDE[name]),
                **template_overrides.get(SIMPLEX_OVERRIDE[name], {})}
        fixed = {c: float(v) for c, v in base.items() if c not in comps}
        simplex = Simplex(name, tuple(comps), fixed, tuple(allowed))
        if simplex.share <= 0:
            raise err(f"the components it does not search take the whole budget "
                      f"({', '.join(f'{k}={v:g}' for k, v in fixed.items())}), leaving "
                      "nothing to split", f"simplexes.{name}")
        simplexes.append(simplex)

    dims: list[Dimension] = []
    options = spec.strategy_options
    if options is not None:
        if not distributed:
            raise err("a strategy search needs a system (a distributed study)", "strategy")
        dims.append(Dimension(STRATEGY, "categorical",
                              _strategies(spec, options, workload, devices, err)))
    if spec.mapping_order is not False:
        if not distributed:
            raise err("a mapping-order search needs a system (a distributed study)",
                      "mapping_order")
        orders = (ORDERS if spec.mapping_order is True
                  else [parse_order(o) for o in spec.mapping_order])
        dims.append(Dimension(MAPPING_ORDER, "categorical",
                              tuple("-".join(o) for o in orders)))
    for name, dist in spec.dimensions.items():
        _check_resolved_param(name, dist, workload, template, err)
        if isinstance(dist, RangeSpec):
            dims.append(Dimension(name, dist.dtype, (), dist.low, dist.high, dist.step,
                                  dist.log))
        else:
            dims.append(Dimension(name, "categorical", tuple(dist)))
    if not simplexes and not dims:
        raise err("the search space has no dimension (simplexes, strategy, mapping_order "
                  "or params)", "", allowed="at least one")
    return SearchSpace(spec.name, tuple(simplexes), tuple(dims))


def _check_resolved_param(name: str, dist, workload: Spec, template: Spec | None, err) -> None:
    key = f"params.{name}"
    if name in PARALLELISM_PARAMS:
        if name in ("micro_batch_size", "context_parallel") \
                and workload.kind != "transformer":
            raise err(f"{name} applies to transformer workloads, not {workload.kind}", key)
        return
    if template is None:
        raise err("hardware dimensions need an architecture template as the study's "
                  "hardware", key)
    lib = library()
    choices = () if isinstance(dist, RangeSpec) else dist
    if name.startswith("memory."):
        level = name[7:]
        levels = [m.name for m in template.memory]
        if level not in levels:
            raise err(f"template {template.name!r} has no memory level {level!r}", key,
                      allowed=", ".join(f"memory.{m}" for m in levels))
        category = "dram" if level == levels[-1] else "sram"
    else:
        category = TECHNOLOGY_CATEGORY.get(name)
    if category is None:
        return
    names = lib.names(category)
    for i, v in enumerate(choices):
        if v is not None and v not in names:
            raise err("unknown technology name", f"{key}[{i}]", v, ", ".join(names))


def _strategies(spec: SearchSpaceSpec, options: StrategySpaceSpec, workload: Spec,
                devices: int, err) -> tuple[str, ...]:
    mbs_dist = spec.dimensions.get("micro_batch_size")
    if mbs_dist is None:
        mbs_values: tuple[int | None, ...] = (None,)
    elif isinstance(mbs_dist, RangeSpec):
        mbs_values = tuple(range(int(mbs_dist.low), int(mbs_dist.high) + 1,
                                 int(mbs_dist.step or 1)))
    else:
        mbs_values = tuple(mbs_dist)  # type: ignore[arg-type]
    if options.choices is not None:
        names = []
        for i, text in enumerate(options.choices):
            try:
                s = Strategy.parse(text)
                problems = []
                for mbs in mbs_values:
                    try:
                        check_strategy(workload, s, devices=devices, micro_batch_size=mbs)
                        break
                    except ConfigError as exc:
                        problems.append(exc)
                else:
                    raise problems[0]
            except ConfigError as exc:
                raise err(f"{exc.problem} (for {devices} devices)",
                          f"strategy.choices[{i}]", text) from None
            names.append(str(s))
        return tuple(names)
    found: dict[str, None] = {}
    try:
        for mbs in mbs_values:  # the union: a pair that does not fit is an infeasible trial
            for s in enumerate_strategies(
                    workload, devices, kernel_types=options.kernel_types,
                    max_tp=options.max_tp, virtual_stages=_virtual_stages(options, workload),
                    sequence_parallel=options.sequence_parallel, micro_batch_size=mbs):
                found[str(s)] = None
    except ConfigError as exc:
        raise err(exc.problem, f"strategy.{exc.key}" if exc.key else "strategy",
                  exc.value, exc.allowed) from None
    if not found:
        raise err(f"no strategy fits workload {workload.name!r} on {devices} devices with "
                  "these options", "strategy")
    return tuple(found)


def _virtual_stages(options: StrategySpaceSpec, workload: Spec) -> tuple[int, ...]:
    """The virtual-stage counts to enumerate (``all``: 1 … the workload's layers; those
    that do not divide a strategy's layers per stage are left out by the enumeration)."""
    if options.virtual_stages != "all":
        return options.virtual_stages
    return tuple(range(1, int(getattr(workload, "num_layers", 1) or 1) + 1))


register_kind("search_space", "search_spaces", SearchSpaceSpec)
