"""Event simulator and pipeline schedules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossflow.errors import ConfigError
from crossflow.sim.engine import After, Task, simulate
from crossflow.sim.pipeline import simulate_pipeline


def test_resource_runs_one_task_at_a_time_in_order():
    s = simulate([Task("a", "gpu", 2.0), Task("b", "gpu", 1.0), Task("c", "link", 5.0)])
    assert (s.tasks["a"].start_s, s.tasks["b"].start_s) == (0.0, 2.0)
    assert s.makespan_s == 5.0


def test_dependencies_and_lags():
    s = simulate([
        Task("f0", 0, 1.0),
        Task("f1", 1, 1.0, deps=(After("f0", 0.25),)),
        Task("b1", 1, 2.0, deps=("f1",)),
        Task("b0", 0, 2.0, deps=(After("b1", 0.25),)),
    ])
    assert s.tasks["f1"].start_s == pytest.approx(1.25)
    assert s.tasks["b0"].start_s == pytest.approx(1.25 + 1 + 2 + 0.25)
    assert s.makespan_s == pytest.approx(6.5)


def test_cycle_is_reported():
    with pytest.raises(ValueError, match="deadlock"):
        simulate([Task("a", 0, 1.0, deps=("b",)), Task("b", 1, 1.0, deps=("a",))])


def test_unknown_dependency_is_reported():
    with pytest.raises(ValueError, match="unknown task"):
        simulate([Task("a", 0, 1.0, deps=("zz",))])


def test_1f1b_bubble_matches_the_hand_computation():
    # p = 4 stages, m = 8 micro-batches, forward 1 s and backward 2 s per stage, no transfer.
    # Every device works m·(f+b) = 24 s; the first forward reaches the last stage after
    # (p-1)·f and the last backward leaves the first stage (p-1)·b after the last stage's, so
    # the flush takes (m + p - 1)·(f + b) = 33 s and the bubble is (p-1)·(f+b) = 9 s.
    r = simulate_pipeline(stages=4, microbatches=8, fwd_s=[1] * 4, bwd_s=[2] * 4)
    assert r.makespan_s == pytest.approx(33.0)
    assert r.bubble_s == pytest.approx(9.0)


def test_p2p_transfers_lengthen_the_fill_and_drain():
    r = simulate_pipeline(stages=4, microbatches=8, fwd_s=[1] * 4, bwd_s=[2] * 4, p2p_s=0.1)
    # At least the 3 forward and 3 backward crossings of the fill and drain; in the steady
    # state a stage also waits for its neighbour's transfer whenever 1F1B alternates.
    assert r.makespan_s >= 33.0 + 6 * 0.1
    assert r.makespan_s < 33.0 + 2 * 8 * 0.1 + 1e-9


def test_interleaving_divides_the_bubble_by_v():
    # v = 2 chunks of half the work each: bubble (p-1)·(f+b)/v (SC21 §2.2.2).
    r = simulate_pipeline(stages=4, microbatches=8, fwd_s=[0.5] * 8, bwd_s=[1.0] * 8,
                          schedule="interleaved", virtual_stages=2)
    assert r.makespan_s == pytest.approx(24.0 + 3 * 1.5)
    assert r.bubble_s == pytest.approx(4.5)


def test_gpipe_has_the_same_flush_time_as_1f1b_for_uniform_stages():
    a = simulate_pipeline(stages=4, microbatches=8, fwd_s=[1] * 4, bwd_s=[2] * 4,
                          schedule="gpipe")
    assert a.makespan_s == pytest.approx(33.0)


def test_interleaving_needs_whole_groups_of_microbatches():
    with pytest.raises(ConfigError, match="multiple of the pipeline stages"):
        simulate_pipeline(stages=4, microbatches=6, fwd_s=[1] * 8, bwd_s=[1] * 8,
                          schedule="interleaved", virtual_stages=2)


def test_single_stage_is_just_the_sum():
    r = simulate_pipeline(stages=1, microbatches=5, fwd_s=[1.0], bwd_s=[2.0])
    assert r.makespan_s == pytest.approx(15.0) and r.bubble_s == pytest.approx(0.0)


@settings(max_examples=60, deadline=None)
@given(
    p=st.integers(1, 6),
    groups=st.integers(1, 4),
    v=st.integers(1, 3),
    schedule=st.sampled_from(["1f1b", "gpipe"]),
    p2p=st.floats(0, 0.5),
    data=st.data(),
)
def test_fast_pipeline_path_equals_the_event_simulator(p, groups, v, schedule, p2p, data):
    if v > 1 and schedule == "1f1b":
        schedule = "interleaved"
    m = groups * p
    times = st.lists(st.floats(0.1, 3.0), min_size=p * v, max_size=p * v)
    fwd, bwd = data.draw(times), data.draw(times)
    kw = dict(stages=p, microbatches=m, fwd_s=fwd, bwd_s=bwd, p2p_s=p2p, schedule=schedule,
              virtual_stages=v)
    fast, full = simulate_pipeline(**kw), simulate_pipeline(**kw, keep_schedule=True)
    assert fast.makespan_s == pytest.approx(full.makespan_s, rel=1e-12)
    assert fast.busy_s == pytest.approx(full.busy_s, rel=1e-12)
    assert fast.makespan_s >= fast.busy_s - 1e-9


@settings(max_examples=30, deadline=None)
@given(p=st.integers(2, 6), m=st.integers(1, 12), extra=st.floats(0.0, 2.0))
def test_slower_stage_never_shortens_the_flush(p, m, extra):
    base = simulate_pipeline(stages=p, microbatches=m, fwd_s=[1.0] * p, bwd_s=[2.0] * p)
    slow = [1.0] * p
    slow[p // 2] += extra
    assert simulate_pipeline(stages=p, microbatches=m, fwd_s=slow,
                             bwd_s=[2.0] * p).makespan_s >= base.makespan_s - 1e-12
