"""The integer lattice of a study's area simplex: designs named by their whole units.

The area budget acts only through whole units — core bundles, SRAM banks per instance,
DRAM devices, link ports (:mod:`crossflow.arch.cliffs`).  Around a point of a study, an
:class:`AreaLattice` names the nearby designs by those counts and builds each one exactly:
the smallest area fractions that buy its units (the thresholds of
:func:`crossflow.arch.cliffs.steps`, ``held`` convention, every other share halved for
room; the SRAM thresholds per bundle count, since more bundles leave each less), the
finest SRAM level (the *absorber*, L2 on the shipped templates) taking what is left.  A
count vector over budget, or one no area step builds, has no point (``None``), found
without a model evaluation.

The best-known search uses it for its exhaustive box around its optimum
(:mod:`crossflow.search.best_known`, phase 6); the ``structured`` driver for its wave-edge
shakes (:func:`wave_edges`, :meth:`AreaLattice.with_bundles`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from crossflow.arch.cliffs import quantities_at, steps, unit_quantity
from crossflow.errors import CrossflowError
from crossflow.search import encoding


def thresholds(template, overrides: Mapping[str, Any], component: str,
               unit: str) -> dict[int, float]:
    """count -> the smallest area fraction of ``component`` that builds ``count`` units,
    the other fractions held (:func:`crossflow.arch.cliffs.steps`, ``held`` convention)."""
    try:
        found = steps(template, overrides, "area", component, 0.0, 1.0, convention="held")
    except CrossflowError:
        return {}
    out: dict[int, float] = {}
    for st in found:
        if st.quantity == unit and st.above > st.below:
            for n in range(st.below + 1, st.above + 1):   # a jump of several units at once
                out.setdefault(n, st.fraction)
    return out


def wave_edges(bundles: int, bases: Sequence[int], *, waves: int = 8, reach: float = 1.6,
               limit: int = 6) -> list[int]:
    """Core-bundle counts near ``bundles`` at which a GEMM's work tiles fill whole waves.

    A GEMM deals its T work tiles to the n bundles in ceil(T / n) waves
    (:mod:`crossflow.kernels.gemm`), so its time jumps where that count does: one bundle
    fewer than ceil(T / w) costs a whole wave.  Tiles are powers of two, so T is a power
    of two times the odd parts of the GEMM's sides (``bases``: 1 for 4096, 3 for 1536 or
    12288).  Returns the counts ceil(base·2^j / w) for w up to ``waves`` (one bundle off
    such an edge costs at least 1/``waves`` of the GEMM's time), within a factor ``reach``
    of ``bundles`` (``bundles`` itself excluded), the ``limit`` nearest by ratio.
    """
    found: set[int] = set()
    for base in bases:
        tiles = base
        while tiles <= bundles * reach * waves:
            for w in range(1, waves + 1):
                n = -(-tiles // w)
                if bundles / reach <= n <= bundles * reach and n != bundles:
                    found.add(n)
            tiles *= 2
    return sorted(found, key=lambda n: (abs(math.log(n / bundles)), n))[:limit]


class AreaLattice:
    """The whole-unit area designs around the point ``params`` of ``setup``.

    ``coarse`` are the components searched by count (every component with at most
    ``coarse_max`` units, and the core); the other unit-buying components keep their
    share (``held``) except the ``absorber``, which takes what the others leave.
    ``counts`` are the point's own counts of the coarse components.  ``ok`` is False where
    the study has no architecture template or no searched area simplex, or the point's
    chip cannot be built: then there is no lattice.
    """

    def __init__(self, setup, params: Mapping[str, Any], *, coarse_max: int = 64) -> None:
        self.setup, self.params = setup, dict(params)
        self.simplex = next((s for s in setup.space.simplexes if s.name == "area"), None)
        self.template = setup.template
        self.ok = self.template is not None and self.simplex is not None
        self.coarse: list[str] = []
        self.counts: dict[str, int] = {}
        if not self.ok:
            self.why = "no architecture template or no searched area simplex"
            return
        template = self.template
        self.overrides = setup.overrides(setup.design(params))
        #: the point's own quantities (:func:`crossflow.arch.cliffs.quantities_at`)
        self.quantities = q0 = quantities_at(template, self.overrides)
        if not q0.get("feasible"):
            self.ok, self.why = False, "the design cannot be built"
            return
        self.area = dict(self.overrides["area_fractions"])
        units = {c: unit_quantity(template, c) for c in self.simplex.components}
        self.units = {c: u for c, u in units.items() if u is not None and u in q0}
        self.levels = [m.name for m in template.memory[:-1]]
        fine = [c for c, u in self.units.items() if q0[u] > coarse_max and c != "core"]
        self.absorber = max((c for c in fine if c in self.levels),
                            key=lambda c: q0[self.units[c]], default=None)
        self.coarse = [c for c in self.units if c not in fine]
        self.held = {c: self.area[c] for c in fine if c != self.absorber}
        self.counts = {c: q0[self.units[c]] for c in self.coarse}
        self.bundles = q0["core.bundles"]
        # room to scan each coordinate: every other searched fraction halved
        self._roomy = {c: (v * 0.5 if c in self.simplex.components else v)
                       for c, v in self.area.items()}
        self._thr: dict[tuple, dict[int, float]] = {}
        # the encoding's smallest slack
        self._floor = 2 * math.exp(-2 * encoding.SPAN) * self.simplex.share

    def threshold(self, component: str, n: int, bundles: int) -> float | None:
        """The smallest area fraction of ``component`` that builds ``n`` of its units (for
        an SRAM level, next to ``bundles`` core bundles); None when no area step does."""
        key = (component, bundles if component in self.levels else None)
        if key not in self._thr:
            fr = dict(self._roomy)
            fr.pop(component, None)
            if component in self.levels:
                core_t = self.threshold("core", bundles, bundles)
                if core_t is None:
                    self._thr[key] = {}
                    return None
                fr["core"] = core_t * (1 + 1e-9)
            self._thr[key] = thresholds(self.template,
                                        {**self.overrides, "area_fractions": {**self.area, **fr}},
                                        component, self.units[component])
        return self._thr[key].get(n)

    def cost(self, component: str) -> float:
        """The area fraction one more unit of ``component`` costs at the point (0 when
        unknown)."""
        n = self.counts[component]
        t = self.threshold(component, n, self.bundles)
        t1 = self.threshold(component, n + 1, self.bundles)
        return (t1 - t) if t is not None and t1 is not None else 0.0

    def point(self, want: Mapping[str, int]) -> dict[str, Any] | None:
        """The study parameters of the design with the coarse counts ``want`` (missing ones
        at the point's own), at the smallest area fractions that buy them, the absorber
        taking the rest; None when it is over budget or no area step builds a count."""
        if not self.ok:
            return None
        want = {**self.counts, **want}
        bundles = want.get("core", self.bundles)
        fr: dict[str, float] = {}
        for c, n in want.items():
            if n < 1:
                return None
            t = self.threshold(c, n, bundles)
            if t is None and n == self.counts[c]:
                # no area step buys this count (it is bound by power or perimeter, or the
                # first unit is the feasibility step): the point's own share builds it
                fr[c] = self.area[c]
                continue
            if t is None:
                return None
            fr[c] = t * (1 + 1e-9)
        fr.update(self.held)
        # the encoding cannot give a share below exp(-2·SPAN) of the largest: a smaller
        # one would be raised on decoding and every other share shrunk
        low = max(fr.values()) * math.exp(-2 * encoding.SPAN) * (1 + 1e-6)
        fr = {c: max(v, low) for c, v in fr.items()}
        used = sum(fr.values()) + sum(v for c, v in self.area.items()
                                      if c not in self.simplex.components)
        left = 1.0 - used - self._floor
        if left <= 0:
            return None
        if self.absorber is not None:
            fr[self.absorber] = left
        return {**self.params, **self.simplex.params_for(
            {c: fr.get(c, self.area[c]) for c in self.simplex.components})}

    def with_bundles(self, n: int) -> dict[str, Any] | None:
        """The study parameters of the design with ``n`` core bundles and the point's other
        coarse counts — or, where that is over budget, each of those one unit fewer in turn,
        then all of them scaled by bundles / n (a chip of more bundles with about as many
        units in all); None when none of these builds."""
        others = [c for c in self.coarse if c != "core"]
        for fewer in ({}, *({c: self.counts[c] - 1} for c in others),
                      {c: max(1, round(self.counts[c] * self.bundles / n)) for c in others}):
            p = self.point({"core": n, **fewer})
            if p is not None:
                return p
        return None
