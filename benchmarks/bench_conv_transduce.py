"""lightning_gtn.nn.ConvTransduce1D against the research layer's pattern on lightning_gtn.wfst.

Forward + backward (input and kernel-weight gradients) of the WFST convolution: batch 32,
T = 100, C_in = 30 (blank 0), kernel 9, stride 4 (25 windows per example), lexicons of 100 and
500 random entries of 1 to 5 letters. The reference is the research code's loop: per window a
linear graph, per kernel an intersection and a forward (or Viterbi) score, then ``gtn.backward``
of every output. It is timed on the first ``--ref-windows`` windows and scaled linearly to the
whole batch (its cost is the same for every window), which the table says.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch

import lightning_gtn.wfst as gtn
from lightning_gtn.functional import kernel_graph
from lightning_gtn.nn import ConvTransduce1D

B, T, C, K, STRIDE = 32, 100, 30, 9, 4


def lexicon(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [list(rng.integers(1, C, size=int(rng.integers(1, 6)))) for _ in range(n)]


def ours_step(layer, x):
    def run():
        x.grad = None
        layer.kernel_params.grad = None
        layer(x).sum().backward()

    return run


def reference_step(layer, x, windows: int):
    """The research pattern on the first ``windows`` windows (example-major)."""
    kernels = [kernel_graph(lex, 0, layer.blank_optional, layer.spike) for lex in layer.lexicon]
    params = layer.kernel_params.detach().float().numpy()
    pad = K // 2

    def run():
        s = 0
        for k in kernels:
            n = k.num_arcs()
            k.set_weights(params[s : s + n])
            k.calc_grad = True
            k.zero_grad()
            s += n
        xp = torch.nn.functional.pad(x.detach(), (0, 0, pad, pad)).float().numpy()
        grad = np.zeros_like(xp)
        done = 0
        score = gtn.viterbi_score if layer.viterbi else gtn.forward_score
        for b in range(B):
            for t in range(0, xp.shape[1] - K + 1, STRIDE):
                if done == windows:
                    return grad
                g_in = gtn.linear_graph(K, C, gtn.Device(gtn.CPU), True)
                g_in.set_weights(np.ascontiguousarray(xp[b, t : t + K]).reshape(-1))
                outs = [score(gtn.intersect(g_in, k)) for k in kernels]
                for o in outs:
                    gtn.backward(o, gtn.scalar_graph(1.0, calc_grad=False))
                grad[b, t : t + K] += g_in.grad().weights_to_numpy().reshape(K, C)
                done += 1
        return grad

    return run


def _median(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer repetitions and reference windows")
    p.add_argument("--ref-windows", type=int, default=None, help="windows the reference is timed on")
    args = p.parse_args(argv)
    reps = 3 if args.quick else 7
    ref_windows = args.ref_windows or (4 if args.quick else 16)
    total_windows = B * ((T - 1) // STRIDE + 1)
    lines = [
        "| lexicon | mode | pairs scored | ConvTransduce1D (ms) | research pattern (ms, scaled) | ratio |",
        "|---|---|---|---|---|---|",
    ]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, C, generator=g).log_softmax(-1).requires_grad_(True)
    for n in (100, 500):
        for viterbi in (False, True):
            torch.manual_seed(0)
            layer = ConvTransduce1D(lexicon(n), K, STRIDE, 0, learn_params=True, viterbi=viterbi)
            with torch.no_grad():
                layer.kernel_params.normal_(0, 0.1)
            t_ours = _median(ours_step(layer, x), reps)
            t_ref = _median(reference_step(layer, x, ref_windows), 1) * total_windows / ref_windows
            mode = "viterbi" if viterbi else "forward"
            lines.append(
                f"| {n} entries | {mode} | {total_windows * n} | {t_ours * 1e3:.1f} | {t_ref * 1e3:.0f} "
                f"| {t_ref / t_ours:.0f}x |"
            )
    text = (
        f"CPU, {torch.get_num_threads()} threads, float32, batch {B}, T {T}, C_in {C}, kernel {K}, stride "
        f"{STRIDE}: forward + backward (input and kernel-weight gradients), median of {reps}. The research "
        f"pattern is timed on {ref_windows} of the {total_windows} windows and scaled.\n\n"
    )
    text += "\n".join(lines) + "\n"
    print(text)
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
