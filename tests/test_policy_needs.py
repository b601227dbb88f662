"""What the built-in components need from the policy (``register(..., needs=...)``, docs/design/policies.md §4).

Selecting a component that declared a capability is refused at start-up with a policy that lacks it; a static
check keeps the declarations honest (a component whose code reads text must say so); ``describe()`` and
``grpolab components`` show them.
"""
import ast
import inspect
import textwrap

import pytest

import grpolab.catalog  # noqa: F401  (registers every built-in component)
from grpolab.catalog import components_markdown, components_text, describe
from grpolab.config import Config, ConfigError
from grpolab.policies import CAPABILITIES, POLICIES, PolicyBase
from grpolab.registry import ALL_REGISTRIES, TASKS
from grpolab.tasks import Task

# registries whose config key takes a list of names
_LIST_KEYS = ("advantage_weightings", "regularizers", "reward_transforms", "batch_stages")

# declared components no config key selects, so no start-up check can refuse them (the declaration documents
# what they read and shows in `grpolab components`)
NOT_SELECTABLE = {
    "answer_key": "answer equivalences have no config key: they are named inside other components' parameters "
                  "(seed_equivalence, ...), never selected by a run",
}

# built-in components whose code mentions a text marker but that declare no `text`, and why
TEXT_EXEMPT: dict = {}  # none today: cppo_prune, eframe and repo_replay read the pad id from the context (ctx.pad_id)

# code (docstrings left out, as ast.unparse writes it: single quotes) that reads text: a tokenizer, decoded
# completions, chat templates, injected or environment spans, agent episode records, thinking tags
TEXT_MARKERS = (
    "tokenizer", ".decode(", "apply_chat_template", "INJECTED", "ENVIRONMENT", "columns['completion']",
    "'completion'", "completion_text(", "_texts(", "episodes_of(", "episode_records(", "EPISODE_COLUMN", "THINK",
)


@pytest.fixture
def bare_policy():
    """A policy with no capabilities at all, and a task that declares none, registered for one test (conftest
    removes both after it)."""
    @POLICIES.register("test_bare")
    class BarePolicy(PolicyBase):
        """A test policy: real-valued actions, no tokens, no text."""
        step = "action"
        capabilities = frozenset()
        description = "a test policy with no capabilities"

    @TASKS.register("test_bare_task")
    def bare_task(n_train: int = 4, n_eval: int = 2, seed: int = 0) -> Task:
        rows = [{"prompt": [0.0, 1.0]} for _ in range(n_train)]
        return Task("test_bare_task", rows, rows[:n_eval], rewards=[])

    return BarePolicy


def _declared():
    """``(kind, registry, registered name)`` of every built-in component that declared a need."""
    return [(kind, reg, name) for kind, reg in ALL_REGISTRIES.items() for name, _ in reg.items() if reg.needs(name)]


def _selection(reg, name: str) -> tuple[str, dict]:
    """``(the name as selected, the config layer selecting it)``; prefix components get a made-up rest (the
    config reads no file: a reward model or judge path is opened, a reasoning-gym data set built, only when the
    run starts)."""
    selected = name
    if reg.split(name + "x") == (name, "x"):  # a prefix entry (rg:, rm:, judge:)
        selected = name + ("chain_sum" if reg is TASKS else "some/path")
    if reg.key == "reward":
        return selected, {"reward": [selected]}
    if reg.key == "task":
        return selected, {"task": selected}
    if reg.switch:
        return selected, {reg.key: True}
    return selected, {reg.key: [selected] if reg.key in _LIST_KEYS else selected}


def test_every_declared_component_is_refused_with_a_policy_without_the_capability(bare_policy):
    base = {"model": "tiny", "task": "test_bare_task", "num_generations": 4, "micro_batch_size": 16,
            "policy": "test_bare"}
    Config.build(base)  # the bare policy with no declared component is a valid run
    declared = _declared()
    assert len(declared) > 40  # tasks, reward specs, rollouts, ... (docs/design/policies.md §4)
    checked = set()
    for kind, reg, name in declared:
        if kind in NOT_SELECTABLE:
            assert reg.key is None, f"{kind} has a config key now: check its components at start-up too"
            continue
        selected, layer = _selection(reg, name)
        with pytest.raises(ConfigError) as e:
            Config.build({**base, **layer})
        msg = str(e.value)
        need = reg.needs(name)[0]
        assert f"{reg.kind} '{selected}' needs a policy with {need} ({CAPABILITIES[need]})" in msg, (kind, name, msg)
        assert "policy 'test_bare' (a test policy with no capabilities) has none of the capabilities" in msg
        others = [n for n, p in POLICIES.items() if need in p.capabilities]
        assert others and f"Use policy {' or '.join(others)}" in msg, (kind, name, msg)
        checked.add(kind)
    assert {"task", "reward_spec", "rollout", "advantage", "weighting", "reward_transform", "prompt_sampler",
            "policy_loss", "regularizer", "stage", "update"} <= checked


def test_every_declared_capability_is_offered_by_some_policy():
    """No component waits for a policy that does not exist: each capability declared is some policy's. The
    causal LM keeps every capability a text component declares (declarations change no text run)."""
    offered = set().union(*(p.capabilities for _, p in POLICIES.items()))
    assert {c for _, reg, name in _declared() for c in reg.needs(name)} <= offered
    assert {"tokens", "text"} <= POLICIES.get("causal_lm").capabilities


def _code(obj) -> str:
    """A component's own code (the function or class; a registered parser's wrapped class), docstrings left out."""
    obj = getattr(obj, "__wrapped__", obj)
    tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    for node in ast.walk(tree):
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
                and isinstance(node.body[0].value.value, str)):
            node.body[0] = ast.Pass()
    return ast.unparse(tree)


def _text_readers() -> dict[tuple[str, str], list[str]]:
    out = {}
    for kind, reg in ALL_REGISTRIES.items():
        if kind == "policy":  # policies provide the capabilities (the causal LM's code is where text lives)
            continue
        for name, obj in reg.items():
            if not getattr(obj, "__module__", "").startswith("grpolab"):
                continue
            hits = [m for m in TEXT_MARKERS if m in _code(obj)]
            if hits:
                out[(kind, name)] = hits
    return out


def test_a_component_whose_code_reads_text_declares_it():
    readers = _text_readers()
    assert len(readers) > 30  # the markers find the text components (rollouts, transforms, reward specs, ...)
    undeclared = [f"{kind}/{name} reads {hits}" for (kind, name), hits in readers.items()
                  if "text" not in ALL_REGISTRIES[kind].needs(name) and (kind, name) not in TEXT_EXEMPT]
    assert not undeclared, "declare needs=('text',) at registration, or exempt with a reason: " + "; ".join(undeclared)
    # an exemption that is no longer needed (the code reads no text marker, or the component declares text) goes
    stale = [k for k in TEXT_EXEMPT if k not in readers or "text" in ALL_REGISTRIES[k[0]].needs(k[1])]
    assert not stale


def test_describe_and_the_listings_show_the_needs():
    entries = describe()
    assert all(isinstance(c["needs"], list) for c in entries)
    by_name = {(c["kind"], c["name"]): c for c in entries}
    assert by_name[("rollout", "agent")]["needs"] == ["text"]
    assert by_name[("task", "rg:NAME (reasoning-gym)")]["needs"] == ["text"]  # a prefix entry
    assert by_name[("regularizer", "entropy_bonus")]["needs"] == ["tokens"]
    assert by_name[("advantage", "group_zscore")]["needs"] == []
    md = components_markdown(describe("regularizer"))
    row = next(line for line in md.splitlines() if line.startswith("| `entropy_bonus`"))
    assert "*needs a policy with tokens*" in row
    assert "needs a policy" not in next(line for line in md.splitlines() if line.startswith("| `llds`"))
    text = components_text(describe("rollout"))
    assert "needs a policy with text" in text
