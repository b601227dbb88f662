"""Policy kind ``speech_to_text``: speech recognition (GRPO for ASR). ``policy.py`` the policy,
``corpus.py`` the synthetic spoken-digits corpus (feature frames, not audio), ``tiny.py`` the built-in tiny model, ``tiny_audio.py`` the same on audio (``--model spoken_words``),
``tasks.py`` / ``rewards.py`` the task and its rewards; ``whisper.py`` / ``audio.py`` Whisper folders trained from
audio (files, arrays, ``datasets.Audio()``), ``spoken_words.py`` / ``tasks_audio.py`` / ``clips/`` real speech
synthesised by espeak-ng (task ``spoken_words_audio``)."""
from __future__ import annotations

from ...registry import declare_capability

declare_capability("audio", "conditions are utterances (speech feature frames or audio): speech tasks")
