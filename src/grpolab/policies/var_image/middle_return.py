"""VAR RL value as middle return (seed 000-27): K continuations of each prefix drawn up to scale ``vmr_scale``."""
from __future__ import annotations

import torch

from ...errors import ConfigError
from ...generation.sampling import per_row, row_temperatures
from ...registry import ROLLOUT_STRATEGIES, param

from ...algorithms.adv_var import PREFIX_COLUMN, SCALE_COLUMN


def _check(cfg) -> None:
    from .model import SCALES
    m, k = int(cfg.vmr_scale), int(cfg.vmr_continuations)
    if not 1 <= m <= SCALES:
        raise ConfigError(f"vmr_scale: the last scale of the prefix, 1..{SCALES}; got {m}")
    if k < 1:
        raise ConfigError(f"vmr_continuations: at least 1; got {k}")
    if m < SCALES and int(cfg.num_generations) % k:
        raise ConfigError(f"num_generations: var_middle_return draws num_generations / vmr_continuations prefixes "
                          f"per prompt, so it must be a multiple of vmr_continuations = {k} (got "
                          f"{cfg.num_generations})")


@ROLLOUT_STRATEGIES.register("var_middle_return", check=_check, needs=("scales",))
def var_middle_return(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
                      vmr_scale: int = param(2, "var_middle_return: last scale of the prefix (1 = 1x1 ... 4 = 8x8); "
                                             "the prefix's value is the mean reward of its continuations; 4 = "
                                             "plain GRPO"),
                      vmr_continuations: int = param(2, "var_middle_return: continuations K drawn per prefix "
                                                     "(num_generations / K prefixes per prompt)")):
    """Value as middle return, VMR ("VAR RL Done Right", Sun et al., arXiv:2601.02256; seed 000-27).

    Per prompt with G = ``num_generations`` rows: P = G / K prefixes, scales 1..m (m = ``vmr_scale``), drawn by
    the policy, each continued K = ``vmr_continuations`` times (scales m+1..4) from the same prefix; the G full
    images are scored. Rows carry ``columns["vmr_prefix"]`` (the prefix they continue) and ``columns["vmr_scale"]``
    (m), which the advantage ``var_middle_return`` reads (select it: another estimator sees only whole rows): the prefix's middle return V_p = mean of its K
    continuations' rewards, prefix tokens get the group-normalised V, later tokens the group-normalised
    remainder r − V (potential-based shaping with V as the potential: the two returns sum to r, so the optimal
    policy is unchanged). The prefix tokens are trained once: they stay on the loss mask of the first
    continuation only (the other continuations carry the same tokens, off the mask). m = 4 (the last scale):
    no continuation, K = 1, every token is prefix: plain GRPO (the draws equal ``ctx.generate``'s).

    Provenance: reconstructed from the abstract — no public code found (searched the code index for "VAR
    reinforcement learning next-scale GRPO" and repository names containing "var"); the abstract's "stabilizing
    intermediate reward to guide early-stage generation" and the reference notes (an intermediate reward at an
    early scale from K = 2 continuations of the prefix, shaped so that the optimal policy does not change).
    Choices made: the potential-based reading (prefix return V, remainder r − V), both normalised over the
    prompt's group (prefixes for V, rows for r − V) by group_zscore, one fixed middle scale, prefix tokens
    trained once, the G rows per prompt split as G / K prefixes x K continuations.
    Test: tests/test_var_image.py::test_vmr_last_scale_is_plain_grpo, tests/test_var_image.py::test_vmr_advantages_by_hand.
    """
    from .model import OFFSETS, SCALES
    from .._image.flow import condition_of

    cfg, policy, module = ctx.cfg, ctx.actions, ctx.policy
    m = int(vmr_scale)
    k = 1 if m >= SCALES else int(vmr_continuations)
    counts = list(budgets) if budgets else [int(cfg.num_generations)] * len(rows)
    if any(c % k for c in counts):
        raise ConfigError(f"var_middle_return: every prompt's row count must be a multiple of vmr_continuations = "
                          f"{k}; got {counts}")
    prefixes = [c // k for c in counts]
    temps = temperatures if temperatures is not None else cfg.temperature
    row_t = row_temperatures(temps, prefixes)
    labels = torch.tensor(per_row([condition_of(r) for r in rows], prefixes))
    generator = ctx.sampling_generator
    codes, logps = policy.draw(module, labels, row_t, generator, to_scale=m)
    if k > 1:
        codes, logps = codes.repeat_interleave(k, 0), logps.repeat_interleave(k, 0)
        cont, cont_lp = policy.draw(module, labels.repeat_interleave(k), row_t.repeat_interleave(k),
                                    generator, codes=codes, from_scale=m + 1)
        codes = cont
        logps[:, OFFSETS[m]:] = cont_lp[:, OFFSETS[m]:]
    batch = policy.pack(rows, uids, counts, codes, logps, group_offset=group_offset)
    prefix_ids = [(group_offset + i) * 100_000 + j for i, p in enumerate(prefixes) for j in range(p) for _ in range(k)]
    batch.columns[PREFIX_COLUMN] = prefix_ids
    batch.columns[SCALE_COLUMN] = [m] * len(prefix_ids)
    if k > 1:  # prefix tokens train once: on the first continuation's row only
        dup = torch.tensor([c > 0 for p in prefixes for _ in range(p) for c in range(k)])
        batch.completion_mask[dup, :OFFSETS[m]] = 0
    ctx.score(batch)
    return batch
