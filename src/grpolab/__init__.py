"""grpolab: group-relative policy optimisation and its published variants."""
from . import catalog  # noqa: F401  (every built-in component registers itself before any config is built)
from .batch import ENVIRONMENT, INJECTED, SAMPLED, RolloutBatch
from .config import Config
from .errors import ConfigError

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "GRPOConfig", "GRPOTrainer", "RolloutBatch", "SAMPLED", "INJECTED",
           "ENVIRONMENT"]


def __getattr__(name: str):
    """``GRPOConfig`` / ``GRPOTrainer`` (the TRL drop-in, grpolab/api.py) load on first use: the trainer's
    imports (transformers, the model code) stay out of ``import grpolab``."""
    if name in ("GRPOConfig", "GRPOTrainer"):
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'grpolab' has no attribute '{name}'")
