"""The shared LF-MMI denominator on a CUDA device: ``mmi_denominator_score`` forward + backward on
CUDA tensors by its default path (the Triton kernels, :mod:`lightning_gtn.kernels.mmi_triton`) and
by the torch path (:mod:`lightning_gtn.kernels.mmi_torch`, ``impl="torch"``), against the same
denominator scored per example by the generic ``graph_loss`` on the device (its Triton scorer), and
the CPU kernel on the same inputs.

The graphs and inputs are ``bench_mmi.py``'s: a character bigram (30 tokens) and a 200-word-piece
bigram in the CTC topology, ``(B, T) = (32, 500)``, float32 log-softmax emissions. Times are the
median of ``--repeats`` calls after a warm-up, each ended by ``torch.cuda.synchronize()``; every
path scores all ``B`` rows. ``make gpu-check`` runs it; without a CUDA device it says so and exits.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_mmi import GRAPHS, B, T, bigram_ctc  # noqa: E402

from lightning_gtn.functional import graph_loss, mmi_denominator_score  # noqa: E402


def _median(fn, repeats: int, cuda: bool) -> float:
    fn()
    if cuda:
        torch.cuda.synchronize()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


def _shared(den, x: torch.Tensor, impl=None):
    def run() -> None:
        z = x.detach().requires_grad_()
        lengths = torch.full((x.shape[0],), x.shape[1], device=x.device)
        mmi_denominator_score(z, lengths, den, impl=impl).sum().backward()

    return run


def _generic(den, x: torch.Tensor):
    def run() -> None:
        z = x.detach().requires_grad_()
        lengths = torch.full((x.shape[0],), x.shape[1], device=x.device)
        graph_loss(z, graphs=[den] * x.shape[0], input_lengths=lengths, reduction="sum").backward()

    return run


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gpu-only", action="store_true", help="accepted for make gpu-check's uniformity")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_mmi_gpu: no CUDA device here")
        return ""
    dev = torch.device("cuda")
    rows = []
    for name, N, keep in GRAPHS:
        den = bigram_ctc(N, keep)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(B, T, N + 1, generator=g).log_softmax(-1)
        xg = x.to(dev)
        shared = _median(_shared(den, xg), args.repeats, True)
        torch_path = _median(_shared(den, xg, "torch"), max(1, args.repeats // 2), True)
        generic = _median(_generic(den, xg), max(1, args.repeats // 2), True)
        cpu = _median(_shared(den, x), max(1, args.repeats // 2), False)
        rows.append((name, den.num_arcs(), shared, torch_path, generic, cpu))
        print(
            f"  {name}: shared {shared * 1e3:.2f} ms, torch path {torch_path * 1e3:.1f} ms, "
            f"generic {generic * 1e3:.1f} ms, CPU {cpu * 1e3:.1f} ms",
            flush=True,
        )
    head = (
        f"\nShared MMI denominator on {torch.cuda.get_device_name()} (torch {torch.__version__}), "
        f"B={B}, T={T}, float32, forward + backward, median of {args.repeats}\n\n"
        "| graph | arcs | shared, Triton (ms) | shared, torch path (ms) | generic graph_loss (ms) "
        "| generic / shared | CPU kernel (ms) |\n"
        "|---|---:|---:|---:|---:|---:|---:|\n"
    )
    body = "".join(
        f"| {n} | {a:,} | {s * 1e3:.2f} | {tp * 1e3:.1f} | {g * 1e3:.1f} | {g / s:.1f}x | {c * 1e3:.1f} |\n"
        for n, a, s, tp, g, c in rows
    )
    text = head + body
    print(text)
    return text


if __name__ == "__main__":
    main()
