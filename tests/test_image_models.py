"""The built-in tiny image models (design §5.4): digits data, the flow and DDPM UNets, the digit classifier, their
cache (hash, lock, meta.json) and PNG rendering.

The real models are built once per test session, in the real cache (``$GRPOLAB_CACHE``, default
``~/.cache/grpolab``), by the session fixtures below; every later run (and every other test file) loads them.
Cache mechanics are tested with a fake ``build_fn`` in a temporary cache."""
import base64
import io
import json
import threading
import time

import pytest
import torch

from grpolab.policies._image import digits as D
from grpolab.model.cache import META, cached_build, cached_path, read_meta, recipe_hash
from grpolab.policies._image.classifier import DigitClassifier, digit_classifier_path, load_digit_classifier
from grpolab.media import from_signed, grid_png, png_data_uri, thumbnail_data_uri, to_uint8

PIL = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="session")
def classifier():
    return load_digit_classifier(log=print)


@pytest.fixture(scope="session")
def flow_model():
    return D.load_digits_model("flow", log=print)


@pytest.fixture(scope="session")
def ddpm_model():
    return D.load_digits_model("ddpm", log=print)


# ---------------------------------------------------------------------------------------------------- data

def test_digits_data_and_split():
    images, labels = D.load_digits_tensor()
    assert images.shape == (1797, 1, 8, 8) and images.dtype == torch.float32
    assert labels.shape == (1797,) and labels.dtype == torch.long
    assert images.min().item() == -1.0 and images.max().item() == 1.0
    xtr, ytr = D.split_digits(images, labels, "train")
    xte, yte = D.split_digits(images, labels, "held_out")
    assert len(xtr) == 899 and len(xte) == 898
    assert torch.equal(xtr[1], images[2]) and torch.equal(yte[0], labels[1])
    assert D.data_sha256(images, labels) == D.data_sha256(*D.load_digits_tensor())


def test_flow_timestep_convention():
    """The UNet is trained and sampled with timestep = 1000·σ, which is what diffusers' flow-matching
    scheduler hands the model."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    s = FlowMatchEulerDiscreteScheduler(num_train_timesteps=D.NUM_TRAIN_TIMESTEPS)
    s.set_timesteps(8)
    torch.testing.assert_close(s.timesteps, s.sigmas[:-1] * D.NUM_TRAIN_TIMESTEPS)


# ---------------------------------------------------------------------------------------------------- cache

def test_cache_hash_follows_the_recipe(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path))
    r = D.pretrain_recipe("flow")
    assert cached_path("digits-flow", r) == cached_path("digits-flow", dict(reversed(list(r.items()))))
    assert cached_path("digits-flow", r).parent == tmp_path
    assert cached_path("digits-flow", r).name == f"digits-flow-{recipe_hash(r)[:12]}"
    for change in ({"iterations": r["iterations"] + 1}, {"learning_rate": 1e-3}, {"seed": 1},
                   {"unet": D.tiny_unet_config((32, 64))}):
        assert cached_path("digits-flow", {**r, **change}) != cached_path("digits-flow", r), change
    assert recipe_hash(D.pretrain_recipe("flow")) != recipe_hash(D.pretrain_recipe("ddpm"))


def test_concurrent_builders_build_once(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path))
    calls, logs, results = [], [], []

    def build(tmp):
        calls.append(tmp)
        time.sleep(0.3)  # the other builder arrives while this one holds the lock
        (tmp / "weights.txt").write_text("w")
        return {"answer": 42}

    def worker():
        results.append(cached_build("fake", {"a": 1}, build, log=logs.append, message="building fake"))

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and logs.count("building fake") == 1
    assert len(set(results)) == 1
    target = results[0]
    assert (target / "weights.txt").read_text() == "w"
    assert not target.with_name(target.name + ".tmp").exists()
    meta = read_meta(target)
    assert meta["answer"] == 42 and meta["recipe"] == {"a": 1} and meta["recipe_sha256"] == recipe_hash({"a": 1})
    for key in ("torch", "diffusers", "cpu_kind", "seconds"):
        assert key in meta
    assert cached_build("fake", {"a": 1}, build, log=logs.append) == target and len(calls) == 1


def test_cache_replaces_an_interrupted_build(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path))
    target = cached_path("fake", {"b": 2})
    stale = target.with_name(target.name + ".tmp")
    stale.mkdir(parents=True)
    (stale / "junk").write_text("x")
    target.mkdir()  # a folder without meta.json is incomplete

    def build(tmp):
        assert not (tmp / "junk").exists()
        (tmp / "ok").write_text("y")

    assert cached_build("fake", {"b": 2}, build, log=lambda m: None) == target
    assert (target / "ok").exists() and (target / META).exists() and not stale.exists()


def test_build_message_and_determinism(tmp_path, monkeypatch):
    """A fresh build logs the design's one line; a cached one is silent; two builds give the same weights."""
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path))
    monkeypatch.setitem(D.ITERATIONS, "flow", 2)
    threads = torch.get_num_threads()
    logs = []
    path = D.digits_model_path("flow", log=logs.append)
    assert torch.get_num_threads() == threads
    assert logs[0] == ("[grpolab] pre-training the tiny digits flow model (UNet2DModel, 0.16M parameters, "
                       f"1,797 scikit-learn digits, 2 steps; one time, about 5 s) and caching it in {path}")
    logs.clear()
    assert D.digits_model_path("flow", log=logs.append) == path and logs == []
    a, _ = D.pretrain_flow(D.pretrain_recipe("flow"))
    b = D.load_digits_model("flow", log=logs.append)
    for (k, va), (_, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(va, vb), k


# ---------------------------------------------------------------------------------------------------- real models

@pytest.mark.parametrize("kind", D.KINDS)
def test_model_folder_and_meta(kind):
    path = D.digits_model_path(kind)
    assert path.name == f"digits-{kind}-{recipe_hash(D.pretrain_recipe(kind))[:12]}"
    for f in ("config.json", "diffusion_pytorch_model.safetensors", "scheduler_config.json", META):
        assert (path / f).exists(), f
    meta = read_meta(path)
    assert meta["recipe"] == D.pretrain_recipe(kind) and meta["seed"] == 0
    assert meta["data_sha256"] == D.data_sha256(*D.load_digits_tensor())
    assert meta["parameters"] == D.n_parameters(D.build_tiny_unet(kind))
    assert meta["cpu_kind"] in ("avx2", "avx512_bf16", "amx_bf16")
    assert meta["torch"] == torch.__version__ and meta["diffusers"] and meta["seconds"] > 0
    assert len(meta["loss_curve"]) == 10
    sched = json.loads((path / "scheduler_config.json").read_text())
    assert sched["_class_name"] == ("FlowMatchEulerDiscreteScheduler" if kind == "flow" else "DDPMScheduler")
    assert sched["num_train_timesteps"] == 1000


def test_loaded_models_are_float32_eval(flow_model, ddpm_model):
    from diffusers import UNet2DModel

    for m in (flow_model, ddpm_model):
        assert isinstance(m, UNet2DModel) and not m.training
        assert all(p.dtype == torch.float32 for p in m.parameters())
        assert m.config.num_class_embeds == 11 and m.config.sample_size == 8


def _accuracy(classifier, images, labels):
    with torch.no_grad():
        return (classifier(images).argmax(-1) == labels).float().mean().item()


@pytest.mark.parametrize("kind", D.KINDS)
def test_base_models_draw_the_asked_digit(kind, classifier, flow_model, ddpm_model):
    """Well above chance (0.1) with the quick samplers; measured ≈ 0.78 (flow) and 0.62 (DDPM) on 500."""
    model = flow_model if kind == "flow" else ddpm_model
    labels = torch.arange(10).repeat(10)
    x = D.sample_digits(model, kind, labels, seed=1)
    assert x.shape == (100, 1, 8, 8) and x.min() >= -1 and x.max() <= 1
    assert _accuracy(classifier, x, labels) > 0.2
    assert torch.equal(x, D.sample_digits(model, kind, labels, seed=1))  # fixed noises: before/after comparable


def test_classifier(classifier):
    meta = read_meta(digit_classifier_path())
    assert meta["held_out_accuracy"] >= 0.9
    assert meta["data_sha256"] == D.data_sha256(*D.load_digits_tensor())
    assert isinstance(classifier, DigitClassifier) and not classifier.training
    images, labels = D.load_digits_tensor()
    xte, yte = D.split_digits(images, labels, "held_out")
    assert _accuracy(classifier, xte, yte) == pytest.approx(meta["held_out_accuracy"], abs=1e-3)
    assert classifier.features(xte[:3]).shape[:2] == (3, 32)
    assert classifier(xte[:3]).shape == (3, 10)


# ---------------------------------------------------------------------------------------------------- render

def test_render_grid_and_thumbnails():
    images = from_signed(torch.linspace(-1, 1, 6 * 64).view(6, 1, 8, 8))
    u8 = to_uint8(images)
    assert u8.shape == (6, 8, 8, 1) and u8.dtype.name == "uint8" and u8.min() == 0 and u8.max() == 255
    png = grid_png(images, rows=2, cols=4, scale=4)
    img = PIL.open(io.BytesIO(png))
    assert img.size == (4 * (8 * 4 + 1) + 1, 2 * (8 * 4 + 1) + 1) and img.mode == "L"
    rgb = PIL.open(io.BytesIO(grid_png(torch.rand(3, 3, 8, 8), rows=1, cols=3, scale=2, pad=0)))
    assert rgb.size == (48, 16) and rgb.mode == "RGB"
    uri = thumbnail_data_uri(images[0], size=32)
    assert uri.startswith("data:image/png;base64,") and png_data_uri(b"x") == "data:image/png;base64,eA=="
    thumb = PIL.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
    assert thumb.size == (32, 32)
    with pytest.raises(ValueError):
        grid_png(images, rows=1, cols=2)
    with pytest.raises(ValueError):
        to_uint8(torch.zeros(2, 2, 8, 8))
