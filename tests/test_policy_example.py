"""A new kind of policy is one class and its tests, with no edit to the trainer (docs/extending.md, section 5, whose
``bandit_policy.py`` block this file imports and trains).

The example is a 2-D Gaussian bandit: for a condition c (the prompt, a digit), an action a in R^2 is drawn from
N(mu_theta(c), I) in one step; log p(a | c) = -|a - mu|^2 / 2 - log(2 pi). The reward is -|a - target(c)|^2.
GRPO (group z-score advantages, the clipped ratio) must move mu towards the targets: the held-out reward of the
deterministic action a = mu rises by a margin on every seed.
"""
import importlib
import json
import sys

import pytest

from grpolab.config import Config
from grpolab.policies import POLICIES
from grpolab.train.trainer import Trainer

from test_extending import doc_module




@pytest.fixture
def bandit(tmp_path, monkeypatch):
    """The docs' ``bandit_policy.py`` block, imported from a user folder (conftest unregisters the policy after)."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "bandit_policy.py").write_text(doc_module("bandit_policy.py"))
    monkeypatch.syspath_prepend(str(user))
    sys.modules.pop("bandit_policy", None)
    importlib.import_module("bandit_policy")
    assert "gaussian_bandit" in POLICIES
    (tmp_path / "bandit_reward.py").write_text(
        "def near_target(prompts, completions, **kw):\n"
        "    out = []\n"
        "    for p, a in zip(prompts, completions):\n"
        "        t = (1.0 + 0.1 * int(p), -1.0)\n"
        "        out.append(-((a[0] - t[0]) ** 2 + (a[1] - t[1]) ** 2))\n"
        "    return out\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "conditions.jsonl"
    data.write_text("".join(json.dumps({"prompt": str(i % 10)}) + "\n" for i in range(40)))
    return data


def _run(data, out, seed):
    cfg = Config.build({"policy": "gaussian_bandit", "data": str(data), "reward": ["bandit_reward:near_target"],
                        "steps": 20, "prompts_per_step": 4, "num_generations": 8, "learning_rate": 0.1,
                        "seed": seed, "out": str(out), "eval_split": 10, "eval_before": True, "eval_after": True,
                        "save_steps": 10, "stall_steps": 0, "dtype": "float32", "log_completions_steps": 10})
    return Trainer(cfg, log=lambda *a: None).train(progress=False)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_policy_defined_outside_grpolab_trains_through_the_unchanged_trainer(bandit, tmp_path, seed):
    summary = _run(bandit, tmp_path / f"run{seed}", seed)
    before, after = summary["before"]["reward_mean"], summary["after"]["reward_mean"]
    # mu starts at 0: the held-out reward is -|target|^2 (-2.9 to -3.3 on these seeds' held-out conditions);
    # measured after 20 steps: -0.43, -0.38, -0.58 (seeds 0, 1, 2), a rise of 2.5 to 2.9; asserted: 1.0
    assert before < -2.0 and after > before + 1.0, (before, after)
    run = tmp_path / f"run{seed}"
    assert (run / "final" / "model.safetensors").exists()  # the policy's own save
    lines = [json.loads(s) for s in (run / "completions.jsonl").read_text().splitlines()]
    assert lines and set(lines[0]) >= {"prompt", "completion", "reward", "advantage"}


def test_a_text_component_is_refused_with_it(bandit):
    from grpolab.config import ConfigError
    with pytest.raises(ConfigError, match="needs a policy with text.*gaussian_bandit"):
        Config.build({"policy": "gaussian_bandit", "data": str(bandit), "reward": ["bandit_reward:near_target"],
                      "advantage_weightings": ["seed_semantic_entropy"]})


def test_the_command_line_trains_it_as_the_page_says(bandit, tmp_path):
    """`grpolab --import bandit_policy train --policy gaussian_bandit --data ... --reward ...` (docs/extending.md)."""
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "user"), str(tmp_path),
                                                         os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "cli_run"
    r = subprocess.run([sys.executable, "-m", "grpolab", "--import", "bandit_policy", "train", "--policy",
                        "gaussian_bandit", "--data", str(bandit), "--reward", "bandit_reward:near_target",
                        "--steps", "2", "--out", str(out), "--quiet"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "final" / "model.safetensors").exists() and (out / "summary.json").exists()
