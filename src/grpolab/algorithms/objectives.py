"""Variant catalogue I (group C): policy objectives beyond the clipped ratio."""
from __future__ import annotations
