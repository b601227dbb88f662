"""Speech recognition: the synthetic spoken-digits corpus (``corpus.py``: feature frames, not audio) and the
built-in tiny speech-to-text model (``tiny.py``); the policy is ``policies/speech.py``, the task and its rewards
``tasks/speech.py``."""
