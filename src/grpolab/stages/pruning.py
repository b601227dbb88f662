"""Batch stage / update strategy module (pruning)."""
