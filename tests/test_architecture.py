"""The architecture's rules, checked on the source: imports point one way (docs/architecture.md), and every
component parameter is declared once, next to its component."""
import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

import grpolab
from grpolab.config import CORE_KEYS, Config, ConfigError
from grpolab.registry import POLICIES, ALL_REGISTRIES, Param, declared_params

SRC = Path(grpolab.__file__).parent

# From the ground up: a module may import from its own layer or below (docs/architecture.md). "kinds" are the
# packages of grpolab/policies other than its __init__ and base.py: one per policy kind (policies/<kind>/) and the
# shared code of several kinds (policies/_<name>/).
LAYERS = [
    {"errors", "registry", "sandbox"},
    {"batch", "data", "config", "components", "devices", "recipes", "roles", "media"},
    {"algorithms", "model"},
    {"generation", "policies"},
    {"rewards", "tasks", "prompts", "rollouts", "stages", "agents"},
    {"kinds"},
    {"catalog", "train", "distributed", "experiments"},
    {"cli", "bench", "compare", "report", "api", "__main__", "__init__"},
]


def kind_of(module: str) -> str | None:
    """The policy-kind package a module belongs to (``grpolab.policies.ddpm.policy`` -> ``ddpm``; shared code:
    ``_image``), None outside them (``grpolab.policies.base`` is the interface, not a kind)."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "policies" and parts[2] != "base":
        return parts[2]
    return None


def layer_of(module: str) -> int:
    parts = module.split(".")
    top = "kinds" if kind_of(module) else parts[1] if len(parts) > 1 else "__init__"
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module}: top-level name '{top}' is in no layer; add it to LAYERS and "
                         f"docs/architecture.md")


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(target: str) -> str:
    """The module a dotted name refers to (``grpolab.x.y`` may be a module or a name in package ``x``)."""
    parts = target.split(".")
    while parts:
        base = SRC.parent.joinpath(*parts)
        if base.with_suffix(".py").exists() or (base / "__init__.py").exists():
            return ".".join(parts)
        parts = parts[:-1]
    raise AssertionError(f"cannot resolve {target}")


def imports_of(source: str, mod: str, is_package: bool) -> set[str]:
    """The grpolab modules that module ``mod`` imports, including imports inside functions.

    Read strictly: ``from M import x`` runs ``M`` (a package's ``__init__``) before it takes ``x`` from it, so it
    is an edge to ``M`` and, when ``M.x`` is a submodule, to ``M.x`` too (``from . import x`` in a package's
    module imports that package's ``__init__``)."""
    pkg = mod if is_package else mod.rsplit(".", 1)[0]
    edges: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "grpolab":
                continue
            edges.add(resolve(target))
            edges.update(resolve(f"{target}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Import):
            edges.update(resolve(a.name) for a in node.names if a.name.split(".")[0] == "grpolab")
    edges.discard(mod)
    return edges


def import_graph() -> dict[str, set[str]]:
    """Every grpolab-internal import of every module (:func:`imports_of`)."""
    return {module_name(path): imports_of(path.read_text(), module_name(path), path.name == "__init__.py")
            for path in SRC.rglob("*.py")}


def top_package(module: str) -> str:
    """The top-level name a module belongs to: ``grpolab.train.trainer`` -> ``train``; ``grpolab`` -> ``__init__``."""
    parts = module.split(".")
    if kind_of(module):
        return f"policies.{kind_of(module)}"  # each kind package is a package of its own
    return parts[1] if len(parts) > 1 else "__init__"


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between grpolab's top-level packages and modules (``train`` -> ``model``, ...)."""
    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        out.setdefault(top_package(a), set()).update(top_package(b) for b in targets)
    for a, targets in out.items():
        targets.discard(a)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if not state.get(v):
                found = visit(v)
                if found:
                    return found
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if not state.get(u):
            found = visit(u)
            if found:
                return found
    return None


def test_no_import_cycle_anywhere():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_between_packages():
    """Packages import each other one way too: no ``train`` -> ``distributed`` -> ``train``."""
    cycle = find_cycle(package_graph(import_graph()))
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle)


def test_imports_point_down_the_layers():
    upward = [f"{a} (layer {layer_of(a) + 1}) imports {b} (layer {layer_of(b) + 1})"
              for a, targets in import_graph().items() for b in targets if layer_of(b) > layer_of(a)]
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def test_the_checks_can_fail():
    """The two checks above find a planted cycle and a planted upward import."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert layer_of("grpolab.model.hf") < layer_of("grpolab.generation.sampling") < layer_of("grpolab.train.trainer")
    # the strict reading: `from . import x` imports the package's __init__ as well as x
    assert imports_of("from . import repeat", "grpolab.tasks.countdown", False) == {"grpolab.tasks",
                                                                                   "grpolab.tasks.repeat"}
    assert imports_of("from .. import catalog", "grpolab.train.trainer", False) == {"grpolab", "grpolab.catalog"}
    assert imports_of("from .repeat import x", "grpolab.tasks.countdown", False) == {"grpolab.tasks.repeat"}
    assert imports_of("from . import repeat", "grpolab.tasks", True) == {"grpolab.tasks.repeat"}
    assert package_graph({"grpolab.train.trainer": {"grpolab.distributed.launch", "grpolab.train.checks"},
                          "grpolab.distributed.launch": {"grpolab.train.checks"}}) == {
        "train": {"distributed"}, "distributed": {"train"}}


def test_no_private_helper_imported_across_packages():
    bad = []
    for path in SRC.rglob("*.py"):
        mod = module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 2:
                bad += [f"{mod}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert not bad, bad


# ------------------------------------------------------------------ one kind of component per module

# the module that holds every built-in component of a kind, and nothing of another kind; a home may be a package
# of family modules (grpolab.rewards.transforms: length.py, noise.py, ...), which then hold that kind only
HOME = {"policy_loss": "grpolab.algorithms.losses", "regularizer": "grpolab.algorithms.regularizers",
        "aggregation": "grpolab.algorithms.aggregation", "kl": "grpolab.algorithms.kl",
        "weighting": "grpolab.algorithms.weightings", "answer_key": "grpolab.algorithms.answer_keys",
        "reward_transform": "grpolab.rewards.transforms", "collector": "grpolab.stages.collectors"}


# kinds whose components are spread over one family module each: the packages that hold them
PACKAGE_HOME = {"advantage": ("grpolab.algorithms", "grpolab.agents"), "reward_spec": ("grpolab.rewards",),
                "task": ("grpolab.tasks",), "prompt_sampler": ("grpolab.prompts",),
                "rollout": ("grpolab.rollouts", "grpolab.agents"), "stage": ("grpolab.stages",),
                "update": ("grpolab.stages",), "policy": ("grpolab.policies",)}
# modules that define components of more than one kind, and why
MIXED = {"grpolab.agents.tree": "one method's tree rollout and the tree advantage it is scored with (TreeRL)"}


def test_every_kind_has_a_home_and_modules_hold_one_kind():
    """Each kind of component has a home (a module named for it, or the packages of its families), and a module
    defines components of one kind (MIXED lists the exceptions, with the reason)."""
    assert set(HOME) | set(PACKAGE_HOME) == set(ALL_REGISTRIES), "give the new kind a home (HOME or PACKAGE_HOME)"
    kinds: dict[str, set] = {}
    wrong = []
    for kind, reg in ALL_REGISTRIES.items():
        for name, obj in reg.items():
            mod = obj.__module__
            if not mod.startswith("grpolab."):
                continue
            kinds.setdefault(mod, set()).add(kind)
            if kind in PACKAGE_HOME and not kind_of(mod) and not mod.startswith(tuple(p + "." for p in PACKAGE_HOME[kind])):
                wrong.append(f"{kind} '{name}' is defined in {mod}, outside {' / '.join(PACKAGE_HOME[kind])}")
    wrong += [f"{mod} defines components of {len(k)} kinds ({', '.join(sorted(k))})"
              for mod, k in kinds.items() if len(k) > 1 and mod not in MIXED]
    assert not wrong, "\n".join(wrong)


def in_home(mod: str, home: str) -> bool:
    """``mod`` is the home module, or a module of the home package (``grpolab.rewards.transforms.length``)."""
    return mod == home or mod.startswith(home + ".")


def test_home_packages_import_every_module():
    """A home that is a package registers its components through its ``__init__`` (the catalogue imports the
    package, not its modules): every module of it is imported with ``import grpolab``."""
    import importlib
    import pkgutil
    import sys
    missing = [f"{home}.{m.name}" for home in HOME.values()
               for m in pkgutil.iter_modules(getattr(importlib.import_module(home), "__path__", []))
               if f"{home}.{m.name}" not in sys.modules]
    assert not missing, f"import these modules in their package's __init__: {missing}"


def test_each_kind_of_component_lives_in_the_module_named_for_it():
    built_in = [(kind, name, obj.__module__) for kind, reg in ALL_REGISTRIES.items() for name, obj in reg.items()
                if obj.__module__.startswith("grpolab.")]
    wrong = [f"{kind} '{name}' is defined in {mod}, not {HOME[kind]}" for kind, name, mod in built_in
             if kind in HOME and not in_home(mod, HOME[kind]) and not kind_of(mod)]
    wrong += [f"{mod} (the {home_kind} module) defines {kind} '{name}'" for kind, name, mod in built_in
              for home_kind, home in HOME.items() if in_home(mod, home) and kind != home_kind]
    assert not wrong, "\n".join(wrong)


# ------------------------------------------------------------------ parameters: declared once


def all_components():
    for kind, reg in ALL_REGISTRIES.items():
        for name, obj in reg.items():
            yield f"{kind}/{name}", obj


def keyword_only(obj):
    targets = [obj.__dict__.get("__init__"), obj.__dict__.get("__call__")] if inspect.isclass(obj) else [obj]
    for fn in targets:
        if fn is None:
            continue
        for p in inspect.signature(fn).parameters.values():
            if p.kind == p.KEYWORD_ONLY:
                yield p


# pipeline inputs a component may take as keyword-only arguments (filled from the stage's inputs, not the config)
INPUTS = {"lengths", "batch", "step", "reward_matrix", "reward_names", "prompt_uids", "truncated", "group_ids"}


def test_every_parameter_is_declared_once():
    """Each config key has one declaration (one Param object: one default, one help text); none shadows a
    core key; a keyword-only parameter named like a core key keeps the core default (or has none)."""
    decl: dict[str, Param] = {}
    core_defaults = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
                     for f in dataclasses.fields(Config)}
    problems = []
    for owner, obj in all_components():
        params = declared_params(obj)
        for key, p in params.items():
            if key in CORE_KEYS:
                problems.append(f"{owner}: parameter '{key}' shadows the core key")
            if key in decl and decl[key] is not p:
                problems.append(f"{owner}: '{key}' declared again (first by {', '.join(decl[key].owners)})")
            decl.setdefault(key, p)
        for p in keyword_only(obj):
            if p.name in params:
                continue
            if p.name in CORE_KEYS:
                if p.default is not inspect.Parameter.empty and p.default != core_defaults[p.name]:
                    problems.append(f"{owner}: '{p.name}' defaults to {p.default!r}, the core key to "
                                    f"{core_defaults[p.name]!r}")
            elif p.default is not inspect.Parameter.empty and p.name not in INPUTS:
                problems.append(f"{owner}: keyword-only '{p.name}' has a default but is neither a core key nor "
                                f"declared with param()")
    assert not problems, "\n".join(problems)
    assert len(decl) > 200  # the catalogue's parameters are all found


def test_every_declaration_has_help_and_a_valid_default():
    for owner, obj in all_components():
        for key, p in declared_params(obj).items():
            assert p.help and len(p.help) > 10, (owner, key)
            if p.choices is not None:
                assert p.default in p.choices, (owner, key, p.default, p.choices)


@pytest.mark.parametrize("kind", sorted(ALL_REGISTRIES))
def test_each_component_resolves_from_its_defaults(kind):
    """Selecting any component gives a valid config whose keys are the core keys plus its parameters."""
    reg = ALL_REGISTRIES[kind]
    if not reg.key or kind in ("reward_spec", "task"):
        return
    for name in reg.names():
        value = [name] if reg.key in ("advantage_weightings", "regularizers", "reward_transforms", "batch_stages") \
            else name
        if reg.switch:  # `dynamic_sampling: true` selects the collector of that name
            value = True
        base = {"model": "tiny", "task": "repeat", reg.key: value, "num_generations": 4, "micro_batch_size": 16}
        if name in ("dynamic_kl",) or name.startswith(("gvpo", "copg")):
            base["beta"] = 0.1
        if name == "auto_group_kl":  # per-group KL coefficients from the auto_group sampler's groups
            base.update(beta=0.1, prompt_sampler="auto_group")
        if name in ("training_free", "experience_prompt"):  # Training-Free GRPO: the library's keeper and its prompts
            base.update(update_strategy="training_free", rollout_strategy="experience_prompt")
        if name == "mashost_hrpo":  # MasHost's HRPO reads the per-action rewards of its construction rollout
            base.update(rollout_strategy="mas_build")
        if name == "better_together":  # optimises the prompts of an LM program's modules (mmGRPO, 000-23)
            base.update(rollout_strategy="lm_program", task="arithmetic")
        # built with the causal LM, else with the first policy that has what it needs and passes its check
        # (an image policy on an image task, or the trajectory task of a policy without images)
        candidates = [name] if kind == "policy" else [
            p for p in ["causal_lm", *POLICIES.names()] if set(reg.needs(name)) <= POLICIES.get(p).capabilities]
        errors = []
        for policy in candidates:
            caps, layers = POLICIES.get(policy).capabilities, dict(base)
            if "text" not in caps:
                layers = {**layers, "policy": policy, "task": "digits" if "images" in caps else "toy_planner"}
                del layers["model"]
            elif policy != "causal_lm":  # another text policy (masked_diffusion_lm): its built-in 'tiny', task repeat
                layers = {**layers, "policy": policy}
            try:
                cfg = Config.build(layers)
                break
            except ConfigError as e:
                errors.append(f"{policy}: {e}")
        else:
            raise AssertionError(f"{kind} '{name}' builds with no policy: " + "; ".join(errors))
        assert set(cfg.params) == set(cfg.component_params()), name
        assert set(declared_params(reg.get(name))) <= set(cfg.params), name


def test_every_module_of_the_component_packages_is_imported():
    """A new component is one new file: the catalogue imports every module of the component packages."""
    import pkgutil
    import sys

    from grpolab.catalog import COMPONENT_PACKAGES
    for pkg in COMPONENT_PACKAGES:
        for mod in pkgutil.iter_modules(pkg.__path__):
            assert f"{pkg.__name__}.{mod.name}" in sys.modules, f"{pkg.__name__}.{mod.name} is not imported"


# ------------------------------------------------------------------ the policy is the only seam


def kind_violations(graph: dict[str, set[str]]) -> list[str]:
    """The kind rules (docs/architecture.md): outside grpolab/policies' kind packages nothing imports one (the
    catalogue finds them by discovery), and a kind imports no other kind, only the shared packages (``_<name>``)."""
    bad = []
    for a, targets in graph.items():
        ka = kind_of(a)
        for b in targets:
            kb = kind_of(b)
            if kb is None or kb == ka:
                continue
            if ka is None:
                bad.append(f"{a} imports the policy kind package {b}: go through the policy (grpolab/policies/base.py)")
            elif not kb.startswith("_"):
                bad.append(f"{a} (kind {ka}) imports kind {kb} ({b}): move what both use to a shared policies/_<name>/")
            elif ka.startswith("_") and not kb.startswith("_"):
                bad.append(f"{a} (shared code) imports kind {kb}")
    return sorted(bad)


def test_nothing_outside_a_kind_imports_one_and_kinds_import_no_other_kind():
    bad = kind_violations(import_graph())
    assert not bad, "\n".join(bad)


def test_the_kind_rules_can_fail():
    g = {"grpolab.train.trainer": {"grpolab.policies.ddpm.policy", "grpolab.policies.base"},
         "grpolab.policies.ddpm.policy": {"grpolab.policies._image.flow", "grpolab.policies.ar_image.codebook"},
         "grpolab.policies._image.flow": {"grpolab.policies.base"}}
    bad = kind_violations(g)
    assert len(bad) == 2 and "grpolab.train.trainer imports" in bad[1] and "imports kind ar_image" in bad[0]


def test_every_policy_kind_is_one_package_named_for_it():
    """A registered policy ``X`` (a built-in) is defined in the package ``grpolab/policies/X/``, and every package
    there is a kind (one policy of that name) or shared code (``_<name>``, no policy)."""
    wrong = [f"policy '{name}' is defined in {cls.__module__}, not in grpolab.policies.{name}"
             for name, cls in POLICIES.items()
             if cls.__module__.startswith("grpolab.") and kind_of(cls.__module__) != name]
    packages = {p.name for p in (SRC / "policies").iterdir() if (p / "__init__.py").exists()}
    wrong += [f"grpolab/policies/{p}/ registers no policy named {p} (shared code is named _{p})"
              for p in sorted(packages) if not p.startswith("_") and p not in POLICIES]
    assert not wrong, "\n".join(wrong)


def test_a_new_kind_is_one_package_with_no_edit_elsewhere(tmp_path):
    """Discovery: a package dropped into grpolab/policies (here a copy of ``flow_frames`` under a new name, as a
    user would start a kind) registers its policy, its task and its capability when the catalogue is imported,
    with no shared list edited."""
    import shutil
    import subprocess
    import sys

    src = tmp_path / "src"
    shutil.copytree(SRC, src / "grpolab", ignore=shutil.ignore_patterns("__pycache__"))
    kind = src / "grpolab" / "policies" / "my_frames"
    shutil.copytree(src / "grpolab" / "policies" / "flow_frames", kind)
    for f in kind.glob("*.py"):
        f.write_text(f.read_text().replace('register("flow_frames"', 'register("my_frames"')
                     .replace('register("digit_frames"', 'register("my_digit_frames"'))
    (kind / "__init__.py").write_text('from ...registry import declare_capability\n\n'
                                      'declare_capability("my_capability", "what my kind offers")\n')
    code = ("import grpolab\nfrom grpolab.registry import CAPABILITIES, POLICIES, TASKS\n"
            "print(POLICIES.get('my_frames').__module__, 'my_digit_frames' in TASKS, 'my_capability' in CAPABILITIES)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == ["grpolab.policies.my_frames.policy", "True", "True"], out.stderr[-2000:]


#: The functions allowed past :data:`MAX_FUNCTION_LINES`: the trainer's step loop, which reads as the pipeline.
LONG_FUNCTIONS_ALLOWED = {("train/trainer.py", "_train")}
MAX_FUNCTION_LINES = 80


def test_no_function_over_80_lines_outside_the_trainers_pipeline():
    """Every function of the package is at most 80 lines: its signature (parameter declarations included) and
    body, blank and comment lines and nested functions included, its docstring not counted; but the trainer's
    ``_train`` (issue 40: long functions are split into named steps)."""
    long = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                        and isinstance(first.value.value, str):
                    n -= first.end_lineno - first.lineno + 1
                if n > MAX_FUNCTION_LINES and (rel, node.name) not in LONG_FUNCTIONS_ALLOWED:
                    long.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    assert not long, "functions over 80 lines (split them into named steps):\n" + "\n".join(long)
