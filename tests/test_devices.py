"""Device and precision settings: validation, resolution, the autocast path, batches moving between devices."""
import pytest
import torch

from grpolab.batch import RolloutBatch
from grpolab.config import Config, ConfigError
from grpolab import devices
from grpolab.devices import check_device_spec, resolve_device, resolve_dtype
from grpolab.model.logprobs import completion_logprobs
from grpolab.train.trainer import Trainer


def test_device_spec_validated_at_config_time(tiny_args):
    for ok in ("auto", "cpu", "cuda", "cuda:1", "mps"):
        check_device_spec(ok)
    with pytest.raises(ConfigError, match="device: 'gpu' is not valid; valid values: auto, cpu, cuda, cuda:N, mps"):
        Config.build({**tiny_args, "device": "gpu"})
    with pytest.raises(ConfigError, match="dtype: 'fp8' is not valid"):
        Config.build({**tiny_args, "dtype": "fp8"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_unavailable_cuda_is_a_clear_error(tiny_args):
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="'cuda' requested but CUDA is not available.*--device cpu"):
        Trainer(Config.build({**tiny_args, "device": "cuda"}), log=lambda *a: None)


def test_dtype_resolution():
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == devices.cpu_autocast_dtype()
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert resolve_dtype("float16", cpu) == torch.float16
    assert resolve_dtype("float32", cpu) == torch.float32


def test_cpu_dtype_is_chosen_by_measured_matmul_rate(monkeypatch):
    """auto on a CPU: bfloat16 only where its matrix products measure >= 1.5x float32's rate."""
    for bf16_rate, expected in ((2e11, torch.bfloat16), (1.4e11, torch.float32), (1e9, torch.float32)):
        rates = {torch.float32: 1e11, torch.bfloat16: bf16_rate}
        monkeypatch.setattr(devices, "matmul_rate", lambda m, k, n, dtype, **kw: rates[dtype])
        assert devices.measured_cpu_dtype() == expected


def test_matmul_rate_is_a_positive_rate():
    assert 1e6 < devices.matmul_rate(32, 32, 32, seconds=0.01, warmups=1) < 1e14


def _batch():
    return RolloutBatch(prompt_ids=torch.tensor([[5, 6], [5, 6]]), prompt_mask=torch.ones(2, 2, dtype=torch.long),
                        completion_ids=torch.tensor([[7, 8], [9, 0]]),
                        completion_mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
                        behavior_logprobs=torch.zeros(2, 2), group_ids=torch.tensor([0, 0]),
                        prompt_uids=torch.tensor([0, 0]), truncated=torch.tensor([False, False]),
                        advantages=torch.ones(2, 2), columns={"answer": ["a", "b"]})


def test_batch_to_device_moves_every_tensor():
    b = _batch()
    assert b.to("cpu") is b  # already there: no copy
    moved = b.to("meta")
    tensors = [v for v in vars(moved).values() if isinstance(v, torch.Tensor)]
    assert len(tensors) == 12 and all(t.device.type == "meta" for t in tensors)
    assert moved.columns == b.columns and b.completion_ids.device.type == "cpu"


def test_bfloat16_autocast_trains_with_float32_master_weights(tiny_args):
    """dtype: bfloat16 runs sampling and training forwards in bf16 (log-probs differ from float32 by bf16
    rounding), while the weights and optimiser state stay float32 and the step is finite."""
    t = Trainer(Config.build({**tiny_args, "dtype": "bfloat16", "steps": 1}), log=lambda *a: None)
    assert t.dtype == torch.bfloat16
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    with t.precision():
        batch, _, _ = t.collect()
    assert torch.isfinite(batch.behavior_logprobs).all()
    with torch.no_grad():
        fp32, _ = completion_logprobs(t.model, batch, t.cfg.temperature)
    gap = ((batch.behavior_logprobs - fp32).abs() * batch.completion_mask).max()
    assert 1e-4 < gap < 0.5  # the rollout really ran in bf16, and it is the same distribution
    m = t.train_step()
    assert m["skipped"] == 0 and torch.isfinite(torch.tensor(m["loss"]))
    for n, p in t.model.named_parameters():
        assert p.dtype == torch.float32
        assert not torch.equal(before[n], p.detach())
    assert all(s["exp_avg"].dtype == torch.float32 for s in t.optimizer.state.values())
