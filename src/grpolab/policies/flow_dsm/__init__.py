"""Policy kind ``flow_dsm``: the rectified-flow image policy trained with a denoising-score-matching
objective; ``policy.py``."""
from __future__ import annotations

from ...registry import declare_capability

declare_capability("denoising_loss", "each step is a re-noised final sample scored by the model's "
                   "flow-matching loss (DGPO): per-step denoising losses")
