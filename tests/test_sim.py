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


# --- the host as a resource (software-stack layer) ----------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    p=st.integers(1, 5),
    groups=st.integers(1, 3),
    v=st.integers(1, 2),
    schedule=st.sampled_from(["1f1b", "gpipe"]),
    p2p=st.floats(0, 0.5),
    sync=st.booleans(),
    launch=st.floats(0, 0.3),
    data=st.data(),
)
def test_fast_pipeline_with_a_host_equals_the_event_simulator(p, groups, v, schedule, p2p,
                                                              sync, launch, data):
    from crossflow.sim.pipeline import Host

    if v > 1 and schedule == "1f1b":
        schedule = "interleaved"
    m = groups * p
    times = st.lists(st.floats(0.1, 3.0), min_size=p * v, max_size=p * v)
    kernels = st.lists(st.integers(1, 50), min_size=p * v, max_size=p * v)
    fwd, bwd = data.draw(times), data.draw(times)
    host = Host.uniform(data.draw(times), data.draw(times), data.draw(kernels),
                        data.draw(kernels), fwd, bwd, launch, sync)
    kw = dict(stages=p, microbatches=m, fwd_s=fwd, bwd_s=bwd,
              p2p_s=p2p, schedule=schedule, virtual_stages=v, host=host)
    fast, full = simulate_pipeline(**kw), simulate_pipeline(**kw, keep_schedule=True)
    assert fast.makespan_s == pytest.approx(full.makespan_s, rel=1e-12)
    # the host can only delay the device
    kw.pop("host")
    assert fast.makespan_s >= simulate_pipeline(**kw).makespan_s - 1e-12


def test_a_host_bound_pass_ends_one_kernel_after_the_host():
    """One stage, one micro-batch, 10 kernels: the host needs 10 s to issue what the device
    runs in 1 s, so the device finishes launch + one kernel (0.1 s) after the host."""
    from crossflow.sim.pipeline import Host

    host = Host.uniform([10.0], [10.0], [10], [10], [1.0], [1.0], launch_s=0.5, sync=False)
    r = simulate_pipeline(stages=1, microbatches=1, fwd_s=[1.0], bwd_s=[1.0], host=host)
    assert r.makespan_s == pytest.approx(20.0 + 0.5 + 0.1)
    # device-bound: the host issues 10 kernels in 0.1 s; the device starts after the first
    # (0.01 s + launch) and runs its 2 s of work back to back
    fast_host = Host.uniform([0.1], [0.1], [10], [10], [1.0], [1.0], launch_s=0.5,
                             sync=False)
    r = simulate_pipeline(stages=1, microbatches=1, fwd_s=[1.0], bwd_s=[1.0], host=fast_host)
    assert r.makespan_s == pytest.approx(0.01 + 0.5 + 2.0)


def test_a_host_that_syncs_every_pass_cannot_run_ahead():
    from crossflow.sim.pipeline import Host

    kw = dict(stages=2, microbatches=4, fwd_s=[1.0, 1.0], bwd_s=[2.0, 2.0])
    ahead = Host.uniform([0.9] * 2, [1.8] * 2, [20] * 2, [20] * 2, [1.0] * 2, [2.0] * 2,
                         launch_s=0.0, sync=False)
    synced = Host.uniform([0.9] * 2, [1.8] * 2, [20] * 2, [20] * 2, [1.0] * 2, [2.0] * 2,
                          launch_s=0.0, sync=True)
    free = simulate_pipeline(**kw).makespan_s
    assert simulate_pipeline(**kw, host=ahead).makespan_s < simulate_pipeline(
        **kw, host=synced).makespan_s
    assert simulate_pipeline(**kw, host=ahead).makespan_s >= free


def test_span_is_the_longest_path_through_host_and_device():
    from crossflow.sim.pipeline import chain, repeat, span

    # one big kernel between two tiny ones: the device waits for the first, the host's
    # last issue comes long before the device is done
    assert span([(1.0, 0.1), (1.0, 10.0), (1.0, 0.1)]) == pytest.approx(1 + 1 + 10 + 0.1)
    # tiny kernels after the big one: their issue time is exposed
    assert span([(1.0, 10.0), (1.0, 0.1), (1.0, 0.1)]) == pytest.approx(1 + 10.2)
    ks = [(0.5, 0.2), (0.1, 3.0), (0.7, 0.1)]
    one = (sum(h for h, _ in ks), sum(d for _, d in ks), span(ks))
    assert chain([one] * 4) == pytest.approx((4 * one[0], 4 * one[1], span(ks * 4)))
    assert repeat(one, 4) == pytest.approx(chain([one] * 4))


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("interleaved", 2), ("gpipe", 2)])
def test_a_kept_plan_prices_other_times_as_the_event_simulator_does(schedule, v):
    """The flush's pass order is worked out once per (schedule, p, v, m) and kept; a later
    call with other times (and a host) takes it and still ends where the event simulator
    does."""
    import random

    from crossflow.sim import pipeline
    from crossflow.sim.pipeline import Host

    p, m = 4, 8
    pipeline._PLANS.plans.clear()
    rng = random.Random(7)
    for call in range(3):
        fwd = [rng.uniform(0.1, 3.0) for _ in range(p * v)]
        bwd = [rng.uniform(0.1, 3.0) for _ in range(p * v)]
        host = None if call == 0 else Host.uniform(
            [rng.uniform(0.1, 3.0) for _ in range(p * v)], [rng.uniform(0.1, 3.0)] * (p * v),
            [5] * (p * v), [9] * (p * v), fwd, bwd, 0.2, call == 2)
        kw = dict(stages=p, microbatches=m, fwd_s=fwd, bwd_s=bwd, p2p_s=0.1,
                  schedule=schedule, virtual_stages=v, host=host)
        fast, full = simulate_pipeline(**kw), simulate_pipeline(**kw, keep_schedule=True)
        assert fast.makespan_s == pytest.approx(full.makespan_s, rel=1e-12)
        assert list(pipeline._PLANS.plans) == [(schedule, p, v, m)]


def test_the_kept_plans_hold_at_most_their_passes_dropping_the_least_recent():
    from crossflow.sim import pipeline

    plans = pipeline._Plans()
    plans.PASSES = 100
    for key, n in ((1, 40), (2, 40), (3, 40)):
        plans.keep(key, ((0,),) * n)
    assert list(plans.plans) == [2, 3] and plans.passes == 80
    assert plans.get(2) is not None  # used: now the most recent
    plans.keep(4, ((0,),) * 40)
    assert list(plans.plans) == [2, 4] and plans.passes == 80
    plans.keep(5, ((0,),) * 101)  # larger than all it may keep: not kept
    assert 5 not in plans.plans
