"""The generic lattice against the specialised RNN-T kernel, on the CPU.

RNN-T at ``(B, T, U, V)`` with full lengths, blank 0, float32 logits ``(B, T, U + 1, V)``, scored
three ways: ``rnnt_loss`` (the specialised kernel, log-softmax fused), ``rnnt_lattice_loss`` (one
:func:`rnnt_lattice` per example built and cached inside the custom op, torch's ``log_softmax``
before it), and ``lattice_loss`` over lattices built afresh each call (``rnnt_lattice`` included
in the time); plus torch's ``log_softmax`` forward + backward over the same logits (the floor).
A pruned row scores ``(B, T, s_range, V)`` through :func:`pruned_rnnt_lattice` with a diagonal band.

Each time is the best of ``--repeats`` wall times of a forward + backward after one warm-up call.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

SHAPES = [(8, 150, 40, 128), (4, 500, 100, 500)]


def _best(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _row(B, T, U, V, repeats):
    from lightning_gtn.functional import lattice_loss, rnnt_lattice, rnnt_lattice_loss, rnnt_loss

    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, U + 1, V, generator=g)
    tg = torch.randint(1, V, (B, U), generator=g)
    il = torch.full((B,), T)
    tl = torch.full((B,), U)
    ones = torch.ones_like(x)

    def special():
        z = x.detach().requires_grad_()
        rnnt_loss(z, tg, il, tl, blank=0).backward()

    def cached():
        z = x.detach().requires_grad_()
        rnnt_lattice_loss(z, tg, il, tl, blank=0).backward()

    def fresh():
        z = x.detach().requires_grad_()
        lats = [rnnt_lattice(T, U, tg[b], V, 0) for b in range(B)]
        lattice_loss(z.log_softmax(-1), lats).backward()

    def floor():
        z = x.detach().requires_grad_()
        torch.autograd.grad(torch.log_softmax(z, -1), z, ones)

    return [_best(f, repeats) for f in (special, cached, fresh, floor)]


def _pruned_row(B, T, U, V, s_range, repeats):
    from lightning_gtn.functional import lattice_loss, pruned_rnnt_lattice

    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, s_range, V, generator=g)
    tg = torch.randint(1, V, (B, U), generator=g)
    ranges = np.minimum((np.arange(T) * (U + 1)) // T, max(U + 1 - s_range, 0))  # a band along the diagonal
    lats = [pruned_rnnt_lattice(ranges, s_range, tg[b], V, 0) for b in range(B)]

    def run():
        z = x.detach().requires_grad_()
        lattice_loss(z.log_softmax(-1), lats).backward()

    return _best(run, repeats)


def main(argv=None) -> str:
    """Prints and returns the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the first shape only")
    args = ap.parse_args(argv)
    shapes = SHAPES[:1] if args.quick else SHAPES
    lines = [
        "| B, T, U, V | rnnt_loss (s) | rnnt_lattice_loss (s) | lattice_loss, lattices built (s) "
        "| log_softmax f+b (s) | lattice / rnnt_loss |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for B, T, U, V in shapes:
        sp, ca, fr, fl = _row(B, T, U, V, args.repeats)
        lines.append(f"| {B}, {T}, {U}, {V} | {sp:.3f} | {ca:.3f} | {fr:.3f} | {fl:.3f} | {ca / sp:.1f} |")
    B, T, U, V = shapes[-1]
    pr = _pruned_row(B, T, U, V, 5, args.repeats)
    lines.append("")
    lines.append(f"pruned lattice, s_range 5, at {B}, {T}, {U}, {V}: {pr:.3f} s (lattice_loss over (B, T, 5, V))")
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
