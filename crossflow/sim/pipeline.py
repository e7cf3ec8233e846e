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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from crossflow.errors import ConfigError
from crossflow.sim.engine import After, Schedule, Task, simulate

SCHEDULES = ("gpipe", "1f1b", "interleaved")


@dataclass(frozen=True)
class PipelineResult:
    """Makespan of one pipeline flush and how it splits."""

    makespan_s: float
    busy_s: float  # the busiest device's forward + backward time
    schedule: Schedule | None = None  # every task's start and end, when asked for

    @property
    def bubble_s(self) -> float:
        return self.makespan_s - self.busy_s


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


def pipeline_tasks(*, stages: int, microbatches: int, fwd_s: Sequence[float],
                   bwd_s: Sequence[float], p2p_s: float = 0.0, schedule: str = "1f1b",
                   virtual_stages: int = 1) -> list[Task]:
    """The pipeline flush as tasks for :func:`crossflow.sim.engine.simulate`."""
    p, m, v = stages, microbatches, virtual_stages
    _check(schedule, p, v, m, fwd_s, bwd_s)
    last = p * v - 1
    tasks = []
    for s in range(p):
        for phase, i, c in _device_order(schedule, p, v, m, s):
            g = c * p + s
            if phase == 0:
                deps = (After(("F", i, g - 1), p2p_s),) if g > 0 else ()
                tasks.append(Task(("F", i, g), s, fwd_s[g], deps, kind="forward"))
            else:
                deps = (("F", i, g),) + ((After(("B", i, g + 1), p2p_s),) if g < last else ())
                tasks.append(Task(("B", i, g), s, bwd_s[g], deps, kind="backward"))
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
    """
    p, m, v = stages, microbatches, virtual_stages
    if keep_schedule:
        tasks = pipeline_tasks(stages=p, microbatches=m, fwd_s=fwd_s, bwd_s=bwd_s, p2p_s=p2p_s,
                               schedule=schedule, virtual_stages=v)
        result = simulate(tasks)
        return PipelineResult(result.makespan_s, max(result.busy_s(s) for s in range(p)), result)
    _check(schedule, p, v, m, fwd_s, bwd_s)
    return _fast(schedule, p, v, m, fwd_s, bwd_s, p2p_s)


def _fast(schedule: str, p: int, v: int, m: int, fwd_s: Sequence[float],
          bwd_s: Sequence[float], p2p_s: float) -> PipelineResult:
    """The event simulator's rules specialised to a pipeline: integer ids, flat lists."""
    chunks = p * v
    last = chunks - 1
    end = [-1.0] * (2 * m * chunks)  # id = (phase * m + i) * chunks + g
    orders = [
        [(ph, i, c * p + s, (ph * m + i) * chunks + c * p + s)
         for ph, i, c in _device_order(schedule, p, v, m, s)]
        for s in range(p)
    ]
    position = [0] * p
    free = [0.0] * p
    work = list(range(p))
    while work:
        s = work.pop()
        order, k, t = orders[s], position[s], free[s]
        progressed = False
        while k < len(order):
            ph, i, g, op = order[k]
            if ph == 0:
                if g > 0:
                    dep = end[op - 1]
                    if dep < 0:
                        break
                    t = max(t, dep + p2p_s)
                t += fwd_s[g]
            else:
                if g < last:
                    dep = end[op + 1]
                    if dep < 0:
                        break
                    t = max(t, dep + p2p_s)
                t = max(t, end[op - m * chunks])  # its own forward (earlier on this device)
                t += bwd_s[g]
            end[op] = t
            k += 1
            progressed = True
        position[s], free[s] = k, t
        if progressed:  # neighbours may have been waiting on this device
            if s > 0 and position[s - 1] < len(orders[s - 1]):
                work.append(s - 1)
            if s < p - 1 and position[s + 1] < len(orders[s + 1]):
                work.append(s + 1)
            if v > 1:  # chunk boundaries wrap from the last device to the first
                for other in (0, p - 1):
                    if position[other] < len(orders[other]):
                        work.append(other)
    if min(position[s] - len(orders[s]) for s in range(p)) < 0:
        raise ValueError("the pipeline order deadlocks")
    busy = max(
        sum((fwd_s[c * p + s] + bwd_s[c * p + s]) * m for c in range(v)) for s in range(p)
    )
    return PipelineResult(max(free), busy)
