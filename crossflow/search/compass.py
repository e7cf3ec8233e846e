"""Compass search: the pattern search both the best-known search and the structured driver
run on a point's continuous coordinates.

Kolda, Lewis and Torczon, "Optimization by direct search: new perspectives on some
classical and modern methods", SIAM Review 45(3), 2003, §3 (compass search): each
coordinate in turn is moved by ``+step`` and, when that is no better, by ``-step``; the
first move that beats the incumbent is taken (opportunistic polling), and a sweep of every
coordinate without a gain halves the step, until it is below ``smallest``.  On the AGE's
budget splits (the simplexes in their softmax coordinates) it starts with large moves —
a step of 1.0 multiplies one share by e — and so crosses whole-unit cliffs a local search of
step-edge moves stays behind (docs/search-history.md, "A twenty-sixth round").

:func:`compass` is a generator, so that a caller with evaluations of its own (a counter, a
plan that yields batches) drives it: it yields one trial point at a time and receives that
point's value.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

import numpy as np

#: The first step and the step below which the search ends, in units of ``scale``: for a
#: simplex in its softmax coordinates (range ±4) a factor e on one share first, then down to
#: ~1.6 % of a share (the best-known search's refinement has used them since it was written).
FIRST_STEP = 1.0
SMALLEST_STEP = 1 / 64


def compass(x: Sequence[float], value: float, low: Sequence[float], high: Sequence[float],
            scale: Sequence[float] | None = None, *, budget: int | None = None,
            gain: float = 0.0) -> Generator[np.ndarray, float, tuple[np.ndarray, float]]:
    """Compass search from ``x`` (whose value is ``value``) in the box [``low``, ``high``]:
    yields trial points, receives their values, and returns (best point, its value) when
    the step falls below :data:`SMALLEST_STEP` or, after a coordinate's turn, ``budget``
    evaluations have been made.  A move is taken when its value is below the incumbent's
    by more than the relative ``gain``; ``scale`` (default 1) sizes the step per
    coordinate."""
    x = np.array(x, dtype=float)
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    scale = np.ones_like(x) if scale is None else np.asarray(scale, dtype=float)
    best, step, used = value, FIRST_STEP, 0
    while step >= SMALLEST_STEP and (budget is None or used < budget):
        improved = False
        for i in range(len(x)):
            for sign in (1.0, -1.0):
                v = min(high[i], max(low[i], x[i] + sign * step * scale[i]))
                if v == x[i]:
                    continue
                y = x.copy()
                y[i] = v
                fy = yield y
                used += 1
                if fy < best * (1 - gain):
                    x, best, improved = y, fy, True
                    break
            if budget is not None and used >= budget:
                break
        if not improved:
            step /= 2
    return x, best


__all__ = ["FIRST_STEP", "SMALLEST_STEP", "compass"]
