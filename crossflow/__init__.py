"""CrossFlow: cross-stack performance model for distributed AI training systems.

``crossflow.predict(workload=..., hardware=...)`` is the one call most users need
(DESIGN.md §7).  Nothing here imports optuna or mlflow.
"""

__version__ = "0.1.0"

from crossflow.errors import ConfigError, CrossflowError, InfeasibleDesignError  # noqa: E402
from crossflow.predict import Prediction, predict  # noqa: E402

__all__ = [
    "ConfigError",
    "CrossflowError",
    "InfeasibleDesignError",
    "Prediction",
    "__version__",
    "predict",
]
