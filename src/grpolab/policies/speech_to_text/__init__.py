"""Policy kind ``speech_to_text``: speech recognition (GRPO for ASR). ``policy.py`` the policy,
``corpus.py`` the synthetic spoken-digits corpus (feature frames, not audio), ``tiny.py`` the built-in tiny model,
``tasks.py`` / ``rewards.py`` the task and its rewards."""
from __future__ import annotations

from ...registry import declare_capability

declare_capability("audio", "conditions are utterances (speech feature frames): speech tasks")
