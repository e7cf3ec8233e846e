"""Why the structured driver ends where it does on a suite study: its end point beside the
best-known design, unit by unit, and what reaches the best-known design from there.

    python benchmarks/bench_basin.py --study lstm-2k-1chip-n7 [--budget 1000] [--seed 0]
        [--best-known DIR] [--quick-reference] [--cma-evals 300] [--hops 12] [--hop-evals 60]
        [--from-evals 400] [--shake-evals 300] [--pairs] [--axial-evals 300]
        [--study-table FILE]

Steps (every figure a model evaluation of the study's own objective; prints one JSON object):

1. the driver's plan (``bench_plan.run``, as a study with the ``structured`` sampler would
   run it) for ``--budget`` evaluations; its best point;
2. the best-known design (:func:`crossflow.search.best_known.best_known`, cached under
   ``--best-known``; a minute or more on a new study; ``--quick-reference``: the suite's
   ``--quick`` settings, seconds, for a smoke test);
3. both designs' whole units (:func:`crossflow.arch.cliffs.quantities_at`) and budget
   shares, and each budget simplex of one put into the other (is the difference one
   simplex's, or do they only pay off together?);
4. from the driver's end point: CMA-ES (the ``cmaes`` package) on every logit with a small
   first step (0.2 and 0.5), three seeds of ``--cma-evals`` evaluations each — does a
   search that learns correlated directions walk across?;
5. monotonic basin hopping (Wales and Doye, J. Phys. Chem. A 101, 1997): ``--hops`` random
   jumps of every log-share by N(0, sigma) (sigma 0.5 and 1.0), each followed by the
   driver's local search for ``--hop-evals`` evaluations — does a short local search from
   a jump land in the better basin?
6. for each budget simplex: the driver's local search for ``--from-evals`` evaluations from
   its end point with that simplex set to the best-known design's — is the better basin a
   matter of that simplex alone, the others following by local search?
7. for each budget share in turn: the driver's end point with that share halved and doubled
   (the others in proportion), each followed by the driver's local search for
   ``--shake-evals`` evaluations — the shakes of the driver's variable neighbourhood search
   (``_plan._shake``), each given a longer search: does one share moved a long way reach
   the better basin?
8. with ``--pairs``: every pair of shares of one simplex multiplied together by 0.25, 0.5,
   2 and 4 (the others in proportion), each followed by the same search, with its rank by
   shaken value among all the shakes of steps 7 and 8 (the driver searches its shakes best
   shaken value first) — does a move of two shares reach what no move of one does, and
   would the driver try it early?

9. with ``--axial-evals N``: the template's start split with each axial probe of the driver
   (``_plan._axial``: one share raised to ``_plan.AXIAL``, the others in proportion), in
   the best-known design's own strategy, order and technology, each followed by the local
   search for N evaluations — which start leads to the best-known basin, and how its
   value at the start ranks it (the driver races the best-valued probe only)?

``--study-table`` diagnoses a study of another table of the suite's format
(``benchmarks/suite/fresh.yaml``); its best-known design is searched and cached under
``--best-known`` when it is not there yet.

Gaps are in % above the best-known value.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_plan  # noqa: E402
import suite  # noqa: E402


def _gap(v: float, ref: float) -> float | None:
    return round(100 * (v / ref - 1), 3) if math.isfinite(v) else None


def _shares(params: dict, block: str) -> dict[str, float]:
    """The decoded shares (slack included) of one budget simplex's logits in ``params``."""
    from crossflow.search.encoding import decode

    keys = [k for k in params if k.startswith(block + ".")]
    return {k.split(".", 1)[1]: round(s, 4)
            for k, s in zip(keys, decode([params[k] for k in keys]), strict=True)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--study", required=True)
    ap.add_argument("--budget", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--best-known", default=str(suite.RESULTS))
    ap.add_argument("--quick-reference", action="store_true")
    ap.add_argument("--cma-evals", type=int, default=300)
    ap.add_argument("--hops", type=int, default=12)
    ap.add_argument("--hop-evals", type=int, default=60)
    ap.add_argument("--from-evals", type=int, default=400)
    ap.add_argument("--shake-evals", type=int, default=300)
    ap.add_argument("--pairs", action="store_true", help="step 8: shakes of two shares")
    ap.add_argument("--axial-evals", type=int, default=0,
                    help="step 9: the local search from each axial probe of the template")
    ap.add_argument("--study-table", default=str(suite.TABLE))
    a = ap.parse_args(argv)
    if not any(e["name"] == a.study for e in suite.load_table(a.study_table)):
        ap.error(f"no study {a.study!r} in {a.study_table}")
    print(json.dumps(diagnose(a.study, budget=a.budget, seed=a.seed, root=a.best_known,
                              quick=a.quick_reference, cma_evals=a.cma_evals, hops=a.hops,
                              hop_evals=a.hop_evals, from_evals=a.from_evals,
                              shake_evals=a.shake_evals, pairs=a.pairs,
                              axial_evals=a.axial_evals, table=a.study_table),
                     indent=1, default=str))
    return 0


def diagnose(study: str, *, budget: int = 1000, seed: int = 0, root: str | None = None,
             quick: bool = False, cma_evals: int = 300, hops: int = 12,
             hop_evals: int = 60, from_evals: int = 400, shake_evals: int = 300,
             pairs: bool = False, axial_evals: int = 0,
             table: str | Path = suite.TABLE) -> dict:
    """Steps 1-7 (8 with ``pairs``, 9 with ``axial_evals``) of the module docstring on the
    study ``study`` of the suite's ``table``."""
    from cmaes import CMA

    from crossflow.arch.cliffs import quantities_at
    from crossflow.search.best_known import best_known
    from crossflow.search.objective import evaluate
    from crossflow.search.samplers.structured._inner import exchange
    from crossflow.search.samplers.structured._plan import AXIAL, _axial, _shakes
    from crossflow.search.samplers.structured._problem import Cont, Problem
    from crossflow.search.study import load_study

    entry = next(e for e in suite.load_table(table) if e["name"] == study)
    setup = load_study(entry["spec"])

    def f(params: dict) -> float:
        return evaluate(setup, setup.design(params)).values(setup.objectives)[0]

    seen: list[tuple[dict, float]] = []
    bench_plan.run(entry["spec"], budget, seed, {},
                   on_batch=lambda pts, vals, _s: seen.extend(zip(pts, vals, strict=True)))
    drv, v_drv = min(seen, key=lambda pv: pv[1])
    bk = best_known(setup, root=root or str(suite.RESULTS),
                    **(suite.QUICK["best_known"] if quick else {}))
    ref, ref_params = float(bk["value"]), bk["params"]
    blocks = sorted({k.split(".")[0] for k in drv if k.split(".")[0] in
                     {s.name for s in setup.space.simplexes}})

    def describe(params: dict, value: float) -> dict:
        q = quantities_at(setup.template, setup.overrides(setup.design(params)))
        return {"gap_pct": _gap(value, ref), "units": q,
                "shares": {b: _shares(params, b) for b in blocks},
                "discrete": {k: v for k, v in params.items() if not isinstance(v, float)}}

    swaps = {}
    for b in blocks:
        mine = {k: v for k, v in ref_params.items() if k.startswith(b + ".")}
        theirs = {k: v for k, v in drv.items() if k.startswith(b + ".")}
        swaps[f"best-known {b} on the driver's"] = _gap(f({**drv, **mine}), ref)
        swaps[f"driver's {b} on the best-known"] = _gap(f({**ref_params, **theirs}), ref)

    keys = [k for k in drv if isinstance(drv[k], float)]
    cma = {}
    for sigma in (0.2, 0.5):
        ends = []
        for seed in range(3):
            m = np.clip([drv[k] for k in keys], -3.999, 3.999)
            es = CMA(mean=m, sigma=sigma, bounds=np.tile([-4.0, 4.0], (len(m), 1)), seed=seed)
            best, used = v_drv, 0
            while used < cma_evals:
                xs = [es.ask() for _ in range(es.population_size)]
                vs = [f({**drv, **dict(zip(keys, map(float, x), strict=True))}) for x in xs]
                used += len(xs)
                best = min([best, *vs])
                es.tell([(x, v if math.isfinite(v) else 1e30) for x, v in zip(xs, vs,
                                                                             strict=True)])
            ends.append(_gap(best, ref))
        cma[f"sigma {sigma}"] = ends

    P = Problem(setup)
    x0, d = P.split(drv)
    rng = np.random.default_rng(seed)

    def fx(x: Cont, discrete: dict = d) -> float:
        return f(P.params(x, discrete))

    def local(y: Cont, evals: int, discrete: dict = d,
              marks: dict[int, float | None] | None = None) -> float:
        """The driver's local search from ``y`` (in the driver's end's discrete choices,
        or ``discrete``): its best value; ``marks`` (evaluations -> None) gets its best
        value after that many evaluations filled in."""
        best = fx(y, discrete)
        g = exchange(P, discrete, y, best, evals, rng)
        used = 0
        try:
            batch = next(g)
            while True:
                got = [fx(b, discrete) for b in batch]
                for v in got:
                    used, best = used + 1, min(best, v)
                    if marks is not None and used in marks:
                        marks[used] = best
                batch = g.send(got)
        except StopIteration as stop:
            return stop.value[1]

    hopped = {}
    for sigma in (0.5, 1.0):
        ends = []
        for _ in range(hops):
            simp = {}
            for k, v in x0.simplexes.items():
                z = np.log(np.maximum(v, 1e-300)) + rng.normal(0.0, sigma, len(v))
                z = np.exp(z - z.max())
                simp[k] = z / z.sum()
            ends.append(_gap(local(Cont(simp, dict(x0.floats)), hop_evals), ref))
        hopped[f"sigma {sigma}"] = sorted(ends, key=lambda g: math.inf if g is None else g)

    from_known = {}
    for b in blocks:
        y, _ = P.split({**drv, **{k: v for k, v in ref_params.items()
                                  if k.startswith(b + ".")}})
        from_known[f"best-known {b}"] = _gap(local(y, from_evals), ref)

    shakes = {f"{c.label} x{factor:g}": {"shaken": _gap(fx(y), ref),
                                         "searched": _gap(local(y, shake_evals), ref)}
              for c, factor, y in _shakes(P, x0, [0.5, 2.0])}
    two = {}
    if pairs:
        two = {label: {"shaken": _gap(fx(y), ref), "searched": _gap(local(y, shake_evals), ref)}
               for label, y in _pair_shakes(P, x0, (0.25, 0.5, 2.0, 4.0))}
        ranked = sorted({**shakes, **two}.items(),
                        key=lambda kv: math.inf if kv[1]["shaken"] is None else kv[1]["shaken"])
        for rank, (_, v) in enumerate(ranked):
            v["rank_by_shaken"] = rank

    axial = {}
    if axial_evals:
        start, _ = P.start()
        _, known = P.split(ref_params)
        starts = [("template", start)] + [(f"{c.label} {share:g}", y)
                                          for c, share, y in _axial(P, start, AXIAL)]
        for label, y in starts:
            marks = dict.fromkeys(m for m in (10, 20, 40, 80, 160) if m < axial_evals)
            end = local(y, axial_evals, known, marks)
            axial[label] = {"probed": _gap(fx(y, known), ref),
                            "after": {m: _gap(v, ref) for m, v in marks.items()
                                      if v is not None},
                            "searched": _gap(end, ref)}

    return {
        "study": study, "budget": budget, "seed": seed,
        "best_known": {"value": ref, "evaluations": bk.get("evaluations"),
                       **describe(ref_params, ref)},
        "driver": {"value": v_drv, **describe(drv, v_drv)},
        "swapped_simplexes_gap_pct": swaps,
        "local_cma_from_driver_gap_pct": cma,
        "basin_hops_gap_pct": hopped,
        "local_search_from_best_known_simplex_gap_pct": from_known,
        "shakes_gap_pct": shakes,
        **({"pair_shakes_gap_pct": two} if pairs else {}),
        **({"axial_from_template_gap_pct": axial} if axial_evals else {}),
    }


def _pair_shakes(P, x, factors) -> list[tuple[str, object]]:
    """(label, point) of every shake of two shares of one simplex of ``x``: both multiplied
    by each of ``factors``, the others (slack included) scaled in proportion to fill the
    rest; a pair the factor would take to the encoding's floor or near the whole budget is
    not shaken."""
    from itertools import combinations

    from crossflow.search.samplers.structured._problem import _FLOOR, Cont

    out = []
    for block, v0 in x.simplexes.items():
        coords = [c for c in P.coords if c.block == block and c.index >= 0]
        for a, b in combinations(coords, 2):
            for f in factors:
                pair = v0[a.index] * f + v0[b.index] * f
                if min(v0[a.index], v0[b.index]) * f <= 2 * _FLOOR or pair >= 0.98:
                    continue
                v = np.array(v0, dtype=float) * (1.0 - pair) / (1.0 - v0[a.index] - v0[b.index])
                v[a.index], v[b.index] = v0[a.index] * f, v0[b.index] * f
                out.append((f"{block}.{a.name}+{b.name} x{f:g}",
                            Cont({**x.simplexes, block: v}, x.floats)))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
