"""Roles: several policies in one run (issue 26).

A role is the run's model with its own instruction and its own view of the data row (``role_adapters: shared``),
optionally with its own LoRA adapter on the shared base model (``role_adapters: lora``, with ``use_lora: true``):
one adapter per role, named after it, trained only on that role's rows; or a separate model
(``role_adapters: separate``): every role its own full copy of the run's model (:class:`RoleModels`), trained only
on its rows. The ``team`` rollout (grpolab/rollouts/team.py) plays the roles; the causal LM policy
(grpolab/policies/causal_lm/policy.py) creates the adapters or copies and routes each row to its role's.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

import torch

from .errors import ConfigError
from .registry import param

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
ROLES = param(["scout", "solver"], "team: the roles (names, or {name, prompt, view, trainable} mappings); each is "
              "the run's model with its own instruction and view")
TEAM_ANSWER_ROLE = param(None, "team: the role whose final message the task's rewards score (default: the last "
                         "role)")
ROLE_ADAPTERS = param("shared", "team: shared (every role is the run's model), lora (one LoRA adapter per role "
                      "on the shared base, named after the role; needs use_lora: true) or separate (every role its "
                      "own full copy of the model)", ["shared", "lora", "separate"])


@dataclass(frozen=True)
class Role:
    """One role of a team: the run's model with its own instruction and view of the row."""
    name: str
    prompt: str = ""
    view: str | None = None
    trainable: bool = True


def parse_roles(spec) -> list[Role]:
    """``roles`` as :class:`Role` objects; errors name the bad entry and the valid form."""
    form = ("roles: a list of at least two role names, or of {name, prompt, view, trainable} mappings, e.g. "
            "[{name: scout, view: scout_facts}, {name: solver, view: solver_facts}]")
    if isinstance(spec, str):
        spec = [s.strip() for s in spec.split(",") if s.strip()]
    if not isinstance(spec, (list, tuple)) or len(spec) < 2:
        raise ConfigError(f"{form}; got {spec!r}")
    out = []
    for i, r in enumerate(spec):
        if isinstance(r, str):
            r = {"name": r}
        if not isinstance(r, dict) or "name" not in r:
            raise ConfigError(f"roles[{i}]: {r!r} has no name; {form}")
        unknown = sorted(set(r) - {"name", "prompt", "view", "trainable"})
        if unknown:
            raise ConfigError(f"roles[{i}] ({r['name']}): unknown key(s) {', '.join(unknown)}; valid keys: name, "
                              f"prompt, view, trainable")
        if not isinstance(r["name"], str) or not _NAME.match(r["name"]):
            raise ConfigError(f"roles[{i}]: name {r['name']!r} must be a letter then letters, digits or _")
        if not isinstance(r.get("trainable", True), bool):
            raise ConfigError(f"roles[{i}] ({r['name']}): trainable must be true or false")
        out.append(Role(r["name"], str(r.get("prompt") or ""), r.get("view"), r.get("trainable", True)))
    names = [r.name for r in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"roles: the name(s) {', '.join(dup)} appear more than once")
    if not any(r.trainable for r in out):
        raise ConfigError("roles: every role has trainable: false; at least one role must be trained")
    return out



def role_names(spec) -> list[str]:
    return [r.name for r in parse_roles(spec)]


class RoleModels(torch.nn.Module):
    """One model per role (``role_adapters: separate``): ``roles[name]`` is role ``name``'s model, a copy of the
    run's model at the start, trained only on that role's rows (the policy routes each row to its role's model).
    The attributes a trainer reads of a model (``config``, ``generation_config``, ``dtype``, ``device``) are the
    first role's; calling the container itself is an error (there is no one model to run)."""

    def __init__(self, models: dict):
        super().__init__()
        self.roles = torch.nn.ModuleDict(models)

    @property
    def names(self) -> list[str]:
        return list(self.roles.keys())

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "roles" or name.startswith("_"):
                raise
            return getattr(next(iter(self.roles.values())), name)

    def forward(self, *args, **kwargs):
        raise TypeError("role_adapters: separate: the run holds one model per role (RoleModels.roles[name]); "
                        "this code path runs one model for every row, which only the team rollout and the causal "
                        "LM policy's forward route by role")


@contextlib.contextmanager
def acting(module, name: str, mode: str, *, given: bool = True):
    """Role ``name`` about to sample with ``module`` (``mode``: the ``role_adapters`` value): yields the model to
    hand the sampler, ``module`` itself (shared), ``module`` with the role's LoRA adapter active (lora,
    :func:`role_adapter`) or the role's own model (separate). ``given`` False: ``module`` is the run's behaviour
    policy, which the sampler uses by default (or its vLLM engine): None is yielded, except for separate."""
    if mode == "separate":
        yield module.roles[name]
        return
    with role_adapter(module, name if mode == "lora" else None):
        yield module if given else None


@contextlib.contextmanager
def role_adapter(module, name: str | None):
    """Sample with role ``name``'s adapter active (``None``: nothing to switch); afterwards every adapter of
    ``module`` is trainable again and the adapter that was active before is active again (PEFT's
    ``set_adapter`` freezes the others)."""
    if name is None:
        yield
        return
    before = module.active_adapter
    module.set_adapter(name)
    try:
        yield
    finally:
        module.set_adapter(before)
        module.set_requires_grad(list(module.peft_config), True)


@contextlib.contextmanager
def per_row_adapters(module, names: list[str]):
    """Every forward of ``module`` inside routes row ``i`` through LoRA adapter ``names[i]`` (PEFT's mixed-batch
    LoRA forward, with gradients: each adapter gets gradients from its rows only). PEFT's own switch for this
    refuses modules in training mode; grpolab's models have no dropout, so the hooks are set here."""
    from peft.tuners.lora import LoraLayer

    def hook(layer, args, kwargs):
        kwargs["adapter_names"] = names
        return args, kwargs

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in module.modules()
               if isinstance(m, LoraLayer)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
