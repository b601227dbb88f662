"""Policy kind ``flow_matching``: rectified-flow image generation with SDE sampling (Flow-GRPO).
The policy class is shared with the other image kinds (``policies/_image/flow.py``); ``policy.py`` registers it,
``egrpo.py`` is E-GRPO's branching rollout."""
