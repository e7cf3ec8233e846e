"""The best-known optimum of a study: the reference ``crossflow compare`` measures against.

:func:`best_known` searches a study's space with the objective directly (no Optuna), in
the phases below, and caches the result per study.  The result records the best value
after each phase (``phases``), so one can see which phase got where.

1. **Discrete screening** — every combination of the discrete dimensions (categoricals such
   as strategy × mapping order × technology, and integer ranges), **one mapping order per
   class of equivalent orders** (:mod:`crossflow.search.orders`: orders that differ only in
   where size-1 grid dimensions sit give the same placement, so the same time; without this
   the top-k below was one strategy in k equivalent orders), priced at two splits: the
   template's own budget split (the study's baseline) and the equal split (equal shares,
   whole budget; ``equal_split``).  A combination ranks by the better of the two.  When the
   product exceeds ``max_discrete`` (default 10000), a seeded random subset of that size (plus
   the baseline's own combination) is screened instead — drawn from the order classes
   when the product has at most ``ENUMERABLE`` × that many combinations; ``discrete_total`` /
   ``discrete_screened`` and ``order_classes`` (combinations, classes, equivalent dropped)
   record it.  In a space with nothing continuous (a strategy-only study) the chip is
   fixed, so the memory verdict of each class (no kernel priced) is exact: the classes it
   refuses are dropped (``memory_dropped``) and every remaining one is screened, however
   many — phase 1 is then an exhaustive search of the space.
2. **Simplex sampling** — for the ``top_k`` best combinations (distinct order classes),
   ``samples`` points per combination: the budget simplexes drawn from a Dirichlet(1) over
   components + slack (half of them with the slack pushed near 0: the optimum uses its
   whole budget), put through the softmax encoding; float ranges uniformly.
3. **Local refinement** — a compass (pattern) search in the encoded parameters (±step on
   every coordinate, step halved when nothing improves, from 1.0 down to 1/64) from the
   ``refine`` best points.
4. **Discrete re-check** — every screened combination again at the refined continuous
   point; if another combination wins, it is refined too.
4b. **Contenders** — per strategy (a combination less its mapping order, its best order
   class kept) its value at each of the three splits (template, equal, refined); every
   strategy within ``margin`` (1.3×) of that split's best at **any** of them is refined by a
   compass search (``contender_evals`` = 600) from the split where it did best — the ones
   phase 3 refined already excepted, the closest first, at most ``max_contenders`` (10).
   ``contenders`` records how many strategies were within the margin, how many were
   refined, how many were left out, and each one's start and end.
5. **Perturbation round** — ``hops`` random perturbations of the best point (σ = 15 % of
   each parameter's range), the best of them refined (``hop_gain``: what that found).
6. **Integer enumeration** (``enumerate``, default on) — the area simplex acts only through
   whole units (bundles, SRAM banks per instance, DRAM devices, link ports), so around the
   best point every integer vector in a box is built exactly: core bundles ±``enum_core_radius``
   (6), every other component with at most ``enum_coarse_max`` (64) units ±``enum_radius``
   (2; ±1 for a unit that costs more than ``enum_big_unit`` = 2 % of the area, e.g. one
   register bank per MCU).  Each vector is built by
   :class:`crossflow.search.lattice.AreaLattice`: the smallest area fractions that buy its
   units (the thresholds of :func:`crossflow.arch.cliffs.steps`, ``held`` convention, the
   other shares halved for room; the SRAM thresholds per bundle count), the finest SRAM
   level (L2) taking what is left; vectors over budget are dropped without an evaluation.  The rest
   are priced at the refined power split in batches (``evaluate_many``), and the
   ``enum_top`` (8) best get their power split (voltages, power-limited unit counts) refined
   by a compass search (``enum_power_evals`` = 400 each).  Repeated around the new best
   (``enum_rounds`` = 3) until a round improves nothing.  The result records every round
   (``enumeration``: box, vectors, evaluated, feasible, best units, value before / after,
   ``improved``, ``gain``) and the best value after each phase (``phases``).

7. **Cross-check** — CMA-ES (the ``cmaes`` package) on the continuous parameters (each
   bound scaled to [0, 1], σ0 = ``cma_sigma``) for the ``cma_combos`` (2) best strategies,
   from ``cma_starts`` (3) starts each (the strategy's best point, then random splits), and
   for the next ``cma_contenders`` (8) strategies that phases 3 and 4b refined from their
   best point only, ``cma_evals`` (1200) evaluations per start: a contender that phase
   4b's compass search left far above its own optimum is looked at again from its best
   point (on ``lstm-4k-64-n3`` a TPE run once beat phases 1–7 that way).  It is
   independent of phases 1–6: ``cross_check`` records its runs, ``main_value`` (phases
   1–6) and ``beat_main``; when it beats them, the new best is polished by a compass search
   (``polished_value``, phase ``polish``) and is the best-known value.  A cross-check that
   beats the main search says the main search's basin choice is not to be trusted on that
   study.

Phases 1, 4 and 4b price every combination of one split in one :func:`evaluate_many` call.

**Independent searches** (``searches``, default 3): phases 1–7 run that many times with
the seeds ``seed``, ``seed`` + 1, …, and the best result is the best-known one; ``searches``
records each one's value, evaluations and seconds, and ``spread`` how far the worst is
above the best.  Phases 2 and 7 draw random splits, and on a study with several basins of
whole units one search's end is partly luck (seeds of one search ended up to 12.7 % apart
on a study that searches strategies, where the best seed's design had 308 core bundles
and one DRAM device and the others ~512 and four; docs/search-history.md, "A twenty-fourth
round").
In a space with nothing continuous the screen is exhaustive, so one search is the answer.

What is not covered: a strategy that is more than ``margin`` from the best at all three
splits but best at some fourth split is missed; with more contenders than
``max_contenders`` the farthest are not refined (``contenders.left_out``).

The objective is the study's first one (``iteration_time_s`` for every shipped study);
infeasible designs do not count.

How close it comes to the true optimum (the model is piecewise constant in the fractions,
unit counts being integers, so no certificate exists): docs/search-benchmarks.md, "The
best-known reference".  Treat "within 1 %" as "within 1 % of the best design known", and a
run that beats it as a finding (the comparison then uses that run's value).

Cache: ``mlruns/best_known/<study>.json``, keyed by a hash of the study spec (with its
resolved search space), the CrossFlow version and the search settings; a second call with
the same key evaluates nothing.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from crossflow import __version__
from crossflow.search import encoding
from crossflow.search.best_known_phases import (  # noqa: F401 - _enumerate: the tests' handle
    _bounds,
    _compass,
    _contenders,
    _cross_check,
    _enumerate,
    _sample,
    _say,
)
from crossflow.search.locations import MLRUNS
from crossflow.search.objective import evaluate, evaluate_many, fitting, memory_verdicts
from crossflow.search.orders import dedupe, without_order

SETTINGS: dict[str, Any] = {"max_discrete": 10000, "top_k": 6, "samples": 300,
                            "refine": 4, "refine_evals": 1500, "hops": 100, "seed": 0,
                            "enumerate": True, "enum_core_radius": 6, "enum_radius": 2,
                            "enum_big_unit": 0.02, "enum_coarse_max": 64, "enum_top": 8,
                            "enum_power_evals": 400, "enum_rounds": 3,
                            # phase 1 also at the equal split; phase 4b; phase 7
                            "equal_split": True, "margin": 1.3, "max_contenders": 10,
                            "contender_evals": 600, "cma_combos": 2, "cma_starts": 3,
                            "cma_contenders": 8, "cma_evals": 1200, "cma_sigma": 0.25,
                            # phases 1-7 this many times, seeds seed, seed + 1, ...
                            "searches": 3}


#: Raised whenever a change to the phases below can find a different optimum, so that a
#: cached reference found by the older search is searched again.
SEARCH_REVISION = 3

#: Up to this many times ``max_discrete`` combinations, the whole product is listed and
#: reduced to its order classes before any subset is drawn.
ENUMERABLE = 50


def cache_path(name: str, root: str | Path | None = None) -> Path:
    return Path(root or MLRUNS) / "best_known" / f"{name}.json"


def cache_key(setup, settings: Mapping[str, Any]) -> str:
    doc = {"spec": setup.spec.model_dump(mode="json"), "space": setup.space.describe(),
           "version": __version__, "model": model_fingerprint(), "settings": dict(settings),
           "search": SEARCH_REVISION}
    for k in ("n_trials", "sampler", "sampler_options", "seed", "storage", "tracking_uri"):
        doc["spec"].pop(k, None)  # how a study is run does not change its optimum
    blob = json.dumps(doc, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@functools.cache
def model_fingerprint() -> str:
    """A hash of the model's code and shipped data (every module below ``search`` and every
    preset): a cached optimum is stale as soon as the model it was found with changes,
    whatever the package version says.  The scripts that record the measurements
    (``presets/measurements/**/*.py``, run by hand on a GPU or CPU, never imported by the
    model) are left out: editing one changes no prediction, and it made every cached
    optimum stale."""
    return fingerprint(Path(__file__).resolve().parents[1])


def fingerprint(root: Path) -> str:
    """:func:`model_fingerprint` of the package tree at ``root``."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if (path.is_file() and path.suffix in (".py", ".yaml", ".csv")
                and not rel.startswith(("search/", "reports/", "cli/"))
                and not (rel.startswith("presets/measurements/") and path.suffix == ".py")
                and "__pycache__" not in rel):
            h.update(rel.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def best_known(setup, *, root: str | Path | None = None, refresh: bool = False,
               progress: bool = False, **settings: Any) -> dict[str, Any]:
    """The best-known optimum of ``setup`` (a StudySetup), from the cache when its key
    matches, else searched (see the module docstring) and cached.

    Returns a JSON-able dict: ``value`` (the first objective), ``objective``, ``params``,
    ``design`` (decoded), ``evaluations``, ``seconds``, ``sampled_value`` (best after
    phase 2), ``refine_gain`` (relative improvement of refinement over sampling),
    ``discrete_total`` / ``discrete_screened``, ``key``, ``cached`` (True when read);
    ``searches`` and ``spread`` (the independent searches; ``evaluations`` and ``seconds``
    are their totals, the phases and the rest the best one's).
    """
    opts = {**SETTINGS, **settings}
    key = cache_key(setup, opts)
    path = cache_path(setup.name, root)
    if not refresh and path.is_file():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            doc = None
        if doc and doc.get("key") == key:
            return {**doc, "cached": True}
    doc = _searches(setup, opts, progress)
    doc["key"] = key
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str), encoding="utf-8")
    tmp.replace(path)
    return {**doc, "cached": False}


def _searches(setup, opts: Mapping[str, Any], progress: bool) -> dict[str, Any]:
    """The best of ``searches`` independent searches (:func:`_search` with the seeds
    ``seed``, ``seed`` + 1, …): its record, with every search's value, evaluations and
    seconds (``searches``), their ``spread`` and the totals.  One search where nothing is
    continuous: the screen is then exhaustive, and every seed would find the same."""
    n = int(opts["searches"])
    if n < 1:
        raise ValueError(f"`searches >= 1` must hold, but got searches={n!r}")
    if not _continuous(setup.space):
        n = 1
    docs = []
    for k in range(n):
        if n > 1:
            _say(progress, f"search {k + 1} of {n} (seed {opts['seed'] + k})")
        docs.append(_search(setup, {**opts, "seed": opts["seed"] + k}, progress))
    values = [d["value"] for d in docs if d["value"] is not None]
    best = min(docs, key=lambda d: math.inf if d["value"] is None else d["value"])
    return {**best,
            "evaluations": sum(d["evaluations"] for d in docs),
            "seconds": round(sum(d["seconds"] for d in docs), 3),
            "searches": [{"seed": d["settings"]["seed"], "value": d["value"],
                          "evaluations": d["evaluations"], "seconds": d["seconds"]}
                         for d in docs],
            "spread": max(values) / min(values) - 1 if values else None,
            "settings": dict(opts)}


def _continuous(space) -> list[str]:
    """The names of the space's continuous parameters: every simplex's encoded shares, then
    the numeric ranges (float and integer: an integer range is searched as a number and
    rounded to its grid when evaluated, as the structured driver does, not enumerated)."""
    return ([p for s in space.simplexes for p in s.param_names]
            + [d.name for d in space.dimensions if d.kind != "categorical"])


class _Counter:
    """The objective on parameter dicts (inf when infeasible), counting evaluations; a
    numeric range's value is put on its grid first (the best point is kept so)."""

    def __init__(self, setup) -> None:
        self.setup, self.n = setup, 0
        self.best = (math.inf, None)
        self._ranges = [d for d in setup.space.dimensions if d.kind != "categorical"]

    def _gridded(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {**params, **{d.name: d.on_grid(params[d.name]) for d in self._ranges
                             if d.name in params}}

    def __call__(self, params: Mapping[str, Any]) -> float:
        self.n += 1
        params = self._gridded(params)
        ev = evaluate(self.setup, self.setup.design(params))
        value = ev.values(self.setup.objectives)[0] if ev.feasible else math.inf
        if value < self.best[0]:
            self.best = (value, dict(params))
        return value

    def many(self, points: list[Mapping[str, Any]], chunk: int = 512) -> list[float]:
        """The objective of many points (one :func:`evaluate_many` call per chunk: points on
        the same chip share every kernel price and memory check); one evaluation each."""
        out: list[float] = []
        for i in range(0, len(points), chunk):
            part = [self._gridded(p) for p in points[i:i + chunk]]
            evs = evaluate_many(self.setup, [self.setup.design(p) for p in part])
            for params, ev in zip(part, evs, strict=True):
                self.n += 1
                value = ev.values(self.setup.objectives)[0] if ev.feasible else math.inf
                if value < self.best[0]:
                    self.best = (value, dict(params))
                out.append(value)
        return out


def _search(setup, opts: Mapping[str, Any], progress: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    rng = np.random.default_rng(opts["seed"])
    space = setup.space
    f = _Counter(setup)
    discrete = [d for d in space.dimensions if d.kind == "categorical"]
    floats = [d for d in space.dimensions if d.kind != "categorical"]   # numeric ranges
    cont_names = _continuous(space)

    base = setup.baseline_params()
    start = {p: float(base.get(p, 0.0)) for s in space.simplexes for p in s.param_names}
    for d in floats:
        start[d.name] = float(base.get(d.name, (d.low + d.high) / 2))
    equal = {d.name: (d.low + d.high) / 2 for d in floats}  # equal shares, whole budget
    for s in space.simplexes:
        n = len(s.components)
        equal.update(zip(s.param_names, encoding.encode([1 / n] * n + [0.0]), strict=True))

    # 1. discrete screening, one mapping order per class of equivalent orders
    total, n_raw, combos, dropped, unfit = _classes(setup, discrete, base, opts, rng,
                                                    fixed_chip=not cont_names)
    at_template = f.many([{**start, **c} for c in combos])
    at_equal = (f.many([{**equal, **c} for c in combos])
                if cont_names and opts["equal_split"] else None)
    ranked = [min(a, b) for a, b in zip(at_template, at_equal or at_template, strict=True)]
    screen = sorted(zip(ranked, range(len(combos)), strict=True))
    phases = [_phase("screen", f, t0)]
    unfit_note = f", {unfit} more that do not fit in memory" if unfit else ""
    _say(progress, f"screened {len(combos)} order classes{unfit_note}, of {n_raw} "
                   f"combinations ({total} in the space): best {screen[0][0]:.6g}")

    def split_of(i: int) -> dict[str, Any]:  # the screened split a combination did best at
        return equal if at_equal is not None and at_equal[i] < at_template[i] else start

    # 2. simplex sampling for the best combinations (feasible ones first)
    top = [combos[i] for v, i in screen[:opts["top_k"]]]
    points: list[tuple[float, dict[str, Any]]] = [(v, {**split_of(i), **combos[i]})
                                                   for v, i in screen[:opts["top_k"]]]
    if cont_names:
        for c in top:
            for j in range(opts["samples"]):
                p = {**_sample(space, floats, rng, near_full=j % 2 == 0), **c}
                points.append((f(p), p))
    points.sort(key=lambda t: t[0])
    sampled = points[0][0]
    phases.append(_phase("sample", f, t0))
    _say(progress, f"sampled: best {sampled:.6g} after {f.n} evaluations")

    # 3. local refinement of the best distinct points; 4. discrete re-check
    refined: list[tuple[float, dict[str, Any]]] = []
    starts = _refine_starts(points, discrete, opts["refine"])
    for v, p in starts:
        refined.append(_compass(f, p, v, cont_names, space, floats, opts["refine_evals"]))
    refined.sort(key=lambda t: t[0])
    phases.append(_phase("refine", f, t0))
    contenders = None
    if refined and cont_names and len(combos) > 1:
        v0, p0 = refined[0]
        cont = {n: p0[n] for n in cont_names}
        at_refined = f.many([{**cont, **c} for c in combos])
        again = sorted(zip(at_refined, range(len(combos)), strict=True))
        if again[0][0] < v0:
            p1 = {**cont, **combos[again[0][1]]}
            refined.append(_compass(f, p1, again[0][0], cont_names, space, floats,
                                    opts["refine_evals"]))
            refined.sort(key=lambda t: t[0])
        phases.append(_phase("recheck", f, t0))
        # 4b. every strategy within the margin at any split, refined from its best split
        splits = {"template": (start, at_template), "refined": (cont, at_refined)}
        if at_equal is not None:
            splits["equal"] = (equal, at_equal)
        done = {without_order({d.name: p[d.name] for d in discrete}) for _, p in starts}
        contenders = _contenders(f, splits, combos, done, cont_names, space, floats, opts)
        phases.append(_phase("contenders", f, t0))
        _say(progress, f"contenders: {contenders['refined']} of {contenders['within_margin']}"
                       f" strategies within {opts['margin']}x refined: best {f.best[0]:.6g}")
    else:
        phases.append(_phase("recheck", f, t0))
    # 5. basin hopping: perturb the best point, refine the best perturbation
    hop_gain = None
    if refined and cont_names and opts["hops"] > 0:
        v0, p0 = f.best
        hops = []
        for _ in range(opts["hops"]):
            q = dict(p0)
            for n in cont_names:
                lo, hi = _bounds(space, floats, n)
                q[n] = min(hi, max(lo, q[n] + rng.normal(0.0, 0.15 * (hi - lo))))
            hops.append((f(q), q))
        hv, hq = min(hops, key=lambda t: t[0])
        if math.isfinite(hv):
            hv, _ = _compass(f, hq, hv, cont_names, space, floats, opts["refine_evals"])
        hop_gain = (v0 - min(v0, hv)) / v0
    phases.append(_phase("perturbation", f, t0))
    # 6. exhaustive enumeration of the integer area designs around the best point
    enumeration = None
    if opts["enumerate"] and f.best[1] is not None and cont_names:
        _say(progress, f"refined: best {f.best[0]:.6g} after {f.n} evaluations")
        enumeration = _enumerations(f, setup, opts, progress)
        phases.append(_phase("enumeration", f, t0))
    # 7. cross-check: CMA-ES from several starts on the best strategies' continuous parameters
    cross = None
    if f.best[1] is not None and cont_names and int(opts["cma_combos"]) > 0:
        cross = _cross_check(f, _cma_starts(f, refined, contenders, discrete, space, floats,
                                            rng, opts), cont_names, space, floats, opts)
        phases.append(_phase("cross-check", f, t0))
        if cross.get("beat_main"):  # the main search missed a basin: polish the new best
            v, _ = _compass(f, f.best[1], f.best[0], cont_names, space, floats,
                            opts["refine_evals"])
            cross["polished_value"] = v
            phases.append(_phase("polish", f, t0))
        if "skipped" not in cross:
            _say(progress, f"CMA-ES cross-check: {cross['value']:.6g} "
                           f"({'beat' if cross['beat_main'] else 'did not beat'} "
                           f"{cross['main_value']:.6g})")
    value, params = f.best
    _say(progress, f"best {value:.6g} after {f.n} evaluations")
    design = setup.design(params) if params is not None else None
    return {
        "study": setup.name,
        "objective": setup.objectives[0],
        "value": value if math.isfinite(value) else None,
        "params": params,
        "design": None if design is None else {
            **{f"{s}_fractions": dict(fr) for s, fr in design.fractions.items()},
            "strategy": design.strategy, "mapping_order": design.mapping_order,
            "technology": dict(design.hardware),
            "parallelism_options": dict(design.parallelism)},
        "evaluations": f.n,
        "seconds": round(time.perf_counter() - t0, 3),
        "sampled_value": sampled if math.isfinite(sampled) else None,
        "refine_gain": (sampled - value) / sampled if math.isfinite(sampled) and
        math.isfinite(value) and sampled > 0 else None,
        "refined_values": [v for v, _ in refined],
        "hop_gain": hop_gain,
        "discrete_total": total,
        "discrete_screened": len(combos),
        "order_classes": {"combinations": n_raw, "classes": len(combos) + unfit,
                          "equivalent_dropped": dropped, "memory_dropped": unfit},
        "phases": phases,
        "contenders": contenders,
        "enumeration": enumeration,
        "cross_check": cross,
        "settings": dict(opts),
    }


def _classes(setup, discrete, base: Mapping[str, Any], opts: Mapping[str, Any], rng,
             *, fixed_chip: bool) -> tuple[int, int, list[dict[str, Any]], int, int]:
    """The combinations the screen prices, one mapping order per class of equivalent orders:
    the classes of the whole product where it is small enough (on a fixed chip every one
    that fits in memory, the screen being the search; else a seeded subset of
    ``max_discrete``, the baseline's own combination in it), else the classes of a seeded
    sample of it.  Returns (combinations in the space, combinations drawn, the classes,
    equivalent orders dropped, classes dropped as over memory)."""
    values = [d.values() for d in discrete]
    names = [d.name for d in discrete]
    total = math.prod(len(v) for v in values) if discrete else 1
    own = tuple(base.get(d.name, v[0]) for d, v in zip(discrete, values, strict=True))
    unfit = 0
    if total <= ENUMERABLE * opts["max_discrete"]:  # the classes of the whole product
        raw = [dict(zip(names, c, strict=True)) for c in itertools.product(*values)]
        combos, dropped = dedupe(discrete, raw)
        if fixed_chip:
            combos, unfit = _fitting(setup, combos)
        elif len(combos) > opts["max_discrete"]:
            mine = dict(zip(names, own, strict=True))
            keep = {int(i) for i in rng.choice(len(combos), opts["max_discrete"] - 1,
                                               replace=False)}
            combos = [mine] + [c for i, c in enumerate(combos) if i in keep and c != mine]
    else:
        seen: dict[tuple, None] = {own: None}
        while len(seen) < opts["max_discrete"]:
            seen[tuple(v[rng.integers(len(v))] for v in values)] = None
        raw = [dict(zip(names, c, strict=True)) for c in seen]
        combos, dropped = dedupe(discrete, raw)
    return total, len(raw), combos, dropped, unfit


def _refine_starts(points: list[tuple[float, dict[str, Any]]], discrete,
                   n: int) -> list[tuple[float, dict[str, Any]]]:
    """The ``n`` points (best first) the refinement starts from: the best point of each of
    the best combinations, then, where combinations are fewer, the next best points."""
    finite = [(v, p) for v, p in points if math.isfinite(v)]
    starts, keys = [], set()
    for v, p in finite:
        k = tuple(p[d.name] for d in discrete)
        if k not in keys and len(starts) < n:
            starts.append((v, p))
            keys.add(k)
    for v, p in finite:
        if len(starts) >= n:
            break
        if not any(p is q for _, q in starts):
            starts.append((v, p))
    return starts


def _enumerations(f: _Counter, setup, opts: Mapping[str, Any], progress: bool
                  ) -> dict[str, Any]:
    """Rounds of the whole-unit enumeration (:func:`_enumerate`) around the best point, each
    centred on the best so far, until one finds nothing or ``enum_rounds`` have run."""
    v_refined, rounds = f.best[0], []
    for _ in range(max(1, int(opts["enum_rounds"]))):
        rounds.append(_enumerate(f, setup, f.best[1], opts, progress))
        if not rounds[-1].get("improved"):
            break
    v_enum = f.best[0]
    return {"rounds": rounds, "value_before": v_refined, "value_after": v_enum,
            "improved": v_enum < v_refined,
            "gain": (v_refined - v_enum) / v_refined if math.isfinite(v_refined)
            and v_enum < v_refined else 0.0,
            "evaluations": sum(r.get("evaluations", 0) for r in rounds)}


def _cma_starts(f, refined, contenders, discrete, space, floats, rng,
                opts: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The cross-check's starts: for each of the ``cma_combos`` best strategies (one order
    class each), its best point found, then ``cma_starts`` − 1 random splits; then one start
    (its best point) for each of the next ``cma_contenders`` strategies that phases 3 and
    4b refined (a compass search can stall far from a contender's basin floor)."""
    cands = [(f.best[0], f.best[1])] + list(refined)
    for c in (contenders or {}).get("contenders", []):
        if c["value"] is not None:
            cands.append((c["value"], c["params"]))
    chosen, seen = [], set()
    for v, p in sorted(cands, key=lambda t: t[0]):
        k = without_order({d.name: p[d.name] for d in discrete})
        if k in seen or not math.isfinite(v):
            continue
        seen.add(k)
        chosen.append(p)
        if len(chosen) >= int(opts["cma_combos"]) + int(opts["cma_contenders"]):
            break
    starts = []
    for j, p in enumerate(chosen):
        fixed = {d.name: p[d.name] for d in discrete}
        starts.append((f"strategy {j + 1}: its best point", dict(p)))
        if j >= int(opts["cma_combos"]):
            continue
        for k in range(int(opts["cma_starts"]) - 1):
            starts.append((f"strategy {j + 1}: random split {k + 1}",
                           {**_sample(space, floats, rng, near_full=True), **fixed}))
    return starts


def _fitting(setup, combos: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The combinations whose memory verdict does not refuse them, and how many it did.

    In a space with nothing continuous every design runs on the same chip, so the verdict
    (no kernel priced) is the prediction's own: a combination it refuses is infeasible, and
    dropping it first lets the screen price every remaining class instead of a random
    subset of them (Llama-2 70B on 256 H100s: 5,328 of 17,760 classes fit; 10,000 drawn
    from all of them missed the optimum by 0.5 %)."""
    kept, _ = fitting(combos, memory_verdicts(setup, [setup.design(c) for c in combos]))
    return kept, len(combos) - len(kept)


def _phase(name: str, f: _Counter, t0: float) -> dict[str, Any]:
    """Where the search stood after a phase: best value, evaluations and seconds so far."""
    v = f.best[0]
    return {"phase": name, "best": v if math.isfinite(v) else None, "evaluations": f.n,
            "seconds": round(time.perf_counter() - t0, 3)}


