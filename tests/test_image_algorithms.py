"""Algorithm components of the image (diffusion / flow) GRPO methods: Flow-GRPO's per-prompt z-score, DDPO's
per-prompt stat tracker, advantage clipping and the denoising-step selection (docs/design/policies.md §5.3, §7).

Expected values are worked out here by hand (the arithmetic in comments, plain Python), following the authors'
code: flow_grpo/stat_tracking.py (PerPromptStatTracker.update), ddpo_pytorch/stat_tracking.py
(PerPromptStatTracker.update), the training loops of scripts/train_sd3.py (Flow-GRPO) and scripts/train.py (DDPO).
"""
import json
import math
from types import SimpleNamespace

import pytest
import torch

import grpolab  # noqa: F401  (the catalogue: registers every component)
from grpolab.algorithms.adv_trackers import PerPromptTracker, per_prompt_zscore
from grpolab.algorithms.advantages import group_zscore
from grpolab.algorithms.weightings import advantage_clip
from grpolab.batch import RolloutBatch
from grpolab.components import Component
from grpolab.config import Config, ConfigError
from grpolab.registry import ADVANTAGES, BATCH_STAGES, WEIGHTINGS
from grpolab.policies._image.stages_denoising import denoising_steps


def texts(*prompts) -> SimpleNamespace:
    """A batch stand-in with the 'prompt' column the per-prompt estimators key by (the authors' decoded text)."""
    return SimpleNamespace(columns={"prompt": list(prompts)})


def close(a, b, tol=1e-9):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    return a.shape == b.shape and bool(torch.allclose(a, b, atol=tol, rtol=0))


# ----------------------------------------------------------------------------- Flow-GRPO per-prompt z-score


def test_per_prompt_zscore_hand_computed_from_flow_grpo():
    """The example of flow_grpo/stat_tracking.py's main(): prompts a b a c b a, rewards 1..6, global_std False.

    a: [1, 3, 6]  mean 10/3, population var ((-7/3)^2 + (-1/3)^2 + (8/3)^2) / 3 = 114/27, std sqrt(114/27)
    b: [2, 5]     mean 3.5,  population std 1.5
    c: [4]        mean 4,    std 0 -> A = 0 / (0 + 1e-4) = 0
    A = (r - mean_prompt) / (std_prompt + 1e-4). Rows are keyed by the prompt text, as the code's decoded
    prompts: six different dataset rows (uids 0..5) with three texts; keyed by uid instead, every row is its
    own prompt and gets 0."""
    uids = torch.arange(6)
    batch = texts("a", "b", "a", "c", "b", "a")
    r = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], dtype=torch.float64)
    sa, sb = math.sqrt(114 / 27), 1.5
    want = [(1 - 10 / 3) / (sa + 1e-4), (2 - 3.5) / (sb + 1e-4), (3 - 10 / 3) / (sa + 1e-4), 0.0,
            (5 - 3.5) / (sb + 1e-4), (6 - 10 / 3) / (sa + 1e-4)]
    got = per_prompt_zscore(r, uids, batch, per_prompt_global_std=False)
    assert close(got, want, 1e-12)
    assert got.dtype == r.dtype and got.shape == (6,)
    assert close(per_prompt_zscore(r, uids, batch, per_prompt_global_std=False, per_prompt_key="prompt_uid"),
                 [0.0] * 6)
    # by uid, with uids that repeat as the texts do (a=0, b=1, c=2), the same values
    assert close(per_prompt_zscore(r, torch.tensor([0, 1, 0, 2, 1, 0]), per_prompt_global_std=False,
                                   per_prompt_key="prompt_uid"), want, 1e-12)
    with pytest.raises(ValueError, match="per_prompt_key: prompt_uid"):
        per_prompt_zscore(r, uids)  # keyed by text, but no 'prompt' column to read
    # the registered estimator, with the config's defaults (global std on, advantage_epsilon 1e-4)
    assert ADVANTAGES.get("per_prompt_zscore") is per_prompt_zscore
    cfg = Config.build({"model": "tiny", "task": "repeat", "advantage": "per_prompt_zscore", "num_generations": 4})
    assert cfg.per_prompt_global_std is True and cfg.advantage_epsilon == 1e-4 and cfg.per_prompt_key == "prompt"
    assert ADVANTAGES.min_group_size("per_prompt_zscore") == 2


def test_per_prompt_zscore_population_std_on_a_tie_group():
    """Population std (np.std), not Bessel's: prompt 0 [1, 1, 0, 0] has std 0.5 (Bessel: sqrt(1/3) = 0.577), so
    A = +-0.5 / 0.5001; prompt 1 [2, 2, 2] (a tie) gets exactly 0, no NaN; a NaN reward is left out, A = 0."""
    uids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    r = torch.tensor([1.0, 1.0, 0.0, 0.0, 2.0, 2.0, 2.0, float("nan")])
    got = per_prompt_zscore(r, uids, per_prompt_global_std=False, per_prompt_key="prompt_uid")
    a = 0.5 / (0.5 + 1e-4)  # 0.99980...
    assert close(got, [a, a, -a, -a, 0.0, 0.0, 0.0, 0.0], 1e-6)
    assert not torch.isnan(got).any()
    bessel = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # 0.86588...: what group_zscore (Bessel) gives on the same group
    assert close(group_zscore(r[:4], uids[:4]), [bessel, bessel, -bessel, -bessel], 1e-6)
    assert abs(a - bessel) > 0.1
    # a single all-tie step with the global std: 0 / (0 + 1e-4) = 0
    assert close(per_prompt_zscore(torch.full((4,), 3.0), torch.tensor([0, 0, 1, 1]), texts("x", "x", "y", "y")),
                 [0.0] * 4)


def test_per_prompt_zscore_global_std():
    """Flow-GRPO's default ``global_std=True``: the prompt's mean, the population std of all the step's rewards.

    rewards 1..6 (prompts a b a c b a): mean 3.5, population var sum((r - 3.5)^2) / 6 = 17.5 / 6, std 1.70783;
    A = (r - mean_prompt) / (1.70783 + 1e-4); prompt c's single row still gets 0 (r = its mean)."""
    uids = torch.arange(6)
    batch = texts("a", "b", "a", "c", "b", "a")
    r = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], dtype=torch.float64)
    s = math.sqrt(17.5 / 6)
    means = [10 / 3, 3.5, 10 / 3, 4.0, 3.5, 10 / 3]
    want = [(x - m) / (s + 1e-4) for x, m in zip(r.tolist(), means)]
    assert close(per_prompt_zscore(r, uids, batch, per_prompt_global_std=True), want, 1e-12)
    assert close(per_prompt_zscore(r, uids, batch), want, 1e-12)  # the default
    # a NaN row is out of the global std as well: [1, 3, NaN, 5] -> std of [1, 3, 5] = sqrt(8/3)
    r2 = torch.tensor([1.0, 3.0, float("nan"), 5.0], dtype=torch.float64)
    got = per_prompt_zscore(r2, torch.tensor([0, 0, 0, 1]), per_prompt_key="prompt_uid")
    s2 = math.sqrt(8 / 3)
    assert close(got, [(1 - 2) / (s2 + 1e-4), (3 - 2) / (s2 + 1e-4), 0.0, 0.0], 1e-12)


# ----------------------------------------------------------------------------- DDPO per-prompt tracker


def test_per_prompt_tracker_hand_computed_from_ddpo():
    """DDPO's tracker with buffer_size 4, min_count 3 over three steps; the buffer is extended before the count
    test, the batch statistics are of every reward of the step, stds are population stds, eps 1e-6.

    step 1: uids [0, 0, 1], r [1, 2, 4]; batch mean 7/3, var (16/9 + 1/9 + 25/9) / 3 = 42/27.
            buffers 0: [1, 2] (2 < 3), 1: [4] (1 < 3): both use the batch statistics.
    step 2: uids [0, 0, 1], r [3, 5, 0]; batch mean 8/3, var (1/9 + 49/9 + 64/9) / 3 = 114/27.
            buffer 0: [1, 2, 3, 5] (4 >= 3): mean 2.75, var (1.75^2 + .75^2 + .25^2 + 2.25^2) / 4 = 2.1875;
            buffer 1: [4, 0] (2 < 3): the batch statistics.
    step 3: uids [0, 0], r [7, 9]; buffer 0 holds the last 4: [3, 5, 7, 9], mean 6, var (9 + 1 + 1 + 9) / 4 = 5."""
    t = PerPromptTracker(tracker_buffer_size=4, tracker_min_count=3)
    eps = 1e-6
    s1 = math.sqrt(42 / 27)
    # prompt "p" comes from two different dataset rows (uids 5 and 6): keyed by text, one buffer
    got = t(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([5, 6, 7]), texts("p", "p", "q"), tracker_epsilon=eps)
    assert close(got, [(1 - 7 / 3) / (s1 + eps), (2 - 7 / 3) / (s1 + eps), (4 - 7 / 3) / (s1 + eps)], 1e-6)
    s2b, s2p = math.sqrt(114 / 27), math.sqrt(2.1875)
    got = t(torch.tensor([3.0, 5.0, 0.0]), torch.tensor([5, 5, 7]), texts("p", "p", "q"), tracker_epsilon=eps)
    assert close(got, [(3 - 2.75) / (s2p + eps), (5 - 2.75) / (s2p + eps), (0 - 8 / 3) / (s2b + eps)], 1e-6)
    got = t(torch.tensor([7.0, 9.0]), torch.tensor([6, 6]), texts("p", "p"), tracker_epsilon=eps)
    assert close(got, [(7 - 6) / (math.sqrt(5) + eps), (9 - 6) / (math.sqrt(5) + eps)], 1e-6)
    # the deque keeps the last buffer_size rewards, in order
    assert t.state_dict() == {"buffers": [["p", [3.0, 5.0, 7.0, 9.0]], ["q", [4.0, 0.0]]]}
    assert len(t.buffers["p"]) == 4 and t.buffers["p"].maxlen == 4
    # the same steps keyed by uid (per_prompt_key: prompt_uid) with uids 0, 0, 1: the same values
    u = PerPromptTracker(tracker_buffer_size=4, tracker_min_count=3)
    for r, ids in (([1.0, 2.0, 4.0], [0, 0, 1]), ([3.0, 5.0, 0.0], [0, 0, 1])):
        got = u(torch.tensor(r), torch.tensor(ids), per_prompt_key="prompt_uid")
    assert close(got, [(3 - 2.75) / (s2p + eps), (5 - 2.75) / (s2p + eps), (0 - 8 / 3) / (s2b + eps)], 1e-6)
    assert u.state_dict() == {"buffers": [[0, [1.0, 2.0, 3.0, 5.0]], [1, [4.0, 0.0]]]}


def test_per_prompt_tracker_min_count_switch_with_ddpo_defaults():
    """buffer_size 16, min_count 16 (DDPO's config/base.py), 8 rows per prompt: the first visit (8 < 16) uses
    the batch statistics, the second (16) the prompt's own buffer; a NaN reward is not buffered, A = 0."""
    t = Component(ADVANTAGES.get("per_prompt_tracker"),
                  Config.build({"model": "tiny", "task": "repeat", "advantage": "per_prompt_tracker"}))
    assert t.stateful and t.fn.buffer_size == 16 and t.fn.min_count == 16
    uids = torch.arange(16)
    batch = texts(*(["4"] * 8 + ["7"] * 8))
    r1 = torch.tensor([float(i) for i in range(16)], dtype=torch.float64)  # 0..15
    # batch: mean 7.5, population var (16^2 - 1) / 12 = 21.25
    want1 = [(x - 7.5) / (math.sqrt(21.25) + 1e-6) for x in range(16)]
    assert close(t(rewards=r1, prompt_uids=uids, batch=batch), want1, 1e-9)
    r2 = torch.tensor([10.0] * 8 + [1.0] * 7 + [float("nan")], dtype=torch.float64)
    got = t(rewards=r2, prompt_uids=uids, batch=batch)
    # prompt 0: buffer 0..7 then eight 10s: mean (28 + 80) / 16 = 6.75,
    #           var = (sum_{x=0..7} (x - 6.75)^2 + 8 * 3.25^2) / 16 = (126.5 + 84.5) / 16 = 13.1875
    m0 = 6.75
    v0 = (sum((x - m0) ** 2 for x in range(8)) + 8 * (10 - m0) ** 2) / 16
    assert abs(v0 - 13.1875) < 1e-12
    # prompt 1: buffer 8..15 then seven 1s (15 < 16): the batch statistics of the 15 scored rewards
    scored = [10.0] * 8 + [1.0] * 7
    mb = sum(scored) / 15
    sb = math.sqrt(sum((x - mb) ** 2 for x in scored) / 15)
    want2 = [(10 - m0) / (math.sqrt(v0) + 1e-6)] * 8 + [(1 - mb) / (sb + 1e-6)] * 7 + [0.0]
    assert close(got, want2, 1e-9)
    assert len(t.fn.buffers["4"]) == 16 and len(t.fn.buffers["7"]) == 15


def test_per_prompt_tracker_state_round_trip():
    """A tracker restored from a (JSON-serialised) state_dict continues exactly like the one that kept running,
    and a fresh one (no buffers) does not."""
    steps = [(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([0, 0, 1]), texts("p", "p", "q")),
             (torch.tensor([3.0, 5.0, 0.0, 2.0]), torch.tensor([0, 0, 1, 1]), texts("p", "p", "q", "q")),
             (torch.tensor([7.0, 9.0, 1.0]), torch.tensor([0, 0, 1]), texts("p", "p", "q"))]
    for key in ("prompt", "prompt_uid"):
        a = PerPromptTracker(tracker_buffer_size=4, tracker_min_count=3)
        for r, u, batch in steps[:2]:
            a(r, u, batch, per_prompt_key=key)
        state = json.loads(json.dumps(a.state_dict()))  # as a JSON checkpoint would hold it
        b = PerPromptTracker(tracker_buffer_size=4, tracker_min_count=3)
        b.load_state_dict(state)
        assert b.state_dict() == a.state_dict()
        assert all(buf.maxlen == 4 for buf in b.buffers.values())
        r, u, batch = steps[2]
        assert torch.equal(a(r, u, batch, per_prompt_key=key), b(r, u, batch, per_prompt_key=key))
        assert a.state_dict() == b.state_dict()
        fresh = PerPromptTracker(tracker_buffer_size=4, tracker_min_count=3)
        assert not torch.equal(fresh(r, u, batch, per_prompt_key=key), a(r, u, batch, per_prompt_key=key))


def test_per_prompt_tracker_config_checks():
    base = {"model": "tiny", "task": "repeat", "advantage": "per_prompt_tracker"}
    with pytest.raises(ConfigError, match="tracker_min_count"):
        Config.build({**base, "tracker_min_count": 17})
    with pytest.raises(ConfigError, match="tracker_buffer_size"):
        Config.build({**base, "tracker_buffer_size": 0})
    Config.build({**base, "tracker_buffer_size": 32, "tracker_min_count": 8})


# ----------------------------------------------------------------------------- advantage clipping


def test_advantage_clip_hand_computed():
    """torch.clamp(A, -adv_clip_max, adv_clip_max), as the DDPO and Flow-GRPO loops do before the loss."""
    assert WEIGHTINGS.get("advantage_clip") is advantage_clip
    a = torch.tensor([-7.0, -5.0, -1.0, 0.0, 2.5, 5.0, 6.0])
    assert advantage_clip(a).tolist() == [-5.0, -5.0, -1.0, 0.0, 2.5, 5.0, 5.0]  # default 5
    a2 = torch.tensor([[3.0, -0.5], [-2.5, 1.0]])
    assert advantage_clip(a2, adv_clip_max=2.0).tolist() == [[2.0, -0.5], [-2.0, 1.0]]
    with pytest.raises(ValueError, match="adv_clip_max"):
        advantage_clip(a, adv_clip_max=0.0)
    assert Config.build({"model": "tiny", "task": "repeat", "advantage_weightings": ["advantage_clip"]}
                        ).adv_clip_max == 5.0


# ----------------------------------------------------------------------------- which denoising steps train


def _image_batch(R: int = 4, T: int = 10, mask: torch.Tensor | None = None) -> RolloutBatch:
    """R rows of T denoising steps, step_data x [R, T, 2] and advantages [R, T]."""
    m = torch.ones(R, T) if mask is None else mask
    b = RolloutBatch(prompt_ids=torch.ones(R, 1, dtype=torch.long), prompt_mask=torch.ones(R, 1, dtype=torch.long),
                     completion_ids=torch.zeros(R, T, dtype=torch.long), completion_mask=m.clone(),
                     behavior_logprobs=-torch.rand(R, T, generator=torch.Generator().manual_seed(1)),
                     group_ids=torch.zeros(R, dtype=torch.long), prompt_uids=torch.zeros(R, dtype=torch.long),
                     truncated=torch.zeros(R, dtype=torch.bool),
                     step_data={"x": torch.randn(R, T, 2, generator=torch.Generator().manual_seed(0))},
                     row_data={"label": torch.arange(R)})
    b.advantages = torch.arange(1, R + 1, dtype=torch.float32)[:, None] * m
    return b


def _ctx(seed: int) -> SimpleNamespace:
    return SimpleNamespace(generator=torch.Generator().manual_seed(seed))


def _kept(b: RolloutBatch) -> list[list[int]]:
    return [torch.nonzero(row).flatten().tolist() for row in b.completion_mask]


def test_denoising_steps_in_order_keeps_the_first_k():
    """Flow-GRPO: ``range(int(num_steps * timestep_fraction))``: T = 10 at 0.99 -> int(9.9) = 9, the first 9
    steps (all but the last); at 0.6 -> 6; at 1.0 every step (the default changes nothing)."""
    b = _image_batch()
    out = denoising_steps(b, _ctx(0), steps_fraction=0.99, steps_order="in_order")
    assert _kept(out) == [list(range(9))] * 4
    assert _kept(denoising_steps(b, _ctx(0), steps_fraction=0.6)) == [list(range(6))] * 4
    assert torch.equal(denoising_steps(b, _ctx(0)).completion_mask, b.completion_mask)
    # only the mask (and the advantages off it) change; the input batch is left as it was
    assert torch.equal(out.step_data["x"], b.step_data["x"]) and torch.equal(out.row_data["label"], b.row_data["label"])
    assert torch.equal(out.behavior_logprobs, b.behavior_logprobs)
    assert torch.equal(out.completion_attention_mask, b.completion_attention_mask)
    assert torch.equal(out.advantages, b.advantages * out.completion_mask)
    assert bool((b.completion_mask == 1).all())
    # a row's own loss steps count: a row with 5 of 10 steps keeps int(5 * 0.6) = 3 of them
    m = torch.ones(2, 10)
    m[1, 5:] = 0
    assert _kept(denoising_steps(_image_batch(2, 10, m), _ctx(0), steps_fraction=0.6)) == [[0, 1, 2, 3, 4, 5],
                                                                                          [0, 1, 2]]


def test_denoising_steps_random_keeps_k_per_row():
    """DDPO: a uniform random permutation per row, the first int(T * fraction) of it: exactly k per row,
    different rows differ, the same seed gives the same steps, another seed other steps."""
    b = _image_batch(R=8, T=10)
    out = denoising_steps(b, _ctx(3), steps_fraction=0.6, steps_order="random")
    kept = _kept(out)
    assert all(len(k) == 6 for k in kept)
    assert len({tuple(k) for k in kept}) > 1
    assert kept != [list(range(6))] * 8
    assert _kept(denoising_steps(b, _ctx(3), steps_fraction=0.6, steps_order="random")) == kept
    assert _kept(denoising_steps(b, _ctx(4), steps_fraction=0.6, steps_order="random")) != kept
    # the draws are DDPO's: row i keeps the first k of torch.randperm(T) drawn in row order
    g = torch.Generator().manual_seed(3)
    want = [sorted(torch.randperm(10, generator=g)[:6].tolist()) for _ in range(8)]
    assert kept == want
    assert torch.equal(out.step_data["x"], b.step_data["x"])
    # every step is drawn about equally often (k/T = 0.6 each), over many rows
    big = denoising_steps(_image_batch(R=2000, T=10), _ctx(5), steps_fraction=0.6, steps_order="random")
    freq = big.completion_mask.mean(0)
    assert bool(((freq - 0.6).abs() < 0.05).all()) and bool((big.completion_mask.sum(1) == 6).all())
    with pytest.raises(ValueError, match="generator"):
        denoising_steps(b, SimpleNamespace(), steps_order="random")


def test_denoising_steps_drop_last():
    """``steps_drop_last``: the last step never trains; k = int((T - 1) * fraction)."""
    b = _image_batch(R=6, T=10)
    assert _kept(denoising_steps(b, _ctx(0), steps_drop_last=True)) == [list(range(9))] * 6
    out = denoising_steps(b, _ctx(0), steps_fraction=0.6, steps_order="random", steps_drop_last=True)
    kept = _kept(out)
    assert all(len(k) == 5 for k in kept)  # int(9 * 0.6) = int(5.4) = 5
    assert all(9 not in k for k in kept)
    big = denoising_steps(_image_batch(R=500, T=10), _ctx(1), steps_fraction=0.6, steps_order="random",
                          steps_drop_last=True)
    assert float(big.completion_mask[:, 9].sum()) == 0.0


def test_denoising_steps_registration_and_checks():
    assert BATCH_STAGES.get("denoising_steps") is denoising_steps
    assert BATCH_STAGES.needs("denoising_steps") == ("gaussian_steps",)
    with pytest.raises(ValueError, match="steps_fraction"):
        denoising_steps(_image_batch(), _ctx(0), steps_fraction=0.0)
    with pytest.raises(ValueError, match="steps_order"):
        denoising_steps(_image_batch(), _ctx(0), steps_order="backwards")
