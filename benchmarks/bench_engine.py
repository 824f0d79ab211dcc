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

EPS = gtn.epsilon

GTN_CTC_MS = 130.0  # C++ GTN, same machine class (from the issue)


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
        n,
        range(width),
        range(layers * width, n),
        src,
        dst,
        lab,
        lab,
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
            out = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900, check=True
            )
        except (subprocess.SubprocessError, OSError):
            return None
    return float(out.stdout.strip().splitlines()[-1])


def _real_gtn():
    """The real ``gtn`` package (C++), when it is importable, else None."""
    try:
        import gtn as real  # noqa: PLC0415
    except ImportError:
        return None
    if getattr(real, "__name__", "") != "gtn" or real is gtn:
        return None
    return real


def _convert(lib, g: gtn.Graph, tmp: str):
    """``g`` as a graph of ``lib`` (through GTN's text format; weights included)."""
    if lib is gtn:
        return g
    path = os.path.join(tmp, "g.txt")
    gtn.savetxt(path, g)
    return lib.loadtxt(path)


def _time_side_by_side(fns: List[Callable[[], object]], repeats: int) -> List[List[float]]:
    """Times each function ``repeats`` times, interleaved (a, b, a, b, ...), after a warm-up."""
    for fn in fns:
        fn()
    out: List[List[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            out[k].append((time.perf_counter() - t) * 1e3)
    return out


def _cases(lib, tmp: str, rng_seed: int = 0):
    """``[(name, sizes, fn)]`` of the benchmark's operations written against ``lib``."""
    cases = []
    ctc0, em = _ctc_case()
    T, C = em.shape
    ctc = _convert(lib, ctc0, tmp)
    flat = np.ascontiguousarray(em, dtype=np.float32)
    import torch  # noqa: PLC0415  (set_weights from a data pointer works in both engines)

    em_t = torch.from_numpy(flat)

    def emissions(M, N, data):
        e = lib.linear_graph(M, N)
        e.set_weights(data.data_ptr())
        return e

    def ctc_step():
        e = emissions(T, C, em_t)
        lib.backward(lib.forward_score(lib.intersect(e, ctc)))

    lin = emissions(T, C, em_t)
    inter = lib.intersect(lin, ctc)
    sizes = f"T={T}, C={C}, 100 tokens; intersection {inter.num_nodes()} nodes, {inter.num_arcs()} arcs"
    cases.append(("**CTC: linear_graph + intersect + forward_score + backward**", sizes, ctc_step, None))
    cases.append(("  intersect(linear_graph(1000, 28), ctc_graph)", "", lambda: lib.intersect(lin, ctc), None))
    cases.append(("  forward_score(intersection)", "", lambda: lib.forward_score(inter), None))

    def fwd_bwd():
        inter.zero_grad()
        lib.backward(lib.forward_score(inter), retain_graph=True)

    cases.append(("  forward_score + backward (intersection only)", "", fwd_bwd, None))
    cases.append(("  viterbi_path(intersection)", "", lambda: lib.viterbi_path(inter), None))

    # 10^5-arc graphs.
    rng = np.random.default_rng(rng_seed)
    for sort in (False, True):
        g1 = layered_graph(1000, 10, 10, 50, rng, sort)
        g2 = layered_graph(1000, 10, 10, 50, rng, sort)
        out = gtn.compose(g1, g2)
        h1, h2 = _convert(lib, g1, tmp), _convert(lib, g2, tmp)
        if sort and lib is not gtn:
            for h in (h1, h2):
                h.arc_sort()
                h.mark_arc_sorted(True)
        cases.append(
            (
                f"compose, random layered graphs ({'sorted' if sort else 'unsorted'})",
                f"2 x {g1.num_arcs()} arcs -> {out.num_nodes()} nodes, {out.num_arcs()} arcs",
                (lambda h1=h1, h2=h2: lib.compose(h1, h2)),
                "large",
            )
        )
    big_w = torch.from_numpy(rng.standard_normal(100_000).astype(np.float32))
    big = emissions(1000, 100, big_w)
    ctc100_0 = ctc_graph(rng.integers(1, 100, size=100).tolist(), 0)
    ctc100 = _convert(lib, ctc100_0, tmp)
    n_out = gtn.intersect(gtn.linear_graph(1000, 100), ctc100_0)
    cases.append(
        (
            "intersect(linear_graph(1000, 100), ctc_graph)",
            f"100000 arcs -> {n_out.num_nodes()} nodes, {n_out.num_arcs()} arcs",
            lambda: lib.intersect(big, ctc100),
            "large",
        )
    )

    # A word-piece decoder's step (gtn_applications' transducer): a short best path composed
    # with a token graph of 1000 tokens where every token may follow every other one
    # (10^6 arcs), the big graph reused by every call.
    K = 1000
    tok = lib.Graph(False)
    tok.add_node(True, True)
    for _ in range(K):
        tok.add_node(False, True)
    for i in range(K):
        tok.add_arc(0, i + 1, i)
        tok.add_arc(i + 1, i + 1, i, EPS)
    arcs = np.array([(i + 1, j + 1, j) for i in range(K) for j in range(K) if i != j], dtype=np.int64)
    for a, b, lab in arcs.tolist():
        tok.add_arc(a, b, lab)
    tok.arc_sort()
    path = lib.Graph(False)
    labels = rng.integers(0, K, size=100).tolist()
    path.add_node(True)
    for t, lab in enumerate(labels):
        path.add_node(False, t == len(labels) - 1)
        path.add_arc(t, t + 1, lab)
    cases.append(
        (
            "compose(path of 100 labels, token graph)",
            f"token graph {tok.num_arcs()} arcs",
            lambda: lib.compose(path, tok),
            None,
        )
    )

    # GTN's n-gram CTC benchmark shape: CTC graph x bigram transitions x emissions, and the
    # normaliser emissions x transitions, forward scores and backward.
    M = 30
    trans = lib.Graph()
    for _ in range(M):
        trans.add_node(True, True)
    for i in range(M):
        for m in range(M):
            trans.add_arc(i, m, m)
    trans.arc_sort()
    w200 = torch.from_numpy(rng.standard_normal(200 * M).astype(np.float32))
    ctc10 = _convert(lib, ctc_graph(rng.integers(1, M, size=10).tolist(), 0), tmp)
    ctc10.arc_sort()

    def ngram():
        em200 = emissions(200, M, w200)
        num = lib.forward_score(lib.intersect(lib.intersect(ctc10, trans), em200))
        den = lib.forward_score(lib.intersect(em200, trans))
        lib.backward(lib.subtract(den, num))

    cases.append(
        (
            "n-gram CTC: intersect(intersect(ctc, bigram), emissions) and normaliser, + backward",
            f"T=200, C={M}, 10 tokens, {trans.num_arcs()} bigram arcs",
            ngram,
            None,
        )
    )
    return cases


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions, no cold-compile row")
    p.add_argument("--repeats", type=int, default=None)
    args = p.parse_args(argv)
    reps = args.repeats or (5 if args.quick else 21)
    real = _real_gtn()
    libs = [gtn] + ([real] if real is not None else [])
    with tempfile.TemporaryDirectory() as tmp:
        per_lib = [_cases(lib, tmp) for lib in libs]
        rows = []
        for k, (name, sizes, _, kind) in enumerate(per_lib[0]):
            r = max(3, reps // 3) if kind == "large" else reps
            times = _time_side_by_side([cases[k][2] for cases in per_lib], r)
            ours = statistics.median(times[0])
            if real is not None:
                theirs = statistics.median(times[1])
                ref = f"{theirs:.1f} | {ours / theirs:.2f}"
            else:
                ref = f"{GTN_CTC_MS:.0f} (quoted) | {ours / GTN_CTC_MS:.2f}" if k == 0 else " | "
            rows.append((name, sizes, f"{ours:.1f}", f"{min(times[0]):.1f}", ref))
            print(f"  {name.strip('* ')}: {ours:.1f} ms", flush=True)

    # First calls in a fresh process.
    warm = _first_call_ms(cold=False)
    if warm is not None:
        rows.append(("first CTC step in a new process (numba cache warm)", "import included", f"{warm:.0f}", "", " | "))
    if not args.quick:
        cold = _first_call_ms(cold=True)
        if cold is not None:
            rows.append(
                (
                    "first CTC step in a new process (empty numba cache)",
                    "compilation included",
                    f"{cold:.0f}",
                    "",
                    " | ",
                )
            )

    gtn_head = "GTN C++ ms (measured, interleaved)" if real is not None else "GTN C++ ms"
    head = (
        f"| operation | sizes | median ms | best ms | {gtn_head} | ratio to GTN |\n" "|---|---|---:|---:|---:|---:|\n"
    )
    table = head + "\n".join("| " + " | ".join(r) + " |" for r in rows)
    note = (
        "the real gtn package was importable: its column is measured in the same process, runs " "interleaved with ours"
        if real is not None
        else "the real gtn package is not importable here: the GTN figure is the one quoted in the issue "
        "(about 130 ms on these machines); put a GTN build on PYTHONPATH to measure it side by side"
    )
    table += f"\n\n{reps} runs per row (fewer for the large graphs), {os.cpu_count()} CPU cores; " f"{note}.\n"
    print(table)
    return table


if __name__ == "__main__":
    main(sys.argv[1:])
