"""GRPO groups over the paraphrases of one question (information-consistency GRPO, seed 000-30)."""
from __future__ import annotations

import torch

from ..errors import ConfigError
from ..prompts.paraphrase import PARAPHRASE_SET_COLUMN
from ..registry import ROLLOUT_STRATEGIES


def paraphrase_set_group_ids(rows: list[dict], group_offset: int, column: str) -> list[int]:
    """The group id of each prompt of ``rows``: ``group_offset + k``, ``k`` the index of the first prompt (in
    ``rows`` order) of the same paraphrase set (the same value of ``column``). Prompts of one set share an id;
    ids stay within ``group_offset .. group_offset + len(rows) - 1``, the range reserved for these prompts."""
    first: dict[str, int] = {}
    out = []
    for k, row in enumerate(rows):
        if column not in row:
            raise ConfigError(f"rollout_strategy paraphrase_groups: a prompt row has no column '{column}' (the "
                             f"paraphrase set it belongs to; set paraphrase_set_column); the built-in tasks "
                             f"fact_paraphrase and arithmetic_paraphrase have 'paraphrase_group'")
        out.append(group_offset + first.setdefault(str(row[column]), k))
    return out


@ROLLOUT_STRATEGIES.register("paraphrase_groups", columns=lambda cfg: [cfg.paraphrase_set_column])
def paraphrase_groups(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
                      paraphrase_set_column: str = PARAPHRASE_SET_COLUMN):
    """G completions per prompt (as ``plain``), then ONE GRPO group per paraphrase set: every completion of
    every wording of a question shares the group id of that question, so the advantage baseline (mean, std)
    is taken over all wordings' completions together::

        group(o_ij) = set(q_i)      A_ij = (r_ij - mean_{u, m} r_um) / std_{u, m} r_um   (group_zscore)

    with ``u`` over the wordings of the set present in the step and ``m`` over their completions (groups are
    ragged when a set is cut or budgets differ). The set is the row's data column ``paraphrase_set_column``;
    draw whole sets with ``prompt_sampler: paraphrase_sets``. Prompt uids stay per wording, so a sampler's
    per-prompt feedback and the consistency rewards (``information_consistency``, ``paraphrase_consistency``)
    still tell the wordings apart. Each wording is its own prompt with no shared conversation (the paper's
    context reset).

    Provenance: reconstructed from the abstract — information-consistency GRPO (Prabhune et al., 2025,
    arXiv:2512.12858, seed 000-30) "treating prompt variants as groups" and "resetting conversational context";
    the group = all completions of all wordings of a question present in the step is grpolab's reading
    (PS-GRPO, seed 000-77, instead normalises within each paraphrase's own rollouts). Test:
    tests/test_paraphrase_groups.py::test_set_groups_advantages_hand_computed.
    """
    batch = ctx.generate(rows, uids, group_offset=group_offset, num_generations=budgets, temperature=temperatures)
    by_prompt = paraphrase_set_group_ids(rows, group_offset, paraphrase_set_column)
    prompt_index = (batch.group_ids - group_offset).tolist()  # ctx.generate numbers prompt k's group offset + k
    batch.group_ids = torch.tensor([by_prompt[k] for k in prompt_index], dtype=torch.long)
    return batch
