"""Where a kernel's data lives between kernels."""

from __future__ import annotations

from crossflow.arch.microarch import MemoryLevel, MicroArch


def home_level(arch: MicroArch, working_set_B: float) -> MemoryLevel:
    """The smallest chip-global level that holds the working set, else main memory.

    Data a previous kernel left in a large enough on-chip level (an L2 or L3 shared by the
    whole chip) is read from there; everything else streams from main memory.  Levels
    private to an MCU or a bundle never hold data between kernels.
    """
    for level in arch.memory[:-1]:
        if level.scope == "global" and level.total_capacity_B >= working_set_B:
            return level
    return arch.main_memory
