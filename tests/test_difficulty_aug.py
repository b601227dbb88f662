"""DeepVideo-R1's difficulty-aware augmentation (rollout difficulty_aug, seed 000-04).

A fake RolloutContext whose "policy" answers by a rule on (prompt uid, prompt text, sample index), so which
prompts are eased or perturbed, and the cue text, are known by hand.
"""
import copy
import math
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
        extra = {k: [] for r in rows for k in r if k.startswith("frame_noise")}
        for i, (r, u, t, g) in enumerate(zip(rows, uids, texts, ns)):
            for k in range(g):
                comp.append(f"sol{k} " * 5 if self.solve(int(u), t, k) else "no")
                gid.append(group_offset + i), puid.append(int(u)), prompts.append(t)
                for key in extra:
                    extra[key].append(r[key])
        R = len(comp)
        return RolloutBatch(prompt_ids=torch.ones(R, 2, dtype=torch.long), prompt_mask=torch.ones(R, 2, dtype=torch.long),
                            completion_ids=torch.ones(R, 3, dtype=torch.long), completion_mask=torch.ones(R, 3),
                            behavior_logprobs=torch.zeros(R, 3), group_ids=torch.tensor(gid),
                            prompt_uids=torch.tensor(puid), truncated=torch.zeros(R, dtype=torch.bool),
                            columns={"prompt": prompts, "completion": comp, **extra})

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


# ----------------------------------------------------------------------------- frame-level noise (dva_perturb frames)

def test_noisy_frames_by_hand():
    import numpy as np

    from grpolab.policies.vision_language.scenes import noisy_frames
    grey = [np.full((40, 40, 3), 128, dtype=np.uint8)] * 2
    assert all((f == g).all() for f, g in zip(noisy_frames(grey, 0.0, 1), grey))
    a, b = noisy_frames(grey, 0.05, 7), noisy_frames(grey, 0.05, 7)
    assert all((x == y).all() for x, y in zip(a, b)) and not (a[0] == a[1]).all()  # seeded; frames differ
    # pixel std 255 * 0.05 = 12.75 (128 +- 4 std stays inside 0..255: no clipping); rounding adds 1/12 variance
    dev = np.concatenate([f.astype(np.float64).ravel() - 128 for f in a])
    assert abs(dev.mean()) < 0.5 and dev.std() == pytest.approx(math.sqrt(12.75 ** 2 + 1 / 12), rel=0.03)
    white = noisy_frames([np.full((8, 8, 3), 255, dtype=np.uint8)], 0.5, 0)[0]
    assert white.max() == 255 and white.dtype == np.uint8  # clipped to the pixel range


def test_row_images_renders_the_noise_columns():
    from grpolab.policies.vision_language.policy import VisionLanguagePolicy
    from grpolab.policies.vision_language.scenes import row_images
    from grpolab.policies.vision_language.tasks_motion import motion_row
    row = motion_row(5)
    noisy = VisionLanguagePolicy.perturb_inputs(None, row, 0.1, torch.Generator().manual_seed(0))
    assert "frame_noise_std" not in row and noisy["frame_noise_std"] == 0.1 and noisy["prompt"] == row["prompt"]
    clean, dirty = row_images(row), row_images(noisy)
    assert len(clean) == len(dirty) == 3 and all(c.shape == d.shape for c, d in zip(clean, dirty))
    assert all((c != d).any() for c, d in zip(clean, dirty))
    assert all((d == e).all() for d, e in zip(dirty, row_images(noisy)))  # a pure function of the row


def test_easy_clip_gets_frame_noise_scaled_by_its_easiness():
    class Actions:
        def perturb_inputs(self, row, strength, generator):
            return {**row, "frame_noise_std": strength, "frame_noise_seed": 1}

    aug, ctx = DifficultyAwareAugmentation(dva_perturb="frames"), FakeCtx(rule)
    ctx.actions = Actions()
    run(aug, ctx, [0, 1])                      # history mean 0.75
    out = run(aug, ctx, [3, 4])                # uid 3: Delta = -0.25 -> std 0.5 * 0.25; uid 4: plain
    assert [u for u, _ in ctx.calls[1]] == [3] and ctx.calls[1][0][1] == "solve problem 3 now"  # text untouched
    assert out.columns["dva_augment"] == [-1] * 4 + [0] * 4
    assert out.columns["frame_noise_std"] == [0.125] * 4 + [None] * 4  # plain rows: no noise column value


def test_frames_need_a_vision_policy_and_vision_runs_it():
    with pytest.raises(ConfigError, match="capability vision"):
        Config.build({"rollout_strategy": "difficulty_aug", "dva_perturb": "frames"})
    Config.build({"policy": "vision_language", "task": "motion_clips", "rollout_strategy": "difficulty_aug",
                  "dva_perturb": "frames", "dva_answer_column": "direction"})
    with pytest.raises(ConfigError, match="continues a text prompt"):  # other text rollouts stay refused
        Config.build({"policy": "vision_language", "task": "motion_clips", "rollout_strategy": "scaf_grpo"})


def test_trains_end_to_end_with_every_prompt_eased(tiny_args):
    """The real tiny model: a history mean of 1 makes every prompt whose group is not all right 'hard'; each gets the
    full-strength cue (its solution, dva_max_cue 1) and its re-sampled group trains on the cued prompt."""
    import json

    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer
    args = {**recipe_overrides("reg_grpo"), **tiny_args, "task": "repeat", "steps": 1, "dva_cue_source": "solution",
            "dva_max_cue": 1.0}
    t = Trainer(Config.build(args), log=lambda *a: None)
    t.strategy.fn.history.extend([1.0])
    seen, original = [], t.update
    t.update = lambda batch: (seen.append(batch), original(batch))[1]
    t.train(progress=False)
    batch = seen[0]
    m = json.loads(open(f"{args['out']}/metrics.jsonl").readline())
    eased = [i for i, k in enumerate(batch.columns["dva_augment"]) if k == 1]
    assert m["rollout/dva_frac_easier"] == len(eased) / batch.num_rows >= 0.75 and m["skipped"] == 0
    for i in eased:  # the cue is the whole solution (repeat: the digit, repeated)
        assert batch.columns["prompt"][i].endswith(f"{CUE_HEADER}\n{batch.columns['solution'][i]}")
