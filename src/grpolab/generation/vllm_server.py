"""vLLM as a separate server process (``grpolab vllm-serve``) and the trainer's HTTP client for it.

Generation can live on other GPUs or machines than the trainer, as with TRL's
``trl vllm-serve`` (same split: a server that owns the engine; the trainer
sends prompts and pushes weights after every update). The transport is plain
HTTP with JSON and safetensors; the server is Python's ``http.server`` around
the same :class:`~grpolab.generation.vllm_engine.VLLMEngine` that
``generation_engine: vllm`` runs in-process, so both engines share one
sampling path.

Endpoints (``grpolab vllm-serve --model FOLDER --port 8000``):

- ``GET /health`` -> ``{"status": "ok", "model": ..., "weights_version": N, "weight_pushes": P,
  "prompts_served": Q}`` (``P`` full weight sets loaded, ``Q`` prompts sampled since the server started)
- ``GET /v1/models`` -> the OpenAI model list (one model).
- ``POST /v1/completions`` -> OpenAI-compatible completions. ``prompt`` is a
  string, a list of token ids, or a list of those (a batch; vLLM batches them
  in one ``generate`` call). Sampling keys: ``n``, ``max_tokens``,
  ``temperature``, ``top_p``, ``logprobs`` and ``seed`` (OpenAI's), plus
  vLLM's extensions ``top_k``, ``stop_token_ids``, ``include_stop_str_in_output``.
  With a batch and a ``seed``, prompt ``i`` is seeded ``seed + i``. Each choice
  carries OpenAI's ``text``, ``finish_reason`` and ``logprobs``
  (``tokens`` / ``token_logprobs``) and vLLM's ``token_ids`` and
  ``stop_reason``; the response carries ``weights_version``, the version of the
  weights that sampled it.
- ``POST /update_weights`` (body: safetensors bytes of ``{HF name: tensor}``;
  headers ``X-Weights-Version: N`` and ``X-Weights-Final: 0|1``) collects the
  chunks; on the final one the full set is loaded into the engine, the prefix
  cache is dropped and the server's ``weights_version`` becomes ``N``. Weights
  go in chunks of at most ``chunk_mb`` so no request body is the model's size.

The server has no authentication: anyone who reaches its port can replace its
weights. It listens on 127.0.0.1 unless ``--host`` says otherwise; across
machines, bind it to a private network only.

Version stamps: the client (``generation_engine: vllm_server``) counts its
pushes; every completions response must carry the client's current version,
otherwise the client raises (another trainer pushed weights to the same
server, or the server restarted), so a rollout never silently samples from
weights other than the trainer's. A server found at a version other than 0
(weights from an earlier run) gets the trainer's weights before the first
rollout.

Several servers: ``vllm_server_url: http://gen0:8000,http://gen1:8000`` (comma-separated). A
trainer process splits each batch of prompts into contiguous blocks, one per server it samples on, sent in
parallel; request ``i`` keeps the seed ``seed + i`` of the whole batch, so the completions are the ones one
server would give. On torch.distributed ranks each server belongs to one rank, which alone pushes the weights
to it: with ``S`` servers and ``W`` ranks, rank ``r`` samples on the servers ``s`` with ``s % W == r % S``
(``S >= W``: its own servers; ``S < W``: server ``r % S``, shared with other ranks) and pushes to those with
``s % W == r``, so every server receives exactly one push per update; a rank that shares a server without
pushing to it waits until the server reports the new weights version.
"""
from __future__ import annotations

import argparse
import json
import threading
from concurrent.futures import ThreadPoolExecutor
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from .counting import GENERATED
from .vllm_engine import VLLMEngine, policy_weights

DEFAULT_CHUNK_MB = 256


# ---------------------------------------------------------------- server side

class EngineService:
    """The server's state: one engine, its weights version, a lock (vLLM's ``LLM`` is not re-entrant)."""

    def __init__(self, engine, model_name: str):
        self.engine = engine
        self.model_name = model_name
        self.version = 0
        self.pending = []  # chunks of the weight push in progress
        self.pushes = 0  # full weight sets loaded
        self.prompts_served = 0
        self.lock = threading.Lock()

    def health(self) -> dict:
        return {"status": "ok", "model": self.model_name, "weights_version": self.version,
                "weight_pushes": self.pushes, "prompts_served": self.prompts_served}

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "grpolab"}]}

    def completions(self, body: dict) -> dict:
        prompts = body.get("prompt")
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not isinstance(prompts, list) or not prompts:
            raise ValueError("'prompt' must be a string, a list of token ids, or a non-empty list of those")
        tok = getattr(self.engine.llm, "get_tokenizer", lambda: None)()
        ids = [p if isinstance(p, list) else _encode(tok, p) for p in prompts]
        seed = body.get("seed")
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else stop
        params = [self.engine.sampling_params(n=int(body.get("n", 1)), temperature=float(body.get("temperature", 1.0)),
                                      top_k=int(body.get("top_k", -1)), top_p=float(body.get("top_p", 1.0)),
                                      max_tokens=int(body.get("max_tokens", 16)),
                                      seed=None if seed is None else int(seed) + i, stop=stop or None,
                                      stop_token_ids=body.get("stop_token_ids") or None,
                                      include_stop_str_in_output=bool(body.get("include_stop_str_in_output")))
                  for i in range(len(ids))]
        with self.lock:
            outs = self.engine.run(ids, params)
            version = self.version
            self.prompts_served += len(ids)
        choices = []
        for k, (toks, lps, finish, stop_reason) in enumerate(outs):
            pieces = [tok.decode([t]) for t in toks] if tok is not None else [str(t) for t in toks]
            choices.append({"index": k, "text": "".join(pieces), "finish_reason": finish, "stop_reason": stop_reason,
                            "token_ids": toks, "logprobs": {"tokens": pieces, "token_logprobs": lps}})
        return {"id": f"cmpl-{time.time_ns()}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices, "weights_version": version}

    def update_weights(self, payload: bytes, version: int, final: bool) -> dict:
        from safetensors.torch import load

        with self.lock:
            self.pending += list(load(payload).items())
            if final:  # vLLM reloads a full set at once (its kernel-format processing is per layer)
                named, self.pending = self.pending, []
                self.engine.load_weights(named)  # also drops the prefix cache
                self.version = version
                self.pushes += 1
        return {"weights_version": self.version}


def _encode(tok, text: str) -> list[int]:
    if tok is None:
        raise ValueError("this engine has no tokenizer: send 'prompt' as token ids")
    return list(tok.encode(text))


def make_handler(service: EngineService):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet; errors are returned to the client
            pass

        def _send(self, code: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length", 0)))

        def do_GET(self):
            path = self.path.rstrip("/")
            if path == "/health":
                return self._send(200, service.health())
            if path == "/v1/models":
                return self._send(200, service.models())
            self._send(404, {"error": {"message": f"no endpoint GET {self.path}"}})

        def do_POST(self):
            path = self.path.rstrip("/")
            try:
                if path == "/v1/completions":
                    return self._send(200, service.completions(json.loads(self._body() or b"{}")))
                if path == "/update_weights":
                    version = int(self.headers.get("X-Weights-Version", "-1"))
                    if version < 0:
                        raise ValueError("POST /update_weights needs the header X-Weights-Version: N (N >= 0)")
                    final = self.headers.get("X-Weights-Final", "1") == "1"
                    return self._send(200, service.update_weights(self._body(), version, final))
                self._send(404, {"error": {"message": f"no endpoint POST {self.path}"}})
            except (ValueError, KeyError, TypeError, RuntimeError) as e:
                self._send(400, {"error": {"message": f"{type(e).__name__}: {e}"}})

    return Handler


def serve(engine, model_name: str, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """An HTTP server around ``engine`` (not started: call ``serve_forever``)."""
    return ThreadingHTTPServer((host, port), make_handler(EngineService(engine, model_name)))


def main(argv: list[str] | None = None) -> int:
    """``grpolab vllm-serve --model FOLDER [--host H] [--port P] [engine options]``."""
    p = argparse.ArgumentParser(prog="grpolab vllm-serve",
                                description="Serve a vLLM engine over HTTP for generation_engine: vllm_server "
                                            "(OpenAI-compatible /v1/completions plus POST /update_weights).")
    p.add_argument("--model", required=True, help="a Hugging Face model folder (the trainer's --model)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for "
                                                       "trainers on other machines)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of the GPU the engine may take (default 0.9: the server owns its GPU)")
    p.add_argument("--max-model-len", type=int, default=None, help="maximum prompt + completion length")
    p.add_argument("--dtype", default="auto", help="weight dtype in the engine (default: the model's)")
    p.add_argument("--seed", type=int, default=0, help="engine seed (requests carry their own seeds)")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs / torch.compile (faster start; "
                                                                "what the CPU build is tested with)")
    args = p.parse_args(argv)
    engine = VLLMEngine(args.model, gpu_memory_utilization=args.gpu_memory_utilization,
                        max_model_len=args.max_model_len, dtype=args.dtype, seed=args.seed,
                        enforce_eager=args.enforce_eager)
    server = serve(engine, args.model, args.host, args.port)
    print(f"[grpolab] vllm-serve: {args.model} on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


# ---------------------------------------------------------------- trainer side

class VLLMServerEngine:
    """The trainer's engine for ``generation_engine: vllm_server``: generates over HTTP, pushes weights.

    Same interface as :class:`~grpolab.generation.vllm_engine.VLLMEngine`
    (``generate``, ``continue_``, ``sync``), so rollouts are unchanged. ``url``: one server, or several
    comma-separated; ``rank`` / ``world_size``: this trainer process among the torch.distributed ranks, which
    decide the servers it samples on and the ones it pushes weights to (the module's docstring).
    """

    def __init__(self, url: str, *, timeout: float = 240.0, chunk_mb: int = DEFAULT_CHUNK_MB, rank: int = 0,
                 world_size: int = 1):
        urls = [u.strip().rstrip("/") for u in str(url).split(",") if u.strip()]
        if not urls or any(not u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"vllm_server_url: {url!r} is not a server address; give http://HOST:PORT, or several "
                             f"separated by commas")
        if len(set(urls)) != len(urls):
            raise ValueError(f"vllm_server_url: {url!r} names a server twice; each server once")
        self.all_urls = urls
        sample_on, push_to = assign_servers(len(urls), rank, world_size)
        self.servers = [urls[s] for s in sample_on]
        self.pushes_to = [urls[s] for s in push_to]
        self.url = self.servers[0]
        self.timeout = timeout
        self.chunk_bytes = chunk_mb * 2 ** 20
        self.syncs = 0
        versions = [int(self._wait_healthy(u, timeout)["weights_version"]) for u in self.servers]
        self.version = max(versions)
        # weights pushed by an earlier run: the trainer must push its own before the first rollout
        self.needs_sync = any(v != 0 for v in versions)
        self._pool = ThreadPoolExecutor(max_workers=len(self.servers), thread_name_prefix="vllm-server")

    def _wait_healthy(self, url: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self._get(url, "/health")
            except (urllib.error.URLError, ConnectionError, OSError) as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"generation_engine 'vllm_server': no server answered at {url}/health "
                                       f"within {timeout:.0f} s ({e}). Start one with `grpolab vllm-serve --model "
                                       f"FOLDER --port PORT` and set vllm_server_url") from e
                time.sleep(0.5)

    def _get(self, url: str, path: str) -> dict:
        with urllib.request.urlopen(url + path, timeout=self.timeout) as r:
            return json.loads(r.read())

    def _post(self, url: str, path: str, data: bytes, headers: dict) -> dict:
        req = urllib.request.Request(url + path, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=None) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"vllm_server {url}{path}: HTTP {e.code}: {e.read().decode(errors='replace')}") from e

    def _complete(self, url: str, prompts: list[list[int]], **body) -> list[tuple]:
        out = self._post(url, "/v1/completions", json.dumps({"prompt": prompts, "logprobs": 0, **body}).encode(),
                         {"Content-Type": "application/json"})
        if out["weights_version"] != self.version:
            raise RuntimeError(f"vllm_server at {url} sampled with weights version {out['weights_version']}, "
                               f"the trainer's is {self.version}: another trainer pushed weights to this server or "
                               f"it restarted. Give each run its own server")
        return [(c["token_ids"], c["logprobs"]["token_logprobs"], c["finish_reason"], c.get("stop_reason"))
                for c in out["choices"]]

    def _spread(self, weights: list[int], request) -> list:
        """``request(url, start, end)`` for contiguous blocks of the requests (``weights``: completions each),
        one block per server, in parallel; the outputs in request order, counted in this process's tally."""
        bounds = _blocks(weights, len(self.servers))
        jobs = [self._pool.submit(request, url, lo, hi) for url, (lo, hi) in zip(self.servers, bounds) if hi > lo]
        out = [o for job in jobs for o in job.result()]
        GENERATED.add(len(out), sum(len(o[0]) for o in out))  # sampled by the servers, for this trainer
        return out

    def generate(self, prompts: list[list[int]], counts: list[int], *, temperature: float, top_k: int, top_p: float,
                 max_tokens: int, seed: int | None = None):
        """As :meth:`VLLMEngine.generate`; one request per run of prompts with equal ``n``, spread over the
        servers."""
        def request(url, lo, hi):
            out = []
            for start, end in _runs(counts[lo:hi]):
                start, end = start + lo, end + lo
                out += self._complete(url, prompts[start:end], n=counts[start], temperature=temperature,
                                      top_k=top_k if top_k > 0 else -1, top_p=top_p, max_tokens=max_tokens,
                                      seed=None if seed is None else seed + start)
            return out

        return [(ids, lps, reason == "stop") for ids, lps, reason, _ in self._spread(list(counts), request)]

    def continue_(self, contexts: list[list[int]], *, max_tokens: list[int], temperature: list[float], top_k: int,
                  top_p: float, stop: list[str] = (), stop_token_ids: list[int] = (), seed: int | None = None):
        """As :meth:`VLLMEngine.continue_`; one request per run of contexts with equal limits, spread over the
        servers."""
        keys = [(int(m), float(t)) for m, t in zip(max_tokens, temperature)]

        def request(url, lo, hi):
            out = []
            for start, end in _runs(keys[lo:hi]):
                start, end = start + lo, end + lo
                m, t = keys[start]
                out += self._complete(url, contexts[start:end], n=1, temperature=t,
                                      top_k=top_k if top_k > 0 else -1, top_p=top_p, max_tokens=m,
                                      seed=None if seed is None else seed + start, stop=list(stop),
                                      stop_token_ids=list(stop_token_ids), include_stop_str_in_output=True)
            return out

        return self._spread([1] * len(contexts), request)

    @torch.no_grad()
    def sync(self, model) -> None:
        """Push the policy's weights (chunks of safetensors) under the next version stamp to the servers this
        process pushes to, in parallel; on a server another rank pushes to, wait until it holds that version."""
        from safetensors.torch import save

        version = self.version + 1
        bodies = []
        if self.pushes_to:
            chunks, chunk, size = [], {}, 0
            for name, p in policy_weights(model):
                # every name, tied ones too: vLLM's in-place reload re-ties nothing (measured: leaving out the tied
                # lm_head.weight of the tiny model gave a 0.07 log-prob mismatch after the first push)
                t = p.detach().to("cpu").contiguous().clone()  # clone: tied weights share storage
                nbytes = t.numel() * t.element_size()
                if chunk and size + nbytes > self.chunk_bytes:
                    chunks.append(chunk)
                    chunk, size = {}, 0
                chunk[name], size = t, size + nbytes
            chunks.append(chunk)
            bodies = [save(c) for c in chunks]
        jobs = [self._pool.submit(self._push, url, bodies, version) for url in self.pushes_to]
        jobs += [self._pool.submit(self._await_version, url, version) for url in self.servers
                 if url not in self.pushes_to]
        for job in jobs:
            job.result()
        self.version = version
        self.needs_sync = False
        self.syncs += 1

    def _push(self, url: str, bodies: list[bytes], version: int) -> None:
        for i, body in enumerate(bodies):
            final = i == len(bodies) - 1
            got = self._post(url, "/update_weights", body, {"Content-Type": "application/octet-stream",
                                                             "X-Weights-Version": str(version),
                                                             "X-Weights-Final": "1" if final else "0"})
        if got["weights_version"] != version:
            raise RuntimeError(f"vllm_server at {url} did not take weights version {version} "
                               f"(it reports {got['weights_version']})")

    def _await_version(self, url: str, version: int) -> None:
        """Wait until ``url`` (pushed to by another rank) holds weights ``version``."""
        deadline = time.monotonic() + self.timeout
        while (held := int(self._get(url, "/health")["weights_version"])) != version:
            if held > version:
                raise RuntimeError(f"vllm_server at {url} holds weights version {held}, newer than this trainer's "
                                   f"{version}: another trainer pushed weights to it. Give each run its own servers")
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm_server at {url} still holds weights version {held} after "
                                   f"{self.timeout:.0f} s (vllm_server_timeout): the rank that pushes to it did not "
                                   f"push version {version}")
            time.sleep(0.02)


def assign_servers(n_servers: int, rank: int, world_size: int) -> tuple[list[int], list[int]]:
    """``(servers rank samples on, servers rank pushes weights to)``, as indices: rank ``r`` samples on the
    servers ``s`` with ``s % world_size == r % n_servers`` and pushes to those with ``s % world_size == r``, so
    each server is pushed to by exactly one rank (the lowest that samples on it) and each rank has a server."""
    sample_on = [s for s in range(n_servers) if s % world_size == rank % n_servers]
    return sample_on, [s for s in sample_on if s % world_size == rank]


def _blocks(weights: list[int], k: int) -> list[tuple[int, int]]:
    """``k`` contiguous ``[lo, hi)`` blocks of the items, each about ``sum(weights) / k`` in weight."""
    total, bounds, acc, lo = sum(weights), [], 0, 0
    for b in range(1, k):
        target = total * b / k
        hi = lo
        while hi < len(weights) and acc + weights[hi] / 2 <= target:
            acc += weights[hi]
            hi += 1
        bounds.append((lo, hi))
        lo = hi
    bounds.append((lo, len(weights)))
    return bounds


def _runs(keys: list) -> list[tuple[int, int]]:
    """``[start, end)`` of each maximal run of equal consecutive keys."""
    runs, start = [], 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            runs.append((start, i))
            start = i
    return runs
