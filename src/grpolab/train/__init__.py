"""Training loop, checkpoints, metrics and evaluation."""
