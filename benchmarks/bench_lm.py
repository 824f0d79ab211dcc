"""n-gram LM: estimating, writing and reading ARPA files, building the decoder's arrays.

Synthetic Zipf-distributed text (seeded), word and character models. Prints a markdown table:
seconds per step, explicit n-grams, traced peak memory of ``from_arpa`` per n-gram (the reader's
``max_bytes`` check assumes ``BYTES_PER_NGRAM``), and KenLM's load time of the same file when
the ``kenlm`` module is importable.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import tracemalloc

import numpy as np

from lightning_gtn.lm import NGramLM, estimate
from lightning_gtn.lm.arpa import BYTES_PER_NGRAM


def corpus(n_sent: int, vocab: int, seed: int = 0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(vocab)]
    out = []
    for _ in range(n_sent):
        k = int(rng.integers(3, 15))
        ids = np.minimum(rng.zipf(1.3, size=k), vocab) - 1
        out.append([words[i] for i in ids])
    return out


def _time(f):
    t0 = time.perf_counter()
    r = f()
    return time.perf_counter() - t0, r


def run_case(name: str, sents, order: int, method: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lm.arpa")
        t_est, lm = _time(lambda: estimate(sents, order=order, method=method))
        t_write, _ = _time(lambda: lm.to_arpa(path))
        t_read, back = _time(lambda: NGramLM.from_arpa(path))
        tracemalloc.start()  # a second read: tracing slows allocation down many times
        NGramLM.from_arpa(path)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        t_arr, a = _time(back.arrays)
        n = sum(back.counts())
        rng = np.random.default_rng(1)
        ws = rng.integers(0, len(back.words), 20000)
        s = back.start_state()
        t0 = time.perf_counter()
        for w in ws.tolist():
            _, s = back.score(s, w)
        t_score = (time.perf_counter() - t0) / len(ws) * 1e6
        kenlm_s = "n/a"
        try:
            import kenlm

            t_k, _ = _time(lambda: kenlm.Model(path))
            kenlm_s = f"{t_k:.2f}"
        except ImportError:
            pass
        return (
            f"| {name} | {order} | {method} | {n} | {t_est:.2f} | {t_write:.2f} | {t_read:.2f} "
            f"| {t_arr:.2f} | {peak / n:.0f} | {t_score:.1f} | {kenlm_s} |"
        )


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller corpora")
    args = p.parse_args(argv)
    n = 5000 if args.quick else 40000
    words = corpus(n, 5000)
    chars = [list("_".join(s)) for s in words[: n // 4]]
    lines = [
        f"ARPA reader's memory estimate: {BYTES_PER_NGRAM} bytes per n-gram.",
        "",
        "| text | order | method | n-grams | estimate (s) | to_arpa (s) | from_arpa (s) | arrays (s) "
        "| from_arpa peak bytes / n-gram | score (us/call, Python) | kenlm load (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, sents, order, method in [
        (f"{n} word sentences", words, 3, "kneser_ney"),
        (f"{n} word sentences", words, 4, "witten_bell"),
        (f"{n // 4} char sentences", chars, 6, "kneser_ney"),
    ]:
        lines.append(run_case(name, sents, order, method))
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
