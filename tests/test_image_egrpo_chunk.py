"""E-GRPO's branching rollout (policies/flow_matching/egrpo.py, seed 000-78) and Chunk-GRPO's chunks (policies/_image/stages_chunks.py
with the loss rank_ratio, seed 000-88).

E-GRPO's expected values are re-derived here in plain torch from the authors' code, shengjun-zhang/VisualGRPO
fastvideo/workers/sampler/flux_sampler.py (_flow_grpo_step with merge_step, at ae619bf):
    sigma = sigmas[k]; sigma_prev = sigmas[k + merge_step]; sigma_max = sigmas[1]; dt = sigma_prev - sigma
    std_dev_t = sqrt(sigma / (1 - where(sigma == 1, sigma_max, sigma))) * eta
    mean = x * (1 + std_dev_t**2 / (2 * sigma) * dt) + v * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
    x' = mean + std_dev_t * sqrt(-dt) * z;  log_prob = mean over elements of the Gaussian log-density
Chunk-GRPO has no public code: its tests check the relations the design fixes (one step per chunk = the per-step
clipped ratio, one chunk = GSPO's sequence ratio) and a hand-computed two-chunk example.
"""
import math
from types import SimpleNamespace

import pytest
import torch

import grpolab  # noqa: F401  (the catalogue: registers every component)
from grpolab.algorithms.losses import clipped_ratio, rank_ratio, sequence_ratio
from grpolab.batch import RolloutBatch
from grpolab.components import Component
from grpolab.config import Config, ConfigError
from grpolab.policies._image import sde
from grpolab.policies import POLICIES
from grpolab.policies._image.stages_chunks import chunk_grpo, chunk_ids


def _code_step(x, v, sigmas, k, m, eta, z):
    """The authors' _flow_grpo_step (merge_step = m), float64, with the noise z given; returns (x', mean, std,
    log_prob)."""
    sigma, sigma_prev, sigma_max = float(sigmas[k]), float(sigmas[k + m]), float(sigmas[1])
    dt = sigma_prev - sigma
    std_dev_t = math.sqrt(sigma / (1 - (sigma_max if sigma == 1 else sigma))) * eta
    mean = x * (1 + std_dev_t ** 2 / (2 * sigma) * dt) + v * (1 + std_dev_t ** 2 * (1 - sigma) / (2 * sigma)) * dt
    std = std_dev_t * math.sqrt(-dt)
    xn = mean + std * z
    lp = (-(xn - mean) ** 2 / (2 * std ** 2) - math.log(std) - math.log(math.sqrt(2 * math.pi)))
    return xn, mean, std, lp.mean(dim=tuple(range(1, lp.ndim)))


SIGMAS = sde.flow_sigmas(8, 1.0, schedule="diffusers").double()


@pytest.mark.parametrize("k", [0, 1, 5])
def test_merged_step_with_m_1_is_the_flow_grpo_step(k):
    g = torch.Generator().manual_seed(k)
    x, v, z = (torch.randn(3, 1, 4, 4, generator=g, dtype=torch.float64) for _ in range(3))
    merged = sde.merged_flow_step(x, v, SIGMAS, k, 1, 0.7, noise=z)
    plain = sde.flow_grpo_step(x, v, SIGMAS[k], SIGMAS[k + 1], 0.7, noise=z)  # the ordinary step k
    xn, mean, std, lp = _code_step(x, v, SIGMAS, k, 1, 0.7, z)
    for out in (merged, plain):
        assert torch.allclose(out.x_next, xn, atol=1e-12) and torch.allclose(out.mean, mean, atol=1e-12)
        assert torch.allclose(out.logprob, lp, atol=1e-10) and abs(float(out.std[0]) - std) < 1e-12
    # a merged step (m = 3) from sigma_0 = 1: the code's sigma_max is sigmas[1] (not sigmas[3])
    xn3, mean3, std3, lp3 = _code_step(x, v, SIGMAS, 0, 3, 0.7, z)
    m3 = sde.merged_flow_step(x, v, SIGMAS, 0, 3, 0.7, noise=z)
    assert torch.allclose(m3.mean, mean3, atol=1e-12) and torch.allclose(m3.logprob, lp3, atol=1e-10)
    assert abs(float(m3.std[0]) - std3) < 1e-12


def test_merged_step_std_grows_with_m():
    x, v = torch.zeros(1, 1, 2, 2, dtype=torch.float64), torch.zeros(1, 1, 2, 2, dtype=torch.float64)
    for k in (0, 2):
        stds = [float(sde.merged_flow_step(x, v, SIGMAS, k, m, 0.7, noise=torch.zeros_like(x)).std[0])
                for m in range(1, 8 - k + 1)]
        assert all(b > a for a, b in zip(stds, stds[1:])), stds
        # by hand: std = a * sqrt(s_k / (1 - s~)) * sqrt(s_k - s_(k+m))
        s = float(SIGMAS[k])
        sub = float(SIGMAS[1]) if s == 1 else s
        assert stds[1] == pytest.approx(0.7 * math.sqrt(s / (1 - sub)) * math.sqrt(s - float(SIGMAS[k + 2])),
                                        rel=1e-12)
    # the step's entropy (d/2) log(2 pi e std^2) grows with it: a merged step is a higher-entropy step


# ----------------------------------------------------------------------------- E-GRPO rollout


def _flow(**over):
    pytest.importorskip("diffusers")
    cfg = Config.build({"policy": "flow_matching", "data": "rows.jsonl", "reward": ["m:f"],
                        "rollout_strategy": "egrpo_branch", "advantage": "group_zscore", **over})
    return cfg, Component(POLICIES.get("flow_matching"), cfg, "flow_matching").fn


@pytest.fixture(scope="module")
def flow():
    cfg, pol = _flow(num_generations=3)
    rows = [{"prompt": "2", "label": 2}, {"prompt": "7", "label": 7}]
    return cfg, pol, pol.load(cfg, rows, [], log=lambda *a: None), rows


def test_egrpo_groups_per_prompt_and_step_and_one_column(flow):
    from grpolab.rollouts.context import RolloutContext
    from grpolab.policies.flow_matching.egrpo import egrpo_branch

    cfg, pol, module, rows = flow
    ctx = RolloutContext(cfg, None, rows, policy=module, scorer=None, generator=torch.Generator().manual_seed(0),
                         actions=pol)
    offset = ctx.allocate_groups(len(rows))  # what the trainer does before calling the strategy
    b = egrpo_branch(ctx, rows, [10, 11], offset, egrpo_steps=[0, 2], egrpo_merge=[2, 1])
    # rows: k-major, then prompt, then branch; 2 steps x 2 prompts x G = 3; one column each, on the mask
    assert b.completion_mask.shape == (12, 1) and bool((b.completion_mask == 1).all())
    assert b.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert b.prompt_uids.tolist() == [10, 10, 10, 11, 11, 11] * 2
    assert b.columns["egrpo_step"] == [0] * 6 + [2] * 6 and b.columns["egrpo_merge"] == [2] * 6 + [1] * 6
    sig, nxt = b.step_data["sigma"][:, 0], b.step_data["sigma_next"][:, 0]
    assert torch.equal(sig, torch.tensor([float(pol.sigmas[0])] * 6 + [float(pol.sigmas[2])] * 6))
    assert torch.equal(nxt, torch.tensor([float(pol.sigmas[2])] * 6 + [float(pol.sigmas[3])] * 6))
    x = b.step_data["x"][:, 0]
    # the branches of a (prompt, k) group leave the same anchor latent; the merged steps differ
    for g in range(4):
        rs = [i for i in range(12) if int(b.group_ids[i]) == g]
        assert all(torch.equal(x[rs[0]], x[r]) for r in rs)
        assert not torch.equal(b.step_data["x_next"][rs[0], 0], b.step_data["x_next"][rs[1], 0])
    # the anchor: x at k = 2 is two Euler ODE steps from the prompt's noise (x at k = 0)
    with torch.no_grad():
        a = x[0:1]
        for j in range(2):
            a = a + (pol.sigmas[j + 1] - pol.sigmas[j]) * pol.velocity(module, a, pol.sigmas[j].expand(1),
                                                                      torch.tensor([2]))
    assert (a[0] - x[6]).abs().max() < 1e-5
    # the image: the ODE from sigma_(k+m) on (here sigma_2 for the merged k = 0, m = 2 rows)
    with torch.no_grad():
        y = b.step_data["x_next"][0:1, 0]
        for j in range(2, pol.T):
            y = y + (pol.sigmas[j + 1] - pol.sigmas[j]) * pol.velocity(module, y, pol.sigmas[j].expand(1),
                                                                      torch.tensor([2]))
    assert (((y.clamp(-1, 1) + 1) / 2)[0] - b.row_data["images"][0]).abs().max() < 1e-5
    # the policy's forward recomputes the merged column: the first ratio is 1 (float32 rounding)
    lp = pol.forward(module, b, grad=False)["logprobs"]
    assert (lp - b.behavior_logprobs).abs().max() < 1e-5
    # and that log-prob is the authors' step: sigma_max = sigmas[1] for the merged step from sigma_0 = 1
    with torch.no_grad():
        v = pol.velocity(module, x[0:1], pol.sigmas[0].expand(1), torch.tensor([2])).double()
    xn = b.step_data["x_next"][0:1, 0].double()
    _, mean, std, _ = _code_step(x[0:1].double(), v, pol.sigmas.double(), 0, 2, pol.a, torch.zeros_like(xn))
    want = (-(xn - mean) ** 2 / (2 * std ** 2) - math.log(std) - 0.5 * math.log(2 * math.pi)).mean()
    assert abs(float(b.behavior_logprobs[0, 0]) - float(want)) < 1e-4
    assert "egrpo_step_std" in ctx.metrics


def test_egrpo_config_checks():
    with pytest.raises(ConfigError, match="k \\+ m <= flow_steps"):
        _flow(egrpo_steps=[7], egrpo_merge=[2])
    with pytest.raises(ConfigError, match="one merge span per branching step"):
        _flow(egrpo_steps=[1, 2], egrpo_merge=[1])
    with pytest.raises(ConfigError, match="flow_sde: flow_grpo"):
        _flow(flow_sde="dance")
    with pytest.raises(ConfigError, match="needs a policy with flow_matching|flow_matching"):
        Config.build({"policy": "ddpm", "data": "rows.jsonl", "reward": ["m:f"], "rollout_strategy": "egrpo_branch"})


# ----------------------------------------------------------------------------- Chunk-GRPO


def _batch(mask, adv=None):
    R, T = mask.shape
    return RolloutBatch(prompt_ids=torch.zeros(R, 1, dtype=torch.long), prompt_mask=torch.ones(R, 1, dtype=torch.long),
                        completion_ids=torch.zeros(R, T, dtype=torch.long), completion_mask=mask.float(),
                        behavior_logprobs=torch.zeros(R, T), group_ids=torch.zeros(R, dtype=torch.long),
                        prompt_uids=torch.zeros(R, dtype=torch.long), truncated=torch.zeros(R, dtype=torch.bool),
                        advantages=adv)


def test_chunk_ids_from_boundaries():
    assert chunk_ids(8, [0, 2, 4]).tolist() == [1, 1, 2, 2, 3, 3, 3, 3]
    assert chunk_ids(8, [0, 2, 4, 8]).tolist() == [1, 1, 2, 2, 3, 3, 3, 3]  # a trailing T is the end
    assert chunk_ids(3, [0, 2, 4]).tolist() == [1, 1, 2]


def test_two_chunks_by_hand():
    """T = 4, chunks {0, 1} and {2, 3}; log-ratios [0.1, 0.3 | -0.2, 0.0], A = 1, eps = 0.1:
    chunk 1: r = exp((0.1 + 0.3) / 2) = exp(0.2) = 1.2214 -> min(1.2214, clip 1.1) = 1.1 -> loss -1.1 per step;
    chunk 2: r = exp(-0.1) = 0.90484 (inside [0.9, 1.1]) -> loss -0.90484; weight |o| / (K |k|) = 4 / (2 * 2) = 1."""
    b = chunk_grpo(_batch(torch.ones(1, 4)), SimpleNamespace(), chunk_boundaries=[0, 2],
                   chunk_weighted_sampling=False, chunk_weights=[])
    assert b.span_ids.tolist() == [[1, 1, 2, 2]]
    new = torch.tensor([[0.1, 0.3, -0.2, 0.0]])
    loss, _ = rank_ratio(new, torch.zeros_like(new), torch.ones(1), b.completion_mask, batch=b, epsilon=0.1)
    e = math.exp(-0.1)
    assert torch.allclose(loss.double(), torch.tensor([[-1.1, -1.1, -e, -e]], dtype=torch.float64), atol=1e-6)


def _rank_ratio_and(reference, mask, boundaries, seed):
    """rank_ratio over the chunks that start at ``boundaries``, and the loss ``reference`` (epsilon 0.05 both), on
    random log-probs, old log-probs and advantages (generator seed ``seed``) of ``mask``'s rows x steps."""
    g = torch.Generator().manual_seed(seed)
    R, T = mask.shape
    lp, old = torch.randn(R, T, generator=g) * 0.1, torch.randn(R, T, generator=g) * 0.1
    adv = torch.randn(R, generator=g)
    b = chunk_grpo(_batch(mask), SimpleNamespace(), chunk_boundaries=boundaries, chunk_weighted_sampling=False,
                   chunk_weights=[])
    got, _ = rank_ratio(lp, old, adv, mask, batch=b, epsilon=0.05)
    want, _ = reference(lp, old, adv, mask, epsilon=0.05)
    return got, want


def test_one_step_per_chunk_is_the_clipped_ratio():
    mask = torch.ones(5, 8)
    mask[:, -1] = 0  # Flow-GRPO's 0.99: the last step off the mask
    got, want = _rank_ratio_and(clipped_ratio, mask, list(range(8)), seed=0)
    assert torch.allclose(got * mask, want * mask, atol=1e-7)


def test_one_chunk_is_the_sequence_ratio():
    mask = torch.ones(5, 8)
    mask[1, 5:] = 0
    got, want = _rank_ratio_and(sequence_ratio, mask, [0], seed=1)
    assert torch.allclose(got * mask, want * mask, atol=1e-7)


def test_weighted_sampling_frequencies():
    """Weights [3, 2, 1] over chunks {0,1}, {2,3}, {4..7}: p = 1/2, 1/3, 1/6; 3000 rows, every count within 4.5
    binomial standard deviations of n·p. A row whose mask lacks chunk 1 draws from chunks 2 and 3 only."""
    R, T = 3000, 8
    mask = torch.ones(R, T)
    adv = torch.ones(R, T)
    ctx = SimpleNamespace(generator=torch.Generator().manual_seed(0))
    b = chunk_grpo(_batch(mask, adv), ctx, chunk_boundaries=[0, 2, 4], chunk_weighted_sampling=True,
                   chunk_weights=[3, 2, 1])
    ids = chunk_ids(T, [0, 2, 4])
    kept = []
    for i in range(R):
        on = b.completion_mask[i] > 0
        chunks = ids[on].unique().tolist()
        assert len(chunks) == 1 and on.sum() == (ids == chunks[0]).sum()  # exactly one whole chunk
        kept.append(chunks[0])
    assert torch.equal(b.advantages, b.completion_mask)  # zeroed off the new mask
    for c, p in zip((1, 2, 3), (1 / 2, 1 / 3, 1 / 6)):
        n = kept.count(c)
        assert abs(n - R * p) < 4.5 * math.sqrt(R * p * (1 - p)), (c, n)
    # chunk 1 off the mask: weights renormalised over chunks 2 and 3 (2/3, 1/3)
    mask2 = torch.ones(600, T)
    mask2[:, :2] = 0
    b2 = chunk_grpo(_batch(mask2), ctx, chunk_boundaries=[0, 2, 4], chunk_weighted_sampling=True,
                    chunk_weights=[3, 2, 1])
    n2 = int((b2.completion_mask[:, 2] > 0).sum())
    assert int(b2.completion_mask[:, :2].sum()) == 0
    assert abs(n2 - 400) < 4.5 * math.sqrt(600 * 2 / 3 * 1 / 3)


def test_chunk_config_checks():
    base = {"policy": "flow_matching", "task": "digits", "batch_stages": ["chunk_grpo"], "policy_loss": "rank_ratio"}
    pytest.importorskip("diffusers")
    Config.build(base)
    with pytest.raises(ConfigError, match="chunk_boundaries"):
        Config.build({**base, "chunk_boundaries": [1, 3]})
    with pytest.raises(ConfigError, match="chunk_weights"):
        Config.build({**base, "chunk_weights": [1, 2]})
