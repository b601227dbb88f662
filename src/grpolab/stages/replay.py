"""Batch stage / update strategy module (replay)."""
