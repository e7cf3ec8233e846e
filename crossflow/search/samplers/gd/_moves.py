"""The dimensions outside the simplexes: random starts and neighbour moves.

Categoricals, integers and floats that are not simplex coordinates have no gradient the
paper's eq. 6 could use.  A chain holds them fixed while it probes the simplexes and, once
per step, proposes one neighbour move per dimension (evaluated as a trial like any probe);
the best move that lowers the loss is kept.  The neighbourhood is the order the search
space lists (strategies by degree, mapping orders in their listed order, technology nodes
by size): the next or previous choice, in the direction that last helped, and for
categoricals of more than three choices a random other choice every third step, because
list order need not mean closeness (the 24 mapping orders).  Ordered numbers move one
point of a grid of about 20 points over their range (their own grid when it is coarser;
geometric for ``log=True``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from crossflow.search.trials import contains

#: Ordered numbers move over about this many grid points across their range.
GRID_POINTS = 20
#: A categorical of more than this many choices jumps to a random other choice every
#: third step instead of moving to a list neighbour.
_JUMP_ABOVE = 3


def as_external(distribution: BaseDistribution, value: Any) -> Any:
    """``value`` with the Python type Optuna expects (a JSON round trip may turn 2.0 into 2)."""
    if isinstance(distribution, IntDistribution):
        return int(round(value))
    if isinstance(distribution, FloatDistribution):
        return float(value)
    if isinstance(distribution, CategoricalDistribution):
        return distribution.choices[int(distribution.to_internal_repr(value))]
    return value


def draw(distribution: BaseDistribution, rng: np.random.Generator) -> Any:
    """A uniform random value (uniform in log space for ``log=True``): a random start."""
    if isinstance(distribution, CategoricalDistribution):
        return distribution.choices[int(rng.integers(len(distribution.choices)))]
    if not isinstance(distribution, (IntDistribution, FloatDistribution)):
        raise ValueError(f"unsupported distribution {distribution!r}")
    low, high = distribution.low, distribution.high
    if distribution.step is not None and not distribution.log:
        n = int(math.floor((high - low) / distribution.step + 1e-9)) + 1
        value = low + distribution.step * int(rng.integers(n))
        return as_external(distribution, min(value, high))
    if distribution.log:
        value = math.exp(rng.uniform(math.log(low), math.log(high)))
    else:
        value = rng.uniform(low, high)
    if isinstance(distribution, IntDistribution):
        value = round(value)
    return as_external(distribution, min(max(value, low), high))


def neighbour(distribution: BaseDistribution, value: Any, direction: int, step: int,
              rng: np.random.Generator) -> tuple[Any, str] | None:
    """A move of one dimension from ``value``: (new value, kind), kind "+", "-" or "jump".

    ``direction`` (+1 or −1) is the preferred way along the list or the number line; at an
    end of an ordered range the move goes the other way.  None: the dimension has a single
    value (or ``value`` is not in it)."""
    if not contains(distribution, value):
        return None
    if isinstance(distribution, CategoricalDistribution):
        k = len(distribution.choices)
        if k < 2:
            return None
        index = int(distribution.to_internal_repr(value))
        if k > _JUMP_ABOVE and step % 3 == 2:
            other = int(rng.integers(k - 1))
            return distribution.choices[other + (other >= index)], "jump"
        return distribution.choices[(index + direction) % k], "+" if direction > 0 else "-"
    if not isinstance(distribution, (IntDistribution, FloatDistribution)):
        return None
    for d in (direction, -direction):
        moved = _ordered_move(distribution, value, d)
        if moved is not None:
            return moved, "+" if d > 0 else "-"
    return None


def _ordered_move(distribution: IntDistribution | FloatDistribution, value: float,
                  direction: int) -> float | int | None:
    """The next point of the dimension's grid beyond ``value`` (None at the end)."""
    grid = _grid(distribution)
    if direction > 0:
        beyond = [g for g in grid if g > value]
        return beyond[0] if beyond else None
    beyond = [g for g in grid if g < value]
    return beyond[-1] if beyond else None


def _grid(distribution: IntDistribution | FloatDistribution) -> list[float | int]:
    """About GRID_POINTS + 1 values spanning the range: the distribution's own grid when it
    has at most that many points, else every k-th point of it; geometric for log=True."""
    low, high, step = distribution.low, distribution.high, distribution.step
    if distribution.log:
        points = [low * (high / low) ** (k / GRID_POINTS) for k in range(GRID_POINTS + 1)]
    elif step is not None:
        n = int(math.floor((high - low) / step + 1e-9))  # grid intervals
        unit = max(1, round(n / GRID_POINTS))
        points = [low + k * unit * step for k in range(n // unit + 1)]
        if points[-1] < low + n * step:
            points.append(low + n * step)
    else:
        points = [low + (high - low) * k / GRID_POINTS for k in range(GRID_POINTS + 1)]
    return sorted({as_external(distribution, min(max(p, low), high)) for p in points})
