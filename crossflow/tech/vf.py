"""Voltage–frequency–power scaling (paper §4.4.1, "standard V-f-P scaling").

Dynamic power P ∝ f·V² and the alpha-power law with alpha = 2 gives f ∝ (V − Vt)² / V, so at a
fixed amount of hardware P ∝ V·(V − Vt)².  Given the ratio of the power budget to the nominal
power, the operating voltage solves

    V·(V − Vt)² = ratio · Vnom·(Vnom − Vt)².

With x = V − Vt that is x³ + Vt·x² − c = 0 (c > 0): one sign change, so exactly one positive
root, and the left side increases monotonically for x > 0.  That root is the only physical
operating point (V > Vt).  (The reference implementation took the first real root returned by
numpy, which for small ratios can be a non-physical one: reference BUGS.md, ``solve_poly``.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def solve_voltage(power_ratio: float, nominal_V: float, threshold_V: float) -> float:
    """The unique V > Vt with V(V−Vt)² = power_ratio · Vnom(Vnom−Vt)² (unclamped).

    Newton's method from above: the cubic is increasing and convex for x = V−Vt > 0, so the
    iterates decrease monotonically to the root.  Both starting guesses, cbrt(c) and
    sqrt(c/Vt), lie at or above the root; the smaller is within a factor ~1.5 of it.
    """
    if not power_ratio > 0.0:
        raise ValueError(f"power_ratio > 0 must hold, but got {power_ratio}")
    vt = threshold_V
    c = power_ratio * nominal_V * (nominal_V - vt) ** 2
    x = c ** (1.0 / 3.0)
    if vt > 0.0:
        x = min(x, math.sqrt(c / vt))
    for _ in range(100):
        step = (x * x * (x + vt) - c) / (x * (3.0 * x + 2.0 * vt))
        x -= step
        if abs(step) <= 1e-15 * x:
            break
    return vt + x


@dataclass(frozen=True, slots=True)
class VoltageFrequency:
    """A component's V/f law and its allowed voltage range [min_V, max_V]."""

    nominal_V: float
    threshold_V: float
    min_V: float
    max_V: float

    def power_ratio(self, voltage_V: float) -> float:
        """P(V) / P(Vnom) for the same hardware: V(V−Vt)² / (Vnom(Vnom−Vt)²)."""
        vt, vn = self.threshold_V, self.nominal_V
        return voltage_V * (voltage_V - vt) ** 2 / (vn * (vn - vt) ** 2)

    def frequency_ratio(self, voltage_V: float) -> float:
        """f(V) / f(Vnom): ((V−Vt)²/V) / ((Vnom−Vt)²/Vnom)."""
        vt, vn = self.threshold_V, self.nominal_V
        return ((voltage_V - vt) ** 2 / voltage_V) / ((vn - vt) ** 2 / vn)

    def energy_ratio(self, voltage_V: float) -> float:
        """Dynamic energy per operation at V relative to nominal: (V / Vnom)²."""
        return (voltage_V / self.nominal_V) ** 2

    def solve(self, power_ratio: float) -> float:
        """The physical (V > Vt) voltage for ``power_ratio``, not clamped."""
        return solve_voltage(power_ratio, self.nominal_V, self.threshold_V)

    def voltage_for(self, power_ratio: float) -> tuple[float, str]:
        """The operating voltage for ``power_ratio``, clamped to [min_V, max_V].

        Returns ``(V, why)`` with ``why`` one of ``"max_voltage"`` (more power than the
        hardware can use), ``"min_voltage"`` (over budget even at min_V: the caller must
        shed hardware) or ``"power"`` (the budget sets V).
        """
        if power_ratio >= self.power_ratio(self.max_V):
            return self.max_V, "max_voltage"
        if power_ratio < self.power_ratio(self.min_V):
            return self.min_V, "min_voltage"
        return min(max(self.solve(power_ratio), self.min_V), self.max_V), "power"
