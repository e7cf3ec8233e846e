"""A small event-driven, resource-constrained scheduler (paper §6.5).

Tasks have a duration, a resource (a pipeline stage's device, a link) and dependencies.
A resource runs one task at a time, in the order tasks were submitted to it (a pipeline
schedule such as 1F1B is exactly such an order); a task starts when its resource is free and
its dependencies' results have arrived.  This is the paper's resource-constrained
critical-path analysis ("event-driven simulation").
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class After:
    """A dependency on task ``name`` whose result arrives ``lag_s`` after it ends."""

    name: Hashable
    lag_s: float


@dataclass(slots=True)
class Task:
    """One unit of work: ``duration_s`` on ``resource`` after ``deps`` have finished.

    ``deps`` holds task names, or :class:`After` for a dependency whose result arrives some
    time after that task ends (a transfer that does not occupy the resource).
    """

    name: Hashable
    resource: Hashable
    duration_s: float
    deps: tuple[Hashable, ...] = ()
    kind: str = "compute"
    start_s: float = field(default=-1.0)
    end_s: float = field(default=-1.0)


@dataclass(frozen=True, slots=True)
class Schedule:
    """The outcome: every task with its start and end, and the makespan."""

    tasks: dict[Hashable, Task]
    makespan_s: float

    def busy_s(self, resource: Hashable) -> float:
        return sum(t.duration_s for t in self.tasks.values() if t.resource == resource)


def simulate(tasks: Iterable[Task]) -> Schedule:
    """Run ``tasks`` (each resource in submission order) and return the schedule.

    Because every resource runs its tasks in a fixed order, the event-driven schedule is
    fixed by two rules: a task starts when its resource has finished the previous task and
    its dependencies' results have arrived.  The loop below applies them in dependency
    order (a worklist instead of a time-ordered heap, same schedule, less overhead).

    Raises:
        ValueError: a dependency names no task, or the order deadlocks (a cycle).
    """
    table: dict[Hashable, Task] = {}
    queues: dict[Hashable, list[Task]] = {}
    for task in tasks:
        if task.name in table:
            raise ValueError(f"task {task.name!r} is submitted twice")
        table[task.name] = task
        queues.setdefault(task.resource, []).append(task)
    deps: dict[Hashable, list[tuple[Hashable, float]]] = {}
    for task in table.values():
        pairs = []
        for dep in task.deps:
            name, lag = (dep.name, dep.lag_s) if isinstance(dep, After) else (dep, 0.0)
            if name not in table:
                raise ValueError(f"task {task.name!r} depends on unknown task {name!r}")
            pairs.append((name, lag))
        deps[task.name] = pairs

    end: dict[Hashable, float] = {}
    position = dict.fromkeys(queues, 0)
    free_at = dict.fromkeys(queues, 0.0)
    waiters: dict[Hashable, list[Hashable]] = {}
    work = list(queues)
    while work:
        resource = work.pop()
        queue, i = queues[resource], position[resource]
        while i < len(queue):
            task = queue[i]
            ready = free_at[resource]
            blocked = None
            for name, lag in deps[task.name]:
                done = end.get(name)
                if done is None:
                    blocked = name
                    break
                ready = max(ready, done + lag)
            if blocked is not None:
                waiters.setdefault(blocked, []).append(resource)
                break
            task.start_s = ready
            task.end_s = end[task.name] = ready + task.duration_s
            free_at[resource] = task.end_s
            i += 1
            work.extend(waiters.pop(task.name, ()))
        position[resource] = i
    if len(end) != len(table):
        stuck = [t.name for t in table.values() if t.name not in end][:5]
        raise ValueError(f"the task order deadlocks (a dependency cycle); stuck: {stuck}")
    return Schedule(table, max(end.values(), default=0.0))
