"""CrossFlow: cross-stack performance model for distributed AI training systems.

``crossflow.predict(workload=..., hardware=...)`` is the one call most users need
(docs/architecture.md, "Data flow of one prediction").  Nothing here imports optuna or
mlflow.
"""

__version__ = "0.1.0"

from crossflow.config.loader import declare_entry_points  # noqa: E402

# Config kinds defined above the config layer: the module that registers each when
# imported (docs/architecture.md, "Config kinds").  The loader imports it the first time a
# file of that kind is loaded; the config layer itself names no module above it.
declare_entry_points({
    "parallelism": ("parallelism", "crossflow.parallel.spec"),
    "search_space": ("search_spaces", "crossflow.search.space"),
    "study": ("studies", "crossflow.search.study"),
})

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
