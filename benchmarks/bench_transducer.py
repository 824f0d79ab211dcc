"""The word-piece transducer loss: batched ``transducer_loss`` against the research pattern.

The research pattern is gtn_applications' ``TransducerLossFunction`` run on
:mod:`lightning_gtn.wfst` (its GTN-compatible engine): per example, build the target chain,
compose it with the lexicon and the token graph, intersect with the emissions (and the
transitions), ``forward_score``, then ``gtn.backward`` per example, over ``gtn.parallel_for``.

Inputs: batch 32, T in 100..150, targets of 20-40 graphemes made of words of a fixed list
(the embedded text task's vocabulary, words joined by ``|``), blank optional. Tokens: the
letters (and ``|``), plus the most frequent substrings (2..6 graphemes) of the word list to make
~200 or ~1000 word pieces. Emissions are log-probabilities (ngram 0) or raw scores.

Columns: forward + backward median wall time of ``transducer_loss`` with the numerator graphs and
lattices cached (a training loop meets the same transcripts every epoch: "warm"), and with every
cache emptied before the call ("cold": all graphs and lattices built), the research pattern's time, and the ratio
research / warm; then the process CPU time (all threads) of both and its ratio, steadier than
wall time on a shared machine. Run with ``OMP_WAIT_POLICY=PASSIVE`` on a machine with few cores (see
``bench_losses.py``: torch's spinning OpenMP workers take a core from the scoring pool).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections import Counter

import numpy as np
import torch

import lightning_gtn.wfst as gtn
from lightning_gtn.functional import full_ngram_transitions, transducer_loss
from lightning_gtn.losses import transducer as td

B = 32


def word_list():
    from lightning_gtn.lightning.text import vocabulary_words

    return [w for w in vocabulary_words() if w.isalpha()]


def make_tokens(words, n_pieces):
    letters = sorted({c for w in words for c in w} | {"|"})
    counts = Counter()
    for w in words:
        for n in range(2, 7):
            for i in range(len(w) - n + 1):
                counts[w[i : i + n]] += 1
    pieces = [s for s, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n_pieces]]
    return letters + pieces, {c: i for i, c in enumerate(letters)}


def make_batch(words, g2i, C, seed):
    rng = np.random.default_rng(seed)
    targets, lengths = [], []
    for _ in range(B):
        n = int(rng.integers(20, 41))
        text = ""
        while len(text) < n:
            text = (text + "|" if text else "") + words[int(rng.integers(len(words)))]
        text = text[:n].strip("|")
        targets.append([g2i[c] for c in text])
        lengths.append(int(rng.integers(100, 151)))
    T = max(lengths)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g)
    return x, targets, torch.tensor(lengths)


# ---------------------------------------------------------------------------
# the research pattern on lightning_gtn.wfst
# ---------------------------------------------------------------------------


def _chain(seq):
    g = gtn.Graph(False)
    g.add_node(True, len(seq) == 0)
    for i, s in enumerate(seq):
        g.add_node(False, i == len(seq) - 1)
        g.add_arc(i, i + 1, s)
    return g


def _lexicon(tokens, g2i):
    g = gtn.Graph(False)
    g.add_node(True, True)
    for i, wp in enumerate(tokens):
        prev = 0
        for ch in wp[:-1]:
            n = g.add_node()
            g.add_arc(prev, n, g2i[ch], gtn.epsilon)
            prev = n
        g.add_arc(prev, 0, g2i[wp[-1]], i)
    g.arc_sort()
    return g


def _token_graph(ntoks):  # blank "optional", repeats allowed
    g = gtn.Graph(False)
    g.add_node(True, True)
    for _ in range(ntoks):
        g.add_node(False, True)
    g.add_node()
    g.add_arc(0, ntoks + 1, ntoks, gtn.epsilon)
    g.add_arc(ntoks + 1, 0, gtn.epsilon)
    for i in range(ntoks):
        g.add_arc(0, i + 1, i)
        g.add_arc(i + 1, i + 1, i, gtn.epsilon)
        g.add_arc(i + 1, 0, gtn.epsilon)
    return g


class Research:
    def __init__(self, tokens, g2i, ngram):
        self.tokens_g = _token_graph(len(tokens))
        self.tokens_g.arc_sort(True)
        self.lexicon = _lexicon(tokens, g2i)
        self.trans = full_ngram_transitions(ngram, len(tokens) + 1, True) if ngram else None
        if self.trans is not None:
            self.trans.arc_sort()

    def __call__(self, x, targets, lengths, params):
        """forward + backward: returns the mean loss (the research "none") and the gradients."""
        B_, T, C = x.shape
        trans = self.trans
        if trans is not None:
            trans.set_weights(params.detach().cpu().contiguous().numpy())
            trans.calc_grad = True
            trans.zero_grad()
        losses, ems = [None] * B_, [None] * B_

        def process(b):
            Tb = int(lengths[b])
            em = gtn.linear_graph(Tb, C, gtn.Device(gtn.CPU), True)
            em.set_weights(x[b, :Tb].contiguous().numpy())
            tgt = _chain(targets[b])
            tgt.arc_sort(True)
            tt = gtn.remove(gtn.project_output(gtn.compose(tgt, self.lexicon)))
            tt.arc_sort()
            al = gtn.project_input(gtn.remove(gtn.compose(self.tokens_g, tt)))
            al.arc_sort()
            if trans is not None:
                al = gtn.intersect(trans, al)
                al.arc_sort()
            loss = gtn.forward_score(gtn.intersect(em, al))
            if trans is not None:
                loss = gtn.subtract(loss, gtn.forward_score(gtn.intersect(em, trans)))
            losses[b] = gtn.negate(loss)
            ems[b] = em

        gtn.parallel_for(process, range(B_))
        grad = torch.zeros(B_, T, C)

        def back(b):
            gtn.backward(losses[b])
            Tb = int(lengths[b])
            grad[b, :Tb] = torch.from_numpy(ems[b].grad().weights_to_numpy()).view(Tb, C)

        gtn.parallel_for(back, range(B_))
        pgrad = torch.from_numpy(trans.grad().weights_to_numpy()) if trans is not None else None
        return sum(l.item() for l in losses) / B_, grad, pgrad


def _time(fn, reps):
    """Median wall time and median process CPU time (all threads) of ``fn()``."""
    wall, cpu = [], []
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


CONFIGS = [
    ("letters", 0, 0),
    ("letters", 0, 1),
    ("letters", 0, 2),
    ("200 pieces", 200, 0),
    ("200 pieces", 200, 1),
    ("200 pieces", 200, 2),
    ("1000 pieces", 1000, 0),
    ("1000 pieces", 1000, 1),
]
#: the research pattern over a word-piece bigram (52k transition arcs per frame) takes ~10 s a call:
#: timed twice
SLOW_RESEARCH_REPS = 2


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--check", action="store_true", help="also compare the losses (float32)")
    args = p.parse_args(argv)
    reps = 2 if args.quick else 7
    words = word_list()
    rows = [
        f"Transducer loss, CPU, batch {B}, T 100..150, targets 20-40 graphemes, blank optional; "
        f"forward + backward, median of {reps}; lightning_gtn.wfst pool of "
        f"{gtn.get_num_threads()} threads (both sides); OMP_WAIT_POLICY="
        f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}; load average at start {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores.\n",
        "| tokens | C | ngram | ours warm (ms) | ours cold (ms) | research pattern (ms) | research / warm "
        "| CPU time: ours warm / research (ms) | CPU ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, n_pieces, ngram in CONFIGS:
        tokens, g2i = make_tokens(words, n_pieces)
        C = len(tokens) + 1
        x, targets, lengths = make_batch(words, g2i, C, seed=n_pieces + ngram)
        if ngram == 0:
            x = x.log_softmax(-1)
        params = None
        if ngram:
            params = torch.nn.Parameter(0.1 * torch.randn(full_ngram_transitions(ngram, C).num_arcs()))
        kw = dict(tokens=tokens, graphemes_to_idx=g2i, ngram=ngram, transition_params=params, blank="optional")
        xg = x.clone().requires_grad_()

        # the loop's values are bound as default arguments: each function runs in its own iteration
        def ours(xg=xg, params=params, targets=targets, lengths=lengths, kw=kw):
            xg.grad = None
            if params is not None:
                params.grad = None
            loss = transducer_loss(xg, targets, lengths, reduction="sum", **kw)
            loss.backward()
            return loss

        def cold(tokens=tokens, g2i=g2i, ngram=ngram, ours=ours):
            crit, _ = td.transducer_criterion(tokens, g2i, ngram, None, "optional")
            crit.cache.clear()
            crit.lat_cache.clear()
            ours()

        ours()  # warm-up: numba, the criterion, the graphs
        warm_t, warm_c = _time(ours, reps)
        cold_t, _ = _time(cold, reps)
        research = Research(tokens, g2i, ngram)
        research(x, targets, lengths, params)  # warm-up
        slow = ngram == 2 and n_pieces > 0
        res_t, res_c = _time(
            functools.partial(research, x, targets, lengths, params), min(reps, SLOW_RESEARCH_REPS) if slow else reps
        )
        if args.check:
            want = research(x, targets, lengths, params)[0] * B
            got = float(ours())
            assert abs(got - want) <= 1e-3 * max(1.0, abs(want)), (name, ngram, got, want)
        rows.append(
            f"| {name} | {C} | {ngram} | {warm_t * 1e3:.1f} | {cold_t * 1e3:.1f} | {res_t * 1e3:.1f} | "
            f"{res_t / warm_t:.1f}x | {warm_c * 1e3:.0f} / {res_c * 1e3:.0f} | {res_c / warm_c:.1f}x |"
        )
    text = "\n".join(rows)
    print(text)
    return text


if __name__ == "__main__":
    main()
