"""Policy kind ``vision_language``: the vision-language policy. ``policy.py`` the policy,
``tiny.py`` the built-in tiny VLM, ``scenes.py`` / ``clips.py`` / ``gui.py`` / ``tools.py`` / ``prompts.py`` the
synthetic scenes and their prompts, ``tasks*.py`` the vision tasks (counting, GUI, segmentation, tools, motion
clips) and ``rewards*.py`` their rewards."""
from __future__ import annotations

from ...registry import declare_capability

declare_capability("vision", "conditions include pictures (a row's image / images / built-in scene): "
                   "vision-language tasks")
