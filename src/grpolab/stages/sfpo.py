"""Batch stage / update strategy module (sfpo)."""
