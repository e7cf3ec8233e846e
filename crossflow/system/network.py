"""Collective and point-to-point times along the parallel dimensions of a device mapping.

Adapts a :class:`~crossflow.system.system.Mapping` to the ``Network`` protocol the
simulators use (:mod:`crossflow.sim.training`, :mod:`crossflow.sim.graph_sim`): the dimension
names are the paper's ``kp1``, ``kp2``, ``dp`` and ``lp`` (Megatron's t is kp1, p is lp).
"""

from __future__ import annotations

from collections.abc import Callable

from crossflow.system.collectives import all_gather, reduce_scatter, send_recv
from crossflow.system.system import Mapping

_GROUP_COLLECTIVES = {"all_gather": all_gather, "reduce_scatter": reduce_scatter}


class MappedNetwork:
    """Times of collectives on the groups of one mapping, memoised per call."""

    def __init__(self, mapping: Mapping) -> None:
        self.mapping = mapping
        self._memo: dict[tuple[str, float, str], float] = {}

    def collective(self, kind: str, nbytes: float, dim: str) -> float:
        key = (kind, nbytes, dim)
        if key not in self._memo:
            if kind == "all_reduce":
                value = self.mapping.all_reduce(dim, nbytes)
            else:
                value = _GROUP_COLLECTIVES[kind](nbytes, self.mapping.group(dim))
            self._memo[key] = value
        return self._memo[key]

    def all_to_all(self, nbytes: float, size: int, stride: int = 1,
                   copies: Callable[[int, int], tuple[float, float]] | None = None) -> float:
        """An all-to-all in each expert-parallel group of ``size`` ranks, every
        ``stride``-th rank of the expert grid, ``copies`` a deduplicating dispatcher's
        (:meth:`Mapping.all_to_all`)."""
        key = ("all_to_all", nbytes, f"{size}/{stride}", copies)
        if key not in self._memo:
            self._memo[key] = self.mapping.all_to_all(nbytes, size, stride, copies)
        return self._memo[key]

    def expert_tensor(self, kind: str, nbytes: float, size: int) -> float:
        """An all-gather or reduce-scatter in each expert-tensor-parallel group of ``size``
        ranks (:meth:`Mapping.expert_tensor`)."""
        key = (kind, nbytes, f"etp{size}")
        if key not in self._memo:
            self._memo[key] = self.mapping.expert_tensor(kind, nbytes, size)
        return self._memo[key]

    def p2p(self, nbytes: float, dim: str) -> float:
        key = ("p2p", nbytes, dim)
        if key not in self._memo:
            self._memo[key] = send_recv(nbytes, self.mapping.group(dim))
        return self._memo[key]
