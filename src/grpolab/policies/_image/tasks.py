"""``digits``, ``digits_jpeg``, ``digits_compress``: class-conditional 8×8 digit generation for image policies.

The tasks of the tiny class-conditional digits models (design: docs/design/policies.md §5.4, §6). They need a
policy with the ``images`` capability (``flow_matching``, ``ddpm``, ...); with a language-model policy the
config is refused at start-up. A row is a condition, not a problem:

* train rows ``{"prompt": "3", "label": 3}``: ``n_per_class`` (20) rows per class of ``digits_classes``
  (default all ten), shuffled with the task's ``seed`` (200 rows by default);
* eval rows ``{"prompt": "3", "label": 3, "noise_seed": j}``: every class of ``digits_eval_classes`` (default:
  ``digits_classes``) × ``digits_eval_noises`` (5) fixed noises j = 0, 1, …; the image policies' evaluation
  samplers draw the initial noise from ``noise_seed``, so the same noises are denoised before and after
  training. Ordered noise-major (all classes with j = 0, then j = 1, …), so a run's ``eval_problems`` cap
  (the trainer keeps the first ``eval_problems`` rows) keeps the classes balanced. 50 rows by default.

Train on digits 0–4 and evaluate on 5–9: ``digits_classes: [0, 1, 2, 3, 4]``, ``digits_eval_classes:
[5, 6, 7, 8, 9]``.

Rewards (below; published as ``grpolab.policies._image.rewards``), accuracy = ``digit_correct`` (the classifier's argmax is the asked class):

* ``digits``: ``digit_confidence`` (1.0), ``digit_correct`` (0.0, logged);
* ``digits_jpeg``: ``jpeg_incompressibility`` (1.0; DDPO's task), ``digit_correct`` (0.0);
* ``digits_compress``: ``jpeg_compressibility`` (1.0; DDPO's task), ``digit_correct`` (0.0).

The reward functions are defined here, with the tasks, as every built-in task's are, and published as
``grpolab.policies._image.rewards`` (design §6; ``--reward grpolab.policies._image.rewards:digit_confidence`` on a user's data
with a ``label`` column). Why here: the rewards package already imports ``tasks`` (``judge:self`` reads the
task's rows), so ``tasks`` importing ``rewards`` would make the two packages import each other
(tests/test_architecture.py).

Reward contract, the text rewards' (TRL's): ``f(prompts, completions, completion_ids, **columns) -> list[float]``.
For a policy with the ``images`` capability, ``completions[i]`` is one generated image, a float32 NumPy array
``[H, W, C]`` with values in [0, 1] (C = 1 grey, 3 RGB; the tiny digits models give ``[8, 8, 1]``), and the data
columns arrive as keyword lists (``label``). Every function takes a batch of any size (an empty one gives
``[]``), returns plain floats, and raises a ``ValueError`` naming the reward and the input it expects when a
completion is not an image array (text from a language-model policy, say). Values are clipped to [0, 1] first.

* :func:`digit_confidence`: softmax probability of the asked class under the digit classifier;
* :func:`digit_correct`: 1.0 when the classifier's argmax is the asked class (the ``digits`` tasks' accuracy);
* :func:`digit_confidence_q`: the confidence rounded to the nearest of {0, 0.2, …, 1} (6 levels);
* :func:`jpeg_incompressibility` / :func:`jpeg_compressibility`: ± the JPEG file size in kB (DDPO's tasks).

The classifier (``grpolab.policies._image.classifier.load_digit_classifier``: a tiny CNN trained on the even-indexed
scikit-learn digits, held-out accuracy in its ``meta.json``) is loaded once per process and kept (trained and
cached on first use; its messages go to stderr). It reads ``[B, 1, 8, 8]`` in [−1, 1], so an image x in [0, 1]
is fed as 2x − 1 (the digits models' and the classifier's own scale, pixel/8 − 1 for the 0–16 data).
"""
from __future__ import annotations

import io
import math
import random
import threading

import numpy as np

from ...registry import TASKS, param
from ...tasks.base import Task
from ..base import reward_column


# ---------------------------------------------------------------------------------------------------- rewards

_CLASSIFIER = None
_CLASSIFIER_LOCK = threading.Lock()  # the scorer may call rewards from a worker thread (reward_timeout)

#: Images with a side below this are nearest-upsampled by an integer factor to at least this side before JPEG
#: encoding (the JPEG rewards' docstring: 8×8 files are header-dominated).
JPEG_MIN_SIDE = 32
JPEG_QUALITY = 95
QUANT_LEVELS = 6  # {0, 0.2, 0.4, 0.6, 0.8, 1}


# ---------------------------------------------------------------------------------------------------- inputs

def _describe(x) -> str:
    if isinstance(x, str):
        return f"text {x[:40]!r}" + ("…" if len(x) > 40 else "")
    shape = getattr(x, "shape", None)
    if shape is not None:
        return f"{type(x).__name__} of shape {tuple(shape)} and dtype {getattr(x, 'dtype', '?')}"
    return f"a {type(x).__name__}"


def _image(reward: str, x, expected: str) -> np.ndarray:
    """``x`` as a float32 array ``[H, W, C]`` (C 1 or 3) clipped to [0, 1], or a ValueError naming ``reward``."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor: accepted as well
        x = x.detach().cpu().numpy()
    ok = (isinstance(x, np.ndarray) and x.ndim == 3 and x.shape[-1] in (1, 3) and min(x.shape[:2]) >= 1
          and np.issubdtype(x.dtype, np.floating))  # integers (uint8 0-255?) would be misread as [0, 1]
    if not ok:
        raise ValueError(
            f"reward '{reward}' scores images: each completion must be {expected}, as an image policy (policy "
            f"flow_matching, ddpm, ...) passes them; got {_describe(x)}. A language-model policy's completions "
            f"are text: use a text reward, or a policy with the images capability.")
    return np.clip(x.astype(np.float32, copy=False), 0.0, 1.0)


def completion_images(reward: str, completions, expected: str) -> list[np.ndarray]:
    if completions is None:
        raise ValueError(f"reward '{reward}': no completions given (expected a list of {expected})")
    return [_image(reward, c, expected) for c in completions]


def label_digits(reward: str, label, n: int) -> list[int]:
    """The ``label`` column as ints in 0..9, one per completion."""
    label = reward_column(reward, "label", label, n, "the asked digit 0-9, one per row", "labels")
    out = []
    for v in label:
        k = None
        if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
            k = int(v)
        elif isinstance(v, str) and v.strip().isdigit():
            k = int(v)
        elif isinstance(v, (float, np.floating)) and float(v).is_integer():
            k = int(v)
        if k is None or not 0 <= k <= 9:
            raise ValueError(f"reward '{reward}': column 'label' must hold digits 0-9 (int), got {v!r}")
        out.append(k)
    return out


# ---------------------------------------------------------------------------------------------------- classifier

def digit_classifier():
    """The digit classifier, loaded once per process (float32, eval mode, CPU; trained and cached on first use)."""
    global _CLASSIFIER
    if _CLASSIFIER is None:
        with _CLASSIFIER_LOCK:
            if _CLASSIFIER is None:
                from ...errors import warn_line
                from .classifier import load_digit_classifier

                _CLASSIFIER = load_digit_classifier(log=warn_line)  # stderr: `grpolab eval` prints JSON on stdout
    return _CLASSIFIER


_DIGIT = "a float32 NumPy array [8, 8, 1] in [0, 1] (an 8x8 grey digit)"


def _probabilities(reward: str, completions) -> np.ndarray:
    """Softmax class probabilities ``[B, 10]`` of the classifier on the images (input 2x − 1)."""
    import torch

    images = completion_images(reward, completions, _DIGIT)
    for x in images:
        if x.shape != (8, 8, 1):
            raise ValueError(f"reward '{reward}' judges 8x8 grey digits with the digit classifier: each completion "
                             f"must be {_DIGIT}; got an image of shape {tuple(x.shape)}")
    if not images:
        return np.zeros((0, 10), dtype=np.float32)
    batch = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous() * 2 - 1  # [B, 1, 8, 8] in [−1, 1]
    model = digit_classifier()
    with torch.no_grad():
        return model(batch).float().softmax(-1).numpy()


def digit_confidence(prompts=None, completions=None, *, label, **kwargs) -> list[float]:
    """p_classifier(label | image): the softmax probability of the asked class, in [0, 1].

    r_i = softmax(f(2·x_i − 1))[label_i], f the digit classifier's logits, x_i the image in [0, 1].

    Source: [ours] (design §6; a classifier-probability reward for the tiny class-conditional digits model).
    """
    return _confidence("digit_confidence", completions, label)


def _confidence(reward: str, completions, label) -> list[float]:
    probs = _probabilities(reward, completions)
    labels = label_digits(reward, label, len(probs))
    return [float(p[k]) for p, k in zip(probs, labels)]


def digit_correct(prompts=None, completions=None, *, label, **kwargs) -> list[float]:
    """1.0 if the classifier's most probable class is the asked one, else 0.0 (the digits tasks' accuracy).

    r_i = 1[argmax_c f(2·x_i − 1)_c = label_i] (ties: the lowest class index, torch/NumPy argmax).

    Source: [ours] (design §6).
    """
    probs = _probabilities("digit_correct", completions)
    labels = label_digits("digit_correct", label, len(probs))
    return [float(int(np.argmax(p)) == k) for p, k in zip(probs, labels)]


def quantize(p: float, levels: int = QUANT_LEVELS) -> float:
    """``p`` in [0, 1] rounded to the nearest of ``levels`` evenly spaced values {0, 1/(L−1), …, 1}, halves up."""
    k = math.floor(min(max(float(p), 0.0), 1.0) * (levels - 1) + 0.5)
    return k / (levels - 1)


def digit_confidence_q(prompts=None, completions=None, *, label, **kwargs) -> list[float]:
    """The :func:`digit_confidence` rounded to the nearest of {0, 0.2, 0.4, 0.6, 0.8, 1} (6 levels).

    r_i = ⌊5·p_i + ½⌋ / 5, p_i = digit_confidence (nearest level, halves up: 0.09 → 0, 0.11 → 0.2, 0.1 → 0.2).

    Source: AR-GRPO's quantised rewards, 6 levels [paper; design §6, reference notes §10]; their exact binning
    is not public: rounding to the nearest level (not flooring) is [ours].
    """
    return [quantize(p) for p in _confidence("digit_confidence_q", completions, label)]


# ---------------------------------------------------------------------------------------------------- JPEG

_ANY = "a float32 NumPy array [H, W, C] in [0, 1] with C = 1 or 3 (an image)"


def jpeg_size_kb(image: np.ndarray) -> float:
    """The JPEG file size in kB (bytes / 1000) of one image ``[H, W, C]`` in [0, 1], as the JPEG rewards
    measure it: uint8 = round(255·x), nearest-upsampled by ⌈32 / min(H, W)⌉ when a side is below 32, PIL,
    quality 95 (mode L for C = 1, RGB for C = 3)."""
    from PIL import Image

    u8 = np.clip(np.round(image * 255.0), 0, 255).astype(np.uint8)
    side = min(u8.shape[:2])
    if side < JPEG_MIN_SIDE:
        f = math.ceil(JPEG_MIN_SIDE / side)
        u8 = u8.repeat(f, axis=0).repeat(f, axis=1)
    buf = io.BytesIO()
    Image.fromarray(u8[..., 0] if u8.shape[-1] == 1 else u8).save(buf, format="JPEG", quality=JPEG_QUALITY)
    return buf.tell() / 1000


def jpeg_incompressibility(prompts=None, completions=None, **kwargs) -> list[float]:
    """+ the JPEG file size in kB: r_i = bytes(JPEG_q95(uint8(round(255·x_i)))) / 1000 (larger = more detail).

    Source: [code: kvablack/ddpo-pytorch ddpo_pytorch/rewards.py jpeg_incompressibility] (DDPO), same formula
    (round, clip, PIL JPEG quality 95, ``buffer.tell() / 1000``). Differences [ours]: (1) a grey image (C = 1) is
    encoded as one-channel JPEG (mode L; DDPO's images are RGB); (2) an image with a side below 32 pixels is
    first nearest-upsampled by the integer factor ⌈32 / min(H, W)⌉ (8×8 → 32×32), because 8×8 files are
    header-dominated [measured on 16 Euler samples per class of the tiny flow model, all 10 classes]: at 8×8
    the file is ≈ 390 bytes with a within-group std of 2.8 bytes (range 10 bytes, integer steps); at 32×32 it is
    ≈ 830 bytes with a std of 45 bytes (range 160). (At 64×64 the spread collapses again, std 5.5 bytes: every
    source pixel then fills one constant 8×8 JPEG block.) Images of side ≥ 32 are encoded as they are.
    """
    return [jpeg_size_kb(x) for x in completion_images("jpeg_incompressibility", completions, _ANY)]


def jpeg_compressibility(prompts=None, completions=None, **kwargs) -> list[float]:
    """− the JPEG file size in kB: r_i = −bytes(JPEG_q95(uint8(round(255·x_i)))) / 1000 (smaller file = higher).

    Source: [code: kvablack/ddpo-pytorch ddpo_pytorch/rewards.py jpeg_compressibility] (DDPO: the negated
    ``jpeg_incompressibility``); the same differences as :func:`jpeg_incompressibility` (grey as mode L; sides
    below 32 nearest-upsampled to ≥ 32 first).
    """
    return [-jpeg_size_kb(x) for x in completion_images("jpeg_compressibility", completions, _ANY)]


# ---------------------------------------------------------------------------------------------------- tasks

NUM_CLASSES = 10

# one declaration per config key, shared by the three tasks
CLASSES = param(list(range(NUM_CLASSES)), "digits tasks: the classes (0-9) the training rows ask for (default all "
                                          "ten)")
EVAL_CLASSES = param(None, "digits tasks: the classes (0-9) of the held-out rows; null = digits_classes (e.g. "
                           "train on [0, 1, 2, 3, 4], evaluate on [5, 6, 7, 8, 9])")
EVAL_NOISES = param(5, "digits tasks: fixed initial noises (noise_seed 0, 1, ...) per held-out class: the held-out "
                       "rows are classes x this (50 by default), capped by eval_problems")


def digit_classes(key: str, value) -> list[int]:
    """A list of distinct digits 0-9 from the option ``key`` (order kept), or a ValueError naming it."""
    if isinstance(value, (int, str)):
        value = [value]
    out = []
    for v in value or ():
        try:
            k = int(v)
        except (TypeError, ValueError):
            k = None
        if k is None or isinstance(v, bool) or not 0 <= k < NUM_CLASSES or str(k) != str(v).strip():
            raise ValueError(f"{key}: expected digits 0-9, got {v!r} in {value!r}")
        if k not in out:
            out.append(k)
    if not out:
        raise ValueError(f"{key}: expected at least one digit 0-9, got {value!r}")
    return out


def digit_rows(classes: list[int], n_per_class: int, seed: int) -> list[dict]:
    """``n_per_class`` rows ``{"prompt": "d", "label": d}`` per class, shuffled with ``seed``."""
    rows = [{"prompt": str(c), "label": c} for c in classes for _ in range(n_per_class)]
    random.Random(seed).shuffle(rows)
    return rows


def digit_eval_rows(classes: list[int], noises: int) -> list[dict]:
    """Every class × ``noises`` fixed noises, noise-major: ``{"prompt": "d", "label": d, "noise_seed": j}``."""
    return [{"prompt": str(c), "label": c, "noise_seed": j} for j in range(noises) for c in classes]


def digit_task_rows(name: str, n_per_class: int, seed: int, digits_classes, digits_eval_classes,
                    digits_eval_noises) -> tuple[list[int], list[int], list[dict], list[dict]]:
    """``(classes, held-out classes, training rows, held-out rows)`` of a digits task (module docstring: rows,
    options), the options checked (a ValueError naming task ``name`` or the option)."""
    classes = digit_classes("digits_classes", digits_classes)
    eval_classes = classes if digits_eval_classes is None else digit_classes("digits_eval_classes", digits_eval_classes)
    if n_per_class < 1:
        raise ValueError(f"{name}: n_per_class must be >= 1, got {n_per_class}")
    if int(digits_eval_noises) < 0:
        raise ValueError(f"digits_eval_noises: must be >= 0, got {digits_eval_noises}")
    return classes, eval_classes, digit_rows(classes, n_per_class, seed), digit_eval_rows(eval_classes,
                                                                                          int(digits_eval_noises))


def _task(name: str, rewards: list, description: str, n_per_class: int, seed: int, digits_classes,
          digits_eval_classes, digits_eval_noises) -> Task:
    classes, eval_classes, rows, eval_rows = digit_task_rows(name, n_per_class, seed, digits_classes,
                                                             digits_eval_classes, digits_eval_noises)
    return Task(name, rows, eval_rows, rewards=rewards, accuracy_reward="digit_correct",
                description=f"{description}; classes {','.join(map(str, classes))}"
                            + (f" (held out: {','.join(map(str, eval_classes))})" if eval_classes != classes else ""),
                extra={})


@TASKS.register("digits", needs=("images",))
def digits(n_per_class: int = 20, seed: int = 0, *, digits_classes: list = CLASSES,
           digits_eval_classes: list | None = EVAL_CLASSES, digits_eval_noises: int = EVAL_NOISES) -> Task:
    """Generate the asked digit: reward ``digit_confidence`` (the classifier's probability of the asked class),
    accuracy ``digit_correct`` (module docstring: rows, options).

    Provenance: grpolab's own — a built-in toy image task (class-conditional 8x8 scikit-learn digits judged by a
    tiny CNN) for the image policies' tests and demos; implements no published method.
    """
    return _task("digits", [("digit_confidence", digit_confidence, 1.0), ("digit_correct", digit_correct, 0.0)],
                 "8x8 digits: the classifier's probability of the asked digit", n_per_class, seed, digits_classes,
                 digits_eval_classes, digits_eval_noises)


@TASKS.register("digits_jpeg", needs=("images",))
def digits_jpeg(n_per_class: int = 20, seed: int = 0, *, digits_classes: list = CLASSES,
                digits_eval_classes: list | None = EVAL_CLASSES, digits_eval_noises: int = EVAL_NOISES) -> Task:
    """DDPO's JPEG incompressibility task on the digits: reward ``jpeg_incompressibility`` (+kB of the image's
    JPEG file), ``digit_correct`` logged as the accuracy (module docstring: rows, options).

    Provenance: grpolab's own — DDPO's JPEG-incompressibility objective (grpolab.policies._image.rewards, after
    kvablack/ddpo-pytorch) posed on the built-in 8x8 digits as a toy image task; the task itself implements no
    published method.
    """
    return _task("digits_jpeg", [("jpeg_incompressibility", jpeg_incompressibility, 1.0),
                                 ("digit_correct", digit_correct, 0.0)],
                 "8x8 digits: JPEG incompressibility (DDPO)", n_per_class, seed, digits_classes,
                 digits_eval_classes, digits_eval_noises)


@TASKS.register("digits_compress", needs=("images",))
def digits_compress(n_per_class: int = 20, seed: int = 0, *, digits_classes: list = CLASSES,
                    digits_eval_classes: list | None = EVAL_CLASSES, digits_eval_noises: int = EVAL_NOISES) -> Task:
    """DDPO's JPEG compressibility task on the digits: reward ``jpeg_compressibility`` (−kB of the image's JPEG
    file), ``digit_correct`` logged as the accuracy (module docstring: rows, options).

    Provenance: grpolab's own — DDPO's JPEG-compressibility objective (grpolab.policies._image.rewards, after
    kvablack/ddpo-pytorch) posed on the built-in 8x8 digits as a toy image task; the task itself implements no
    published method.
    """
    return _task("digits_compress", [("jpeg_compressibility", jpeg_compressibility, 1.0),
                                     ("digit_correct", digit_correct, 0.0)],
                 "8x8 digits: JPEG compressibility (DDPO)", n_per_class, seed, digits_classes,
                 digits_eval_classes, digits_eval_noises)


# ---------------------------------------------------------------------------------------------------- AR-GRPO

#: AR-GRPO's quantised reward map [code: Kwai-Klear/AR-GRPO img_gen_grpo_rewards.py, ``discrete_reward_map(score,
#: [0, 0.3, 0.6, 1], [-1, 0.5, 1, 1.5])`` in CLIPDistanceReward / HPSV21DistanceReward / MANIQAReward with
#: ``quantize=True``]: below 0 → −1, [0, 0.3) → 0.5, [0.3, 0.6) → 1, [0.6, 1) → 1.5 (≥ 1: 1.5, [ours]).
STEP_THRESHOLDS = (0.0, 0.3, 0.6, 1.0)
STEP_VALUES = (-1.0, 0.5, 1.0, 1.5)


def step_map(value: float, thresholds=STEP_THRESHOLDS, values=STEP_VALUES) -> float:
    """AR-GRPO's ``discrete_reward_map``: ``values[0]`` below ``thresholds[0]``, ``values[i + 1]`` on
    ``[thresholds[i], thresholds[i + 1])``, and the last value from the last threshold on. (Their code returns
    ``reward_list[len(value_list)]`` there, index 4 of a 4-entry list: an IndexError for a score ≥ 1, which CLIP
    and HPS scores never reach but a classifier probability can (float32 softmax gives exactly 1.0); the last
    value, 1.5, is [ours].)"""
    v = float(value)
    if v < thresholds[0]:
        return float(values[0])
    for i in range(len(thresholds) - 1):
        if thresholds[i] <= v < thresholds[i + 1]:
            return float(values[i + 1])
    return float(values[-1])


def digit_confidence_steps(prompts=None, completions=None, *, label, **kwargs) -> list[float]:
    """The :func:`digit_confidence` p on AR-GRPO's quantised-reward steps: 0.5 for p < 0.3, 1 for 0.3 ≤ p < 0.6,
    1.5 for p ≥ 0.6 (their map also gives −1 below 0, which a probability never reaches; p = 1 gives 1.5,
    see :func:`step_map`).

    r_i = step_map(p_i) with thresholds [0, 0.3, 0.6, 1] and values [−1, 0.5, 1, 1.5].

    Source: [code: Kwai-Klear/AR-GRPO img_gen_grpo_rewards.py, discrete_reward_map and its use by the quantised
    CLIP / HPS-v2.1 / MANIQA rewards], the same map applied to the classifier's probability instead of a CLIP or
    HPS score (both in [0, 1] as well). Not the 6-level :func:`digit_confidence_q` (the design's reading of the
    paper before the code was read).
    """
    return [step_map(p) for p in _confidence("digit_confidence_steps", completions, label)]


#: The non-quantised rewards of AR-GRPO return 5·score ("we need a positive max reward"); the reward weights of
#: their class-to-image script are all 1. So the digits confidence enters with weight 5.
AR_GRPO_CONFIDENCE_WEIGHT = 5.0


@TASKS.register("digits_multi", needs=("images",))
def digits_multi(n_per_class: int = 20, seed: int = 0, *, digits_classes: list = CLASSES,
                 digits_eval_classes: list | None = EVAL_CLASSES, digits_eval_noises: int = EVAL_NOISES) -> Task:
    """AR-GRPO's multi-dimensional reward on the digits: the weighted sum of ``digit_confidence`` (weight 5),
    ``digit_confidence_steps`` (1) and ``jpeg_compressibility`` (1); accuracy ``digit_correct`` (module
    docstring: rows, options).

    r = 5·p + step_map(p) − kB(JPEG(x)), p = the classifier's probability of the asked digit.

    AR-GRPO's class-to-image run (run_c2i_train.sh) sums CLIP similarity, HPS-v2.1 (each as 5·score and
    quantised), MANIQA and three Qwen2.5-VL judgments with weights 1: semantic fidelity (here the classifier's
    confidence, raw ×5 and quantised by their map) plus image quality (here JPEG compressibility, DDPO's
    simplicity reward, standing in for MANIQA and the VLM judges: an 8x8 digit has no perceptual-quality model).

    Provenance: grpolab's own — AR-GRPO's multi-reward design (https://github.com/Kwai-Klear/AR-GRPO,
    img_gen_grpo_rewards.py, run_c2i_train.sh) posed on the built-in 8x8 digits; the reward models are stand-ins.
    """
    return _task("digits_multi", [("digit_confidence", digit_confidence, AR_GRPO_CONFIDENCE_WEIGHT),
                                  ("digit_confidence_steps", digit_confidence_steps, 1.0),
                                  ("jpeg_compressibility", jpeg_compressibility, 1.0),
                                  ("digit_correct", digit_correct, 0.0)],
                 "8x8 digits: AR-GRPO's multi-dimensional reward (confidence x5, quantised confidence, JPEG "
                 "compressibility)", n_per_class, seed, digits_classes, digits_eval_classes, digits_eval_noises)
