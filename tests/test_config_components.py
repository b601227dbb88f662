"""The config is the core keys plus the parameters of the components a run selects (docs/configuration.md)."""
import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
import yaml

from grpolab.cli import main
from grpolab.config import CORE_KEYS, Config
from grpolab.errors import ConfigError
from grpolab.recipes import recipe_overrides
from grpolab.registry import POLICIES, declared_params
from grpolab.train.metrics import read_metrics

# the default policy (causal_lm) is a selected component too: its own keys are in every text run's config
POLICY_KEYS = set(declared_params(POLICIES.get("causal_lm")))
LEGACY = Path(__file__).parent / "data" / "legacy_config_vade.yaml"


def capture(argv) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    return buf.getvalue()


def test_selected_components_bring_their_parameters_and_only_theirs():
    cfg = Config.build({"prompt_sampler": "vade", "vade_prior_alpha": 2.0})
    assert cfg.vade_prior_alpha == 2.0 and cfg.vade_step_decay == 0.99  # set, and the declared default
    assert set(cfg.params) == {k for k in cfg.params if k.startswith("vade_")} | POLICY_KEYS
    assert not hasattr(cfg, "gdro_window")  # a sampler this run does not select
    keys = list(cfg.to_dict())
    assert keys[:len(CORE_KEYS)] == CORE_KEYS and keys[len(CORE_KEYS):] == sorted(cfg.params)


def test_unknown_key_names_the_owner_and_the_valid_keys_for_this_run():
    with pytest.raises(ConfigError) as e:
        Config.build({"gdro_window": 3}, sources=["my.yaml"])
    msg = str(e.value)
    assert "my.yaml: unknown key 'gdro_window'" in msg and "prompt sampler/prompt_gdro" in msg
    assert "valid keys for this run:" in msg and "learning_rate" in msg
    with pytest.raises(ConfigError, match="did you mean learning_rate"):
        Config.build({"lerning_rate": 1e-5})
    with pytest.raises(ConfigError, match="vade_step_decay: invalid value"):
        Config.build({"prompt_sampler": "vade", "vade_step_decay": "fast"})
    with pytest.raises(ConfigError, match="gvpo_anchor: 'nowhere' is not valid; valid values: behavior, reference"):
        Config.build({"policy_loss": "gvpo", "gvpo_anchor": "nowhere", "micro_batch_size": 8})


def test_values_from_the_command_line_are_converted_by_the_declared_type():
    cfg = Config.build({"prompt_sampler": "prompt_gdro", "gdro_bin_edges": "0.2,0.8", "gdro_window": "6",
                        "gdro_init_pass": "0.25", "success_threshold": "0.5"})
    assert [float(x) for x in cfg.gdro_bin_edges] == [0.2, 0.8]
    assert cfg.gdro_window == 6 and cfg.gdro_init_pass == 0.25 and cfg.success_threshold == 0.5
    cfg = Config.build({"policy_loss": "cispo", "cispo_epsilon_low": "none"})
    assert cfg.cispo_epsilon_low is None


def test_dapo_overlong_settings_are_parameters_of_its_transform():
    """overlong_buffer / overlong_penalty_factor belong to reward transform overlong_penalty (one default, declared
    next to it), not to the core keys; the dapo recipe's YAML keys and the command-line flags still set them."""
    from grpolab.registry import REWARD_TRANSFORMS
    decl = REWARD_TRANSFORMS.params("overlong_penalty")
    assert decl["overlong_buffer"].default == 4 and decl["overlong_penalty_factor"].default == 1.0
    assert "overlong_buffer" not in CORE_KEYS and "overlong_penalty_factor" not in CORE_KEYS
    cfg = Config.build(recipe_overrides("dapo"))
    assert cfg.overlong_buffer == 4 and cfg.overlong_penalty_factor == 1.0
    cfg = Config.build({"reward_transforms": "overlong_penalty", "overlong_buffer": "3",
                        "overlong_penalty_factor": "0.5"})  # as typed on the command line
    assert cfg.overlong_buffer == 3 and cfg.overlong_penalty_factor == 0.5
    out = yaml.safe_load(capture(["config", "--recipe", "dapo", "--overlong_buffer=2"]))
    assert out["overlong_buffer"] == 2 and out["overlong_penalty_factor"] == 1.0
    with pytest.raises(ConfigError, match="parameter of reward transform/overlong_penalty, which this run does not"):
        Config.build({"overlong_buffer": 3})


def test_config_command_shows_core_keys_then_the_recipes_component_keys():
    out = yaml.safe_load(capture(["config", "--recipe", "vade"]))
    keys = list(out)
    assert keys[:len(CORE_KEYS)] == CORE_KEYS
    assert keys[len(CORE_KEYS):] == sorted([k for k in keys if k.startswith("vade_")] + list(POLICY_KEYS))
    assert out["prompt_sampler"] == "vade"
    plain = yaml.safe_load(capture(["config", "--dynamic_sampling", "false"]))
    assert list(plain) == CORE_KEYS + sorted(POLICY_KEYS)  # GRPO on arithmetic: only the text policy's keys
    job = yaml.safe_load(capture(["config"]))  # the default job: arithmetic's dynamic sampling brings its keys
    assert list(job) == CORE_KEYS + sorted([k for k in job if k.startswith("dynamic_sampling_")] + list(POLICY_KEYS))
    table = capture(["config", "--recipe", "vade", "--markdown"])
    assert "| `vade_prior_alpha` | `1.0` |" in table and "prompt sampler/vade" in table


def test_recipes_set_only_keys_of_their_components():
    from grpolab.recipes import recipe_names
    for name in recipe_names():
        rec = recipe_overrides(name)
        cfg = Config.build({**rec, "model": "tiny"})
        assert set(rec) <= set(cfg.to_dict()), name


def test_run_folder_config_of_an_older_grpolab_still_resumes(tmp_path, tiny_args):
    """A config.yaml written before components owned their parameters (every variant key, 355 lines) resumes:
    the selected sampler's settings are kept, the other components' keys are dropped with a note."""
    out = tmp_path / "run"
    legacy = yaml.safe_load(LEGACY.read_text())
    assert len(legacy) > 300 and legacy["vade_prior_alpha"] == 2.0 and "gdro_window" in legacy
    # a checkpoint at step 1 (the checkpoint format did not change), then the old config.yaml in its place
    args = {**tiny_args, **{k: legacy[k] for k in ("recipe", "prompt_sampler", "prompts_per_step",
                                                   "num_generations", "micro_batch_size", "vade_prior_alpha")},
            "steps": 1, "save_steps": 1, "out": str(out)}
    assert main(["train", "--quiet"] + [f"--{k}={v}" for k, v in args.items()]) == 0
    shutil.copy(LEGACY, out / "config.yaml")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert main(["train", "--resume", str(out), "--steps", "2", "--quiet"]) == 0
    assert "keys of components this run does not select were ignored" in err.getvalue()
    assert [r["step"] for r in read_metrics(out)] == [1, 2]
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["vade_prior_alpha"] == 2.0 and "gdro_window" not in saved and saved["steps"] == 2
    assert json.loads((out / "summary.json").read_text())["skipped_steps"] == 0


def test_a_bad_key_in_a_new_run_is_still_an_error_on_the_command_line(tmp_path, capsys):
    assert main(["train", "--model", "tiny", "--task", "repeat", "--vade_prior_alpha", "2",
                 "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'vade_prior_alpha'" in err and "prompt sampler/vade" in err
    assert not (tmp_path / "r").exists()
