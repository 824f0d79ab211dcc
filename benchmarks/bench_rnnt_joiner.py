"""The joiner RNN-T loss against the materialised path: time and memory of one training step.

One forward + backward of the RNN-T loss of the joiner ``Linear(tanh(enc + pred))`` over encoder
frames ``(B, T, J)`` and prediction-network outputs ``(B, U + 1, J)``, with the gradients of all
four tensors:

* joiner: :func:`lightning_gtn.functional.rnnt_joiner_loss` (chunks of
  :data:`lightning_gtn.losses.rnnt_joiner.JOINER_CHUNK_BYTES`, never the ``(B, T, U + 1, V)``
  logits);
* materialised: the logits ``tanh(enc[:, :, None] + pred[:, None]) @ W.T + b`` built by torch and
  given to :func:`lightning_gtn.functional.rnnt_loss`.

Each measurement runs in a FRESH process (the two paths alternate, ``--repeats`` rounds), after a
warm-up step on a small case (numba's and torch's first calls). Memory: one step at the
benchmark's size with glibc told to mmap every buffer of 4 KiB or more and to give freed memory
back at once, the high-water mark reset through ``/proc/self/clear_refs`` before it; the figure
is ``VmHWM - VmRSS`` across the step, inputs excluded. Time: in another process with glibc's
usual settings (the mmap settings make every chunk's buffers fresh pages, which would charge the
chunked path for page faults a training loop does not pay), a first step at the size, then the
measured one: wall time and process CPU time (all threads). The table gives medians over the
rounds and the ratios joiner / materialised, then the largest relative difference of the two
losses. ``--loss tdt`` / ``--loss multiblank`` measure :func:`~lightning_gtn.functional.tdt_joiner_loss`
against :func:`~lightning_gtn.functional.tdt_loss` (``V`` vocabulary classes, blank 0, then the 5
durations ``0..4``: ``V + 5`` outputs) and :func:`~lightning_gtn.functional.multiblank_rnnt_joiner_loss`
against :func:`~lightning_gtn.functional.multiblank_rnnt_loss` (big blanks of durations 2 and 4 as
the last two of ``V + 2`` outputs) instead. ``--small`` runs a small size for a quick check;
``--threads`` sets torch's threads in the workers. The joiner path makes a dozen torch calls per
chunk of nodes where the materialised path makes one per tensor: on a machine with more runnable
threads than cores each parallel region waits for its slowest thread, which costs the joiner path
more (compare ``--threads 1``).
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

from lightning_gtn.functional import (
    multiblank_rnnt_joiner_loss,
    multiblank_rnnt_loss,
    rnnt_joiner_loss,
    rnnt_loss,
    tdt_joiner_loss,
    tdt_loss,
)

SIZE = (8, 300, 60, 1024, 512)  # B, T, U, V, J
SMALL = (4, 100, 20, 256, 128)
WARMUP = (2, 8, 3, 16, 8)
PATHS = ("joiner", "materialised")
TDT_DURATIONS = (0, 1, 2, 3, 4)
BIG_BLANKS = (2, 4)
#: per loss: (joiner function, materialised function, extra outputs, keyword arguments of an output count)
LOSSES = {
    "rnnt": (rnnt_joiner_loss, rnnt_loss, 0, lambda n: {"blank": 0}),
    "tdt": (tdt_joiner_loss, tdt_loss, len(TDT_DURATIONS), lambda n: {"blank": 0, "durations": TDT_DURATIONS}),
    "multiblank": (
        multiblank_rnnt_joiner_loss,
        multiblank_rnnt_loss,
        len(BIG_BLANKS),
        lambda n: {"blank": 0, "big_blank_durations": BIG_BLANKS, "big_blank_ids": [n - 1 - i for i in range(2)]},
    ),
}


def _inputs(B, T, U, V, J, seed=0, extra=0):
    g = torch.Generator().manual_seed(seed)
    enc = (0.5 * torch.randn(B, T, J, generator=g)).requires_grad_()
    pred = (0.5 * torch.randn(B, U + 1, J, generator=g)).requires_grad_()
    w = (torch.randn(V + extra, J, generator=g) / J**0.5).requires_grad_()
    b = torch.zeros(V + extra).requires_grad_()
    tg = torch.randint(1, V, (B, U), generator=g)
    il = torch.full((B,), T, dtype=torch.long)
    tl = torch.full((B,), U, dtype=torch.long)
    return (enc, pred, w, b), tg, il, tl


def _step(path, tensors, tg, il, tl, loss_name="rnnt"):
    for x in tensors:
        x.grad = None
    joiner, materialised, _, kwargs = LOSSES[loss_name]
    kw = kwargs(tensors[2].shape[0])
    if path == "joiner":
        loss = joiner(*tensors, tg, il, tl, **kw)
    else:
        enc, pred, w, b = tensors
        logits = torch.tanh(enc[:, :, None] + pred[:, None]) @ w.T + b
        loss = materialised(logits, tg, il, tl, **kw)
    loss.backward()
    return float(loss.detach())


def _worker(what: str, path: str, size, threads: int, loss_name: str) -> None:
    import gc

    if threads > 0:
        torch.set_num_threads(threads)
    extra = LOSSES[loss_name][2]
    _step(path, *_inputs(*WARMUP, extra=extra), loss_name)
    args = _inputs(*size, extra=extra)
    gc.collect()
    if what == "memory":
        extra_bytes, loss = peak_growth(lambda: _step(path, *args, loss_name))
        print(json.dumps({"extra_mb": (extra_bytes or 0) / 2**20, "loss": loss}))
        return
    _step(path, *args, loss_name)  # the first step at this size (first touches of torch's buffers)
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    _step(path, *args, loss_name)
    print(json.dumps({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}))


def _run(what: str, path: str, size, threads: int, loss_name: str = "rnnt") -> dict:
    env = dict(os.environ)
    if what == "memory":  # every buffer of 4 KiB or more its own mapping, given back when freed
        env.update(MALLOC_MMAP_THRESHOLD_="4096", MALLOC_TRIM_THRESHOLD_="0", MALLOC_TOP_PAD_="0")
    cmd = [sys.executable, __file__, "--worker", what, path, ",".join(map(str, size)), str(threads), loss_name]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--small", action="store_true", help=f"the size {SMALL} instead of {SIZE}")
    p.add_argument("--quick", action="store_true", help="one round (run_all's quick mode)")
    p.add_argument("--repeats", type=int, default=3, help="rounds of fresh processes (default 3)")
    p.add_argument("--threads", type=int, default=0, help="torch threads in the workers (default: torch's)")
    p.add_argument("--loss", choices=sorted(LOSSES), default="rnnt", help="the loss (default: rnnt)")
    p.add_argument("--worker", nargs=5, metavar=("WHAT", "PATH", "SIZE", "THREADS", "LOSS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        what, path, size_s, threads, loss_name = args.worker
        _worker(what, path, tuple(int(s) for s in size_s.split(",")), int(threads), loss_name)
        return ""
    size = SMALL if args.small else SIZE
    rounds = 1 if args.quick else max(1, args.repeats)
    load0 = os.getloadavg()
    runs = {path: [] for path in PATHS}
    for _ in range(rounds):
        for path in PATHS:
            mem = _run("memory", path, size, args.threads, args.loss)
            runs[path].append({**mem, **_run("time", path, size, args.threads, args.loss)})
    load1 = os.getloadavg()
    keys = ("wall", "cpu", "extra_mb")
    med = {path: {k: statistics.median(r[k] for r in runs[path]) for k in keys} for path in PATHS}
    j, m = med["joiner"], med["materialised"]
    diff = max(
        abs(a["loss"] - c["loss"]) / max(abs(c["loss"]), 1e-30) for a, c in zip(runs["joiner"], runs["materialised"])
    )
    B, T, U, V, J = size
    joiner, materialised, extra, _ = LOSSES[args.loss]
    logits_mb = B * T * (U + 1) * (V + extra) * 4 / 2**20
    table = (
        f"One training step (forward + backward, float32, CPU), B, T, U, V, J = {', '.join(map(str, size))} "
        f"(the logits alone: {logits_mb:.0f} MiB); medians of {rounds} fresh process(es) per path, "
        f"torch threads {args.threads or torch.get_num_threads()}, load average {load0[0]:.1f} -> {load1[0]:.1f} "
        "(a shared machine: wall times move with the load, CPU times less).\n\n"
        "| path | wall (s) | CPU (s) | peak extra (MiB) |\n|---|---|---|---|\n"
        f"| joiner ({joiner.__name__}) | {j['wall']:.2f} | {j['cpu']:.2f} | {j['extra_mb']:.1f} |\n"
        f"| materialised (torch joiner + {materialised.__name__}) | {m['wall']:.2f} | {m['cpu']:.2f} | "
        f"{m['extra_mb']:.1f} |\n"
        f"| ratio joiner / materialised | {j['wall'] / m['wall']:.2f} | {j['cpu'] / m['cpu']:.2f} | "
        f"{j['extra_mb'] / m['extra_mb']:.3f} |\n\n"
        f"Largest relative difference of the two losses: {diff:.1e}.\n"
    )
    print(table)
    return table


if __name__ == "__main__":
    main()
