"""The study as the driver sees it: discrete combinations, a continuous point, cliffs.

A **point** is a full parameter dict of the study (Optuna's names and values).  The driver
splits it in two:

* the **discrete part** — every categorical dimension (strategy, mapping order,
  technology, a list of micro-batch sizes, …);
* the **continuous part** — a :class:`Cont`: one fraction vector per budget simplex (the
  searched components then the slack, summing to 1: the decoded softmax of
  :mod:`crossflow.search.encoding`) and the numeric ranges — float and integer alike, in
  their own units or, for a log range, their logarithm; an integer range is rounded to its
  step only when a point becomes parameters (:meth:`Problem.params`).  A range is ordered,
  so it is searched by moves, as Optuna's CMA-ES searches an ``IntDistribution``: screened
  value by value as a discrete choice, a ``tdp_W`` of 150-450 W spent the first 256
  evaluations (the screen's cap) on the template's split at other watts before the split
  was searched (docs/search-history.md, "Integer ranges").

Moves of a simplex coordinate are *exchanges*: component i is scaled by ``exp(s)`` and the
others (slack included) share what it gains or gives up in proportion, so the point stays
on the simplex without a projection.  Where the AGE turns a budget into whole units
(bundles, banks, DRAM devices, link ports), :meth:`Problem.snap` lands a move on the edge
of a step (:mod:`crossflow.arch.cliffs`): the smallest share that buys the quantities the
move reached, the rest handed to the other components — so a search neither wastes budget
on a plateau nor steps blindly over a cliff.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crossflow.errors import CrossflowError
from crossflow.search import encoding, orders
from crossflow.search.space import MAPPING_ORDER, STRATEGY

#: Smallest share a simplex coordinate may take (the encoding's floor is exp(-2·SPAN)).
_FLOOR = 2 * math.exp(-2 * encoding.SPAN)


@dataclass(frozen=True)
class Cont:
    """The continuous part of a point: simplex fraction vectors (slack last) and floats."""

    simplexes: Mapping[str, np.ndarray] = field(default_factory=dict)
    floats: Mapping[str, float] = field(default_factory=dict)

    def key(self) -> tuple:
        return (tuple((n, tuple(np.round(v, 12))) for n, v in self.simplexes.items()),
                tuple(sorted(self.floats.items())))


@dataclass(frozen=True)
class Coord:
    """One searchable coordinate: a simplex component (``index`` into its vector) or a
    float range (``index`` −1, bounds ``low``/``high``)."""

    block: str
    name: str
    index: int = -1
    low: float = 0.0
    high: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.block}.{self.name}" if self.index >= 0 else self.name


def _inward(d, value: float) -> float:
    """A numeric range's value as its coordinate: the value, or its log for a log range."""
    return math.log(float(value)) if d.log else float(value)


def _outward(d, u: float) -> int | float:
    """The parameter value of a range's coordinate ``u`` (clipped to the range; an integer
    range's, or a stepped one's, on its grid)."""
    return d.on_grid(math.exp(min(u, 700.0)) if d.log else u)


class Problem:
    """A study's space, split for the driver, with its objective's structure."""

    def __init__(self, setup) -> None:
        self.setup = setup
        space = setup.space
        self.simplexes = {s.name: s for s in space.simplexes}
        self.discrete = [d for d in space.dimensions if d.kind == "categorical"]
        #: the numeric ranges (float and int), each a coordinate of the continuous part
        self.floats = [d for d in space.dimensions if d.kind != "categorical"]
        self.coords: list[Coord] = [
            Coord(s.name, c, i) for s in space.simplexes for i, c in enumerate(s.components)]
        self.coords += [Coord("float", d.name, -1, _inward(d, d.low), _inward(d, d.high))
                        for d in self.floats]
        self.has_order = any(d.name == MAPPING_ORDER for d in self.discrete)
        self.has_strategy = any(d.name == STRATEGY for d in self.discrete)
        self._edge_cache: dict[tuple, list[float]] = {}
        self._simplex_params = {p for s in space.simplexes for p in s.param_names}
        self._chips: dict[str, str] = {}   # chip key -> the chip's model key

    # ---- points -----------------------------------------------------------------------

    def start(self) -> tuple[Cont, dict[str, Any]]:
        """The template's own split and technology (the study's baseline), the rest at the
        first choice / the middle of the range."""
        base = self.setup.start_params()
        simplexes = {}
        for name, s in self.simplexes.items():
            values = [base[p] for p in s.param_names] if all(
                p in base for p in s.param_names) else [0.0] * len(s.param_names)
            simplexes[name] = np.array(encoding.decode(values))
        floats = {d.name: _inward(d, base[d.name]) for d in self.floats}
        discrete = {d.name: base[d.name] for d in self.discrete}
        return Cont(simplexes, floats), discrete

    def params(self, cont: Cont, discrete: Mapping[str, Any]) -> dict[str, Any]:
        """The study's parameters of a point."""
        out: dict[str, Any] = {}
        for name, s in self.simplexes.items():
            x = np.maximum(cont.simplexes[name], 0.0)
            out.update(zip(s.param_names, encoding.encode(list(x / x.sum())), strict=True))
        for d in self.floats:
            out[d.name] = _outward(d, cont.floats[d.name])
        out.update(discrete)
        return out

    def design_key(self, params: Mapping[str, Any]) -> str:
        """A key equal for two points the model cannot tell apart: the same parameters
        besides the budget split, on the same chip.  The AGE turns a split into whole units
        (bundles, banks, DRAM devices, ports), so many splits build one chip, and the plan
        prices a design once (the driver's moves land on about 10-40 % such repeats in a
        budget-only study).  A point whose chip cannot be built, or a study without an
        architecture template, keys by its parameters."""
        key = self._model_key(params) if self.setup.template is not None else ""
        if not key:
            return point_key(params)
        return point_key([key, {k: v for k, v in params.items()
                                if k not in self._simplex_params}])

    def refused(self, params: Mapping[str, Any]) -> bool:
        """Whether a point is no design to price: the AGE cannot build its chip (a budget
        below one unit of a component the template uses), or its strategy does not fit in
        memory on that chip (the memory-only check of the screen's first phase: no kernel
        priced).  Both follow from the chip alone, before the model prices anything."""
        if self.setup.template is None:
            return False
        if not self._model_key(params):
            return True
        if not self.has_strategy:
            return False
        from crossflow.search.objective import memory_verdicts

        (verdict,) = memory_verdicts(self.setup, [self.setup.design(params)])
        return verdict is not None and not verdict.feasible

    def _model_key(self, params: Mapping[str, Any]) -> str:
        """:meth:`MicroArch.model_key` of a point's chip, "" when the AGE cannot build it
        (cached by the chip's :meth:`Design.chip_key`)."""
        design = self.setup.design(params)
        chip = design.chip_key()
        key = self._chips.get(chip)
        if key is None:
            try:
                key = self.setup.arch(design).model_key()
            except CrossflowError:
                key = ""
            if len(self._chips) > 65536:
                self._chips.clear()
            self._chips[chip] = key
        return key

    def split(self, params: Mapping[str, Any]) -> tuple[Cont, dict[str, Any]]:
        """The inverse of :meth:`params`."""
        simplexes = {name: np.array(encoding.decode([params[p] for p in s.param_names]))
                     for name, s in self.simplexes.items()}
        floats = {d.name: _inward(d, params[d.name]) for d in self.floats}
        return Cont(simplexes, floats), {d.name: params[d.name] for d in self.discrete}

    # ---- discrete structure -------------------------------------------------------------

    def combos(self) -> list[dict[str, Any]]:
        """Every combination of the discrete dimensions except the mapping order."""
        dims = [d for d in self.discrete if d.name != MAPPING_ORDER]
        names = [d.name for d in dims]
        return [dict(zip(names, values, strict=True))
                for values in itertools.product(*(d.values() for d in dims))]

    def order_classes(self, combo: Mapping[str, Any]) -> list[str]:
        """One mapping order per class of orders that give the same time for the combo's
        strategy (they differ only where size-1 grid dimensions sit); ``[None]`` when the
        study does not search the order (:func:`crossflow.search.orders.order_classes`)."""
        return orders.order_classes(self.discrete, combo)

    def same_class(self, combo: Mapping[str, Any], order: str) -> str | None:
        """``combo`` in the class of ``order`` (:func:`crossflow.search.orders.same_class`)."""
        return orders.same_class(self.discrete, combo, order)

    def canonical_order(self, combo: Mapping[str, Any]) -> str | None:
        return self.order_classes(combo)[0]

    def with_order(self, combo: Mapping[str, Any], order: str | None) -> dict[str, Any]:
        """A combination with its mapping order (when the study searches the order)."""
        if self.has_order and order is not None:
            return {**combo, MAPPING_ORDER: order}
        return dict(combo)

    def memory_checks(self, cont: Cont, combos: Sequence[Mapping[str, Any]]) -> list:
        """The memory-only verdict of each combination on the chip of ``cont`` (no kernel
        is priced, each chip built once): objects with ``feasible``, ``need_bytes``,
        ``capacity_bytes`` and ``reason``, or None (no verdict: the chip cannot be built,
        or the study has no strategy)."""
        if not self.has_strategy:
            return [None] * len(combos)
        from crossflow.search.objective import memory_verdicts

        designs = []
        for combo in combos:
            params = self.params(cont, self.with_order(combo, self.canonical_order(combo)))
            designs.append(self.setup.design(params))
        return memory_verdicts(self.setup, designs)

    # ---- moves --------------------------------------------------------------------------

    def move(self, cont: Cont, coord: Coord, s: float) -> Cont:
        """Coordinate ``coord`` scaled by exp(s) (a simplex exchange), or a float range
        moved by s times its width (clipped)."""
        if coord.index < 0:
            width = coord.high - coord.low
            v = min(coord.high, max(coord.low, cont.floats[coord.name] + s * width))
            return Cont(cont.simplexes, {**cont.floats, coord.name: v})
        x = cont.simplexes[coord.block]
        target = min(1.0 - _FLOOR, max(_FLOOR, x[coord.index] * math.exp(s)))
        return self.with_share(cont, coord, target)

    def slack(self, block: str) -> Coord:
        """The slack of a simplex as a coordinate (a donor for exchanges; never searched)."""
        return Coord(block, encoding.SLACK, len(self.simplexes[block].components))

    def transfer(self, cont: Cont, to: Coord, frm: Coord, s: float) -> Cont:
        """Component ``to`` scaled by exp(s) with everything it gains taken from ``frm``
        alone (same simplex), the other shares unchanged: a pairwise exchange (at most
        what ``frm`` has, less the encoding's floor)."""
        x = np.array(cont.simplexes[to.block], dtype=float)
        amount = min(x[to.index] * (math.exp(s) - 1.0), x[frm.index] - _FLOOR)
        if amount <= 0:
            return cont
        x[to.index] += amount
        x[frm.index] -= amount
        return Cont({**cont.simplexes, to.block: x}, cont.floats)

    def snap_transfer(self, cont: Cont, moved: Cont, to: Coord, frm: Coord,
                      discrete: Mapping[str, Any]) -> Cont:
        """A :meth:`transfer` landed on a step edge of ``to``: its smallest share that keeps
        what it reached (the next edge up if it reached none), the difference given back
        to (or taken from) ``frm``."""
        snapped = self.snap(cont, moved, to, discrete, donor=frm)
        x = np.array(moved.simplexes[to.block], dtype=float)
        delta = snapped.simplexes[to.block][to.index] - x[to.index]
        if x[frm.index] - delta <= _FLOOR:
            return moved
        x[to.index] += delta
        x[frm.index] -= delta
        return Cont({**moved.simplexes, to.block: x}, moved.floats)

    def with_share(self, cont: Cont, coord: Coord, target: float) -> Cont:
        """``cont`` with simplex coordinate ``coord`` at the share ``target``, the others
        (slack included) scaled in proportion to fill the rest."""
        x = np.array(cont.simplexes[coord.block], dtype=float)
        rest = 1.0 - x[coord.index]
        scale = (1.0 - target) / rest if rest > 0 else 0.0
        y = x * scale
        y[coord.index] = target
        return Cont({**cont.simplexes, coord.block: y}, cont.floats)

    def snap(self, cont: Cont, moved: Cont, coord: Coord, discrete: Mapping[str, Any],
             donor: Coord | None = None) -> Cont:
        """``moved`` (a move of ``coord`` from ``cont``) landed on a step edge of the AGE:
        the smallest share of the component that keeps the quantities ``moved`` reached
        (the rest goes to the others); a move up that reached no new step goes up to the
        next one.  Unchanged where the coordinate has no steps (float ranges, studies
        without an architecture template)."""
        if coord.index < 0 or self.setup.template is None:
            return moved
        share = self.simplexes[coord.block].share
        old = cont.simplexes[coord.block][coord.index] * share
        new = moved.simplexes[coord.block][coord.index] * share
        edges = self._edges(moved, coord, discrete, donor)
        if not edges:
            return moved
        # the edges are compared at 15 decimals; rounding is monotone, so a binary search
        # that rounds the few edges it looks at finds what rounding them all would
        i = bisect.bisect_right(edges, new + 1e-12, key=_round15)
        target = _round15(edges[i - 1]) if i else None
        if new > old and (target is None or target <= old + 1e-12):
            j = bisect.bisect_right(edges, old + 1e-12, key=_round15)
            target = _round15(edges[j]) if j < len(edges) else None
        if target is None or not 0 < target / share < 1 - _FLOOR:
            return moved
        # a hair above the threshold: the encoding's round trip must not lose the unit
        return self.with_share(moved, coord, target * (1 + 1e-9) / share)

    def wave_shakes(self, cont: Cont, discrete: Mapping[str, Any],
                    bases: Sequence[int]) -> list[Cont]:
        """``cont`` with its core at each wave edge near its bundle count
        (:func:`crossflow.search.lattice.wave_edges` of ``bases``), each built exactly on
        the area lattice (:meth:`~crossflow.search.lattice.AreaLattice.with_bundles`); []
        where the study has no area lattice or no core bundles."""
        from crossflow.search.lattice import AreaLattice, wave_edges

        lattice = AreaLattice(self.setup, self.params(cont, discrete))
        if not lattice.ok or "core" not in lattice.counts:
            return []
        built = (lattice.with_bundles(n) for n in wave_edges(lattice.bundles, bases))
        return [self.split(p)[0] for p in built if p is not None]

    def _edges(self, cont: Cont, coord: Coord, discrete: Mapping[str, Any],
               donor: Coord | None = None) -> list[float]:
        """Step thresholds of ``coord`` on the line a move from ``cont`` follows (sorted;
        cached).

        A move (:meth:`move`) scales the other shares in proportion: the steps of
        :func:`crossflow.arch.cliffs.steps` with ``convention="proportional"`` (every
        component's units step along it: one more bundle costs the register file a little
        area, which is where the cliffs of the core coordinate are).  An exchange with a
        ``donor`` holds the other shares: the ``held`` steps, with half of the donor's share
        put in the slack so that the coordinate has room to grow into.  Only the steps of
        :meth:`_quantities` count, so they come from :func:`~crossflow.arch.cliffs.thresholds`
        (the fractions alone: building every quantity's :class:`Step` and dropping most
        of them took two thirds of a budget-only study's time)."""
        from crossflow.arch.cliffs import thresholds

        convention = "proportional"
        if donor is not None:
            x = np.array(cont.simplexes[coord.block], dtype=float)
            x[-1] += 0.5 * x[donor.index]
            x[donor.index] *= 0.5
            cont = Cont({**cont.simplexes, coord.block: x}, cont.floats)
            convention = "held"
        design = self.setup.design(self.params(cont, discrete))
        overrides = self.setup.overrides(design)
        key = (coord.block, coord.name, convention, _freeze(overrides))
        if key not in self._edge_cache:
            if len(self._edge_cache) > 4096:
                self._edge_cache.clear()
            try:
                found = thresholds(self.setup.template, overrides, coord.block, coord.name,
                                   self._quantities(coord), convention=convention)
            except CrossflowError:
                found = []
            self._edge_cache[key] = found
        return self._edge_cache[key]

    def _quantities(self, coord: Coord) -> tuple[str, ...]:
        """The quantities (:func:`crossflow.arch.cliffs.quantities` names, as prefixes)
        whose steps a budget coordinate cares about: the component it buys (all its
        quantities; for links their ports only, not single lanes), for the core also the
        banks per instance of the levels whose clients are its MCUs and bundles (more
        bundles on the same area leave fewer register banks per MCU: the cliffs of the core
        coordinate), and where the design becomes (in)feasible."""
        from crossflow.arch.cliffs import FEASIBLE, unit_quantity

        template = self.setup.template
        unit = unit_quantity(template, coord.name)
        if unit is None:
            own = f"{coord.name}."
        else:
            own = unit if unit.endswith(".ports") else unit.split(".")[0] + "."
        if coord.name != "core":
            return (FEASIBLE, own)
        clients = tuple(f"{m.name}.banks_per_instance" for m in template.memory[:-1]
                        if m.scope in ("mcu", "bundle"))
        return (FEASIBLE, own, *clients)


def _round15(x: float) -> float:
    return round(x, 15)


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, float):
        return round(value, 12)
    if isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(_freeze(v) for v in value)
    return value


#: An inner method (crossflow.search.samplers.structured._inner): a generator that yields
#: batches of points, receives their values and returns (best point, best value).
Inner = Generator[list[Cont], list[float], tuple[Cont, float]]

#: Relative change below which two values are the same (the model is deterministic).
SAME = 1e-9


def point_key(params: Any) -> str:
    """A point's parameters as one string, equal for equal points whether they come from
    the plan or back from the storage (JSON: tuples read back as lists)."""
    return json.dumps(params, sort_keys=True, default=str)


def better(a: float, b: float) -> bool:
    """Whether value ``a`` improves on ``b`` by more than :data:`SAME` (any finite value
    improves on an infinite one)."""
    return a < b * (1.0 - SAME) if math.isfinite(b) else a < b


def same(a: float, b: float) -> bool:
    """Whether values ``a`` and ``b`` are the same: within :data:`SAME` of ``b``, or equal
    (two infinities included)."""
    return abs(a - b) <= SAME * abs(b) or a == b
