"""Pipeline schedules as task orders for the event simulator (paper §6.5).

A pipeline of ``p`` devices runs ``m`` micro-batches through ``p·v`` model chunks (``v``
virtual stages per device when interleaved).  Each schedule is the order in which every
device runs its forward and backward passes:

* ``gpipe``: all forwards, then all backwards (Huang et al. 2019);
* ``1f1b``: ``p − s − 1`` warm-up forwards on device ``s``, then alternate one forward and
  one backward, then drain (PipeDream-Flush; Narayanan et al. SC21 §2.2.1);
* ``interleaved``: 1F1B over ``v`` chunks per device, micro-batches in groups of ``p``
  (Narayanan et al. SC21 §2.2.2; the order Megatron-LM's ``forward_backward_pipelining_with_
  interleaving`` uses).

The stage boundary transfer is a lag on the dependency (``p2p_s``), so it overlaps with
whatever else the devices do, as Megatron's asynchronous send/recv does.

**The host** (the software-stack layer, docs/software-stack.md) is a resource of its own on
each device: a pass is a host task that issues its kernels and a device task that runs them.
The host runs ahead of the device asynchronously: kernel ``j`` (host time ``h_j``, device time
``d_j``) starts no earlier than ``launch`` after the host issued it, so a pass whose host task
starts at ``a`` ends on the device at ``max(device free + D, a + launch + span)`` with
``span = max_j (h_1 + … + h_j + d_j + … + d_n)`` — the longest path through the two
streams (:func:`span`).  As a dependency of the device task on the host task (which lasts
``H = Σh``) this is a lag of ``launch + span − H − D`` after the host task ends.  Where the
framework synchronises at every pipeline send/recv (``sync``, Megatron after
``batch_isend_irecv``), a pass's host task also waits for the device to finish the pass
before it on that device and for its input to arrive; otherwise the host runs ahead across
passes too.  The iteration is bounded by whichever stream is the critical path.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from crossflow.errors import ConfigError
from crossflow.sim.engine import After, Schedule, Task, simulate

SCHEDULES = ("gpipe", "1f1b", "interleaved")

#: The most passes (micro-batches × model chunks × forward and backward) one pipeline
#: simulation runs: 1e6 passes take ~1.6 s and ~250 MB; a real iteration has at most a few
#: ten thousand (hundreds of micro-batches over at most a few hundred chunks).
MAX_PASSES = 1_000_000


def passes(p: int, v: int, m: int) -> int:
    """Forward and backward passes of ``m`` micro-batches over ``p·v`` chunks."""
    return 2 * m * p * v


def span(kernels: Sequence[tuple[float, float]]) -> float:
    """``max_j (h_1 + … + h_j + d_j + … + d_n)`` over ``kernels`` = ``[(h, d), …]``: from the
    host starting to issue them to the device finishing them, without launch latency."""
    host = sum(h for h, _ in kernels)
    best, issued, remaining = 0.0, 0.0, sum(d for _, d in kernels)
    for h, d in kernels:
        issued += h
        best = max(best, issued + remaining)
        remaining -= d
    return best if kernels else host


def chain(segments: Sequence[tuple[float, float, float]]) -> tuple[float, float, float]:
    """``(H, D, span)`` of segments issued one after another, each ``(H, D, span)``."""
    total_h = sum(h for h, _, _ in segments)
    total_d = sum(d for _, d, _ in segments)
    best, before_h, after_d = 0.0, 0.0, total_d
    for h, d, sp in segments:
        after_d -= d
        best = max(best, before_h + sp + after_d)
        before_h += h
    return total_h, total_d, best


def repeat(segment: tuple[float, float, float], times: int) -> tuple[float, float, float]:
    """``(H, D, span)`` of ``times`` identical segments in a row (closed form of
    :func:`chain`: the longest path crosses from host to device in one of them)."""
    h, d, sp = segment
    if times <= 0:
        return 0.0, 0.0, 0.0
    return times * h, times * d, sp + (times - 1) * max(h, d)


@dataclass(frozen=True)
class Host:
    """The host side of each pass (see the module docstring).

    Attributes:
        fwd_s, bwd_s: host time to issue one micro-batch's forward / backward pass of each
            global chunk (length ``p·v``).
        fwd_span_s, bwd_span_s: the pass's :func:`span` (its device time included).
        launch_s: from issuing a kernel until the device can start it.
        sync: the host waits for the device at every pass boundary.
    """

    fwd_s: Sequence[float]
    bwd_s: Sequence[float]
    fwd_span_s: Sequence[float]
    bwd_span_s: Sequence[float]
    launch_s: float = 0.0
    sync: bool = True

    @classmethod
    def uniform(cls, fwd_s, bwd_s, fwd_kernels, bwd_kernels, device_fwd_s, device_bwd_s,
                launch_s: float = 0.0, sync: bool = True) -> Host:
        """Passes of ``k`` alike kernels each: span = ``max(h + D, H + d)``."""
        def spans(host, kernels, device):
            return [max(h / k + d, h + d / k) for h, k, d in zip(host, kernels, device,
                                                                strict=True)]
        return cls(fwd_s, bwd_s, spans(fwd_s, fwd_kernels, device_fwd_s),
                   spans(bwd_s, bwd_kernels, device_bwd_s), launch_s, sync)

    def lag(self, phase: int, g: int, device_s: float) -> float:
        """Lag of the device task after its host task ends."""
        if phase == 0:
            return self.launch_s + self.fwd_span_s[g] - self.fwd_s[g] - device_s
        return self.launch_s + self.bwd_span_s[g] - self.bwd_s[g] - device_s


@dataclass(frozen=True)
class PipelineResult:
    """Makespan of one pipeline flush and how it splits."""

    makespan_s: float
    busy_s: float  # the busiest device's forward + backward time
    schedule: Schedule | None = None  # every task's start and end, when asked for

    @property
    def bubble_s(self) -> float:
        # the makespan and the busy time are sums in different orders: a difference within
        # their rounding (a pipeline of one stage has none) is no bubble
        gap = self.makespan_s - self.busy_s
        return gap if gap > 1e-12 * self.makespan_s else 0.0


def _device_order(schedule: str, p: int, v: int, m: int, s: int) -> list[tuple[int, int, int]]:
    """(phase, micro-batch, chunk) in the order device ``s`` runs them; phase 0 = F, 1 = B."""
    if schedule == "gpipe":
        return [(0, i, c) for c in range(v) for i in range(m)] + [
            (1, i, c) for c in reversed(range(v)) for i in range(m)
        ]

    def fwd(k: int) -> tuple[int, int, int]:
        return (0, (k // (p * v)) * p + k % p, (k // p) % v)

    def bwd(k: int) -> tuple[int, int, int]:
        return (1, (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    total = m * v
    # Warm-up forwards: Megatron-LM's num_warmup_microbatches for each schedule.
    warmup = min(p - s - 1, m) if v == 1 else min((p - s - 1) * 2 + (v - 1) * p, total)
    order = [fwd(k) for k in range(warmup)]
    for k in range(total - warmup):
        order.append(fwd(warmup + k))
        order.append(bwd(k))
    order += [bwd(k) for k in range(total - warmup, total)]
    return order


def _check(schedule: str, p: int, v: int, m: int, fwd_s, bwd_s) -> None:
    if schedule not in SCHEDULES:
        raise ConfigError("unknown pipeline schedule", key="schedule", value=schedule,
                          allowed=", ".join(SCHEDULES))
    if v > 1 and schedule != "gpipe" and m % p:
        raise ConfigError(
            f"the interleaved schedule needs the micro-batches per pipeline ({m}) to be a "
            f"multiple of the pipeline stages ({p})", key="virtual_pipeline_stages", value=v,
        )
    if len(fwd_s) != p * v or len(bwd_s) != p * v:
        raise ValueError(f"fwd_s and bwd_s need p*v = {p * v} entries")
    if passes(p, v, m) > MAX_PASSES:
        raise ConfigError(f"the pipeline would simulate {passes(p, v, m):,} passes ({m:,} "
                          f"micro-batches × {p * v} chunks × forward and backward), more "
                          f"than one prediction runs ({MAX_PASSES:,})", key="microbatches",
                          value=m, allowed=f"at most {MAX_PASSES // (2 * p * v):,} "
                          f"micro-batches per pipeline")


def pipeline_tasks(*, stages: int, microbatches: int, fwd_s: Sequence[float],
                   bwd_s: Sequence[float], p2p_s: float = 0.0, schedule: str = "1f1b",
                   virtual_stages: int = 1, host: Host | None = None) -> list[Task]:
    """The pipeline flush as tasks for :func:`crossflow.sim.engine.simulate`: device ``s``
    is resource ``s``; with ``host``, its host is resource ``("host", s)``."""
    p, m, v = stages, microbatches, virtual_stages
    _check(schedule, p, v, m, fwd_s, bwd_s)
    last = p * v - 1
    tasks = []
    for s in range(p):
        previous = None
        for phase, i, c in _device_order(schedule, p, v, m, s):
            g = c * p + s
            name = ("F" if phase == 0 else "B", i, g)
            if phase == 0:
                deps = (After(("F", i, g - 1), p2p_s),) if g > 0 else ()
                device_s, kind = fwd_s[g], "forward"
            else:
                deps = (("F", i, g),) + ((After(("B", i, g + 1), p2p_s),) if g < last else ())
                device_s, kind = bwd_s[g], "backward"
            if host is not None:
                issue = ("H",) + name
                host_deps = deps + ((previous,) if previous and host.sync else ())
                host_deps = host_deps if host.sync else ()
                tasks.append(Task(issue, ("host", s),
                                  (host.fwd_s if phase == 0 else host.bwd_s)[g], host_deps,
                                  kind="host"))
                deps = deps + (After(issue, host.lag(phase, g, device_s)),)
            tasks.append(Task(name, s, device_s, deps, kind=kind))
            previous = name
    return tasks


def simulate_pipeline(
    *,
    stages: int,
    microbatches: int,
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    p2p_s: float = 0.0,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    keep_schedule: bool = False,
    host: Host | None = None,
) -> PipelineResult:
    """Simulate one iteration's pipeline flush.

    Args:
        stages: devices in the pipeline (``p``).
        microbatches: micro-batches per iteration per pipeline (``m``).
        fwd_s, bwd_s: forward / backward time of one micro-batch on each model chunk, indexed
            by global chunk ``g = chunk · p + device`` (length ``p · v``).
        p2p_s: activation (or gradient) transfer time across a chunk boundary.
        schedule: ``gpipe``, ``1f1b`` or ``interleaved`` (``virtual_stages`` > 1).
        virtual_stages: model chunks per device (``v``).
        keep_schedule: run the generic event simulator and keep every task's times (slower);
            otherwise the same rules run on plain arrays (tests check they agree).
        host: the host side of each pass (None: a host that is never on the critical path).
    """
    p, m, v = stages, microbatches, virtual_stages
    if keep_schedule:
        tasks = pipeline_tasks(stages=p, microbatches=m, fwd_s=fwd_s, bwd_s=bwd_s, p2p_s=p2p_s,
                               schedule=schedule, virtual_stages=v, host=host)
        result = simulate(tasks)
        return PipelineResult(result.makespan_s, max(result.busy_s(s) for s in range(p)), result)
    _check(schedule, p, v, m, fwd_s, bwd_s)
    return _fast(schedule, p, v, m, fwd_s, bwd_s, p2p_s, host)


class _Plans:
    """The plans :func:`_plan` keeps, most recently used last: a search prices the same
    (schedule, p, v, m) again and again, among a few hundred in a whole Megatron space
    (GPT-3 175B on 1536 GPUs: ~300), so up to :attr:`PASSES` passes are kept (~180 bytes
    each, ~50 MB at most), the least recently used dropped first."""

    PASSES = 262_144

    def __init__(self) -> None:
        self.plans: OrderedDict[tuple, tuple[tuple[int, ...], ...]] = OrderedDict()
        self.passes = 0
        self._lock = threading.Lock()  # predictions may run in threads of one process

    def get(self, key: tuple) -> tuple[tuple[int, ...], ...] | None:
        with self._lock:
            plan = self.plans.get(key)
            if plan is not None:
                self.plans.move_to_end(key)
            return plan

    def keep(self, key: tuple, plan: tuple[tuple[int, ...], ...]) -> None:
        with self._lock:
            if len(plan) > self.PASSES or key in self.plans:
                return
            self.plans[key] = plan
            self.passes += len(plan)
            while self.passes > self.PASSES:
                self.passes -= len(self.plans.popitem(last=False)[1])


_PLANS = _Plans()


def _plan(schedule: str, p: int, v: int, m: int) -> tuple[tuple[int, ...], ...]:
    """Every pass of the flush in an order that puts each after what it waits for — its
    device's pass before it, its input's pass on the neighbouring chunk, a backward's own
    forward — as (device, first on its device, phase, chunk, id, input's id or -1, own
    forward's id or -1), ids indexing :func:`_fast`'s flat list of pass ends.  The order
    depends on the schedule alone, not on any time, so it is worked out once and kept
    (:data:`_PLANS`)."""
    key = (schedule, p, v, m)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan_of(schedule, p, v, m)
        _PLANS.keep(key, plan)
    return plan


def _plan_of(schedule: str, p: int, v: int, m: int) -> tuple[tuple[int, ...], ...]:
    chunks = p * v
    last, back = chunks - 1, m * chunks
    orders = [[(ph, c * p + s, (ph * m + i) * chunks + c * p + s)
               for ph, i, c in _device_order(schedule, p, v, m, s)] for s in range(p)]
    lengths = [len(order) for order in orders]
    done = [False] * (2 * back)
    position = [0] * p
    plan = []
    add = plan.append
    wrap = (0, p - 1) if v > 1 else ()  # chunk boundaries wrap from the last device to the first
    work = list(range(p))
    while work:
        s = work.pop()
        order, k, n = orders[s], position[s], lengths[s]
        start = k
        while k < n:
            ph, g, op = order[k]
            if ph == 0:
                dep = op - 1 if g > 0 else -1
                own = -1
            else:
                dep = op + 1 if g < last else -1
                own = op - back
            if dep >= 0 and not done[dep]:
                break
            add((s, k == 0, ph, g, op, dep, own))
            done[op] = True
            k += 1
        position[s] = k
        if k > start:  # neighbours may have been waiting on this device
            for other in (s - 1, s + 1, *wrap):
                if 0 <= other < p and position[other] < lengths[other]:
                    work.append(other)
    if position != lengths:
        raise ValueError("the pipeline order deadlocks")
    return tuple(plan)


def _fast(schedule: str, p: int, v: int, m: int, fwd_s: Sequence[float],
          bwd_s: Sequence[float], p2p_s: float, host: Host | None = None) -> PipelineResult:
    """The event simulator's rules specialised to a pipeline: one pass over the flush in
    :func:`_plan`'s order, integer ids, flat lists (``max`` as comparisons, the host's lags
    per chunk worked out first: this is most of a warm transformer prediction)."""
    chunks = p * v
    end = [0.0] * (2 * m * chunks)  # id = (phase * m + i) * chunks + g
    free = [0.0] * p
    host_free = [0.0] * p
    if host is not None:
        # each pass's lag depends on its phase and chunk only: once per chunk, not per pass
        lags = tuple([host.lag(ph, g, times[g]) for g in range(chunks)]
                     for ph, times in enumerate((fwd_s, bwd_s)))
        issue = (host.fwd_s, host.bwd_s)
        sync = host.sync
    times = (fwd_s, bwd_s)
    for s, first, ph, g, op, dep, own in _plan(schedule, p, v, m):
        t = free[s]
        ready = end[dep] + p2p_s if dep >= 0 else 0.0  # when the pass's inputs have arrived
        if ph and end[own] > ready:  # a backward waits for its own forward too
            ready = end[own]
        start = t if t >= ready else ready
        if host is not None:
            h = host_free[s]
            if sync:
                if ready > h:
                    h = ready
                if not first and t > h:
                    h = t
            h += issue[ph][g]
            host_free[s] = h
            after = h + lags[ph][g]
            if after > start:
                start = after
        t = start + times[ph][g]
        end[op] = free[s] = t
    busy = max(
        sum((fwd_s[c * p + s] + bwd_s[c * p + s]) * m for c in range(v)) for s in range(p)
    )
    return PipelineResult(max(free), busy)
