"""Rollout: generation engines and strategies that turn prompts into a RolloutBatch."""
from .sampling import SampleOutput, sample_completions

__all__ = ["SampleOutput", "sample_completions"]
