"""Rewards: reward functions scored into a ``[rows, K]`` matrix (``scoring.py``), reward-model, judge, process
and agent rewards registered as ``--reward`` specs, and every reward transform (``transforms.py``)."""
from . import agentic, gui, images, judge, models, process, step_judge, multi_label_rm, transforms  # noqa: F401  (register specs and transforms; gui: the GUI tasks' LM judge)
from . import grm  # noqa: F401  (grm:PATH, a trained generative reward model: IRPO, 000-21)
from . import drirl  # noqa: F401  (drirl:PATH, saved DR-IRL category reward models, 000-43)
from .scoring import STANDARD_ARGS, BatchScorer, RewardFn, RewardScorer, check_signature, parse_reward_spec

__all__ = ["STANDARD_ARGS", "BatchScorer", "RewardFn", "RewardScorer", "check_signature", "parse_reward_spec"]
