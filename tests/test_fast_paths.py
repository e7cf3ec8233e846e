"""Fast screening (issue 11 part 4): the batch path, the memory-only check and the mapping
order classes give exactly what the full prediction gave before them.

The golden files were written by the prediction path as it was before the fast paths
(commit d419945: ``evaluate()`` on each design, ``crossflow.predict`` for the others):
``fast_paths_golden.json`` holds, for paper-lstm-512 and gemm-64k, three chips (the
template's split and two perturbed splits) with every strategy at one order (the memory
verdicts) and a sample of memory-feasible strategies x orders (times).  The three
transformer entries of ``fast_paths_predict_golden.json`` were rewritten by ``crossflow.predict``
after issue #19 changed the transformer model on purpose (Megatron's optimizer-step traffic,
blocking send/recv occupying both stages, the fp32 gradient buffer in memory); the batch path
must still match them exactly.  Likewise the LSTM times (``paper-lstm-512`` and the two LSTM
entries of the second file) were rewritten by ``evaluate`` / ``crossflow.predict`` one design
at a time when the LSTM's shared weights came to be all-reduced once per iteration instead of
once per time step (memory verdicts and bytes unchanged).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import crossflow
from crossflow.distributed import MemoryCheck, memory_check, predict_many
from crossflow.search.objective import evaluate, evaluate_many
from crossflow.search.study import load_study
from crossflow.system import ORDERS, order_classes, order_representative

DATA = Path(__file__).parent / "data"
GOLDEN = json.loads((DATA / "fast_paths_golden.json").read_text())
PREDICT_GOLDEN = json.loads((DATA / "fast_paths_predict_golden.json").read_text())
REL = 1e-9


@pytest.fixture(scope="module", params=sorted(GOLDEN))
def study(request):
    return request.param, load_study(request.param), GOLDEN[request.param]


def _design(setup, golden, row):
    return setup.design({**golden["chips"][row["chip"]], "strategy": row["strategy"],
                         "mapping_order": row["order"]})


def _same_time(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= REL * abs(b)


def _check(ev, row) -> None:
    p = ev.prediction
    time_s = None if p is None or not math.isfinite(p.time_s) else p.time_s
    assert ev.feasible == row["feasible"], row
    assert ev.reason == row["reason"]
    assert ev.mapping_order == row["mapping_order"]
    assert _same_time(time_s, row["time_s"]), (time_s, row)
    assert ev.infeasibility == pytest.approx(row["infeasibility"], rel=REL)
    if p is not None:
        assert p.energy_J == pytest.approx(row["energy_J"], rel=REL)
        assert p.memory_per_device_bytes == row["memory_per_device_bytes"]


def test_evaluate_and_evaluate_many_match_the_old_path(study):
    _, setup, golden = study
    rows = golden["time"]
    designs = [_design(setup, golden, r) for r in rows]
    batch = evaluate_many(setup, designs)
    assert len(batch) == len(rows)
    for ev, row in zip(batch, rows, strict=True):
        _check(ev, row)
        assert ev.eval_time_s > 0 and not ev.memory_only
    for design, row in list(zip(designs, rows, strict=True))[::7]:
        _check(evaluate(setup, design), row)


def test_memory_check_agrees_with_the_full_prediction(study):
    """Every strategy of the study at three chips: the memory-only verdict is the full
    prediction's (feasible or not, bytes, reason)."""
    _, setup, golden = study
    archs = {}
    for row in golden["memory"]:
        if row["chip"] not in archs:
            archs[row["chip"]] = setup.arch(_design(setup, golden, row))
        arch = archs[row["chip"]]
        check = memory_check(setup.workload, arch, row["strategy"])
        assert isinstance(check, MemoryCheck)
        assert check.feasible == row["feasible"], row["strategy"]
        assert check.need_bytes == row["memory_per_device_bytes"] or row["feasible"]
        assert check.capacity_bytes == arch.main_memory.total_capacity_B
        if not row["feasible"]:
            assert check.reason == row["reason"]
            assert check.need_bytes == row["memory_per_device_bytes"]
        else:
            assert check.reason is None and check.need_bytes <= check.capacity_bytes


def test_memory_rejected_designs_are_memory_only(study):
    """evaluate / evaluate_many reject memory-infeasible designs without pricing a kernel,
    with the same reason, memory and infeasibility as the full path gave."""
    _, setup, golden = study
    rows = golden["memory"][::5]
    evs = evaluate_many(setup, [_design(setup, golden, r) for r in rows])
    for ev, row in zip(evs, rows, strict=True):
        _check(ev, row)
        assert ev.memory_only == (not row["feasible"])


@pytest.mark.parametrize("case", PREDICT_GOLDEN, ids=lambda c: "{parallelism}:{mapping_order}"
                         .format(**c["predict"]))
def test_predict_and_predict_many_match_the_old_path(case):
    """Transformers and "best" (one order per class) included."""
    kw = case["predict"]
    p = crossflow.predict(**kw)
    (q,) = predict_many(kw["workload"], kw["hardware"], kw["system"],
                        [(kw["parallelism"], kw["mapping_order"])])
    for pred in (p, q):
        assert pred.feasible == case["feasible"] and pred.reason == case["reason"]
        assert _same_time(pred.to_dict()["time_s"], case["time_s"])
        assert pred.energy_J == pytest.approx(case["energy_J"], rel=REL)
        assert pred.memory_per_device_bytes == case["memory_per_device_bytes"]
        assert pred.details.get("mapping_order") == case["mapping_order"]
        assert pred.details.get("mapping_orders_tried") == case["mapping_orders_tried"]


def test_predict_many_shares_and_reports_bad_candidates():
    kw = PREDICT_GOLDEN[3]["predict"]
    good = (kw["parallelism"], "kp2-kp1-dp-lp")
    with pytest.raises(crossflow.ConfigError):
        predict_many(kw["workload"], kw["hardware"], kw["system"], [good, ("RC-3-1-d1-p1", None)])
    out = predict_many(kw["workload"], kw["hardware"], kw["system"],
                       [good, ("RC-3-1-d1-p1", None), good], return_exceptions=True)
    assert isinstance(out[1], crossflow.ConfigError)
    assert out[0].time_s == out[2].time_s == crossflow.predict(
        **{**kw, "mapping_order": good[1]}).time_s


@pytest.mark.parametrize("grid", [(1, 1, 1, 1), (32, 16, 1, 1), (4, 1, 8, 4), (2, 2, 2, 2),
                                  (1, 8, 1, 64)])
def test_order_classes_are_exhaustive(grid):
    classes = order_classes(grid)
    members = [m for _, ms in classes for m in ms]
    assert sorted(members) == sorted("-".join(o) for o in ORDERS)  # each order exactly once
    big = sum(n > 1 for n in grid)
    assert len(classes) == math.factorial(big)
    for rep, ms in classes:
        assert rep == ms[0]
        assert all(order_representative(grid, m) == rep for m in ms)


def test_order_classes_of_the_lstm_study():
    setup = load_study("paper-lstm-512")
    strategies = setup.space.dimension("strategy").choices
    assert sum(len(order_classes(s)) for s in strategies) == 1433  # of 163 x 24 = 3,912


@pytest.mark.parametrize("strategy", ["RC-4-4-d8-p4", "RC-16-8-d4-p1", "CR-2-d64-p4"])
def test_members_of_an_order_class_predict_the_same(strategy):
    """Every one of the 24 orders gives its representative's prediction exactly."""
    kw = {"workload": "lstm-paper-case-study", "hardware": "deepflow-case-study",
          "system": "deepflow-case-study-512"}
    classes = order_classes(strategy)
    orders = ["-".join(o) for o in ORDERS]
    preds = dict(zip(orders, predict_many(**kw, candidates=[(strategy, o) for o in orders]),
                     strict=True))
    times = set()
    for rep, members in classes:
        for m in members:
            assert preds[m].time_s == preds[rep].time_s
            assert preds[m].breakdown == preds[rep].breakdown
        times.add(preds[rep].time_s)
    assert len(classes) > 1


def test_evaluate_many_generates_each_chip_once(monkeypatch):
    from crossflow.search.study import StudySetup

    setup = load_study("paper-lstm-512")
    golden = GOLDEN["paper-lstm-512"]
    rows = golden["time"][:12]
    calls = []
    real = StudySetup.arch
    monkeypatch.setattr(StudySetup, "arch", lambda self, d: calls.append(d) or real(self, d))
    evs = evaluate_many(setup, [_design(setup, golden, r) for r in rows])
    assert len(calls) == len({r["chip"] for r in rows})
    for ev, row in zip(evs, rows, strict=True):
        _check(ev, row)


@pytest.mark.parametrize("name", ["llama3-70b-h100-cp", "qwen3-30b-a3b-h100"])
def test_the_screens_memory_verdict_is_the_predictions_on_a_software_stack(name):
    """On a system with a software stack (FlashAttention keeps no score matrix, gradients in
    the stack's precision) the memory-only verdict a search screens with is the one the
    prediction gives: every combination of the study at its start, feasible or not alike
    (without the system the check counted the attention scores, and the driver dropped
    e.g. Llama-3 70B's best strategy as 523 GB over an 80 GB device)."""
    from crossflow.search.objective import memory_verdicts
    from crossflow.search.samplers.structured._problem import Problem

    setup = load_study(name)
    P = Problem(setup)
    x0, _ = P.start()
    combos = P.combos()[::7]
    designs = [setup.design(P.params(x0, {**c, "mapping_order": P.canonical_order(c)}))
               for c in combos]
    verdicts = memory_verdicts(setup, designs)
    evaluations = evaluate_many(setup, designs)
    agree = 0
    for verdict, ev in zip(verdicts, evaluations, strict=True):
        if verdict is None or not hasattr(verdict, "need_bytes"):  # refused whatever the chip
            assert not ev.feasible
            continue
        assert verdict.feasible == (ev.feasible or not ev.memory_only), ev.reason
        if ev.prediction is not None and ev.prediction.memory_per_device_bytes:
            assert verdict.need_bytes == pytest.approx(ev.prediction.memory_per_device_bytes)
        agree += 1
    assert agree > 50


def test_fitting_drops_what_memory_refuses_and_keeps_all_when_it_refuses_everything():
    """One rule for the driver's screen and the best-known search: a combination without a
    verdict (its chip cannot be built) stays; when every one is refused, all stay, so the
    search prices them and each infeasible result says why."""
    from types import SimpleNamespace

    from crossflow.search.objective import fitting

    fits, over = SimpleNamespace(feasible=True), SimpleNamespace(feasible=False)
    kept, refused = fitting(["a", "b", "c"], [fits, over, None])
    assert kept == ["a", "c"] and refused == [("b", over)]
    kept, refused = fitting(["a", "b"], [over, over])
    assert kept == ["a", "b"] and [item for item, _ in refused] == ["a", "b"]
