"""Image rewards (design: docs/design/policies.md §6): the rewards of the ``digits*`` tasks, for image policies.

``completions[i]`` is one generated image, a float32 NumPy array ``[H, W, C]`` in [0, 1] (C = 1 for the tiny
digits models' 8×8 images); data columns arrive as keyword lists (``label``). Each function takes a batch of any
size, returns floats, and raises a ``ValueError`` naming the reward and the input it expects when a completion is
not an image (text from a language-model policy, say):

* ``digit_confidence``: softmax probability of the asked class (``label``) under the digit classifier;
* ``digit_correct``: 1.0 when the classifier's argmax is the asked class (the digits tasks' accuracy);
* ``digit_confidence_q``: the confidence rounded to the nearest of {0, 0.2, …, 1} (AR-GRPO's 6 levels);
* ``jpeg_incompressibility`` / ``jpeg_compressibility``: ± the JPEG file size in kB (DDPO; images with a side
  below 32 pixels are nearest-upsampled to at least 32 first, as 8×8 files are header-dominated).

Use them on your own data with ``--reward grpolab.policies._image.rewards:digit_confidence`` (the data needs a ``label``
column). They are defined, with their formulas and sources, in ``grpolab/policies/_image/tasks.py`` beside the tasks that
use them (as every built-in task's rewards are): this package already imports ``tasks`` (``judge:self``), so
``tasks`` may not import ``rewards`` (tests/test_architecture.py, no import cycle between packages).
"""
from __future__ import annotations

from .tasks import (digit_classifier, digit_confidence, digit_confidence_q, digit_correct,
                            jpeg_compressibility, jpeg_incompressibility, jpeg_size_kb, quantize)

__all__ = ["digit_confidence", "digit_correct", "digit_confidence_q", "jpeg_incompressibility",
           "jpeg_compressibility", "jpeg_size_kb", "quantize", "digit_classifier"]
