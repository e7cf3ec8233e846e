"""``python -m crossflow``: the ``crossflow`` command."""

import sys

from crossflow.cli import main

sys.exit(main())
