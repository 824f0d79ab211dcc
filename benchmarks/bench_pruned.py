"""Pruned RNN-T (k2's API, ``lightning_gtn.k2``) against the full lattice: time and memory as U grows.

One training step of a small transducer head, forward + backward: encoder frames ``(B, T, J)``,
prediction-network outputs ``(B, U + 1, J)``, the joiner ``Linear(J, V)(tanh(enc + pred))``, and
the simple projections ``Linear(J, V)``.

* full: ``k2.rnnt_loss`` of the joiner over the whole ``(B, T, U + 1, V)`` lattice;
* pruned (``s_range=5``): icefall's step, ``rnnt_loss_smoothed(..., return_grad=True)``,
  ``get_rnnt_prune_ranges``, ``do_rnnt_pruning``, the joiner on ``(B, T, 5, V)`` only,
  ``rnnt_loss_pruned``, and ``0.5 * simple + pruned``.

Columns: median wall time and process CPU time (all threads) of forward + backward (a few
repeats: the machine is shared; CPU time is the steadier figure there), the ratio of the CPU
times, and the
peak extra resident memory of one step measured in a fresh subprocess (glibc told to mmap every
buffer of 4 KiB or more and give freed memory back at once; after a warm-up the high-water mark
is reset through ``/proc/self/clear_refs``; the figure is ``VmHWM - VmRSS`` across one step,
inputs excluded). The last row, ``B=16, T=500, U=200, V=500``, runs only the pruned step and
prints the bytes the full lattice's joiner output alone would take.

On a machine with a CUDA device a second table (``--gpu-only``: that table alone, in ``make
gpu-check``) runs the same steps on the GPU, where k2's recursion runs on the Triton kernel
(``impl=None`` picks it after its self-check): median synchronised wall time and the peak CUDA
memory of one step. Without CUDA it prints "no CUDA".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from _procmem import peak_growth  # noqa: E402

import lightning_gtn.k2 as k2

J = 128
S_RANGE = 5


def _make(kind: str, B: int, T: int, U: int, V: int, seed: int = 0, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    joiner = torch.nn.Linear(J, V).to(device)
    am_proj = torch.nn.Linear(J, V).to(device)
    lm_proj = torch.nn.Linear(J, V).to(device)
    enc = torch.randn(B, T, J, generator=g).to(device).requires_grad_()
    pred = torch.randn(B, U + 1, J, generator=g).to(device).requires_grad_()
    symbols = torch.randint(1, V, (B, U), generator=g)
    frames = torch.randint(T // 2, T + 1, (B,), generator=g)
    frames[0] = T
    lengths = torch.minimum(torch.randint(U // 2, U + 1, (B,), generator=g), frames * (S_RANGE - 1))
    lengths[0] = U
    boundary = torch.stack([torch.zeros(B, dtype=torch.long)] * 2 + [lengths, frames], dim=1).to(device)
    symbols = symbols.to(device)

    def full():
        logits = joiner(torch.tanh(enc[:, :, None] + pred[:, None]))
        k2.rnnt_loss(logits, symbols, 0, boundary=boundary, reduction="sum").backward()

    def pruned():
        simple, (px_grad, py_grad) = k2.rnnt_loss_smoothed(
            lm_proj(pred), am_proj(enc), symbols, 0, 0.25, 0.0, boundary=boundary, reduction="sum", return_grad=True
        )
        ranges = k2.get_rnnt_prune_ranges(px_grad, py_grad, boundary, S_RANGE)
        am_p, lm_p = k2.do_rnnt_pruning(enc, pred, ranges)
        logits = joiner(torch.tanh(am_p + lm_p))
        loss = k2.rnnt_loss_pruned(logits, symbols, ranges, 0, boundary, reduction="sum")
        (0.5 * simple + loss).backward()

    return full if kind == "full" else pruned


def _time(step, repeats: int) -> tuple:
    """Median wall time and median process CPU time (all threads; steadier on a shared machine)."""
    step()  # warm-up (numba's cached kernels load, torch's allocator settles)
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def _memory_worker(kind: str, shape) -> None:
    import gc

    step = _make(kind, *shape)
    step()
    gc.collect()
    extra, _ = peak_growth(step)
    print(json.dumps({"extra_mb": (extra or 0) / 2**20}))


def _memory(kind: str, shape) -> float:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="4096", MALLOC_TRIM_THRESHOLD_="0", MALLOC_TOP_PAD_="0")
    cmd = [sys.executable, __file__, "--memory-worker", kind, ",".join(map(str, shape))]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])["extra_mb"]
    except Exception:  # pragma: no cover - reported as unknown
        return float("nan")


def gpu_table(repeats: int = 5, quick: bool = False) -> str:
    """The CUDA table (see the module docstring), or a line saying there is no CUDA device."""
    title = f"### Pruned RNN-T against the full lattice on CUDA (k2's recursion by Triton), s_range={S_RANGE}"
    if not torch.cuda.is_available():
        print(f"{title}\n\nno CUDA: skipped")
        return f"{title}\n\nno CUDA: skipped"
    from lightning_gtn.losses.k2_rnnt import MI_BACKENDS

    rows = []
    for shape in (
        [(4, 100, 40, 128), (16, 500, 200, 500)]
        if quick
        else [(4, 100, 10, 128), (4, 100, 80, 128), (16, 500, 200, 500)]
    ):
        cells = []
        for kind in ("full", "pruned"):
            step = _make(kind, *shape, device="cuda")
            try:
                step()
                torch.cuda.synchronize()
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    step()
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - t0)
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                step()
                torch.cuda.synchronize()
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20
                cells.append(f"{statistics.median(times) * 1e3:.2f} | {peak:.0f}")
            except torch.OutOfMemoryError:
                cells.append("out of memory | -")
            del step
            torch.cuda.empty_cache()
        rows.append(f"| {', '.join(map(str, shape))} | {cells[0]} | {cells[1]} |")
    table = (
        f"{title}\n\n{torch.cuda.get_device_name(0)}; recursion impl: {MI_BACKENDS.default(torch.device('cuda'))}\n\n"
        "| B, T, U, V | full (ms) | full peak (MB) | pruned (ms) | pruned peak (MB) |\n"
        "|---|---|---|---|---|\n" + "\n".join(rows)
    )
    print(table)
    return table


def main(argv=None) -> str:
    """Prints the table and returns it."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="two small shapes and the big pruned row")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--memory-worker", nargs=2, metavar=("KIND", "SHAPE"), help=argparse.SUPPRESS)
    p.add_argument("--gpu-only", action="store_true", help="only the CUDA table")
    args = p.parse_args(argv)
    if args.gpu_only:
        return gpu_table(max(args.repeats, 5), args.quick)
    if args.memory_worker:
        kind, shape = args.memory_worker
        _memory_worker(kind, [int(v) for v in shape.split(",")])
        return ""
    torch.manual_seed(0)
    grow = [(4, 100, U, 128) for U in ((10, 40) if args.quick else (10, 20, 40, 80))]
    big = (16, 500, 200, 500)
    rows = []
    for shape in grow:
        (tf, cf), (tp, cp) = _time(_make("full", *shape), args.repeats), _time(_make("pruned", *shape), args.repeats)
        mf = float("nan") if args.no_memory else _memory("full", shape)
        mp = float("nan") if args.no_memory else _memory("pruned", shape)
        rows.append(
            f"| {', '.join(map(str, shape))} | {tf * 1e3:.0f} / {cf * 1e3:.0f} | {tp * 1e3:.0f} / {cp * 1e3:.0f} "
            f"| {cf / cp:.2f} | {mf:.0f} | {mp:.0f} |"
        )
    tp, cp = _time(_make("pruned", *big), max(1, args.repeats - 1))
    mp = float("nan") if args.no_memory else _memory("pruned", big)
    B, T, U, V = big
    need = B * T * (U + 1) * V * 4
    rows.append(
        f"| {', '.join(map(str, big))} | not run: the joiner output alone is {need / 2**30:.1f} GiB "
        f"(float32), its gradient as much again | {tp * 1e3:.0f} / {cp * 1e3:.0f} | n/a | n/a | {mp:.0f} |"
    )
    table = (
        f"### Pruned RNN-T (`lightning_gtn.k2`, s_range={S_RANGE}) against the full lattice, forward + backward, "
        f"J={J}\n\n"
        "| B, T, U, V | full: wall / CPU (ms) | pruned: wall / CPU (ms) | full / pruned (CPU) "
        "| full peak extra (MB) | pruned peak extra (MB) |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )
    print(table)
    return table + "\n" + gpu_table(max(args.repeats, 5), args.quick)


if __name__ == "__main__":
    main()
