"""Named registries of pluggable components, and how a component declares its parameters.

A leaf module: every registry of grpolab lives here, so a component imports the
registry it joins from below and no package imports its own implementations
back. Recipes and configs name components as data; users call them from their
own loops::

    from grpolab.registry import ADVANTAGES
    fn = ADVANTAGES.get("group_zscore")

A component **owns its parameters**: a keyword-only parameter whose default is
``param(default, help)`` is a config key of the runs that select the component,
with that default and help text, declared once, next to the code that uses it::

    @ADVANTAGES.register("my_estimator")
    def my_estimator(rewards, group_ids, *, my_scale: float = param(1.0, "My estimator: scale of ...")):
        ...

Registering replaces the ``param(...)`` default by its value, so the function
stays callable directly (``my_estimator(r, g)`` uses ``my_scale=1.0``). A
keyword-only parameter named like a core config key (``epsilon``,
``max_completion_length``, ...) is filled from that key and has no default of
its own. Several components that share one setting use the same ``Param``
object (declared once at module level).
"""
from __future__ import annotations

import copy
import inspect
from typing import Any, Callable, Generic, TypeVar

from .errors import UnknownComponentError

T = TypeVar("T")

__all__ = ["Registry", "Param", "param", "declared_params", "UnknownComponentError", "ALL_REGISTRIES",
           "CAPABILITIES", "declare_capability", "REPLACED_KEYS", "replaced_key_note"]


class Param:
    """The declaration of one component parameter: default, help text, valid choices."""

    __slots__ = ("default", "help", "choices", "name", "owners", "annotation")

    def __init__(self, default: Any, help: str, choices: list | None = None):
        self.default = default
        self.help = help
        self.choices = choices
        self.name: str | None = None  # the config key (the parameter's name), set at registration
        self.owners: list[str] = []   # "kind/name" of the components that take it
        self.annotation: str | None = None  # the parameter's type annotation, as written

    def value(self) -> Any:
        """A fresh copy of the default (lists and dicts are never shared between runs)."""
        return copy.deepcopy(self.default)

    def __repr__(self) -> str:
        return f"param({self.default!r}, {self.help!r})"


def param(default: Any, help: str, choices: list | None = None) -> Any:
    """Declare a component parameter (use as the default of a keyword-only parameter)."""
    return Param(default, help, choices)


def _targets(obj) -> list[Callable]:
    """The callables whose keyword-only parameters are an object's parameters."""
    if inspect.isclass(obj):
        return [f for f in (obj.__dict__.get("__init__"), obj.__dict__.get("__call__")) if f is not None]
    return [obj]


def _collect(obj, owner: str) -> dict[str, Param]:
    params = dict(getattr(obj, "__grpolab_params__", {}))
    for fn in _targets(obj):
        kwd = getattr(fn, "__kwdefaults__", None) or {}
        for key, value in list(kwd.items()):
            if isinstance(value, Param):
                if value.name not in (None, key):
                    raise ValueError(f"{owner}: parameter '{key}' reuses the declaration of '{value.name}'")
                value.name = key
                ann = getattr(fn, "__annotations__", {}).get(key)
                value.annotation = ann if isinstance(ann, str) or ann is None else getattr(ann, "__name__", str(ann))
                params[key] = value
                kwd[key] = value.default  # callable directly with the declared default
    for p in params.values():
        if owner is not None and owner not in p.owners:
            p.owners.append(owner)
    try:
        obj.__grpolab_params__ = params
    except (AttributeError, TypeError):  # builtins and the like: no parameters to keep
        pass
    return params


def declared_params(obj, *, owned: bool = True) -> dict[str, Param]:
    """The parameters ``obj`` (a function or class) declared with :func:`param`. ``owned=False``: collect them
    without naming ``obj`` as their owner (a base class whose subclasses register: only the registered names own
    the keys)."""
    if not hasattr(obj, "__grpolab_params__"):
        _collect(obj, getattr(obj, "__qualname__", repr(obj)) if owned else None)
    return dict(getattr(obj, "__grpolab_params__", {}))


class Registry(Generic[T]):
    """A name -> component mapping with helpful errors.

    ``register(name, check=fn)`` may attach a config check ``fn(cfg)`` that
    raises :class:`~grpolab.errors.ConfigError` for settings the component
    cannot work with (e.g. a pairwise objective with odd group sizes).

    Two declarations are checked before a run starts: ``min_group_size=2``
    (the component compares the completions of one prompt with each other,
    so ``num_generations`` below it leaves every advantage at 0) and
    ``columns=("hints",)`` (data columns every training row must have; or a
    function ``cfg -> column names`` when they depend on the component's
    parameters). ``needs=("text",)`` names the capabilities it needs from the
    policy (grpolab/policies/base.py): selecting it with a policy that lacks
    one is a start-up error.
    """

    def __init__(self, kind: str, key: str | None = None, switch: bool = False):
        self.kind = kind
        self.key = key  # the config key that selects from this registry (for messages and docs)
        # a switch registry: its key is a bool, and ``key: true`` selects the component named like the key
        self.switch = switch
        self._items: dict[str, T] = {}
        self._checks: dict[str, Callable] = {}
        self._prefixes: dict[str, str] = {}  # "rg:" -> how the rest of the name is read, for messages
        self._min_group: dict[str, int] = {}
        self._columns: dict[str, tuple | Callable] = {}
        self._needs: dict[str, tuple[str, ...]] = {}

    def register(self, name: str, *, check: Callable | None = None, prefix: str | None = None,
                 min_group_size: int = 1, columns: tuple | Callable | None = None,
                 needs: tuple[str, ...] = ()) -> Callable[[T], T]:
        """Register under ``name``; with ``prefix="WHAT"``, ``name`` is a prefix (``"rg:"``) and every
        ``name + WHAT`` resolves to this component, which receives ``WHAT`` as its first argument.
        ``min_group_size`` / ``columns`` / ``needs``: what the component needs (see the class docstring)."""
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            self._items[name] = obj
            if prefix is not None:
                self._prefixes[name] = prefix
            _collect(obj, f"{self.kind}/{name}")
            if check is not None:
                self._checks[name] = check
            if min_group_size > 1:
                self._min_group[name] = int(min_group_size)
            if columns:
                self._columns[name] = columns
            if needs:
                self._needs[name] = tuple(needs)
            return obj

        return deco

    def selection(self, name: str) -> str | None:
        """The config setting that selects ``name`` (``advantage: NAME``; a switch: ``dynamic_sampling: true``),
        or None for a registry no config key selects from."""
        if self.key is None:
            return None
        if self.switch:  # the field named like the component: a bool, or a count above 1 (steps_per_generation)
            return f"{self.key}: true" if name == self.key else f"{name}: 2 or more"
        return f"{self.key}: {name}"

    def split(self, name: str) -> tuple[str, str | None]:
        """``(registered name, rest)``: ``("rg:", "chain_sum")`` for a prefix entry, else ``(name, None)``."""
        if isinstance(name, str):
            for pre in self._prefixes:
                if name.startswith(pre) and len(name) > len(pre):
                    return pre, name[len(pre):]
        return name, None

    def get(self, name: str) -> T:
        key, _ = self.split(name)
        try:
            return self._items[key]
        except (KeyError, TypeError):
            raise UnknownComponentError(
                f"unknown {self.kind} '{name}'; valid: {', '.join(self.names())}"
            ) from None

    def check(self, name: str) -> Callable | None:
        """The config check registered with ``name`` (``None`` if it has none)."""
        return self._checks.get(name)

    def min_group_size(self, name: str) -> int:
        """Completions per prompt the component needs to produce a non-zero advantage (1 if it declared none)."""
        return self._min_group.get(self.split(name)[0], 1)

    def columns(self, name: str, cfg=None) -> list[str]:
        """Data columns every training row must have for the component (declared with ``columns=``)."""
        cols = self._columns.get(self.split(name)[0], ())
        return list(cols(cfg) if callable(cols) else cols)

    def needs(self, name: str) -> tuple[str, ...]:
        """Capabilities the component needs from the policy (``register(..., needs=("text",))``; see
        grpolab/policies/base.py CAPABILITIES)."""
        return self._needs.get(self.split(name)[0], ())

    def params(self, name: str) -> dict[str, Param]:
        return declared_params(self.get(name))

    def names(self) -> list[str]:
        return sorted(n + self._prefixes[n] if n in self._prefixes else n for n in self._items)

    def items(self) -> list[tuple[str, T]]:
        return sorted(self._items.items())

    def __contains__(self, name: str) -> bool:
        key, rest = self.split(name)
        return key in self._items and not (key in self._prefixes and rest is None)


# ------------------------------------------------------------ every registry
ADVANTAGES: Registry = Registry("advantage estimator", "advantage")
WEIGHTINGS: Registry = Registry("advantage weighting", "advantage_weightings")
POLICY_LOSSES: Registry = Registry("policy loss", "policy_loss")
REGULARIZERS: Registry = Registry("regularizer", "regularizers")
AGGREGATIONS: Registry = Registry("loss aggregation", "loss_aggregation")
KL_ESTIMATORS: Registry = Registry("KL estimator", "kl_estimator")
ANSWER_KEYS: Registry = Registry("answer equivalence")
REWARD_TRANSFORMS: Registry = Registry("reward transform", "reward_transforms")
REWARD_SPECS: Registry = Registry("reward spec", "reward")
TASKS: Registry = Registry("task", "task")
SAMPLERS: Registry = Registry("prompt sampler", "prompt_sampler")
ROLLOUT_STRATEGIES: Registry = Registry("rollout strategy", "rollout_strategy")
BATCH_STAGES: Registry = Registry("batch stage", "batch_stages")
UPDATE_STRATEGIES: Registry = Registry("update strategy", "update_strategy")
# how a step's batch is gathered when one rollout round is not enough (grpolab/stages/collectors.py);
# `dynamic_sampling: true` selects the component of that name (DAPO), `steps_per_generation: K` (K > 1) the
# one that decodes K steps' prompts in one call
COLLECTORS: Registry = Registry("collector", "dynamic_sampling", switch=True)
# the model being trained and how it acts (grpolab/policies/): the causal LM by default
POLICIES: Registry = Registry("policy", "policy")
# what a component may need from a policy (register(..., needs=...)), each with the line errors show; a policy
# class lists the ones it has in its ``capabilities``
CAPABILITIES: dict[str, str] = {
    "tokens": "actions are ids from a vocabulary: token entropies over the vocabulary, shared token prefixes, "
              "lengths in tokens",
    "text": "completions decode to text through a tokenizer and a chat template: text tasks and reward "
            "functions, thinking tags, tool calls, hints, injected text, agent episodes",
}


def declare_capability(name: str, help: str) -> str:
    """Declare a capability a policy kind offers and components may need (``register(..., needs=(name,))``),
    with the line errors show; a kind declares its own in its package (policies/<kind>/__init__.py), so a new
    kind edits no shared list. Declaring a name twice with another text is an error. Returns ``name``."""
    if CAPABILITIES.get(name, help) != help:
        raise ValueError(f"capability '{name}' is already declared as {CAPABILITIES[name]!r}")
    CAPABILITIES[name] = help
    return name
# builders of generation engines (grpolab/generation/engines.py); no component: their settings are core keys
GENERATION_ENGINES: Registry = Registry("generation engine")

ALL_REGISTRIES: dict[str, Registry] = {
    "advantage": ADVANTAGES, "weighting": WEIGHTINGS, "policy_loss": POLICY_LOSSES, "regularizer": REGULARIZERS,
    "aggregation": AGGREGATIONS, "kl": KL_ESTIMATORS, "answer_key": ANSWER_KEYS, "reward_transform": REWARD_TRANSFORMS,
    "reward_spec": REWARD_SPECS, "task": TASKS, "prompt_sampler": SAMPLERS, "rollout": ROLLOUT_STRATEGIES,
    "stage": BATCH_STAGES, "update": UPDATE_STRATEGIES, "collector": COLLECTORS,
    "policy": POLICIES,
}


# ------------------------------------------------------------ config keys that were replaced
# A config key no component takes any more -> (the key that replaced it, the components that took it). A config
# or recipe that still sets one is told what replaced it (replaced_key_note); a resumed run folder whose
# config.yaml gives one of its selected components' old keys another value than the replacement's is refused
# (cli.py), so that a resumed run never silently changes meaning.
_SAMPLER, _ROLLOUT = "prompt sampler", "rollout strategy"
REPLACED_KEYS: dict[str, tuple[str, tuple[str, ...]]] = {
    # issue 23: one shared "a completion is a success" threshold, the core key success_threshold (scalar reward
    # >= it); every key below had the same default and rule. Kept, because their papers set their own value or
    # comparison: dcpo_success_threshold, sgrpo_success_threshold, lead_correct_threshold (and
    # shaping_correct_threshold, which tests one reward column, not the scalar reward).
    f"{old}_success_threshold": ("success_threshold", tuple(owners)) for old, owners in (
        ("knapsack", [f"{_SAMPLER}/knapsack"]),
        ("ar3po", [f"{_SAMPLER}/ar3po", f"{_ROLLOUT}/ar3po"]),
        ("gain_rl", [f"{_SAMPLER}/gain_rl"]),
        ("auto_group", [f"{_SAMPLER}/auto_group"]),
        ("erpo", [f"{_SAMPLER}/erpo"]),
        ("rgdro", [f"{_SAMPLER}/rollout_gdro"]),
        ("vade", [f"{_SAMPLER}/vade"]),
        ("vas", [f"{_SAMPLER}/vas"]),
        ("srpo", [f"{_SAMPLER}/srpo_history"]),
        ("gdro", [f"{_SAMPLER}/prompt_gdro"]),
        ("scaf", [f"{_ROLLOUT}/scaf_grpo"]),
        ("guide", [f"{_ROLLOUT}/guide"]),
        ("ghpo", [f"{_ROLLOUT}/ghpo"]),
        ("gcpo", [f"{_ROLLOUT}/gcpo_reference"]),
        ("dagrpo", [f"{_ROLLOUT}/dagrpo_anchors"]),
        ("thinktuning", [f"{_ROLLOUT}/thinktuning"]),
        ("edge_gec", [f"{_ROLLOUT}/edge_correction"]),
    )
}


def replaced_key_note(key: str) -> str | None:
    """What replaced the config key ``key`` (None when it was not replaced): the end of an "unknown key 'KEY'"
    message."""
    if key not in REPLACED_KEYS:
        return None
    new, owners = REPLACED_KEYS[key]
    return (f"it was a parameter of {', '.join(owners)}, replaced by the key '{new}': set {new} instead "
            f"(`grpolab config {new}` explains it)")


#: The rubric critics' factory (GRAPE's ``grape_critic``): set by ``rewards/rubric.py`` (``get_critic``), read by
#: ``algorithms/adv_grape.py``, so that the advantage does not import the rewards package (layers point one way)
RUBRIC_CRITICS: dict = {}
