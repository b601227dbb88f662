"""Training-Free GRPO (Cai et al., 2025, arXiv:2510.08191, seed 000-44): update strategy training_free and rollout
strategy experience_prompt. Expected libraries are written out by hand from the scripted LM replies."""
import json
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from grpolab.config import Config, ConfigError
from grpolab.recipes import recipe_overrides
from grpolab.stages.training_free import (EXPERIENCE_HEADER, ExperienceLibrary, Operation, OperationError,
                                          TrainingFree, parse_operations)

QUIET = {"log": lambda *a: None}


# ------------------------------------------------------------------------------------------------ parsing
def test_parse_operations_forms_and_prose():
    reply = ("Let me think. The lessons say to check signs.\n"
             "ADD: Check the sign of each term before adding.\n"
             "- MODIFY 2: Carry tens explicitly.\n"
             "1. DELETE [1]\n"
             "Some closing words.")
    assert parse_operations(reply, size=2, max_words=32) == [
        Operation("ADD", None, "Check the sign of each term before adding."),
        Operation("MODIFY", 2, "Carry tens explicitly."), Operation("DELETE", 1, None)]
    assert parse_operations("KEEP", size=0, max_words=32) == [Operation("KEEP")]


@pytest.mark.parametrize("reply, size, match", [
    ("no operation here", 2, "no operation line"),
    ("ADD Check signs.", 2, r"line 1 .*ADD: <experience>"),             # missing colon
    ("MODIFY: better", 2, r"MODIFY <n>: <experience>"),                # missing number
    ("DELETE 3", 2, r"experience 3 does not exist \(numbers 1..2\)"),
    ("DELETE 1", 0, r"the library is empty"),
    ("MODIFY 1: a\nDELETE 1", 2, r"line 2 .*already has an operation on line 1"),
    ("KEEP\nADD: x", 2, "KEEP .* must be the only operation"),
    ("KEEP everything", 2, r"write a KEEP operation as 'KEEP'"),
    ("ADD: " + "w " * 5, 2, r"5 words, more than training_free_max_words=4"),
])
def test_parse_operations_is_strict(reply, size, match):
    with pytest.raises(OperationError, match=match):
        parse_operations(reply, size=size, max_words=4)


def test_library_apply_order_and_numbering():
    lib = ExperienceLibrary(["a", "b", "c"])
    # shown as [1] a [2] b [3] c: MODIFY 3 -> c2, DELETE 1 -> [b, c2], ADD d, e appended in order
    lib.apply(parse_operations("ADD: d\nMODIFY 3: c2\nDELETE 1\nADD: e", 3, 32), max_size=4)
    assert lib.experiences == ["b", "c2", "d", "e"]
    assert lib.numbered() == "[1] b\n[2] c2\n[3] d\n[4] e"
    with pytest.raises(OperationError, match="5 experiences, more than training_free_max_experiences=4"):
        lib.apply(parse_operations("ADD: f", 4, 32), max_size=4)
    assert lib.experiences == ["b", "c2", "d", "e"]  # unchanged
    lib.apply([Operation("KEEP")], max_size=4)
    assert lib.experiences == ["b", "c2", "d", "e"]


# ------------------------------------------------------------------------------------------ scripted LM
class ScriptedLM:
    """Replies by stage: a summary, a lesson, then the given update replies in order; records the requests."""

    def __init__(self, updates):
        self.updates, self.requests = list(updates), []

    def __call__(self, chats):
        out = []
        for chat in chats:
            text = chat[-1]["content"]
            self.requests.append(text)
            if text.startswith("Problem:"):
                out.append(f"summary {len(self.requests)}")
            elif text.startswith("Several attempts"):
                out.append("Lesson: say the digit first.")
            else:
                out.append(self.updates.pop(0))
        return out


def _batch(rewards, groups, uids):
    return SimpleNamespace(scalar_rewards=torch.tensor(rewards), group_ids=torch.tensor(groups),
                           prompt_uids=uids, columns={"completion": [f"c{i}" for i in range(len(rewards))]})


ROWS = [{"prompt": [{"role": "user", "content": f"q{i}"}], "answer": str(i)} for i in range(3)]


def test_update_on_scripted_replies_hand_checked():
    upd = TrainingFree(training_free_max_experiences=3)
    # group 0: rewards 1,1,1 (all equal: skipped); group 1: 0,0,0 (skipped); group 2: 0, 1, 0.5 (kept)
    batch = _batch([1, 1, 1, 0, 0, 0, 0, 1, 0.5], [0, 0, 0, 1, 1, 1, 2, 2, 2], [0, 0, 0, 1, 1, 1, 2, 2, 2])
    lm = ScriptedLM(["MODIFY 1: nothing to modify", "ADD: Say the digit first.\nADD: Stop after it."])
    rec = upd.update(batch, ROWS, lm)
    # 3 summaries (group 2 only), 1 lesson, 2 update requests (the first malformed: the library is empty)
    assert rec["metrics"] == {"groups_used": 1, "groups_skipped": 2, "malformed_replies": 1, "lm_calls": 6,
                              "ops_add": 2, "ops_modify": 0, "ops_delete": 0, "ops_keep": 0, "experiences": 2}
    assert upd.library.experiences == ["Say the digit first.", "Stop after it."]
    assert "experience 1 does not exist" in rec["errors"][0]
    summaries = lm.requests[:3]
    assert all("Problem: q2" in s and "Reference answer: 2" in s for s in summaries)
    assert [s.split("Reward of this attempt: ")[1][:4] for s in summaries] == ["0.00", "1.00", "0.50"]
    assert "Attempt 2 (reward 1.00):\nsummary 2" in lm.requests[3] and "Current experiences:\nNone" in lm.requests[3]
    # step 2: the library shown numbered; MODIFY 2 -> 'Stop at once.', DELETE 1, ADD one -> 2 experiences
    lm2 = ScriptedLM(["MODIFY 2: Stop at once.\nDELETE 1\nADD: Check the digit."])
    rec = upd.update(_batch([0, 1], [0, 0], [1, 1]), ROWS, lm2)
    assert "[1] Say the digit first.\n[2] Stop after it." in lm2.requests[2]  # after the 2 summaries
    assert upd.library.experiences == ["Stop at once.", "Check the digit."]
    assert rec["metrics"]["ops_modify"] == rec["metrics"]["ops_delete"] == rec["metrics"]["ops_add"] == 1
    # every reply malformed: counted per reply (3 attempts), the library unchanged, no crash
    rec = upd.update(_batch([0, 1], [0, 0], [1, 1]), ROWS, ScriptedLM(["???"] * 3))
    assert rec["metrics"]["malformed_replies"] == 3 and upd.library.experiences == ["Stop at once.",
                                                                                     "Check the digit."]
    # no group with a reward spread: no LM call at all
    rec = upd.update(_batch([1, 1], [0, 0], [1, 1]), ROWS, ScriptedLM([]))
    assert rec["metrics"]["lm_calls"] == 0 and rec["metrics"]["groups_skipped"] == 1


def test_missing_answer_column_names_it():
    upd = TrainingFree(training_free_answer_column="gold")
    with pytest.raises(ConfigError, match="training_free_answer_column: .* no column 'gold'"):
        upd.update(_batch([0, 1], [0, 0], [0, 0]), ROWS, ScriptedLM([]))


def test_library_in_prompt_forms():
    lib = ExperienceLibrary(["Say it.", "Stop."])
    row = {"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}], "x": 1}
    out = lib.with_experiences(row)
    assert out["prompt"][1]["content"] == f"Q\n\n{EXPERIENCE_HEADER}\n[1] Say it.\n[2] Stop."
    assert row["prompt"][1]["content"] == "Q" and out["x"] == 1  # the data row itself is untouched
    assert lib.with_experiences({"prompt": "Q"})["prompt"] == f"Q\n\n{EXPERIENCE_HEADER}\n[1] Say it.\n[2] Stop."
    assert ExperienceLibrary().with_experiences(row) is row  # an empty library: the plain question


# ------------------------------------------------------------------------------------------ through the trainer
def _stub_module(monkeypatch):
    """A module with a scripted LM whose update reply depends on the library it is shown (so it evolves)."""
    def lm(chats):
        out = []
        for chat in chats:
            text = chat[-1]["content"]
            if text.startswith("You keep a library"):
                n = text.count("\n[")  # experiences shown
                out.append(f"ADD: Lesson number {n + 1}." if n < 3 else "MODIFY 1: Revised lesson.\nDELETE 2")
            else:
                out.append("fine")
        return out

    mod = types.ModuleType("tf_stub_lm")
    mod.lm = lm
    monkeypatch.setitem(sys.modules, "tf_stub_lm", mod)


def _args(tiny_args, **kw):
    return {**recipe_overrides("training_free_grpo"), **tiny_args, "training_free_answer_column": "digit",
            "max_prompt_length": 256, **kw}


def test_config_checks():
    from grpolab.train.trainer import Trainer  # noqa: F401  (the catalogue)
    base = {"model": "tiny", "task": "repeat"}
    with pytest.raises(ConfigError, match="rollout_strategy: experience_prompt"):
        Config.build({**base, "update_strategy": "training_free"})
    with pytest.raises(ConfigError, match="beta: .*set beta: 0"):
        Config.build({**recipe_overrides("training_free_grpo"), **base, "beta": 0.04})
    with pytest.raises(ConfigError, match="update_strategy training_free"):
        Config.build({**base, "rollout_strategy": "experience_prompt"})
    with pytest.raises(ConfigError, match="training_free_lm: 'policy' or MODULE:FUNCTION"):
        Config.build({**recipe_overrides("training_free_grpo"), **base, "training_free_lm": "gpt"})
    with pytest.raises(ConfigError, match="training_free_lm: 'no_such_module:f' is neither"):
        TrainingFree(training_free_lm="no_such_module:f")


def test_library_in_training_and_eval_prompts(tiny_args, monkeypatch):
    from grpolab.train.trainer import Trainer

    _stub_module(monkeypatch)
    t = Trainer(Config.build(_args(tiny_args, training_free_lm="tf_stub_lm:lm")), **QUIET)
    t.components["update/training_free"].fn.library = ExperienceLibrary(["Say 7."])
    batch = t.rollout()
    text = t.tok.decode(batch.prompt_ids[0][batch.prompt_mask[0] > 0])
    assert text == f"{t.rows[batch.prompt_uids[0]]['prompt']}\n\n{EXPERIENCE_HEADER}\n[1] Say 7."  # a string prompt
    ev = t._eval_rollout()(t.eval_rows[:2], [0, 1])
    assert f"{EXPERIENCE_HEADER}\n[1] Say 7." in t.tok.decode(ev.prompt_ids[0][ev.prompt_mask[0] > 0])


def test_smoke_weights_unchanged_files_and_exact_resume(tiny_args, monkeypatch, tmp_path):
    from grpolab.train.trainer import Trainer

    _stub_module(monkeypatch)
    args = _args(tiny_args, training_free_lm="tf_stub_lm:lm", steps=4, save_steps=2)
    a = Trainer(Config.build({**args, "out": str(tmp_path / "a")}), **QUIET)
    before = {k: v.clone() for k, v in a.model.state_dict().items()}
    a.train(progress=False)
    assert all(torch.equal(before[k], v) for k, v in a.model.state_dict().items())  # no weight changed
    lib = a.components["update/training_free"].fn.library.experiences
    assert lib, "the scripted LM adds an experience on every step with a reward spread"
    out = tmp_path / "a"
    assert (out / "experiences.md").read_text().splitlines()[0] == "# Experience library after step 4"
    lines = [json.loads(x) for x in (out / "experience_updates.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3, 4] and lines[-1]["library"] == lib
    owned = json.loads((out / "grpolab_run.json").read_text())["owned"]  # --overwrite removes them, nothing else
    assert {"experiences.md", "experience_updates.jsonl"} <= set(owned)
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("training_free/experiences" in m and m["loss"] is None for m in metrics)

    # "kill -9" after step 3 (checkpoint at step 2), then resume: the same library, updates and rewards
    b_args = {**args, "out": str(tmp_path / "b")}
    b = Trainer(Config.build(b_args), **QUIET)
    for _ in range(3):
        b.metrics.write(b.train_step())
        if b.step == 2:
            b.save()
    del b
    r = Trainer(Config.build(b_args), resume=True, **QUIET)
    assert r.step == 2
    r.train(progress=False)
    assert r.components["update/training_free"].fn.library.experiences == lib
    b_lines = [json.loads(x) for x in (tmp_path / "b" / "experience_updates.jsonl").read_text().splitlines()]
    assert b_lines == lines
    b_metrics = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [m["reward_mean"] for m in b_metrics] == [m["reward_mean"] for m in metrics]


def test_smoke_policy_lm_counts_malformed_replies(tiny_args):
    """The default LM is the tiny policy itself: its random replies are malformed, counted, and the run goes on."""
    from grpolab.train.trainer import Trainer

    t = Trainer(Config.build(_args(tiny_args, steps=1, training_free_max_new_tokens=6, training_free_attempts=2)),
                **QUIET)
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    m = t.train_step()
    assert m["training_free/groups_used"] >= 1
    # per kept group G = 4 summaries and 1 lesson, then 2 update requests (both malformed)
    assert m["training_free/lm_calls"] == (4 + 1) * m["training_free/groups_used"] + 2
    assert m["training_free/malformed_replies"] == 2
    assert all(torch.equal(before[k], v) for k, v in t.model.state_dict().items())


def test_rows_without_the_answer_column_stop_at_start(tiny_args):
    """repeat's rows have no 'answer': the run stops before any work, naming the column and the component."""
    from grpolab.train.trainer import Trainer

    with pytest.raises(ConfigError, match="no 'answer' column, which update strategy 'training_free' reads"):
        Trainer(Config.build({**recipe_overrides("training_free_grpo"), **tiny_args}), **QUIET)
