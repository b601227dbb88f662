"""Variant catalogue I (group B): uncertainty, entropy, token-level, stateful and span-decoupled advantages."""
from __future__ import annotations
