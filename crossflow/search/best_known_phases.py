"""The best-known search's helpers and its later phases (:mod:`crossflow.search.best_known`):
Dirichlet sampling and compass search of the continuous parameters, the refinement of every
contending strategy (phase 4b), the whole-unit enumeration (phase 6) and the CMA-ES
cross-check (phase 7).  Each phase evaluates through the caller's counter ``f`` (``f(params)``
and ``f.many(points)``; every call is one evaluation) and returns a JSON-able record."""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from crossflow.arch.cliffs import quantities_at
from crossflow.search import encoding
from crossflow.search.compass import compass
from crossflow.search.lattice import AreaLattice
from crossflow.search.orders import without_order


def _sample(space, floats, rng, near_full: bool) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in space.simplexes:
        w = rng.dirichlet(np.ones(len(s.components) + 1))
        if near_full:
            w[-1] *= 1e-3
            w /= w.sum()
        out.update(zip(s.param_names, encoding.encode(list(w / w.sum())), strict=True))
    for d in floats:
        out[d.name] = float(rng.uniform(d.low, d.high))
    return out


def _compass(f, params: dict[str, Any], value: float, names: list[str], space, floats,
             max_evals: int) -> tuple[float, dict[str, Any]]:
    """Compass search (:func:`crossflow.search.compass.compass`) on the continuous
    parameters ``names`` (encoded simplexes in [-SPAN, SPAN], float ranges scaled to the
    same span), at most ``max_evals`` evaluations (checked after each coordinate's turn)."""
    bounds = [_bounds(space, floats, n) for n in names]
    low, high = [lo for lo, _ in bounds], [hi for _, hi in bounds]
    scale = [(hi - lo) / (2 * encoding.SPAN) for lo, hi in bounds]
    search = compass([params[n] for n in names], value, low, high, scale, budget=max_evals)
    try:
        y = next(search)
        while True:
            y = search.send(f({**params, **dict(zip(names, map(float, y), strict=True))}))
    except StopIteration as end:
        x, best = end.value
    return best, {**params, **dict(zip(names, map(float, x), strict=True))}


def _bounds(space, floats, name: str) -> tuple[float, float]:
    d = next((d for d in floats if d.name == name), None)
    return (-encoding.SPAN, encoding.SPAN) if d is None else (d.low, d.high)


def _say(enabled: bool, text: str) -> None:
    if enabled:
        print(f"best-known: {text}", file=sys.stderr, flush=True)


# --- phase 6: exhaustive enumeration of the integer designs near the optimum -------------------


def _enumerate(f, setup, params: dict[str, Any], opts: Mapping[str, Any],
               progress: bool) -> dict[str, Any]:
    """Phase 6: every integer area design in a box around ``params`` (a refined optimum),
    each at the smallest area fractions that buy its units (:class:`AreaLattice`), priced
    at the refined power split; the best few then get their power split refined.  Returns
    the record."""
    t0, n0, v0 = time.perf_counter(), f.n, f.best[0]
    lat = AreaLattice(setup, params, coarse_max=opts["enum_coarse_max"])
    if not lat.ok:
        return {"skipped": lat.why if lat.why != "the design cannot be built"
                else "the refined design cannot be built"}
    template, units, coarse, q0 = lat.template, lat.units, lat.coarse, lat.quantities
    radius = {c: int(opts["enum_core_radius"]) if c == "core" else
              1 if lat.cost(c) > opts["enum_big_unit"] else int(opts["enum_radius"])
              for c in coarse}
    ranges = {c: [n for n in range(lat.counts[c] - radius[c], lat.counts[c] + radius[c] + 1)
                  if n >= 1] for c in coarse}
    cands, vectors, over = [], 0, 0
    for combo in itertools.product(*(ranges[c] for c in coarse)):
        vectors += 1
        want = dict(zip(coarse, combo, strict=True))
        p = lat.point(want)
        if p is None:
            over += 1
            continue
        cands.append((want, p))
    _say(progress, f"enumerating {len(cands)} integer area designs "
                   f"({vectors} in the box, {over} over budget or unbuildable)")
    values = f.many([p for _, p in cands])
    ranked = sorted(zip(values, range(len(cands)), strict=True), key=lambda t: t[0])
    # the best few: their power split refined (a compass search on the power parameters)
    power = next((s for s in setup.space.simplexes if s.name == "power"), None)
    names = list(power.param_names) if power is not None else []
    top = []
    for v, i in ranked[:opts["enum_top"]]:
        if not math.isfinite(v):
            break
        want, p = cands[i]
        entry = {"units": want, "value": v}
        if names and opts["enum_power_evals"] > 0:
            pv, pp = _compass(f, p, v, names, setup.space, [], opts["enum_power_evals"])
            entry["power_refined_value"] = pv
            built = quantities_at(template, setup.overrides(setup.design(pp)))
            entry["built_units"] = {c: built.get(u) for c, u in units.items()}
        top.append(entry)
    best_v, best_p = f.best
    improved = best_v < v0
    found_units = None
    if best_p is not None:
        got = quantities_at(template, setup.overrides(setup.design(best_p)))
        found_units = {c: got.get(units[c]) for c in units}
    best_units = top[0]["units"] if top else {}
    _say(progress, f"enumeration: best {best_v:.6g} ({'better than' if improved else 'no better than'}"
                   f" {v0:.6g}) after {f.n - n0} evaluations")
    return {
        "center": {c: q0[units[c]] for c in units},
        "units": units,
        "absorber": lat.absorber,
        "held": sorted(lat.held),
        "box": {c: [r[0], r[-1]] for c, r in ranges.items()},
        "vectors": vectors,
        "over_budget": over,
        "evaluated": len(cands),
        "feasible": sum(math.isfinite(v) for v in values),
        "top": top,
        "at_box_edge": sorted(c for c, n in (found_units or best_units).items()
                              if c in ranges
                              and n is not None and (n <= ranges[c][0] or n >= ranges[c][-1])
                              and len(ranges[c]) > 1),
        "value_before": v0 if math.isfinite(v0) else None,
        "value_after": best_v if math.isfinite(best_v) else None,
        "improved": bool(improved),
        "gain": (v0 - best_v) / v0 if improved and math.isfinite(v0) else 0.0,
        "best_units": found_units,
        "evaluations": f.n - n0,
        "seconds": round(time.perf_counter() - t0, 3),
    }


# --- phase 4b: every strategy within a margin at any of several splits, refined ---------------


def _contenders(f, splits: Mapping[str, tuple[dict[str, Any], list[float]]],
                combos: list[dict[str, Any]], done: set[tuple], cont_names: list[str],
                space, floats, opts: Mapping[str, Any]) -> dict[str, Any]:
    """``splits``: name -> (continuous point, the value of every combination there).  Per
    strategy (a combination less its mapping order) its best order at each split; a strategy
    is a contender when at some split it is within ``margin`` × that split's best.  The
    contenders not refined yet (``done``: strategy keys) are refined from their best
    (split, order) by a compass search of ``contender_evals``, the closest first, at most
    ``max_contenders``.  Returns the record."""
    margin = float(opts["margin"])
    best_at: dict[str, float] = {}
    per: dict[tuple, dict[str, Any]] = {}
    for split, (_, values) in splits.items():
        finite = [v for v in values if math.isfinite(v)]
        best_at[split] = min(finite) if finite else math.inf
        for combo, v in zip(combos, values, strict=True):
            if not math.isfinite(v):
                continue
            k = without_order(combo)
            e = per.setdefault(k, {"ratio": math.inf, "splits": []})
            ratio = v / best_at[split]
            if ratio <= margin and split not in e["splits"]:
                e["splits"].append(split)
            if ratio < e["ratio"]:
                e.update(ratio=ratio, value=v, split=split, combo=combo)
    within = {k: e for k, e in per.items() if e["splits"]}
    todo = sorted((e["ratio"], k) for k, e in within.items() if k not in done)
    chosen = todo[:int(opts["max_contenders"])]
    t0, n0, v0 = time.perf_counter(), f.n, f.best[0]
    refined = []
    for _, k in chosen:
        e = within[k]
        point = {**splits[e["split"]][0], **e["combo"]}
        v, q = _compass(f, point, e["value"], cont_names, space, floats,
                        int(opts["contender_evals"]))
        done.add(k)
        refined.append({"combination": e["combo"], "from_split": e["split"],
                        "within_margin_at": e["splits"], "start_value": e["value"],
                        "value": v if math.isfinite(v) else None, "params": q})
    return {"margin": margin, "splits": list(splits), "strategies": len(per),
            "within_margin": len(within), "already_refined": len(within) - len(todo),
            "refined": len(refined), "left_out": len(todo) - len(chosen),
            "contenders": refined, "improved": bool(f.best[0] < v0),
            "evaluations": f.n - n0, "seconds": round(time.perf_counter() - t0, 3)}


# --- phase 7: a CMA-ES cross-check from several starts -----------------------------------------


def _cross_check(f, starts: list[tuple[str, dict[str, Any]]], cont_names: list[str], space,
                 floats, opts: Mapping[str, Any]) -> dict[str, Any]:
    """CMA-ES (the ``cmaes`` package) on the continuous parameters, each bound scaled to
    [0, 1], from each start (``(label, params)``: the discrete choices stay those of the
    start) for ``cma_evals`` evaluations (population evaluated in one batch; an infeasible
    design scores 1e30).  Independent of the main search: when it finds a better design,
    that design is the best-known one and the record says so (``beat_main``)."""
    main = f.best[0]
    t0, n0 = time.perf_counter(), f.n
    if len(cont_names) < 2:  # CMA-ES needs two dimensions or more
        return {"skipped": f"{len(cont_names)} continuous parameter(s): nothing for CMA-ES",
                "beat_main": False}
    from cmaes import CMA

    bounds = np.array([_bounds(space, floats, n) for n in cont_names])
    lo, width = bounds[:, 0], bounds[:, 1] - bounds[:, 0]
    runs = []
    for i, (label, start) in enumerate(starts):
        fixed = {k: v for k, v in start.items() if k not in cont_names}
        u0 = np.clip((np.array([start[n] for n in cont_names]) - lo) / width, 0.0, 1.0)
        cma = CMA(mean=u0, sigma=float(opts["cma_sigma"]),
                  bounds=np.tile([0.0, 1.0], (len(cont_names), 1)),
                  seed=int(opts["seed"]) + i)
        used, best = 0, math.inf
        while used < opts["cma_evals"] and not cma.should_stop():
            xs = [cma.ask() for _ in range(cma.population_size)]
            points = [{**fixed, **dict(zip(cont_names, (lo + x * width).tolist(),
                                           strict=True))} for x in xs]
            values = f.many(points)
            used += len(points)
            best = min(best, *values)
            cma.tell([(x, v if math.isfinite(v) else 1e30)
                      for x, v in zip(xs, values, strict=True)])
        runs.append({"start": label, "value": best if math.isfinite(best) else None,
                     "evaluations": used})
    found = min((r["value"] for r in runs if r["value"] is not None), default=math.inf)
    return {"main_value": main if math.isfinite(main) else None,
            "value": found if math.isfinite(found) else None, "runs": runs,
            "beat_main": bool(found < main),
            "gain": (main - found) / main if found < main and math.isfinite(main) else 0.0,
            "evaluations": f.n - n0, "seconds": round(time.perf_counter() - t0, 3)}
