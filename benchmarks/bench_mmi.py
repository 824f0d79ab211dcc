"""The shared LF-MMI denominator on the CPU: ``mmi_denominator_score`` forward + backward against
the same denominator scored per example by the generic path, and against the arithmetic floor.

Graphs: a token bigram ``P`` composed with the CTC topology (``core.topologies.compose_token_acceptor``):
30 tokens with each history keeping about half of the tokens (a character bigram: about 1,000
arcs, 61 states) and 200 word pieces the same way (about 40,700 arcs, 401 states). Bigram
probabilities are random (Dirichlet); only the graph's shape matters for time. Emissions
``(B, T, C) = (32, 500, N + 1)`` float32 log-softmax, full lengths.

Columns:

* ``shared fwd+bwd``: best (and median) of ``--repeats`` wall and process-CPU times of
  ``mmi_denominator_score(...).sum()`` and its backward (the kernel computes the gradient in the
  forward; the backward scales it);
* ``generic fwd+bwd``: ``graph_loss(x, graphs=[den] * B, reduction="sum")`` forward + backward: the
  same graph handed to the generic batched scorer once per example, exactly what
  ``graph_loss(..., denominators=[den] * B)`` adds for its denominator part. It is slow at the large
  graph, so it runs on ``--generic-batch`` rows (default 4 there, all 32 for the small graph) and is
  scaled linearly to B (the generic scorer's time is linear in the rows: each row is its own
  problem); the column says so;
* ``floor``: ``B * T * arcs`` gather-multiply-adds (``y[group a] += x[src a] * p_a`` over the rows,
  the rows innermost, 32 rows at a time in eight vector registers: the forward's arc loop
  ``gather32`` / ``gather16`` / ``gather8`` with nothing else, no emissions, no rescaling) timed in a numba kernel
  with the same chunks, threads, layout and float32 as the shared kernel: the rate this machine reaches
  on exactly this access pattern (printed as G MAD/s), one pass over the arcs. A forward +
  backward needs at least two such passes (alpha and beta) plus the emissions' ``exp`` and the
  ``(B, T, C)`` gradient; the target is ``shared <= 3 x floor``;
* ``peak MB``: growth of the process's peak resident set (``VmHWM``, reset before the call) over one
  shared forward + backward, measured in a fresh process, beside the kernel's own buffer estimate.

Threads: the engine's pool (``LIGHTNING_GTN_NUM_THREADS``, default ``min(4, cores)``); the table
prints it. On a shared machine wall times vary; run it alone for stable numbers.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys

import numpy as np
import torch
from _procmem import peak_growth  # noqa: E402
from _timing import times_in_turn  # noqa: E402
from numba import njit

from lightning_gtn.core.shared_graph import shared_graph
from lightning_gtn.core.topologies import compose_token_acceptor
from lightning_gtn.functional import graph_loss, mmi_denominator_score
from lightning_gtn.kernels.mmi_numba import chunks_of, gather8, gather16, gather32, shared_scores
from lightning_gtn.kernels.simd import vstore
from lightning_gtn.wfst.parallel import get_num_threads, parallel_map

B, T = 32, 500
GRAPHS = [("char bigram, CTC", 30, 0.5), ("200 word pieces bigram, CTC", 200, 0.5)]


def bigram_ctc(N: int, keep: float, seed: int = 0):
    """A bigram over ``N`` tokens (each history keeps about ``keep`` of the tokens, at least one) in
    the CTC topology."""
    rng = np.random.default_rng(seed)
    allowed = rng.random((N + 1, N)) < keep
    allowed[np.arange(N + 1), rng.integers(0, N, N + 1)] = True
    nxt = np.where(allowed, np.arange(1, N + 1)[None, :], -1)
    nxt = np.concatenate([np.full((N + 1, 1), -1), nxt], axis=1).astype(np.int64)
    logp = np.log(rng.dirichlet(np.ones(N + 1), size=N + 1))
    return compose_token_acceptor(N, "ctc", nxt, logp, 0, np.ones(N + 1, dtype=bool))


def _inputs(Bn: int, C: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(Bn, T, C, generator=g).log_softmax(-1)


def _shared(den, x: torch.Tensor) -> None:
    z = x.detach().requires_grad_()
    mmi_denominator_score(z, torch.full((x.shape[0],), x.shape[1]), den).sum().backward()


def _kernel(sg, E: np.ndarray) -> None:
    """The numba kernel alone (``shared_scores`` with the emission gradient), without the torch op
    around it."""
    shared_scores(sg, E, np.full(E.shape[0], E.shape[1]), need_e=True)


def _generic(den, x: torch.Tensor) -> None:
    z = x.detach().requires_grad_()
    lengths = torch.full((x.shape[0],), x.shape[1])
    graph_loss(z, graphs=[den] * x.shape[0], input_lengths=lengths, reduction="sum").backward()


@njit(cache=True, nogil=True)
def _floor_kernel(goff, src, p, x, y, frames):
    """``frames`` passes of ``y[g] = sum over the arcs a of group g of x[src a] * p_a`` (rows
    innermost, padded to whole vectors; 32, then 16, then 8 rows at a time into vector
    accumulators, as the kernel's frame): the shared kernel's forward arc loop (:func:`gather32`,
    :func:`gather16`, :func:`gather8`) alone."""
    nbp = x.shape[1]
    for _ in range(frames):
        for g in range(goff.shape[0] - 1):
            a0, a1 = goff[g], goff[g + 1]
            k = 0
            while k + 32 <= nbp:
                u0, u1, u2, u3 = gather32(x, nbp, k, src, p, a0, a1)
                vstore(y, g * nbp + k, u0)
                vstore(y, g * nbp + k + 8, u1)
                vstore(y, g * nbp + k + 16, u2)
                vstore(y, g * nbp + k + 24, u3)
                k += 32
            if k + 16 <= nbp:
                u0, u1 = gather16(x, nbp, k, src, p, a0, a1)
                vstore(y, g * nbp + k, u0)
                vstore(y, g * nbp + k + 8, u1)
                k += 16
            while k < nbp:
                vstore(y, g * nbp + k, gather8(x, nbp, k, src, p, a0, a1))
                k += 8


def _floor_fn(sg):
    """A call of ``B * T * arcs`` gather-multiply-adds in the shared kernel's layout, with its
    chunks and threads."""
    chunks = chunks_of(np.full(B, T), get_num_threads())
    p = sg.probabilities(np.float32)[0]
    rng = np.random.default_rng(0)
    width = [(len(c) + 7) // 8 * 8 for c in chunks]  # the kernel's columns: rows padded to whole vectors
    xs = [rng.random((sg.num_states, w)).astype(np.float32) for w in width]
    ys = [np.zeros((sg.num_groups, w), dtype=np.float32) for w in width]

    def run(i):
        _floor_kernel(sg.group_off, sg.fwd_src, p, xs[i], ys[i], T)

    _floor_kernel(sg.group_off, sg.fwd_src, p, xs[0], ys[0], 1)
    if len(chunks) == 1:
        return lambda: run(0)
    return lambda: parallel_map(run, list(range(len(chunks))))


def _best(fn, repeats: int):
    """Best wall and best process CPU time (all threads) of ``repeats`` calls of ``fn``."""
    return _stats(times_in_turn([fn], repeats)[0])[:2]


def _stats(ts):
    """``(best wall, best CPU, median wall, median CPU)`` of a list of (wall, CPU)."""
    w = sorted(t[0] for t in ts)
    c = sorted(t[1] for t in ts)
    return w[0], c[0], w[len(w) // 2], c[len(c) // 2]


def _memory_child(k: int) -> None:
    name, N, keep = GRAPHS[k]
    den = bigram_ctc(N, keep)
    x = _inputs(B, N + 1)
    _shared(den, x[:, :4].contiguous())  # compile, warm caches
    grew, _ = peak_growth(lambda: _shared(den, x))
    print(json.dumps({"mb": None if grew is None else grew / 2**20}))


def _memory(k: int):
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", str(k)], capture_output=True, text=True, env=os.environ.copy()
    )
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])["mb"]
    except (ValueError, IndexError, KeyError):
        return None


def main(argv=None) -> str:
    """Prints the table and returns it."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--generic-batch", type=int, default=4, help="rows of the generic path at the large graph")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--quick", action="store_true", help="one repeat, 2 generic rows at the large graph")
    ap.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.generic_batch = 1, 2
    if args.memory_child is not None:
        _memory_child(args.memory_child)
        return ""
    chunks = chunks_of(np.full(B, T), get_num_threads())
    load0 = os.getloadavg()[0]
    rows = [
        f"Shared LF-MMI denominator, B={B}, T={T}, float32, {len(chunks)} chunk(s) of {len(chunks[0])} rows "
        f"on {get_num_threads()} thread(s) (torch: {torch.get_num_threads()}); times wall / process CPU (s), "
        f"best of {args.repeats} (median in brackets):",
        "",
        "| graph | states | arcs | shared fwd+bwd | kernel alone | generic fwd+bwd | speedup (wall / CPU) | floor "
        "| floor rate (G MAD/s, wall) | shared / floor (wall / CPU) | kernel / floor (wall / CPU) "
        "| peak MB (kernel buffers MB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, (name, N, keep) in enumerate(GRAPHS):
        den = bigram_ctc(N, keep)
        sg = shared_graph(den)
        x = _inputs(B, N + 1)
        _shared(den, x[:2, :8].contiguous())  # compile
        nb = B if k == 0 else max(1, min(B, args.generic_batch))
        _generic(den, x[:1, :8].contiguous())
        xg = x[:nb].contiguous()
        E = x.numpy()
        fns = [
            functools.partial(_shared, den, x),
            functools.partial(_kernel, sg, E),
            _floor_fn(sg),
            functools.partial(_generic, den, xg),
        ]
        fns[1]()
        ts = times_in_turn(fns, args.repeats)
        ours, ker, fl = _stats(ts[0]), _stats(ts[1]), _stats(ts[2])
        gen = tuple(v * B / nb for v in _stats(ts[3])[:2])
        note = "" if nb == B else f" ({nb} rows x {B // nb})"
        rate = B * T * sg.num_arcs / fl[0] / 1e9
        C = N + 1
        buffers = B * (T * (sg.num_groups + C) + 4 * sg.num_states + 2 * sg.num_groups) * 4 / 2**20
        mb = None if args.no_memory else _memory(k)
        mb_col = ("n/a" if mb is None else f"{mb:.0f}") + f" ({buffers:.0f})"
        rows.append(
            f"| {name} | {sg.num_states} | {sg.num_arcs} | {ours[0]:.4f} / {ours[1]:.4f} "
            f"({ours[2]:.4f} / {ours[3]:.4f}) | {ker[0]:.4f} / {ker[1]:.4f} "
            f"| {gen[0]:.2f} / {gen[1]:.2f}{note} | {gen[0] / ours[0]:.0f}x / {gen[1] / ours[1]:.0f}x "
            f"| {fl[0]:.4f} / {fl[1]:.4f} | {rate:.2f} | {ours[0] / fl[0]:.1f}x / {ours[1] / fl[1]:.1f}x "
            f"| {ker[0] / fl[0]:.1f}x / {ker[1] / fl[1]:.1f}x | {mb_col} |"
        )
    rows += [
        "",
        "floor: B*T*arcs float32 gather-multiply-adds (y[group] += x[src] * p, rows innermost, the forward's",
        "arc loop alone, same chunks/threads/layout), timed in turn with the shared call; one arc pass,",
        "where a forward + backward needs two plus exp(E) and the (B, T, C) gradient. Generic: graph_loss",
        "with graphs=[den] * rows, also in turn, scaled to B rows when run on fewer. Kernel alone: the numba",
        "kernel without the torch op around it (the op adds the autograd plumbing and the gradient's scaling).",
        f"Load average (1 min) before / after: {load0:.2f} / {os.getloadavg()[0]:.2f}.",
    ]
    table = "\n".join(rows)
    print(table)
    return table


if __name__ == "__main__":
    main()
