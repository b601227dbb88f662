"""Issue 23, the messages a newcomer reads: data errors that name the file and the line, one prompt format per
data set, warnings that start on their own line while a progress bar is drawn, help text as written, and
summary numbers as the user means them. Each test failed on the code before the fix."""
import json
import sys

import pytest
import torch

from grpolab import cli
from grpolab.config import Config
from grpolab.data import DataError, load_data


# ------------------------------------------------------------------------------- invalid UTF-8 in --data
@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv"])
def test_invalid_utf8_names_the_file_line_and_byte(tmp_path, suffix):
    good = {".jsonl": b'{"prompt": "one"}\n{"prompt": "two"}\n',
            ".json": b'[{"prompt": "one"},\n {"prompt": "two"},\n',
            ".csv": b'prompt,answer\none,1\ntwo,2\n'}[suffix]
    bad = {".jsonl": b'{"prompt": "caf\xe9"}\n', ".json": b' {"prompt": "caf\xe9"}]\n',
           ".csv": b'caf\xe9,3\n'}[suffix]
    path = tmp_path / f"latin1{suffix}"
    path.write_bytes(good + bad)
    with pytest.raises(DataError) as e:
        load_data(path)
    msg = str(e.value)
    offset = len(good) + bad.index(b"\xe9")
    line = good.count(b"\n") + 1
    assert f"{path}:{line}:" in msg and "UTF-8" in msg, msg
    assert f"byte {offset}" in msg and "0xe9" in msg, msg


def test_invalid_utf8_through_the_cli_is_one_line(tmp_path, capsys):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "\xff"}\n')
    rc = cli.main(["train", "--model", "tiny", "--data", str(path), "--reward", "grpolab.rewards:format_reward",
                   "--out", str(tmp_path / "run"), "--steps", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{path}:2" in err and "Traceback" not in err, err


# ------------------------------------------------------------------------------- mixed prompt formats
def test_mixed_chat_and_plain_rows_are_refused_naming_one_of_each(tmp_path):
    path = tmp_path / "mixed.jsonl"
    rows = [{"prompt": "plain one"}, {"prompt": "plain two"},
            {"prompt": [{"role": "user", "content": "chat three"}]}, {"prompt": "plain four"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as e:
        load_data(path)
    msg = str(e.value)
    assert f"{path}:1" in msg and f"{path}:3" in msg and "conversational" in msg and "standard" in msg, msg
    j = tmp_path / "mixed.json"
    j.write_text(json.dumps([rows[2], rows[0]]))
    with pytest.raises(DataError, match="item 1.*item 2|item 2.*item 1"):
        load_data(j)


def test_one_format_per_file_still_loads(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"q{i}"}]}) + "\n" for i in range(3)))
    assert len(load_data(path)) == 3


# ------------------------------------------------------------------------------- progress bar lines
def _bad_reward(prompts, completions, **kw):
    raise RuntimeError("boom in reward")


def _on_own_lines(err: str, needle: str) -> list[str]:
    """The text a terminal shows on each line that mentions ``needle`` (what follows the last carriage return)."""
    return [ln.split("\r")[-1] for ln in err.split("\n") if needle in ln]


def test_reward_errors_during_the_before_evaluation_start_on_their_own_line(tiny_args, capfd):
    from grpolab.rewards import RewardFn  # noqa: F401 - the reward spec below is a module path
    from grpolab.train.trainer import Trainer

    sys.modules[__name__]._bad_reward = _bad_reward
    cfg = Config.build({**tiny_args, "steps": 1, "eval_before": True, "eval_problems": 4,
                        "reward": [f"{__name__}:_bad_reward"]})
    t = Trainer(cfg)
    capfd.readouterr()
    t.train(progress=False)
    err = capfd.readouterr().err
    shown = _on_own_lines(err, "reward function '_bad_reward' raised")
    assert shown and all(s.startswith("[grpolab] reward function") for s in shown), shown


def test_an_error_in_the_before_evaluation_starts_on_its_own_line(tiny_args, capfd, monkeypatch):
    from grpolab.train import trainer as trainer_mod

    def failing(*a, progress=None, **kw):
        progress(1)
        raise ValueError("evaluation failed")

    monkeypatch.setattr(trainer_mod, "evaluate", failing)
    rc = cli.main(["train", "--model", "tiny", "--task", "repeat", "--steps", "1", "--out", tiny_args["out"],
                   "--eval_before", "true", "--max_completion_length", "4"])
    err = capfd.readouterr().err
    assert rc == 2 and "eval (before)" in err, err
    assert _on_own_lines(err, "evaluation failed") == ["grpolab: error: evaluation failed"], repr(err[-300:])


# ------------------------------------------------------------------------------- help text
def _all_help() -> dict[str, str]:
    from grpolab.bench import _parser as bench_parser
    from grpolab.compare import parser as compare_parser

    top = cli.build_parser()
    out = {"grpolab": top.format_help(), "grpolab compare": compare_parser().format_help(),
           "grpolab bench speed": bench_parser().format_help()}
    for name, sub in top._subparsers._group_actions[0].choices.items():
        out[f"grpolab {name} (stub)" if name == "compare" else f"grpolab {name}"] = sub.format_help()
    return out


def test_help_prints_percent_signs_once():
    pages = _all_help()
    assert "95% CI" in pages["grpolab compare"], pages["grpolab compare"]
    assert not {name for name, text in pages.items() if "%%" in text}


# ------------------------------------------------------------------------------- summary numbers
def test_evaluation_means_are_the_numbers_meant():
    """1 correct of 40 is 0.025, not float32's 0.02500000037252903; a reward of 0.1 averages to 0.1."""
    from grpolab.batch import RolloutBatch
    from grpolab.rewards import RewardFn
    from grpolab.train.evaluate import evaluate

    rows = [{"prompt": f"p{i}", "answer": str(i)} for i in range(40)]

    def rollout(chunk, uids):
        n = len(chunk)
        b = RolloutBatch(prompt_ids=torch.ones(n, 2, dtype=torch.long), prompt_mask=torch.ones(n, 2),
                         completion_ids=torch.ones(n, 3, dtype=torch.long), completion_mask=torch.ones(n, 3),
                         behavior_logprobs=torch.zeros(n, 3), group_ids=torch.tensor(uids),
                         prompt_uids=torch.tensor(uids), truncated=torch.zeros(n, dtype=torch.bool),
                         columns={"prompt": [r["prompt"] for r in chunk], "answer": [r["answer"] for r in chunk],
                                  "completion": ["0"] * n})
        return b

    def acc(prompts, completions, answer, **kw):
        return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]

    def tenth(prompts, completions, **kw):
        return [0.1] * len(completions)

    res = evaluate(None, rows, [RewardFn("acc", acc, 1.0), RewardFn("tenth", tenth, 0.0)],
                   accuracy_reward="acc", rollout=rollout, batch_size=16)
    assert res["accuracy"] == 0.025 and json.dumps(res["accuracy"]) == "0.025"
    assert res["rewards/tenth/mean"] == 0.1 and res["reward_mean"] == 0.025
    assert res["len_correct"] == 3.0
