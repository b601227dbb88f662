"""Rollout strategies that inject tokens into completions (filled in by the catalogue II work)."""
