"""DeepVideo-R1's difficulty-aware augmentation (rollout difficulty_aug, seed 000-04).

A fake RolloutContext whose "policy" answers by a rule on (prompt uid, prompt text, sample index), so which
prompts are eased or perturbed, and the cue text, are known by hand.
"""
import copy
from types import SimpleNamespace

import pytest
import torch

from grpolab.batch import RolloutBatch
from grpolab.config import Config, ConfigError
from grpolab.rollouts.difficulty_aug import (CUE_HEADER, NOISE_WORDS, DifficultyAwareAugmentation, difficulty,
                                             perturb_text)


def row(uid):
    return {"prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": f"solve problem {uid} now"}],
            "answer": str(100 + uid), "solution": f"step a {uid}\nstep b\nAnswer: {100 + uid}"}


class FakeCtx:
    """Completion of sample k: 'sol{k} ' * 5 (reward 1) when ``solve(uid, text, k)``, else 'no' (reward 0)."""

    def __init__(self, solve, G=4):
        self.solve, self.cfg = solve, SimpleNamespace(num_generations=G)
        self.tokenizer = SimpleNamespace(pad_token_id=0)
        self.calls, self.metrics, self._next = [], {}, 0

    def new_step(self):
        self._next, self.metrics, self.calls = 0, {}, []

    def metric(self, name, value):
        self.metrics[name] = float(value)

    def allocate_groups(self, n):
        self._next += n
        return self._next - n

    def generate(self, rows, uids, *, group_offset, num_generations=None, temperature=None):
        n = num_generations if num_generations is not None else self.cfg.num_generations
        ns = n if isinstance(n, list) else [n] * len(rows)
        texts = [r["prompt"][-1]["content"] for r in rows]
        self.calls.append(list(zip(uids, texts)))
        comp, gid, puid, prompts = [], [], [], []
        for i, (u, t, g) in enumerate(zip(uids, texts, ns)):
            for k in range(g):
                comp.append(f"sol{k} " * 5 if self.solve(int(u), t, k) else "no")
                gid.append(group_offset + i), puid.append(int(u)), prompts.append(t)
        R = len(comp)
        return RolloutBatch(prompt_ids=torch.ones(R, 2, dtype=torch.long), prompt_mask=torch.ones(R, 2, dtype=torch.long),
                            completion_ids=torch.ones(R, 3, dtype=torch.long), completion_mask=torch.ones(R, 3),
                            behavior_logprobs=torch.zeros(R, 3), group_ids=torch.tensor(gid),
                            prompt_uids=torch.tensor(puid), truncated=torch.zeros(R, dtype=torch.bool),
                            columns={"prompt": prompts, "completion": comp})

    def score(self, batch):
        r = torch.tensor([1.0 if c.startswith("sol") else 0.0 for c in batch.columns["completion"]])
        batch.rewards, batch.reward_names = r[:, None], ["acc"]
        return r


def run(aug, ctx, uids):
    ctx.new_step()
    off = ctx.allocate_groups(len(uids))
    return aug(ctx=ctx, rows=[row(u) for u in uids], uids=uids, group_offset=off)


def rule(uid, text, k):
    """uid 0: always right; uid 1: right for k < 2 (mean 0.5); uid 2: right only with the answer shown, from k = 1;
    uid 3: always right; uid 4: right for k < 3 (mean 0.75)."""
    if "The correct final answer" in text:
        return k >= 1
    return {0: True, 1: k < 2, 2: False, 3: True, 4: k < 3}[uid]


def test_difficulty_sign():
    assert difficulty(0.75, 0.0) == 0.75 and difficulty(0.75, 1.0) == -0.25


def test_first_step_has_no_history_and_changes_nothing():
    aug, ctx = DifficultyAwareAugmentation(), FakeCtx(rule)
    out = run(aug, ctx, [0, 1])
    assert len(ctx.calls) == 1 and out.num_rows == 8 and out.columns["dva_augment"] == [0] * 8
    assert list(aug.history) == [1.0, 0.5]


def test_hard_prompt_gets_the_best_answer_shown_response_prefix_easy_prompt_gets_noise():
    aug, ctx = DifficultyAwareAugmentation(seed=0), FakeCtx(rule)
    run(aug, ctx, [0, 1])                      # history [1.0, 0.5]: mean 0.75
    out = run(aug, ctx, [2, 3, 4])
    # uid 2: mean 0 -> Delta = 0.75 (hard), level 0.75, cue fraction 0.5 * 0.75 = 0.375;
    # uid 3: mean 1 -> Delta = -0.25 (easy), level 0.25, noise probability 0.5 * 0.25 = 0.125;
    # uid 4: mean 0.75 -> Delta = 0: plain.
    plain, cue_call, aug_call = ctx.calls
    assert [u for u, _ in cue_call] == [2] and "The correct final answer is 102." in cue_call[0][1]
    # best answer-shown response: k = 1 (k = 0 fails), 'sol1 ' * 5 = 25 chars; round(25 * 0.375) = 9 -> 'sol1 sol1'
    assert [u for u, _ in aug_call] == [2, 3]
    assert aug_call[0][1] == f"solve problem 2 now\n\n{CUE_HEADER}\nsol1 sol1"
    noisy = aug_call[1][1].split(" ")
    assert [w for w in noisy if w not in NOISE_WORDS] == "solve problem 3 now".split(" ")
    assert out.group_ids.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert out.columns["dva_augment"] == [1] * 4 + [-1] * 4 + [0] * 4
    assert out.columns["dva_level"][:8] == [0.75] * 4 + [0.25] * 4
    assert out.columns["prompt"][0].endswith("sol1 sol1") and out.columns["prompt"][8] == "solve problem 4 now"
    # the eased group was re-sampled with the cue: still all wrong under this rule (k-independent for uid 2)
    assert out.rewards[:4, 0].tolist() == [0.0] * 4
    assert ctx.metrics == {"dva_frac_easier": pytest.approx(1 / 3), "dva_frac_harder": pytest.approx(1 / 3),
                           "dva_difficulty": pytest.approx((0.75 - 0.25 + 0.0) / 3)}
    # the history took the plain means of this step (after measuring): [1, .5, 0, 1, .75]
    assert list(aug.history) == [1.0, 0.5, 0.0, 1.0, 0.75]


def test_solution_cue_and_window():
    aug, ctx = DifficultyAwareAugmentation(dva_cue_source="solution", dva_max_cue=1.0, dva_window=2), FakeCtx(rule)
    run(aug, ctx, [0, 0, 0])                      # window 2 keeps [1.0, 1.0]
    assert list(aug.history) == [1.0, 1.0]
    run(aug, ctx, [2])                            # Delta = 1 -> level 1 -> the whole solution; no cue generation
    assert len(ctx.calls) == 2
    assert ctx.calls[1][0][1].endswith(f"{CUE_HEADER}\nstep a 2\nstep b\nAnswer: 102")


def test_zero_strength_equals_the_plain_rollout():
    aug, ctx = DifficultyAwareAugmentation(dva_max_cue=0.0, dva_max_noise=0.0), FakeCtx(rule)
    run(aug, ctx, [0, 1])
    out = run(aug, ctx, [2, 3, 4])
    # an empty cue and a zero noise probability leave every group plain (one cue generation, no re-sampling)
    assert len(ctx.calls) == 2 and out.columns["dva_augment"] == [0] * 12
    assert out.columns["prompt"] == [f"solve problem {u} now" for u in (2, 3, 4) for _ in range(4)]


def test_perturb_text_keeps_every_word_in_order():
    g = torch.Generator().manual_seed(0)
    assert perturb_text("a b c", 0.0, g) == "a b c"
    words = perturb_text("a b c", 1.0, g).split(" ")
    assert words[0::2] == ["a", "b", "c"] and all(w in NOISE_WORDS for w in words[1::2])


def test_restored_state_perturbs_identically():
    a, ctx = DifficultyAwareAugmentation(seed=3), FakeCtx(rule)
    run(a, ctx, [0, 1])
    b = DifficultyAwareAugmentation(seed=9)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    ca, cb = FakeCtx(rule), FakeCtx(rule)
    oa, ob = run(a, ca, [3, 3, 3]), run(b, cb, [3, 3, 3])
    assert oa.columns["prompt"] == ob.columns["prompt"] and list(a.history) == list(b.history)


def test_config_checks():
    with pytest.raises(ConfigError, match="dva_max_cue"):
        Config.build({"rollout_strategy": "difficulty_aug", "dva_max_cue": 1.5})
    with pytest.raises(ConfigError, match="dva_window"):
        Config.build({"rollout_strategy": "difficulty_aug", "dva_window": 0})
