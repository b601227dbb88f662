"""Policies: the model being trained and how it acts (``POLICIES``, config key ``policy``).

``base.py`` names what the pipeline needs from a policy and the capabilities a component may require;
``causal_lm.py`` is the causal language model every text recipe trains (the default).
"""
from __future__ import annotations

from ..registry import POLICIES
from . import causal_lm  # noqa: F401  (registers the causal LM)
from . import flow_matching  # noqa: F401  (registers the rectified-flow image policy)
from . import ddpm  # noqa: F401  (registers the DDPM/DDIM image policy, DDPO)
from . import ar_image  # noqa: F401  (registers the autoregressive image policy, AR-GRPO)
from . import var_image  # noqa: F401  (registers the next-scale image policy, VAR RL)
from . import masked_dlm  # noqa: F401  (registers the masked diffusion LM, diffu-GRPO)
from . import speech  # noqa: F401  (registers the speech recogniser, GRPO for ASR)
from . import vlm  # noqa: F401  (registers the vision-language policy)
from . import control  # noqa: F401  (registers the control policy: Gymnasium / PettingZoo)
from .base import CAPABILITIES, PolicyBase

__all__ = ["CAPABILITIES", "POLICIES", "PolicyBase"]
