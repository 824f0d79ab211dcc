"""The GTN documentation's pattern for a custom loss, running on ``import lightning_gtn.wfst as gtn``.

This is how loss functions are written for the ``gtn`` package: a ``torch.autograd.Function``
that copies the emissions to the host, builds one emissions graph and one criterion graph per
example, scores them in a ``gtn.parallel_for`` over the batch, and calls ``gtn.backward`` in
``backward``. Code in this style runs unchanged on lightning_gtn's engine; only the import differs.

The criterion is the alignment-free sequence loss: every target token covers one or more
consecutive frames, and the loss is the log-partition of all label paths minus that of the
target's paths. The script checks the result against the batched
:func:`lightning_gtn.functional.sequence_loss` and trains a linear layer on random data for a
few steps.

Run:  python examples/gtn_loss_function.py [--batch 4 --frames 12 --classes 6 --steps 20]
"""

from __future__ import annotations

import argparse

import torch

import lightning_gtn.wfst as gtn


def target_graph(tokens) -> gtn.Graph:
    """Chain acceptor: node ``i`` -> ``i + 1`` reads ``tokens[i]``, and ``i + 1`` loops on it."""
    g = gtn.Graph(False)
    g.add_node(True, len(tokens) == 0)
    for i, tok in enumerate(tokens):
        g.add_node(False, i == len(tokens) - 1)
        g.add_arc(i, i + 1, int(tok))
        g.add_arc(i + 1, i + 1, int(tok))
    g.arc_sort(True)
    return g


class SequenceCriterion(torch.autograd.Function):
    """Per-example losses ``(B,)`` of emissions ``(B, T, C)`` against targets ``(B, U)``."""

    @staticmethod
    def forward(ctx, emissions, targets):
        B, T, C = emissions.shape
        device = emissions.device
        host = emissions.detach().to("cpu", torch.float32).contiguous()
        tokens = targets.cpu().tolist()
        losses, graphs = [None] * B, [None] * B

        def one(b):
            # GTN's docs: linear_graph(T, C, calc_grad); newer GTN also takes a device third
            em = gtn.linear_graph(T, C, emissions.requires_grad)
            em.set_weights(host[b].data_ptr())  # host[b] stays referenced until set_weights copies
            target_score = gtn.forward_score(gtn.intersect(target_graph(tokens[b]), em))
            partition = gtn.forward_score(em)
            losses[b] = gtn.subtract(partition, target_score)
            graphs[b] = em

        gtn.parallel_for(one, range(B))
        ctx.saved = (losses, graphs, (B, T, C), emissions.dtype)
        return torch.tensor([loss.item() for loss in losses], dtype=emissions.dtype, device=device)

    @staticmethod
    def backward(ctx, grad_output):
        losses, graphs, (B, T, C), dtype = ctx.saved
        grad = torch.empty(B, T, C)

        def one(b):
            gtn.backward(losses[b])
            grad[b] = torch.from_numpy(graphs[b].grad().weights_to_numpy()).view(T, C)

        gtn.parallel_for(one, range(B))
        grad = grad.to(device=grad_output.device, dtype=dtype)
        return grad_output.view(B, 1, 1) * grad, None


def sequence_criterion(emissions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Losses ``(B,)``; see :class:`SequenceCriterion`."""
    return SequenceCriterion.apply(emissions, targets)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--frames", type=int, default=12)
    p.add_argument("--classes", type=int, default=6)
    p.add_argument("--target-length", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    from lightning_gtn.functional import sequence_loss

    torch.manual_seed(a.seed)
    B, T, C, U = a.batch, a.frames, a.classes, a.target_length
    emissions = torch.randn(B, T, C, requires_grad=True)
    targets = torch.randint(0, C, (B, U))

    # 1. The GTN-style Function against the batched loss of lightning_gtn.functional.
    ours = sequence_criterion(emissions, targets)
    ours.sum().backward()
    grad_gtn_style = emissions.grad.clone()
    emissions.grad = None
    batched = sequence_loss(emissions, targets, torch.full((B,), T), torch.full((B,), U), reduction="none")
    batched.sum().backward()
    max_diff = float((ours - batched).detach().abs().max())
    max_grad_diff = float((grad_gtn_style - emissions.grad).abs().max())
    print(f"GTN-style losses {ours.detach().numpy().round(4)}")
    print(f"batched losses   {batched.detach().numpy().round(4)}")
    print(f"max |loss diff| {max_diff:.2e}, max |grad diff| {max_grad_diff:.2e}")

    # 2. Train a linear layer with it for a few steps: the loss goes down.
    features = torch.randn(B, T, 8)
    layer = torch.nn.Linear(8, C)
    opt = torch.optim.Adam(layer.parameters(), lr=0.1)
    history = []
    for _ in range(a.steps):
        loss = sequence_criterion(layer(features).log_softmax(-1), targets).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(loss.item())
    print(f"training loss {history[0]:.3f} -> {history[-1]:.3f} in {a.steps} steps")
    return {"max_diff": max_diff, "max_grad_diff": max_grad_diff, "first_loss": history[0], "last_loss": history[-1]}


if __name__ == "__main__":
    main()
