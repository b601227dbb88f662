"""Device and precision settings: validation, resolution, the autocast path, batches moving between devices."""
import json
import os
from pathlib import Path

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


def _proc_cpuinfo_bf16() -> bool:
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="reads the CPU flags from /proc/cpuinfo")
def test_cpu_dtype_is_decided_by_cpu_features_not_by_timing(monkeypatch):
    """auto on a CPU: bfloat16 exactly where the CPU has native bf16 matrix instructions (AVX512-BF16 / AMX-BF16),
    whatever a timing says (it used to be a 20 ms matmul timing: under load, two runs of one command differed)."""
    monkeypatch.delenv("GRPOLAB_CPU_KIND", raising=False)
    expected = torch.bfloat16 if _proc_cpuinfo_bf16() else torch.float32
    for f32_rate, bf16_rate in ((1e11, 1e9), (1e9, 1e12), (1e11, 1.6e11), (1e11, 1.4e11)):
        rates = {torch.float32: f32_rate, torch.bfloat16: bf16_rate}
        monkeypatch.setattr(devices, "matmul_rate", lambda m, k, n, dtype=torch.float32, **kw: rates[dtype])
        getattr(devices.cpu_autocast_dtype, "cache_clear", lambda: None)()  # the old per-process measurement
        assert resolve_dtype("auto", torch.device("cpu")) == expected, (f32_rate, bf16_rate)
    for feats, dtype in ((["avx512_bf16"], torch.bfloat16), (["amx_bf16"], torch.bfloat16), ([], torch.float32)):
        monkeypatch.setattr(devices, "cpu_bf16_features", lambda feats=feats: feats)
        assert devices.cpu_autocast_dtype() == dtype
        assert ("cpu has " + feats[0] if feats else "cpu has no avx512_bf16") in devices.cpu_dtype_choice()[1]


def test_cpu_bf16_features_match_proc_cpuinfo():
    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("reads the CPU flags from /proc/cpuinfo")
    assert bool(devices.cpu_bf16_features()) == _proc_cpuinfo_bf16()


def test_cpu_kind_override(monkeypatch):
    """GRPOLAB_CPU_KIND forces either CPU kind (``make test-avx2`` runs the suite as an AVX2-only machine)."""
    monkeypatch.setattr(devices, "cpu_bf16_features", lambda: ["avx512_bf16"])
    monkeypatch.setenv("GRPOLAB_CPU_KIND", "avx2")
    assert devices.cpu_dtype_choice() == (torch.float32, "GRPOLAB_CPU_KIND=avx2 (bf16 matrix products would be "
                                                         "emulated)")
    monkeypatch.setattr(devices, "cpu_bf16_features", lambda: [])
    monkeypatch.setenv("GRPOLAB_CPU_KIND", "avx512_bf16")
    assert devices.cpu_autocast_dtype() == torch.bfloat16
    assert devices.dtype_reason("auto", torch.device("cpu"), torch.bfloat16) == \
        "dtype auto: GRPOLAB_CPU_KIND=avx512_bf16 (native bf16 matrix instructions)"
    assert devices.dtype_reason("float32", torch.device("cpu"), torch.float32) == "dtype: float32 set"
    monkeypatch.setenv("GRPOLAB_CPU_KIND", "avx1024")
    with pytest.raises(ConfigError, match="GRPOLAB_CPU_KIND='avx1024' is not valid; valid values: avx2, "):
        devices.cpu_kind()


def test_summary_records_dtype_and_why(tiny_args, monkeypatch):
    """The chosen precision and the reason are printed at startup and recorded in summary.json."""
    monkeypatch.setenv("GRPOLAB_CPU_KIND", "avx512_bf16")
    logs = []
    t = Trainer(Config.build({**tiny_args, "steps": 1, "save_steps": 1}), log=logs.append)
    assert t.dtype == torch.bfloat16
    reason = "dtype auto: GRPOLAB_CPU_KIND=avx512_bf16 (native bf16 matrix instructions)"
    assert f"[grpolab] device cpu, forward precision bfloat16 ({reason})" in logs
    t.train(progress=False)
    summary = json.loads((Path(tiny_args["out"]) / "summary.json").read_text())
    assert summary["dtype"] == "bfloat16" and summary["dtype_reason"] == reason
    assert summary["compile_decode"] == "compile_decode off: eager decode step"  # the default, and why
    assert summary["cpu_heap_reuse"] == devices.reuse_freed_memory("auto", torch.device("cpu"))  # and why
    monkeypatch.setenv("GRPOLAB_CPU_KIND", "avx2")  # a resumed run keeps the precision it started with
    t2 = Trainer(Config.build({**tiny_args, "steps": 2, "save_steps": 1}), resume=True, log=logs.append)
    assert t2.dtype == torch.bfloat16 and t2.dtype_reason == f"kept from the checkpoint: {reason}"


def test_matmul_rate_is_a_positive_rate():
    # a timing (the bench's): only its sign and scale are checked; under load the 10 ms window can see one product
    # take a descheduled 0.1 s (it failed the former 1e6 FLOP/s bound with other jobs on 2 cores), so no lower bound
    assert 0 < devices.matmul_rate(32, 32, 32, seconds=0.01, warmups=1) < 1e14


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


def test_cpu_heap_reuse_sets_glibc_mallopt_once_per_mode():
    """cpu_heap_reuse: auto/on on the CPU call mallopt(M_MMAP_MAX, 0) then mallopt(M_TRIM_THRESHOLD, 1 GiB) (glibc's
    parameter numbers -4 and -1); auto beside a GPU, off, no glibc and a refused mallopt leave the allocator alone
    and say so; a bad mode names the valid ones."""
    from grpolab.devices import reuse_freed_memory
    from grpolab.errors import ConfigError

    class Libc:
        def __init__(self, ok=1):
            self.calls, self.ok = [], ok

        def mallopt(self, param, value):
            self.calls.append((param, value))
            return self.ok

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    for mode, dev in (("auto", cpu), ("on", cpu), ("on", gpu)):
        libc = Libc()
        assert "freed memory reused" in reuse_freed_memory(mode, dev, libc=libc)
        assert libc.calls == [(-4, 0), (-1, 1 << 30)]
    for mode, dev, says in (("auto", gpu, "off on cuda"), ("off", cpu, "glibc's default")):
        libc = Libc()
        assert says in reuse_freed_memory(mode, dev, libc=libc) and libc.calls == []
    assert "refused" in reuse_freed_memory("auto", cpu, libc=Libc(ok=0))
    with pytest.raises(ConfigError, match="valid values: auto, on, off"):
        reuse_freed_memory("yes", cpu, libc=Libc())


def test_reused_heap_computes_the_same():
    """With freed memory kept in the heap (this process, glibc) tensors computed into reused memory are the
    same as before (torch never relies on fresh pages being zero)."""
    from grpolab.devices import reuse_freed_memory
    x = torch.randn(600, 20000, generator=torch.Generator().manual_seed(0))  # 48 MB: over glibc's mmap threshold
    before = torch.log_softmax(x, -1)
    reason = reuse_freed_memory("auto", torch.device("cpu"))
    for _ in range(3):
        assert torch.equal(torch.log_softmax(x, -1), before), reason


@pytest.mark.parametrize("num_iterations,checkpointing", [(1, False), (2, False), (1, True)])
def test_weights_cast_once_per_pass_gives_the_same_gradients(tiny_args, num_iterations, checkpointing):
    """bfloat16: the update's pass-wide autocast region (each weight cast once per optimiser pass, backward with
    autocast off) gives bit for bit the gradients of a cast per micro-batch (the region replaced by a no-op),
    over 4 micro-batches and across optimiser passes (the cache must not outlive a pass: the weights change), and
    with gradient checkpointing (the backward's recomputation runs inside the region)."""
    import contextlib
    grads = {}
    for shared in (True, False):
        t = Trainer(Config.build({**tiny_args, "out": f"{tiny_args['out']}-{shared}", "dtype": "bfloat16",
                                  "micro_batch_size": 4, "num_iterations": num_iterations,
                                  "gradient_checkpointing": checkpointing}), log=lambda *a: None)
        if not shared:
            t.pass_precision = contextlib.nullcontext
        seen = grads[shared] = []
        t.optimizer.register_step_pre_hook(
            lambda *_: seen.append([p.grad.clone() for p in t.model.parameters() if p.grad is not None]))
        t.train_step()
        t.train_step()
    assert len(grads[True]) == 2 * num_iterations and len(grads[True][0]) > 5
    for a, b in zip(grads[True], grads[False]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
