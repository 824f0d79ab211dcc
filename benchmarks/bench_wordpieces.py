"""Speed and size of the word-piece trainer and of pruned n-gram transition graphs.

Transcripts are synthetic but shaped like handwriting or speech transcripts: 10,000 lines of
about eight words drawn from a Zipf-distributed vocabulary of 20,000 made-up words. The first
table times :func:`lightning_gtn.wordpieces.train_word_pieces`; the second builds token
transition graphs over the word pieces of the lines (:func:`lightning_gtn.wfst.ngram.transitions_graph`)
for several orders and pruning thresholds, and shows their size next to the full
``num_tokens ** order`` graph of the research code's unpruned construction.

Run: ``python benchmarks/bench_wordpieces.py [--quick]``. Prints two markdown tables and
returns them from ``main``.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import List, Optional

from lightning_gtn.wfst.ngram import transitions_graph
from lightning_gtn.wordpieces import greedy_segment, train_word_pieces

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def transcripts(num_lines: int, vocab: int = 20_000, seed: int = 0) -> List[str]:
    rng = random.Random(seed)
    # Made-up words with English-like letter frequencies (vowels common, q/x/z rare).
    weights = [
        8,
        1.5,
        2.8,
        4.3,
        12.7,
        2.2,
        2.0,
        6.1,
        7.0,
        0.2,
        0.8,
        4.0,
        2.4,
        6.7,
        7.5,
        1.9,
        0.1,
        6.0,
        6.3,
        9.1,
        2.8,
        1.0,
        2.4,
        0.2,
        2.0,
        0.1,
    ]
    words = sorted({"".join(rng.choices(LETTERS, weights, k=rng.randint(1, 10))) for _ in range(vocab)})
    rng.shuffle(words)
    zipf = [1.0 / (r + 1) for r in range(len(words))]
    return [" ".join(rng.choices(words, zipf, k=rng.randint(3, 12))) for _ in range(num_lines)]


def _time(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main(argv: Optional[List[str]] = None) -> str:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="one repetition, 2,000 lines")
    args = p.parse_args(argv)
    lines = 2_000 if args.quick else 10_000
    repeats = 1 if args.quick else 3
    texts = transcripts(lines)
    chars = sum(map(len, texts))

    rows = ["| lines | characters | pieces | train (s) |", "|---:|---:|---:|---:|"]
    pieces_by_n = {}
    for n in (200, 1000):
        sec, pieces = _time(lambda n=n: train_word_pieces(texts, n, progress=False), repeats)
        pieces_by_n[n] = pieces
        rows.append(f"| {lines} | {chars} | {len(pieces)} | {sec:.2f} |")
    table1 = "\n".join(rows)

    pieces = pieces_by_n[200]
    seqs = [greedy_segment(t, pieces) for t in texts]
    num_tokens = len(pieces) + 1  # the pieces and a blank
    rows = [
        "| order | prune | blank | nodes | arcs | num_tokens ** order | build (s) |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for order, prune, blank in (
        (2, 0, "none"),
        (2, 5, "none"),
        (2, 5, "optional"),
        (3, 5, "none"),
        (3, 10, "optional"),
    ):
        sec, g = _time(
            lambda order=order, prune=prune, blank=blank: transitions_graph(
                seqs, num_tokens, order=order, prune=prune, blank=blank, init="counts"
            ),
            repeats,
        )
        rows.append(
            f"| {order} | {prune} | {blank} | {g.num_nodes()} | {g.num_arcs()} | "
            f"{num_tokens ** order} | {sec:.2f} |"
        )
    table2 = "\n".join(rows)
    out = (
        f"Word pieces from {lines} synthetic transcripts (Zipf vocabulary of 20k words):\n\n{table1}\n\n"
        f"Transition graphs over those {len(pieces)} pieces (+ blank):\n\n{table2}\n"
    )
    print(out)
    return out


if __name__ == "__main__":
    main()
