"""TempSamp-R1 rollout strategy (rollouts/tempsamp.py): ground truth in every group, hybrid CoT prompts."""
import math

import pytest
import torch

from grpolab.batch import INJECTED, SAMPLED
from grpolab.config import Config, ConfigError
from grpolab.rollouts import tempsamp as ts
from grpolab.data import tokenize_prompts
from grpolab.rollouts.injection import text_ids

from _helpers import countdown_trainer

L = 24  # max_completion_length of the shared trainer
COT, DIRECT = " Think.", " Direct."


@pytest.fixture(scope="module")
def tr(tmp_path_factory):
    """A tiny-model trainer on countdown (reference 'Answer: {solution}', reward 1.5 when right)."""
    return countdown_trainer(tmp_path_factory.mktemp("ts") / "run", "tempsamp_r1", L)


from test_rollout_injection import injected_rows as injected, short_rows  # noqa: E402  (same L, same rows)


def test_gt_replaces_last_row_of_every_group(tr):
    rows, uids = short_rows(tr)
    b = ts.tempsamp_r1(tr.ctx, rows, uids, 5, injection_reference_template="Answer: {solution}",
                       tempsamp_hybrid_cot=False)
    # G = 4: three sampled rows + the ground truth in the last slot of every group (replaced, not added)
    assert b.group_ids.tolist() == [5] * 4 + [6] * 4 + [7] * 4
    assert injected(b) == [3, 7, 11]
    eos = tr.tok.eos_token_id
    for k, i in enumerate([3, 7, 11]):
        want = text_ids(tr.tok, "Answer: " + rows[k]["solution"]) + [eos]
        n = len(want)
        assert b.completion_ids[i, :n].tolist() == want and int(b.completion_attention_mask[i].sum()) == n
        assert (b.token_origin[i, :n] == INJECTED).all() and (b.completion_mask[i, :n] == 1).all()  # trained on
        assert int(b.prompt_uids[i]) == uids[k] and not b.truncated[i]
    for i in set(range(12)) - {3, 7, 11}:
        m = b.completion_attention_mask[i].bool()
        assert (b.token_origin[i][m] == SAMPLED).all()
    # the ground truth is scored like any completion: accuracy 1 + 0.5 * format 1 = 1.5
    scalar = tr.ctx.score(b)
    assert scalar[[3, 7, 11]].tolist() == [1.5, 1.5, 1.5]
    # its behaviour log-prob is the teacher-forced log pi_old(y*_t | x, y*_<t), like every sampled token's
    forced = tr.ctx.logprobs(b)
    assert ((b.behavior_logprobs - forced) * b.completion_attention_mask).abs().max() < 1e-4
    # off: plain groups, nothing injected
    plain = ts.tempsamp_r1(tr.ctx, rows, uids, 0, injection_reference_template="Answer: {solution}",
                           tempsamp_hybrid_cot=False, tempsamp_gt_injection=False)
    assert plain.num_rows == 12 and injected(plain) == []


def test_hybrid_cot_modes_hand_computed():
    rows = [{"prompt": "What is 2+3?", "answer": "5"},
            {"prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": "Q1"},
                        {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}]}]
    g = torch.Generator().manual_seed(0)
    all_cot = ts.hybrid_cot_rows(rows, 1.0, g, COT, DIRECT)  # u < 1 always
    assert all_cot[0]["prompt"] == "What is 2+3? Think." and all_cot[0]["tempsamp_cot"] is True
    assert all_cot[0]["answer"] == "5"
    msgs = all_cot[1]["prompt"]  # the last user message gets the instruction, nothing else changes
    assert [m["content"] for m in msgs] == ["sys", "Q1", "A1", "Q2 Think."]
    assert rows[1]["prompt"][3]["content"] == "Q2" and rows[0]["prompt"] == "What is 2+3?"  # inputs untouched
    none = ts.hybrid_cot_rows(rows, 0.0, g, COT, DIRECT)  # u < 0 never
    assert none[0]["prompt"] == "What is 2+3? Direct." and none[0]["tempsamp_cot"] is False
    assert none[1]["prompt"][3]["content"] == "Q2 Direct."
    # p = 0.3 over 4000 prompts: CoT share within 4 binomial sd (sqrt(0.3 * 0.7 / 4000) = 0.0072) of 0.3
    many = ts.hybrid_cot_rows([{"prompt": "x"}] * 4000, 0.3, torch.Generator().manual_seed(1), COT, DIRECT)
    share = sum(r["tempsamp_cot"] for r in many) / 4000
    assert abs(share - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 4000)
    assert all(r["prompt"] == ("x" + (COT if r["tempsamp_cot"] else DIRECT)) for r in many)


def test_hybrid_groups_share_one_mode_and_train_on_its_prompt(tr):
    rows, uids = short_rows(tr)
    b = ts.tempsamp_r1(tr.ctx, rows, uids, 0, injection_reference_template="Answer: {solution}",
                       tempsamp_cot_fraction=0.5, tempsamp_cot_instruction=COT, tempsamp_direct_instruction=DIRECT)
    assert injected(b) == [3, 7, 11]
    for g in range(3):
        sel = (b.group_ids == g).nonzero().squeeze(-1).tolist()
        modes = {b.columns["tempsamp_cot"][i] for i in sel}
        assert len(modes) == 1  # one mode per prompt (the whole group)
        suffix = COT if modes.pop() else DIRECT
        for i in sel:  # sampled rows and the ground-truth row are all trained on the mode's prompt
            msgs = [dict(m) for m in rows[g]["prompt"]]  # countdown: system + user; the user message gets the suffix
            msgs[-1]["content"] += suffix
            assert b.columns["prompt"][i] == msgs
            want, _ = tokenize_prompts(tr.tok, [msgs], tr.cfg.max_prompt_length)
            assert b.prompt_ids[i][b.prompt_mask[i].bool()].tolist() == want[0].tolist()


def test_check_rejects_bad_fraction(tiny_args):
    with pytest.raises(ConfigError, match="tempsamp_cot_fraction"):
        Config.build({**tiny_args, "rollout_strategy": "tempsamp_r1", "tempsamp_cot_fraction": 1.5,
                      "injection_reference_template": "{answer}"})


def test_cut_ground_truth_is_logged_once(tr, monkeypatch):
    rows, uids = short_rows(tr, 2)
    seen = []
    monkeypatch.setattr(tr.ctx, "log", lambda *a: seen.append(" ".join(map(str, a))))
    monkeypatch.setattr(tr.cfg, "max_completion_length", 5)  # 'Answer: ...' + EOS needs more than 5 tokens
    for _ in range(2):
        b = ts.tempsamp_r1(tr.ctx, rows, uids, 0, injection_reference_template="Answer: {solution}",
                           tempsamp_hybrid_cot=False)
        assert b.truncated[[3, 7]].all()
    assert len(seen) == 1 and "2 of 2 ground-truth solutions were cut" in seen[0]
