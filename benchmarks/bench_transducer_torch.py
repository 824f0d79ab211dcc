"""The transducer losses on the torch reference backend (``impl="torch"``, forward + backward, CPU).

Every torch transducer path runs the one torch lattice (:mod:`lightning_gtn.kernels.transducer_lattice_torch`).
One joiner output shape, (B=4, T=100, U=30, V=64) by default, the variants adding their extra
outputs. Rows:

* regular RNN-T (``rnnt_loss``);
* multi-blank RNN-T, big blanks [2, 4, 8];
* TDT, durations [0, 1, 2, 3, 4];
* k2's simple loss (``rnnt_loss_simple``: the ``px``/``py`` recursion over ``(B, U + 1, T + 1)``);
* the floor: torch's ``log_softmax`` forward + backward over the regular logits.

Median and minimum wall time (ms). Only the public API is used, so the script times any tree put first on
``PYTHONPATH`` (``--label`` names it in the table): run it under two trees in fresh processes,
back to back, to compare them.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from _timing import times_in_turn


def _times(fn, reps):
    """``(median, min)`` wall time of ``fn`` after a warm-up (the min is steadier on a loaded machine)."""
    fn()  # warm-up
    walls = [w for w, _ in times_in_turn([fn], reps)[0]]
    return statistics.median(walls), min(walls)


def _step(loss, *tensors):
    def run():
        leaves = [t.detach().requires_grad_() for t in tensors]
        loss(*leaves).backward()

    return run


def main(argv=None) -> str:
    import lightning_gtn.functional as F
    import lightning_gtn.k2 as k2

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--shape", type=int, nargs=4, default=[4, 100, 30, 64], metavar=("B", "T", "U", "V"))
    p.add_argument("--label", default="this tree", help="the tree's name in the table")
    p.add_argument("--skip", nargs="*", default=[], help="rows whose name contains one of these are skipped")
    args = p.parse_args(argv)
    reps = 2 if args.quick else 7
    B, T, U, V = args.shape
    g = torch.Generator().manual_seed(0)
    tg = torch.randint(1, V - 1, (B, U), generator=g)  # never a blank class of any row
    tl, ul = torch.full((B,), T), torch.full((B,), U)
    x = torch.randn(B, T, U + 1, V, generator=g)
    xm = torch.randn(B, T, U + 1, V + 3, generator=g)
    xt = torch.randn(B, T, U + 1, V + 5, generator=g)
    lm = torch.randn(B, U + 1, V, generator=g)
    am = torch.randn(B, T, V, generator=g)
    rows = [
        ("regular RNN-T", lambda a: F.rnnt_loss(a, tg, tl, ul, blank=0, impl="torch"), (x,)),
        ("multi-blank, big blanks [2, 4, 8]",
         lambda a: F.multiblank_rnnt_loss(a, tg, tl, ul, blank=-1, big_blank_durations=[2, 4, 8], impl="torch"), (xm,)),
        ("TDT, durations [0..4]",
         lambda a: F.tdt_loss(a, tg, tl, ul, blank=0, durations=[0, 1, 2, 3, 4], impl="torch"), (xt,)),
        ("k2 rnnt_loss_simple", lambda a, b: k2.rnnt_loss_simple(a, b, tg, 0, impl="torch"), (lm, am)),
        ("floor: log_softmax fwd+bwd", lambda a: a.log_softmax(-1).sum(), (x,)),
    ]  # fmt: skip
    lines = [
        f"### Transducer losses, impl='torch' ({args.label}, forward + backward)",
        "",
        f"B={B}, T={T}, U={U}, V={V} (+ the variant's extra outputs), torch threads {torch.get_num_threads()}.",
        "",
        "| loss | median (ms) | min (ms) |",
        "|---|---:|---:|",
    ]
    for name, fn, tensors in rows:
        if any(s in name for s in args.skip):
            continue
        med, low = _times(_step(fn, *tensors), reps)
        lines.append(f"| {name} | {med * 1e3:.1f} | {low * 1e3:.1f} |")
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
