"""Data as users keep it (docs/data.md): every --data format, column mapping, splits, held-out evaluation that
never uses training rows, and every recipe on a user's own JSONL task with one reward."""
import csv
import json
import os
import re

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only (datasets reads it on import)

import pytest

from grpolab.cli import recipe_layer
from grpolab.config import Config, ConfigError
from grpolab.data import DataError, load_data, load_user_data, parse_column_map, split_held_out
from grpolab.recipes import recipe_names
from grpolab.tasks import get_task
from grpolab.train.trainer import Trainer

ROWS = [{"prompt": f"say {i}:", "answer": str(i)} for i in range(12)]
CHAT = [{"prompt": [{"role": "user", "content": f"say {i}:"}], "answer": str(i)} for i in range(3)]


def write(path, rows, fmt):
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    elif fmt == "json_splits":
        path.write_text(json.dumps({"train": rows, "test": rows[:2]}))
    elif fmt == "csv":
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return path


@pytest.mark.parametrize("fmt,suffix", [("jsonl", "jsonl"), ("json", "json"), ("json_splits", "json"),
                                        ("csv", "csv")])
def test_stdlib_formats_load(tmp_path, fmt, suffix):
    rows = load_data(write(tmp_path / f"d.{suffix}", ROWS, fmt))
    assert list(rows) == ROWS


def test_csv_multiline_fields_keep_line_numbers(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text('question,answer\n"two\nlines",1\nok,2\n,3\n')
    with pytest.raises(DataError, match=r"d.csv:5: 'prompt' is empty"):
        load_data(p, column_map=parse_column_map(None, "question"))
    rows = load_data(write(tmp_path / "e.csv", [{"q": "a\nb", "a": "1"}, {"q": "c", "a": "2"}], "csv"),
                     column_map={"q": "prompt"})
    assert rows.where(1).endswith("e.csv:4") and rows[0]["prompt"] == "a\nb"


def test_conversational_and_standard_prompts(tmp_path):
    rows = load_data(write(tmp_path / "c.json", CHAT, "json"))
    assert rows[0]["prompt"] == [{"role": "user", "content": "say 0:"}]
    bad = [{"prompt": [{"role": "user", "content": 3}]}]
    with pytest.raises(DataError, match=r"b.json:item 1: message 1 of 'prompt' has a 'content' of type int"):
        load_data(write(tmp_path / "b.json", bad, "json"))


@pytest.mark.parametrize("fmt,suffix,where", [("jsonl", "jsonl", "d.jsonl:3"), ("json", "json", "d.json:item 3"),
                                               ("json_splits", "json", "d.json:train[3]"), ("csv", "csv", "d.csv:4")])
def test_errors_name_file_row_and_column(tmp_path, fmt, suffix, where):
    rows = [dict(r) for r in ROWS[:4]]
    rows[2]["prompt"] = 5 if fmt != "csv" else ""
    p = write(tmp_path / f"d.{suffix}", rows, fmt)
    if fmt == "csv":  # every CSV value is a string: an empty one is the error there
        with pytest.raises(DataError, match=rf"{re.escape(where)}: 'prompt' is empty"):
            load_data(p)
        with pytest.raises(DataError, match=r"d.csv:2: missing key 'prompt' \(column_map renames 'question'"):
            load_data(p, column_map={"question": "prompt", "prompt": "old_prompt"})
        return
    with pytest.raises(DataError, match=rf"{re.escape(where)}: 'prompt' must be a string"):
        load_data(p)


def test_column_map_and_prompt_column(tmp_path):
    src = [{"question": f"q{i}", "label": str(i)} for i in range(3)]
    p = write(tmp_path / "d.jsonl", src, "jsonl")
    rows = load_data(p, column_map=parse_column_map("label:answer", "question"))
    assert rows[1] == {"prompt": "q1", "answer": "1"}
    with pytest.raises(DataError, match="missing key 'prompt'.*--prompt_column"):
        load_data(p)
    with pytest.raises(DataError, match="'label' is not OLD:NEW"):
        parse_column_map("label")
    cfg = Config.build({"data": str(p), "prompt_column": "question", "column_map": "label:answer", "eval_split": 0,
                        "reward": ["x:y"]})
    train, held, info = load_user_data(cfg)
    assert train[0] == {"prompt": "q0", "answer": "0"} and len(held) == 0


def test_json_split_selection(tmp_path):
    p = write(tmp_path / "d.json", ROWS, "json_splits")
    assert len(load_data(p, split="test")) == 2
    with pytest.raises(DataError, match="has splits train, test and no 'dev'; choose one with --data_split"):
        load_data(p, split="dev")


def test_unknown_format_is_named(tmp_path):
    p = tmp_path / "d.txt"
    p.write_text("hi")
    with pytest.raises(DataError, match=r"unknown format '.txt'; valid: .jsonl"):
        load_data(p)


# ----------------------------------------------------------------------- formats that need `datasets`
def test_parquet_save_to_disk_and_folder(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the [data] extra: make test-data")
    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    assert list(load_data(tmp_path / "d.parquet")) == ROWS
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(str(tmp_path / "saved"))
    assert list(load_data(tmp_path / "saved")) == ROWS
    assert len(load_data(tmp_path / "saved", split="test")) == 2
    with pytest.raises(DataError, match="no 'dev'; choose one with --data_split"):
        load_data(tmp_path / "saved", split="dev")
    ds.save_to_disk(str(tmp_path / "one"))  # a single Dataset
    assert load_data(tmp_path / "one")[3] == ROWS[3]
    folder = tmp_path / "folder"  # a local dataset folder of data files, loaded offline
    folder.mkdir()
    write(folder / "train.csv", ROWS, "csv")
    assert load_data(folder)[5]["prompt"] == ROWS[5]["prompt"]  # (datasets reads the CSV's "5" as a number)
    bad = datasets.Dataset.from_list([{"question": "a"}, {"question": None}])
    bad.to_parquet(str(tmp_path / "b.parquet"))
    with pytest.raises(DataError, match=r"b.parquet:row 2: 'prompt' must be a string"):
        load_data(tmp_path / "b.parquet", column_map={"question": "prompt"})


# ----------------------------------------------------------------------- held-out evaluation
def test_held_out_split_is_disjoint_seeded_and_complete(tmp_path):
    rows = load_data(write(tmp_path / "d.jsonl", [{"prompt": f"p{i}"} for i in range(50)], "jsonl"))
    train, held = split_held_out(rows, 0.1, seed=0, cap=200)
    ids_t = {train.where(i) for i in range(len(train))}
    ids_h = {held.where(i) for i in range(len(held))}
    assert len(held) == 5 and len(train) == 45
    assert not ids_t & ids_h and len(ids_t | ids_h) == 50  # by row identity (file:line)
    assert [held.where(i) for i in range(5)] != [rows.where(i) for i in range(5)]  # not the first rows
    assert [r["prompt"] for r in split_held_out(rows, 0.1, 0, 200)[1]] == [r["prompt"] for r in held]  # seeded
    assert len(split_held_out(rows, 7, 0, 200)[1]) == 7  # a count
    assert len(split_held_out(rows, 30, 0, 4)[1]) == 4  # at most eval_problems
    with pytest.raises(DataError, match="leaves none to train on.*--eval_data"):
        split_held_out(rows, 50, 0, 200)


def test_eval_data_file_and_trainer_summary(tiny_args, tmp_path, monkeypatch):
    (tmp_path / "rw.py").write_text("def hit(completions, answer, **kw):\n"
                                    "    return [float(a in c) for c, a in zip(completions, answer)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = write(tmp_path / "data.jsonl", [{"prompt": f"say {i}:", "answer": str(i)} for i in range(20)], "jsonl")
    args = {**tiny_args, "data": str(data), "reward": ["rw:hit"], "steps": 1, "eval_after": True,
            "eval_problems": 50}
    del args["task"]
    logs = []
    t = Trainer(Config.build(args), log=logs.append)
    train_p = {r["prompt"] for r in t.rows}
    assert len(t.eval_rows) == 2 and not train_p & {r["prompt"] for r in t.eval_rows}
    summary = t.train(progress=False)
    assert summary["data"]["rows"] == 2 and summary["data"]["train_rows"] == 18 and summary["data"]["seed"] == 0
    stated = f"eval: 2 rows held out from {data}, seed 0; training on 18"
    assert stated in summary["data"]["statement"] and any(stated in m for m in logs)
    assert summary["after"]["n"] == 2 if "n" in summary["after"] else True
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["data"]["statement"] == summary["data"]["statement"]
    ev = write(tmp_path / "ev.csv", [{"prompt": "say 99:", "answer": "99"}], "csv")
    t2 = Trainer(Config.build({**args, "eval_data": str(ev), "out": str(tmp_path / "r2")}), log=logs.append)
    assert len(t2.rows) == 20 and [r["prompt"] for r in t2.eval_rows] == ["say 99:"]
    both = write(tmp_path / "both.json", {"train": ROWS, "test": [{"prompt": "say 77:", "answer": "77"}]}, "json")
    cfg = Config.build({**args, "data": str(both), "eval_data": str(both), "eval_data_split": "test"})
    train, held, _ = load_user_data(cfg)
    assert len(train) == 12 and [r["prompt"] for r in held] == ["say 77:"]
    tiny = write(tmp_path / "tiny.jsonl", ROWS[:4], "jsonl")  # 0.1 of 4 rows rounds to 0: said, not hidden
    t3 = Trainer(Config.build({**args, "data": str(tiny), "out": str(tmp_path / "r3")}), log=logs.append)
    assert len(t3.rows) == 4 and not t3.eval_rows
    assert any("eval: none (eval_split 0.1 of 4 rows rounds to 0; give --eval_data FILE)" in m for m in logs)


@pytest.mark.parametrize("task", ["arithmetic", "arithmetic_multistep"])  # `repeat` is a toy of 10 prompts
def test_builtin_task_eval_sets_disjoint_from_training(task):
    t = get_task(task, cfg=Config.build({"task": task}))
    key = (lambda r: json.dumps(r["prompt"], sort_keys=True))
    assert t.eval_rows and not {key(r) for r in t.train_rows} & {key(r) for r in t.eval_rows}


# ----------------------------------------------------------------------- every recipe on the user's data
ONE_REWARD = "def hit(completions, answer, **kw):\n    return [float(a in c) for c, a in zip(completions, answer)]\n"


# in reverse order: tests/test_training.py trains every recipe in alphabetical order at the same time on the other
# worker (`make test`), and each first builds its tiny pre-trained models; in the same order one worker would wait
# on the other's build of every model (model/cache.py's lock)
@pytest.mark.parametrize("recipe", sorted(recipe_names(), reverse=True))
def test_every_recipe_trains_on_user_data_or_names_the_column(recipe, tiny_args, tmp_path, monkeypatch):
    (tmp_path / "user_rw.py").write_text(ONE_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = write(tmp_path / "d.jsonl", [{"prompt": f"say {i}:", "answer": str(i)} for i in range(8)], "jsonl")
    user = {**{k: v for k, v in tiny_args.items() if k != "task"}, "data": str(data), "reward": ["user_rw:hit"],
            "steps": 1, "save_steps": 100, "prompts_per_step": 2, "num_generations": 2, "max_completion_length": 4,
            "eval_split": 0}  # (each recipe's checkpoint is tests/test_training.py::test_every_recipe_trains')
    try:
        cfg = Config.build(recipe_layer(recipe, user), user)
        t = Trainer(cfg, log=lambda *a: None)
        t.train(progress=False)
    except ConfigError as e:  # refusing is fine only when it names what the method needs from the data
        needs = re.search(r"column '\w+'|'\w+' column|is missing|no environment|num_generations must be", str(e))
        assert needs, str(e)  # (a StandInError: span ids that only multi-turn/tool rollouts mark; an agent
        #                       recipe's rollout on data without --tools / --env names the missing environment;
        #                       decentralised_grpo's horizontal exchange names the group size it needs)
        return
    assert t.step == 1


def test_issue_recipes_on_user_data_from_the_command_line(tmp_path, monkeypatch, capsys):
    """The issue's report: --recipe fgrpr / pm4grpo with --data and one reward stopped on the recipe's
    reward_weights. fgrpr now trains; pm4grpo keeps its method reward and names the column it needs."""
    from grpolab.cli import main
    (tmp_path / "user_rw.py").write_text(ONE_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = write(tmp_path / "d.jsonl", [{"prompt": f"say {i}:", "answer": str(i)} for i in range(8)], "jsonl")
    common = ["--model", "tiny", "--data", str(data), "--reward", "user_rw:hit", "--steps", "1",
              "--prompts_per_step", "2", "--num_generations", "2", "--max_completion_length", "4",
              "--eval_before", "false", "--eval_after", "false", "--tensorboard", "false", "--quiet"]
    assert main(["train", "--recipe", "fgrpr", *common, "--out", str(tmp_path / "f")]) == 0
    assert (tmp_path / "f" / "final").exists()
    assert main(["train", "--recipe", "pm4grpo", *common, "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "reward_weights" not in err and "'solution'" in err, err
    solved = write(tmp_path / "s.jsonl", [{"prompt": f"say {i}:", "answer": str(i), "solution": f"Step 1: {i}"}
                                          for i in range(8)], "jsonl")
    common[common.index(str(data))] = str(solved)
    assert main(["train", "--recipe", "pm4grpo", *common, "--out", str(tmp_path / "p2")]) == 0
