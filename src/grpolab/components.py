"""How the trainer calls registered components.

A component is a function (pure) or a class (stateful: it has ``state_dict`` /
``load_state_dict`` and is checkpointed). Its parameters are filled by name:

1. from the *inputs* the pipeline stage offers (e.g. ``rewards``,
   ``group_ids``, ``reward_matrix``, ``lengths`` for advantages; ``logprobs``,
   ``old_logprobs``, ``advantages``, ``mask``, ``ref_logprobs``, ``entropy``
   for losses and regularisers);
2. otherwise from the config key ``prefix + name`` (keyword-only parameters);
3. otherwise the parameter's default.

A class is instantiated once with its ``__init__`` keyword-only parameters
taken from the config the same way; its ``__call__`` is then resolved like a
function. So a new variant adds a function or class, a config field per
parameter, and a recipe — never a branch in the trainer.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from .config import Config, ConfigError


def _config_kwargs(fn: Callable, cfg: Config, prefix: str, skip: set[str]) -> dict[str, Any]:
    out = {}
    for p in inspect.signature(fn).parameters.values():
        if p.name in skip or p.name == "self" or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        key = prefix + p.name
        if hasattr(cfg, key):
            out[p.name] = getattr(cfg, key)
        elif hasattr(cfg, p.name) and p.kind == p.KEYWORD_ONLY:
            out[p.name] = getattr(cfg, p.name)
        elif p.default is inspect.Parameter.empty and p.kind == p.KEYWORD_ONLY:
            raise ConfigError(f"{getattr(fn, '__qualname__', fn)} needs config key '{key}', which does not exist")
    return out


class Component:
    """A resolved component: call it with the stage's inputs."""

    def __init__(self, obj: Callable, cfg: Config, prefix: str = "", name: str = ""):
        self.name = name or getattr(obj, "__name__", str(obj))
        if inspect.isclass(obj):
            self.fn = obj(**_config_kwargs(obj.__init__, cfg, prefix, set()))
            target = self.fn.__call__
        else:
            self.fn = obj
            target = obj
        self.params = [p for p in inspect.signature(target).parameters.values() if p.name != "self"]
        self.fixed = _config_kwargs(target, cfg, prefix, set())

    @property
    def stateful(self) -> bool:
        return hasattr(self.fn, "state_dict") and hasattr(self.fn, "load_state_dict")

    def wants(self, name: str) -> bool:
        return any(p.name == name for p in self.params)

    def __call__(self, **inputs: Any):
        kwargs = {}
        for p in self.params:
            if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue
            if p.name in inputs:
                kwargs[p.name] = inputs[p.name]
            elif p.name in self.fixed:
                kwargs[p.name] = self.fixed[p.name]
            elif p.default is inspect.Parameter.empty:
                raise ConfigError(f"component '{self.name}' needs input '{p.name}', which this stage does not "
                                  f"provide (available: {', '.join(sorted(inputs))})")
        return self.fn(**kwargs)
