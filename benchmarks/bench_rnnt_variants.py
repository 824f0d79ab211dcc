"""Multi-blank RNN-T and TDT against the regular RNN-T shape (forward + backward, CPU).

One joiner output shape, (B=8, T=150, U=40, V=128) by default (the issue's first RNN-T shape);
the variants add their extra outputs (3 big blanks [2, 4, 8]; 5 durations [0..4]). Rows:

* the regular RNN-T lattice (``multiblank_rnnt_loss`` without big blanks, the same kernel);
* multi-blank RNN-T, big blanks [2, 4, 8];
* TDT, durations [0, 1, 2, 3, 4] (and with ``omega=0.1``: a second, regular lattice mixed in);
* the floor: torch's ``log_softmax`` forward + backward over the same logits (every element read
  and a gradient written).

Median wall time of forward + backward with the numba kernel, and the ratio to the floor. Run
with ``OMP_WAIT_POLICY=PASSIVE`` on a machine with few cores (see ``bench_losses.py``). On a machine
with a CUDA device the same rows run again on the GPU with ``impl="triton"`` (synchronised wall
time; ``--gpu-only`` runs only those); without one that table says "no CUDA".
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lightning_gtn.functional import multiblank_rnnt_loss, tdt_loss


def _median(fn, reps):
    fn()  # warm-up (numba compiles or loads its cache)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _step(loss_fn, x, **kw):
    def run():
        xx = x.detach().requires_grad_()
        loss_fn(xx, **kw).backward()

    return run


def _floor(x):
    def run():
        xx = x.detach().requires_grad_()
        xx.log_softmax(-1).sum().backward()

    return run


def _cuda_median(fn, reps):
    fn()  # warm-up (Triton compiles its kernels)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _gpu_lines(rows, common, B, T, U, V, reps) -> list:
    title = "### Multi-blank RNN-T and TDT (CUDA, impl='triton', forward + backward)"
    if not torch.cuda.is_available():
        print("no CUDA: the Triton rows are skipped")
        return ["", title, "", "no CUDA: skipped"]
    dev = torch.device("cuda")
    on_dev = {k: v.to(dev) for k, v in common.items()}
    lines = ["", title, "", f"{torch.cuda.get_device_name(0)}, B={B}, T={T}, U={U}, V={V}.", ""]
    lines += [
        "| loss | classes | time (ms) | log_softmax fwd+bwd floor (ms) | time / floor |",
        "|---|---:|---:|---:|---:|",
    ]
    g = torch.Generator().manual_seed(1)
    for name, classes, fn, kw in rows:
        x = torch.randn(B, T, U + 1, classes, generator=g).to(dev)
        t = _cuda_median(_step(fn, x, **on_dev, **kw, impl="triton"), reps)
        f = _cuda_median(_floor(x), reps)
        lines.append(f"| {name} | {classes} | {t * 1e3:.2f} | {f * 1e3:.2f} | {t / f:.1f}x |")
    return lines


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--shape", type=int, nargs=4, default=[8, 150, 40, 128], metavar=("B", "T", "U", "V"))
    p.add_argument("--gpu-only", action="store_true", help="only the CUDA table (impl='triton')")
    args = p.parse_args(argv)
    reps = 2 if args.quick else 5
    B, T, U, V = args.shape
    g = torch.Generator().manual_seed(0)
    targets = torch.randint(1, V - 1, (B, U), generator=g)  # never a blank class of any row
    common = dict(targets=targets, logit_lengths=torch.full((B,), T), target_lengths=torch.full((B,), U))
    bigs, durs = [2, 4, 8], [0, 1, 2, 3, 4]
    rows = [
        ("regular RNN-T (no big blanks)", V, multiblank_rnnt_loss, dict(blank=0)),
        ("multi-blank, big blanks [2, 4, 8]", V + 3, multiblank_rnnt_loss,
         dict(blank=-1, big_blank_durations=bigs, sigma=0.05)),
        ("TDT, durations [0..4]", V + 5, tdt_loss, dict(blank=0, durations=durs, sigma=0.05)),
        ("TDT, durations [0..4], omega=0.1", V + 5, tdt_loss, dict(blank=0, durations=durs, sigma=0.05, omega=0.1)),
    ]  # fmt: skip
    if args.gpu_only:
        table = "\n".join(_gpu_lines(rows, common, B, T, U, V, max(reps, 5))[1:])
        print(table)
        return table
    lines = [
        "### Multi-blank RNN-T and TDT (numba, forward + backward)",
        "",
        f"B={B}, T={T}, U={U}, V={V} (+ the variant's extra outputs), targets avoiding the blank classes.",
        "",
        "| loss | classes | time (ms) | log_softmax fwd+bwd floor (ms) | time / floor |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, classes, fn, kw in rows:
        x = torch.randn(B, T, U + 1, classes, generator=g)
        t = _median(_step(fn, x, **common, **kw), reps)
        f = _median(_floor(x), reps)
        lines.append(f"| {name} | {classes} | {t * 1e3:.1f} | {f * 1e3:.1f} | {t / f:.1f}x |")
    lines += _gpu_lines(rows, common, B, T, U, V, max(reps, 5))
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
