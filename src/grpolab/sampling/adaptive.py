"""Adaptive prompt samplers (variant catalogue II): difficulty- and variance-aware prompt selection."""
from __future__ import annotations
