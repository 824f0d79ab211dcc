"""Decoders on letter emissions: greedy, beam search (no LM), beam + lexicon + trigram LM, pyctcdecode.

B=32 utterances of T=200 frames over C=29 letters (blank, space, apostrophe, a-z). The emissions
are synthetic: sentences of a small random vocabulary rendered frame by frame (each character held
1-3 frames, blanks between) plus Gaussian noise, then log-softmax, so that the lexicon and the LM
have something to correct. The LM is estimated from other sentences of the same vocabulary: a
trigram Kneser-Ney model by ``lightning_gtn.lm.estimate``.
Times are per utterance (median of repetitions, numba compilation excluded); WER against the
rendered sentences.
"""

from __future__ import annotations

import argparse
import importlib
import math
import statistics
import time

import numpy as np

from lightning_gtn.decode import BeamSearchDecoder, Lexicon, greedy_decode
from lightning_gtn.lm import estimate
from lightning_gtn.wfst.parallel import get_num_threads, set_num_threads

LETTERS = ["_", " ", "'"] + [chr(ord("a") + i) for i in range(26)]
B, T, C = 32, 200, len(LETTERS)


def _vocab(rng, n=300):
    words = set()
    while len(words) < n:
        k = int(rng.integers(2, 8))
        words.add("".join(chr(ord("a") + int(i)) for i in rng.integers(0, 26, size=k)))
    return sorted(words)


def _sentences(rng, vocab, n, zipf=1.1):
    p = 1.0 / np.arange(1, len(vocab) + 1) ** zipf
    p /= p.sum()
    out = []
    for _ in range(n):
        k = int(rng.integers(3, 9))
        first = rng.choice(len(vocab), p=p)
        s = [vocab[first]]
        for _ in range(k - 1):  # a weak bigram structure: often the next word in the list
            nxt = (vocab.index(s[-1]) + 1) % len(vocab) if rng.random() < 0.4 else rng.choice(len(vocab), p=p)
            s.append(vocab[nxt] if isinstance(nxt, (int, np.integer)) else nxt)
        out.append(s)
    return out


def _render(rng, sentence, noise):
    frames = []
    for ch in " ".join(sentence):
        frames += [LETTERS.index(ch)] * int(rng.integers(1, 3)) + [0] * int(rng.integers(0, 2))
    frames = (frames + [0] * T)[:T]
    x = rng.normal(size=(T, C)) * noise
    x[np.arange(T), frames] += 4.0
    x -= np.log(np.exp(x).sum(-1, keepdims=True))
    return x.astype(np.float32)


def _wer(hyps, refs):
    errs = words = 0
    for h, r in zip(hyps, refs):
        d = list(range(len(r) + 1))
        for i, hw in enumerate(h, 1):
            prev, d[0] = d[0], i
            for j, rw in enumerate(r, 1):
                prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (hw != rw))
        errs += d[len(r)]
        words += len(r)
    return 100.0 * errs / max(words, 1)


def _time(fn, reps):
    fn()  # warm-up (numba compiles here)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), out


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--beam", type=int, default=50)
    args = p.parse_args(argv)
    reps = 1 if args.quick else 3
    rng = np.random.default_rng(0)
    vocab = _vocab(rng)
    train = _sentences(rng, vocab, 3000)
    refs = [s[:6] for s in _sentences(rng, vocab, B)]
    x = np.stack([_render(rng, s, noise=1.0) for s in refs])
    lm, lm_name = estimate([" ".join(s) for s in train], order=3, method="kneser_ney"), "trigram KN LM"
    lex = Lexicon.from_words(vocab, {ch: i for i, ch in enumerate(LETTERS)})
    beam = args.beam
    rows = []
    threads = get_num_threads()

    def add(name, fn, texts_of, nthreads):
        set_num_threads(nthreads)
        try:
            sec, out = _time(fn, reps)
        finally:
            set_num_threads(threads)
        rows.append((name, nthreads, sec / B * 1e3, _wer(texts_of(out), refs)))
        return sec

    add("greedy", lambda: greedy_decode(x), lambda out: ["".join(LETTERS[t] for t in s).split() for s in out], 1)
    words = lambda out: [h[0].words if h else [] for h in out]  # noqa: E731
    free = BeamSearchDecoder(LETTERS, blank=0, beam_size=beam, beam_threshold=10.0)
    ours_all = add(f"beam {beam}, no LM, all tokens", lambda: free.decode(x), words, 1)
    free5 = BeamSearchDecoder(LETTERS, blank=0, beam_size=beam, beam_threshold=10.0, token_min_logp=-5.0)
    ours_5 = add(f"beam {beam}, no LM, token_min_logp=-5", lambda: free5.decode(x), words, 1)
    full = BeamSearchDecoder(
        LETTERS, blank=0, lexicon=lex, lm=lm, lm_weight=0.5, word_score=0.5, beam_size=beam, beam_threshold=25.0
    )
    add(f"beam {beam} + lexicon ({len(vocab)} words) + {lm_name}", lambda: full.decode(x), words, 1)
    hot = {w: 0.5 for w in vocab[:30]}  # 30 hotwords worth 0.5 each (through the context graph)
    free_hot = BeamSearchDecoder(LETTERS, blank=0, beam_size=beam, beam_threshold=10.0, hotwords=hot)
    add(f"beam {beam}, no LM, all tokens, {len(hot)} hotwords", lambda: free_hot.decode(x), words, 1)
    full_hot = BeamSearchDecoder(
        LETTERS,
        blank=0,
        lexicon=lex,
        lm=lm,
        lm_weight=0.5,
        word_score=0.5,
        beam_size=beam,
        beam_threshold=25.0,
        hotwords=hot,
    )
    add(f"beam {beam} + lexicon + {lm_name}, {len(hot)} hotwords", lambda: full_hot.decode(x), words, 1)
    if threads > 1:
        add(f"beam {beam}, no LM, all tokens", lambda: free.decode(x), words, threads)
        add(f"beam {beam} + lexicon ({len(vocab)} words) + {lm_name}", lambda: full.decode(x), words, threads)
    note = ""
    try:
        pyctc = importlib.import_module("pyctcdecode")
    except ImportError:
        pyctc = None
        rows.append(
            ("pyctcdecode: not importable (install it outside the venv, put it on PYTHONPATH)", "-", math.nan, math.nan)
        )
    if pyctc is not None:
        ref = pyctc.build_ctcdecoder([""] + LETTERS[1:])

        def run(n, tmin):
            return lambda: [
                ref.decode_beams(
                    x[b], beam_width=beam, beam_prune_logp=-10.0, token_min_logp=tmin, prune_history=False
                )[0][0]
                for b in range(n)
            ]

        theirs_5 = add(
            f"pyctcdecode beam {beam}, no LM, token_min_logp=-5", run(B, -5.0), lambda out: [t.split() for t in out], 1
        )
        # all tokens is slow in pyctcdecode: timed on the first 4 utterances (WER over those only)
        set_num_threads(1)
        sec, out = _time(run(4, -1e30), 1)
        set_num_threads(threads)
        rows.append(
            (
                f"pyctcdecode beam {beam}, no LM, all tokens (4 utterances)",
                1,
                sec / 4 * 1e3,
                _wer([t.split() for t in out], refs[:4]),
            )
        )
        note = (
            f"One thread, no LM, beam {beam}: {theirs_5 / ours_5:.1f}x faster than pyctcdecode with "
            f"token_min_logp=-5, {sec / 4 / (ours_all / B):.1f}x with all tokens.\n"
        )
    lines = ["| decoder | threads | ms / utterance | WER % |", "|---|---|---|---|"]
    lines += [f"| {n} | {t} | {ms:.2f} | {w:.1f} |" for n, t, ms, w in rows]
    text = (
        f"B={B}, T={T}, C={C} letters, synthetic noisy emissions; median of {reps} (numba compile excluded).\n\n"
        + "\n".join(lines)
        + "\n\n"
        + note
    )
    print(text)
    return text


if __name__ == "__main__":
    main()
