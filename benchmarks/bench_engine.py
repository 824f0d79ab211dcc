"""Speed of the WFST engine's heavy operations (compose/intersect, forward_score, backward).

The headline row is the issue's benchmark: one example of T=1000 frames over C=28 labels
against the CTC graph of a 100-token target, ``intersect(linear_graph(1000, 28), ctc)``,
then ``forward_score`` and ``backward``. The C++ GTN takes about 130 ms for it on the
project's 2-core machines.

Run: ``python benchmarks/bench_engine.py [--quick] [--repeats N]``. Prints a markdown table
(median and best of N runs, in ms) and returns it from ``main``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, List, Optional

import numpy as np

import lightning_gtn.wfst as gtn
from lightning_gtn.wfst.criterion import ctc_graph

GTN_CTC_MS = 130.0  # C++ GTN, same machine class (from the issue)


def _time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> List[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def _ctc_case(T=1000, C=28, L=100, seed=0):
    rng = np.random.default_rng(seed)
    target = rng.integers(1, C, size=L).tolist()
    emissions = rng.standard_normal((T, C)).astype(np.float32)
    return ctc_graph(target, 0), emissions


def _ctc_step(ctc, emissions):
    T, C = emissions.shape
    em = gtn.linear_graph(T, C)
    em.set_weights(emissions)
    score = gtn.forward_score(gtn.intersect(em, ctc))
    gtn.backward(score)
    return em.grad()


def layered_graph(layers: int, width: int, degree: int, labels: int, rng, sort: bool) -> gtn.Graph:
    """A random acyclic graph of ``layers + 1`` layers of ``width`` nodes; every node has
    ``degree`` arcs to random nodes of the next layer with random labels. Two such graphs
    compose into about ``layers * width**2`` states, so the result stays moderate."""
    n = (layers + 1) * width
    src = np.repeat(np.arange(layers * width), degree)
    layer = src // width
    dst = (layer + 1) * width + rng.integers(0, width, size=src.size)
    lab = rng.integers(0, labels, size=src.size)
    g = gtn.Graph._from_arrays(
        n, range(width), range(layers * width, n), src, dst, lab, lab,
        rng.standard_normal(src.size).astype(np.float32),
    )
    if sort:
        g.arc_sort()
        g.mark_arc_sorted(True)  # an acceptor: sorted by input labels is sorted by output labels
    return g


def _first_call_ms(cold: bool) -> Optional[float]:
    """Time of import + the first headline step in a fresh process (with an empty numba
    cache when ``cold``, i.e. compilation included)."""
    code = (
        "import time; t=time.perf_counter();"
        "import sys; sys.path.insert(0, {here!r});"
        "import bench_engine as b; ctc, em = b._ctc_case(); b._ctc_step(ctc, em);"
        "print((time.perf_counter()-t)*1e3)"
    ).format(here=os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        if cold:
            env["NUMBA_CACHE_DIR"] = tmp
        try:
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                 text=True, timeout=900, check=True)
        except (subprocess.SubprocessError, OSError):
            return None
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions, no cold-compile row")
    p.add_argument("--repeats", type=int, default=None)
    args = p.parse_args(argv)
    reps = args.repeats or (5 if args.quick else 21)
    rows = []

    def row(op, sizes, times, ref=""):
        rows.append((op, sizes, f"{statistics.median(times):.1f}", f"{min(times):.1f}", ref))

    # Headline: CTC of one example through the engine.
    ctc, em = _ctc_case()
    T, C = em.shape
    lin = gtn.linear_graph(T, C)
    lin.set_weights(em)
    inter = gtn.intersect(lin, ctc)
    sizes = (f"T={T}, C={C}, 100 tokens; intersection {inter.num_nodes()} nodes, "
             f"{inter.num_arcs()} arcs")
    row("**CTC: linear_graph + intersect + forward_score + backward**", sizes,
        _time(lambda: _ctc_step(ctc, em), reps), f"{GTN_CTC_MS:.0f}")
    row("  intersect(linear_graph(1000, 28), ctc_graph)", "", _time(lambda: gtn.intersect(lin, ctc), reps))
    row("  forward_score(intersection)", "", _time(lambda: gtn.forward_score(inter), reps))

    def fwd_bwd():
        inter.zero_grad()
        gtn.backward(gtn.forward_score(inter), retain_graph=True)

    row("  forward_score + backward (intersection only)", "", _time(fwd_bwd, reps))
    row("  viterbi_path(intersection)", "", _time(lambda: gtn.viterbi_path(inter), reps))

    # 10^5-arc graphs.
    rng = np.random.default_rng(0)
    for sort in (False, True):
        g1 = layered_graph(1000, 10, 10, 50, rng, sort)
        g2 = layered_graph(1000, 10, 10, 50, rng, sort)
        out = gtn.compose(g1, g2)
        row(f"compose, random layered graphs ({'sorted' if sort else 'unsorted'})",
            f"2 x {g1.num_arcs()} arcs -> {out.num_nodes()} nodes, {out.num_arcs()} arcs",
            _time(lambda: gtn.compose(g1, g2), max(3, reps // 3)))
    big = gtn.linear_graph(1000, 100)
    big.set_weights(rng.standard_normal(100_000).astype(np.float32))
    ctc100 = ctc_graph(rng.integers(1, 100, size=100).tolist(), 0)
    out = gtn.intersect(big, ctc100)
    row("intersect(linear_graph(1000, 100), ctc_graph)",
        f"{big.num_arcs()} arcs -> {out.num_nodes()} nodes, {out.num_arcs()} arcs",
        _time(lambda: gtn.intersect(big, ctc100), max(3, reps // 3)))

    # GTN's n-gram CTC benchmark shape: CTC graph x bigram transitions x emissions, and the
    # normaliser emissions x transitions, forward scores and backward.
    M = 30
    trans = gtn.Graph()
    for _ in range(M):
        trans.add_node(True, True)
    for i in range(M):
        for m in range(M):
            trans.add_arc(i, m, m)
    trans.arc_sort()
    em200 = gtn.linear_graph(200, M)
    em200.set_weights(rng.standard_normal(200 * M).astype(np.float32))
    ctc10 = ctc_graph(rng.integers(1, M, size=10).tolist(), 0)
    ctc10.arc_sort()

    def ngram():
        num = gtn.forward_score(gtn.intersect(gtn.intersect(ctc10, trans), em200))
        den = gtn.forward_score(gtn.intersect(em200, trans))
        gtn.backward(gtn.subtract(den, num))

    row("n-gram CTC: intersect(intersect(ctc, bigram), emissions) and normaliser, + backward",
        f"T=200, C={M}, 10 tokens, {trans.num_arcs()} bigram arcs", _time(ngram, reps))

    # First calls in a fresh process.
    warm = _first_call_ms(cold=False)
    if warm is not None:
        rows.append(("first CTC step in a new process (numba cache warm)", "import included",
                     f"{warm:.0f}", "", ""))
    if not args.quick:
        cold = _first_call_ms(cold=True)
        if cold is not None:
            rows.append(("first CTC step in a new process (empty numba cache)", "compilation included",
                         f"{cold:.0f}", "", ""))

    head = "| operation | sizes | median ms | best ms | GTN C++ ms |\n|---|---|---:|---:|---:|\n"
    table = head + "\n".join("| " + " | ".join(r) + " |" for r in rows)
    table += f"\n\n{reps} runs per row (fewer for the large graphs), {os.cpu_count()} CPU cores.\n"
    print(table)
    return table


if __name__ == "__main__":
    main(sys.argv[1:])
