"""Forced alignment benchmark: :func:`lightning_gtn.functional.forced_align` against a
per-example loop of the engine (the GTN pattern: ``linear_graph`` of the emissions,
``intersect`` with the CTC graph, ``viterbi_path``) and against
``torchaudio.functional.forced_align`` per example when torchaudio is importable.

Default shape: batch 32, T 500, C 30, targets of 90-110 tokens (blank 0). A second table times
forced_align with 1 and 2 torch threads (``torch.set_num_threads``; the CPU kernels deal the
examples to that many threads) against torchaudio's per-example loop, medians of ``--repeats``
interleaved runs, and counts the examples whose paths equal torchaudio's. torchaudio needs the
torch it was built for: run this script in an environment with such a pair (torch 2.11 with
torchaudio 2.11, say) and the package on ``PYTHONPATH``. Median wall time of
``--repeats`` runs after one warm-up (the engine loop: ``--loop-repeats`` runs); the last
column is the largest difference of the best-path scores from forced_align's. Also timed:
``impl="torch"`` on the CPU, ``star`` and ``blank=None``, and on a GPU when present.

On a machine with no spare core torch's OpenMP workers keep spinning after each parallel op
and slow the numba kernel's threads down (up to 2x here); ``OMP_WAIT_POLICY=PASSIVE`` in the
environment lets them sleep. The header says which policy a run used.

    python benchmarks/bench_align.py [--batch 32 --frames 500 --classes 30 --tokens 100]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import lightning_gtn.wfst as gtn
from lightning_gtn.functional import forced_align


def _inputs(B, T, C, L, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g).log_softmax(-1)
    lengths = torch.full((B,), T, dtype=torch.int64)
    targets = []
    for _ in range(B):
        n = int(torch.randint(max(1, L - 10), L + 11, (1,), generator=g))
        targets.append(torch.randint(1, C, (n,), generator=g).tolist())
    return x, lengths, targets


def _time(fn, repeats):
    fn()  # warm-up (numba compilation, caches)
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _engine_loop(x, targets, blank=0):
    """One graph per example, the GTN way; returns the scores and the frame label paths."""
    B, T, C = x.shape
    scores, paths = [], []
    for b in range(B):
        em = gtn.linear_graph(T, C)
        em.set_weights(x[b].contiguous().reshape(-1).tolist())
        ali = gtn.intersect(em, gtn.criterion.ctc_graph(targets[b], blank))
        path = gtn.viterbi_path(ali)
        scores.append(gtn.viterbi_score(ali).item())
        paths.append(path.labels_to_list())
    return torch.tensor(scores, dtype=torch.float64), paths


def _torchaudio_loop(x, targets, blank=0):
    import torchaudio.functional as AF

    scores = []
    for b in range(x.shape[0]):
        t = torch.tensor([targets[b]], dtype=torch.int32)
        ali, sc = AF.forced_align(x[b : b + 1], t, blank=blank)
        scores.append(float(sc.sum()))
    return torch.tensor(scores, dtype=torch.float64)


def _threads_table(x, lengths, targets, repeats):
    """ours at 1 and 2 threads against torchaudio's loop (when importable), interleaved runs."""
    try:
        import torchaudio.functional  # noqa: F401

        have_ta = True
    except ImportError:
        have_ta = False
    old = torch.get_num_threads()
    lines = [
        "| torch threads | forced_align (ms) | torchaudio loop (ms) | ours / torchaudio | "
        "paths equal to torchaudio's |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in (1, 2):
        torch.set_num_threads(n)
        ours = lambda: forced_align(x, targets, lengths)  # noqa: E731
        ta = lambda: _torchaudio_paths(x, targets)  # noqa: E731
        al = ours()
        paths = ta() if have_ta else None
        t_ours, t_ta = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            ours()
            t_ours.append(time.perf_counter() - t0)
            if have_ta:
                t0 = time.perf_counter()
                ta()
                t_ta.append(time.perf_counter() - t0)
        mo = statistics.median(t_ours)
        if have_ta:
            mt = statistics.median(t_ta)
            same = sum(p == al.labels[b].tolist() for b, p in enumerate(paths))
            lines.append(f"| {n} | {mo * 1e3:.1f} | {mt * 1e3:.1f} | {mo / mt:.2f} | {same}/{len(paths)} |")
        else:
            lines.append(f"| {n} | {mo * 1e3:.1f} | - | - | torchaudio not importable |")
    torch.set_num_threads(old)
    return "\n".join(lines)


def _torchaudio_paths(x, targets, blank=0):
    import torchaudio.functional as AF

    out = []
    for b in range(x.shape[0]):
        t = torch.tensor([targets[b]], dtype=torch.int32)
        ali, _ = AF.forced_align(x[b : b + 1], t, blank=blank)
        out.append(ali[0].tolist())
    return out


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--frames", type=int, default=500)
    p.add_argument("--classes", type=int, default=30)
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--loop-repeats", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="fewer repetitions (make bench ARGS=--quick)")
    a = p.parse_args(argv)
    if a.quick:
        a.repeats = min(a.repeats, 2)
    B, T, C, L = a.batch, a.frames, a.classes, a.tokens
    x, lengths, targets = _inputs(B, T, C, L)
    rows = []

    def ours(dev="cpu", **kw):
        xd = x.to(dev)
        return _time(lambda: forced_align(xd, targets, lengths, **kw), a.repeats)

    t_ref, ref = ours()
    rows.append(("forced_align (numba, CPU)", t_ref, "0"))
    sec, al = ours(impl="torch")
    diff = (al.score.double() - ref.score.double()).abs().max().item()
    rows.append(("forced_align impl=torch (CPU)", sec, f"{diff:.1e}"))
    for name, kw in (
        ("forced_align star=-2 (numba, CPU)", dict(star=-2.0)),
        ("forced_align blank=None (numba, CPU)", dict(blank=None)),
    ):
        sec, _ = ours(**kw)
        rows.append((name, sec, "n/a (another graph)"))
    if torch.cuda.is_available():
        sec, al = ours("cuda")
        diff = (al.score.double().cpu() - ref.score.double()).abs().max().item()
        rows.append((f"forced_align (torch, {torch.cuda.get_device_name()})", sec, f"{diff:.1e}"))
    sec, (scores, paths) = _time(lambda: _engine_loop(x, targets), a.loop_repeats)
    diff = (scores - ref.score.double()).abs().max().item()
    same = sum(p == ref.labels[b].tolist() for b, p in enumerate(paths))
    rows.append((f"engine loop: intersect + viterbi_path per example ({same}/{B} identical paths)", sec, f"{diff:.1e}"))
    try:
        import torchaudio.functional  # noqa: F401
    except ImportError:
        rows.append(("torchaudio.functional.forced_align per example", None, "not installed"))
    else:
        sec, scores = _time(lambda: _torchaudio_loop(x, targets), a.repeats)
        rows.append(
            (
                "torchaudio.functional.forced_align per example",
                sec,
                f"{(scores - ref.score.double()).abs().max().item():.1e}",
            )
        )
    import os

    policy = os.environ.get("OMP_WAIT_POLICY", "unset")
    lines = [
        f"Forced alignment, B={B}, T={T}, C={C}, targets of {L - 10}-{L + 10} tokens "
        f"(torch threads: {torch.get_num_threads()}, OMP_WAIT_POLICY={policy}):",
        "",
        "| method | median time (ms) | speed-up vs engine loop | max score difference |",
        "|---|---:|---:|---:|",
    ]
    loop = next(r[1] for r in rows if r[0].startswith("engine loop"))
    for name, sec, diff in rows:
        if sec is None:
            lines.append(f"| {name} | - | - | {diff} |")
        else:
            lines.append(f"| {name} | {sec * 1e3:.1f} | {loop / sec:.1f}x | {diff} |")
    import platform

    lines += [
        "",
        f"Threads (medians of {max(a.repeats, 5) * 3} interleaved runs, CTC, torch {torch.__version__}, "
        f"{platform.machine()}, load average {os.getloadavg()[0]:.2f}):",
        "",
        _threads_table(x, lengths, targets, max(a.repeats, 5) * 3),
    ]
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
