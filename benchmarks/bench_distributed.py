"""Distributed prediction latency (docs/architecture.md, "Benchmarks"; issue #3).

Prints one JSON object.

    python benchmarks/bench_distributed.py [--repeat N] [--cold-runs N]

* ``lstm_case_study_512``: the paper's §9 LSTM on its 512-node torus (``deepflow-case-study``
  chips, ``deepflow-case-study-512``) with the strategy ``RC-4-2-d32-p2`` (the
  ``lstm-rc-4-2-d32-p2`` preset; the full simulation runs, then the memory check finds it
  over the chip's 16 GiB) and with ``RC-16-8-d4-p1`` (fits), mapping order kp1-kp2-dp-lp;
  target ≤ 10 ms.
* ``gpt3_175b_1536_a100``: GPT-3 175B, t8 p8 d24 on ``dgx-a100``, one mapping order; target
  ≤ 20 ms.
* ``gpt3_175b_1536_a100_best_order``: the same with ``mapping_order="best"`` (all 24 orders);
  target ≤ 24 × the single order.

Each is timed warm (:func:`_timing.timeit`: median of N calls in this process, caches filled
by the warm-up calls) and cold (:func:`_timing.cold`: the first call in a fresh interpreter).
Arguments are preset names, as a user or a study passes them, so every call reads and
validates the workload, system and parallelism files.
"""

from __future__ import annotations

import argparse
import json

from _timing import cold, machine, timeit

import crossflow

LSTM = {"workload": "lstm-paper-case-study", "hardware": "deepflow-case-study",
        "system": "deepflow-case-study-512", "mapping_order": "kp1-kp2-dp-lp"}
GPT3 = {"workload": "gpt3-175b", "hardware": "a100-sxm4-80gb", "system": "dgx-a100",
        "parallelism": "gpt3-175b-t8-p8-d24"}
#: name -> (keyword arguments of crossflow.predict, share of --repeat, target in ms)
CASES = {
    "lstm_case_study_512_RC-4-2-d32-p2": ({**LSTM, "parallelism": "lstm-rc-4-2-d32-p2"}, 1.0,
                                          10.0),
    "lstm_case_study_512_RC-16-8-d4-p1": ({**LSTM, "parallelism": "RC-16-8-d4-p1"}, 1.0, 10.0),
    "gpt3_175b_1536_a100": ({**GPT3, "mapping_order": "kp1-kp2-dp-lp"}, 1.0, 20.0),
    "gpt3_175b_1536_a100_best_order": ({**GPT3, "mapping_order": "best"}, 0.25, None),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=100, help="warm calls per case")
    parser.add_argument("--cold-runs", type=int, default=5, help="fresh processes per case")
    args = parser.parse_args()
    results: dict[str, object] = {"machine": machine()}
    for name, (kwargs, share, target) in CASES.items():
        p = crossflow.predict(**kwargs)
        warm = timeit(lambda kw=kwargs: crossflow.predict(**kw), max(5, int(args.repeat * share)))
        results[name] = {
            "predict": kwargs,
            "feasible": p.feasible,
            "time_s": p.to_dict()["time_s"],
            "warm": warm,
            "cold": cold(f"crossflow.predict(**{kwargs!r})", args.cold_runs),
            **({"target_ms": target, "meets_target": warm["median_ms"] <= target}
               if target else {}),
        }
    single = results["gpt3_175b_1536_a100"]
    best = results["gpt3_175b_1536_a100_best_order"]
    best["ratio_to_single_order"] = best["warm"]["median_ms"] / single["warm"]["median_ms"]
    best["cold_ratio_to_single_order"] = best["cold"]["median_ms"] / single["cold"]["median_ms"]
    best["target_ratio"] = 24.0
    best["meets_target"] = best["ratio_to_single_order"] <= 24.0
    print(json.dumps(results, indent=2, default=float))


if __name__ == "__main__":
    main()
