"""Where a strategy ranks among a study's strategies at one budget split and at others: does
the split a search screens at decide which strategy it keeps?
(docs/search-history.md, "A thirty-fifth round").

    python benchmarks/strategy_ranks.py --study lstm-2560-256-n3-350w \\
        --study-table benchmarks/suite/fresh3.yaml --strategy RC-64-1-d1-p4 \\
        [--runs RUNS_FOLDER] [--driver-prefixes 250,400] [--random 8 --sigma 0.5,1.0 --top 32]
        [--mixed 60,120 --pool 16]

Every memory-feasible combination of the study is priced in each of its classes of mapping
orders (its best class counts) at:

* the template's split (the screen's);
* with ``--runs`` (a ``benchmarks/suite.py`` runs folder), the best split of each run of
  the study at its largest budget, e.g. plain CMA-ES's and the driver's;
* with ``--driver-prefixes 250,400``, the driver's best split after that many of its
  evaluations (its plan run as ``benchmarks/bench_plan.py`` runs it, seed 0, no jitter);
* with ``--random N``, N random splits per ``--sigma`` (every logit of the template moved
  by N(0, sigma)), for the template's ``--top`` best combinations only; the rank printed
  for them is by each one's best over the N splits;
* with ``--mixed 60,120``, the split of the best sample after that many evaluations of a
  *mixed* CMA-ES: CMA-ES over the split from the template's (step 1 in the natural
  coordinates), each sample paired with one of the template's ``--pool`` best combinations
  (each in its best class of orders) drawn at random, as plain CMA-ES samples categoricals
  beside the split (docs/search-history.md, "A thirty-sixth round").

Prints the best three strategies and ``--strategy``'s rank at each.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import suite  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--study", required=True)
    ap.add_argument("--study-table", default=str(suite.TABLE))
    ap.add_argument("--strategy", required=True, help="the strategy whose rank is printed")
    ap.add_argument("--runs", type=Path, default=None)
    ap.add_argument("--driver-prefixes", default="",
                    help="the driver's best split after these many evaluations, e.g. 250,400")
    ap.add_argument("--random", type=int, default=0)
    ap.add_argument("--sigma", default="0.5,1.0")
    ap.add_argument("--top", type=int, default=32)
    ap.add_argument("--mixed", default="", help="a mixed CMA-ES's best split after these "
                    "many evaluations, e.g. 60,120")
    ap.add_argument("--pool", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from crossflow.search.objective import evaluate
    from crossflow.search.samplers.structured._plan import _memory_screen, _point, _vector
    from crossflow.search.samplers.structured._problem import Problem
    from crossflow.search.study import load_study

    entry = next((e for e in suite.load_table(args.study_table) if e["name"] == args.study),
                 None)
    if entry is None:
        raise SystemExit(f"strategy_ranks: no study {args.study!r} in {args.study_table}")
    setup = load_study(entry["spec"])
    P = Problem(setup)
    x0, d0 = P.start()
    _, combos = _memory_screen(P, x0, d0, None, np.random.default_rng(0), None)

    def priced(x, discrete) -> float:
        e = evaluate(setup, setup.design(P.params(x, discrete)))
        return e.values(setup.objectives)[0] if e.feasible else math.inf

    def best_order(x, combo) -> tuple[float, dict]:
        return min(((priced(x, d), d) for d in (P.with_order(combo, o)
                                                for o in P.order_classes(combo))),
                   key=lambda t: t[0])

    def value(x, combo) -> float:
        return best_order(x, combo)[0]

    def at(x, among=None) -> dict[str, float]:
        # a strategy's value: its best combination's (other categoricals, e.g. technology)
        out: dict[str, float] = {}
        for c in among or combos:
            out[c["strategy"]] = min(out.get(c["strategy"], math.inf), value(x, c))
        return out

    def show(label: str, values: dict[str, float]) -> None:
        ranked = sorted(values, key=values.__getitem__)
        rank = ranked.index(args.strategy) + 1 if args.strategy in values else None
        top = ", ".join(f"{s} {values[s]:.4g}" for s in ranked[:3])
        print(f"{label:40s} {args.strategy} rank {rank} of {len(ranked)}; best: {top}")

    at_template = at(x0)
    show("template split", at_template)
    if args.runs is not None:
        folder = args.runs / args.study
        files = sorted(folder.glob("*.json"), key=lambda f: int(f.stem.rsplit(".b", 1)[1]))
        largest = int(files[-1].stem.rsplit(".b", 1)[1]) if files else 0
        for f in files:
            if int(f.stem.rsplit(".b", 1)[1]) != largest:
                continue
            run = json.loads(f.read_text())
            x, _ = P.split(run["best_params"])
            show(f"{f.stem} ({run['best_params']['strategy']})",
                 at(x))
    if args.driver_prefixes:
        import bench_plan

        prefixes = sorted(int(n) for n in args.driver_prefixes.split(","))
        seen: list = []

        def record(points, values, _seconds) -> None:
            seen.extend(zip(points, values, strict=True))

        bench_plan.run(entry["spec"], prefixes[-1], 0, {}, on_batch=record)
        for n in prefixes:
            params, best = min(seen[:n], key=lambda pv: pv[1])
            x, _ = P.split(params)
            show(f"driver after {n} ({params['strategy']}, {best:.4g})", at(x))
    if args.random:
        top = sorted(combos, key=lambda c: at_template[c["strategy"]])[:args.top]
        rng = np.random.default_rng(args.seed)
        v0 = _vector(P, x0)
        for sigma in (float(s) for s in args.sigma.split(",")):
            best = at(x0, top)
            for _ in range(args.random):
                x = _point(P, v0 + sigma * rng.standard_normal(v0.shape), x0)
                for k, v in at(x, top).items():
                    best[k] = min(best[k], v)
            show(f"best of {args.random} random splits, sigma {sigma:g}", best)
    if args.mixed:
        from crossflow.search.samplers.structured._plan import cma_es, told

        ranked = sorted((c for c in combos if math.isfinite(at_template[c["strategy"]])),
                        key=lambda c: at_template[c["strategy"]])
        pool = [best_order(x0, c)[1] for c in ranked[:args.pool]]
        rng = np.random.default_rng(args.seed)
        cma = cma_es(P, x0, 1.0, args.seed)
        marks = sorted(int(n) for n in args.mixed.split(","))
        used, best = 0, (math.inf, cma.mean, None)
        while marks:
            vs = [cma.ask() for _ in range(cma.population_size)]
            got = []
            for v in vs:
                d = pool[int(rng.integers(len(pool)))]
                got.append(priced(_point(P, v, x0), d))
                best = min(best, (got[-1], v, d["strategy"]), key=lambda t: t[0])
            used += len(vs)
            cma.tell(told(vs, got))
            while marks and used >= marks[0]:
                marks.pop(0)
                show(f"mixed CMA-ES's best after {used} ({best[2]})",
                     at(_point(P, best[1], x0)))


if __name__ == "__main__":
    main()
