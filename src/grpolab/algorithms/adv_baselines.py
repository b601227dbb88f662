"""Variant catalogue I (group A): baselines, normalisations, difficulty and multi-reward weightings."""
from __future__ import annotations
