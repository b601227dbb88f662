"""Drawing tokens (layer 4): the KV-cache sampler (``sampling.py``), the static-cache decode step
(``fast_decode.py``), prompt tokenisation and batch packing (``plain.py``), continuation of token-id
sequences with stop strings and ids, episodes of model and environment turns (``turns.py``), and the vLLM
engine (``vllm_engine.py``, optional)."""
