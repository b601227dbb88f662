"""Config validation, data loading and reward-function contract."""
import json

import pytest

from grpolab.cli import main
from grpolab.config import Config, ConfigError
from grpolab.data import DataError, load_jsonl
from grpolab.recipes import recipe_names, recipe_overrides
from grpolab.rewards import RewardFn, RewardScorer, check_signature, parse_reward_spec


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError) as e:
        Config.build({"learning_rat": 1.0})
    msg = str(e.value)
    assert "unknown key 'learning_rat'" in msg and "learning_rate" in msg and "num_generations" in msg


def test_bad_value_lists_valid_values():
    with pytest.raises(ConfigError, match="loss_aggregation: 'mean' is not valid; valid values: .*token_mean"):
        Config.build({"loss_aggregation": "mean"})
    with pytest.raises(ConfigError, match="steps: invalid value 'ten'"):
        Config.build({"steps": "ten"})
    with pytest.raises(ConfigError, match="num_generations: .* needs at least 2 per prompt"):
        Config.build({"num_generations": 1})


def test_precedence_recipe_then_file_then_cli():
    cfg = Config.build(recipe_overrides("dapo"), {"epsilon_high": 0.3}, {"steps": "7"})
    assert cfg.loss_aggregation == "token_mean" and cfg.epsilon_high == 0.3 and cfg.steps == 7


def test_recipes_exist_and_validate():
    assert {"grpo", "dr_grpo", "dapo"} <= set(recipe_names())
    for name in recipe_names():
        Config.build(recipe_overrides(name))


def test_recipes_cli_json(capsys):
    assert main(["recipes", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    by = {r["name"]: r for r in data}
    assert by["dapo"]["parameters"]["epsilon_high"] == 0.28
    assert by["dr_grpo"]["seed"] == "000-107" and "arXiv" in by["grpo"]["citation"]
    assert by["grpo"]["components"]["advantage"] == "group_zscore"


def test_unknown_recipe_cli(capsys, tmp_path):
    assert main(["train", "--recipe", "nope", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "unknown recipe 'nope'" in err and "dapo" in err and "grpo" in err


def test_unknown_key_cli(capsys, tmp_path):
    assert main(["train", "--stepz", "3", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'stepz'" in err and "did you mean steps" in err


def test_malformed_jsonl_names_file_and_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt": "a"}\n\n{"prompt": "b",}\n')
    with pytest.raises(DataError, match=r"d.jsonl:3: not valid JSON"):
        load_jsonl(p)
    p.write_text('{"prompt": "a"}\n{"question": "b"}\n')
    with pytest.raises(DataError, match=r"d.jsonl:2: missing key 'prompt'"):
        load_jsonl(p)
    p.write_text('{"prompt": [{"content": "x"}]}\n')
    with pytest.raises(DataError, match=r"d.jsonl:1: 'prompt' must be"):
        load_jsonl(p)


def test_reward_parameter_not_a_column():
    def needs_solution(prompts, completions, solution, **kw):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match="parameter 'solution'.*no column 'solution'.*columns: answer"):
        check_signature(RewardFn("needs_solution", needs_solution), {"answer"})
    check_signature(RewardFn("ok", needs_solution), {"solution"})


def test_reward_spec_parsing(tmp_path, monkeypatch):
    (tmp_path / "myrewards.py").write_text("def f(completions, **kw):\n    return [1.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    r = parse_reward_spec("myrewards:f=0.5")
    assert r.name == "f" and r.weight == 0.5
    with pytest.raises(ValueError, match="no function 'g'"):
        parse_reward_spec("myrewards:g")
    with pytest.raises(ValueError, match="cannot import module"):
        parse_reward_spec("nomodule_xyz:f")
    with pytest.raises(ValueError, match="expected module:function"):
        parse_reward_spec("justaname")


def test_scorer_none_nan_and_raising():
    def half_none(completions, **kw):
        return [None if i % 2 else 1.0 for i in range(len(completions))]

    def boom(completions, **kw):
        raise RuntimeError("judge offline")

    logs = []
    s = RewardScorer([RewardFn("half", half_none), RewardFn("boom", boom)], log=logs.append)
    m, errors = s.score(["p"] * 4, ["c"] * 4, [[1]] * 4, {})
    assert errors == 1 and "judge offline" in logs[0]
    assert m[:, 0].tolist()[0] == 1.0 and m[1, 0].isnan() and bool(m[:, 1].isnan().all())


def test_config_reference_doc_is_current(capsys):
    """docs/configuration.md carries the output of `grpolab config --markdown`."""
    from pathlib import Path

    assert main(["config", "--markdown"]) == 0
    table = capsys.readouterr().out
    doc = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    assert table in doc, "regenerate: grpolab config --markdown"
    assert main(["config"]) == 0
    assert "learning_rate:" in capsys.readouterr().out


def test_components_doc_is_current(capsys):
    """docs/components.md carries the output of `grpolab components --markdown` (regenerate: make docs)."""
    from pathlib import Path

    assert main(["components", "--markdown"]) == 0
    tables = capsys.readouterr().out
    doc = (Path(__file__).parent.parent / "docs" / "components.md").read_text()
    assert tables in doc, "regenerate: make docs (scripts/regen_docs.py)"
    assert "## advantage: advantage estimator" in tables and "`group_zscore`" in tables


def test_components_command(capsys):
    """`grpolab components [KIND] [--json]`: kind, name, file:line, papers, parameters; an unknown kind names the
    valid ones."""
    import json

    assert main(["components", "advantage", "--json"]) == 0
    comps = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert {c["kind"] for c in comps.values()} == {"advantage"}
    gpg = comps["gpg"]
    assert gpg["file"] == "grpolab/algorithms/adv_baselines.py" and gpg["line"] > 0
    assert "2504.02546" in gpg["arxiv"] and "000-18" in gpg["seeds"]
    assert any(r["name"] == "gpg" for r in gpg["recipes"])
    alpha = next(p for p in gpg["params"] if p["key"] == "gpg_alpha")
    assert alpha["default"] == "valid" and alpha["choices"] == ["valid", "nonzero", "none"] and alpha["help"]
    assert main(["components"]) == 0
    text = capsys.readouterr().out
    assert "[rollout] rollout strategy (--rollout_strategy)" in text and "grpolab/algorithms/adv_baselines.py:" in text
    assert main(["components", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown component kind 'nope'" in err and "advantage" in err and "rollout" in err


def test_readme_recipe_table_is_current(capsys):
    """README.md carries the output of `grpolab recipes --markdown` (every recipe, with its paper)."""
    from pathlib import Path

    assert main(["recipes", "--markdown"]) == 0
    table = capsys.readouterr().out
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    assert "<!-- recipes:start -->\n" + table + "<!-- recipes:end -->" in readme, \
        "regenerate the README recipe table: grpolab recipes --markdown"
    assert table.count("\n") == len(recipe_names()) + 2
