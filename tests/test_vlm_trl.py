"""grpolab beside TRL 1.16's ``GRPOTrainer`` on the same tiny random-weight Qwen2-VL (the VLM of TRL's VLM GRPO
examples) and the same TRL-style rows (conversational prompts with ``{"type": "image"}`` blocks, an ``image``
column of PIL pictures of 4 sizes), issue 42. TRL generates and scores one batch
(``_generate_and_score_completions``); on its prompts and completions:

- grpolab's prompt ids are TRL's (the same chat template and image-token expansion);
- per-token log-probs: TRL's ``_get_per_token_logps_and_entropies`` scores the full vocabulary, grpolab's policy
  the vocabulary without the image placeholder token (its sampler never writes one; TRL's run here suppresses it in
  generation with ``generation_kwargs={"suppress_tokens": [image token]}``, so both sample the same support). So
  grpolab = TRL - log(1 - p_image) per token, p_image the tempered softmax's image-token probability, checked
  exactly (1e-5); on a trained model p_image ~ 0 and the two coincide;
- advantages (TRL's ``scale_rewards="group"`` = grpolab's ``group_zscore``) are equal;
- the loss (TRL's default ``loss_type="dapo"``, epsilon 0.2 both sides, beta 0): equal with TRL's on-policy old
  log-probs and with shifted ones on both sides of the clip range; its gradient w.r.t. every weight equals TRL's
  once the image-token term is added to TRL's loss (and differs without it: the check can fail).

Skipped only without trl (the bench extra: ``pip install -e '.[bench]'``); ``make test`` runs it when trl is there.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL is the bench extra: pip install -e '.[bench]'")

from test_vlm_models import _rows, build_qwen  # noqa: E402  (tests/ is on sys.path: rootdir conftest)

TEMP = 0.7


def _pil_rows():
    from PIL import Image
    return [{"prompt": r["prompt"], "image": Image.fromarray(np.asarray(r["image"], dtype=np.uint8)),
             "answer": r["answer"]} for r in _rows()]


def test_logprobs_advantages_loss_and_gradient_equal_trl_grpotrainer(tmp_path, monkeypatch):
    from datasets import Dataset
    from transformers import Qwen2VLForConditionalGeneration

    import grpolab
    from grpolab.algorithms.aggregation import StepTotals
    from grpolab.batch import RolloutBatch

    folder = tmp_path / "m"
    folder.mkdir()
    _, proc = build_qwen("qwen2_vl", folder, monkeypatch)  # the native processor (less its video part)
    proc.tokenizer.padding_side = "left"  # as TRL loads a processor (padding_side="left")
    rows = _pil_rows()
    rewards_seen = []

    def varied(completions, **kw):
        out = [float(sum(map(ord, str(c))) % 7) for c in completions]
        rewards_seen.append(out)
        return out

    # ---- TRL: generate and score one batch (4 prompts x G 2) on its own copy of the weights
    tm = Qwen2VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    image_id = tm.config.image_token_id
    args = trl.GRPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=8, num_generations=2,
                          max_completion_length=6, max_steps=1, temperature=TEMP, report_to="none", use_cpu=True,
                          bf16=False, gradient_checkpointing=False, seed=0,
                          generation_kwargs={"suppress_tokens": [image_id]})
    t = trl.GRPOTrainer(model=tm, reward_funcs=varied, args=args, train_dataset=Dataset.from_list(rows),
                        processing_class=proc)
    t.current_gradient_accumulation_steps = 1  # what Trainer.train sets (gradient_accumulation_steps 1)
    assert (t.loss_type, t.beta) == ("dapo", 0.0)
    batch_rows = [rows[i] for i in range(4) for _ in range(2)]
    t.model.train()
    inputs = t._generate_and_score_completions(batch_rows)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    am = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    T = inputs["completion_ids"].shape[1]
    pix = {k: inputs[k] for k in ("pixel_values", "image_grid_thw", "mm_token_type_ids")}
    with torch.no_grad():
        lp_trl, _, _ = t._get_per_token_logps_and_entropies(t.model, ids, am, T, num_images=inputs["num_images"],
                                                            **pix)
        logits = tm(input_ids=ids, attention_mask=am, **pix).logits[:, -T - 1:-1].float() / TEMP
        p_image = torch.softmax(logits, -1)[..., image_id]

    # ---- grpolab: the same folder, rows and settings through the Python API (a TRL drop-in)
    g = grpolab.GRPOTrainer(model=str(folder), reward_funcs=varied, train_dataset=rows, args=grpolab.GRPOConfig(
        output_dir=str(tmp_path / "g"), per_device_train_batch_size=8, num_generations=2, max_completion_length=6,
        max_steps=1, temperature=TEMP, report_to="none", threads=1, dtype="float32"))
    tr, policy = g.trainer, g.trainer.policy
    assert (tr.cfg.policy_loss, tr.cfg.loss_aggregation, tr.cfg.advantage) == (
        "clipped_ratio", "token_mean", "group_zscore")
    prompt_ids, prompt_mask, row_data = policy._encode(batch_rows)
    assert torch.equal(prompt_ids, inputs["prompt_ids"]) and torch.equal(prompt_mask.long(), inputs["prompt_mask"])
    mask = inputs["completion_mask"].float()
    b = RolloutBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=inputs["completion_ids"],
                     completion_mask=mask, behavior_logprobs=torch.zeros(8, T), group_ids=torch.arange(8) // 2,
                     prompt_uids=torch.arange(8) // 2, truncated=mask[:, -1] > 0, row_data=row_data)
    with torch.no_grad():
        lp = policy.forward(tr.model, b, grad=False)["logprobs"]
    assert torch.allclose(lp * mask, (lp_trl - torch.log1p(-p_image)) * mask, atol=1e-5)
    assert ((lp - lp_trl) * mask).abs().max() > 1e-3  # the image-token term is really there at random weights

    b.scalar_rewards = torch.tensor(rewards_seen[0])
    tr.step = 0
    b.advantages = tr.compute_advantages(b)
    assert torch.allclose(b.advantages, inputs["advantages"][:, None] * mask, atol=1e-6)
    assert b.advantages.abs().max() > 0.5
    totals = StepTotals.from_masks([mask], constant=tr.cfg.max_completion_length)

    # the loss with old log-probs shifted by the same amount on both sides (ratios on both sides of the clip range)
    shift = (torch.rand(8, T, generator=torch.Generator().manual_seed(1)) - 0.5) * 1.2
    trl_in = {**inputs, "old_per_token_logps": lp_trl + shift}
    b.behavior_logprobs = (lp + shift) * mask
    with torch.no_grad():
        ours = tr._micro_batch_loss(b, totals, tr.loss_wants)[0]
        theirs = t.compute_loss(t.model, trl_in)
    assert float(ours) == pytest.approx(float(theirs), abs=1e-6)
    unclipped = -(inputs["advantages"][:, None] * torch.exp(-shift) * mask).sum() / inputs["num_items_in_batch"]
    assert abs(float(unclipped) - float(theirs)) > 1e-3  # the clip range is reached

    # on-policy (TRL's num_iterations 1: old = its log-probs detached): the loss and its gradient
    b.behavior_logprobs = lp * mask
    tm.zero_grad()
    theirs = t.compute_loss(t.model, inputs)
    theirs.backward()
    trl_grads = {k: p.grad.clone() for k, p in tm.named_parameters() if p.grad is not None}
    logits = tm(input_ids=ids, attention_mask=am, **pix).logits[:, -T - 1:-1].float() / TEMP
    term = (inputs["advantages"][:, None] * mask * torch.log1p(-torch.softmax(logits, -1)[..., image_id])).sum()
    (term / inputs["num_items_in_batch"]).backward()  # d(-A lp_grpolab) = d(-A lp_trl) + d(A log(1 - p_image))
    tr.model.zero_grad()
    ours = tr._micro_batch_loss(b, totals, tr.loss_wants)[0]
    ours.backward()
    assert float(ours) == pytest.approx(float(theirs), abs=1e-6)
    mine = {k: p.grad for k, p in tr.model.named_parameters() if p.grad is not None}
    assert mine.keys() == trl_grads.keys() and len(mine) > 50
    corrected = {k: p.grad for k, p in tm.named_parameters()}
    for k, gr in mine.items():
        scale = corrected[k].abs().max().clamp_min(1e-8)
        assert ((gr - corrected[k]).abs().max() / scale) < 1e-4, k
    assert max(float((mine[k] - trl_grads[k]).abs().max() / trl_grads[k].abs().max().clamp_min(1e-8))
               for k in mine) > 1e-3  # without the image-token term the gradients differ
