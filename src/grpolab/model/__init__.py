"""Policy models: loading (SmolLM2 from its GGUF, tiny random-init, local HF folders), LoRA."""
from .loading import load_policy, save_policy
from .logprobs import completion_logprobs

__all__ = ["load_policy", "save_policy", "completion_logprobs"]
