"""Small derivative-free minimisers for the calibration scripts (no SciPy dependency).

Nelder–Mead on an unconstrained vector; callers fit positive constants on a log scale and
fractions through a logistic, so every trial point is physical.  Golden-section search for
one factor in a bracket.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def nelder_mead(f: Callable[[np.ndarray], float], x0, *, step: float = 0.3,
                iterations: int = 2000, tol: float = 1e-10) -> np.ndarray:
    """Minimise ``f`` from ``x0`` (standard coefficients 1, 2, 0.5, 0.5); returns the best x."""
    x0 = np.asarray(x0, float)
    n = x0.size
    simplex = np.vstack([x0] + [x0 + step * np.eye(n)[i] for i in range(n)])
    values = np.array([f(x) for x in simplex])
    for _ in range(iterations):
        order = np.argsort(values)
        simplex, values = simplex[order], values[order]
        if abs(values[-1] - values[0]) <= tol * (abs(values[0]) + tol):
            break
        centre = simplex[:-1].mean(axis=0)
        worst = simplex[-1]
        reflected = centre + (centre - worst)
        fr = f(reflected)
        if fr < values[0]:
            expanded = centre + 2 * (centre - worst)
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centre + 0.5 * (worst - centre)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex[1:] = simplex[0] + 0.5 * (simplex[1:] - simplex[0])
                values[1:] = [f(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]


def golden(f: Callable[[float], float], lo: float, hi: float, *,
           iterations: int = 25) -> float:
    """The minimiser of a unimodal ``f`` on [lo, hi], by golden-section search (the bracket
    shrinks by 0.618 an iteration: 25 take a bracket of 0.4 to 1e-6)."""
    ratio = (5 ** 0.5 - 1) / 2
    for _ in range(iterations):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if f(a) < f(b):
            hi = b
        else:
            lo = a
    return (lo + hi) / 2


def logistic(x: float) -> float:
    return float(1.0 / (1.0 + np.exp(-x)))


def logit(p: float) -> float:
    return float(np.log(p / (1.0 - p)))
