"""A prompt sampler that draws whole paraphrase sets, so that consistency rewards see every wording of a set."""
from __future__ import annotations

import torch

from ..registry import SAMPLERS, param
from .uniform import UniformSampler

PARAPHRASE_SET_COLUMN = param("paraphrase_group", "paraphrase_sets sampler, paraphrase_groups rollout: data column "
                                                  "naming each row's paraphrase set")


@SAMPLERS.register("paraphrase_sets")
class ParaphraseSetSampler(UniformSampler):
    """Epoch-wise shuffled pass over paraphrase *sets*: rows sharing a value of ``paraphrase_set_column``.

    ``next(k)`` returns the rows of whole sets, in shuffled set order, until ``k`` rows are reached; when a set
    does not fit in what is left of ``k`` only its first rows are taken (choose ``prompts_per_step`` as a
    multiple of the set size to avoid it; the ``paraphrase_consistency`` transform reports a set seen with one
    wording). Needs the data column, else a ConfigError-style message naming it.

    The rollout strategy ``paraphrase_groups`` then makes each set one GRPO group (000-30); with the plain
    rollout each wording stays its own group (PS-GRPO, 000-77).

    Provenance: reconstructed from the abstract — PS-GRPO (seed 000-77) and the information-consistency GRPO
    (seed 000-30) roll out over the paraphrases of a query together; drawing whole sets per step is grpolab's way
    to put every wording of a set in one batch.
    """

    def __init__(self, num_rows: int, seed: int = 0, rows: list[dict] | None = None, *,
                 paraphrase_set_column: str = PARAPHRASE_SET_COLUMN):
        if rows is None or any(paraphrase_set_column not in r for r in rows):
            raise ValueError(f"prompt_sampler paraphrase_sets: every data row needs the column "
                             f"'{paraphrase_set_column}' (the paraphrase set it belongs to); the built-in tasks "
                             f"fact_paraphrase and arithmetic_paraphrase have it")
        sets: dict = {}
        for i, r in enumerate(rows):
            sets.setdefault(str(r[paraphrase_set_column]), []).append(i)
        self.sets = list(sets.values())
        super().__init__(num_rows, seed)

    def next(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if self.position >= len(self.order):
                self.order = torch.randperm(len(self.sets), generator=self.generator).tolist()
                self.position = 0
                self.epoch += 1
            members = self.sets[self.order[self.position]]
            self.position += 1
            out.extend(members[:k - len(out)])
        return out
