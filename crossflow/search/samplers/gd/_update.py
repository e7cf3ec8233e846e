"""The arithmetic of one step of the paper's eq. 6 on one simplex.

DeepFlow paper §7, eq. 6, with the normalised step that the reference implementation
(and the prose) use — the printed ``Ŵ_t = W_t/‖W_t‖`` normalises the step's gradient,
not the parameters::

    W'_t = W_{t−1} − η · g_t / ‖g_t‖            (normalised gradient step)
    M_t  = β · M_{t−1} + (1 − β) · W'_t          (exponential average in parameter space)
    W_t  = Project_Δ(M_t)                         (Euclidean projection onto the simplex)

with M_0 = W_0 (the reference started M at 0, which biases the first steps towards the
origin).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from crossflow.search.samplers.gd._simplex import project_onto_simplex

#: Differences of losses within this relative distance count as equal (float noise of an
#: objective that is constant along a direction must not become a full-length step).
_RTOL = 1e-12


def simplex_gradient(loss_base: float, loss_probes: Sequence[float], probe: float) -> np.ndarray:
    """The gradient of the loss in the simplex's tangent space, from mixing probes.

    Probe i evaluates x_i = (1 − h)·w + h·e_i, so its forward difference
    d_i = (f(x_i) − f(w)) / h estimates the directional derivative along e_i − w, which is
    ∂_i f − w·∇f.  The constant w·∇f is the same for every i, so d − mean(d) =
    ∇f − mean(∇f)·1: the projection of ∇f onto {Σx = 0}, the directions that stay on the
    simplex.  The slack is one of the coordinates, so "Σ fractions ≤ 1" is "Σ = 1".

    Infinite losses (infeasible or failed trials count as +inf) take the limit of the
    normalised gradient: from a finite base, the probes that became infinite dominate
    (d_i = 1 for them, 0 for the others: step away from them); from an infinite base, the
    finite probes dominate (d_i = −1: step towards them); inf − inf counts as 0.  All
    infinite: no information, zero gradient.
    """
    if not probe > 0:
        raise ValueError(f"`probe > 0` must hold, but got probe={probe}")
    f = np.asarray(loss_probes, dtype=float)
    with np.errstate(invalid="ignore"):
        diff = f - loss_base
    diff[np.isnan(diff)] = 0.0
    infinite = ~np.isfinite(diff)
    if infinite.any():
        d = np.where(infinite, np.sign(diff), 0.0)
    else:
        scale = np.maximum(abs(loss_base), np.abs(f))
        diff[np.abs(diff) <= _RTOL * scale] = 0.0
        d = diff / probe
    return d - d.mean()


def eq6_step(w: np.ndarray, m: np.ndarray, g: np.ndarray, *, learning_rate: float,
             beta: float) -> tuple[np.ndarray, np.ndarray]:
    """One step of eq. 6: returns (W_t, M_t) from W_{t−1}, M_{t−1} and g_t.

    A zero gradient takes no step (W'_t = W_{t−1}); the average still moves M towards it.
    """
    w = np.asarray(w, dtype=float)
    g = np.asarray(g, dtype=float)
    norm = float(np.linalg.norm(g))
    stepped = w - learning_rate * g / norm if norm > 0 else w.copy()
    m_new = beta * np.asarray(m, dtype=float) + (1.0 - beta) * stepped
    return project_onto_simplex(m_new), m_new


def tiered_gradient(loss_base: tuple[int, float], loss_probes: Sequence[tuple[int, float]],
                    probe: float) -> np.ndarray:
    """:func:`simplex_gradient` for losses (tier, value) compared lexicographically (see
    :func:`crossflow.search.samplers.gd._ledger.loss`): values differ finitely within the
    base's tier, infinitely across tiers (a worse tier is +inf, a better one −inf);
    no information at all (every loss in the "unknown" tier) is a zero gradient."""
    tier, value = loss_base
    if all(t == tier for t, _ in loss_probes):
        return simplex_gradient(value, [v for _, v in loss_probes], probe)
    return simplex_gradient(0.0, [math.copysign(math.inf, t - tier) if t != tier else 0.0
                                  for t, _ in loss_probes], probe)
