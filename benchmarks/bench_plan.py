"""The structured driver's plan run directly (no Optuna, no MLflow), for choosing its
settings on the benchmark suite: the same points and values as a study with the
``structured`` sampler (the plan is deterministic), in a fraction of the time.

    python benchmarks/bench_plan.py --half tuning --budgets 300,1000 --jobs 2 \\
        --variants '{"default": {}, "race-2": {"race": 2}}' [--seeds 1] [--studies a,b]
        [--best-known benchmarks/results/best_known] [--references FILE.json]
        [--out FILE.json] [--seeds 3 --jitter 0.05] [--kind budgets+strategy+order]
    python benchmarks/bench_plan.py --shipped gpt3-175b-a100 --budgets 4900,30000 \
        --variants '{"all": {"screen_cap": "all"}}'   # the study's trials vs its whole space

Every variant (a name -> :class:`~crossflow.search.samplers.structured.Settings` fields,
under ``"exchange"`` keyword arguments of the local search's rules, under ``"plan"`` the
plan module's constants; or ``{"cma_alone": SIGMA}``: no plan, CMA-ES alone over the split
of the template's combination, in the driver's natural coordinates, from the template's
split with step SIGMA — the driver's own late optimiser as a baseline; ``{"cma_alone":
{"sigma": SIGMA, "lr_adapt": true}}`` passes the other keys to ``cmaes.CMA``; or
``{"turbo_alone": {}}``: TuRBO-1, trust-region Bayesian optimisation (``benchmarks/turbo.py``),
from the same split, its options ``q`` and :class:`turbo.Turbo`'s keywords); or
``{"scipy_alone": {"method": "de" | "nelder-mead", ...}}``: scipy's differential evolution
or Nelder-Mead over the same split (:func:`_scipy_alone`)) runs on
every selected study of ``benchmarks/suite/studies.yaml`` (without
``--studies``, the 22 with a budget split: a strategy-only study's plan ends with its
screen, where a study hands over to TPE).  A study's reference is
the best value any run found, or the suite's cached best-known value when it is lower
(``--best-known``: the folder ``benchmarks/suite.py`` caches them in).  Prints, per budget,
each variant's median and worst gap (%) over the studies, with more than one variant each
one's change against the first with its bootstrap interval (``benchmarks/paired.py``, which
also pools the ``--out`` files of several tables), and writes every run's gaps to
``--out``.  The study's baseline trials count as evaluations, as in a study.
``--table`` adds each study's median gap under each variant, per budget; ``--trace`` every
run's local searches (which run had each turn, over which evaluations, from and to which
gap: where a run stalls, and which run found the best design).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import paired  # noqa: E402  (benchmarks/paired.py: a variant's change against noise)
import suite  # noqa: E402  (benchmarks/suite.py: the table of studies)
import suite_tables  # noqa: E402  (benchmarks/suite_tables.py: a committed table read back)

_DEFAULTS: dict[str, dict] = {}


def run(spec, budget: int, seed: int, settings: dict,
        phases: list[list] | None = None, jitter: float = 0.0,
        on_batch=None, searches: list[dict] | None = None) -> list[float]:
    """Every evaluation's value (inf when infeasible), the baseline trials first (a study
    samples their missing dimensions at random: counted here as inf); ``phases`` (when
    given) gets the plan's phases in order, each as [name, evaluations].  With ``jitter``
    and a seed above 0, the plan starts from the template's split with every share scaled
    by exp(N(0, jitter)) (see ``--jitter``).  ``on_batch(points, values, seconds)`` (when
    given) is called after each of the plan's batches with the model's time for it
    (``benchmarks/bench_driver.py``).  ``searches`` (when given) gets the local searches'
    turns in order (:func:`_traced`)."""
    import functools

    from crossflow.search.objective import evaluate, evaluate_many
    from crossflow.search.samplers.structured import _inner, _plan
    from crossflow.search.samplers.structured._plan import Settings, _point, plan
    from crossflow.search.samplers.structured._problem import Problem, point_key
    from crossflow.search.study import load_study

    # the local search's own rules are constants of the driver, not settings; a variant's
    # "exchange" entry sets them here, to measure what each rule is worth
    settings = dict(settings)
    _plan.exchange = functools.partial(_inner.exchange, **settings.pop("exchange", {}))
    # ... and a "plan" entry sets the plan module's constants (PATIENCE, SIGMA0, ...); a
    # pool worker runs many tasks, so each task starts from the module's own values
    defaults = _DEFAULTS.setdefault("plan", {k: getattr(_plan, k) for k in dir(_plan)
                                             if k.isupper()})
    for k, v in {**defaults, **settings.pop("plan", {})}.items():
        setattr(_plan, k, v)
    setup = load_study(spec)
    names = {d.name for d in setup.space.dimensions}
    def value(e):
        return e.values(setup.objectives)[0] if e.feasible else math.inf

    cma_sigma = settings.pop("cma_alone", None)
    turbo = settings.pop("turbo_alone", None)
    scipy_alone = settings.pop("scipy_alone", None)
    baseline = setup.baseline_trials()
    values = [value(evaluate(setup, setup.design(p))) if names <= set(p) else math.inf
              for p in baseline]
    # a point of the plan that a baseline trial evaluated is answered from it, as the
    # sampler does, not evaluated (nor counted) again
    known = {point_key(p): v for p, v in zip(baseline, values, strict=True)
             if names <= set(p)}
    P = Problem(setup)
    start = None
    if jitter and seed:
        import numpy as np

        from crossflow.search.samplers.structured._problem import Cont

        rng = np.random.default_rng(10_000 + seed)
        x0, d0 = P.start()
        shaken = {}
        for name, v in x0.simplexes.items():
            w = np.maximum(v, 1e-9) * np.exp(rng.normal(0.0, jitter, len(v)))
            shaken[name] = w / w.sum()
        start = P.params(Cont(shaken, x0.floats), d0)
    if turbo is not None or cma_sigma is not None or scipy_alone is not None:
        # a baseline instead of the plan
        x0, d0 = P.start() if start is None else P.split(start)

        def price(vectors) -> list[float]:
            """Each split of ``d0`` given in the driver's natural coordinates, priced."""
            return [value(e) for e in evaluate_many(
                setup, [setup.design(P.params(_point(P, v, x0), d0)) for v in vectors])]

        if scipy_alone is not None:
            return _scipy_alone(P, x0, seed, budget, values, price, dict(scipy_alone))
        if turbo is not None:
            return _turbo_alone(P, x0, d0, seed, budget, values, price, dict(turbo), known)
        options = dict(cma_sigma) if isinstance(cma_sigma, dict) else {"sigma": cma_sigma}
        return _cma_alone(P, x0, float(options.pop("sigma", 1.0)), seed, budget, values,
                          price, options)
    if searches is not None:
        _traced(_plan, searches, len(values))
    elif hasattr(_plan._Local, "_untraced_advance"):  # a traced task ran in this worker
        _plan._Local.advance = _plan._Local._untraced_advance
    gen = plan(P, seed=seed, settings=Settings(**settings), records=[], start=start)
    phase, batch = next(gen)
    while len(values) < budget:
        keys = [point_key(p) for p in batch]
        fresh = [i for i, k in enumerate(keys) if k not in known][:budget - len(values)]
        todo = [batch[i] for i in fresh]
        if phases is not None and todo:
            if phases and phases[-1][0] == phase:
                phases[-1][1] += len(todo)
            else:
                phases.append([phase, len(todo)])
        t0 = time.perf_counter()
        got = [value(e) for e in evaluate_many(setup, [setup.design(p) for p in todo])]
        if on_batch is not None:
            on_batch(todo, got, time.perf_counter() - t0)
        values += got
        if len(values) >= budget:
            break
        priced = {keys[i]: v for i, v in zip(fresh, got, strict=True)}
        try:
            phase, batch = gen.send([known.get(k, priced.get(k)) for k in keys])
        except StopIteration:  # the plan has seen the whole (discrete) space
            break
    return values


def _cma_alone(P, x0, sigma: float, seed: int, budget: int, values: list[float], price,
               options: dict | None = None) -> list[float]:
    """``values`` (the baseline trials') followed by CMA-ES's own until ``budget``: whole
    generations of :func:`~crossflow.search.samplers.structured._plan.cma_es` from ``x0``
    with step ``sigma`` (and ``options`` for ``cmaes.CMA``), each sample priced by
    ``price`` as a split of the template's combination."""
    from crossflow.search.samplers.structured._plan import cma_es, told

    cma = cma_es(P, x0, sigma, seed, **(options or {}))
    while len(values) < budget:
        xs = [cma.ask() for _ in range(cma.population_size)]
        got = price(xs)
        values += got
        cma.tell(told(xs, got))
    return values[:budget]


SCIPY_METHODS = ("de", "nelder-mead")  # what ``{"scipy_alone": {"method": ...}}`` runs


class _Spent(Exception):
    """The budget is spent: ends a scipy optimiser mid-run."""


def _scipy_alone(P, x0, seed: int, budget: int, values: list[float], price,
                 options: dict) -> list[float]:
    """``values`` (the baseline trials') followed by a scipy optimiser's until ``budget``,
    over the split of the template's combination in the driver's natural coordinates
    (bounded to them), restarted whenever it stops before the budget is spent:

    * ``{"method": "de"}`` (default): ``scipy.optimize.differential_evolution``, whole
      generations priced as one batch, the template's split in the first population, a
      restart with another seed; its other options (``popsize``, ``strategy``,
      ``mutation``, ``recombination``, ``maxiter``) passed on;
    * ``{"method": "nelder-mead", "step": S}``: adaptive Nelder-Mead from the template's
      split, a restart from the best point so far, its first simplex ``S`` (default 1)
      along each axis.

    An infeasible design is priced 1e30: both compare values only.  Unlike the other
    baselines these price the template's split again (scipy takes no value for a starting
    point): one evaluation of the budget."""
    import warnings

    import numpy as np
    from scipy import optimize

    from crossflow.search import encoding
    from crossflow.search.samplers.structured._plan import _vector

    method = options.pop("method", "de")
    if method not in SCIPY_METHODS:
        raise ValueError(f"scipy_alone: method {method!r} is not one of "
                         f"{', '.join(SCIPY_METHODS)}")
    span = encoding.SPAN
    start = np.clip(_vector(P, x0), -span + 1e-6, span - 1e-6)
    bounds = [(-span, span)] * len(start)
    best = [math.inf, start]

    def f(xs: np.ndarray) -> np.ndarray:
        batch = [xs] if xs.ndim == 1 else list(xs.T)
        room = budget - len(values)
        if room <= 0:
            raise _Spent
        got = price(batch[:room])
        values.extend(got)
        for x, v in zip(batch, got, strict=False):  # got is cut to the budget
            if v < best[0]:
                best[:] = [v, np.array(x)]
        if len(got) < len(batch):
            raise _Spent
        out = np.array([v if math.isfinite(v) else 1e30 for v in got])
        return out[0] if xs.ndim == 1 else out

    restart = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while len(values) < budget:
            try:
                if method == "de":
                    optimize.differential_evolution(
                        f, bounds, x0=start if restart == 0 else None, seed=seed + 1000 * restart,
                        vectorized=True, updating="deferred", polish=False,
                        **{"tol": 0.0, "maxiter": budget, **options})
                else:  # nelder-mead
                    step = float(options.get("step", 1.0))
                    x = np.clip(best[1], -span + 1e-6, span - 1e-6)
                    simplex = [x] + [np.clip(x + step * e, -span, span)
                                     for e in np.eye(len(x))]
                    optimize.minimize(f, x, method="Nelder-Mead", bounds=bounds,
                                      options={"initial_simplex": np.array(simplex),
                                               "adaptive": True, "maxfev": budget,
                                               "xatol": 1e-4, "fatol": 0.0})
            except _Spent:
                break
            restart += 1
    return values[:budget]


def _turbo_alone(P, x0, d0, seed: int, budget: int, values: list[float], price,
                 options: dict, known: dict) -> list[float]:
    """``values`` (the baseline trials') followed by TuRBO-1's (:mod:`turbo`) until
    ``budget``: the template's split first (told from ``known``, the baseline trials by
    point, when one of them was it), then batches of ``q`` (option, default 4) in the
    driver's natural coordinates scaled to the unit cube, each priced by ``price`` as a
    split of ``d0``; the other options go to :class:`turbo.Turbo`."""
    import numpy as np
    import turbo as trust_region

    from crossflow.search import encoding
    from crossflow.search.samplers.structured._plan import _vector
    from crossflow.search.samplers.structured._problem import point_key

    q = int(options.pop("q", 4))
    span = encoding.SPAN
    start = np.clip((_vector(P, x0) + span) / (2 * span), 0.0, 1.0)
    search = trust_region.Turbo(start, seed, **options)
    batch = [start]
    template = known.get(point_key(P.params(x0, d0)))
    if template is not None:
        search.tell(batch, [template])
        batch = search.ask(q)
    while len(values) < budget:
        got = price([u * 2 * span - span for u in batch])
        values += got
        if len(values) < budget:  # no GP is fitted for a batch that would not be priced
            search.tell(batch, got)
            batch = search.ask(min(q, budget - len(values)))
    return values[:budget]


def _traced(module, searches: list[dict], offset: int) -> None:
    """Record in ``searches`` every turn of a local search of ``module`` (the plan; each
    task of a pool worker sets it afresh): one entry per run of the local search and phase
    in a row — ``run`` (the runs numbered as the plan creates them: the race's first, a
    restart, a bracket's pair), its discrete choices, ``phase``, ``first`` / ``last``
    (the study's evaluations, the baseline trials counted), ``start`` and ``value`` (its
    best when the turn ended)."""
    import itertools

    base = module._Local
    if not hasattr(base, "_untraced_advance"):
        base._untraced_advance = base.advance
    # numbered on the run itself: an id() is reused once a replaced run is collected
    numbers = itertools.count()

    def advance(self, ask, phase, n):
        if getattr(self, "_traced_as", None) is not numbers:
            self._traced_as, self._traced_run = numbers, next(numbers)
        first = ask.total
        result = yield from base._untraced_advance(self, ask, phase, n)
        last = searches[-1] if searches else None
        if last and last["run"] == self._traced_run and last["phase"] == phase \
                and last["last"] == offset + first:
            last["last"], last["value"] = offset + ask.total, self.value
        elif ask.total > first:
            searches.append({"run": self._traced_run, "phase": phase,
                             "discrete": {k: str(v) for k, v in self.discrete.items()},
                             "first": offset + first, "last": offset + ask.total,
                             "start": self.start, "value": self.value})
        return result

    base.advance = advance


def _task(task):
    entry, variant, settings, seed, budget, jitter, trace = task
    t0 = time.perf_counter()
    phases: list[list] = []
    searches: list[dict] | None = [] if trace else None
    try:
        values = run(entry["spec"], budget, seed, settings, phases, jitter,
                     searches=searches)
    except BaseException as exc:  # a StopIteration would end the pool's iterator silently
        raise RuntimeError(f"{entry['name']} {variant}: {exc!r}") from exc
    return {"study": entry["name"], "half": entry["half"], "variant": variant, "seed": seed,
            "values": [v if math.isfinite(v) else None for v in values],
            "phases": phases, "wall_s": round(time.perf_counter() - t0, 2),
            **({"searches": searches} if trace else {})}


def references(path: Path) -> dict[str, float]:
    """Study -> reference value from a JSON object or a CSV with ``study`` and
    ``reference`` columns (``suite.csv`` repeats a study's reference on each of its rows; read
    as the suite reads an earlier table, :func:`suite_tables.carried_references`)."""
    if path.suffix == ".csv":
        return suite_tables.reference_values(path)
    return {k: float(v) for k, v in json.loads(path.read_text()).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--half", default="tuning", choices=("tuning", "checking", "all"))
    ap.add_argument("--studies", default="")
    ap.add_argument("--kind", default="",
                    help="only studies of these kinds (comma-separated: "
                         f"{', '.join(suite.KINDS)}), e.g. budgets+strategy+order for the "
                         "co-design studies a rule of the race or the second bracket touches")
    ap.add_argument("--study-table", type=Path, default=suite.TABLE,
                    help="the table of studies (default: the suite's); another table, such "
                         "as a set of new studies written the same way, checks whether a "
                         "rule holds beyond the suite")
    ap.add_argument("--shipped", default="",
                    help="shipped studies (comma-separated names) instead of the suite's")
    ap.add_argument("--budgets", default="300,1000")
    ap.add_argument("--variants", default='{"default": {}}')
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--jitter", type=float, default=0.0,
                    help="seeds above 0 start from the template's split with every share "
                         "scaled by exp(N(0, JITTER)): the driver is deterministic, so this "
                         "is how several runs of one study sample its schedule")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--best-known", type=Path)
    ap.add_argument("--references", type=Path,
                    help="study -> reference value: a JSON object, or a CSV with study and "
                         "reference columns such as benchmarks/results/suite.csv")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--table", action="store_true",
                    help="also print, per budget, each study's median gap under each variant")
    ap.add_argument("--trace", action="store_true",
                    help="also print every run's local searches: which run (the race's, a "
                         "restart, the second bracket's pair) had each turn, over which "
                         "evaluations, from and to which gap (kept in --out as 'searches')")
    args = ap.parse_args()
    if args.out:  # made now: a missing folder would lose the runs at the end
        args.out.parent.mkdir(parents=True, exist_ok=True)
    budgets = sorted(int(b) for b in args.budgets.split(","))
    variants = json.loads(args.variants)
    from crossflow.search.samplers.structured import _plan
    for name, v in variants.items():
        # a constant the plan does not have would be set and never read: a variant that
        # silently measures the default
        unknown = sorted(k for k in v.get("plan", {}) if not (k.isupper() and hasattr(_plan, k)))
        if unknown:
            ap.error(f"--variants: variant {name!r} sets {', '.join(unknown)}, which the plan "
                     f"(crossflow/search/samplers/structured/_plan.py) has no constant of; "
                     f"its constants: {', '.join(k for k in dir(_plan) if k.isupper())}")
        scipy_options = v.get("scipy_alone", {})
        if not isinstance(scipy_options, dict):
            ap.error(f"--variants: variant {name!r} sets scipy_alone to {scipy_options!r}; "
                     'it takes an object, e.g. {"method": "nelder-mead"}')
        if scipy_options.get("method", "de") not in SCIPY_METHODS:
            ap.error(f"--variants: variant {name!r} asks scipy_alone for method "
                     f"{scipy_options['method']!r}; allowed: {', '.join(SCIPY_METHODS)}")
    if args.shipped:
        studies = [{"name": n, "half": "shipped", "spec": n} for n in args.shipped.split(",")]
    else:
        names = [s for s in args.studies.split(",") if s] or None
        kinds = [k for k in args.kind.split(",") if k] or None
        studies = suite.select(suite.load_table(args.study_table), args.half, names, kinds)
        if names is None and kinds is None:
            # the plan of a strategy-only study ends with its screen (a study hands it to
            # TPE), so its gaps say nothing of the driver: those run as studies (suite.py)
            studies = [s for s in studies if s["kind"] != "strategy"]
        if not studies:
            ap.error(f"no study of {args.study_table} is in half {args.half!r}"
                     + (f" of kind {args.kind}" if kinds else "")
                     + (f" among {args.studies}" if names else ""))
        suite.preflight(studies, args.study_table)
    tasks = [(e, v, variants[v], seed, budgets[-1], args.jitter, args.trace) for e in studies
             for v in variants for seed in range(args.seeds)]
    t0 = time.perf_counter()
    with mp.get_context("fork").Pool(args.jobs) as pool:
        runs = list(pool.imap_unordered(_task, tasks))
    reference = {}
    for r in runs:
        best = min((v for v in r["values"] if v is not None), default=math.inf)
        reference[r["study"]] = min(reference.get(r["study"], math.inf), best)
    if args.best_known:
        for name in reference:
            try:
                doc = json.loads((args.best_known / f"{name}.json").read_text())
                if doc.get("value") is not None:
                    reference[name] = min(reference[name], doc["value"])
            except (OSError, ValueError):
                pass
    if args.references:
        for name, value in references(args.references).items():
            if name in reference:
                reference[name] = min(reference[name], float(value))
    rows = []
    for r in runs:
        for b in budgets:
            best = min((v for v in r["values"][:b] if v is not None), default=math.inf)
            ref = reference[r["study"]]
            gap = (best / ref - 1) * 100 if math.isfinite(best) and math.isfinite(ref) else None
            rows.append({**{k: r[k] for k in ("study", "half", "variant", "seed", "wall_s")},
                         "budget": b, "best": best, "gap_pct": gap})
    print(f"{len(studies)} studies x {len(variants)} variants x {args.seeds} seeds in "
          f"{time.perf_counter() - t0:.0f} s")
    for b in budgets:
        for v in variants:
            gaps = [r["gap_pct"] if r["gap_pct"] is not None else math.inf for r in rows
                    if r["variant"] == v and r["budget"] == b]
            line = (f"  @{b:5d} {v:24s} median {statistics.median(gaps):7.2f} %  worst "
                    f"{max(gaps):7.2f} %")
            if args.seeds > 1:  # each study's median over its seeds, then over studies
                per = [statistics.median(r["gap_pct"] if r["gap_pct"] is not None
                                         else math.inf for r in rows
                                         if r["variant"] == v and r["budget"] == b
                                         and r["study"] == e["name"]) for e in studies]
                line += (f"  | per-study medians: median {statistics.median(per):7.2f} %"
                         f"  worst {max(per):7.2f} %")
            print(line)
    if len(variants) > 1:  # is each variant's change in the median more than noise?
        print(paired.report([{"variants": variants, "rows": rows}]))
    if args.table:
        _print_table(rows, studies, variants, budgets)
    if args.trace:
        _print_traces(runs, reference)
    if args.out:
        args.out.write_text(json.dumps({"variants": variants, "rows": rows, "runs": runs}))


def _median_gap(rows: list[dict], study: str, variant: str, budget: int) -> float:
    """A study's median gap (%) over its seeds under a variant at a budget."""
    return statistics.median(r["gap_pct"] if r["gap_pct"] is not None else math.inf
                             for r in rows if r["study"] == study and r["variant"] == variant
                             and r["budget"] == budget)


def _print_table(rows: list[dict], studies: list[dict], variants: dict,
                 budgets: list[int]) -> None:
    """Per budget: one line per study, its median gap under each variant; then the
    median and mean over the studies of each half."""
    names = list(variants)
    width = max(len(e["name"]) for e in studies) + 2
    for b in budgets:
        print(f"\n@{b}".ljust(width + 1) + "".join(f"{v[:12]:>13s}" for v in names))
        for half in dict.fromkeys(e["half"] for e in studies):
            mine = [e["name"] for e in studies if e["half"] == half]
            per = {v: [_median_gap(rows, n, v, b) for n in mine] for v in names}
            for i, n in enumerate(mine):
                print(f"  {n:{width}s}" + "".join(f"{per[v][i]:12.2f} " for v in names))
            for label, f in (("median", statistics.median), ("mean", statistics.mean)):
                print(f"  {half + ' ' + label:{width}s}" + "".join(f"{f(per[v]):12.2f} "
                                                                 for v in names))


def _print_traces(runs: list[dict], reference: dict[str, float]) -> None:
    """Every run's local-search turns (``--trace``), gaps to the study's reference."""
    def gap(v: float, ref: float) -> str:
        return f"{(v / ref - 1) * 100:+8.2f} %" if math.isfinite(v) else "  infeasible"

    for r in sorted(runs, key=lambda r: (r["study"], r["variant"], r["seed"])):
        ref = reference[r["study"]]
        print(f"\n{r['study']}  {r['variant']}  seed {r['seed']}  phases "
              + ", ".join(f"{p} {n}" for p, n in r["phases"]))
        for t in r["searches"]:
            what = " ".join(str(v) for k, v in t["discrete"].items()
                            if k in ("strategy", "mapping_order"))
            print(f"  run {t['run']:<3d} {t['phase']:7s} {t['first']:5d}-{t['last']:<5d} "
                  f"{what:32s} start {gap(t['start'], ref)} -> {gap(t['value'], ref)}")


if __name__ == "__main__":
    main()
