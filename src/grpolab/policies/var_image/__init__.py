"""Policy kind ``var_image``: next-scale (VAR) image generation; ``policy.py`` the policy, ``model.py``
the tiny VAR model, ``masks.py`` the mask-propagation stage, ``middle_return.py`` the middle-return rollout."""
from __future__ import annotations

from ...registry import declare_capability

declare_capability("scales", "span_ids number the scales of a next-scale (VAR) image model")
