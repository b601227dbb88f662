"""The ``flow_matching`` kind: the shared rectified-flow image policy (``policies/_image/flow.py``, where its
docstring, formulas and provenance live) registered under its own name."""
from __future__ import annotations

from ...registry import POLICIES
from .._image.flow import FlowMatchingPolicy as _RectifiedFlow
from .._image.flow import check_image_policy


@POLICIES.register("flow_matching", check=check_image_policy)
class FlowMatchingPolicy(_RectifiedFlow):
    __doc__ = _RectifiedFlow.__doc__
