"""Compass search (crossflow.search.compass): the pattern search of the best-known search's
refinement and of the structured driver's second local search."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossflow.search.compass import FIRST_STEP, SMALLEST_STEP, compass


def _run(search, f):
    """Drive a compass generator with ``f``: (best point, its value, the points asked)."""
    asked = []
    try:
        y = next(search)
        while True:
            asked.append(y.copy())
            y = search.send(f(y))
    except StopIteration as end:
        x, best = end.value
    return x, best, asked


def _bowl(centre):
    return lambda y: float(np.sum((y - centre) ** 2))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-3.5, 3.5), min_size=1, max_size=5))
def test_it_ends_within_its_last_step_of_a_bowls_minimum_and_stays_in_its_box(centre):
    centre = np.array(centre)
    low, high = np.full(len(centre), -4.0), np.full(len(centre), 4.0)
    x, best, asked = _run(compass(np.zeros(len(centre)), _bowl(centre)(np.zeros(len(centre))),
                                  low, high), _bowl(centre))
    assert np.all(np.abs(x - centre) <= SMALLEST_STEP)   # the last step it tried failed
    assert best == _bowl(centre)(x)
    assert all(np.all((y >= low) & (y <= high)) for y in asked)


def test_polling_is_opportunistic_and_a_failed_sweep_halves_the_step():
    """Each coordinate: +step first, -step only when +step is no better; the step halves
    only after a whole sweep without a gain."""
    f = _bowl(np.array([-1.0, 0.0]))
    _, _, asked = _run(compass(np.zeros(2), f(np.zeros(2)), [-4, -4], [4, 4]), f)
    moves = [tuple(y) for y in asked[:7]]
    # x0: +1 is worse, -1 reaches -1; x1: +1 and -1 both worse; then x0 again from -1: 0
    # (worse) and -2 (worse); x1 likewise: the sweep failed, so the step halves
    assert moves[:4] == [(1.0, 0.0), (-1.0, 0.0), (-1.0, 1.0), (-1.0, -1.0)]
    assert moves[4:] == [(0.0, 0.0), (-2.0, 0.0), (-1.0, 1.0)] and tuple(asked[7]) == (-1.0, -1.0)
    assert np.max(np.abs(asked[8] - np.array([-1.0, 0.0]))) == pytest.approx(FIRST_STEP / 2)


def test_a_bound_is_never_crossed_and_a_move_that_stays_put_is_not_asked():
    f = _bowl(np.array([10.0]))        # the minimum is outside the box
    x, _, asked = _run(compass([3.5], f(np.array([3.5])), [-4], [4]), f)
    assert x[0] == 4.0
    assert all(-4 <= y[0] <= 4 for y in asked)
    assert len({y[0] for y in asked}) == len(asked)   # no point twice in a row on the bound


def test_the_budget_ends_it_after_a_coordinates_turn():
    f = _bowl(np.array([3.0, 3.0, 3.0]))
    _, _, asked = _run(compass(np.zeros(3), f(np.zeros(3)), [-4] * 3, [4] * 3, budget=4), f)
    # coordinate 0 takes one evaluation (+1 is better), coordinate 1 one, coordinate 2 one,
    # coordinate 0 again one: the fourth ends the turn with the budget spent
    assert len(asked) == 4


def test_a_gain_below_the_threshold_is_not_a_move():
    start = np.zeros(1)
    f = lambda y: 1.0 - 1e-9 * float(y[0])   # noqa: E731 - better by far less than the gain
    x, best, _ = _run(compass(start, f(start), [-4], [4], gain=1e-6), f)
    assert np.array_equal(x, start) and best == 1.0
    x, best, _ = _run(compass(start, f(start), [-4], [4]), f)   # without a gain: it moves
    assert x[0] == 4.0 and best < 1.0


def test_an_infeasible_start_takes_the_first_finite_point():
    values = iter([math.inf, 2.0])
    search = compass(np.zeros(1), math.inf, [-4], [4])
    next(search)
    search.send(next(values))
    y = search.send(next(values))  # -1 gave 2.0: the next sweep starts from -1
    assert y[0] == pytest.approx(-1.0 + FIRST_STEP)
