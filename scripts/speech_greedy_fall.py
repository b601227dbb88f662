"""Measure the greedy-WER fall of a speech recipe (docs/speech.md, "Why greedy falls"): train the recipe for
``--steps`` steps per seed and compare the held-out transcripts of the model before and after, decoded greedily and
by seeded draws, with the statistics that separate the candidate causes.

    python scripts/speech_greedy_fall.py --recipe asr_grpo_audio --seeds 0 1 2            # the docs' table
    python scripts/speech_greedy_fall.py --recipe asr_grpo_audio --seeds 0 1 2 --set loss_aggregation=constant

Per seed, one JSON line: ``greedy`` / ``seeded`` held-out mean 1 - WER and exact match before -> after;
``seeded_train``: the same seeded draws on the first 200 training utterances (what the run trained on);
``greedy_len``: how many greedy transcripts are 2+ words short, 1 short, of the reference's length, longer;
``eos_early`` / ``eos_end``: the mean probability of ``</s>`` teacher-forced on the references, at the positions
before the reference's last word is written (stopping there deletes words) and right after it (the correct stop);
``sampled``: at the model before training, G = ``num_generations`` transcripts drawn at the run's temperature for
each of the first 64 training utterances: the per-word accuracy of the sampled words (words in the right place),
and the mean group advantage (reward minus its group's mean, the rewards of the recipe summed) of the transcripts
that are short, of the right length and long; a positive advantage for short ones means the reward, under
sampling, favours stopping early. Also the mean completion length (tokens) of training's first and last steps.
About 30-60 s per seed on one thread.

    python scripts/speech_greedy_fall.py --pretrain 100 200 400 500 600    # the built-in audio model's steps

pre-trains the built-in tiny audio model (``tiny_audio.py``) for each number of teacher-forcing steps (the recipe
otherwise unchanged, nothing cached) and prints its held-out greedy 1 - WER and exact match on the 200 held-out
utterances of ``spoken_words_audio`` (docs/speech.md, "The built-in model on audio").
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402


def _value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def held_out(policy, module, rows, sampling: str) -> list[str]:
    policy.eval_sampling = sampling
    out = []
    for i in range(0, len(rows), 64):
        b = policy.sample(module, rows[i:i + 64], list(range(i, i + len(rows[i:i + 64]))), num_generations=1,
                          evaluation=True)
        out += b.columns["completion"]
    return out


def scores(hyps, refs) -> dict:
    from grpolab.policies.speech_to_text.tasks import exact_match, one_minus_wer
    return {"wer1": round(float(np.mean(one_minus_wer(None, hyps, transcript=refs))), 4),
            "exact": round(float(np.mean(exact_match(None, hyps, transcript=refs))), 4)}


def lengths(hyps, refs) -> list[int]:
    """[2+ words short, 1 short, right length, longer]."""
    d = [len(h.split()) - len(r.split()) for h, r in zip(hyps, refs)]
    return [sum(x <= -2 for x in d), sum(x == -1 for x in d), sum(x == 0 for x in d), sum(x > 0 for x in d)]


@torch.no_grad()
def eos_probabilities(policy, module, rows) -> tuple[float, float]:
    """Mean p(</s>) teacher-forced on the references: before the last word (early) and after it (end)."""
    from grpolab.policies.speech_to_text.tiny import decoder_inputs, encode_transcripts

    feats, mask = policy.conditions(rows)
    refs = [r["transcript"] for r in rows]
    targets = encode_transcripts(refs, policy.vocab)
    logits = module(input_features=feats, attention_mask=mask,
                    decoder_input_ids=decoder_inputs(targets, policy.vocab["bos"])).logits.float()
    p = torch.softmax(logits / policy.temperature, -1)[..., policy.vocab["eos"]]
    early, end = [], []
    for i, r in enumerate(refs):
        n = len(r.split())
        early += p[i, :n].tolist()  # positions 0..n-1: </s> here deletes words
        end.append(float(p[i, n]))
    return round(float(np.mean(early)), 4), round(float(np.mean(end)), 4)


@torch.no_grad()
def sampled_groups(policy, module, rows, rewards, G: int, seed: int) -> dict:
    """Per-word accuracy of sampled transcripts, and the mean within-group advantage by length class."""
    b = policy.sample(module, rows, list(range(len(rows))), num_generations=G, temperature=policy.temperature,
                      generator=torch.Generator().manual_seed(seed))
    hyps, refs = b.columns["completion"], b.columns["transcript"]
    r = np.sum([np.asarray(fn(None, hyps, transcript=refs)) * w for _, fn, w in rewards], axis=0)
    adv = (r.reshape(-1, G) - r.reshape(-1, G).mean(1, keepdims=True)).ravel()
    d = np.array([len(h.split()) - len(t.split()) for h, t in zip(hyps, refs)])
    right = sum(sum(a == b for a, b in zip(h.split(), t.split())) for h, t in zip(hyps, refs))
    out = {"word_acc": round(right / sum(len(t.split()) for t in refs), 4)}
    for name, sel in (("short", d < 0), ("right", d == 0), ("long", d > 0)):
        out[f"adv_{name}"] = round(float(adv[sel].mean()), 4) if sel.any() else None
        out[f"n_{name}"] = int(sel.sum())
    return out


def run(recipe: str, seed: int, steps: int, sets: dict) -> dict:
    from grpolab.config import Config
    from grpolab.policies.speech_to_text.policy import SpeechToTextPolicy
    from grpolab.recipes import recipe_overrides
    from grpolab.registry import TASKS
    from grpolab.tasks import get_task
    from grpolab.train.metrics import read_metrics
    from grpolab.train.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        cfg = Config.build({**recipe_overrides(recipe), "steps": steps, "seed": seed, "save_steps": 1000,
                            "micro_batch_size": 128, "out": tmp + "/run", "stall_steps": 0, "threads": 1,
                            "eval_before": False, "eval_after": False, "tensorboard": False, **sets})
        Trainer(cfg, log=lambda *a: None).train(progress=False)
        metrics = read_metrics(tmp + "/run")
        own = set(TASKS.params(cfg.task))
        task = get_task(cfg.task, seed=seed, **{k: v for k, v in cfg.params.items() if k in own})
        rows, refs = task.eval_rows, [r["transcript"] for r in task.eval_rows]
        out = {"recipe": recipe, "seed": seed, "steps": steps, "set": sets}
        res = {}
        for when, model in (("before", cfg.model), ("after", tmp + "/run/final")):
            policy = SpeechToTextPolicy(model=model, temperature=cfg.temperature)
            module = policy.load(None, [], [], log=lambda *a: None)
            g = held_out(policy, module, rows, "greedy")
            s = held_out(policy, module, rows, "seeded")
            train = task.train_rows[:200]
            st = held_out(policy, module, train, "seeded")
            res[when] = {"greedy": scores(g, refs), "seeded": scores(s, refs), "greedy_len": lengths(g, refs),
                         "seeded_train": scores(st, [r["transcript"] for r in train]),
                         "eos": eos_probabilities(policy, module, rows)}
            if when == "before":
                out["sampled"] = sampled_groups(policy, module, task.train_rows[:64], task.rewards,
                                                cfg.num_generations, seed)
        for k in ("greedy", "seeded", "seeded_train"):
            out[k] = {m: [res["before"][k][m], res["after"][k][m]] for m in ("wer1", "exact")}
        out["greedy_len"] = [res["before"]["greedy_len"], res["after"]["greedy_len"]]
        out["eos_early"] = [res["before"]["eos"][0], res["after"]["eos"][0]]
        out["eos_end"] = [res["before"]["eos"][1], res["after"]["eos"][1]]
        key = next((k for k in ("completion_len_mean",)
                    if k in metrics[0]), None)
        if key:
            out["train_len"] = [round(metrics[0][key], 3), round(metrics[-1][key], 3)]
    return out


def pretrain_sweep(iterations: list[int]) -> None:
    from grpolab.policies.speech_to_text import tiny_audio as TA
    from grpolab.policies.speech_to_text.spoken_words import utterance
    from grpolab.policies.speech_to_text.tasks_audio import EVAL_BASE
    from grpolab.policies.speech_to_text.tiny import decode_tokens, greedy_decode

    torch.set_num_threads(1)
    refs, clips = zip(*(utterance(EVAL_BASE + i) for i in range(200)))
    feats, mask = TA.audio_features(TA.feature_extractor(), list(clips))
    for n in iterations:
        recipe = {**TA.pretrain_recipe(), "iterations": n}
        model, losses = TA.pretrain(recipe)
        hyps = [decode_tokens(x, recipe["vocab"]) for x in greedy_decode(model, feats, mask, recipe["vocab"]).tolist()]
        print(json.dumps({"iterations": n, "loss_curve": losses, "greedy": scores(hyps, list(refs))}), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default="asr_grpo_audio")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE config override (JSON value)")
    ap.add_argument("--pretrain", type=int, nargs="+", help="pre-train the built-in audio model for these steps")
    a = ap.parse_args(argv)
    if a.pretrain:
        pretrain_sweep(a.pretrain)
        return 0
    sets = {k: _value(v) for k, v in (s.split("=", 1) for s in a.set)}
    for seed in a.seeds:
        print(json.dumps(run(a.recipe, seed, a.steps, sets)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
