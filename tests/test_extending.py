"""docs/extending.md, followed to the letter: the user-code estimator, reward transform and rollout strategy it
prints are written to a temporary folder, imported, listed, configured (Python, command line, YAML) and trained."""
import importlib
import json
import re
import sys
from pathlib import Path

import pytest

from grpolab.cli import main
from grpolab.config import Config, ConfigError
from grpolab.registry import ADVANTAGES, REWARD_TRANSFORMS, ROLLOUT_STRATEGIES
from grpolab.train.metrics import read_metrics
from grpolab.train.trainer import Trainer

DOC = Path(__file__).parent.parent / "docs" / "extending.md"


def doc_module(name: str) -> str:
    """The Python block of docs/extending.md between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``."""
    m = re.search(rf"<!-- {re.escape(name)}:start -->\n```python\n(.*?)```\n<!-- {re.escape(name)}:end -->",
                  DOC.read_text(), flags=re.S)
    assert m, f"docs/extending.md has no {name} block"
    return m.group(1)


def _import_from_doc(tmp_path, monkeypatch, name: str, registry, key: str):
    """Write the docs' ``NAME.py`` block to a temporary folder and import it; yield its path, then unregister
    ``key`` from ``registry`` and forget the module (registries are global)."""
    path = tmp_path / "user" / f"{name}.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(doc_module(f"{name}.py"))
    monkeypatch.syspath_prepend(str(path.parent))
    sys.modules.pop(name, None)
    importlib.import_module(name)
    try:
        yield path
    finally:
        registry._items.pop(key, None)
        sys.modules.pop(name, None)


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """toy_estimator.py as printed in the docs."""
    yield from _import_from_doc(tmp_path, monkeypatch, "toy_estimator", ADVANTAGES, "toy_centered")


@pytest.fixture
def toy_transform(tmp_path, monkeypatch):
    """toy_transform.py as printed in section 4."""
    yield from _import_from_doc(tmp_path, monkeypatch, "toy_transform", REWARD_TRANSFORMS, "toy_length_cost")


@pytest.fixture
def self_check(tmp_path, monkeypatch):
    yield from _import_from_doc(tmp_path, monkeypatch, "self_check", ROLLOUT_STRATEGIES, "self_check")


def one_step(tiny_args, out, **kw):
    return {**tiny_args, "steps": 1, "save_steps": 1, "out": str(out), **kw}


def test_user_component_is_listed(toy, capsys):
    assert main(["components", "advantage", "--json"]) == 0
    comps = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    c = comps["toy_centered"]
    assert c["kind"] == "advantage" and Path(c["file"]) == toy.resolve() and c["line"] > 0
    assert c["summary"].startswith("Toy centred reward")
    (p,) = c["params"]
    assert p["key"] == "toy_scale" and p["default"] == 1.0 and p["help"].startswith("toy_centered:")
    # the line the docs print for `grpolab --import toy_estimator components advantage`
    assert f"toy_estimator.py:{c['line']}" in DOC.read_text()
    # the same through --import, as the docs say for the command line
    ADVANTAGES._items.pop("toy_centered")
    sys.modules.pop("toy_estimator")
    assert main(["--import", "toy_estimator", "components", "advantage"]) == 0
    assert "toy_centered" in capsys.readouterr().out and "toy_centered" in ADVANTAGES


def test_user_component_parameters_are_keys_of_runs_that_select_it(toy):
    cfg = Config.build({"advantage": "toy_centered", "toy_scale": 2.0})
    assert cfg.toy_scale == 2.0 and cfg.to_dict()["toy_scale"] == 2.0
    assert Config.build({"advantage": "toy_centered"}).toy_scale == 1.0
    with pytest.raises(ConfigError, match="toy_centered"):  # not selected: the error names its owner
        Config.build({"toy_scale": 2.0})
    with pytest.raises(ConfigError, match="unknown key 'toy_scael'"):
        Config.build({"advantage": "toy_centered", "toy_scael": 2.0})


def test_user_component_trains_python_cli_and_yaml(toy, tiny_args, tmp_path, capsys):
    runs = {}
    for scale in (1.0, 2.0):
        args = one_step(tiny_args, tmp_path / f"py{scale}", advantage="toy_centered", toy_scale=scale)
        Trainer(Config.build(args), log=lambda *a: None).train(progress=False)
        runs[scale] = read_metrics(args["out"])[0]
    a1, a2 = runs[1.0]["advantage_abs_mean"], runs[2.0]["advantage_abs_mean"]
    assert a1 > 0, "the step had no reward variance: the check says nothing"
    assert a2 == pytest.approx(2 * a1, rel=1e-5)  # same seed, same rollouts: the parameter reached the estimator
    assert runs[1.0]["reward_mean"] == runs[2.0]["reward_mean"]

    tiny_cli = []
    for k, v in one_step(tiny_args, tmp_path / "cli").items():
        tiny_cli += [f"--{k}", str(v)]
    assert main(["train", "--quiet", "--advantage", "toy_centered", "--toy_scale", "2", *tiny_cli]) == 0
    assert read_metrics(tmp_path / "cli")[0]["advantage_abs_mean"] == pytest.approx(a2, rel=1e-5)

    yml = tmp_path / "my_run.yaml"
    yml.write_text("advantage: toy_centered\ntoy_scale: 2.0\n")
    tiny_cli[tiny_cli.index("--out") + 1] = str(tmp_path / "yaml")
    assert main(["train", "--quiet", "--config", str(yml), *tiny_cli]) == 0
    assert read_metrics(tmp_path / "yaml")[0]["advantage_abs_mean"] == pytest.approx(a2, rel=1e-5)
    capsys.readouterr()
    assert main(["train", "--quiet", "--toy_scale", "2", *tiny_cli]) == 2  # GRPO run: not one of its keys
    assert "toy_centered" in capsys.readouterr().err


def test_doc_rollout_strategy_trains(self_check, tiny_args, tmp_path):
    """The rollout strategy of section 2: two model turns around an ENVIRONMENT nudge, scored by the strategy."""
    from grpolab.batch import ENVIRONMENT, SAMPLED

    args = one_step(tiny_args, tmp_path / "run", rollout_strategy="self_check", max_completion_length=6)
    t = Trainer(Config.build(args), log=lambda *a: None)
    seen = []
    strategy = t.strategy.fn

    def spy(*a, **kw):
        batch = strategy(*a, **kw)
        seen.append(batch)
        return batch
    t.strategy.fn = spy
    t.train(progress=False)
    (batch,) = seen
    row = batch.completion_attention_mask[0].bool()
    origins = batch.token_origin[0][row].tolist()
    assert ENVIRONMENT in origins and origins[0] == SAMPLED
    env = batch.token_origin == ENVIRONMENT
    assert not batch.completion_mask[env].any()  # the nudge is attended to, never trained on
    assert set(batch.span_ids[0][row].tolist()) <= {1, 2, 3}
    assert batch.group_ids.tolist() == sorted(batch.group_ids.tolist())
    row = read_metrics(args["out"])[0]
    assert "rollout/self_check_solved" in row


def test_doc_reward_transform_is_listed_configured_and_trains(toy_transform, tiny_args, tmp_path, capsys):
    """Section 4: the user's reward transform is listed with its parameter, is a key only of runs that select it,
    and lowers the logged reward_mean by exactly toy_cost * completion_len_mean / max_completion_length."""
    assert main(["components", "reward_transform", "--json"]) == 0
    (c,) = [c for c in json.loads(capsys.readouterr().out) if c["name"] == "toy_length_cost"]
    assert Path(c["file"]) == toy_transform.resolve() and [p["key"] for p in c["params"]] == ["toy_cost"]
    assert Config.build({"reward_transforms": ["toy_length_cost"]}).toy_cost == 0.5
    with pytest.raises(ConfigError, match="toy_length_cost"):  # not selected: the error names its owner
        Config.build({"toy_cost": 0.25})

    base_args = one_step(tiny_args, tmp_path / "base")
    Trainer(Config.build(base_args), log=lambda *a: None).train(progress=False)
    base = read_metrics(base_args["out"])[0]
    args = one_step(tiny_args, tmp_path / "py", reward_transforms=["toy_length_cost"], toy_cost=0.25)
    Trainer(Config.build(args), log=lambda *a: None).train(progress=False)
    run = read_metrics(args["out"])[0]
    assert run["completion_len_mean"] == base["completion_len_mean"] > 0  # same seed, same rollouts
    cost = 0.25 * base["completion_len_mean"] / tiny_args["max_completion_length"]
    assert run["reward_mean"] == pytest.approx(base["reward_mean"] - cost, abs=1e-6)
    assert {k: v for k, v in run.items() if k.startswith("rewards/")} == \
        {k: v for k, v in base.items() if k.startswith("rewards/")}  # the reward functions' own columns

    # the command line the section prints, through --import
    REWARD_TRANSFORMS._items.pop("toy_length_cost")
    sys.modules.pop("toy_transform")
    tiny_cli = []
    for k, v in one_step(tiny_args, tmp_path / "cli").items():
        tiny_cli += [f"--{k}", str(v)]
    assert main(["--import", "toy_transform", "train", "--quiet", "--reward_transforms", "toy_length_cost",
                 "--toy_cost", "0.25", *tiny_cli]) == 0
    assert read_metrics(tmp_path / "cli")[0]["reward_mean"] == pytest.approx(run["reward_mean"], abs=1e-6)
    doc = DOC.read_text()
    assert "grpolab --import toy_transform train --reward_transforms toy_length_cost --toy_cost 0.25" in doc
