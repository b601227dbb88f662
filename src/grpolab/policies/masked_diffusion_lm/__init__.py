"""Policy kind ``masked_diffusion_lm``: masked diffusion language models (diffu-GRPO, LLaDA).
``policy.py`` the policy, ``estimators.py`` the log-prob estimators, ``sampler.py`` LLaDA's block-wise sampler,
``tiny.py`` the built-in tiny character-level model."""
