"""lightning_gtn.nn.Linear against torch.nn.Linear: forward + backward, interleaved, CPU."""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from lightning_gtn.nn import Linear

SHAPES = [  # (leading dims, in_features, out_features)
    ((32, 250), 512, 30),
    ((32, 250), 256, 256),
    ((8, 250), 512, 1000),
]


def _step(layer, x):
    def run():
        x.grad = None
        for p in layer.parameters():
            p.grad = None
        layer(x).sum().backward()

    return run


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    reps = 10 if args.quick else 30
    lines = [
        "| input shape | out | lightning_gtn.nn.Linear (ms) | torch.nn.Linear (ms) | ratio |",
        "|---|---|---|---|---|",
    ]
    for lead, fin, fout in SHAPES:
        torch.manual_seed(0)
        ours = Linear(fin, fout)
        ref = torch.nn.Linear(fin, fout)
        ref.load_state_dict(ours.state_dict())
        x = torch.randn(*lead, fin, requires_grad=True)
        a, b = _step(ours, x), _step(ref, x)
        for _ in range(3):
            a(), b()
        ta, tb = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            a()
            ta.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            b()
            tb.append(time.perf_counter() - t0)
        ma, mb = statistics.median(ta), statistics.median(tb)
        lines.append(f"| {tuple(lead) + (fin,)} | {fout} | {ma * 1e3:.2f} | {mb * 1e3:.2f} | {ma / mb:.2f} |")
    text = f"CPU, {torch.get_num_threads()} threads, forward + backward (input grad included), median of {reps}.\n\n"
    text += "\n".join(lines) + "\n"
    print(text)
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
