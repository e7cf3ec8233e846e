"""Geometry of the probability simplex Δ = {x ∈ ℝᵐ : x ≥ 0, Σx = 1}."""

from __future__ import annotations

import numpy as np


def project_onto_simplex(v: np.ndarray) -> np.ndarray:
    """The Euclidean projection of ``v`` onto the probability simplex.

    ``argmin_x ‖x − v‖₂`` over Δ, by the sort-and-threshold algorithm of Held, Wolfe and
    Crowder (1974) as written by Duchi, Shalev-Shwartz, Singer and Chandra, "Efficient
    projections onto the ℓ1-ball for learning in high dimensions", ICML 2008, Fig. 1:
    with u = v sorted in decreasing order, ρ = max{j : u_j − (Σ_{r≤j} u_r − 1)/j > 0}
    and θ = (Σ_{r≤ρ} u_r − 1)/ρ, the projection is max(v − θ, 0).  O(m log m).
    """
    v = np.asarray(v, dtype=float)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"a non-empty vector is required, but got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"the vector must be finite, but got {v}")
    u = np.sort(v)[::-1]
    css = np.cumsum(u)
    j = np.arange(1, v.size + 1)
    rho = int(np.nonzero(u - (css - 1.0) / j > 0)[0][-1]) + 1
    theta = (css[rho - 1] - 1.0) / rho
    x = np.maximum(v - theta, 0.0)
    # Exact in real arithmetic; renormalise the last ulp so encode() sees Σx = 1.
    return x / x.sum()


def mix_towards_vertex(w: np.ndarray, i: int, weight: float) -> np.ndarray:
    """The probe point (1 − weight)·w + weight·e_i: a move of ``weight`` towards vertex i.

    A convex combination of two points of Δ, so it never leaves the simplex (no
    projection needed, unlike an additive probe near a face) and it can grow a
    coordinate that is 0 (unlike a multiplicative probe x_i·α)."""
    x = (1.0 - weight) * np.asarray(w, dtype=float)
    x[i] += weight
    return x
