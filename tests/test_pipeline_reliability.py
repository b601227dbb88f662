"""A user's Stable Diffusion pipeline folder (policy ddpm, recipe ddpo; a tiny random-weight
StableDiffusionPipeline built in-process, tests/test_ddpm_pipelines.py::build_tiny_sd) survives what the digits
models survive (tests/test_image_reliability.py): a run killed with ``kill -9`` resumes to the uninterrupted run
(every step's metrics but timings and the final UNet, bit for bit; the VAE and the text encoder come from the
folder again), and 2 gloo ranks train what one process trains.

Minutes on a 2-core machine (every `grpolab train` process loads the pipeline): marker ``pipelines``,
``make test-pipelines``, not in ``make test``. tests/test_ddpm_pipelines.py::test_a_resumed_sd_run_is_the_straight_run
is the in-process resume that ``make test`` runs."""
import json
import subprocess
import sys

import pytest
import torch

from grpolab.config import Config
from grpolab.recipes import recipe_overrides
from grpolab.train.metrics import read_metrics
from grpolab.train.trainer import Trainer

from test_ddpm_pipelines import ROWS, build_tiny_sd
from test_image_reliability import TIMING, WORKER, env, kill_9_and_resume

pytest.importorskip("diffusers")
pytestmark = pytest.mark.pipelines

STEPS = 6
SETTINGS = {"ddpm_steps": 2, "ddpm_eval_steps": 2, "prompts_per_step": 2, "num_generations": 2,
            "micro_batch_size": 2, "eval_before": False, "eval_after": False, "tensorboard": False,
            "log_completions_steps": 0, "stall_steps": 0}


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory):
    """The pipeline, its prompts and a brightness reward file, as a user keeps them."""
    root = tmp_path_factory.mktemp("user")
    build_tiny_sd(root / "sd" / "pipe")
    (root / "bright.py").write_text("def score(completions, **kw):\n    return [float(c.mean()) for c in completions]\n")
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return root


def unet_weights(run) -> dict:
    """Every tensor of the run's final UNet (final/ is the user's pipeline folder; the UNet is final/unet/)."""
    from safetensors.torch import load_file

    files = sorted((run / "final" / "unet").glob("*.safetensors"))
    assert files, f"no final UNet in {run}"
    return {k: v for f in files for k, v in load_file(str(f)).items()}


def _cli(root, out, steps: int) -> list[str]:
    args = [a for k, v in SETTINGS.items() for a in (f"--{k}", str(v).lower() if isinstance(v, bool) else str(v))]
    return [sys.executable, "-m", "grpolab", "train", "--recipe", "ddpo", "--model", str(root / "sd" / "pipe"),
            "--data", str(root / "prompts.jsonl"), "--reward", f"{root / 'bright.py'}:score", "--steps", str(steps),
            "--save_steps", "2", "--threads", "1", "--out", str(out), "--quiet", *args]


def test_kill_9_of_a_pipeline_run_resumes_to_the_uninterrupted_run(user_folder, tmp_path):
    ref, out = tmp_path / "ref", tmp_path / "killed"
    kill_9_and_resume(lambda o: _cli(user_folder, o, STEPS), ref, out, STEPS, start_s=600, end_s=600, poll_s=0.02,
                      cwd=user_folder)
    wa, wb = unet_weights(ref), unet_weights(out)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_two_ranks_train_a_pipeline_as_one_process(user_folder, tmp_path):
    """3 steps on 2 gloo ranks and in one process (``rollout_seeding: group``, one thread like the ranks): the
    same UNet and the same metrics but timings, bit for bit (the reasons: test_image_reliability.py's twin)."""
    import os

    layers = {**recipe_overrides("ddpo"), **SETTINGS, "model": str(user_folder / "sd" / "pipe"),
              "data": str(user_folder / "prompts.jsonl"), "reward": [f"{user_folder / 'bright.py'}:score"],
              "steps": 3, "save_steps": 3}
    layers.pop("task", None)
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "plan.json").write_text(json.dumps([{**layers, "out": str(tmp_path / "ddp")}]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(tmp_path / "worker.py"), str(tmp_path / "plan.json")]
    proc = subprocess.Popen(cmd, env=env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cwd = os.getcwd()
    try:
        os.chdir(user_folder)
        Trainer(Config.build({**layers, "out": str(tmp_path / "single"), "rollout_seeding": "group"}),
                log=lambda *a: None).train(progress=False)
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
    text, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, text[-6000:]
    wa, wb = unet_weights(tmp_path / "ddp"), unet_weights(tmp_path / "single")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    m2, m1 = read_metrics(tmp_path / "ddp"), read_metrics(tmp_path / "single")
    assert [r["step"] for r in m2] == [r["step"] for r in m1] == [1, 2, 3]
    for a, b in zip(m2, m1):
        assert {k: v for k, v in a.items() if k not in TIMING} == {k: v for k, v in b.items() if k not in TIMING}
