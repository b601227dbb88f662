"""Rank-GRPO's rank items on the built-in ``ranked_list`` task: the task's rows and per-rank rewards, the item
spans of the ``rank_items`` rollout, and the per-rank advantages they select."""
import math
from types import SimpleNamespace

import torch

from grpolab.algorithms.adv_shaping import span_decoupled_advantage
from grpolab.rollouts.rank_items import line_item_ids, mark_rank_items
from grpolab.tasks import get_task
from grpolab.tasks.ranked_list import list_hits, rank_rewards


def test_ranked_list_rows_are_deterministic_disjoint_and_carry_the_top_three():
    a, b = get_task("ranked_list"), get_task("ranked_list")
    assert a.train_rows == b.train_rows and a.eval_rows == b.eval_rows
    assert (len(a.train_rows), len(a.eval_rows)) == (1000, 100)
    train = {frozenset(r["numbers"]) for r in a.train_rows}
    held = {frozenset(r["numbers"]) for r in a.eval_rows}
    assert len(train) == 1000 and len(held) == 100 and not train & held
    assert get_task("ranked_list", seed=7).train_rows != a.train_rows
    for r in a.train_rows[:50]:
        assert len(set(r["numbers"])) == 6 and all(1 <= n <= 99 for n in r["numbers"])
        rest = set(r["numbers"]) - set(r["top"])
        assert len(r["top"]) == 3 and r["top"] == sorted(r["top"], reverse=True) and min(r["top"]) > max(rest)
        assert r["answer"] == "\n".join(map(str, r["top"]))
    assert [name for name, _, _ in a.rewards] == ["rank_1", "rank_2", "rank_3"]
    assert [w for _, _, w in a.rewards] == [1.0, 0.0, 0.0]


def test_per_rank_rewards_are_the_dcg_from_each_rank_on():
    top = [29, 23, 17]
    # hits: line 1 = 29 (hit), line 2 = 4 (miss), line 3 = 17 (hit); gains 1/log2(2) = 1, 0, 1/log2(4) = 0.5
    assert list_hits("29\n4\n17", top) == [1, 0, 1]
    assert rank_rewards([1, 0, 1]) == [1.5, 0.5, 0.5]
    # a repeated item is no second hit; an empty line is a rank with no item
    assert list_hits("23\n23\n29", top) == [1, 0, 1]
    assert list_hits("\n29", top) == [0, 1, 0]
    g = 1 / math.log2(3)  # rank 2's discount
    assert rank_rewards([0, 1, 0]) == [g, g, 0.0]
    task = get_task("ranked_list")
    fns = [fn for _, fn, _ in task.rewards]
    completions = ["29\n4\n17", "1. 17\n2. 23\n3. 29\n4. 5"]
    got = [fn(completions=completions, top=[top, top]) for fn in fns]
    # second list: all three hits: rank_1 = 1 + 1/log2(3) + 1/2, rank_2 = 1/log2(3) + 1/2, rank_3 = 1/2
    assert got[0] == [1.5, 1 + g + 0.5] and got[1] == [0.5, g + 0.5] and got[2] == [0.5, 0.5]


def test_line_items_follow_the_newlines():
    # a newline closes its item; a double newline skips one (empty) item, as the authors' segmentation counts
    assert line_item_ids(["1", "7", "\n", "29", "\n\n", "x", " 5\n"]) == [1, 1, 1, 2, 2, 4, 4]
    assert line_item_ids(["a", "b"]) == [1, 1]


def _tiny_tokenizer():
    from grpolab.model.loading import load_policy
    texts = [r["answer"] for r in get_task("ranked_list").train_rows[:200]]
    return load_policy("tiny", task_texts=texts, log=lambda *a: None)[1]


def test_rank_items_marks_the_lines_of_decoded_completions():
    tok = _tiny_tokenizer()
    texts = ["17\n29\n\n5", "88"]
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    T = max(map(len, ids)) + 1
    completion_ids = torch.zeros(2, T, dtype=torch.long)
    mask = torch.zeros(2, T)
    for i, seq in enumerate(ids):
        completion_ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, :len(seq)] = 1
    batch = SimpleNamespace(completion_ids=completion_ids, completion_mask=mask,
                            span_ids=torch.zeros(2, T, dtype=torch.long))
    spans = mark_rank_items(batch, tok)
    # expected from the text: the line a token's first character is on (by character offsets, not the code's
    # per-token newline count), 1-based
    for i, seq in enumerate(ids):
        for t, tid in enumerate(seq):
            piece = tok.decode([tid])
            before = "".join(tok.decode([x]) for x in seq[:t])
            assert before == texts[i][:len(before)]
            assert int(spans[i, t]) == before.count("\n") + 1, (texts[i], t, piece)
        assert (spans[i, len(seq):] == 0).all()
    assert int(spans[0].max()) == 4 and int(spans[1].max()) == 1


def test_each_rank_takes_its_own_column_advantage():
    """span_decoupled_advantage over the rank items: item k's tokens get the group z-score of rank_k."""
    # two completions of one prompt, three one-token items each (plus one token past the list on row 0)
    spans = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 0]])
    mask = torch.tensor([[1., 1, 1, 1], [1, 1, 1, 0]])
    # rank_1 differs (1.5 vs 0.63), rank_2 is higher on row 1, rank_3 is equal: no signal on item 3
    matrix = torch.tensor([[1.5, 0.5, 0.5], [0.63, 0.63, 0.5]])
    batch = SimpleNamespace(span_ids=spans, reward_names=["rank_1", "rank_2", "rank_3"], columns={})
    adv = span_decoupled_advantage(matrix[:, 0], torch.tensor([0, 0]), matrix, mask, batch, span_mark="batch",
                                   span_reward_columns=["", "rank_1", "rank_2", "rank_3"])
    assert adv[0, 0] > 0 > adv[1, 0] and torch.isclose(adv[0, 0], -adv[1, 0])
    assert adv[0, 1] < 0 < adv[1, 1] and torch.isclose(adv[0, 1], -adv[1, 1])
    assert adv[0, 2] == 0 and adv[1, 2] == 0
    assert adv[0, 3] == adv[0, 0]  # a line past the third: the combined reward (here rank_1)
    assert adv[1, 3] == 0  # off the mask
