"""What users rely on, with an image policy: a run killed with ``kill -9`` resumes to the uninterrupted run
(metrics and final weights identical; also for the dLLM and speech policies), and 2 gloo ranks train what one
process trains.

The image twins of tests/test_training.py::test_kill_9_and_resume_matches_uninterrupted_run and
tests/test_distributed.py::test_two_ranks_equal_one_process, for the recipe flow_grpo_images (policy
flow_matching) and, where the recipe exists, ddpo (policy ddpm: the stateful per_prompt_tracker advantage and the
random denoising-step subset drawn from the run's generator).
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import grpolab
from grpolab.config import Config
from grpolab.distributed import collective
from grpolab.recipes import recipe_names, recipe_overrides
from grpolab.train.checkpoint import checkpoint_dirs, read_state
from grpolab.train.metrics import read_metrics
from grpolab.train.trainer import Trainer

from _helpers import final_weights

pytest.importorskip("diffusers")

SRC = str(Path(grpolab.__file__).parent.parent)
TIMING = {"rollout_s", "train_s", "tokens_per_s", "train_seconds_total", "peak_rss_mb"}
# ddpo: buffers of 8 rewards, used from 8 on (2 steps of a prompt), so that a resumed run's advantages depend on
# the tracker's checkpointed buffers within a few steps (DDPO's 16 / 16 would need 4 steps of one prompt)
EXTRA = {"flow_grpo_images": {}, "ddpo": {"tracker_buffer_size": 8, "tracker_min_count": 8}}
RECIPES = [r for r in EXTRA if r in recipe_names()]
# vision_language (vlm_grpo): the tiny VLM of the smoke runs (5 pre-training steps, its own cache entry)
KILL_EXTRA = {"vlm_grpo": {"vlm_pretrain_steps": 5},
              # control: episodes of at most 60 steps (the checkpointed state, not CartPole's length, is tested)
              "ppo_control": {"max_completion_length": 60}}
# the kill -9 test also covers the other non-causal policies: masked_diffusion_lm (diffu_grpo: per-row mask seeds
# drawn from the run's generator, mask_reseed's passes), speech_to_text (asr_grpo), vision_language (vlm_grpo) and
# control (ppo_control: the control policy's episodes as grpo_control samples them, and control_gae's value network
# and optimiser in the checkpoint; grpo_control's state is a subset of it, so it is not run again)
KILLED = RECIPES + [r for r in ("diffu_grpo", "asr_grpo", "vlm_grpo", "ppo_control")
                    if r in recipe_names()]
# runs of the 2-rank test: name -> (recipe, settings); flow_random: a random half of each row's denoising steps,
# drawn from the run's generator after the rollout (DanceGRPO's / DDPO's timestep_fraction < 1)
RUNS = {**{r: (r, EXTRA[r]) for r in RECIPES},
        "flow_random": ("flow_grpo_images", {"steps_order": "random", "steps_fraction": 0.5})}


def env() -> dict:
    e = {k: v for k, v in os.environ.items() if k not in collective.ENV_KEYS}
    return {**e, "PYTHONPATH": SRC + os.pathsep + e.get("PYTHONPATH", ""), "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


# ------------------------------------------------------------------------------------------ kill -9 and resume
def _cli(recipe: str, out: Path, steps: int) -> list[str]:
    extra = [a for k, v in {**EXTRA.get(recipe, {}), **KILL_EXTRA.get(recipe, {})}.items() for a in (f"--{k}", str(v))]
    return [sys.executable, "-m", "grpolab", "train", "--recipe", recipe, "--steps", str(steps),
            "--prompts_per_step", "2", "--num_generations", "4", "--eval_before", "false", "--eval_after", "false",
            "--tensorboard", "false", "--save_steps", "2", "--threads", "1", "--out", str(out), "--quiet", *extra]


def kill_9_and_resume(cli, ref: Path, out: Path, steps: int, *, start_s: float, end_s: float, poll_s: float,
                      cwd=None, on_checkpoint=None) -> None:
    """Runs ``cli(ref)`` uninterrupted (its stderr in ``ref.log`` beside ``ref``) and ``cli(out)`` at once (on 2
    cores both run at once), kills the second with SIGKILL once it has logged 3 steps and saved a checkpoint
    (within ``start_s`` seconds), calls ``on_checkpoint(state)`` with the state of the checkpoint the resume will
    start from (before it), resumes with ``--resume`` and asserts that both end (within ``end_s``) with every
    step's metrics but timings equal. The uninterrupted run is killed if the check fails before it ends."""
    log = ref.parent / "ref.log"
    uninterrupted = subprocess.Popen(cli(ref), env=env(), stdout=subprocess.DEVNULL, stderr=log.open("w"), cwd=cwd)
    try:
        proc = subprocess.Popen(cli(out), env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
        deadline = time.time() + start_s
        while time.time() < deadline and proc.poll() is None:
            if len(read_metrics(out)) >= 3 and checkpoint_dirs(out):
                break
            time.sleep(poll_s)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert 3 <= len(read_metrics(out)) < steps, "the run ended before it was killed"
        if on_checkpoint is not None:
            on_checkpoint(read_state(checkpoint_dirs(out)[-1]))
        resumed = subprocess.run([sys.executable, "-m", "grpolab", "train", "--resume", str(out), "--quiet"],
                                 env=env(), capture_output=True, text=True, timeout=end_s, cwd=cwd)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert uninterrupted.wait(timeout=end_s) == 0, log.read_text()[-3000:]
    finally:
        if uninterrupted.poll() is None:
            uninterrupted.kill()
            uninterrupted.wait()
    a, b = read_metrics(ref), read_metrics(out)
    assert [r["step"] for r in b] == [r["step"] for r in a] == list(range(1, steps + 1))
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if k not in TIMING} == {k: v for k, v in rb.items() if k not in TIMING}


def _tracker_buffers_saved(state: dict) -> None:
    """ddpo: the per-prompt tracker's buffers are in the checkpoint the resume starts from."""
    assert any(s.get("buffers") for s in state["components"].values()), state["components"]


@pytest.mark.parametrize("recipe", KILLED)
def test_kill_9_and_resume_matches_uninterrupted_run(tmp_path, recipe):
    """Killed (SIGKILL) after its 3rd step, between the checkpoints of steps 2 and 4, and resumed with
    ``--resume``: every step's metrics (but timings) and the final weights equal the uninterrupted run's, bit for
    bit: the SDE's noise comes from the checkpointed generator, the step data lives only in its step, and
    ddpo's per_prompt_tracker buffers are checkpointed (a resume that drops them differs from step 7 on:
    measured, prompts of steps 1-2 come back then)."""
    steps = 8
    ref, out = tmp_path / "ref", tmp_path / "killed"
    kill_9_and_resume(lambda o: _cli(recipe, o, steps), ref, out, steps, start_s=240, end_s=300, poll_s=0.01,
                      on_checkpoint=_tracker_buffers_saved if recipe == "ddpo" else None)
    wa, wb = final_weights(ref), final_weights(out)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# ------------------------------------------------------------------------------------------ 2 ranks = 1 process
BASE = {"prompts_per_step": 2, "num_generations": 4, "micro_batch_size": 4, "steps": 3, "save_steps": 3,
        "eval_before": False, "eval_after": False, "tensorboard": False, "log_completions_steps": 0}

WORKER = textwrap.dedent('''
    import json, sys
    from grpolab.config import Config
    from grpolab.distributed import collective
    from grpolab.distributed.trainer import DistributedTrainer

    collective.init_from_env("cpu")
    for layers in json.load(open(sys.argv[1])):
        DistributedTrainer(Config.build(layers), log=lambda *a: None).train(progress=False)
''')


def layers(run: str, out, **kw) -> dict:
    recipe, extra = RUNS[run]
    return {**recipe_overrides(recipe), **BASE, **extra, "out": str(out), **kw}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One torchrun launch (2 gloo ranks) trains every run of RUNS; meanwhile this process trains the
    single-process twins (``rollout_seeding: group``, one thread like the ranks)."""
    tmp = tmp_path_factory.mktemp("dist")
    (tmp / "worker.py").write_text(WORKER)
    (tmp / "plan.json").write_text(json.dumps([layers(r, tmp / f"ddp_{r}") for r in RUNS]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(tmp / "worker.py"), str(tmp / "plan.json")]
    proc = subprocess.Popen(cmd, env=env(), cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for r in RUNS:
            Trainer(Config.build(layers(r, tmp / f"single_{r}", rollout_seeding="group")),
                    log=lambda *a: None).train(progress=False)
    finally:
        torch.set_num_threads(threads)
    text, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, text[-6000:]
    return tmp


@pytest.mark.parametrize("run", list(RUNS))
def test_two_ranks_equal_one_process(two_ranks, run):
    """After 3 steps the 2-rank DDP run and the single-process run (``rollout_seeding: group``) hold the same
    weights and logged the same metrics (but timings), bit for bit, in the image policies' float32.

    Exact, not to a tolerance, and without float64 (the image policies compute in float32 whatever the dtype):
    each rank draws one whole group, from the generator seeded by (seed, step, group id), and the policy draws
    all of a group's noise from it in a fixed order (row_noise, then the SDE's steps), so the samples are the
    single-process ones; each rank runs the forward and backward of one of the step's two micro-batches, the
    single-process micro-batch with its shapes (so the same convolution kernels); the gradients' sum over 2 ranks
    is one addition, which one process does too, and the loss's x2 / DDP's /2 are exact. flow_random draws a
    random half of the steps from the run's generator after the rollout: equal only if every rank's generator
    is left as one process leaves it (DistributedTrainer.run_strategy takes the state of the rank that drew
    the last group; before that, rank 0's masks were drawn from another state: weights 1.8e-3 apart)."""
    got, ref = two_ranks / f"ddp_{run}", two_ranks / f"single_{run}"
    wa, wb = final_weights(got), final_weights(ref)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    m2, m1 = read_metrics(got), read_metrics(ref)
    assert [r["step"] for r in m2] == [r["step"] for r in m1] == [1, 2, 3]
    for a, b in zip(m2, m1):
        assert {k: v for k, v in a.items() if k not in TIMING} == {k: v for k, v in b.items() if k not in TIMING}
