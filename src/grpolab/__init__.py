"""grpolab: group-relative policy optimisation and its published variants."""
from . import catalog  # noqa: F401  (every built-in component registers itself before any config is built)
from .batch import ENVIRONMENT, INJECTED, SAMPLED, RolloutBatch
from .config import Config
from .errors import ConfigError

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "RolloutBatch", "SAMPLED", "INJECTED", "ENVIRONMENT"]
