"""Policy kind ``causal_lm``: the causal language model every text recipe trains (the default).
``policy.py`` loads it (Hugging Face folders, the tiny built-in, LoRA) and samples through the text engines
(native, compiled decode, vLLM, Ray workers: ``grpolab/generation``, ``grpolab/distributed``)."""
