"""Masked diffusion language models: the log-prob estimators (``estimators.py``), LLaDA's block-wise sampler
(``sampler.py``) and the built-in tiny character-level model (``tiny.py``); the policy is
``policies/masked_dlm.py``."""
