"""Size and build time of LF-MMI denominator graphs (``lightning_gtn.lm.denominator``).

Transcripts: the sentences of the default ``data=text`` task (``make_sentences(8000, 0)``, its
training-set size), as characters (``N`` = the distinct characters) and as 200 word pieces
(``train_word_pieces``, greedy segmentation). For each token set, n-gram order and topology the
table gives the token n-gram ``P`` and the denominator ``topology o P``: nodes, arcs, and the
time to build the graph from the estimated model (back-off folding + composition, best of
``--reps``), next to the time :func:`lightning_gtn.lm.estimate` takes to count and smooth the
transcripts (once per token set and order; ``denominator_graph`` pays both).

Run: ``python benchmarks/bench_mmi_graphs.py [--quick]``. Prints a markdown table and returns it
from ``main``.
"""

from __future__ import annotations

import argparse
import time
from typing import Optional

import numpy as np

from lightning_gtn.core.topologies import MMI_TOPOLOGIES, compose_token_acceptor
from lightning_gtn.lightning.text import make_sentences
from lightning_gtn.lm.denominator import token_lm, token_lm_tables
from lightning_gtn.wordpieces import greedy_segment, train_word_pieces


def _best(reps: int, fn, *args, **kwargs):
    best, out = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv: Optional[list] = None) -> str:
    """Prints and returns the markdown table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1000 sentences, order 2 only, 1 rep")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    num = 1000 if args.quick else 8000
    reps = 1 if args.quick else args.reps
    orders = (2,) if args.quick else (2, 3)
    sents = make_sentences(num, 0)
    chars = sorted(set("".join(sents)))
    char_seqs = [[chars.index(c) + 1 for c in s] for s in sents]
    pieces = train_word_pieces(sents, 200)
    piece_seqs = [[i + 1 for i in greedy_segment(s, pieces)] for s in sents]
    rows = [
        "| tokens | N | order | estimate (s) | P states / arcs | topology | nodes | arcs | graph build (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, seqs, n in (("characters", char_seqs, len(chars)), ("word pieces", piece_seqs, len(pieces))):
        for order in orders:
            t_est, lm = _best(1, token_lm, seqs, n, order=order)
            t_tab, (table, lp, start, _) = _best(reps, token_lm_tables, lm, n)
            accept = np.ones(table.shape[0], dtype=bool)
            for topo in MMI_TOPOLOGIES:
                t_cmp, g = _best(reps, compose_token_acceptor, n, topo, table, lp, start, accept)
                rows.append(
                    f"| {name} | {n} | {order} | {t_est:.2f} | {table.shape[0]} / {table.shape[0] * n} | {topo} "
                    f"| {g.num_nodes()} | {g.num_arcs()} | {1000 * (t_tab + t_cmp):.1f} |"
                )
    out = "\n".join(rows)
    print(out)
    return out


if __name__ == "__main__":
    main()
