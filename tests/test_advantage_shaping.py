"""Advantage shaping: uncertainty, entropy, token-level, stateful and span-decoupled advantages.

Every expected number is computed by hand in the comments next to it.
"""
import io
import math

import pytest
import torch

from grpolab.algorithms import ADVANTAGES, AGGREGATIONS, POLICY_LOSSES, WEIGHTINGS, StepTotals, group_zscore
from grpolab.algorithms.adv_shaping import SPOValueTracker, AAPOMomentum, asymmetric_soft_reward, sgrpo_weight
from grpolab.algorithms.answer_keys import last_number_key
from grpolab.algorithms.weightings import semantic_entropy, shared_prefix_counts
from grpolab.batch import RolloutBatch
from grpolab.components import Component
from grpolab.config import Config
from grpolab.recipes import recipe_overrides

EPS = 1e-4


def make_batch(completion_ids, mask=None, logprobs=None, group_ids=None, prompt_uids=None, completions=None,
               span_ids=None, reward_names=None):
    ids = torch.as_tensor(completion_ids, dtype=torch.long)
    R, T = ids.shape
    mask = torch.ones(R, T) if mask is None else torch.as_tensor(mask, dtype=torch.float32)
    lp = torch.zeros(R, T) if logprobs is None else torch.as_tensor(logprobs, dtype=torch.float32)
    gids = torch.zeros(R, dtype=torch.long) if group_ids is None else torch.as_tensor(group_ids)
    uids = gids.clone() if prompt_uids is None else torch.as_tensor(prompt_uids)
    cols = {} if completions is None else {"completion": list(completions)}
    b = RolloutBatch(prompt_ids=torch.zeros(R, 1, dtype=torch.long), prompt_mask=torch.ones(R, 1, dtype=torch.long),
                     completion_ids=ids, completion_mask=mask, behavior_logprobs=lp * mask, group_ids=gids,
                     prompt_uids=uids, truncated=torch.zeros(R, dtype=torch.bool), columns=cols,
                     span_ids=None if span_ids is None else torch.as_tensor(span_ids, dtype=torch.long))
    b.reward_names = list(reward_names or [])
    return b


# ------------------------------------------------------------------ SEED-GRPO (000-86)

def test_answer_keys():
    assert last_number_key("so the answer is 3") == "3"
    assert last_number_key("x = 3.0\n") == "3" == last_number_key("3.00")
    assert last_number_key("1/2 of 7/3") == "7/3"
    assert last_number_key("no digits\n final line  \n") == "final line"


def test_semantic_entropy_hand_computed():
    # group 0 keys a,a,a,b: p = 3/4, 1/4; SE = -(log .75 + log .25)/2 = (0.287682 + 1.386294)/2 = 0.836988
    # group 1 keys a,b,c,d: SE = -(4 log 1/4)/4 = log 4 = 1.386294 (= SE_max)
    se, se_max = semantic_entropy(list("aaab") + list("abcd"), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]))
    assert se[0].item() == pytest.approx(0.836988, abs=1e-6)
    assert se[4].item() == pytest.approx(math.log(4))
    assert se_max[0].item() == pytest.approx(math.log(4))


def test_seed_semantic_entropy_scaling():
    fn = WEIGHTINGS.get("seed_semantic_entropy")
    texts = ["the answer is 3", "3.0", "x = 3\n", "5",       # keys 3,3,3,5 -> SE/SE_max = 0.836988/1.386294
             "1", "2", "3", "4",                            # all differ -> SE/SE_max = 1
             "7", "seven is 7", "7", "7.0"]                 # one answer -> SE = 0
    batch = make_batch([[0]] * 12, completions=texts)
    gids = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
    adv = torch.ones(12)
    out = fn(adv, gids, batch, seed_alpha=0.5, seed_scaling="linear", seed_equivalence="last_number")
    # linear: f = 1 - 0.5 * 0.603759 = 0.698120; 1 - 0.5 = 0.5; 1
    assert out[0].item() == pytest.approx(0.698120, abs=1e-6)
    assert out[4].item() == pytest.approx(0.5)
    assert torch.equal(out[8:], adv[8:])  # confident prompt keeps its advantages exactly
    out = fn(adv, gids, batch, seed_alpha=0.5, seed_scaling="exponential", seed_equivalence="last_number")
    assert out[0].item() == pytest.approx(math.exp(-0.301880), abs=1e-6)  # 0.739444
    # [R, T] advantages are scaled per row
    out2 = fn(torch.ones(12, 3), gids, batch, seed_alpha=0.5, seed_equivalence="last_number")
    assert out2[4].tolist() == pytest.approx([0.5, 0.5, 0.5])


def seed_authors(cluster_logliks, alpha=0.5):
    """SEED-GRPO's linear factor written from the paper: p(C_k) = sum_{i in C_k} pi(o_i) / sum_j pi(o_j),
    SE = -(1/K) sum_k log p(C_k), f = 1 - alpha * min(SE / log G, 1)."""
    mass = [sum(math.exp(x) for x in c) for c in cluster_logliks]
    G = sum(len(c) for c in cluster_logliks)
    se = -sum(math.log(m / sum(mass)) for m in mass) / len(mass)
    return 1 - alpha * min(se / math.log(G), 1.0)


def test_seed_cluster_probability_is_the_likelihood_mass():
    from grpolab.batch import INJECTED
    fn = WEIGHTINGS.get("seed_semantic_entropy")
    # group 0: keys 3,3,3,5; sampled-token log-probs (row 1's third token is injected: not pi_old's)
    #   sums  -1.0, -2.0, -2.0 | -0.3   -> pi = .367879, .135335, .135335 | .740818
    #   p(C_3) = .638550 / 1.379368 = .462929, p(C_5) = .537071
    #   SE = -(ln .462929 + ln .537071) / 2 = .695903; / ln 4 = .501988; f = 1 - .5 * .501988 = .749006
    #   frequency instead: p = 3/4, 1/4 -> SE = .836988 -> f = .698120 (the two differ)
    # group 1: one answer, unequal likelihoods -> p = 1, SE = 0, f = 1
    lp = [[-0.5, -0.5, 0.0], [-1.0, -1.0, -5.0], [-1.5, -0.5, 0.0], [-0.1, -0.2, 0.0],
          [-0.1, 0.0, 0.0], [-3.0, -2.0, 0.0]]
    mask = [[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 0, 0], [1, 1, 0]]
    batch = make_batch([[1, 2, 3]] * 6, mask=mask, logprobs=lp,
                       completions=["3", "so 3", "3.0", "5", "7", "it is 7"])
    batch.token_origin[1, 2] = INJECTED
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    out = fn(torch.ones(6), g, batch, seed_alpha=0.5, seed_equivalence="last_number")
    assert out.tolist() == pytest.approx([0.749006] * 4 + [1.0] * 2, abs=1e-6)
    assert out[0].item() == pytest.approx(seed_authors([[-1.0, -2.0, -2.0], [-0.3]]), abs=1e-6)
    freq = fn(torch.ones(6), g, batch, seed_alpha=0.5, seed_cluster_probability="frequency")
    assert freq[:4].tolist() == pytest.approx([0.698120] * 4, abs=1e-6)
    # token_mass: per-token means -.5, -1, -1 | -.15 -> pi = .606531, .367879, .367879 | .860708
    #   p = 1.342289 / 2.202997 = .609301, .390699; SE = (.495444 + .939817) / 2 = .717631; f = .741169
    tok = fn(torch.ones(6), g, batch, seed_alpha=0.5, seed_cluster_probability="token_mass")
    assert tok[:4].tolist() == pytest.approx([0.741169] * 4, abs=1e-6)
    assert tok[:4].tolist() == pytest.approx([seed_authors([[-0.5, -1.0, -1.0], [-0.15]])] * 4, abs=1e-6)
    # equal likelihoods: the mass is the frequency
    same = make_batch([[1]] * 4, logprobs=[[-0.7]] * 4, completions=["3", "3", "3", "5"])
    assert fn(torch.ones(4), g[:4], same).tolist() == pytest.approx([0.698120] * 4, abs=1e-6)
    # a cluster with almost no mass: SE = 15.05 > log 4, clipped at SE_max -> f = 1 - alpha (never negative)
    rare = make_batch([[1]] * 4, logprobs=[[-1.0], [-1.0], [-1.0], [-30.0]], completions=["3", "3", "3", "5"])
    assert fn(torch.ones(4), g[:4], rare, seed_alpha=1.0).tolist() == pytest.approx([0.0] * 4, abs=1e-12)
    with pytest.raises(ValueError, match="seed_cluster_probability"):
        fn(torch.ones(4), g[:4], rare, seed_cluster_probability="count")


def test_seed_pluggable_equivalence():
    fn = WEIGHTINGS.get("seed_semantic_entropy")
    # os.path:basename as the key: "x/3" and "y/3" are one answer, "z/4" another -> keys 3,3,4,4
    batch = make_batch([[0]] * 4, completions=["x/3", "y/3", "z/4", "w/4"])
    out = fn(torch.ones(4), torch.zeros(4, dtype=torch.long), batch, seed_alpha=1.0, seed_equivalence="os.path:basename")
    # SE = -(log .5 + log .5)/2 = log 2; SE/SE_max = log2/log4 = 0.5; f = 1 - 0.5
    assert out.tolist() == pytest.approx([0.5] * 4)
    with pytest.raises(ValueError, match="seed_equivalence"):
        fn(torch.ones(4), torch.zeros(4, dtype=torch.long), batch, seed_equivalence="nonsense")


# -------------------------------------------------------------------- S-GRPO (000-32)

def test_sgrpo_weight_hand_computed():
    # n=4, k=1, p=0.1: q=.25, t=(.25-.1)/.8=.1875, t(1-t)=.15234375, num=.8*.15234375=.121875
    # den = sqrt(.1875) * sqrt(.15234375) = .4330127 * .3903124 = .1690103 -> w = .721110
    # n=4, k=2: q=t=.5 -> w = .8*.25 / (.5*.5) = .8 ; k=0: t=0 -> w=0
    w = sgrpo_weight(torch.tensor([4.0, 4.0, 4.0]), torch.tensor([1.0, 2.0, 0.0]), 0.1)
    assert w.tolist() == pytest.approx([0.721110, 0.8, 0.0], abs=1e-5)
    with pytest.raises(ValueError):
        sgrpo_weight(torch.tensor([4.0]), torch.tensor([1.0]), 0.5)


def test_sgrpo_advantage():
    fn = ADVANTAGES.get("sgrpo_noise_aware")
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    out = fn(r, g, advantage_epsilon=EPS, sgrpo_noise_p=0.1)
    z = group_zscore(r, g, advantage_epsilon=EPS)
    assert out[:4].tolist() == pytest.approx((z[:4] * 0.721110).tolist(), abs=1e-5)
    assert out[4:].tolist() == pytest.approx((z[4:] * 0.8).tolist(), abs=1e-6)
    # p = 0: w* = t(1-t)/(t(1-t)+eps) ~= 1 -> GRPO
    assert torch.allclose(fn(r, g, sgrpo_noise_p=0.0), z, atol=1e-6)


# ---------------------------------------------------------------- EDGE-GRPO (000-25)

def test_sgrpo_matches_the_authors_drgrpo_branch():
    # authors (shenpeijun0212/S-GRPO, train/train_S-GRPO.py): group_weight(n, k, p) and the critic_type "drgrpo"
    # branch of compute_monte_carlo_advantages: A = (r - mean_g) * w*(n, k, p) / (sample std_g + 1e-8), k = #(r > 0),
    # written out here in plain python; groups: single correct, two correct, all correct, all wrong
    def w_star(n, k, p, eps=1e-8):
        q = k / n
        t = max(0.0, min(1.0, (q - p) / (1 - 2 * p)))
        return (1 - 2 * p) * t * (1 - t) / (math.sqrt(q * (1 - q) + eps) * math.sqrt(t * (1 - t) + eps))

    def authors(rewards, n, p):
        out = []
        for i in range(0, len(rewards), n):
            g = rewards[i:i + n]
            m = sum(g) / n
            sd = math.sqrt(sum((x - m) ** 2 for x in g) / (n - 1))
            w = w_star(n, sum(x > 0 for x in g), p)
            out += [(x - m) * w / (sd + 1e-8) for x in g]
        return out

    r = [1.0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0]
    g = torch.arange(4).repeat_interleave(4)
    # by hand, p = .1: single correct q = .25, t = .1875, w* = .8 * .152344 / (.433013 * .390312) = .721110;
    # two correct q = .5, t = .5 -> w* = .8 * .25 / (.5 * .5) = .8
    assert w_star(4, 1, 0.1) == pytest.approx(0.721110, abs=1e-6) and w_star(4, 2, 0.1) == pytest.approx(0.8, abs=1e-6)
    for p in (0.0, 0.1, 0.3):
        expect = authors(r, 4, p)
        got = ADVANTAGES.get("sgrpo_noise_aware")(torch.tensor(r), g, advantage_epsilon=1e-8, sgrpo_noise_p=p)
        assert got.tolist() == pytest.approx(expect, abs=1e-5)
    # p = .3: the single correct row is most likely a flipped label -> weight 0 (t clipped to 0), GRPO's is not
    assert authors(r, 4, 0.3)[:4] == pytest.approx([0.0] * 4, abs=1e-6)
    assert float(group_zscore(torch.tensor(r), g, advantage_epsilon=1e-8)[0]) == pytest.approx(1.5)


def test_edge_entropy_driven():
    fn = WEIGHTINGS.get("edge_entropy_driven")
    # P = mean -logprob over the row's tokens: row0 1, row1 (3+1)/2 = 2, rows 2,3: 3 (padding ignored)
    lp = torch.tensor([[-1.0, -1.0], [-3.0, -1.0], [-3.0, -3.0], [-3.0, -100.0]])
    mask = torch.tensor([[1.0, 1], [1, 1], [1, 1], [1, 0]])
    g = torch.tensor([0, 0, 1, 1])
    adv = torch.tensor([1.0, -1.0, 2.0, -2.0])
    out = fn(adv, g, lp * mask, mask, edge_normalize="group")
    # group 0 mean P 1.5: scales 1.5/1, 1.5/2; group 1 both P=3 -> scale 1
    assert out.tolist() == pytest.approx([1.5, -0.75, 2.0, -2.0])
    out = fn(adv, g, lp * mask, mask, edge_normalize="batch")
    # batch mean P = (1+2+3+3)/4 = 2.25: scales 2.25, 1.125, .75, .75
    assert out.tolist() == pytest.approx([2.25, -1.125, 1.5, -1.5])


# ---------------------------------------------------------------------- SPO (000-113)

class ThetaPolicy:
    """A stand-in policy for the tracker's drift: token t of a completion has log-prob -theta * t."""

    def __init__(self, theta=1.0):
        self.theta, self.calls = theta, 0

    def __call__(self, batch):
        self.calls += 1
        return -self.theta * batch.completion_ids.double() * batch.completion_attention_mask


def spo_step(tracker, policy, reward, ids, uid=7):
    """One step: the advantage (value before the step), then the tracker update under ``policy``."""
    b = make_batch([ids], prompt_uids=[uid])
    a = tracker(torch.tensor([reward]), torch.tensor([uid]), b).item()
    tracker.after_optimizer_step(policy)
    return a


def test_spo_tracker_hand_computed():
    """The authors' order (verl recipe/spo): A = r - v before the step; after the update, D on the prompt's
    last completion between the log-probs stored then and now, rho = clip(2^(-D / .06), .875, .96)."""
    t = SPOValueTracker(spo_rho_min=0.875, spo_rho_max=0.96, spo_kl_half=0.06, spo_prior_value=0.5,
                        spo_normalize="none")
    pol = ThetaPolicy(1.0)
    # step 1, new prompt: N0 = 1/(1-.875) = 8 -> a = b = 4, v = .5, A = 1 - .5. First visit: D = 0 -> rho =
    # clip(1) = .96: a = .96*4 + 1 = 4.84, b = .96*4 = 3.84; stored: y = [1, 2], log-probs [-1, -2]
    assert spo_step(t, pol, 1.0, [1, 2]) == pytest.approx(0.5)
    assert t.table[7] == pytest.approx((4.84, 3.84))
    assert t.last[7][1].tolist() == [[-1.0, -2.0]]
    # step 2: A = 0 - 4.84/8.68 = -.557604. The update moved theta to 1.03: on y_last = [1, 2] the log-probs are
    # now [-1.03, -2.06]: D = (.03 + .06)/2 = .045, 2^(-.045/.06) = .594604 -> clipped to .875:
    # a = .875*4.84 = 4.235, b = .875*3.84 + 1 = 4.36; stored: y = [3], log-prob -3.09
    pol.theta = 1.03
    assert spo_step(t, pol, 0.0, [3]) == pytest.approx(-4.84 / 8.68, abs=1e-6)
    assert t.table[7] == pytest.approx((4.235, 4.36))
    # step 3: v = 4.235/8.595 = .492728 -> A = .507272. theta 1.033: D = |-3.09 + 3.099| = .009 (on y_last = [3],
    # not on this step's completion) -> rho = 2^(-.15) = .901250 inside the clip: a = .90125*4.235 + 1 = 4.816793,
    # b = .90125*4.36 = 3.929450
    pol.theta = 1.033
    assert spo_step(t, pol, 1.0, [5, 5, 5]) == pytest.approx(1 - 4.235 / 8.595, abs=1e-6)
    assert t.table[7] == pytest.approx((2 ** -0.15 * 4.235 + 1, 2 ** -0.15 * 4.36), abs=1e-6)
    assert t.rho(0.009) == pytest.approx(0.9012504626, abs=1e-9)
    # the next advantage call before the update is an error, not a silent skip of the tracker update
    b = make_batch([[1]], prompt_uids=[7])
    t(torch.tensor([1.0]), torch.tensor([7]), b)
    with pytest.raises(RuntimeError, match="after_optimizer_step"):
        t(torch.tensor([1.0]), torch.tensor([7]), b)


def test_spo_batch_normalisation_and_groups():
    t = SPOValueTracker(spo_normalize="batch")
    r = torch.tensor([1.0, 0.0, 1.0, 0.0])
    uids = torch.tensor([1, 1, 2, 3])
    out = t(r, uids, make_batch([[1, 2], [1, 4], [2, 0], [3, 3]], mask=[[1, 1], [1, 1], [1, 0], [1, 1]],
                                prompt_uids=[1, 1, 2, 3]), advantage_epsilon=EPS)
    # fresh prompts: A = r - .5 = [.5,-.5,.5,-.5]; batch mean 0, std = sqrt(4*.25/3) = .57735
    assert out.tolist() == pytest.approx([0.5 / (0.57735027 + EPS), -0.5 / (0.57735027 + EPS)] * 2, abs=1e-6)
    pol = ThetaPolicy(1.0)
    t.after_optimizer_step(pol)
    assert pol.calls == 1  # nothing seen before: only this batch's log-probs, stored for the next visit
    assert t.table[1] == pytest.approx((0.96 * 4 + 1, 0.96 * 4 + 1))  # G = 2 rows of prompt 1 share one update
    assert t.last[2][1].tolist() == [[-2.0]]  # stored trimmed to the prompt's own completion width
    # prompt 1 again: D = mean over its 2 rows of each row's mean |delta|: theta 1 -> 1.1 changes row [1, 2] by
    # (.1 + .2)/2 = .15 and row [1, 4] by (.1 + .4)/2 = .25: D = .2 -> rho = clip(2^(-.2/.06)) = .875
    pol.theta = 1.1
    t(torch.tensor([1.0]), torch.tensor([1]), make_batch([[7]], prompt_uids=[1]))
    t.after_optimizer_step(pol)
    assert t.table[1] == pytest.approx((0.875 * 4.84 + 1, 0.875 * 4.84), abs=1e-9)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        t(torch.tensor([2.0]), torch.tensor([1]), make_batch([[1]], prompt_uids=[1]))
    # unscorable rows: A = 0, no tracker update
    out = t(torch.tensor([float("nan"), 1.0]), torch.tensor([9, 1]), make_batch([[1], [2]], prompt_uids=[9, 1]))
    t.after_optimizer_step(pol)
    assert out[0].item() == 0.0 and 9 not in t.table and 9 not in t.last


def test_spo_restore_is_exact():
    """Through the checkpoint's own encoding (weights_only loading): the table, the stored completions and their
    log-probs come back, and the restored tracker continues exactly as the original."""
    from grpolab.train.checkpoint import decode_state, encode_state
    gen = torch.Generator().manual_seed(0)

    def inputs():
        r = (torch.rand(6, generator=gen) > 0.5).float()
        uids = torch.randint(0, 4, (6,), generator=gen)
        ids = torch.randint(1, 9, (6, 3), generator=gen)
        return r, uids, make_batch(ids, prompt_uids=uids)

    a, pol = SPOValueTracker(), ThetaPolicy(1.0)
    for step in range(3):
        a(*inputs())
        pol.theta += 0.01
        a.after_optimizer_step(pol)
    buf = io.BytesIO()
    torch.save(encode_state(a.state_dict()), buf)
    buf.seek(0)
    b = SPOValueTracker()
    b.load_state_dict(decode_state(torch.load(buf, weights_only=True)))
    for _ in range(3):
        x = inputs()
        assert torch.equal(a(*x), b(*x))
        pol.theta += 0.01
        a.after_optimizer_step(pol)
        b.after_optimizer_step(pol)
    assert a.table == b.table and a.last.keys() == b.last.keys()


def test_spo_trainer_updates_the_tracker_with_the_updated_policy(tiny_args):
    """In the trainer the tracker update runs after the optimiser step: the log-probs stored for a prompt are the
    updated model's on that completion (not the behaviour log-probs it was sampled with)."""
    from grpolab.train.trainer import Trainer
    args = {**recipe_overrides("spo_single_stream"), **tiny_args, "steps": 1, "prompts_per_step": 3,
            "num_generations": 1, "learning_rate": 5e-2, "max_completion_length": 6}
    tr = Trainer(Config.build(args), log=lambda *a: None)
    seen = []
    compute, update = tr.compute_advantages, tr.update_strategy
    tr.compute_advantages = lambda batch: seen.append(batch) or compute(batch)

    def update_then_move(**kw):  # the step's update, plus a move of every weight that cannot go unnoticed
        out = update(**kw)
        with torch.no_grad():
            for p in tr.model.parameters():
                p.add_(0.05)
        return out
    tr.update_strategy = update_then_move
    tr.train(progress=False)
    tracker = tr.components["advantage/spo_single_stream"].fn
    assert tracker.pending is None and len(tracker.last) == 3
    batch = seen[0]
    for u, (stored, lp) in tracker.last.items():
        now = tr.ctx.logprobs(stored, model=tr.model).float()
        assert torch.allclose(lp, now, atol=1e-5)  # the model as the step left it
        row = batch.prompt_uids.tolist().index(u)
        T = lp.shape[1]
        behaviour = batch.behavior_logprobs[row, :T] * batch.completion_attention_mask[row, :T]
        assert not torch.allclose(lp[0], behaviour, atol=1e-3)  # ... not the policy that sampled it
        a, b = tracker.table[u]
        r = float(batch.scalar_rewards[row])
        assert (a, b) == pytest.approx((0.96 * 4 + r, 0.96 * 4 + 1 - r))  # first visit: rho = .96


def test_spo_recipe_single_stream_validates():
    cfg = Config.build(recipe_overrides("spo_single_stream"))
    assert cfg.num_generations == 1 and cfg.advantage == "spo_single_stream"
    comp = Component(ADVANTAGES.get("spo_single_stream"), cfg, "spo_single_stream")
    assert comp.stateful and comp.fn.rho_min == 0.875


# ----------------------------------------------------------------- lambda-GRPO (004-03)

def test_lambda_prefix_weight():
    fn = WEIGHTINGS.get("lambda_prefix_weight")
    ids = [[5, 6, 7], [5, 6, 8], [5, 9, 9], [5, 6, 7]]
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1]])
    g = torch.tensor([0, 0, 0, 1])  # row 3 repeats row 0 but is in another group: does not count
    batch = make_batch(ids, mask=mask, group_ids=g)
    # k: t0 all three share [5] -> 3; t1 rows 0,1 share [5,6] -> 2, row2 -> 1; t2 unique -> 1; padding 0
    k = shared_prefix_counts(batch.completion_ids, mask, g)
    assert k.tolist() == [[3, 2, 1], [3, 2, 1], [3, 1, 0], [1, 1, 1]]
    adv = torch.tensor([1.0, 2.0, 3.0, 4.0])
    out = fn(adv, g, mask, batch, lambda_grpo_power=1.0)
    assert out[0].tolist() == pytest.approx([1 / 3, 1 / 2, 1.0])
    assert out[2].tolist() == pytest.approx([1.0, 3.0, 0.0])
    # the shared first step counts once: its total weight is the mean advantage (1+2+3)/3 = 2
    assert out[:3, 0].sum().item() == pytest.approx(2.0)
    # lambda = 0 is GRPO
    assert torch.equal(fn(adv, g, mask, batch, lambda_grpo_power=0.0), adv[:, None].expand(4, 3) * mask)


def test_lambda_grpo_loss_matches_the_authors_trainer():
    # authors (coli-saar/grpo-prm, lambda_grpo/utils.py InfPRMTree.loss_scales + trainer.py _step, loss_type grpo):
    # token scale = 1 / (number of group trajectories through its tree node); identical trajectories share one
    # terminal node; loss = mean_i [ sum_t -min(r A, clip(r) A) * scale_t / #tokens_i ]
    from grpolab.algorithms import AGGREGATIONS, POLICY_LOSSES, StepTotals
    ids = [[5, 6, 7], [5, 6, 7], [5, 6, 8], [4, 4, 4]]  # rows 0 and 1 identical
    mask = torch.ones(4, 3)
    g = torch.zeros(4, dtype=torch.long)
    batch = make_batch(ids, mask=mask, group_ids=g)
    scales = [[1 / 3, 1 / 3, 1 / 2], [1 / 3, 1 / 3, 1 / 2], [1 / 3, 1 / 3, 1.0], [1.0, 1.0, 1.0]]
    adv = torch.tensor([1.0, 1.0, -0.5, -1.5])
    ratio = torch.tensor([[1.1, 0.7, 1.0], [1.0, 1.0, 1.3], [0.9, 1.25, 1.0], [1.0, 0.75, 1.0]])
    authors = 0.0
    for i in range(4):
        per = []
        for t in range(3):
            r, a = float(ratio[i, t]), float(adv[i])
            per.append(-min(r * a, min(max(r, 0.8), 1.2) * a) * scales[i][t])
        authors += sum(per) / 3
    authors /= 4
    w = WEIGHTINGS.get("lambda_prefix_weight")(adv, g, mask, batch, lambda_grpo_power=1.0)
    loss, _ = POLICY_LOSSES.get("clipped_ratio")(torch.log(ratio), torch.zeros(4, 3), w, mask, epsilon=0.2)
    ours = AGGREGATIONS.get("seq_mean_token_mean")(loss, mask, StepTotals.from_masks([mask], constant=3))
    assert float(ours) == pytest.approx(authors, abs=1e-6)


# --------------------------------------------------------------------- TW-GRPO (000-95)

def _k3(d):
    d = max(-11.0, min(11.0, d))
    return math.exp(d) - d - 1


def _authors_tw_weights(dists, alive, alpha):
    """The authors' compute_token_importance_kl_logs_uniform (longmalongma/TW-GRPO) for one group, in plain
    Python: dists[i][t] = row i's next-token distribution at t; a dead position takes the uniform one;
    m = mean_i log p_i; s_t = mean_i sum_v k3(m_v - log p_i,v); w = 1 + (alpha - 1) minmax(s)."""
    G, T, V = len(dists), len(dists[0]), len(dists[0][0])
    logp = [[[math.log(p) for p in dists[i][t]] if alive[i][t] else [-math.log(V)] * V for t in range(T)]
            for i in range(G)]
    s = []
    for t in range(T):
        m = [sum(logp[i][t][v] for i in range(G)) / G for v in range(V)]
        s.append(sum(sum(_k3(m[v] - logp[i][t][v]) for v in range(V)) for i in range(G)) / G)
    lo, hi = min(s), max(s)
    return [1 + (alpha - 1) * (x - lo) / (hi - lo + 1e-8) for x in s]


def _tw(dists, alive, group_ids, alpha=1.7, adv=None):
    """grpolab's path: per-row divergence from the log-probs, then the tw_token_weight weighting."""
    from grpolab.model.logprobs import tw_group_divergence
    lp = torch.tensor(dists, dtype=torch.float64).log()
    alive = torch.tensor(alive, dtype=torch.bool)
    g = torch.tensor(group_ids)
    D = torch.zeros(alive.shape, dtype=torch.float64)
    for gid in g.unique():
        rows = (g == gid).nonzero().squeeze(-1)
        D[rows] = tw_group_divergence(lp[rows], alive[rows])
    R, T = alive.shape
    batch = make_batch(torch.ones(R, T, dtype=torch.long), mask=alive.float(), group_ids=g)
    adv = torch.ones(R, dtype=torch.float64) if adv is None else adv
    return WEIGHTINGS.get("tw_token_weight")(adv, g, batch, D, tw_alpha=alpha)


def test_tw_token_weight_issue_example():
    # two rows; position 0: the same distribution, different sampled tokens (p .6 and .1);
    # position 1: different distributions, both sampled a p = .6 token
    p, q = [0.6, 0.3, 0.1], [0.6, 0.1, 0.3]
    dists = [[p, p], [p, q]]
    alive = [[1, 1], [1, 1]]
    # by hand: s_0 = 0; at t = 1, m = (log .6, (log .3 + log .1)/2, same), d = 0, -/+ .549306 for row 0
    # (mirrored for row 1): k3 = .126646 + .182745 = .309391 per row -> s_1 = .309391 -> w = [1, 1.7]
    assert _authors_tw_weights(dists, alive, 1.7) == pytest.approx([1.0, 1.7], abs=1e-6)
    w = _tw(dists, alive, [0, 0])
    assert w.flatten().tolist() == pytest.approx([1.0, 1.7, 1.0, 1.7], abs=1e-6)
    # the sampled-token spread (grpolab's old rule) would have weighted position 0 instead: log .6 vs log .1
    # differ there and agree at position 1 -> [1.7, 1.0]. The full distributions decide.


def test_tw_token_weight_uniform_padding_ragged_groups():
    u = [1 / 3] * 3
    a, b, c = [0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8]
    # group 0: row 1 ends after position 0 (authors: uniform there); group 1 (one row longer) ends at t = 2
    dists = [[a, b, c, a], [a, u, u, u], [b, c, a, u], [a, c, c, u]]
    alive = [[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0]]
    gids = [0, 0, 1, 1]
    w = _tw(dists, alive, gids, alpha=2.0)
    exp0 = _authors_tw_weights(dists[:2], alive[:2], 2.0)  # T_0 = 4
    exp1 = _authors_tw_weights([r[:3] for r in dists[2:]], [r[:3] for r in alive[2:]], 2.0)  # T_1 = 3
    assert w[0].tolist() == pytest.approx(exp0, abs=1e-6) and w[1].tolist() == pytest.approx(exp0, abs=1e-6)
    assert w[2, :3].tolist() == pytest.approx(exp1, abs=1e-6) and w[2, 3] == 1.0  # past T_1: weight 1
    assert min(exp0) == pytest.approx(1.0) and max(exp0) == pytest.approx(2.0)
    # the ended row takes part (uniform): dropping it would change the weights
    assert exp0 != pytest.approx(_authors_tw_weights(dists[:1], alive[:1], 2.0), abs=1e-3)
    # advantages are scaled token by token; alpha 1 is GRPO; alpha < 1 is refused
    adv = torch.tensor([1.0, -1.0, 2.0, 0.5], dtype=torch.float64)
    out = _tw(dists, alive, gids, alpha=2.0, adv=adv)
    assert torch.allclose(out, adv[:, None] * w)
    assert torch.equal(_tw(dists, alive, gids, alpha=1.0, adv=adv), adv[:, None].expand(4, 4))
    with pytest.raises(ValueError, match="tw_alpha"):
        _tw(dists, alive, gids, alpha=0.5)


def test_tw_group_divergence_of_the_model_matches_a_full_forward():
    """group_token_divergence (shared-prefix forward, hidden states, position chunks) equals the authors'
    formula on the full [G, T, V] log-probs of a plain forward of each row."""
    from grpolab.model.loading import load_policy
    from grpolab.model.logprobs import group_token_divergence
    model, tok = load_policy("tiny", task_texts=["abc 123 +-= Answer:"], seed=0, log=lambda *a: None)
    model.eval()
    gen = torch.Generator().manual_seed(0)
    V = len(tok)
    R, T, P = 5, 6, 3
    comp = torch.randint(4, V, (R, T), generator=gen)
    lengths = torch.tensor([6, 2, 4, 3, 1])
    present = torch.arange(T)[None, :] < lengths[:, None]
    prompts = torch.tensor([[5, 6, 7], [5, 6, 7], [5, 6, 7], [8, 9, 10], [8, 9, 10]])
    batch = RolloutBatch(prompt_ids=prompts, prompt_mask=torch.ones(R, P, dtype=torch.long), completion_ids=comp,
                         completion_mask=present.float(), behavior_logprobs=torch.zeros(R, T),
                         group_ids=torch.tensor([0, 0, 0, 1, 1]), prompt_uids=torch.tensor([0, 0, 0, 1, 1]),
                         truncated=torch.zeros(R, dtype=torch.bool), completion_attention_mask=present.long())
    temp = 0.7
    with torch.no_grad():
        got = group_token_divergence(model, batch, temp, rows=1, max_elements=2 * 3 * V)  # 1-row forwards, chunks
        full = model(input_ids=torch.cat([prompts, comp], 1)).logits[:, P - 1:P - 1 + T].double()
    logp = torch.log_softmax(full / temp, -1)
    for rows in ([0, 1, 2], [3, 4]):
        Tg = int(lengths[rows].max())
        lp = torch.where(present[rows, :Tg, None], logp[rows, :Tg], torch.tensor(-math.log(V), dtype=torch.float64))
        d = (lp.mean(0, keepdim=True) - lp).clamp(-11, 11)
        expect = (torch.exp(d) - d - 1).sum(-1)
        assert torch.allclose(got[rows, :Tg].double(), expect, atol=1e-4, rtol=1e-4)
        assert (got[rows, Tg:] == 0).all()
    assert got[3, 3] == 0 and got[4, 2] > 0  # past T_1: 0; an ended row inside T_1: uniform vs the mean


def test_tw_trainer_computes_divergence_only_when_asked(tiny_args, monkeypatch):
    import grpolab.policies.causal_lm.policy as trainer_mod  # the causal LM policy computes it (advantage_inputs)
    from grpolab.train.trainer import Trainer
    calls = []
    real = trainer_mod.group_token_divergence
    monkeypatch.setattr(trainer_mod, "group_token_divergence", lambda *a, **k: calls.append(1) or real(*a, **k))
    for recipe, expected in (("grpo", 0), ("tw_grpo", 2)):
        calls.clear()
        args = {**recipe_overrides(recipe), **tiny_args, "steps": 2, "task": "repeat",
                "out": tiny_args["out"] + recipe}
        t = Trainer(Config.build(args), log=lambda *a: None)
        for _ in range(2):
            m = t.train_step()
            assert m["skipped"] == 0 and math.isfinite(m["loss"])
        assert len(calls) == expected


# ----------------------------------------------------------------- TempSamp-R1 (000-112)

def test_tempsamp_soft_advantage():
    # the public TempSamp-R1 code (transform_rewards): r >= .8 -> .8 + .01 log(r - .8 + 1);
    # r < .8 -> .8 - (exp(.8 - r) - 1) / (e - 1); then the GRPO z-score (sample std)
    r = torch.tensor([1.0, 0.8, 0.5, 0.0])
    e = math.e
    phi_ref = [0.8 + 0.01 * math.log(1.2), 0.8, 0.8 - (math.exp(0.3) - 1) / (e - 1), 0.8 - (math.exp(0.8) - 1) / (e - 1)]
    phi = asymmetric_soft_reward(r, 0.8, 0.01, 1.0)
    assert phi.tolist() == pytest.approx(phi_ref, abs=1e-6)
    assert phi_ref[0] == pytest.approx(0.801823, abs=1e-6) and phi_ref[3] == pytest.approx(0.086763, abs=1e-6)
    out = ADVANTAGES.get("tempsamp_soft_advantage")(r, torch.zeros(4, dtype=torch.long), advantage_epsilon=EPS)
    m = sum(phi_ref) / 4
    sd = math.sqrt(sum((p - m) ** 2 for p in phi_ref) / 3)
    assert out.tolist() == pytest.approx([(p - m) / (sd + EPS) for p in phi_ref], abs=1e-5)
    # the old log/exp pair around tau=.5 gave 1.0 and 0.8 clearly different advantages; the plateau nearly ties them
    assert abs(float(out[0] - out[1])) < 0.01 < float(out[1] - out[2])
    # continuous at the pivot, monotone
    x = torch.tensor([0.8 - 1e-6, 0.8, 0.8 + 1e-6])
    y = asymmetric_soft_reward(x, 0.8, 0.01, 1.0)
    assert float(y[2] - y[0]) == pytest.approx(0.0, abs=1e-5) and bool((y[1:] >= y[:-1]).all())
    with pytest.raises(ValueError, match="tempsamp_alpha"):
        asymmetric_soft_reward(r, 0.8, 0.01, 0.0)


# ------------------------------------------------------------------------ AAPO (000-48)

def aapo_authors(rewards, ref_rewards, group_size):
    """AAPO's advantage as the authors' open-r1/trainer/AAPOTrainer.py computes it, re-derived in plain Python:
    z = (r - mean_g) / (std_g Bessel + 1e-4) on consecutive groups of ``group_size``; A = z + clamp(r - r_ref,
    -0.2, 0.28) row by row (reference completion i paired with policy completion i)."""
    out = []
    for s in range(0, len(rewards), group_size):
        g = rewards[s:s + group_size]
        m = sum(g) / len(g)
        sd = math.sqrt(sum((x - m) ** 2 for x in g) / (len(g) - 1))
        out += [(x - m) / (sd + 1e-4) for x in g]
    return [a + min(max(r - q, -0.2), 0.28) for a, r, q in zip(out, rewards, ref_rewards)]


def test_aapo_momentum_hand_computed():
    # the issue's example: an all-correct group (second visit) whose reference completions are wrong.
    # authors: z = 0 (all equal), margin clip(1 - 0, -.2, .28) = +.28 per row; grpolab's old EMA stand-in gave 0
    g, u = torch.tensor([0, 0, 0, 0]), torch.tensor([3, 3, 3, 3])
    r = torch.tensor([1.0, 1.0, 1.0, 1.0])
    batch = make_batch([[1]] * 4)
    batch.columns["ref_reward"] = [0.0, 0.0, 0.0, 0.0]
    a = AAPOMomentum()
    for _ in range(2):  # first and second visit: the reference margin does not depend on history
        out = a(r, g, u, batch, advantage_epsilon=EPS)
        assert out.tolist() == pytest.approx([0.28] * 4) == aapo_authors([1.0] * 4, [0.0] * 4, 4)
    ema = AAPOMomentum(aapo_momentum=0.9)
    ema(r, g, u, aapo_baseline="ema")
    assert ema(r, g, u, aapo_baseline="ema").tolist() == [0.0] * 4  # the EMA has settled at 1: margin 0
    # mixed group, unequal reference rewards (paired by index), both clip bounds active:
    # r = 1,0,1,0 -> mean .5, Bessel std sqrt(1/3) = .577350; z = +-.5/.577450 = +-.865876
    # ref = 0, 1, 1, .1 -> margins 1 (-> .28), -1 (-> -.2), 0, -.1
    r2, ref2 = [1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.1]
    batch.columns["ref_reward"] = ref2
    out = a(torch.tensor(r2), g, u, batch, advantage_epsilon=EPS)
    assert out.tolist() == pytest.approx([0.865876 + 0.28, -0.865876 - 0.2, 0.865876, -0.865876 - 0.1], abs=1e-5)
    assert out.tolist() == pytest.approx(aapo_authors(r2, ref2, 4), abs=1e-6)
    # all-wrong group against a correct reference: z = 0, margin -1 -> -.2
    batch.columns["ref_reward"] = [1.0] * 4
    assert a(torch.zeros(4), g, u, batch).tolist() == pytest.approx([-0.2] * 4)


def test_aapo_momentum_needs_the_reference_column():
    a = AAPOMomentum()
    g, u, r = torch.tensor([0, 0]), torch.tensor([3, 3]), torch.tensor([1.0, 0.0])
    with pytest.raises(ValueError, match="ref_reward.*aapo_reference.*aapo_baseline: ema"):
        a(r, g, u, make_batch([[1], [1]]))
    with pytest.raises(ValueError, match="ref_reward"):
        a(r, g, u)  # no batch at all
    with pytest.raises(ValueError, match="aapo_baseline"):
        a(r, g, u, make_batch([[1], [1]]), aapo_baseline="nonsense")


def test_aapo_ema_baseline_hand_computed():
    # grpolab's explicit stand-in (aapo_baseline: ema): r_ref = the prompt's EMA of past group means
    a = AAPOMomentum(aapo_momentum=0.9)
    g, u = torch.tensor([0, 0]), torch.tensor([3, 3])
    # step 1: rewards 1,1 -> z 0, first visit -> term 0; ema = 1
    assert a(torch.tensor([1.0, 1.0]), g, u, advantage_epsilon=EPS, aapo_baseline="ema").tolist() == [0.0, 0.0]
    # step 2: rewards 0,0 -> z 0; margin 0 - 1 = -1, clipped to -.2
    assert a(torch.tensor([0.0, 0.0]), g, u, aapo_baseline="ema").tolist() == pytest.approx([-0.2, -0.2])
    assert a.ema[3] == pytest.approx(0.9)  # .9 * 1 + .1 * 0
    # step 3: rewards 1,0 -> z = +-.5/(.707107+1e-4) = +-.706997; margins 1-.9 = .1 (kept), 0-.9 = -.9 -> -.2
    out = a(torch.tensor([1.0, 0.0]), g, u, advantage_epsilon=EPS, aapo_baseline="ema")
    assert out.tolist() == pytest.approx([0.706997 + 0.1, -0.706997 - 0.2], abs=1e-5)
    assert a.ema[3] == pytest.approx(0.9 * 0.9 + 0.1 * 0.5)  # .86
    # without clipping the unclipped margins come back: -.706997 - (0 - .86)
    wide = a(torch.tensor([1.0, 0.0]), g, u, advantage_epsilon=EPS, aapo_clip_low=10.0, aapo_clip_high=10.0,
             aapo_baseline="ema")
    assert wide.tolist() == pytest.approx([0.706997 + 0.14, -0.706997 - 0.86], abs=1e-5)


def test_aapo_reference_reward_column():
    # r_ref from the reference model's completion of the same row (batch column ref_reward)
    a = AAPOMomentum()
    g, u = torch.tensor([0, 0, 0]), torch.tensor([5, 5, 5])
    batch = make_batch([[1], [1], [1]])
    batch.columns["ref_reward"] = [0.0, 1.0, None]
    r = torch.tensor([1.0, 1.0, 1.0])
    # z = 0 (all equal); margins 1-0 = 1 -> .28, 1-1 = 0, None (unscorable reference) -> 0
    assert a(r, g, u, batch, advantage_epsilon=EPS).tolist() == pytest.approx([0.28, 0.0, 0.0])
    assert a.ema == {}  # the reference baseline keeps no EMA
    # eta scales the margin term; rewards 1,0,0 vs ref 0,1,None: z = (2/3, -1/3, -1/3)/(.57735 + 1e-4)
    out = a(torch.tensor([1.0, 0.0, 0.0]), g, u, batch, advantage_epsilon=EPS, aapo_eta=0.5)
    z = 1 / 3 / (0.577350 + 1e-4)
    assert out.tolist() == pytest.approx([2 * z + 0.5 * 0.28, -z + 0.5 * -0.2, -z], abs=1e-5)
    batch.columns["my_ref"] = [1.0, 1.0, 1.0]
    assert a(r, g, u, batch, aapo_ref_column="my_ref").tolist() == pytest.approx([0.0, 0.0, 0.0])
    with pytest.raises(ValueError):
        a(r, g, u, batch, aapo_clip_low=-0.1)


def test_aapo_restore_is_exact():
    gen = torch.Generator().manual_seed(1)

    def inputs():
        return ((torch.rand(6, generator=gen) > 0.5).float(), torch.tensor([0, 0, 0, 1, 1, 1]),
                torch.randint(0, 3, (2,), generator=gen).repeat_interleave(3))

    a = AAPOMomentum()
    for _ in range(3):
        a(*inputs(), aapo_baseline="ema")
    b = AAPOMomentum()
    b.load_state_dict(a.state_dict())
    for _ in range(3):
        x = inputs()
        assert torch.equal(a(*x, aapo_baseline="ema"), b(*x, aapo_baseline="ema"))


# ------------------------------------------------------------------------ AWPO (000-118)

def test_awpo_gated():
    fn = ADVANTAGES.get("awpo_gated")
    o = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    z = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    rm = torch.tensor([o, z]).T
    g = torch.tensor([0] * 4 + [1] * 4)
    batch = make_batch([[0]] * 8, reward_names=["acc", "fmt"])
    out = fn(rm, g, batch, advantage_epsilon=EPS, awpo_outcome_reward="acc", awpo_reasoning_reward="fmt", awpo_lambda=0.5)
    # group 0 all fail: var 0 -> gate 1, difficulty 1 - 0 = 1; A = .5 * zscore(z) = .5 * [.75, -.25...]/.5001
    assert out[:4].tolist() == pytest.approx([0.5 * 0.75 / 0.5001] + [0.5 * -0.25 / 0.5001] * 3, abs=1e-6)
    # group 1: var_o = 1/3 > .25 -> gate 0 -> outcome advantage only
    assert torch.allclose(out[4:], group_zscore(torch.tensor(o[4:]), torch.zeros(4, dtype=torch.long)))
    # indices work too ("0" = first column, "-1" = last)
    assert torch.equal(out, fn(rm, g, batch, advantage_epsilon=EPS, awpo_outcome_reward="0", awpo_reasoning_reward="-1"))
    with pytest.raises(ValueError, match="neither a reward name"):
        fn(rm, g, batch, awpo_reasoning_reward="tool")


# ---------------------------------------------------------------------- DaGRPO (000-17)

def test_dagrpo_distinct_pairs():
    fn = ADVANTAGES.get("dagrpo_distinct_pairs")
    r = torch.tensor([1.0, 0.95, 0.0, 0.5, 0.52, 0.55])
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    out = fn(r, g, advantage_epsilon=EPS, dagrpo_delta=0.1)
    # group 0: std = sqrt((.35^2+.3^2+.65^2)/2) = sqrt(.3175) = .563471; pair (0,1) masked (|.05| < .1)
    # A0 = (1/3)(1-0) = .333333, A1 = (1/3)(.95-0) = .316667, A2 = (1/3)(-1-.95) = -.65  (all / (std+eps))
    s = 0.563471 + EPS
    assert out[:3].tolist() == pytest.approx([0.333333 / s, 0.316667 / s, -0.65 / s], abs=1e-5)
    assert out[3:].tolist() == [0.0, 0.0, 0.0]  # homogeneous group: every pair within delta
    assert torch.allclose(fn(r, g, advantage_epsilon=EPS, dagrpo_delta=0.0), group_zscore(r, g, advantage_epsilon=EPS), atol=1e-6)


# ----------------------------------------------------- span-decoupled (004-12, 004-05)

def test_span_scale_degrpo_hand_computed():
    fn = WEIGHTINGS.get("span_scale")
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    batch = make_batch([[1, 2, 3], [1, 2, 0]], mask=mask)
    adv = torch.tensor([2.0, -1.0])
    out = fn(adv, mask, batch, span_mark="first_token", span_scales=[1.0, 0.001, 1.0],
             span_normalize="per_span_tokens")
    # N = 5 tokens; control span 1 has 2 -> c1 = .001 * 5/2 = .0025; response span 2 has 3 -> c2 = 5/3
    assert out.flatten().tolist() == pytest.approx([0.005, 10 / 3, 10 / 3, -0.0025, -5 / 3, 0.0])
    # token_mean at ratio 1 (loss = -A): .001 * mean(-2, 1) + mean(-2, -2, 1) = -.0005 - 1 = -1.0005
    loss, _ = POLICY_LOSSES.get("clipped_ratio")(torch.zeros(2, 3), torch.zeros(2, 3), out, mask)
    total = AGGREGATIONS.get("token_mean")(loss, mask, StepTotals.from_masks([mask], 3))
    assert total.item() == pytest.approx(-1.0005)
    # batch spans; no normalisation: plain per-span coefficients
    batch = make_batch([[1, 2, 3], [1, 2, 0]], mask=mask, span_ids=[[0, 1, 1], [2, 2, 0]])
    out = fn(adv, mask, batch, span_mark="batch", span_scales=[1.0, 0.5], span_normalize="none")
    assert out.flatten().tolist() == pytest.approx([2.0, 1.0, 1.0, -1.0, -1.0, 0.0])


def test_span_scale_equals_decoupled_loss_off_policy():
    """With clipping active, token_mean of the scaled advantages = alpha*mean(control) + mean(response)."""
    gen = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    batch = make_batch([[1, 2, 3, 4]] * 3, mask=mask)
    adv = torch.tensor([1.5, -0.5, -1.0])
    logp, old = 0.5 * torch.randn(3, 4, generator=gen), 0.5 * torch.randn(3, 4, generator=gen)
    clipped = POLICY_LOSSES.get("clipped_ratio")
    scaled = WEIGHTINGS.get("span_scale")(adv, mask, batch, span_mark="first_token", span_scales=[1.0, 0.1, 1.0],
                                          span_normalize="per_span_tokens")
    lhs = AGGREGATIONS.get("token_mean")(clipped(logp, old, scaled, mask)[0], mask, StepTotals.from_masks([mask], 4))
    per_tok = clipped(logp, old, adv, mask)[0]
    ctrl = torch.zeros_like(mask)
    ctrl[:, 0] = 1
    resp = mask - ctrl
    rhs = 0.1 * (per_tok * ctrl).sum() / ctrl.sum() + (per_tok * resp).sum() / resp.sum()
    assert lhs.item() == pytest.approx(rhs.item(), rel=1e-5)


def test_span_decoupled_advantage_dtpo():
    fn = ADVANTAGES.get("span_decoupled_advantage")
    rm = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # columns tool, acc
    rewards = torch.tensor([1.0, 1.0])           # combined: equal -> advantage 0 on unmarked tokens
    g = torch.zeros(2, dtype=torch.long)
    mask = torch.ones(2, 3)
    batch = make_batch([[1, 2, 3]] * 2, mask=mask, span_ids=[[1, 1, 2], [1, 2, 0]], reward_names=["tool", "acc"])
    out = fn(rewards, g, rm, mask, batch, advantage_epsilon=EPS, span_mark="batch", span_reward_columns=["", "tool", "acc"])
    z = 0.5 / (math.sqrt(0.5) + EPS)  # two rows 1, 0: mean .5, std .707107 -> +-.706997
    assert out.flatten().tolist() == pytest.approx([z, z, -z, -z, z, 0.0], abs=1e-6)
    # unmarked everywhere -> every token gets the combined-reward GRPO advantage
    plain = make_batch([[1, 2, 3]] * 2, mask=mask, reward_names=["tool", "acc"])
    out = fn(torch.tensor([1.0, 0.0]), g, rm, mask, plain, advantage_epsilon=EPS, span_reward_columns=["", "tool", "acc"])
    assert out.flatten().tolist() == pytest.approx([z] * 3 + [-z] * 3, abs=1e-6)


# ------------------------------------------------------------------ recipes resolve

@pytest.mark.parametrize("recipe", ["seed_grpo", "s_grpo_stable", "edge_grpo", "spo_single_stream", "lambda_grpo",
                                    "tw_grpo", "tempsamp_r1", "aapo", "awpo", "dagrpo", "degrpo_thinkless", "dtpo"])
def test_group_b_recipes_build(recipe):
    cfg = Config.build(recipe_overrides(recipe))
    Component(ADVANTAGES.get(cfg.advantage), cfg, cfg.advantage)
    for n in cfg.advantage_weightings:
        Component(WEIGHTINGS.get(n), cfg, n)
