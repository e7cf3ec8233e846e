"""Encoding budget simplexes as free floats, so every sampled point is a valid budget split.

A simplex of components c1…cn whose fractions must be ≥ 0 and sum to ≤ 1 gets n + 1
Optuna float parameters ``"{simplex}.{component}"`` and ``"{simplex}.slack"``, each in
[-SPAN, SPAN].  They decode by normalised exponentials (a softmax over the n + 1 values):
the components' fractions plus the unused share (the slack) sum to exactly 1, whatever the
sampler proposes, so TPE, CMA-ES and random search never produce an invalid budget (raw
fractions would satisfy the sum constraint with probability 1/n!).  The smallest fraction
one component can get relative to the largest is exp(-2·SPAN) ≈ 3.4e-4.

Samplers that think in fractions (the ``gd`` sampler) use :func:`encode` to turn a point of
the simplex back into parameter values that decode to it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

SPAN = 4.0
SLACK = "slack"


def param_names(simplex: str, components: Sequence[str]) -> list[str]:
    """Optuna parameter names of a simplex, the slack last."""
    return [f"{simplex}.{c}" for c in components] + [f"{simplex}.{SLACK}"]


def decode(values: Sequence[float]) -> list[float]:
    """Fractions (components then slack, summing to 1) from encoded values."""
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    total = sum(weights)
    return [w / total for w in weights]


def encode(fractions: Sequence[float]) -> list[float]:
    """Encoded values (in [-SPAN, SPAN]) that decode to ``fractions`` (components then
    slack; they must be ≥ 0 and sum to 1).  Fractions too small to represent are raised to
    the smallest representable share of the largest one."""
    if any(f < 0 for f in fractions) or not math.isclose(sum(fractions), 1.0, abs_tol=1e-9):
        raise ValueError(f"fractions must be >= 0 and sum to 1, got {list(fractions)}")
    top = max(fractions)
    return [max(-SPAN, SPAN + math.log(f / top)) if f > 0 else -SPAN for f in fractions]


def decode_params(params: Mapping[str, float], simplex: str,
                  components: Sequence[str]) -> dict[str, float]:
    """Component -> fraction (slack dropped) from a trial's parameters."""
    names = param_names(simplex, components)
    fractions = decode([params[n] for n in names])
    return dict(zip(components, fractions[:-1], strict=True))
