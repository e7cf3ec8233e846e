"""Classes of equivalent device-mapping orders.

A mapping order lists the four parallel dimensions ``(kp1, kp2, dp, lp)`` in the order
:meth:`crossflow.system.System.map` places them (the first on adjacent devices).  Orders that
differ only in where the grid's size-1 dimensions sit give the same placement, hence the same
prediction: :func:`order_classes` groups the 24 orders of a grid into those classes, so a
search or a screen prices one representative per class.
"""

from __future__ import annotations

from crossflow.parallel import Strategy
from crossflow.system.system import DIMS, ORDERS, parse_order


def _grid(grid_or_strategy) -> tuple[int, ...]:
    if isinstance(grid_or_strategy, str):
        grid_or_strategy = Strategy.parse(grid_or_strategy)
    grid = getattr(grid_or_strategy, "grid", grid_or_strategy)
    grid = tuple(int(n) for n in grid)
    if len(grid) != len(DIMS) or min(grid) < 1:
        raise ValueError(f"a grid is four sizes >= 1 (kp1, kp2, dp, lp), not {grid!r}")
    return grid


def order_classes(grid_or_strategy) -> list[tuple[str, tuple[str, ...]]]:
    """The mapping orders of a grid grouped into classes that give identical predictions.

    Args:
        grid_or_strategy: a ``(kp1, kp2, dp, lp)`` tuple, a
            :class:`~crossflow.parallel.Strategy` or a strategy name (``"RC-32-16-d1-p1"``).

    Returns:
        ``[(representative, members), ...]``: order strings such as ``"kp1-kp2-dp-lp"``.
        Every one of the 24 orders is in exactly one class; the representative is the
        class's first member in :data:`~crossflow.system.ORDERS` order (so a search over
        "best" that keeps the first of equal times picks the same order either way), and
        classes come in the order of their representatives.

    Why the members of a class give identical times: :class:`~crossflow.system.Mapping`
    places shard ``i`` on device ``Σ_j i[o_j]·stride(o_j)`` where ``stride(o_j)`` is the
    product of the sizes of the dimensions before ``o_j`` in the order.  A size-1 dimension
    multiplies that product by 1, so moving it changes no other dimension's stride, and
    its own index is always 0: the device of every shard is the same.  Everything the
    simulators ask of a mapping goes through ``Mapping._key(dim) = (size, stride, devices)``
    — the rings of a size-1 dimension are empty whatever its stride (no edges, an infinite
    bandwidth group, no hierarchy), and link sharing between dimensions (``concurrent=``)
    skips size-1 dimensions — so ``group``, ``all_reduce``, ``hierarchy``, ``spans_nodes``
    and ``link_loads`` agree for all members.  Two orders in different classes place some
    dimension of size > 1 with a different stride, which in general routes differently.
    """
    grid = _grid(grid_or_strategy)
    classes: dict[tuple[str, ...], list[str]] = {}
    for order in ORDERS:
        key = tuple(d for d in order if grid[DIMS.index(d)] > 1)
        classes.setdefault(key, []).append("-".join(order))
    return [(members[0], tuple(members)) for members in classes.values()]


def order_representative(grid_or_strategy, order: str | tuple[str, ...]) -> str:
    """The representative of the class of ``order`` (see :func:`order_classes`)."""
    grid = _grid(grid_or_strategy)
    key = tuple(d for d in parse_order(order) if grid[DIMS.index(d)] > 1)
    for o in ORDERS:
        if tuple(d for d in o if grid[DIMS.index(d)] > 1) == key:
            return "-".join(o)
    raise AssertionError("unreachable: every order has a class")
