"""VAR RL value as middle return (seed 000-27): the advantage of the ``var_middle_return`` rollout's rows."""
from __future__ import annotations

import torch

from ..errors import ConfigError
from ..registry import ADVANTAGES
from .advantages import group_zscore

PREFIX_COLUMN = "vmr_prefix"  #: the prefix a row continues (unique in the batch), written by the rollout
SCALE_COLUMN = "vmr_scale"  #: the row's last prefix scale (tokens of scales <= it are the prefix)


@ADVANTAGES.register("var_middle_return", min_group_size=2)
def var_middle_return_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, completion_mask: torch.Tensor,
                                batch, *, advantage_epsilon: float = 1e-4) -> torch.Tensor:
    """Value as middle return, VMR ("VAR RL Done Right", Sun et al., arXiv:2601.02256; seed 000-27).

    With p(i) the prefix row i continues (``columns["vmr_prefix"]``), m its last prefix scale
    (``columns["vmr_scale"]``) and V_p = mean of r over the rows of prefix p (NaN rewards left out):

    ``A_it = zscore_g(V)_p(i)`` for tokens of scale ≤ m (``span_ids``), the z-score taken over the group's
    prefixes (each once), and ``A_it = zscore_g(r − V_p)_i`` for the later tokens, over the group's rows;
    zscore = ``group_zscore`` (Bessel std, ``advantage_epsilon``). With one row per prefix and m = the last scale
    this is ``group_zscore`` on every token (plain GRPO). Output ``[R, T]``.

    Provenance: reconstructed from the abstract — the advantage half of the var_middle_return rollout (see its
    docstring for the search and the choices: potential-based shaping with the prefix's mean continuation reward
    as the potential, both parts group-normalised).
    Test: tests/test_var_image.py::test_vmr_advantages_by_hand, tests/test_var_image.py::test_vmr_last_scale_is_plain_grpo.
    """
    if batch is None or PREFIX_COLUMN not in batch.columns or batch.span_ids is None:
        raise ConfigError("advantage var_middle_return needs each row's prefix (batch.columns['vmr_prefix']) and "
                          "scales (span_ids), which rollout_strategy var_middle_return writes: set it")
    prefix = torch.as_tensor(batch.columns[PREFIX_COLUMN], dtype=torch.long)
    last = torch.as_tensor(batch.columns[SCALE_COLUMN], dtype=torch.long)
    r = rewards.double()
    uniq, inv = torch.unique(prefix, return_inverse=True)
    ok = ~r.isnan()
    sums = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, torch.where(ok, r, 0.0))
    cnt = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, ok.double())
    value = torch.where(cnt > 0, sums / cnt.clamp(min=1), torch.full_like(sums, float("nan")))
    first = torch.full((len(uniq),), len(prefix), dtype=torch.long).scatter_reduce_(
        0, inv, torch.arange(len(prefix)), reduce="amin")
    a_pre = group_zscore(value, group_ids[first], advantage_epsilon=advantage_epsilon)[inv]
    a_post = group_zscore(r - value[inv], group_ids, advantage_epsilon=advantage_epsilon)
    spans = batch.span_ids.long().to(completion_mask.device)
    is_prefix = spans <= last[:, None].to(spans.device)
    adv = torch.where(is_prefix, a_pre[:, None].to(spans.device), a_post[:, None].to(spans.device))
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.float32)
