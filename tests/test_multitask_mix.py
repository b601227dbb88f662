"""The built-in ``multitask_mix`` task (a 'task' column for multi-task methods such as DGRPO)."""
import re

from grpolab.tasks import get_task


def _value(question: str) -> int:
    # the multistep question is left-to-right with parentheses only around what precedes a '*'
    assert re.fullmatch(r"[\d\s+\-*()]+", question)
    return eval(question)  # noqa: S307  (digits and + - * ( ) only, checked above)


def test_rows_are_deterministic_disjoint_and_name_their_task():
    a, b = get_task("multitask_mix"), get_task("multitask_mix")
    assert a.train_rows == b.train_rows and a.eval_rows == b.eval_rows
    assert (len(a.train_rows), len(a.eval_rows)) == (1000, 100)
    train = {r["question"] for r in a.train_rows}
    held = {r["question"] for r in a.eval_rows}
    assert len(train) == 1000 and len(held) == 100 and not train & held
    assert get_task("multitask_mix", seed=5).train_rows != a.train_rows
    for rows in (a.train_rows, a.eval_rows):
        kinds = [r["task"] for r in rows]
        assert kinds.count("copy") == kinds.count("multistep") == len(rows) // 2
    for r in a.train_rows:
        assert set(r) == {"prompt", "question", "answer", "task"}
        user = r["prompt"][-1]["content"]
        if r["task"] == "copy":
            n = r["question"].split()[1]
            assert r["answer"] == n and f"Repeat the number {n}." in user and 100 <= int(n) <= 9999
        else:
            assert r["question"].count(" ") == 6  # three operations
            assert int(r["answer"]) == _value(r["question"]) and r["question"] in user


def test_one_reward_scores_both_task_types():
    task = get_task("multitask_mix")
    acc = dict((n, f) for n, f, _ in task.rewards)["accuracy"]
    copy = next(r for r in task.train_rows if r["task"] == "copy")
    multi = next(r for r in task.train_rows if r["task"] == "multistep")
    got = acc(completions=[f"Answer: {copy['answer']}", f"Answer: {multi['answer']}", "Answer: 0.5", "x"],
              answer=[copy["answer"], multi["answer"], copy["answer"], multi["answer"]])
    assert got == [1.0, 1.0, 0.0, 0.0]


def test_dgrpo_task_factor_reads_the_task_column():
    """dgrpo_difficulty_weight on multitask_mix rows: the task column gives each type its own difficulty."""
    from types import SimpleNamespace

    import torch

    from grpolab.algorithms.weightings import dgrpo_difficulty_weight
    rows = get_task("multitask_mix").train_rows
    copy = next(r for r in rows if r["task"] == "copy")
    multi = next(r for r in rows if r["task"] == "multistep")
    batch = SimpleNamespace(columns={"task": [copy["task"]] * 2 + [multi["task"]] * 2})
    rewards = torch.tensor([1.0, 0.6, 0.2, 0.0])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    out = dgrpo_difficulty_weight(adv, rewards, torch.tensor([0, 0, 1, 1]), batch)
    # by hand: d_copy = 1 - 0.8 = 0.2, d_multistep = 1 - 0.1 = 0.9, mean over the two tasks 0.55;
    # one prompt per task, so the prompt factor is 1: A' = A * d_task / 0.55
    expected = torch.tensor([0.2 / 0.55, -0.2 / 0.55, 0.9 / 0.55, -0.9 / 0.55])
    assert torch.allclose(out.double(), expected.double(), atol=1e-6)
