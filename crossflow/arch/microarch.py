"""`MicroArch`: what the performance model knows about one accelerator (all SI).

The value types are defined in :mod:`crossflow.config.device` (the hardware and template
configs, one layer down, validate against them and build them) and re-exported here, the
name the rest of the model imports them by.
"""

from crossflow.config.device import (
    ACCUMULATOR_BYTES,
    BYTES_PER_ELEMENT,
    PRECISIONS,
    SCOPES,
    Link,
    MemoryLevel,
    MicroArch,
    Precision,
    Scope,
)

__all__ = [
    "ACCUMULATOR_BYTES",
    "BYTES_PER_ELEMENT",
    "PRECISIONS",
    "SCOPES",
    "Link",
    "MemoryLevel",
    "MicroArch",
    "Precision",
    "Scope",
]
