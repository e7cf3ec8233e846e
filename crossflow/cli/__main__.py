"""``python -m crossflow.cli``: the ``crossflow`` command (as ``python -m crossflow``)."""

import sys

from crossflow.cli import main

sys.exit(main())
