"""Classes of equivalent mapping orders, on a study's discrete dimensions.

Two mapping orders that differ only in where the strategy's size-1 grid dimensions sit give
the same placement, hence the same prediction (:func:`crossflow.system.order_classes` says
why).  A search that screens or ranks combinations of the discrete dimensions (strategy ×
mapping order × technology …) prices one order per class, and a top-k of combinations counts
each class once: otherwise the k best are one strategy in k orders that give one time.

Used by the best-known search (:mod:`crossflow.search.best_known`) and, with the same
answers, by the ``structured`` driver's :class:`~crossflow.search.samplers.structured._problem.
Problem` (its ``order_classes`` / ``canonical_order`` compute the same thing; they can
delegate here).  This module sits below the samplers: it imports only the space's names and
:mod:`crossflow.system`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from crossflow.search.space import MAPPING_ORDER, STRATEGY


def _allowed_orders(discrete: Sequence[Any]) -> list[str] | None:
    dim = next((d for d in discrete if d.name == MAPPING_ORDER), None)
    return None if dim is None else list(dim.values())


def order_classes(discrete: Sequence[Any], combo: Mapping[str, Any]) -> list[str | None]:
    """One mapping order per class of orders that give the same time for ``combo``'s
    strategy, among the orders the space allows (the first allowed member of each class, in
    the order of :func:`crossflow.system.order_classes`); ``[None]`` when the space does not
    search the order; every allowed order when the combination has no strategy.

    ``discrete``: the space's discrete dimensions (objects with ``name`` and ``values()``)."""
    allowed = _allowed_orders(discrete)
    if allowed is None:
        return [None]
    strategy = combo.get(STRATEGY)
    if strategy is None:
        return sorted(allowed)
    from crossflow.system import order_classes as classes

    inside = set(allowed)
    reps = []
    for rep, members in classes(strategy):
        mine = [o for o in (rep, *members) if o in inside]
        if mine:
            reps.append(mine[0])
    return reps


def canonical_order(discrete: Sequence[Any], combo: Mapping[str, Any]) -> str | None:
    """The first class's order for ``combo``'s strategy (None: the order is not searched)."""
    return order_classes(discrete, combo)[0]


def same_class(discrete: Sequence[Any], combo: Mapping[str, Any], order: str) -> str | None:
    """The order the space prices for ``combo`` in the class of ``order`` under ``combo``'s
    strategy (what "this strategy in that order" is for another strategy: the same
    dimensions of size > 1 in the same sequence); None when the space allows none of it."""
    reps = order_classes(discrete, combo)
    strategy = combo.get(STRATEGY)
    if strategy is None or reps == [None]:
        return order if order in reps else None
    from crossflow.system import order_representative

    want = order_representative(strategy, order)
    return next((o for o in reps if order_representative(strategy, o) == want), None)


def class_key(discrete: Sequence[Any], combo: Mapping[str, Any]) -> tuple:
    """A hashable key equal for two combinations exactly when they differ at most in the
    mapping order and their orders are in one class (the same prediction)."""
    items = []
    for d in discrete:
        value = combo.get(d.name)
        if d.name == MAPPING_ORDER and value is not None and combo.get(STRATEGY) is not None:
            from crossflow.system import order_representative

            value = ("class", order_representative(combo[STRATEGY], value))
        items.append((d.name, value))
    return tuple(items)


def dedupe(discrete: Sequence[Any], combos: Iterable[Mapping[str, Any]]
           ) -> tuple[list[dict[str, Any]], int]:
    """``combos`` with one combination per order class (the first met), and how many were
    dropped as equivalent to one kept."""
    kept: dict[tuple, dict[str, Any]] = {}
    dropped = 0
    for combo in combos:
        key = class_key(discrete, combo)
        if key in kept:
            dropped += 1
        else:
            kept[key] = dict(combo)
    return list(kept.values()), dropped


def without_order(combo: Mapping[str, Any]) -> tuple:
    """The combination less its mapping order: what "one strategy" means when the best order
    of each strategy is kept (a hashable key)."""
    return tuple(sorted((k, v) for k, v in combo.items() if k != MAPPING_ORDER))
