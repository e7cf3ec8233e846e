"""TuRBO-1 (Eriksson et al., "Scalable Global Optimization via Local Bayesian Optimization",
NeurIPS 2019) in numpy, as a baseline for ``bench_plan.py``'s ``{"turbo_alone": {...}}``.

The standard trust-region answer for Bayesian optimisation in a space where every good
point lies near a known one: a box around the incumbent (side ``length`` of the unit cube,
stretched per dimension by the GP's length-scales), a Gaussian process fitted to the
points of the current region, and a batch chosen by Thompson sampling over candidates that
perturb a few coordinates of the incumbent.  The box doubles after three batches in a row
that gain and halves after ``ceil(max(4, d) / q)`` that do not; below ``0.5**7`` the search
restarts from a fresh Latin hypercube in a random region.  The paper's settings throughout
(length 0.8, from 0.5**7 to 1.6; 2d initial points; 20 / d perturbation probability); the
GP is a Matérn-5/2 kernel with one length-scale per dimension, its hyperparameters fitted
by Adam on the marginal likelihood (as the paper's GPyTorch code does), warm-started from
the last fit.  It lives here, not in the package: measured on the budgets-only studies it
ends behind both the driver and plain CMA-ES (docs/search-history.md, "A fifty-eighth
round").
"""

from __future__ import annotations

import math

import numpy as np

_LOG_BOUNDS = {"length": (math.log(0.005), math.log(2.0)),
               "signal": (math.log(0.05), math.log(20.0)),
               "noise": (math.log(1e-6), math.log(0.1))}
_SQRT5 = math.sqrt(5.0)


def _matern52(r: np.ndarray) -> np.ndarray:
    s = _SQRT5 * r
    return (1 + s + s * s / 3) * np.exp(-s)


def _distance(a: np.ndarray, b: np.ndarray, scales: np.ndarray) -> np.ndarray:
    return np.sqrt((((a[:, None, :] - b[None, :, :]) / scales) ** 2).sum(-1))


class GP:
    """A zero-mean GP on standardised ``y`` with a Matérn-5/2 ARD kernel; ``theta`` = log
    length-scales (d), log signal variance, log noise variance."""

    def __init__(self, X: np.ndarray, y: np.ndarray, theta: np.ndarray | None = None,
                 steps: int = 50, lr: float = 0.1) -> None:
        self.X = X
        self.mu, self.sd = float(y.mean()), float(y.std()) or 1.0
        self.y = (y - self.mu) / self.sd
        d = X.shape[1]
        self._sq = (X[:, None, :] - X[None, :, :]) ** 2
        if theta is None:
            theta = np.concatenate([np.full(d, math.log(0.5)), [0.0, math.log(1e-2)]])
        low, high = np.array([_LOG_BOUNDS["length"]] * d
                             + [_LOG_BOUNDS["signal"], _LOG_BOUNDS["noise"]]).T
        theta = np.clip(np.asarray(theta, float), low, high)
        m, v = np.zeros_like(theta), np.zeros_like(theta)
        best, best_f = theta, math.inf
        for t in range(1, steps + 1):  # Adam, bias-corrected
            f, g = self.nll(theta)
            if f < best_f:
                best, best_f = theta.copy(), f
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            theta = np.clip(theta - lr * (m / (1 - 0.9 ** t))
                            / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8), low, high)
        self.theta = best
        self.scales, self.signal = np.exp(best[:d]), math.exp(best[d])
        self.L = np.linalg.cholesky(self._terms(best)[-1])
        self.alpha = np.linalg.solve(self.L.T, np.linalg.solve(self.L, self.y))

    def _terms(self, theta: np.ndarray):
        """The kernel at ``theta`` over the data: each dimension's scaled squared distances,
        the distance r, exp(-sqrt5 r), the Matérn correlation and the covariance matrix."""
        d = self.X.shape[1]
        parts = self._sq / np.exp(theta[:d]) ** 2
        r = np.sqrt(parts.sum(-1))
        e = np.exp(-_SQRT5 * r)
        k = (1 + _SQRT5 * r + 5 * r * r / 3) * e
        K = math.exp(theta[d]) * k + (math.exp(theta[d + 1]) + 1e-8) * np.eye(len(self.X))
        return parts, r, e, k, K

    def nll(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """Negative log marginal likelihood (constant dropped) and its gradient."""
        d, n = self.X.shape[1], len(self.X)
        signal, noise = math.exp(theta[d]), math.exp(theta[d + 1])
        parts, r, e, k, K = self._terms(theta)
        try:
            L = np.linalg.cholesky(K)
        except np.linalg.LinAlgError:
            return math.inf, np.zeros_like(theta)
        Kinv = np.linalg.solve(L.T, np.linalg.solve(L, np.eye(n)))
        a = Kinv @ self.y
        f = 0.5 * float(self.y @ a) + float(np.log(np.diag(L)).sum())
        W = Kinv - np.outer(a, a)
        # dk/dlog(scale_i) = (5/3)(1 + sqrt5 r) e^(-sqrt5 r) (x_i - x'_i)^2 / scale_i^2
        base = W * (signal * 5.0 / 3.0) * (1 + _SQRT5 * r) * e
        g = np.empty_like(theta)
        g[:d] = 0.5 * np.einsum("ij,ijk->k", base, parts)
        g[d] = 0.5 * float((W * (signal * k)).sum())
        g[d + 1] = 0.5 * float(np.trace(W)) * noise
        return f, g

    def sample(self, Z: np.ndarray, q: int, rng: np.random.Generator) -> np.ndarray:
        """``q`` joint posterior draws at the rows of ``Z``, in ``y``'s units."""
        cross = self.signal * _matern52(_distance(Z, self.X, self.scales))
        mean = cross @ self.alpha
        v = np.linalg.solve(self.L, cross.T)
        cov = self.signal * _matern52(_distance(Z, Z, self.scales)) - v.T @ v
        w, U = np.linalg.eigh((cov + cov.T) / 2)
        root = U * np.sqrt(np.maximum(w, 0.0))
        draws = mean[None, :] + (root @ rng.standard_normal((len(Z), q))).T
        return draws * self.sd + self.mu


class Turbo:
    """``ask(q)`` -> points of the unit cube; ``tell(points, values)`` with the objective's
    values (minimised on a log scale; ``inf`` = infeasible, told as worse than any seen).
    The first region is centred on ``x0`` (a designed start: random points of the whole
    box almost never beat it)."""

    def __init__(self, x0: np.ndarray, seed: int, length: float = 0.8,
                 n_init: int | None = None, candidates: int = 500,
                 max_points: int = 100) -> None:
        self.d = len(x0)
        self.rng = np.random.default_rng(seed)
        self.length0 = self.length = length
        self.n_init = n_init or 2 * self.d
        self.candidates, self.max_points = candidates, max_points
        self.X: list[np.ndarray] = []
        self.y: list[float] = []
        self.region: list[int] = []  # this restart's points
        self.region_best = math.inf
        self.succ = self.fail = 0
        self.theta: np.ndarray | None = None
        self.pending = self._design(np.asarray(x0, float))

    def _design(self, center: np.ndarray) -> list[np.ndarray]:
        """A Latin hypercube of ``n_init`` points in the box around ``center``."""
        n = self.n_init
        lo = np.clip(center - self.length / 2, 0, 1)
        hi = np.clip(center + self.length / 2, 0, 1)
        strata = self.rng.permuted(np.tile(np.arange(n), (self.d, 1)), axis=1).T
        return list(lo + (strata + self.rng.random((n, self.d))) / n * (hi - lo))

    def ask(self, q: int) -> list[np.ndarray]:
        if self.pending:
            out, self.pending = self.pending[:q], self.pending[q:]
            return out
        idx = self.region[-self.max_points:]
        X = np.array([self.X[i] for i in idx])
        y = np.array([self.y[i] for i in idx])
        gp = GP(X, y, self.theta)
        self.theta = gp.theta
        center = X[np.argmin(y)]
        stretch = gp.scales / np.exp(np.log(gp.scales).mean())
        lo = np.clip(center - stretch * self.length / 2, 0, 1)
        hi = np.clip(center + stretch * self.length / 2, 0, 1)
        n = self.candidates
        moved = self.rng.random((n, self.d)) <= min(20.0 / self.d, 1.0)
        none = ~moved.any(1)
        moved[none, self.rng.integers(0, self.d, none.sum())] = True
        Z = np.where(moved, lo + self.rng.random((n, self.d)) * (hi - lo), center)
        chosen: list[int] = []
        for draw in gp.sample(Z, q, self.rng):
            chosen.append(next(int(j) for j in np.argsort(draw) if j not in chosen))
        return [Z[j] for j in chosen]

    def tell(self, points: list[np.ndarray], values: list[float]) -> None:
        finite = [math.log(v) for v in values if math.isfinite(v)]
        worst = max(self.y + finite) + 1.0 if self.y or finite else 0.0
        ys = [math.log(v) if math.isfinite(v) else worst for v in values]
        initial = len(self.region) < self.n_init
        for p, v in zip(points, ys, strict=True):
            self.region.append(len(self.X))
            self.X.append(np.asarray(p, float))
            self.y.append(v)
        gained = min(ys) < self.region_best - 1e-3 * abs(self.region_best)
        self.region_best = min(self.region_best, min(ys))
        if initial:
            return
        self.succ, self.fail = (self.succ + 1, 0) if gained else (0, self.fail + 1)
        if self.succ >= 3:
            self.length, self.succ = min(2 * self.length, 1.6), 0
        elif self.fail >= math.ceil(max(4.0, self.d) / len(points)):
            self.length, self.fail = self.length / 2, 0
        if self.length < 0.5 ** 7:
            self.length, self.region, self.region_best = self.length0, [], math.inf
            self.succ = self.fail = 0
            self.theta = None
            self.pending = self._design(self.rng.random(self.d))
