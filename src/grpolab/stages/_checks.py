"""The start-up check the stages, update strategies and collectors share: a config key's lower bound."""
from __future__ import annotations

from ..errors import ConfigError


def require_at_least(cfg, low, *keys: str) -> None:
    """Each of the config ``keys``, in order, ``>= low``; the first below it is a ConfigError naming the key, the
    bound and the value (``"<key>: must be >= <low>, got <value>"``)."""
    for key in keys:
        if getattr(cfg, key) < low:
            raise ConfigError(f"{key}: must be >= {low}, got {getattr(cfg, key)}")
