"""Adaptive prompt samplers (VADE, VAS, SRPO history resampling, Prompt-GDRO): hand values and relations."""
import io
import warnings

import pytest
import torch

from grpolab.config import Config
from grpolab.prompts import SAMPLERS
from grpolab.prompts.adaptive import prompt_outcomes, trajectory_diversity
from grpolab.train.trainer import build_sampler
from grpolab.train.checkpoint import decode_state, encode_state

T = torch.tensor
NAN = float("nan")


def fb(sampler, uids, rewards, **kw):
    kw.setdefault("lengths", torch.ones(len(uids)))
    sampler.feedback(prompt_uids=T(uids), rewards=T(rewards, dtype=torch.float32),
                     group_ids=T(uids), reward_matrix=T(rewards)[:, None], step=0, **kw)


# ----------------------------------------------------------------------------- shared rule

def test_prompt_outcomes_threshold_and_nan():
    out = prompt_outcomes(T([0, 0, 1, 1, 2]), T([1.0, 0.4, NAN, 1.0, NAN]), 1.0)
    # prompt 0: 1.0 >= 1 success, 0.4 failure; prompt 1: NaN ignored, 1 success; prompt 2: nothing scorable
    assert out == {0: (1, 2), 1: (1, 1), 2: (0, 0)}
    assert prompt_outcomes(T([0, 0]), T([0.6, 0.4]), 0.5) == {0: (1, 2)}


# ----------------------------------------------------------------------------- VADE

def vade(n=3, **kw):
    return SAMPLERS.get("vade")(num_rows=n, seed=0, **kw)


def test_vade_posterior_update_and_two_scale_decay_hand_values():
    s = vade(2, vade_step_decay=0.5, vade_visit_decay=0.5)
    fb(s, [0, 0, 0, 0], [1, 1, 1, 0])
    # all at the prior (1, 1): decays change nothing; prompt 0: a = 1 + 3 = 4, b = 1 + 1 = 2
    assert s.alpha.tolist() == [4.0, 1.0] and s.beta.tolist() == [2.0, 1.0]
    fb(s, [1, 1], [0, 0])
    # step decay: a0 = 1 + .5*(4-1) = 2.5, b0 = 1 + .5*(2-1) = 1.5; prompt 1: b = 1 + 2 = 3
    assert s.alpha.tolist() == [2.5, 1.0] and s.beta.tolist() == [1.5, 3.0]
    fb(s, [0, 0], [1, 1])
    # prompt 0: step a = 1 + .5*1.5 = 1.75, b = 1 + .5*.5 = 1.25;
    #           visit a = 1 + .5*.75 = 1.375, b = 1 + .5*.25 = 1.125; + 2 successes: a = 3.375
    # prompt 1: step b = 1 + .5*2 = 2
    assert torch.allclose(s.alpha, T([3.375, 1.0], dtype=torch.float64))
    assert torch.allclose(s.beta, T([1.125, 2.0], dtype=torch.float64))


def test_vade_posteriors_decay_to_the_prior():
    s = vade(2, vade_step_decay=0.9, vade_visit_decay=1.0)
    fb(s, [0] * 10, [1.0] * 8 + [0.0] * 2)          # a = 9, b = 3
    var0 = (s.alpha * s.beta / ((s.alpha + s.beta) ** 2 * (s.alpha + s.beta + 1)))[0].item()
    for _ in range(20):
        fb(s, [1], [NAN])                            # prompt 0 not visited: only the slow decay
    # the first step decayed nothing (all at the prior), then a = 9, b = 3; each of the 20 later steps
    # shrinks the evidence above the prior by 0.9: a - 1 = 8 * 0.9^20, b - 1 = 2 * 0.9^20
    assert s.alpha[0].item() == pytest.approx(1 + 8 * 0.9 ** 20)
    assert s.beta[0].item() == pytest.approx(1 + 2 * 0.9 ** 20)
    var1 = (s.alpha * s.beta / ((s.alpha + s.beta) ** 2 * (s.alpha + s.beta + 1)))[0].item()
    assert var1 > var0                               # uncertainty grows back: the prompt gets re-explored


def test_vade_prefers_success_probability_near_one_half():
    s = vade(3, vade_step_decay=1.0, vade_visit_decay=1.0)
    fb(s, [0] * 1000, [1.0] * 500 + [0.0] * 500)     # p ~ 0.5
    fb(s, [1] * 1000, [1.0] * 990 + [0.0] * 10)      # p ~ 0.99
    fb(s, [2] * 1000, [1.0] * 10 + [0.0] * 990)      # p ~ 0.01
    assert all(s.next(1) == [0] for _ in range(30))
    picks = s.next(2)
    assert picks[0] == 0 and sorted(picks) != [0, 0]  # top-k: no duplicates

    # weak evidence: the near-1/2 prompt is still picked most often
    w = vade(3, vade_step_decay=1.0, vade_visit_decay=1.0)
    fb(w, [0] * 4 + [1] * 4 + [2] * 4, [1, 1, 0, 0] + [1, 1, 1, 1] + [0, 0, 0, 0])
    counts = torch.bincount(T([w.next(1)[0] for _ in range(300)]), minlength=3)
    assert counts[0] > counts[1] and counts[0] > counts[2]


def test_vade_draw_leaves_global_rng_alone():
    s = vade(5)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    s.next(2)
    assert torch.equal(torch.rand(3), expected)


# ----------------------------------------------------------------------------- VAS

def test_trajectory_diversity_hand_values():
    ids = T([[1, 2, 3], [1, 2, 4], [5, 6, 0]])
    # bigrams {12,23}, {12,24}, {56}: shared with others 1/2, 1/2, 0 -> TDS = 1 - 1/3 = 2/3
    assert trajectory_diversity(ids, T([3, 3, 2])) == pytest.approx(2 / 3)
    assert trajectory_diversity(T([[1, 2, 3], [1, 2, 3]]), T([3, 3])) == 0.0


def test_vas_vps_hand_values_and_refresh_interval():
    s = SAMPLERS.get("vas")(num_rows=3, seed=0, vas_update_interval=2, vas_tds_weight=0.5)
    ids = T([[1, 2, 3], [1, 2, 4], [5, 6, 0], [1, 2, 3]])
    fb(s, [0, 0, 0, 0], [1, 0, 0, 0], completion_ids=ids, lengths=T([3, 3, 2, 3]))
    # p = 1/4: OVS = 3/16 = 0.1875; bigrams {12,23},{12,24},{56},{12,23}: shared 1, 1/2, 0, 1
    # -> TDS = 1 - 2.5/4 = 0.375; VPS = 0.1875 + 0.5 * 0.375 = 0.375
    assert s.vps[0].item() == pytest.approx(0.375)
    assert s.vps[1].item() == 0.25                    # unseen: vas_init_score
    assert s.weights[0].item() == 0.25                # not refreshed yet (interval 2)
    fb(s, [1, 1], [1, 1])                             # without ids: TDS = 0; p = 1 -> VPS = 0
    assert s.vps[1].item() == 0.0
    assert torch.allclose(s.weights, s.vps)           # refreshed at the 2nd update


def test_vas_samples_by_vps_and_mixes_uniform():
    s = SAMPLERS.get("vas")(num_rows=4, seed=1, vas_mix=1.0, vas_min_score=1e-9)
    fb(s, [0, 0, 1, 1, 2, 2, 3, 3], [1, 0, 1, 1, 0, 0, 1, 1])   # VPS = 0.25, 0, 0, 0
    assert all(s.next(1) == [0] for _ in range(20))
    u = SAMPLERS.get("vas")(num_rows=4, seed=1, vas_mix=0.0)
    fb(u, [0, 0, 1, 1, 2, 2, 3, 3], [1, 0, 1, 1, 0, 0, 1, 1])
    assert sorted(u.next(4)) == [0, 1, 2, 3]
    half = SAMPLERS.get("vas")(num_rows=4, seed=1, vas_mix=0.5, vas_min_score=1e-9)
    fb(half, [0, 0, 1, 1, 2, 2, 3, 3], [1, 0, 1, 1, 0, 0, 1, 1])
    for _ in range(10):
        picks = half.next(2)
        assert picks[0] == 0 and picks[1] != 0        # one by VPS, one uniform from the rest


# ----------------------------------------------------------------------------- SRPO history resampling

def test_srpo_skips_prompts_all_correct_in_previous_epoch():
    s = SAMPLERS.get("srpo_history")(num_rows=4, seed=0)
    assert sorted(s.next(4)) == [0, 1, 2, 3]
    # epoch 1: prompt 0 all correct, 1 mixed, 2 all wrong, 3 unscorable
    fb(s, [0, 0, 1, 1, 2, 2, 3, 3], [1, 1, 1, 0, 0, 0, NAN, NAN])
    assert sorted(s.next(3)) == [1, 2, 3] and s.skipped == 1 and s.epoch == 2
    fb(s, [1, 1, 2, 2, 3, 3], [1, 1, 0, 1, 0, 0])        # epoch 2: prompt 1 now all correct
    assert sorted(s.next(3)) == [0, 2, 3]                 # 0 is back, 1 is skipped
    assert s.epoch == 3


def test_srpo_permanent_drop_and_clear_when_all_solved():
    s = SAMPLERS.get("srpo_history")(num_rows=3, seed=0, srpo_drop_permanently=True)
    s.next(3)
    fb(s, [0, 0, 1, 1, 2, 2], [1, 1, 0, 1, 0, 0])
    assert sorted(s.next(2)) == [1, 2]
    fb(s, [1, 1, 2, 2], [0, 1, 1, 0])
    assert sorted(s.next(2)) == [1, 2]                    # 0 stays out in epoch 3
    fb(s, [1, 1, 2, 2], [1, 1, 1, 1])                     # now every prompt is solved
    with pytest.warns(UserWarning, match="clearing the history"):
        assert sorted(s.next(3)) == [0, 1, 2]


# ----------------------------------------------------------------------------- Prompt-GDRO

def gdro(n=2, **kw):
    kw = {"gdro_bin_edges": [0.5], "gdro_window": 2, "gdro_gamma": 0.1, **kw}
    return SAMPLERS.get("prompt_gdro")(num_rows=n, seed=0, **kw)


def test_prompt_gdro_hand_values():
    s = gdro()
    assert s.bins().tolist() == [1, 1]                    # unseen: pass@k 0.5 -> bin [0.5, 1]
    fb(s, [0, 0, 1, 1], [0, 0, 1, 0])
    # bin 1 error rate 3/4: m = 0.1 * 0.75 = 0.075, debiased 0.075 / (1 - 0.9) = 0.75
    assert s.debiased_loss().tolist() == pytest.approx([0.0, 0.75])
    assert s.log_w.tolist() == pytest.approx([-0.75, 0.0])
    # pass@2: prompt 0 no success -> 0 (bin 0); prompt 1 -> 1 (bin 1)
    assert s.pass_at_k().tolist() == [0.0, 1.0] and s.bins().tolist() == [0, 1]
    # q = 0.9 softmax([-0.75, 0]) + 0.05 = 0.9 * [0.32082, 0.67918] + 0.05
    assert s.probabilities().tolist() == pytest.approx([0.338738, 0.661262], abs=1e-5)
    fb(s, [0, 0], [0, 0])
    # bin 0: error 1 -> debiased 1.0; bin 1 keeps 0.75: log w = [-0.75 + 1, 0.75] -> shifted [-0.5, 0]
    assert s.log_w.tolist() == pytest.approx([-0.5, 0.0])


def test_prompt_gdro_upweights_persistently_hard_bins():
    s = gdro(4, gdro_window=1)
    for _ in range(30):
        fb(s, [0, 0, 1, 1, 2, 2, 3, 3], [0, 0, 0, 0, 1, 1, 1, 1])   # prompts 0, 1 always fail
    q = s.probabilities()
    assert q[0] > 0.94 and q[0] <= 0.95 + 1e-9          # floor gamma / B = 0.05 for the easy bin
    picks = torch.bincount(T(s.next(400)), minlength=4)
    assert picks[:2].sum() > 340


def test_prompt_gdro_has_no_frequency_bias():
    """A bin's weight moves by its error *rate*, once per step: 2 rows or 6 rows at the same rate
    give the same weights."""
    few, many = gdro(4), gdro(4)
    for _ in range(3):
        fb(few, [0, 0], [1, 0])                              # bin 1: 2 rows, error 1/2
        fb(many, [0, 0, 1, 1, 2, 2], [1, 0, 1, 0, 1, 0])     # bin 1: 6 rows, error 1/2
        assert torch.allclose(few.log_w, many.log_w) and torch.allclose(few.m, many.m)
    # error 1/2 every step: the debiased EMA is exactly 0.5 (0.05/0.1, 0.095/0.19, 0.1355/0.271)
    assert few.debiased_loss()[1].item() == pytest.approx(0.5)


def test_prompt_gdro_draws_only_from_the_favoured_bin_without_exploration():
    s = gdro(4, gdro_gamma=0.0, gdro_window=1)
    for _ in range(20):
        fb(s, [0, 0, 1, 1, 2, 2, 3, 3], [0, 0, 0, 0, 1, 1, 1, 1])
    assert s.probabilities()[1].item() < 1e-6
    picks = s.next(4)
    assert sorted(picks) == [0, 0, 1, 1]                  # bin 0 = {0, 1}, without replacement per cycle


# ----------------------------------------------------------------------------- exact resume (all samplers)

def outcome(uids):
    # deterministic outcomes: prompt u succeeds on completion j when (u + j) % 3 == 0
    rewards = [1.0 if (u + j) % 3 == 0 else 0.0 for u in uids for j in range(2)]
    return [u for u in uids for _ in range(2)], rewards


@pytest.mark.parametrize("name", ["vade", "vas", "srpo_history", "prompt_gdro"])
def test_resumed_sampler_makes_the_same_choices(name):
    cfg = Config.build({"prompt_sampler": name})
    a = build_sampler(cfg, [{}] * 7)
    for _ in range(3):
        fb(a, *outcome(a.next(3)))
    buf = io.BytesIO()
    torch.save(encode_state(a.state_dict()), buf)  # the checkpoint format: tensors and plain data only
    buf.seek(0)
    b = build_sampler(Config.build({"prompt_sampler": name}), [{}] * 7)
    b.load_state_dict(decode_state(torch.load(buf, weights_only=True)))
    for _ in range(6):
        pa, pb = a.next(3), b.next(3)
        assert pa == pb
        fb(a, *outcome(pa))
        fb(b, *outcome(pb))
    assert a.next(5) == b.next(5)
    with pytest.raises(ValueError, match="rows"):
        build_sampler(cfg, [{}] * 8).load_state_dict(a.state_dict())


@pytest.mark.parametrize("name", ["vade", "vas", "srpo_history", "prompt_gdro"])
def test_sampler_returns_valid_indices_even_beyond_dataset_size(name):
    s = build_sampler(Config.build({"prompt_sampler": name}), [{}] * 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        picks = s.next(7)
    assert len(picks) == 7 and all(0 <= p < 3 for p in picks)
    assert set(picks) == {0, 1, 2}
