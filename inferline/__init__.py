"""inferline: serve ML prediction pipelines under tail-latency SLOs at the lowest cost.

The facade re-exports the public API of the subsystems (``inferline.core``, ``inferline.queueing``,
``inferline.selection``, ``inferline.velox``, ``inferline.adapters``).
"""

from inferline.core import (
    DEFAULT_CATALOG,
    HardwareCatalog,
    InferlineError,
    ModelConfig,
    Pipeline,
    Plan,
    Profiles,
    ValidationError,
    gamma_trace,
    load_pipeline,
    load_plan,
    load_profiles,
    load_trace,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_CATALOG",
    "HardwareCatalog",
    "InferlineError",
    "ModelConfig",
    "Pipeline",
    "Plan",
    "Profiles",
    "ValidationError",
    "__version__",
    "gamma_trace",
    "load_pipeline",
    "load_plan",
    "load_profiles",
    "load_trace",
]
