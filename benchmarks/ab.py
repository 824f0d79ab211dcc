"""Interleaved A/B timing of two source trees with their own benchmark scripts.

Each job runs in a fresh process per tree, with ``PYTHONPATH`` set to that tree and the tree's
OWN copy of the benchmark script (an older tree's scripts import its own private modules), in
alternation A, B, B, A, A, B, ... (the order flips every round, so slow drifts of a shared
machine's load hit both sides alike). The markdown tables the scripts print are parsed; every
cell whose column header says ``(ms`` is a time. Per (job, table row, column) the script prints
the median of the A and B times over the rounds, the median of the per-round B/A ratios, and the
geometric mean of those medians (over all columns, and over lightning_gtn's own columns only:
headers naming torch, a reference or the research pattern are left out of the second). The table
so far is also printed to stderr after each round.

Jobs (``--jobs``, default ``losses stc transducer conv``):

- ``losses``: bench_losses.py's CPU rows for lightning_gtn only (its ``_make`` and
  ``_time_interleaved``, imported from the tree's own script): CTC and the sequence criterion
  on (32, 250, 30, 50) and (32, 1000, 30, 200), ASG on (32, 250, 30, 50); forward + backward.
- ``stc``: ``bench_stc.py --quick``.
- ``transducer``: bench_transducer.py's warm ``transducer_loss`` for letters ngram 0/1/2 and
  200 pieces ngram 0/1 (its ``make_tokens``/``make_batch``; the research pattern is not timed).
- ``conv``: ``bench_conv_transduce.py --quick --ref-windows 1``.
- ``rnnt``: ``bench_rnnt.py --no-memory --shapes small --repeats 3``.
- any other word: ``benchmarks/<word>.py --quick``.

Usage::

    python benchmarks/ab.py --a /work/wt/old --b /work/wt/fingerprint --rounds 3 [--jobs losses stc]

The python that runs the jobs is ``--python`` (default: this one). ``OMP_WAIT_POLICY=PASSIVE``
is set for the jobs unless the environment sets it.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import time

LOSSES_DRIVER = r"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("bl", "benchmarks/bench_losses.py")
bl = importlib.util.module_from_spec(spec); spec.loader.exec_module(bl)
reps = int(sys.argv[1])
print("### losses CPU (lightning_gtn only)\n\n| loss | B, T, C, L | lightning_gtn (ms) |\n|---|---|---|")
for kind, shapes in (("ctc", bl.SHAPES[:2]), ("seq", bl.SHAPES[:2]), ("asg", bl.SHAPES[:1])):
    for shape in shapes:
        t, = bl._time_interleaved([bl._make(kind, "ours", *shape)], reps)
        print(f"| {kind} | {', '.join(map(str, shape))} | {t * 1e3:.1f} |", flush=True)
"""

TRANSDUCER_DRIVER = r"""
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("bt", "benchmarks/bench_transducer.py")
bt = importlib.util.module_from_spec(spec); spec.loader.exec_module(bt)
from lightning_gtn.functional import transducer_loss, transitions_graph
reps = int(sys.argv[1])
words = bt.word_list()
print("### transducer_loss warm, CPU\n\n| tokens | ngram | ours warm (ms) |\n|---|---|---|")
for name, n_pieces, ngram in [("letters", 0, 0), ("letters", 0, 1), ("letters", 0, 2), ("200 pieces", 200, 0),
                              ("200 pieces", 200, 1)]:
    tokens, g2i = bt.make_tokens(words, n_pieces)
    C = len(tokens) + 1
    x, targets, lengths = bt.make_batch(words, g2i, C, seed=n_pieces + ngram)
    if ngram == 0:
        x = x.log_softmax(-1)
    params = None
    if ngram:
        torch.manual_seed(0)
        params = torch.nn.Parameter(0.1 * torch.randn(transitions_graph(ngram, C).num_arcs()))
    kw = dict(tokens=tokens, graphemes_to_idx=g2i, ngram=ngram, transition_params=params, blank="optional")
    xg = x.clone().requires_grad_()
    def step():
        xg.grad = None
        if params is not None:
            params.grad = None
        transducer_loss(xg, targets, lengths, reduction="sum", **kw).backward()
    step()
    wall, _ = bt._time(step, reps)
    print(f"| {name} | {ngram} | {wall * 1e3:.1f} |", flush=True)
"""


def job_command(job: str, python: str, reps: int):
    if job == "losses":
        return [python, "-c", LOSSES_DRIVER, str(reps)]
    if job == "transducer":
        return [python, "-c", TRANSDUCER_DRIVER, str(reps)]
    if job == "stc":
        return [python, "benchmarks/bench_stc.py", "--quick"]
    if job == "conv":
        return [python, "benchmarks/bench_conv_transduce.py", "--quick", "--ref-windows", "1"]
    if job == "rnnt":
        return [python, "benchmarks/bench_rnnt.py", "--no-memory", "--shapes", "small", "--repeats", "3"]
    return [python, f"benchmarks/{job}.py", "--quick"]


_NUM = re.compile(r"^\s*([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")


def parse_tables(text: str) -> dict:
    """{(table title, row key, column header): milliseconds} for every ``(ms`` column."""
    out, title, header = {}, "", None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            title, header = s.lstrip("#").strip(), None
            continue
        if not s.startswith("|"):
            header = None if not s else header
            continue
        cells = [c.strip() for c in s.strip("|").split("|")]
        if header is None:
            header = cells
            continue
        if all(set(c) <= set("-: ") for c in cells):
            continue
        times = [i for i, h in enumerate(header) if "(ms" in h]
        if not times:
            continue
        key = " / ".join(cells[: min(times)]) or "-"
        for i in times:
            if i < len(cells):
                m = _NUM.match(cells[i])
                if m:
                    out[(title, key, header[i])] = float(m.group(1))
    return out


def run_job(tree: str, job: str, python: str, reps: int, timeout: float):
    # the tree first, then its benchmarks folder (the scripts import their helpers, _procmem, _timing)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.path.join(tree, "benchmarks")]))
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    t0 = time.perf_counter()
    proc = subprocess.run(
        job_command(job, python, reps), cwd=tree, env=env, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{job} in {tree} failed (rc={proc.returncode}):\n{proc.stderr[-2000:]}")
    return parse_tables(proc.stdout), time.perf_counter() - t0


def _ours(column: str) -> bool:
    c = column.lower()
    return not any(w in c for w in ("torch", "research", "reference", "gtn pattern"))


def report(res, jobs, trees, rounds_done, t_start) -> str:
    """The markdown table of B/A ratios over the rounds done so far."""
    rows, logs_all, logs_ours = [], [], []
    for job in jobs:
        runs = res[(job, "A")] + res[(job, "B")]
        if not res[(job, "A")] or not res[(job, "B")]:
            continue
        keys = [k for k in res[(job, "A")][0] if all(k in t for t in runs)]
        for k in keys:
            a = [t[k] for t in res[(job, "A")]]
            b = [t[k] for t in res[(job, "B")]]
            ratios = [v / u for u, v in zip(a, b) if u > 0]
            if not ratios:
                continue
            ratio = statistics.median(ratios)
            rows.append((job, *k, statistics.median(a), statistics.median(b), ratio, min(ratios), max(ratios)))
            logs_all.append(math.log(ratio))
            if _ours(k[2]):
                logs_ours.append(math.log(ratio))
    lines = [
        f"A = {trees['A']}\nB = {trees['B']}\n{rounds_done} rounds, order flipped each round; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end; "
        f"{(time.perf_counter() - t_start) / 60:.1f} min.\n",
        "| job | table | row | column | A median (ms) | B median (ms) | B/A (median of rounds) | B/A min..max |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    for job, title, key, col, ma, mb, ratio, lo, hi in rows:
        lines.append(
            f"| {job} | {title[:50]} | {key} | {col} | {ma:.1f} | {mb:.1f} | {ratio:.3f} | {lo:.2f}..{hi:.2f} |"
        )
    if logs_all:
        lines.append(
            f"\nGeometric mean of B/A: {math.exp(statistics.fmean(logs_all)):.3f} over {len(logs_all)} times"
            + (
                f"; lightning_gtn's own columns only: {math.exp(statistics.fmean(logs_ours)):.3f} "
                f"over {len(logs_ours)}."
                if logs_ours
                else "."
            )
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="tree A (baseline)")
    p.add_argument("--b", required=True, help="tree B")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=3, help="repetitions inside the driver jobs (losses, transducer)")
    p.add_argument("--jobs", nargs="*", default=["losses", "stc", "transducer", "conv"])
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per job run")
    args = p.parse_args(argv)
    trees = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    res = {(job, side): [] for job in args.jobs for side in "AB"}
    t_start = time.perf_counter()
    for r in range(args.rounds):
        order = "AB" if r % 2 == 0 else "BA"
        for job in args.jobs:
            for side in order:
                tables, secs = run_job(trees[side], job, args.python, args.reps, args.timeout)
                res[(job, side)].append(tables)
                print(f"round {r + 1} {job} {side}: {secs:.0f} s, {len(tables)} times", file=sys.stderr, flush=True)
        if r + 1 < args.rounds:  # partial results, in case the run is cut short
            print(report(res, args.jobs, trees, r + 1, t_start), file=sys.stderr, flush=True)
    print(report(res, args.jobs, trees, args.rounds, t_start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
