"""`make test-vllm`'s training run: `grpolab train` with generation_engine: vllm (and, with --server, through
`grpolab vllm-serve`) on the tiny model, then the engine-vs-trainer log-prob mismatch from its metrics.jsonl.

    HF_HUB_OFFLINE=1 .venv-vllm/bin/python scripts/vllm_train_check.py [--steps 4] [--server]

The tiny model is saved with hidden size 128 (vLLM's CPU attention takes head sizes 32, 64, ...; the default
tiny model's is 16). Exit code 1 when the mean |logp_trainer - logp_vllm| per token exceeds --max-mismatch.
The engine and the trainer both run in ENGINE_DTYPE (float32): with the trainer on `dtype: auto`, a CPU with
AVX512-BF16 trained in bfloat16 against a float32 engine and the mismatch (1.58e-3) was bf16 rounding, not a sync.
"""
import argparse
import functools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the precision of both the vLLM engine (``vllm_dtype`` / ``vllm-serve --dtype``) and the trainer (``dtype``)
ENGINE_DTYPE = "float32"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--server", action="store_true", help="generate through `grpolab vllm-serve` (a subprocess)")
    p.add_argument("--max-mismatch", type=float, default=1e-3)
    args = p.parse_args()
    from grpolab.cli import main as cli
    from grpolab.config import Config
    from grpolab.model import loading
    from grpolab.train.trainer import Trainer

    tmp = Path(tempfile.mkdtemp(prefix="grpolab-vllm-"))
    job = {"task": "repeat", "prompts_per_step": 4, "num_generations": 4, "max_completion_length": 6,
           "learning_rate": 3e-3, "eval_before": False, "eval_after": False, "tensorboard": False}
    loading.build_tiny = functools.partial(loading.build_tiny, hidden=128)
    init = Trainer(Config.build({**job, "model": "tiny", "out": str(tmp / "init")}), log=lambda *a: None)
    loading.save_policy(init.model, init.tok, tmp / "model")
    del init
    argv = ["train", "--model", str(tmp / "model"), "--steps", str(args.steps), "--out", str(tmp / "run"),
            "--quiet", "--vllm_dtype", ENGINE_DTYPE, "--dtype", ENGINE_DTYPE, "--vllm_enforce_eager", "true"]
    argv += [x for k, v in job.items() for x in (f"--{k}", str(v).lower() if isinstance(v, bool) else str(v))]
    server = None
    if args.server:
        server = subprocess.Popen([sys.executable, "-m", "grpolab", "vllm-serve", "--model", str(tmp / "model"),
                                   "--port", "0", "--enforce-eager", "--dtype", ENGINE_DTYPE], stdout=subprocess.PIPE,
                                  text=True)
        url = next(line for line in server.stdout if "vllm-serve:" in line).strip().rsplit(" ", 1)[-1]
        argv += ["--generation_engine", "vllm_server", "--vllm_server_url", url]
    else:
        argv += ["--generation_engine", "vllm"]
    t0 = time.time()
    try:
        rc = cli(argv)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
    if rc:
        return rc
    rows = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    mism = [r["engine_logprob_mismatch"] for r in rows if "engine_logprob_mismatch" in r]
    mean = sum(mism) / len(mism)
    engine = "vllm_server" if args.server else "vllm"
    print(f"[test-vllm] grpolab train --generation_engine {engine}, {len(rows)} steps in {time.time() - t0:.0f} s: "
          f"engine_logprob_mismatch mean {mean:.2e} (per step {', '.join(f'{m:.2e}' for m in mism)})")
    return 0 if len(mism) == args.steps and mean <= args.max_mismatch else 1


if __name__ == "__main__":
    sys.exit(main())
