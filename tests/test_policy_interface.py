"""The policy interface (grpolab/policies/): the causal LM as one policy kind, and what components need of one."""
import re

import pytest
import torch

from grpolab.components import Component
from grpolab.config import Config, ConfigError
from grpolab.model.logprobs import completion_logprobs
from grpolab.policies import CAPABILITIES, POLICIES, PolicyBase
from grpolab.registry import ALL_REGISTRIES, REGULARIZERS


def test_the_causal_lm_is_the_default_policy_and_lists_its_capabilities():
    cfg = Config.build({"model": "tiny"})
    assert cfg.policy == "causal_lm" and "policy" in ALL_REGISTRIES
    lm = POLICIES.get("causal_lm")
    assert lm.step == "token" and lm.capabilities == {"tokens", "text"} <= set(CAPABILITIES)
    with pytest.raises(ConfigError, match="policy: 'pixels' is not valid; valid values: .*causal_lm.*flow_matching"):
        Config.build({"model": "tiny", "policy": "pixels"})


def test_every_declared_need_is_a_known_capability():
    unknown = [f"{kind}/{name}: {reg.needs(name)}" for kind, reg in ALL_REGISTRIES.items() for name, _ in reg.items()
               if not set(reg.needs(name)) <= set(CAPABILITIES)]
    assert not unknown


@pytest.fixture
def vector_policy():
    """A policy kind with no text and no tokens, registered for one test (conftest removes it after)."""
    @POLICIES.register("test_vector")
    class VectorPolicy(PolicyBase):
        """A test policy: real-valued actions, no tokens."""
        step = "action"
        capabilities = frozenset({"vectors"})
        description = "a test policy with vector actions"
    return VectorPolicy


def test_a_component_needing_text_is_refused_with_a_policy_without_it(vector_policy):
    @REGULARIZERS.register("test_text_bonus", needs=("text",))
    def text_bonus(logprobs, mask):
        return torch.zeros_like(logprobs), {}

    with pytest.raises(ConfigError) as e:  # --data: no built-in task (every one needs text) is selected
        Config.build({"model": "tiny", "policy": "test_vector", "data": "rows.jsonl", "reward": ["m:f"],
                      "regularizers": ["test_text_bonus"]})
    msg = str(e.value)
    assert "regularizer 'test_text_bonus' needs a policy with text" in msg
    assert "policy 'test_vector' (a test policy with vector actions) has vectors" in msg
    # the fix names every registered policy that has text (causal_lm first), then the way out
    assert re.search(r"Use policy causal_lm( or [a-z_]+)*, or leave 'test_text_bonus' out \(regularizers\)", msg), msg
    # with the causal LM (which has text) the same selection is valid
    assert Config.build({"model": "tiny", "regularizers": ["test_text_bonus"]}).regularizers == ["test_text_bonus"]


def _tiny_batch():
    from grpolab.data import model_texts
    from grpolab.generation.plain import plain_rollout
    from grpolab.model.loading import load_policy
    from grpolab.tasks import get_task

    rows = get_task("repeat").train_rows[:3]
    model, tok = load_policy("tiny", task_texts=model_texts(rows), seed=0, log=lambda *a: None)
    batch = plain_rollout(model.eval(), tok, rows, [0, 1, 2], num_generations=2, max_completion_length=5,
                          max_prompt_length=64, temperature=1.0, generator=torch.Generator().manual_seed(0))
    return model, batch


@pytest.mark.parametrize("shared", [True, False])
def test_causal_lm_forward_is_the_token_logprob_and_entropy(shared):
    model, batch = _tiny_batch()
    cfg = Config.build({"model": "tiny", "temperature": 0.8, "shared_prefix_forward": shared})
    lm = Component(POLICIES.get("causal_lm"), cfg, "causal_lm").fn
    logp, ent = completion_logprobs(model, batch, 0.8, with_entropy=True, shared_prefix=shared)
    out = lm.forward(model, batch, want=frozenset({"entropy"}))
    assert set(out) == {"logprobs", "entropy", "entropy_grad"}
    assert torch.equal(out["logprobs"], logp) and torch.equal(out["entropy"], ent)
    assert not out["entropy_grad"].requires_grad  # the entropy carries gradients only when asked for
    assert out["logprobs"].requires_grad
    assert lm.forward(model, batch, want=frozenset({"entropy_grad"}))["entropy_grad"].requires_grad
    assert set(lm.forward(model, batch)) == {"logprobs"}
    # no gradients, micro-batched, zero off the mask: the behaviour log-probs of a batch
    no_grad = lm.logprobs(model, batch, micro_batch_size=2)
    assert not no_grad.requires_grad
    torch.testing.assert_close(no_grad, (logp * batch.completion_attention_mask).detach(), rtol=1e-5, atol=1e-6)


def test_the_trainer_asks_the_policy_for_what_its_loss_components_take(tiny_args):
    from grpolab.train.trainer import Trainer

    t = Trainer(Config.build({**tiny_args, "steps": 1}), log=lambda *a: None)
    assert t.policy is t.ctx.actions and type(t.policy).__name__ == "CausalLMPolicy"
    assert t.loss_wants == {"entropy"}  # the entropy metric; no component differentiates through it
    t = Trainer(Config.build({**tiny_args, "steps": 1, "regularizers": ["entropy_bonus"]}), log=lambda *a: None)
    wants = {p.name for p in t.regularizers[0].params} & {"entropy", "entropy_grad"}
    assert t.loss_wants == {"entropy"} | wants
