"""Probe an image policy's policy gradient on the digits confidence reward: estimate it from 4 batches (10 classes
x N images, advantages r - group mean, summed step log-probs), then move the weights a fixed L2 length along it
(+) and against it (-) and measure the expected reward on 10 x 200 fresh seeded draws. A correct gradient raises
the reward for a small step and lowers it for the opposite one (docs/images.md, "Why the learning rates are
small").

    python scripts/gradient_probe.py --policy ar_image --lengths 0.01 0.03 0.1
    python scripts/gradient_probe.py --policy ddpm --lengths 0.01 0.03 0.1
"""
import argparse
import copy

import torch

from grpolab.policies._image.tasks import digit_confidence


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", choices=["ar_image", "ddpm"], default="ar_image")
    ap.add_argument("--lengths", type=float, nargs="+", default=[0.01, 0.03, 0.1])
    ap.add_argument("--per_class", type=int, default=64, help="images per class in each gradient batch")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.policy == "ar_image":
        from grpolab.policies.ar_image.policy import ARImagePolicy
        pol = ARImagePolicy(model="digits", temperature=1.0, top_k=0, top_p=1.0)
    else:
        from grpolab.policies.ddpm.policy import DDPMPolicy
        pol = DDPMPolicy(model="digits")
    model = pol.load(None, [], [], log=lambda *x: None)
    print(f"{a.policy}: {sum(p.numel() for p in model.parameters()):,} parameters")
    rows = [{"label": c, "prompt": str(c)} for c in range(10)]

    def draw(m, n, seed):
        b = pol.sample(m, rows, list(range(10)), num_generations=n, generator=torch.Generator().manual_seed(seed))
        return b, torch.tensor(digit_confidence(completions=b.columns["completion"], label=b.columns["label"]))

    grads = []
    for seed in range(1, 5):
        b, r = draw(model, a.per_class, seed)
        adv = (r.view(10, -1) - r.view(10, -1).mean(1, keepdim=True)).view(-1)
        model.zero_grad()
        (-(adv[:, None] * pol.forward(model, b)["logprobs"]).sum(1).mean()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    g = torch.stack(grads).mean(0)
    g = g / g.norm()
    base = draw(model, 200, 99)[1].mean().item()
    for length in a.lengths:
        for sign in (1, -1):
            m = copy.deepcopy(model)
            with torch.no_grad():
                flat = torch.nn.utils.parameters_to_vector(m.parameters())
                torch.nn.utils.vector_to_parameters(flat - sign * length * g, m.parameters())
            print(f"step {'+' if sign > 0 else '-'}{length}: expected reward {draw(m, 200, 99)[1].mean().item():.4f} "
                  f"(before {base:.4f})")


if __name__ == "__main__":
    main()
