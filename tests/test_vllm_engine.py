"""The vLLM generation engine.

The adapter is tested against ``fake_vllm`` below, a stand-in with vLLM's
interface (``LLM.generate`` with per-request ``SamplingParams``, processed
log-probs, ``load_weights`` through the driver worker, ``reset_prefix_cache``)
that samples with grpolab's own sampler and reports log-probs shifted by a
known amount, as a different kernel would. Where ``import vllm`` works (a GPU
machine with ``pip install 'grpolab[vllm]'``), ``test_real_vllm_engine`` runs
the same job through vLLM itself:

    HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q tests/test_vllm_engine.py
"""
import copy
import sys
import types

import pytest
import torch

from grpolab.config import Config
from grpolab.generation.vllm_engine import importance_weights
from grpolab.train.trainer import Trainer

from _fake_vllm import SHIFT, fake_vllm_module, real_vllm, save_tiny_model  # noqa: E402  (tests/_fake_vllm.py)


@pytest.fixture
def model_dir(tiny_args, tmp_path, monkeypatch):
    """A tiny model saved as a folder (vLLM loads folders)."""
    return save_tiny_model(tiny_args, tmp_path / "model", monkeypatch)


def test_importance_weights_are_truncated_ratios():
    tr = torch.tensor([[-1.0, -2.0, -0.5]])
    en = torch.tensor([[-1.5, -1.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    w = importance_weights(tr, en, mask, cap=1.5)
    # exp(0.5) = 1.6487 -> capped at 1.5; exp(-1) = 0.3679; padding -> 1
    assert torch.allclose(w, torch.tensor([[1.5, 0.36788, 1.0]]), atol=1e-4)


def test_engine_rollout_sync_and_correction(tiny_args, tmp_path, model_dir, monkeypatch):
    fake = fake_vllm_module()
    monkeypatch.setitem(sys.modules, "vllm", fake)
    cfg = Config.build(tiny_args, {"model": model_dir, "generation_engine": "vllm", "vllm_is_cap": 2.0,
                                   "out": str(tmp_path / "run"), "steps": 2})
    tr = Trainer(cfg, log=lambda *a: None)
    llm = fake.LLM.instances[-1]
    assert llm.kwargs["enable_prefix_caching"] and llm.kwargs["logprobs_mode"] == "processed_logprobs"
    tr.model.eval()
    tr.ctx.new_step()
    batch = tr.rollout()
    mask = batch.completion_attention_mask.float()
    # behaviour log-probs are the trainer's own forward on the engine's tokens ...
    own = tr.ctx.logprobs(copy.deepcopy(batch))
    assert torch.allclose(batch.behavior_logprobs, own, atol=1e-5)
    # ... and the engine's SHIFT-lower log-probs become a per-token weight exp(SHIFT) on real tokens
    expect = torch.where(mask > 0, torch.full_like(mask, float(torch.exp(torch.tensor(SHIFT)))), torch.ones_like(mask))
    assert torch.allclose(batch.token_weights, expect, atol=1e-4)
    assert abs(sum(batch.columns["engine_logprob_mismatch"]) / batch.num_rows - SHIFT) < 1e-4
    # a full step: the update changes the policy, the next rollout first pushes the new weights into the engine
    m = tr.train_step()
    assert abs(m["engine_logprob_mismatch"] - SHIFT) < 1e-4
    before = copy.deepcopy(llm.model.state_dict())
    tr.ctx.new_step()
    tr.rollout()
    after = llm.model.state_dict()
    assert llm.resets == 1
    for name, p in tr.model.state_dict().items():
        assert torch.equal(after[name], p), name
    assert any(not torch.equal(before[k], after[k]) for k in after)


def test_sync_merges_lora_into_copies(tiny_args, tmp_path, model_dir, monkeypatch):
    """use_lora: the engine gets W + B A (scaled) under the base model's names; the trainer keeps its adapters."""
    fake = fake_vllm_module()
    monkeypatch.setitem(sys.modules, "vllm", fake)
    cfg = Config.build(tiny_args, {"model": model_dir, "generation_engine": "vllm", "use_lora": True, "lora_r": 2,
                                   "out": str(tmp_path / "run"), "steps": 2})
    tr = Trainer(cfg, log=lambda *a: None)
    llm = fake.LLM.instances[-1]
    with torch.no_grad():  # a trained adapter: B != 0 (PEFT initialises B to zero)
        for n, p in tr.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    tr.engine.sync(tr.behavior_policy())  # what a rollout after an update does first
    assert tr.engine.syncs == 1
    base = tr.model.get_base_model()
    engine_sd = llm.model.state_dict()
    for name, mod in base.named_modules():
        if hasattr(mod, "lora_A") and "default" in mod.lora_A:
            A, B = mod.lora_A["default"].weight, mod.lora_B["default"].weight
            expect = mod.base_layer.weight + (B @ A) * mod.scaling["default"]  # LoRA: W + (alpha / r) B A
            assert torch.allclose(engine_sd[f"{name}.weight"], expect, atol=1e-6), name
            assert not torch.allclose(expect, mod.base_layer.weight)  # a real delta was merged
    # the trained model keeps its adapters (merge_and_unload would have removed them)
    assert hasattr(tr.model, "get_base_model")
    assert [n for n, p in tr.model.named_parameters() if p.requires_grad] and all(
        "lora_" in n for n, p in tr.model.named_parameters() if p.requires_grad)
    assert torch.isfinite(torch.tensor(tr.train_step()["loss"]))


def test_engine_needs_vllm_installed(tiny_args, tmp_path, model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    cfg = Config.build(tiny_args, {"model": model_dir, "generation_engine": "vllm", "out": str(tmp_path / "r")})
    with pytest.raises(RuntimeError, match=r"pip install 'grpolab\[vllm\]'"):
        Trainer(cfg, log=lambda *a: None)


def test_engine_rejects_in_memory_tiny_model(tiny_args, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm_module())
    with pytest.raises(RuntimeError, match="model folder"):
        Trainer(Config.build(tiny_args, {"generation_engine": "vllm"}), log=lambda *a: None)


def test_real_vllm_engine(tiny_args, tmp_path, model_dir):
    """`make test-vllm`: vLLM itself samples; behaviour log-probs are the trainer's forward; the engine's own
    log-probs agree with it (mean |diff| printed), also after the first weight sync."""
    real_vllm()
    cfg = Config.build(tiny_args, {"model": model_dir, "generation_engine": "vllm", "vllm_enforce_eager": True,
                                   "vllm_dtype": "float32", "out": str(tmp_path / "run"), "steps": 3})
    tr = Trainer(cfg, log=lambda *a: None)
    tr.model.eval()
    tr.ctx.new_step()
    batch = tr.rollout()
    assert torch.allclose(batch.behavior_logprobs, tr.ctx.logprobs(copy.deepcopy(batch)), atol=1e-5)
    mism = [tr.train_step()["engine_logprob_mismatch"] for _ in range(3)]
    assert tr.engine.syncs == 2
    # the engine holds the trainer's weights after a sync (vLLM fuses q/k/v and pads the vocabulary: compare
    # the embedding's real rows and a norm)
    tr.engine.sync(tr.behavior_policy())
    got = tr.engine.llm.apply_model(lambda m: (m.model.embed_tokens.weight.detach().clone(),
                                               m.model.norm.weight.detach().clone()))[0]
    sd = tr.model.state_dict()
    emb = sd["model.embed_tokens.weight"]
    assert torch.equal(got[0][:emb.shape[0]].float(), emb)
    assert torch.equal(got[1].float(), sd["model.norm.weight"])
    print(f"\n[test-vllm] engine_logprob_mismatch (mean |logp_trainer - logp_vllm| per token) by step: "
          f"{', '.join(f'{m:.2e}' for m in mism)}")
    assert max(mism) < 1e-3, mism


@pytest.mark.parametrize("server", [False, True])
def test_vllm_train_check_runs_trainer_and_engine_in_one_dtype(tmp_path, monkeypatch, server):
    """scripts/vllm_train_check.py (`make test-vllm`) compares the trainer's log-probs with vLLM's: both must
    run in one precision. It set the engine to float32 and left the trainer on `dtype: auto`, which is bfloat16
    on a CPU with AVX512-BF16 (mismatch 1.58e-3 over its 1e-3 limit). The script's `grpolab train` argv and its
    `grpolab vllm-serve` command are captured here (no vLLM needed)."""
    import importlib.util
    from pathlib import Path

    import grpolab.cli
    from grpolab.model import loading
    path = Path(__file__).resolve().parents[1] / "scripts" / "vllm_train_check.py"
    spec = importlib.util.spec_from_file_location("vllm_train_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import grpolab.train.trainer
    monkeypatch.setattr(loading, "build_tiny", loading.build_tiny)  # the script narrows it: restored afterwards
    monkeypatch.setattr(loading, "save_policy", lambda *a, **kw: None)  # its tiny model is not needed here
    monkeypatch.setattr(grpolab.train.trainer, "Trainer", lambda cfg, log: types.SimpleNamespace(model=0, tok=0))
    monkeypatch.setattr(mod, "tempfile", types.SimpleNamespace(mkdtemp=lambda **kw: str(tmp_path)))
    servers, trains = [], []

    class Server:
        stdout = iter(["[grpolab] vllm-serve: listening on http://127.0.0.1:1\n"])
        terminate = wait = staticmethod(lambda *a, **kw: None)

    monkeypatch.setattr(mod, "subprocess", types.SimpleNamespace(
        PIPE=-1, Popen=lambda cmd, **kw: servers.append(cmd) or Server()))
    monkeypatch.setattr(grpolab.cli, "main", lambda argv: trains.append(argv) or 3)
    monkeypatch.setattr(sys, "argv", ["vllm_train_check.py"] + (["--server"] if server else []))
    assert mod.main() == 3
    argv = trains[0]
    opt = {argv[i]: argv[i + 1] for i in range(1, len(argv) - 1) if argv[i].startswith("--")}
    assert opt.get("--dtype") == opt["--vllm_dtype"] == "float32", opt
    assert Config.build({"model": "tiny", "dtype": opt["--dtype"]}).dtype == "float32"
    if server:
        cmd = servers[0]
        assert cmd[cmd.index("--dtype") + 1] == opt["--dtype"]
        assert opt["--generation_engine"] == "vllm_server"
