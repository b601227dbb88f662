"""Rollout strategies for thinking modes (MOTIF multi-round thinking)."""
