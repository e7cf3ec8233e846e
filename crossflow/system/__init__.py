"""The system layer: topology, device mapping, routing, link sharing, collectives.

    >>> from crossflow.system import ORDERS, all_reduce, build_system
    >>> system = build_system("dgx-a100")                 # device from the file, 384 nodes
    >>> m = system.map((8, 1, 48, 8), ("kp1", "kp2", "dp", "lp"))
    >>> round(m.group_bandwidth("kp1") / 1e9)             # NVSwitch ring, NCCL-calibrated
    228
    >>> t = all_reduce(1 << 30, m.group("kp1"))           # seconds for 1 GiB over 8 GPUs

See :mod:`crossflow.system.system` for the conventions (paper §5.2, §6.4) and
:mod:`crossflow.system.collectives` for the α–β cost model.
"""

from crossflow.system.collectives import (
    Group,
    all_gather,
    all_reduce,
    bus_bandwidth,
    hierarchical_all_reduce,
    reduce_scatter,
    send_recv,
    switch_group,
)
from crossflow.system.orders import order_classes, order_representative
from crossflow.system.system import DIMS, ORDERS, Mapping, System, build_system, parse_order

__all__ = [
    "DIMS",
    "ORDERS",
    "Group",
    "Mapping",
    "System",
    "all_gather",
    "all_reduce",
    "build_system",
    "bus_bandwidth",
    "hierarchical_all_reduce",
    "order_classes",
    "order_representative",
    "parse_order",
    "reduce_scatter",
    "send_recv",
    "switch_group",
]
