"""Rollout strategies that add hints to the prompt (filled in by the catalogue II work)."""
