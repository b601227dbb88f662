"""``digit_frames``: a three-frame "video" of a digit moving right, for Self-Paced GRPO (seed 000-36, design §7).

A row asks for a digit, as in the ``digits`` tasks (``{"prompt": "3", "label": 3}``; held-out rows add a
``noise_seed``). The image policy ``flow_frames`` (the built-in 3-channel 8×8 flow UNet, ``policies/_image/digits.py``
``frames_model_path``) generates a float32 ``[8, 8, 3]`` image in [0, 1] whose channel t is frame t
(t = 0, 1, 2); the training data were the digit shifted right by t pixels. (The report shows the three
channels as one RGB thumbnail; ``flow_frames`` renders them side by side instead.)

Rewards, the three stages of Self-Paced GRPO's progressive reward (combined by the ``self_paced`` reward
transform; without it the task's weights 1/1/1 sum them):

* ``frame_fidelity`` (coarse visual fidelity): mean over frames of the classifier's top-class probability,
  F = (1/3)·Σ_t max_c p(c | S_{−t} f_t), class-agnostic ("a clean digit in every frame");
* ``frame_coherence`` (temporal coherence): −mean_{t, pixels} |f_{t+1} − S_1 f_t| (t = 0, 1), in [−1, 0];
* ``frame_alignment`` (semantic alignment): p(label | S_{−2} f_2), the asked digit's probability on the last
  frame;
* ``frames_correct`` (accuracy, weight 0): 1 when the classifier's argmax on the last frame is the label;

with S_k the shift right by k pixels (S_{−k} left; vacated columns 0 = background) and p the digit
classifier's softmax on the frame fed as 2x − 1. Frames are re-aligned (S_{−t}) before the classifier,
which was trained on centred digits: on the held-out real stacks the asked-class accuracy of the shifted
frames t = 1, 2 is 0.68 / 0.45 as they are and 0.96 / 0.94 re-aligned [measured].
"""
from __future__ import annotations

import numpy as np

from ...registry import TASKS
from ...tasks.base import Task
from .._image.tasks import (CLASSES, EVAL_CLASSES, EVAL_NOISES, completion_images, digit_classifier, digit_task_rows,
                            label_digits)

FRAMES = 3
_FRAMES = "a float32 NumPy array [8, 8, 3] in [0, 1] (three 8x8 grey frames as channels)"


def shift(frame: np.ndarray, k: int) -> np.ndarray:
    """``[..., H, W]`` shifted by ``k`` columns (right for k > 0, left for k < 0), vacated columns 0."""
    out = np.zeros_like(frame)
    if k == 0:
        out[...] = frame
    elif k > 0:
        out[..., k:] = frame[..., :-k]
    else:
        out[..., :k] = frame[..., -k:]
    return out


def _frames(reward: str, completions) -> np.ndarray:
    """The completions as ``[B, 3, 8, 8]`` float32 in [0, 1], or a ValueError naming ``reward``."""
    images = completion_images(reward, completions, _FRAMES)
    for x in images:
        if x.shape != (8, 8, FRAMES):
            raise ValueError(f"reward '{reward}' scores three 8x8 frames: each completion must be {_FRAMES}; got "
                             f"an image of shape {tuple(x.shape)}")
    if not images:
        return np.zeros((0, FRAMES, 8, 8), dtype=np.float32)
    return np.stack(images).transpose(0, 3, 1, 2).copy()


def _frame_probs(frames: np.ndarray) -> np.ndarray:
    """Classifier probabilities ``[B, 3, 10]`` of each frame re-aligned (frame t shifted left by t)."""
    import torch

    B = len(frames)
    if B == 0:
        return np.zeros((0, FRAMES, 10), dtype=np.float32)
    aligned = np.stack([shift(frames[:, t], -t) for t in range(FRAMES)], 1)  # [B, 3, 8, 8]
    x = torch.from_numpy(aligned.reshape(B * FRAMES, 1, 8, 8)) * 2 - 1
    with torch.no_grad():
        p = digit_classifier()(x).float().softmax(-1).numpy()
    return p.reshape(B, FRAMES, 10)


def frame_fidelity(prompts=None, completions=None, **kwargs) -> list[float]:
    """Coarse visual fidelity: F = (1/3)·Σ_t max_c p(c | S_{−t} f_t) (the module docstring's notation), in
    [0.1, 1]; class-agnostic.

    Source: [ours] — Self-Paced GRPO's first stage, "coarse visual fidelity" (Li et al., arXiv:2511.19356, seed
    000-36), posed on the toy frames: the paper's fidelity judge is a video reward model, not this classifier.
    """
    p = _frame_probs(_frames("frame_fidelity", completions))
    return [float(v) for v in p.max(-1).mean(-1)]


def frame_coherence(prompts=None, completions=None, **kwargs) -> list[float]:
    """Temporal coherence: C = −mean_{t∈{0,1}, pixels} |f_{t+1} − S_1 f_t|, in [−1, 0] (0: each frame is the
    previous one moved right by one pixel).

    Source: [ours] — Self-Paced GRPO's second stage, "temporal coherence" (arXiv:2511.19356, seed 000-36), as a
    motion-consistency error on the toy frames.
    """
    f = _frames("frame_coherence", completions)
    if not len(f):
        return []
    err = np.abs(f[:, 1:] - shift(f[:, :-1], 1))
    return [float(-v) for v in err.reshape(len(f), -1).mean(-1)]


def frame_alignment(prompts=None, completions=None, *, label, **kwargs) -> list[float]:
    """Semantic alignment: A = p(label | S_{−2} f_2), the asked digit's probability on the last frame.

    Source: [ours] — Self-Paced GRPO's third stage, "fine-grained text–video semantic alignment"
    (arXiv:2511.19356, seed 000-36), as the asked class on the toy frames.
    """
    p = _frame_probs(_frames("frame_alignment", completions))
    labels = label_digits("frame_alignment", label, len(p))
    return [float(pi[-1, k]) for pi, k in zip(p, labels)]


def frames_correct(prompts=None, completions=None, *, label, **kwargs) -> list[float]:
    """1.0 when the classifier's argmax on the re-aligned last frame is the asked digit (the task's accuracy).

    Source: [ours].
    """
    p = _frame_probs(_frames("frames_correct", completions))
    labels = label_digits("frames_correct", label, len(p))
    return [float(int(np.argmax(pi[-1])) == k) for pi, k in zip(p, labels)]


@TASKS.register("digit_frames", needs=("images",))
def digit_frames(n_per_class: int = 20, seed: int = 0, *, digits_classes: list = CLASSES,
                 digits_eval_classes: list | None = EVAL_CLASSES, digits_eval_noises: int = EVAL_NOISES) -> Task:
    """Three frames of the asked digit moving right by one pixel a frame, as the 3 channels of an 8x8 image
    (policy ``flow_frames``): rewards ``frame_fidelity``, ``frame_coherence``, ``frame_alignment`` (weights 1;
    the ``self_paced`` reward transform re-weights them by competence), accuracy ``frames_correct``; rows and
    options as the ``digits`` task (module docstring).

    Provenance: grpolab's own — a toy stand-in for Self-Paced GRPO's video setting (Li et al., arXiv:2511.19356,
    seed 000-36): three reward columns, one per stage of its curriculum, on 3-frame 8x8 digit "videos".
    """
    classes, _, rows, eval_rows = digit_task_rows("digit_frames", n_per_class, seed, digits_classes,
                                                  digits_eval_classes, digits_eval_noises)
    return Task("digit_frames", rows, eval_rows,
                rewards=[("frame_fidelity", frame_fidelity, 1.0), ("frame_coherence", frame_coherence, 1.0),
                         ("frame_alignment", frame_alignment, 1.0), ("frames_correct", frames_correct, 0.0)],
                accuracy_reward="frames_correct",
                description="3 frames of a digit moving right (Self-Paced GRPO's toy video); classes "
                            + ",".join(map(str, classes)), extra={})
