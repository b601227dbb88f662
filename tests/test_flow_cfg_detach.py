"""``cfg_detach_uncond`` of the rectified-flow image policies (policies/_image/flow.py, sde.guided): with guidance
w the detached form's gradient is w·∂v_c alone, the default's is w·∂v_c + (1 − w)·∂v_u; the values (velocity,
log-probs, ratios, samples) are the same. Expected gradients come from separate conditional and unconditional
calls of the network, combined by hand."""
import pytest
import torch

from _helpers import image_policy

pytest.importorskip("diffusers")

W = 3.0


def _grads(module, loss):
    """The gradient of ``loss`` w.r.t. every parameter of ``module``, flattened into one vector."""
    params = [p for p in module.parameters() if p.requires_grad]
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params, retain_graph=True)])


def _unet():
    from grpolab.policies._image.digits import build_tiny_unet
    return build_tiny_unet("flow", seed=0).float()


def _unet_branches(module, x, sigma, labels):
    """v_c and v_u of the UNet by two separate calls (label 10 is the unconditional class)."""
    t = sigma * 1000
    return (module(x, t, class_labels=labels).sample, module(x, t, class_labels=torch.full_like(labels, 10)).sample)


def test_unet_velocity_gradient_is_w_times_the_conditional_branch_when_detached():
    from grpolab.policies._image.flow import unet_velocity

    torch.manual_seed(0)
    module = _unet()
    x, sigma, labels = torch.randn(3, 1, 8, 8), torch.tensor([0.9, 0.5, 0.2]), torch.tensor([0, 4, 7])
    c = torch.randn(3, 1, 8, 8)  # a fixed cotangent: L = <c, v>
    v_c, v_u = _unet_branches(module, x, sigma, labels)
    g_c, g_u = _grads(module, (c * v_c).sum()), _grads(module, (c * v_u).sum())
    v_det = unet_velocity(module, x, sigma, labels, W, detach_uncond=True)
    v_old = unet_velocity(module, x, sigma, labels, W, detach_uncond=False)
    assert torch.allclose(v_det, v_old) and torch.allclose(v_det, (v_u + W * (v_c - v_u)).detach(), atol=1e-5)
    g_det, g_old = _grads(module, (c * v_det).sum()), _grads(module, (c * v_old).sum())
    scale = g_c.abs().max()
    assert (g_det - W * g_c).abs().max() < 1e-4 * scale
    assert (g_old - (W * g_c + (1 - W) * g_u)).abs().max() < 1e-4 * scale
    assert (g_old - g_det - (1 - W) * g_u).abs().max() < 1e-4 * scale  # the old form's extra (1 - w)·dv_u
    assert abs(1 - W) * g_u.abs().max() > 1e-2 * scale  # ... which is not negligible here


class _TinyTransformer(torch.nn.Module):
    """v = A x + B pooled (per row): enough to tell the two branches' gradients apart."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(3, 4, bias=False)

    def forward(self, x, pooled):
        return self.a(x) + self.b(pooled)


def _adapter():
    from types import SimpleNamespace

    from grpolab.policies._image.pipelines_flow import FlowPipeline

    class Adapter(FlowPipeline):
        def sigmas(self, steps):
            return torch.linspace(1, 0, steps + 1)

        def frozen_to(self, device):
            pass

        def encode_unique(self, prompts, device):
            pooled = torch.tensor([[float(len(p)), 1.0, -float(len(p))] for p in prompts])
            return pooled[:, None, :].repeat(1, 2, 1), pooled

        def call(self, module, x, sigma, cond, w):
            return module(x, cond["pooled_prompt_embeds"])

    torch.manual_seed(1)
    return Adapter(SimpleNamespace(transformer=_TinyTransformer()), "tiny", 1.0)


def test_a_pipelines_velocity_gradient_is_w_times_the_conditional_branch_when_detached():
    ad = _adapter()
    module = ad.module
    x, sigma = torch.randn(2, 4), torch.tensor([0.8, 0.3])
    cond = ad.encode(["a cat", "a dog on a mat"], "cpu")
    neg = ad.negative("cpu")
    c = torch.randn(2, 4)
    v_c = module(x, cond["pooled_prompt_embeds"])
    v_u = module(x, neg["pooled_prompt_embeds"].expand(2, 3))
    g_c, g_u = _grads(module, (c * v_c).sum()), _grads(module, (c * v_u).sum())
    v_det = ad.velocity(module, x, sigma, cond, W, detach_uncond=True)
    v_old = ad.velocity(module, x, sigma, cond, W)
    assert torch.allclose(v_det, v_old) and torch.allclose(v_det, (v_u + W * (v_c - v_u)).detach(), atol=1e-6)
    assert torch.allclose(_grads(module, (c * v_det).sum()), W * g_c, atol=1e-5)
    assert torch.allclose(_grads(module, (c * v_old).sum()), W * g_c + (1 - W) * g_u, atol=1e-5)


def _policies():
    """The default flow_matching policy and the detached one, both at guidance w = 3, on one untrained UNet."""
    _, default = image_policy("flow_matching", guidance_scale=W)
    _, detached = image_policy("flow_matching", guidance_scale=W, cfg_detach_uncond=True)
    assert default.detach_uncond is False and detached.detach_uncond is True  # the default: both branches
    return default, detached, _unet()


def test_sampling_is_the_same_and_the_training_logprob_values_are_the_same():
    default, detached, module = _policies()
    rows = [{"prompt": str(i), "label": i} for i in range(2)]
    batches = [p.sample(module, rows, [0, 1], num_generations=2, temperature=1.0,
                        generator=torch.Generator().manual_seed(0)) for p in (default, detached)]
    assert torch.equal(batches[0].step_data["x_next"], batches[1].step_data["x_next"])
    assert torch.equal(batches[0].behavior_logprobs, batches[1].behavior_logprobs)
    b = batches[0]
    lp = [p.forward(module, b)["logprobs"] for p in (default, detached)]
    assert torch.equal(lp[0], lp[1])
    ratio = torch.exp(lp[1] - b.behavior_logprobs)  # step 0 of the update: ratio 1 either way
    assert (ratio - 1).abs().max() < 1e-4


def test_the_training_logprob_gradient_by_hand():
    """grad Σ log p under each form = the hand chain rule with v_u detached or not (sde.flow_grpo_step on a
    velocity combined by hand from separate conditional / unconditional calls)."""
    from grpolab.policies._image import sde

    default, detached, module = _policies()
    rows = [{"prompt": "3", "label": 3}]
    b = default.sample(module, rows, [0], num_generations=2, temperature=1.0, generator=torch.Generator().manual_seed(1))
    j = 1
    b.completion_mask.zero_()
    b.completion_mask[:, j] = 1
    x, xn = b.step_data["x"][:, j], b.step_data["x_next"][:, j]
    sig, nxt = b.step_data["sigma"][:, j], b.step_data["sigma_next"][:, j]
    v_c, v_u = _unet_branches(module, x, sig, b.row_data["cond"])

    def hand(v):
        out = sde.flow_grpo_step(x, v, sig, nxt, default.a, sigma_max_sub=float(default.sigmas[1]), x_next=xn)
        return out.logprob.sum()

    want_det = _grads(module, hand(v_u.detach() + W * (v_c - v_u.detach())))
    want_old = _grads(module, hand(v_u + W * (v_c - v_u)))
    got_det = _grads(module, detached.forward(module, b)["logprobs"].sum())
    got_old = _grads(module, default.forward(module, b)["logprobs"].sum())
    scale = want_old.abs().max()
    assert (got_det - want_det).abs().max() < 1e-4 * scale and (got_old - want_old).abs().max() < 1e-4 * scale
    assert (got_old - got_det).abs().max() > 1e-2 * scale  # the (1 - w)·dv_u term the two forms differ by
