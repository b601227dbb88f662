"""Prompt samplers: which prompts come next. Stateful; they checkpoint exactly.

A sampler is a class registered in ``SAMPLERS`` and built as
``cls(num_rows=N, seed=S, [rows=dataset rows], **config keys)`` (keyword-only
``__init__`` parameters are filled from config keys of the same name). It has

* ``next(k) -> list[int]``: the dataset indices of the next ``k`` prompts;
* ``feedback(prompt_uids, rewards, group_ids, reward_matrix, lengths, completion_ids, step)``:
  per-row outcomes after every step (``prompt_uids`` are dataset indices,
  ``rewards`` the combined scalar reward with NaN = unscorable);
* ``state_dict()`` / ``load_state_dict()``: everything needed to make the same
  choices after a resume, its random generator included.
"""
from . import adaptive, budgets, spo, uniform  # noqa: F401  (register the samplers)
from .uniform import UniformSampler
from ..registry import SAMPLERS

__all__ = ["SAMPLERS", "UniformSampler"]
