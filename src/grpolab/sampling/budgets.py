"""Budget-aware samplers: completions per prompt, per-prompt temperature, model-derived orderings."""
