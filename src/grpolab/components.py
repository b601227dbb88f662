"""How the pipeline calls a registered component.

A component is a function (pure) or a class (stateful: it has ``state_dict`` /
``load_state_dict`` and is checkpointed). Its parameters are filled by name:

1. from the *inputs* the pipeline stage offers (e.g. ``rewards``,
   ``group_ids``, ``reward_matrix``, ``lengths`` for advantages; ``logprobs``,
   ``old_logprobs``, ``advantages``, ``mask``, ``ref_logprobs``, ``entropy``
   for losses and regularisers);
2. otherwise, for a keyword-only parameter, from the config key of the same
   name: a core key (``epsilon``, ``max_completion_length``, ...) or a
   parameter the component declared with ``registry.param`` (the run's
   ``cfg.params``);
3. otherwise the parameter's default.

A class is instantiated once with its ``__init__`` keyword-only parameters
(and the ``fixed`` arguments the caller passes, e.g. a sampler's ``num_rows``);
its ``__call__`` is then resolved like a function. So a new variant is a
function or class with its parameters, and a recipe — never a branch in the
trainer.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from .config import Config
from .errors import ConfigError


def config_kwargs(fn: Callable, cfg: Config, skip: set[str] = frozenset(),
                  keyword_only: bool = False) -> dict[str, Any]:
    """Parameters of ``fn`` named like a config key (core key or component parameter), with the config's value.

    ``keyword_only``: only keyword-only parameters (a task's positional ``seed`` never reads the training seed).
    A keyword-only parameter without a default that the config does not have is an error."""
    out = {}
    for p in inspect.signature(fn).parameters.values():
        if p.name in skip or p.name == "self" or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        if keyword_only and p.kind != p.KEYWORD_ONLY:
            continue
        if p.name in cfg.params or p.name in type(cfg).field_names():
            out[p.name] = getattr(cfg, p.name)
        elif p.default is inspect.Parameter.empty and p.kind == p.KEYWORD_ONLY:
            raise ConfigError(f"{getattr(fn, '__qualname__', fn)} needs config key '{p.name}', which this run "
                              f"does not have (neither a core key nor a parameter of a selected component)")
    return out


class Component:
    """A resolved component: call it with the stage's inputs.

    ``fixed``: constructor arguments the caller supplies for a class (e.g. ``num_rows`` and ``seed`` of a
    prompt sampler); they win over config keys of the same name.
    """

    def __init__(self, obj: Callable, cfg: Config, name: str = "", **fixed: Any):
        self.name = name or getattr(obj, "__name__", str(obj))
        if inspect.isclass(obj):
            self.fn = obj(**{**config_kwargs(obj.__init__, cfg, set(fixed)), **fixed})
            target = self.fn.__call__ if callable(self.fn) else None
        else:
            self.fn = obj
            target = obj
        self.params = [] if target is None else [p for p in inspect.signature(target).parameters.values()
                                                 if p.name != "self"]
        self.fixed = {} if target is None else config_kwargs(target, cfg)

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
