"""The exit statuses of the ``crossflow`` command (docs/architecture.md, "Command line")."""

from __future__ import annotations

#: 0 success, 1 a validation data set missed its tolerance, 2 bad input (one paragraph on
#: stderr, no traceback unless ``--debug``), 3 the design is infeasible; 130 interrupted.
EXIT_OK, EXIT_TOLERANCE, EXIT_BAD_INPUT, EXIT_INFEASIBLE = 0, 1, 2, 3
