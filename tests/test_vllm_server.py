"""vLLM as a separate server process: ``grpolab vllm-serve`` and ``generation_engine: vllm_server``.

Here the server runs in a subprocess with the stand-in vLLM of tests/_fake_vllm.py behind the real HTTP
endpoints, so the protocol (OpenAI completions, weight pushes, version stamps) is tested in ``make test``;
``make test-vllm`` runs :func:`test_real_vllm_server` against vLLM itself.
"""
import contextlib
import copy
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from grpolab.config import Config
from grpolab.generation.counting import GENERATED
from grpolab.generation.vllm_server import VLLMServerEngine, assign_servers
from grpolab.model.loading import load_policy
from grpolab.train.trainer import Trainer

from _fake_vllm import SHIFT, fake_vllm_module, real_vllm, save_tiny_model  # noqa: E402  (tests/_fake_vllm.py)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def model_dir(tiny_args, tmp_path, monkeypatch):
    """A tiny model saved as a folder (vLLM loads folders)."""
    return save_tiny_model(tiny_args, tmp_path / "model", monkeypatch)


@contextlib.contextmanager
def server(model_dir, *, real=False):
    """``grpolab vllm-serve`` on a free port (the stand-in vLLM unless ``real``); yields its URL."""
    cmd = [sys.executable, "-m", "grpolab", "vllm-serve"] if real else [sys.executable, str(ROOT / "tests" /
                                                                                        "_fake_vllm.py")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"),
                                                       os.environ.get("PYTHONPATH", "")]), HF_HUB_OFFLINE="1")
    extra = ["--enforce-eager", "--dtype", "float32"] if real else []
    proc = subprocess.Popen(cmd + ["--model", model_dir, "--port", "0"] + extra, stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        for line in proc.stdout:  # the server prints its address once it listens
            if "vllm-serve:" in line:
                yield line.strip().rsplit(" ", 1)[-1]
                break
        else:
            raise RuntimeError(f"vllm-serve exited with {proc.wait()} before listening")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def get(url, path):
    with urllib.request.urlopen(url + path) as r:
        return json.loads(r.read())


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


def test_server_trains_like_the_colocated_engine(tiny_args, tmp_path, model_dir, monkeypatch):
    """Same seeds, same sampler behind HTTP: the server's completions equal the in-process engine's;
    after an update the server samples from the trainer's new weights (its log-probs are the trainer's
    minus SHIFT again), under version stamp 1."""
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm_module())
    local = Trainer(Config.build(tiny_args, {"model": model_dir, "generation_engine": "vllm",
                                             "out": str(tmp_path / "local")}), log=lambda *a: None)
    with server(model_dir) as url:
        assert get(url, "/health") == {"status": "ok", "model": model_dir, "weights_version": 0,
                                       "weight_pushes": 0, "prompts_served": 0}
        cfg = Config.build(tiny_args, {"model": model_dir, "generation_engine": "vllm_server",
                                       "vllm_server_url": url, "out": str(tmp_path / "remote")})
        tr = Trainer(cfg, log=lambda *a: None)
        assert isinstance(tr.engine, VLLMServerEngine) and not tr.engine.needs_sync
        for t in (local, tr):
            t.model.eval()
            t.ctx.new_step()
        a, b = local.rollout(), tr.rollout()
        assert torch.equal(a.completion_ids, b.completion_ids)
        assert torch.allclose(a.behavior_logprobs, b.behavior_logprobs, atol=1e-6)
        assert torch.allclose(a.token_weights, b.token_weights, atol=1e-5)
        m = tr.train_step()
        assert abs(m["engine_logprob_mismatch"] - SHIFT) < 1e-4
        before = copy.deepcopy(tr.model.state_dict())
        m = tr.train_step()  # pushes step 1's weights first, then samples from them
        assert tr.engine.syncs == 1 and get(url, "/health")["weights_version"] == 1
        assert get(url, "/health")["weight_pushes"] == 1
        assert any(not torch.equal(before[k], v) for k, v in tr.model.state_dict().items())
        assert abs(m["engine_logprob_mismatch"] - SHIFT) < 1e-4  # engine = trainer's weights, less SHIFT


def test_server_is_openai_compatible_and_guards_versions(tiny_args, tmp_path, model_dir):
    with server(model_dir) as url:
        assert get(url, "/v1/models")["data"][0]["id"] == model_dir
        out = post(url, "/v1/completions", {"model": model_dir, "prompt": "1 2 3", "n": 2, "max_tokens": 4,
                                            "temperature": 1.0, "logprobs": 0, "seed": 3})
        assert out["object"] == "text_completion" and len(out["choices"]) == 2
        for c in out["choices"]:
            assert c["finish_reason"] in ("stop", "length") and isinstance(c["text"], str)
            assert len(c["logprobs"]["token_logprobs"]) == len(c["token_ids"]) == len(c["logprobs"]["tokens"])
            assert all(lp <= 0 for lp in c["logprobs"]["token_logprobs"])
        bad = urllib.request.Request(url + "/update_weights", data=b"", method="POST")
        with pytest.raises(urllib.error.HTTPError, match="400"):
            urllib.request.urlopen(bad)
        # two trainers on one server: the first one's next rollout refuses weights it did not push
        cfg = Config.build(tiny_args, {"model": model_dir, "generation_engine": "vllm_server", "vllm_server_url": url,
                                       "out": str(tmp_path / "a")})
        first = Trainer(cfg, log=lambda *a: None)
        second = VLLMServerEngine(url, chunk_mb=0)  # chunk_mb 0: one tensor per request (chunked push)
        second.sync(first.model)
        assert second.version == 1 and get(url, "/health")["weights_version"] == 1
        with pytest.raises(RuntimeError, match="weights version 1, the trainer's is 0"):
            first.rollout()
        # a trainer that finds a server at version 1 pushes its own weights before its first rollout
        late = Trainer(Config.build(tiny_args, {"model": model_dir, "generation_engine": "vllm_server", "vllm_server_url": url,
                                                "out": str(tmp_path / "b")}), log=lambda *a: None)
        assert late.engine.needs_sync
        late.rollout()
        assert late.engine.version == 2 and get(url, "/health")["weights_version"] == 2


def test_no_server_is_an_error_naming_the_fix():
    with pytest.raises(RuntimeError, match="grpolab vllm-serve"):
        VLLMServerEngine("http://127.0.0.1:9", timeout=0.5)


def test_real_vllm_server(tiny_args, tmp_path, model_dir):
    """`make test-vllm`: the same run against vLLM itself served by `grpolab vllm-serve`."""
    real_vllm()
    with server(model_dir, real=True) as url:
        cfg = Config.build(tiny_args, {"model": model_dir, "generation_engine": "vllm_server",
                                       "vllm_server_url": url, "out": str(tmp_path / "run")})
        tr = Trainer(cfg, log=lambda *a: None)
        m1 = tr.train_step()
        m2 = tr.train_step()
        assert tr.engine.syncs == 1 and get(url, "/health")["weights_version"] == 1
        print(f"\n[test-vllm] vllm_server engine_logprob_mismatch by step: {m1['engine_logprob_mismatch']:.2e}, "
              f"{m2['engine_logprob_mismatch']:.2e}")
        assert max(m1["engine_logprob_mismatch"], m2["engine_logprob_mismatch"]) < 1e-3


@pytest.mark.parametrize("n_servers", [1, 2, 3, 5])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_each_server_gets_its_weights_from_one_rank(n_servers, world_size):
    """Every rank samples on at least one server, every server is sampled on, and pushed to by exactly one
    rank, which samples on it."""
    plans = [assign_servers(n_servers, r, world_size) for r in range(world_size)]
    assert all(sample_on for sample_on, _ in plans)
    assert sorted({s for sample_on, _ in plans for s in sample_on}) == list(range(n_servers))
    pushers = [r for s in range(n_servers) for r, (_, push_to) in enumerate(plans) if s in push_to]
    assert len(pushers) == n_servers
    assert all(set(push_to) <= set(sample_on) for sample_on, push_to in plans)
    if n_servers >= world_size:  # no server shared: each rank pushes to every server it samples on
        assert all(push_to == sample_on for sample_on, push_to in plans)


def test_two_servers_share_the_prompts_and_get_one_push_each(tiny_args, tmp_path, model_dir):
    """vllm_server_url with two servers: the prompts are split between them (the completions those of one
    server, same seeds), the completions are counted for the budgets, and each server gets exactly one weight
    push per update."""
    with server(model_dir) as a, server(model_dir) as b:
        def trainer(url, name):
            t = Trainer(Config.build(tiny_args, {"model": model_dir, "generation_engine": "vllm_server",
                                                 "vllm_server_url": url, "out": str(tmp_path / name)}),
                        log=lambda *x: None)
            t.model.eval()
            t.ctx.new_step()
            return t

        one, two = trainer(a, "one"), trainer(f"{a}, {b}/", "two")
        assert two.engine.servers == two.engine.pushes_to == [a, b]
        x = one.rollout()
        before = GENERATED.snapshot()
        y = two.rollout()
        assert torch.equal(x.completion_ids, y.completion_ids)
        assert torch.allclose(x.behavior_logprobs, y.behavior_logprobs, atol=1e-6)
        c0, t0 = before
        c1, t1 = GENERATED.snapshot()
        assert (c1 - c0, t1 - t0) == (y.num_rows, int(y.completion_attention_mask.sum()))
        assert [get(u, "/health")["prompts_served"] for u in (a, b)] == [4 + 2, 2]
        for _ in range(3):  # pushes before steps 2 and 3
            two.train_step()
        assert two.engine.syncs == 2
        for u in (a, b):
            h = get(u, "/health")
            assert (h["weight_pushes"], h["weights_version"]) == (2, 2)


def test_ranks_sharing_a_server_push_once(tiny_args, tmp_path, model_dir):
    """2 ranks, 1 server: rank 0 pushes, rank 1 waits for the server to hold the new version; one push per
    update, and both ranks then sample from it."""
    model, _ = load_policy(model_dir, log=lambda *a: None)
    with server(model_dir) as url:
        r0, r1 = (VLLMServerEngine(url, rank=r, world_size=2) for r in (0, 1))
        assert (r0.pushes_to, r1.pushes_to, r1.servers) == ([url], [], [url])
        waiting = threading.Thread(target=r1.sync, args=(model,))
        waiting.start()  # rank 1 first: it waits for rank 0's push
        r0.sync(model)
        waiting.join(timeout=60)
        assert not waiting.is_alive() and r0.version == r1.version == 1
        h = get(url, "/health")
        assert (h["weight_pushes"], h["weights_version"]) == (1, 1)
        for e in (r0, r1):
            assert len(e.generate([[5, 6, 7]], [2], temperature=1.0, top_k=0, top_p=1.0, max_tokens=3, seed=1)) == 2
