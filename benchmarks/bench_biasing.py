"""Context biasing on the text task: its cost with 1,000 phrases, and boosted rare words.

Two sources of frames, beam 16 either way, one thread, numba compilation excluded:

* by default (what needs no checkpoint, as ``bench_decode.py`` does): sentences of the text task's
  grammar (``lightning_gtn.lightning.text.make_sentences``: 8,000 "training" sentences, the
  evaluated lines distinct from them) rendered as noisy frame log-probabilities over its
  characters, where a character is sometimes confusable with another (an error the frames alone
  cannot fix). The CTC lines go to :class:`lightning_gtn.decode.BeamSearchDecoder`
  (lexicon-free); the transducer lines (one frame a character, blanks after) to
  ``modified_beam_search`` over a memoryless network whose joiner returns the frame;
* with ``--ctc`` / ``--rnnt`` checkpoints of the text task (``lightning-gtn-train data=text``,
  ``... loss=rnnt``), the validation and test lines of their data config, through
  ``model.decode`` with ``decoder=beam`` / ``decoder=rnnt_beam`` and the ``context_*`` keys.

For each: the decoding time with no context graph and with 1,000 distractor phrases (word pairs of
the grammar that the evaluated lines do not contain), the runs alternated, ratio of the medians;
then the ``--rare`` words of the evaluated lines that are rarest in the training sentences boosted
(one phrase each) at a few ``context_score`` values: their recall (the fraction of their
occurrences in the references that the hypothesis of the line has) and the WER of the other
words (both sides with the boosted words removed).

    .venv/bin/python benchmarks/bench_biasing.py

With trained checkpoints (what ``docs/dev/context_biasing.md`` records: each model trained
7 minutes on the 2-core machine, outputs outside the repository)::

    .venv/bin/lightning-gtn-train data=text trainer.max_time=00:00:07:00 hydra.run.dir=/tmp/biasckpt/ctc
    .venv/bin/lightning-gtn-train data=text loss=rnnt trainer.max_time=00:00:07:00 hydra.run.dir=/tmp/biasckpt/rnnt
    .venv/bin/python benchmarks/bench_biasing.py --ctc /tmp/biasckpt/ctc/checkpoints/best.ckpt --lines 500
    .venv/bin/python benchmarks/bench_biasing.py --rnnt /tmp/biasckpt/rnnt/checkpoints/best.ckpt --transducer-lines 150

(``--lines`` and ``--transducer-lines`` bound the evaluated lines, the validation lines first;
the transducer search over a trained network costs about five times the CTC search a line.)
"""

from __future__ import annotations

import argparse
import collections
import random
import statistics
import time

import numpy as np
import torch
from bench_decode import _wer as word_error_rate  # noqa: E402

from lightning_gtn.lightning.text import TEXT_CHARS, make_sentences


def _load(path):
    from lightning_gtn.evaluate import load_model
    from lightning_gtn.lightning import TextLinesDataModule

    model = load_model(path)
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    dm = TextLinesDataModule(**ckpt["datamodule_hyper_parameters"])
    return model.eval(), dm


def _frames(model, dm, limit):
    dm.setup("fit")
    out, n = [], 0
    with torch.no_grad():
        for loader in (dm.val_dataloader(), dm.test_dataloader()):
            for batch in loader:
                # what model.decode reads: emissions, or a transducer's encoder frames
                e, lens = model.outputs(batch["inputs"], batch["input_lengths"])
                k = min(len(batch["texts"]), limit - n)  # the first ``limit`` lines
                out.append((e[:k].float(), lens[:k], list(batch["texts"])[:k]))
                n += k
                if n >= limit:
                    return out
    return out


def _wer(hyps, refs, drop):
    """Word error rate (%) with the words of ``drop`` removed from both sides."""

    def keep(t):
        return [w for w in t.split() if w not in drop]

    return word_error_rate([keep(h) for h in hyps], [keep(r) for r in refs])


def _recall(hyps, refs, boosted):
    hit = total = 0
    for h, r in zip(hyps, refs):
        hc = collections.Counter(w for w in h.split() if w in boosted)
        for w, k in collections.Counter(w for w in r.split() if w in boosted).items():
            total += k
            hit += min(k, hc[w])
    return 100.0 * hit / max(total, 1), total


def _phrases(refs, train, args):
    """The rarest words of ``refs`` in ``train`` (to boost) and distractor word pairs."""
    freq = collections.Counter(w for t in train for w in t.split())
    ref_words = collections.Counter(w for t in refs for w in t.split())
    rare = sorted(ref_words, key=lambda w: (freq[w], w))[: args.rare]
    vocab = sorted(set(freq) | set(ref_words))
    rng = random.Random(0)
    seen = {(a, b) for t in refs for a, b in zip(t.split(), t.split()[1:])}
    distract: set = set()
    while len(distract) < args.phrases:
        a, b = rng.choice(vocab), rng.choice(vocab)
        if (a, b) not in seen:
            distract.add(f"{a} {b}")
    return rare, sorted(distract)


def _measure(name, decode, refs, train, args, rows, timing):
    """``decode(phrases, score) -> (texts, seconds per line)``; appends the table rows."""
    rare, distract = _phrases(refs, train, args)
    decode([], 1.0)  # compile
    t_none, t_ctx = [], []
    plain = None
    for _ in range(args.reps):
        plain, dt = decode([], 1.0)
        t_none.append(dt)
        _, dt = decode(distract, 1.0)
        t_ctx.append(dt)
    a, b = statistics.median(t_none), statistics.median(t_ctx)
    timing.append((name, len(refs), a * 1e3, b * 1e3, b / a))
    boosted = set(rare)
    rec, occ = _recall(plain, refs, boosted)
    rows.append((name, "none", rec, occ, _wer(plain, refs, boosted), _wer(plain, refs, set())))
    for score in args.scores:
        hyps, _ = decode(rare, score)
        rec, occ = _recall(hyps, refs, boosted)
        rows.append((name, f"{score:g}", rec, occ, _wer(hyps, refs, boosted), _wer(hyps, refs, set())))
    return len(rare)


def _checkpoint(name, path, args, rows, timing):
    model, dm = _load(path)
    batches = _frames(model, dm, min(args.lines, args.transducer_lines) if model.reads_network else args.lines)
    refs = [t for _, _, texts in batches for t in texts]
    base = {"name": "rnnt_beam" if model.reads_network else "beam", "beam_size": args.beam}
    if model.reads_network:
        base["max_symbols_per_frame"] = 3

    def decode(phrases, score):
        model.configure_decoder(dict(base, context_phrases=phrases, context_score=score))
        t0 = time.perf_counter()
        hyps = [h for e, n, _ in batches for h in model.decode(e, n)]
        return hyps, (time.perf_counter() - t0) / len(refs)

    return _measure(name, decode, refs, list(dm.train_set.texts), args, rows, timing)


# ----------------------------------------------------------------------------- synthetic emissions
CHARS = ["_"] + list(TEXT_CHARS)  # blank 0, then the text task's characters


def _render(rng, text, noise, confuse, transducer):
    """Frame log-probs of ``text``: CTC, each character 2-3 frames then 0-1 blanks; transducer,
    each character one frame then 1-2 blank frames. With probability ``confuse`` a character's
    frames also favour another character, by up to one nat more or less (errors the frames alone
    cannot fix); Gaussian noise on top."""
    C = len(CHARS)
    rows = []
    prev = -1
    for ch in text:
        c = CHARS.index(ch)
        if c == prev and not transducer:  # CTC needs a blank between repeated characters
            rows.append((0, -1, 0.0))
        prev = c
        other = int(rng.integers(1, C)) if rng.random() < confuse else -1
        d = float(rng.uniform(-1.0, 1.0))
        k = 1 if transducer else int(rng.integers(2, 4))
        for _ in range(k):
            rows.append((c, other, d))
        for _ in range(int(rng.integers(1, 3)) if transducer else int(rng.integers(0, 2))):
            rows.append((0, -1, 0.0))
    x = rng.normal(size=(len(rows), C)) * noise
    for t, (c, other, d) in enumerate(rows):
        x[t, c] += 5.0
        if other >= 0 and other != c:
            x[t, other] += 5.0 + d
    x -= np.logaddexp.reduce(x, axis=-1, keepdims=True)
    return x.astype(np.float32)


class _FrameTransducer:
    """A memoryless transducer whose joiner returns the encoder frame: the search reads the
    rendered frame log-probs (blank 0) as ``log_softmax(enc + 0)``."""

    def __init__(self, V):
        self.V = V

    def predict(self, tokens, state=None):
        return torch.zeros(*tokens.shape, self.V), None

    def select_state(self, state, index):
        return None

    def join(self, enc, pred):
        return enc + pred


def _synthetic(name, transducer, args, rows, timing):
    from lightning_gtn.decode import BeamSearchDecoder, ContextGraph
    from lightning_gtn.decode.transducer_beam import modified_beam_search

    n = args.lines if not transducer else min(args.lines, args.transducer_lines)
    train = make_sentences(8000, seed=0)
    refs = make_sentences(n, seed=1, exclude=train)
    rng = np.random.default_rng(2 + transducer)
    frames = [_render(rng, t, args.noise, args.confuse, transducer) for t in refs]
    T = max(f.shape[0] for f in frames)
    x = np.full((n, T, len(CHARS)), -30.0, dtype=np.float32)
    for i, f in enumerate(frames):
        x[i, : f.shape[0]] = f
    lengths = torch.tensor([f.shape[0] for f in frames])
    xt = torch.from_numpy(x)
    net = _FrameTransducer(len(CHARS))
    texts = [None] + list(TEXT_CHARS)

    def decode(phrases, score):
        if transducer:
            g = ContextGraph.from_phrases(phrases, texts, score=score, skip=[0]) if phrases else None
            t0 = time.perf_counter()
            out = []
            for s in range(0, n, args.batch):
                ids = modified_beam_search(
                    net, xt[s : s + args.batch], lengths[s : s + args.batch], blank=0, beam=args.beam, context=g
                )
                out += ["".join(texts[v] for v in row) for row in ids]
            hyps = [" ".join(h.split()) for h in out]
        else:
            dec = BeamSearchDecoder(
                CHARS, blank=0, beam_size=args.beam, lexicon_free=True, context=phrases or None, context_score=score
            )
            t0 = time.perf_counter()
            hyps = [h[0].text for h in dec.decode(xt, lengths)]
        return hyps, (time.perf_counter() - t0) / n

    return _measure(name, decode, refs, train, args, rows, timing)


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ctc", help="a CTC checkpoint of the text task")
    p.add_argument("--rnnt", help="an RNN-T checkpoint of the text task")
    p.add_argument("--beam", type=int, default=16)
    p.add_argument("--phrases", type=int, default=1000)
    p.add_argument("--rare", type=int, default=100)
    p.add_argument("--lines", type=int, default=1000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--scores", type=float, nargs="*", default=[0.5, 1.0, 2.0])
    p.add_argument("--noise", type=float, default=1.0, help="synthetic frames: Gaussian noise")
    p.add_argument("--confuse", type=float, default=0.04, help="synthetic frames: confusable characters")
    p.add_argument("--transducer-lines", type=int, default=300, help="lines of the transducer")
    p.add_argument("--batch", type=int, default=100, help="transducer: lines a search call")
    p.add_argument("--only", choices=["ctc", "rnnt"], help="synthetic frames: one of the two searches")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from lightning_gtn.wfst.parallel import set_num_threads

    set_num_threads(1)
    rows: list = []
    timing: list = []
    nrare = {}
    if args.ctc or args.rnnt:
        for name, path in (("CTC, beam (checkpoint)", args.ctc), ("RNN-T, rnnt_beam (checkpoint)", args.rnnt)):
            if path:
                nrare[name] = _checkpoint(name, path, args, rows, timing)
    else:
        for name, transducer in (("CTC beam, synthetic frames", False), ("RNN-T beam, synthetic frames", True)):
            if args.only is None or args.only == ("rnnt" if transducer else "ctc"):
                nrare[name] = _synthetic(name, transducer, args, rows, timing)
    lines = [
        f"Decoding time with {args.phrases} distractor phrases (word pairs), beam {args.beam}, one thread, "
        f"median of {args.reps} alternated runs:",
        "",
        f"| search | lines | ms / line, no context | ms / line, {args.phrases:,} phrases | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {n} | {k} | {a:.2f} | {b:.2f} | {r:.3f} |" for n, k, a, b, r in timing]
    lines += [
        "",
        f"The rarest words of the evaluated lines boosted ({', '.join(f'{n}: {k}' for n, k in nrare.items())} words):",
        "",
        "| search | context_score | boosted-word recall | occurrences | WER of the other words | WER |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {n} | {s} | {r:.1f}% | {o} | {w:.2f}% | {a:.2f}% |" for n, s, r, o, w, a in rows]
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
