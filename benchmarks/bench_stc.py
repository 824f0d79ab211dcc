"""STC: batched ``stc_loss`` against the research code's per-example pattern on the engine.

The research pattern (gtn_applications' ``STC`` criterion) run on :mod:`lightning_gtn.wfst`:
the star columns are computed with torch ops once for the batch, then per example (over
``gtn.parallel_for``) the STC graph of the target is built in Python, intersected with a linear
graph of the augmented emissions, scored with ``forward_score`` and differentiated with
``gtn.backward``. Both sides compute the same losses and emission gradients (checked below).

Inputs: batch 32, T in 100..150, C = 28 letters + blank, targets of 20-40 tokens, p = 0.5.
Columns: forward + backward median wall time of ``stc_loss`` with the criterion graphs cached
(a training loop meets the same transcripts every epoch: "warm") and cold (caches emptied), the
research pattern's time and the ratio research / warm. Run with ``OMP_WAIT_POLICY=PASSIVE`` on a
machine with few cores (see ``bench_losses.py``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
import torch

import lightning_gtn.wfst as gtn
from lightning_gtn.core import criterion_graphs
from lightning_gtn.functional import stc_loss
from lightning_gtn.losses.stc import stc_emissions, stc_graph

B, C, P = 32, 29, 0.5


def make_batch(seed: int):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(100, 151, size=B)
    T = int(lengths.max())
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(seed)).log_softmax(-1)
    targets = [list(rng.integers(1, C, size=int(rng.integers(20, 41)))) for _ in range(B)]
    return x, targets, torch.from_numpy(lengths)


def research(x, targets, lengths):
    """forward + backward of the per-example pattern: ``(losses (B,), grad (B, T, C))``."""
    xx = x.detach().clone().requires_grad_()
    aug = stc_emissions(xx, 0, math.log(P))  # (B, T, 2C), torch ops as in the research code
    a = aug.detach()
    T = a.shape[1]
    losses, ems = [None] * B, [None] * B

    def process(b):
        Tb = int(lengths[b])
        em = gtn.linear_graph(Tb, 2 * C, gtn.Device(gtn.CPU), True)
        em.set_weights(a[b, :Tb].contiguous().numpy())
        g = stc_graph(targets[b], 0, C, 0.0, gtn=gtn)
        losses[b] = gtn.negate(gtn.forward_score(gtn.intersect(g, em)))
        ems[b] = em

    gtn.parallel_for(process, range(B))
    g_aug = torch.zeros(B, T, 2 * C)

    def back(b):
        gtn.backward(losses[b])
        Tb = int(lengths[b])
        g_aug[b, :Tb] = torch.from_numpy(ems[b].grad().weights_to_numpy()).view(Tb, 2 * C)

    gtn.parallel_for(back, range(B))
    aug.backward(g_aug)
    return torch.tensor([l.item() for l in losses]), xx.grad


def ours(x, targets, lengths):
    xx = x.detach().clone().requires_grad_()
    out = stc_loss(xx, targets, lengths, p=P, reduction="none")
    out.sum().backward()
    return out.detach(), xx.grad


def _median(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = p.parse_args(argv)
    reps = 2 if args.quick else 5
    x, targets, lengths = make_batch(0)
    l_ours, g_ours = ours(x, targets, lengths)
    l_res, g_res = research(x, targets, lengths)
    err = max(float((l_ours - l_res).abs().max()), float((g_ours - g_res).abs().max()))
    warm = _median(lambda: ours(x, targets, lengths), reps)

    def cold():
        criterion_graphs.clear_cache()
        ours(x, targets, lengths)

    cold_t = _median(cold, reps)
    res_t = _median(lambda: research(x, targets, lengths), max(2, reps // 2))
    lines = [
        "### STC: batched against the per-example research pattern (forward + backward)",
        "",
        f"B={B}, T 100..150, C={C} (+{C} star columns), targets of 20-40 tokens, p={P}; largest difference of "
        f"losses and gradients between the two: {err:.1e}.",
        "",
        "| stc_loss warm (ms) | stc_loss cold (ms) | research pattern on lightning_gtn.wfst (ms) | research / warm |",
        "|---:|---:|---:|---:|",
        f"| {warm * 1e3:.1f} | {cold_t * 1e3:.1f} | {res_t * 1e3:.1f} | {res_t / warm:.1f}x |",
    ]
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
