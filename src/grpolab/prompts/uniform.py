"""The uniform prompt sampler: an epoch-wise shuffled pass over the data."""
from __future__ import annotations

import torch

from ..registry import SAMPLERS


def require_rows(num_rows: int) -> None:
    """The check every prompt sampler makes first: a ValueError unless the data has at least one row."""
    if num_rows < 1:
        raise ValueError("the prompt sampler needs at least one data row")


@SAMPLERS.register("uniform")
class UniformSampler:
    """Epoch-wise shuffled pass over the dataset (sampling without replacement).

    ``next(k)`` returns ``k`` dataset indices; a new permutation is drawn from
    the sampler's own generator at each epoch boundary. ``feedback`` receives
    per-prompt outcomes after every step (unused here; adaptive samplers such
    as VADE use it).

    Provenance: paper equations — DeepSeekMath (Shao et al., 2024, arXiv:2402.03300), Algorithm 1 (sample a
    batch of questions each step), as an epoch-wise shuffled pass like TRL's sampler.
    """

    def __init__(self, num_rows: int, seed: int = 0):
        require_rows(num_rows)
        self.num_rows = num_rows
        self.generator = torch.Generator().manual_seed(seed)
        self.order: list[int] = []
        self.position = 0
        self.epoch = 0

    def next(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.position >= len(self.order):
                self.order = torch.randperm(self.num_rows, generator=self.generator).tolist()
                self.position = 0
                self.epoch += 1
            take = min(k - len(out), len(self.order) - self.position)
            out.extend(self.order[self.position:self.position + take])
            self.position += take
        return out

    def feedback(self, **outcomes) -> None:
        pass

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "order": list(self.order),
                "position": self.position, "epoch": self.epoch, "num_rows": self.num_rows}

    def load_state_dict(self, state: dict) -> None:
        if state["num_rows"] != self.num_rows:
            raise ValueError(f"sampler state is for {state['num_rows']} rows, the data has {self.num_rows}")
        self.generator.set_state(state["generator"])
        self.order, self.position, self.epoch = list(state["order"]), state["position"], state["epoch"]
