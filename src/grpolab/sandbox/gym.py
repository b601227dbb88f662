"""reasoning-gym scoring inside a sandbox child (:mod:`grpolab.sandbox`).

reasoning-gym's ``score_answer`` of several datasets evaluates the answer as
Python (``eval`` in spiral_matrix, string_insertion, n_queens, ...;
``sympy.parse_expr`` in polynomial_multiplication, simple_integration, ...).
``tasks/gym.py`` therefore never calls it in the training process: it builds the
datasets in the sandbox worker once (:func:`preload`, trusted set-up) and scores
each answer with :func:`score` in a fresh, limited child.
"""
from __future__ import annotations

_DATASETS: dict[str, object] = {}


def preload(key: str, name: str, size: int, seed: int, options: dict) -> None:
    """Build ``reasoning_gym.create_dataset(name, size, seed, **options)`` into the worker's cache as ``key``."""
    import reasoning_gym

    ds = _DATASETS[key] = reasoning_gym.create_dataset(name, size=size, seed=seed, **options)
    if size > 0:  # warm what the scorer imports lazily (sympy's parser, ...) once, not in every child
        entry = ds[0]
        ds.score_answer(str(entry["answer"]), entry)


def score(key: str, answer: str, entry: dict) -> float:
    """``score_answer(answer, entry)`` of the cached dataset ``key`` (runs in a sandbox child)."""
    return float(_DATASETS[key].score_answer(answer, entry))


def score_many(key_answer_entries: list) -> list[float | None]:
    """:func:`score` of each ``(key, answer, entry)`` in one child (``rg_sandbox: call``); None where it raised."""
    out = []
    for k, a, e in key_answer_entries:
        try:
            out.append(score(k, a, e))
        except Exception:  # noqa: BLE001 - that answer is unscorable, the others are not
            out.append(None)
    return out
