"""Image rewards (policies/_image/rewards.py) and the digits tasks (policies/_image/tasks.py): hand-checked values."""
import io

import numpy as np
import pytest

pytest.importorskip("sklearn")  # the images extra (digits data, classifier training)

from PIL import Image  # noqa: E402

from grpolab.config import Config  # noqa: E402
from grpolab.errors import ConfigError  # noqa: E402
from grpolab.registry import POLICIES, TASKS  # noqa: E402
from grpolab.rewards import RewardFn, RewardScorer  # noqa: E402
from grpolab.policies._image.rewards import (digit_classifier, digit_confidence, digit_confidence_q, digit_correct,  # noqa: E402
                                    jpeg_compressibility, jpeg_incompressibility, quantize)
from grpolab.tasks import get_task  # noqa: E402


@pytest.fixture(scope="module")
def real_digits():
    """Held-out (odd-indexed: the classifier never trained on them) scikit-learn digits, [8, 8, 1] in [0, 1]."""
    from sklearn.datasets import load_digits

    d = load_digits()
    idx = [1, 3, 7, 9]
    images = [(d.images[i] / 16.0).astype(np.float32)[..., None] for i in idx]
    labels = [int(d.target[i]) for i in idx]
    assert labels == [1, 3, 7, 9]
    return images, labels


# ---------------------------------------------------------------------------------------------------- classifier rewards

def test_digit_confidence_is_high_for_the_label_and_low_for_another(real_digits):
    images, labels = real_digits
    own = digit_confidence(["1", "3", "7", "9"], images, label=labels)
    other = digit_confidence(["7", "8", "1", "4"], images, label=[7, 8, 1, 4])
    assert all(isinstance(v, float) for v in own + other)
    assert min(own) > 0.95 and max(other) < 0.01
    # a probability: the ten classes' confidences of one image sum to 1
    total = sum(digit_confidence(None, [images[1]] * 10, label=list(range(10))))
    assert total == pytest.approx(1.0, abs=1e-5)


def test_digit_correct_is_the_argmax_test(real_digits):
    images, labels = real_digits
    assert digit_correct(None, images, label=labels) == [1.0, 1.0, 1.0, 1.0]
    assert digit_correct(None, images, label=[7, 8, 1, 4]) == [0.0, 0.0, 0.0, 0.0]
    # exactly one class is "correct" for an image: the argmax
    assert sum(digit_correct(None, [images[2]] * 10, label=list(range(10)))) == 1.0
    # labels as the data may hold them: NumPy ints, digit strings
    assert digit_correct(None, images[:2], label=[np.int64(1), "3"]) == [1.0, 1.0]


def test_classifier_input_is_2x_minus_1(real_digits):
    """The reward feeds the classifier 2x − 1 ([−1, 1], its training scale): recomputed here by hand."""
    import torch

    images, labels = real_digits
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2) * 2 - 1
    with torch.no_grad():
        p = digit_classifier()(x).softmax(-1).numpy()
    expected = [float(p[i, k]) for i, k in enumerate(labels)]
    assert digit_confidence(None, images, label=labels) == pytest.approx(expected, abs=1e-6)


def test_classifier_is_loaded_once_per_process():
    assert digit_classifier() is digit_classifier()


def test_rewards_take_a_batch_of_any_size(real_digits):
    images, labels = real_digits
    for fn in (digit_confidence, digit_correct, digit_confidence_q):
        assert fn(None, [], label=[]) == []
        assert len(fn(None, images[:1], label=labels[:1])) == 1
        assert len(fn(None, images * 8, label=labels * 8)) == 32
    for fn in (jpeg_incompressibility, jpeg_compressibility):
        assert fn(None, []) == [] and len(fn(None, images * 8)) == 32


def test_values_outside_0_1_are_clipped(real_digits):
    images, labels = real_digits
    x = images[0] * 1.5 - 0.25  # [−0.25, 1.25]
    assert digit_confidence(None, [x], label=[1]) == digit_confidence(None, [np.clip(x, 0, 1)], label=[1])
    assert jpeg_incompressibility(None, [x]) == jpeg_incompressibility(None, [np.clip(x, 0, 1)])


# ---------------------------------------------------------------------------------------------------- quantised

@pytest.mark.parametrize("p, q", [(0.0, 0.0), (0.09, 0.0), (0.1, 0.2), (0.11, 0.2), (0.29, 0.2), (0.31, 0.4),
                                  (0.5, 0.6), (0.69, 0.6), (0.71, 0.8), (0.89, 0.8), (0.91, 1.0), (1.0, 1.0)])
def test_quantize_rounds_to_the_nearest_of_six_levels(p, q):
    assert quantize(p) == q


def test_digit_confidence_q_bins_the_confidence(real_digits):
    images, labels = real_digits
    wrong = [7, 8, 1, 4]
    both = images + images
    lab = labels + wrong
    q = digit_confidence_q(None, both, label=lab)
    assert q == [quantize(p) for p in digit_confidence(None, both, label=lab)]
    assert q == [1.0] * 4 + [0.0] * 4
    assert set(q) <= {0.0, 0.2, 0.4, 0.6, 0.8, 1.0}


# ---------------------------------------------------------------------------------------------------- JPEG

def _pil_kb(u8: np.ndarray) -> float:
    """File size in kB of a uint8 image [H, W] or [H, W, 3] saved by PIL as JPEG quality 95 (DDPO's reward)."""
    buf = io.BytesIO()
    Image.fromarray(u8).save(buf, format="JPEG", quality=95)
    return len(buf.getvalue()) / 1000


def test_jpeg_rewards_match_pil_sizes_computed_here():
    rng = np.random.default_rng(0)
    grey8 = rng.random((8, 8, 1)).astype(np.float32)
    rgb8 = rng.random((8, 8, 3)).astype(np.float32)
    grey40 = rng.random((40, 40, 1)).astype(np.float32)
    u8 = lambda x: np.clip(np.round(x * 255), 0, 255).astype(np.uint8)  # noqa: E731
    # 8x8: nearest-upsampled x4 to 32x32 (each pixel a 4x4 block), grey as mode L, RGB as RGB
    e_grey8 = _pil_kb(np.kron(u8(grey8[..., 0]), np.ones((4, 4), np.uint8)))
    e_rgb8 = _pil_kb(u8(rgb8).repeat(4, axis=0).repeat(4, axis=1))
    e_grey40 = _pil_kb(u8(grey40[..., 0]))  # a side >= 32: encoded as it is
    got = jpeg_incompressibility(None, [grey8, rgb8, grey40])
    assert got == [e_grey8, e_rgb8, e_grey40]
    assert jpeg_compressibility(None, [grey8, rgb8, grey40]) == [-e_grey8, -e_rgb8, -e_grey40]
    assert all(isinstance(v, float) for v in got)


def test_jpeg_reward_orders_detail():
    """Noise is less compressible than a flat image: incompressibility ranks it higher, compressibility lower."""
    flat = np.full((8, 8, 1), 0.5, np.float32)
    noise = np.random.default_rng(1).random((8, 8, 1)).astype(np.float32)
    inc = jpeg_incompressibility(None, [flat, noise])
    comp = jpeg_compressibility(None, [flat, noise])
    assert inc[1] > inc[0] + 0.1 and comp[1] < comp[0] - 0.1


# ---------------------------------------------------------------------------------------------------- wrong inputs

@pytest.mark.parametrize("fn", [digit_confidence, digit_correct, digit_confidence_q, jpeg_incompressibility,
                                jpeg_compressibility])
def test_text_completions_are_refused_naming_the_reward(fn):
    kwargs = {} if fn.__name__.startswith("jpeg") else {"label": [3]}
    with pytest.raises(ValueError, match=rf"reward '{fn.__name__}' scores images.*\[H, W, C\]|"
                                         rf"reward '{fn.__name__}' scores images.*\[8, 8, 1\]") as e:
        fn(["3"], ["the digit three"], **kwargs)
    assert "text" in str(e.value) and "images capability" in str(e.value)


def test_other_non_images_are_refused():
    with pytest.raises(ValueError, match="digit_confidence.*8x8 grey digits.*shape \\(16, 16, 1\\)"):
        digit_confidence(None, [np.zeros((16, 16, 1), np.float32)], label=[3])
    with pytest.raises(ValueError, match="jpeg_incompressibility.*float32 NumPy array \\[H, W, C\\]"):
        jpeg_incompressibility(None, [np.zeros((8, 8), np.float32)])  # no channel axis
    with pytest.raises(ValueError, match="jpeg_compressibility.*uint8"):
        jpeg_compressibility(None, [np.zeros((8, 8, 1), np.uint8)])  # 0-255 integers would be misread
    with pytest.raises(ValueError, match="digit_correct.*column 'label'.*got 12"):
        digit_correct(None, [np.zeros((8, 8, 1), np.float32)], label=[12])
    with pytest.raises(ValueError, match="digit_correct': 2 completions but 1 labels"):
        digit_correct(None, [np.zeros((8, 8, 1), np.float32)] * 2, label=[1])


def test_the_scorer_scores_image_completions(real_digits):
    """Through the reward scorer (deep copies, timeout thread): the task's rewards give one finite row each."""
    images, labels = real_digits
    task = get_task("digits")
    scorer = RewardScorer([RewardFn(n, f, w) for n, f, w in task.rewards], log=lambda *a: None, timeout=30)
    matrix, errors = scorer.score([str(k) for k in labels], images, [[0]] * 4, {"label": labels})
    assert errors == 0 and matrix.shape == (4, 2)
    assert matrix[:, 1].tolist() == [1.0, 1.0, 1.0, 1.0] and (matrix[:, 0] > 0.95).all()


# ---------------------------------------------------------------------------------------------------- tasks

def test_digits_task_rows():
    t = get_task("digits")
    assert len(t.train_rows) == 200 and len(t.eval_rows) == 50
    assert all(set(r) == {"prompt", "label"} and r["prompt"] == str(r["label"]) for r in t.train_rows)
    assert [sum(r["label"] == c for r in t.train_rows) for c in range(10)] == [20] * 10
    assert [r["label"] for r in t.train_rows] != sorted(r["label"] for r in t.train_rows)  # shuffled
    assert get_task("digits").train_rows == t.train_rows  # fixed by the seed
    assert get_task("digits", seed=1).train_rows != t.train_rows
    # held out: 10 classes x 5 fixed noises, noise-major (an eval_problems cap keeps the classes balanced)
    assert all(set(r) == {"prompt", "label", "noise_seed"} and r["prompt"] == str(r["label"]) for r in t.eval_rows)
    assert [r["label"] for r in t.eval_rows[:10]] == list(range(10))
    pairs = [(r["label"], r["noise_seed"]) for r in t.eval_rows]
    assert len(set(pairs)) == 50
    assert all(sorted(r["noise_seed"] for r in t.eval_rows if r["label"] == c) == [0, 1, 2, 3, 4] for c in range(10))
    assert get_task("digits", seed=1).eval_rows == t.eval_rows  # the same noises whatever the seed


def test_digits_tasks_rewards_and_needs():
    expected = {"digits": [("digit_confidence", 1.0), ("digit_correct", 0.0)],
                "digits_jpeg": [("jpeg_incompressibility", 1.0), ("digit_correct", 0.0)],
                "digits_compress": [("jpeg_compressibility", 1.0), ("digit_correct", 0.0)]}
    for name, rewards in expected.items():
        t = get_task(name)
        assert t.name == name and [(n, w) for n, _, w in t.rewards] == rewards
        assert all(f.__name__ == n for n, f, _ in t.rewards)
        assert t.accuracy_reward == "digit_correct"
        assert TASKS.needs(name) == ("images",)


def test_digits_classes_restrict_the_rows():
    t = get_task("digits", digits_classes=[0, 1, 2, 3, 4], digits_eval_classes=[5, 6, 7, 8, 9],
                 digits_eval_noises=3)
    assert len(t.train_rows) == 100 and {r["label"] for r in t.train_rows} == {0, 1, 2, 3, 4}
    assert len(t.eval_rows) == 15 and {r["label"] for r in t.eval_rows} == {5, 6, 7, 8, 9}
    t = get_task("digits_jpeg", digits_classes=[3, 8])
    assert {r["label"] for r in t.train_rows} == {3, 8} and len(t.train_rows) == 40
    assert {r["label"] for r in t.eval_rows} == {3, 8} and len(t.eval_rows) == 10
    for bad in ([10], [], ["x"], [True]):
        with pytest.raises(ValueError, match="digits_classes"):
            get_task("digits", digits_classes=bad)


@pytest.mark.parametrize("task", ["digits", "digits_jpeg", "digits_compress"])
def test_digits_tasks_are_refused_with_a_language_model_policy(task):
    with pytest.raises(ConfigError, match=rf"task '{task}' needs a policy with images"):
        Config.build({"task": task})


@pytest.mark.skipif("flow_matching" not in POLICIES, reason="the flow_matching policy is not registered")
def test_task_options_are_config_keys():
    cfg = Config.build({"task": "digits", "policy": "flow_matching", "digits_classes": [0, 1, 2, 3, 4],
                        "digits_eval_classes": [5, 6, 7, 8, 9]})
    t = get_task("digits", cfg=cfg)
    assert {r["label"] for r in t.train_rows} == {0, 1, 2, 3, 4}
    assert {r["label"] for r in t.eval_rows} == {5, 6, 7, 8, 9} and len(t.eval_rows) == 25
