"""torch.distributed (docs/distributed.md): 2 gloo ranks on the CPU give the single-process update.

One torchrun launch (2 ranks) trains, in float64 on the tiny model, the recipes grpo, dapo (token-mean
loss, dynamic sampling with refill rounds), reinforce_pp_baseline (batch whitening), prompt_gdro (a
stateful prompt sampler fed back every step) and grpo under FSDP2, 3 steps each; resumes a copy of the
grpo run from its step-2 checkpoint on 2 ranks; then starts a long run and has its rank 1 killed
(``kill -9``) after the first checkpoint. Meanwhile this process trains the same runs in one process (the
plain ``Trainer``, ``rollout_seeding: group``). The final weights agree to 1e-10; the step-2 checkpoint
also resumes in one process, and the killed run's last checkpoint resumes to the uninterrupted weights.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import grpolab
from grpolab.config import Config
from grpolab.distributed import collective
from grpolab.distributed.checkpoint import is_dcp, run_uses_dcp
from grpolab.distributed.launch import strip_option, torchrun_args
from grpolab.distributed.trainer import DistributedTrainer
from grpolab.recipes import recipe_overrides
from grpolab.rollouts.context import group_seed
from grpolab.train.checkpoint import checkpoint_dirs
from grpolab.train.metrics import read_metrics
from grpolab.train.trainer import Trainer

from _helpers import final_weights

SRC = str(Path(grpolab.__file__).parent.parent)
TOL = 1e-10
BASE = {"model": "tiny", "task": "repeat", "prompts_per_step": 4, "num_generations": 4, "max_completion_length": 6,
        "learning_rate": 3e-3, "eval_before": False, "eval_after": False, "tensorboard": False, "save_steps": 2,
        "micro_batch_size": 6, "dtype": "float32", "log_completions_steps": 0, "steps": 3}
# dapo: refill rounds (oversample 1: a round generates the groups still missing), filtering on the shaped
# reward (the tiny model is never exactly right on `repeat`, so accuracy alone would drop every group)
RUNS = {"grpo": {}, "dapo": {"dynamic_sampling_oversample": 1.0, "dynamic_sampling_metric": "reward",
                             "dynamic_sampling_max_rounds": 3},
        "reinforce_pp_baseline": {}, "prompt_gdro": {}}

WORKER = textwrap.dedent('''
    import json, shutil, sys
    import torch
    import grpolab.devices
    grpolab.devices.cpu_autocast_dtype = lambda: torch.float32
    from grpolab.config import Config
    from grpolab.distributed import collective
    from grpolab.distributed.trainer import DistributedTrainer
    from grpolab.train.checkpoint import checkpoint_dirs

    class F64(DistributedTrainer):
        def load_policy(self, cfg):
            model, tok = super().load_policy(cfg)
            return model.double(), tok

    collective.init_from_env("cpu")
    for run in json.load(open(sys.argv[1])):
        if run.get("copy_from"):
            if collective.rank() == 0:  # a copy without its newest checkpoint
                shutil.copytree(run["copy_from"], run["layers"]["out"])
                shutil.rmtree(checkpoint_dirs(run["layers"]["out"])[-1])
            collective.barrier()
        if run.get("kill_after"):
            print(f"PID {collective.rank()} {__import__('os').getpid()} .\\n", end="", flush=True)
        cfg = Config.build(run["layers"])
        F64(cfg, resume=bool(run.get("resume")), log=lambda *a: None).train(progress=False)
''')


class F64(Trainer):
    def load_policy(self, cfg):
        model, tok = super().load_policy(cfg)
        return model.double(), tok


class F64Dist(DistributedTrainer):
    def load_policy(self, cfg):
        model, tok = super().load_policy(cfg)
        return model.double(), tok


def layers(recipe: str, out, **kw) -> dict:
    return {**recipe_overrides(recipe), **BASE, **RUNS.get(recipe, {}), "out": str(out), **kw}


def env() -> dict:
    e = {k: v for k, v in os.environ.items() if k not in collective.ENV_KEYS}
    return {**e, "PYTHONPATH": SRC + os.pathsep + e.get("PYTHONPATH", ""), "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def torchrun(tmp: Path, plan: list[dict], log: Path | None = None) -> subprocess.Popen:
    """``torchrun --standalone --nproc_per_node 2 worker.py plan.json``; its output to a pipe or to ``log``."""
    (tmp / "worker.py").write_text(WORKER)
    (tmp / "plan.json").write_text(json.dumps(plan))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(tmp / "worker.py"), str(tmp / "plan.json")]
    return subprocess.Popen(cmd, env=env(), cwd=tmp, stdout=subprocess.PIPE if log is None else log.open("w"),
                            stderr=subprocess.STDOUT, text=True)


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    assert all(v.dtype == torch.float64 for v in a.values())
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def single(recipe: str, out) -> Path:
    F64(Config.build(layers(recipe, out, rollout_seeding="group")), log=lambda *a: None).train(
        progress=False)
    return Path(out)


def drop_last_checkpoint(src: Path, dst: Path) -> Path:
    """A copy of run folder ``src`` without its newest checkpoint (the run then resumes from the one before)."""
    shutil.copytree(src, dst)
    shutil.rmtree(checkpoint_dirs(dst)[-1])
    return dst


def kill_rank_1_after_checkpoint(proc: subprocess.Popen, log: Path, out: Path) -> None:
    """``kill -9`` the rank-1 process of the run in ``out`` as soon as it has a checkpoint."""
    pids: dict[int, int] = {}
    while proc.poll() is None:
        if len(pids) < 2:  # the ranks' lines may interleave: search the whole text
            pids = {int(r): int(p) for r, p in re.findall(r"PID (\d+) (\d+) \.", log.read_text())}
        if len(pids) == 2 and checkpoint_dirs(out):
            os.kill(pids[1], signal.SIGKILL)  # mid-step: a step takes far longer than this poll
            return
        time.sleep(0.05)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One torchrun launch (2 gloo ranks): the 2-rank runs, a resume on 2 ranks, then a long run whose rank 1
    is killed (``kill -9``) once it has saved a checkpoint. Meanwhile the single-process twins train here."""
    tmp = tmp_path_factory.mktemp("dist")
    plan = [{"layers": layers(r, tmp / f"ddp_{r}")} for r in RUNS]
    plan.append({"layers": layers("grpo", tmp / "fsdp2_grpo", distributed_strategy="fsdp2")})
    # 16 completions per step over both ranks: max_completions 24 ends the run after step 2 of 3 on both ranks
    plan.append({"layers": layers("grpo", tmp / "ddp_budget", max_completions=24)})
    # grpo saved checkpoints at steps 2 and 3; without the last one, a resume on 2 ranks redoes step 3
    plan.append({"layers": layers("grpo", tmp / "ddp_grpo_resumed2"), "resume": True,
                 "copy_from": str(tmp / "ddp_grpo")})
    plan.append({"layers": layers("grpo", tmp / "killed", steps=10 ** 6, save_steps=1, save_total_limit=100,
                                  stall_steps=0), "kill_after": 1})
    log = tmp / "torchrun.log"
    t0 = time.perf_counter()
    proc = torchrun(tmp, plan, log=log)
    killer = threading.Thread(target=kill_rank_1_after_checkpoint, args=(proc, log, tmp / "killed"), daemon=True)
    killer.start()
    ref = {r: single(r, tmp / f"single_{r}") for r in RUNS}  # meanwhile, in this process
    code = proc.wait(timeout=600)  # after the kill, torchrun stops rank 0 and reports the failure
    killer.join()
    text = log.read_text()
    assert code != 0 and checkpoint_dirs(tmp / "killed") and ("SIGKILL" in text or "-9" in text), text[-6000:]
    return tmp, ref, time.perf_counter() - t0


@pytest.mark.parametrize("recipe", list(RUNS))
def test_two_ranks_equal_one_process(two_ranks, recipe):
    """After 3 steps the 2-rank DDP weights equal the single-process weights to 1e-10 (float64); so do the
    logged metrics that do not measure time, the generated tokens and completions (both ranks' counted) among
    them."""
    tmp, ref, _ = two_ranks
    got = tmp / f"ddp_{recipe}"
    assert max_diff(final_weights(got), final_weights(ref[recipe])) < TOL
    assert run_uses_dcp(got) and not run_uses_dcp(ref[recipe])
    m2, m1 = read_metrics(got), read_metrics(ref[recipe])
    assert [r["step"] for r in m2] == [1, 2, 3]
    for a, b in zip(m2, m1):
        for k in ("reward_mean", "reward_std", "completion_len_mean", "advantage_abs_mean", "loss", "entropy",
                  "grad_norm", "frac_zero_std_groups", "dynamic_sampling/rounds",
                  "dynamic_sampling/dropped_groups", "generated_tokens", "generated_tokens_total",
                  "generated_completions_total"):
            if k in b:
                assert a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-12), (k, a[k], b[k])
    if recipe == "dapo":  # the keep / refill decision was exercised: groups dropped, a second round drawn
        assert sum(r["dynamic_sampling/dropped_groups"] for r in m1) > 0
        assert max(r["dynamic_sampling/rounds"] for r in m1) > 1


def test_budgets_count_every_rank(two_ranks):
    """Both ranks' completions count: max_completions 24 stops the 2-rank run after step 2 (32 completions), on
    both ranks at once (rank 0 alone counted 8 per step and ran all 3 steps)."""
    tmp, _, _ = two_ranks
    m = read_metrics(tmp / "ddp_budget")
    assert [r["step"] for r in m] == [1, 2]
    assert [r["generated_completions_total"] for r in m] == [16, 32]
    summary = json.loads((tmp / "ddp_budget" / "summary.json").read_text())
    assert summary["stopped_by"] == "max_completions reached: 32 sampled completions (limit 24)"
    assert summary["spent"]["completions"] == 32


def test_fsdp2_equals_one_process(two_ranks):
    """FSDP2 (fully_shard, gloo): the same 3 steps, the same weights."""
    tmp, ref, _ = two_ranks
    assert max_diff(final_weights(tmp / "fsdp2_grpo"), final_weights(ref["grpo"])) < TOL


def test_checkpoint_moves_between_world_sizes(two_ranks, tmp_path):
    """A checkpoint saved by 2 ranks (DCP, step 2 of 3) resumes on 2 ranks and in 1 process, and both end
    with the weights of the uninterrupted single-process run."""
    tmp, ref, _ = two_ranks
    assert max_diff(final_weights(tmp / "ddp_grpo_resumed2"), final_weights(ref["grpo"])) < TOL
    assert [r["step"] for r in read_metrics(tmp / "ddp_grpo_resumed2")] == [1, 2, 3]
    one = drop_last_checkpoint(tmp / "ddp_grpo", tmp_path / "resumed1")
    assert is_dcp(checkpoint_dirs(one)[-1])
    t = F64Dist(Config.build(layers("grpo", one, rollout_seeding="group")), resume=True, log=lambda *a: None)
    assert t.step == 2 and t.world_size == 1
    t.train(progress=False)
    assert max_diff(final_weights(one), final_weights(ref["grpo"])) < TOL
    assert [r["step"] for r in read_metrics(one)] == [1, 2, 3]


def test_single_process_checkpoint_resumes_distributed(two_ranks, tmp_path):
    """The single-process format (weights.safetensors + state.pt) stays loadable: the distributed trainer
    (DDP) resumes a one-process run's step-2 checkpoint to the same weights."""
    _, ref, _ = two_ranks
    one = drop_last_checkpoint(ref["grpo"], tmp_path / "legacy")
    assert not is_dcp(checkpoint_dirs(one)[-1]) and (checkpoint_dirs(one)[-1] / "weights.safetensors").is_file()
    t = F64Dist(Config.build(layers("grpo", one, rollout_seeding="group")), resume=True, log=lambda *a: None)
    assert t.step == 2
    t.train(progress=False)
    assert max_diff(final_weights(one), final_weights(ref["grpo"])) < TOL


def test_kill_9_leaves_last_checkpoint_resumable(two_ranks, tmp_path):
    """``kill -9`` of rank 1 mid-run: the newest checkpoint is complete (no torn folder counts), loads, and
    resuming it in one process ends where the uninterrupted run ends."""
    tmp, ref, _ = two_ranks
    out = tmp / "killed"
    last = checkpoint_dirs(out)[-1]
    step = int(last.name.split("_")[1])
    assert is_dcp(last) and (last / "dcp" / ".metadata").is_file() and (last / "state.pt").is_file()
    if step >= 3:  # the kill came late (a loaded machine): compare from the step-2 checkpoint
        for d in checkpoint_dirs(out):
            if int(d.name.split("_")[1]) > 2:
                shutil.rmtree(d)
    t = F64Dist(Config.build(layers("grpo", out, save_steps=1, rollout_seeding="group")), resume=True,
                log=lambda *a: None)
    assert 1 <= t.step <= 2
    t.train(progress=False)
    assert max_diff(final_weights(out), final_weights(ref["grpo"])) < TOL


def test_torn_checkpoint_is_skipped(two_ranks, tmp_path):
    """A rank killed mid-save leaves ``step_N.tmp`` (ignored); a DCP folder without its ``.metadata`` is
    skipped with a warning for the one before."""
    tmp, _, _ = two_ranks
    out = tmp_path / "torn"
    shutil.copytree(tmp / "ddp_grpo", out)
    (out / "checkpoints" / "step_000004.tmp" / "dcp").mkdir(parents=True)
    (checkpoint_dirs(out)[-1] / "dcp" / ".metadata").unlink()
    said = []
    t = F64Dist(Config.build(layers("grpo", out, rollout_seeding="group")), resume=True, log=said.append)
    assert t.step == 2 and any("corrupt" in s and "step_000003" in s for s in said)


def test_group_seeding_does_not_depend_on_the_batch(tiny_args, tmp_path):
    """``rollout_seeding: group``: a group's completions are the same drawn alone or with other groups."""
    cfg = Config.build({**tiny_args, "rollout_seeding": "group"})
    t = Trainer(cfg, log=lambda *a: None)
    rows = [t.rows[i] for i in range(4)]
    both = t.ctx.generate(rows, [0, 1, 2, 3], group_offset=0)
    alone = t.ctx.generate(rows[2:], [2, 3], group_offset=2)
    n = cfg.num_generations
    T = alone.completion_ids.shape[1]
    assert torch.equal(both.completion_ids[2 * n:, :T], alone.completion_ids)
    assert group_seed(0, 1, 2) != group_seed(0, 1, 3) != group_seed(0, 2, 2)


def test_launcher_builds_torchrun_command():
    """``grpolab train --nproc_per_node N ...`` is torchrun --standalone --nproc_per_node N -m grpolab train ..."""
    argv = ["train", "--nproc_per_node", "2", "--recipe", "grpo", "--nproc_per_node=3"]
    assert strip_option(argv, "--nproc_per_node") == ["train", "--recipe", "grpo"]
    assert torchrun_args(2, ["train", "--recipe", "grpo"]) == ["--standalone", "--nproc_per_node", "2", "-m",
                                                               "grpolab", "train", "--recipe", "grpo"]


def test_collectives_are_the_identity_in_one_process():
    assert not collective.initialized() and collective.world_size() == 1
    assert collective.all_reduce_sums({"a": 1.5}) == {"a": 1.5}
    assert collective.all_gather_objects({"x": 1}) == [{"x": 1}]
    assert [collective.shard_bounds(5, r, 2) for r in range(2)] == [(0, 2), (2, 5)]


@pytest.mark.parametrize("settings, named", [
    ({"use_lora": "true"}, "use_lora"),
    ({"update_strategy": "sfpo"}, "update_strategy"),
])
def test_fsdp2_refusals_come_before_the_ranks_start(tmp_path, monkeypatch, capsys, settings, named):
    """``distributed_strategy: fsdp2`` with LoRA (or a non-standard update strategy) is a config error: `grpolab
    train --nproc_per_node 2` says so and exits 2 without starting torchrun, naming both settings and the way
    out."""
    from grpolab import cli
    from grpolab.config import ConfigError
    from grpolab.distributed import launch

    started = []
    monkeypatch.setattr(launch, "launch", lambda *a: started.append(a) or 0)
    with pytest.raises(ConfigError, match=f"fsdp2.*{named}"):
        Config.build(layers("grpo", tmp_path / "c", distributed_strategy="fsdp2", **settings))
    argv = ["train", "--nproc_per_node", "2", "--model", "tiny", "--task", "repeat", "--out", str(tmp_path / "o"),
            "--distributed_strategy", "fsdp2"]
    for k, v in settings.items():
        argv += [f"--{k}", v]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert started == [] and "distributed_strategy: fsdp2" in err and named in err and "ddp" in err, err
    assert not (tmp_path / "o").exists()


def test_launcher_hands_the_ranks_the_run_folder_it_chose(tmp_path, monkeypatch):
    """The launching process checks the config and picks the run folder once; the ranks get it as --out."""
    from grpolab import cli
    from grpolab.distributed import launch

    started = []
    monkeypatch.setattr(launch, "launch", lambda n, argv: started.append((n, argv)) or 0)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--nproc_per_node", "2", "--model", "tiny", "--task", "repeat"]) == 0
    (n, argv), = started
    assert n == 2 and argv[-2:] == ["--out", Config().out]
