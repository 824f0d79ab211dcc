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

A third table aligns one long recording, an hour of 40 ms frames by default (T = 90,000,
S = 50,000 tokens, C = 32): plain CTC, the star with a blank and the star on the no-blank chain
(the graph-free kernels), one torch thread, the peak resident memory each call adds
(``/proc/self``, after a warm-up). It runs at a tenth of the size first (medians of
interleaved runs, with the star's graph path beside it and whether its paths equal the
kernel's), then once at the full size (``--quick``: the tenth only).

    python benchmarks/bench_align.py [--batch 32 --frames 500 --classes 30 --tokens 100]
                                     [--long-frames 90000 --long-tokens 50000 --long-classes 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _procmem import peak_growth  # noqa: E402

import lightning_gtn.wfst as gtn  # noqa: E402
from lightning_gtn.functional import forced_align  # noqa: E402


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


_LONG_ROWS = (
    ("plain CTC (blank 0)", dict(blank=0)),
    ("star=-2, CTC (blank 0)", dict(blank=0, star=-2.0)),
    ("star=-2, no-blank chain", dict(blank=None, star=-2.0)),
)


def _long_inputs(T, L, C, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, T, C, generator=g).log_softmax(-1)
    return x, [torch.randint(1, C, (L,), generator=g).tolist()]


def _long_table(T, L, C, repeats, graph_too):
    """One long example: time, peak memory growth and the ratio to plain CTC of each row."""
    import lightning_gtn.align.forced as forced

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    x, y = _long_inputs(T, L, C)
    for _, kw in _LONG_ROWS:  # compiled (numba's cache) before timing
        forced_align(x[:, :100], [y[0][:20]], [100], **kw)
    times = {name: [] for name, _ in _LONG_ROWS}
    mem, out = {}, {}
    for _ in range(repeats):  # interleaved
        for name, kw in _LONG_ROWS:
            t0 = time.perf_counter()
            m, al = peak_growth(lambda kw=kw: forced_align(x, y, [T], **kw))
            times[name].append(time.perf_counter() - t0)
            mem[name] = max(mem.get(name) or 0, m or 0) if m is not None else None
            out[name] = al
    rows = [(name, statistics.median(times[name]), mem[name], "") for name, _ in _LONG_ROWS]
    if graph_too:
        forced._STAR_KERNEL = False
        try:
            for name, kw in _LONG_ROWS[1:]:
                t0 = time.perf_counter()
                m, al = peak_growth(lambda kw=kw: forced_align(x, y, [T], **kw))
                sec = time.perf_counter() - t0
                same = torch.equal(al.labels, out[name].labels) and torch.equal(al.score, out[name].score)
                rows.append((f"{name}: graph path", sec, m, "equal" if same else "DIFFERENT"))
        finally:
            forced._STAR_KERNEL = True
    torch.set_num_threads(old)
    base = rows[0][1]
    lines = []
    for name, sec, m, same in rows:
        mb = "-" if m is None else f"{m / 2**20:.0f}"
        lines.append(f"| T={T}, S={L} | {name} | {sec:.2f} | {sec / base:.2f}x | {mb} | {same} |")
    return lines


def _long_lines(a):
    lines = [
        f"One long recording (C={a.long_classes}, one torch thread, load average {os.getloadavg()[0]:.2f}; "
        "the tenth: medians of 3 interleaved runs, the full size: one run each; memory: the peak "
        "resident set's growth during the call; last column: the graph path's paths against the kernel's):",
        "",
        "| size | alignment | time (s) | vs plain CTC | peak memory growth (MiB) | graph path |",
        "|---|---|---:|---:|---:|---|",
    ]
    lines += _long_table(a.long_frames // 10, a.long_tokens // 10, a.long_classes, 3, True)
    if not a.quick:
        lines += _long_table(a.long_frames, a.long_tokens, a.long_classes, 1, False)
    return lines


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--frames", type=int, default=500)
    p.add_argument("--classes", type=int, default=30)
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--loop-repeats", type=int, default=1)
    p.add_argument("--long-frames", type=int, default=90_000, help="the long recording's frames")
    p.add_argument("--long-tokens", type=int, default=50_000, help="the long recording's tokens")
    p.add_argument("--long-classes", type=int, default=32)
    p.add_argument("--long-only", action="store_true", help="only the long-recording table")
    p.add_argument("--quick", action="store_true", help="fewer repetitions (make bench ARGS=--quick)")
    a = p.parse_args(argv)
    if a.long_only:
        table = "\n".join(_long_lines(a))
        print(table)
        return table
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
        "",
        *_long_lines(a),
    ]
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
