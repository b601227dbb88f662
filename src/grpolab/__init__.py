"""grpolab: group-relative policy optimisation and its published variants."""
from .batch import ENVIRONMENT, INJECTED, SAMPLED, RolloutBatch
from .config import Config, ConfigError

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "RolloutBatch", "SAMPLED", "INJECTED", "ENVIRONMENT"]
