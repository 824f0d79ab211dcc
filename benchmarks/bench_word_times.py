"""Word times of the transducer decoders against the forced alignment, on the embedded task.

Trains a small RNN-T network (:class:`lightning_gtn.lightning.TransducerModel`, stateless
prediction network, ``loss=rnnt``'s :class:`lightning_gtn.nn.RNNTLoss`) on the digit lines of
``data=digits`` for a fixed number of steps (seeded; a wall-clock cap for loaded machines), then
decodes the validation lines with the greedy search and the modified beam search (word spans at
the space token) and force-aligns the reference transcripts with the same network
(:func:`lightning_gtn.functional.rnnt_align`, word spans by :func:`word_spans`). Decoded words are
matched to reference words by a word-level edit alignment; for every matched word that is decoded
correctly the table reports how often its start frame lies within 0, 1 and 2 encoder frames of
the forced alignment's, plus the mean absolute difference, the same for the word end, the share
of reference words compared and the WER. Torch runs on one thread (small steps: a second thread
only adds contention)."""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from lightning_gtn.decode.timed import greedy_search_hypotheses
from lightning_gtn.decode.transducer_beam import modified_beam_search_nbest
from lightning_gtn.functional import rnnt_align, word_spans
from lightning_gtn.lightning import DigitLinesDataModule, TransducerModel
from lightning_gtn.lightning.vocabulary import Vocabulary
from lightning_gtn.nn import RNNTLoss


def _edit_pairs(hyp: list, ref: list) -> tuple[list, int]:
    """Pairs ``(i, j)`` of hypothesis and reference words that a minimal word edit alignment
    matches (substitutions included), and the edit distance."""
    n, m = len(hyp), len(ref)
    d = np.zeros((n + 1, m + 1), dtype=np.int64)
    d[:, 0], d[0, :] = np.arange(n + 1), np.arange(m + 1)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            d[i, j] = min(d[i - 1, j] + 1, d[i, j - 1] + 1, d[i - 1, j - 1] + (hyp[i - 1] != ref[j - 1]))
    pairs, i, j = [], n, m
    while i > 0 and j > 0:
        if d[i, j] == d[i - 1, j - 1] + (hyp[i - 1] != ref[j - 1]):
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif d[i, j] == d[i - 1, j] + 1:
            i -= 1
        else:
            j -= 1
    return pairs[::-1], int(d[n, m])


def _train(net, loss, data, vocab, max_steps: int, seconds: float, lr: float) -> tuple[int, float]:
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    steps, t0, last = 0, time.perf_counter(), float("nan")
    net.train()
    while steps < max_steps and time.perf_counter() - t0 < seconds:
        for batch in data.train_dataloader():
            targets, target_lengths = vocab.batch_encode(batch["texts"])
            enc, enc_lengths = net.encode(batch["inputs"], batch["input_lengths"])
            value = loss.joint_loss(net, enc, enc_lengths, targets, target_lengths)
            opt.zero_grad()
            value.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 5.0)
            opt.step()
            steps, last = steps + 1, float(value.detach())
            if steps >= max_steps or time.perf_counter() - t0 >= seconds:
                break
    net.eval()
    return steps, last


def _words(tokens: list, spans: list) -> list:
    return [tuple(tokens[w["token_range"][0] : w["token_range"][1]]) for w in spans]


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="a shorter training (a smoke run)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 1500; --quick 150)")
    p.add_argument("--max-seconds", type=float, default=600.0, help="training stops here at the latest")
    p.add_argument("--num-train", type=int, default=4000)
    p.add_argument("--num-val", type=int, default=200)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: small steps run best on one)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    max_steps = args.steps if args.steps is not None else (150 if args.quick else 1500)
    torch.manual_seed(0)
    data = DigitLinesDataModule(num_train=args.num_train, num_val=args.num_val, num_test=8, batch_size=16)
    data.setup()
    vocab = Vocabulary(data.chars, blank=True)
    space = vocab.encode(" ")[0]
    feature_dim = int(data.train_set[0][0].shape[1])
    net = TransducerModel(
        feature_dim=feature_dim,
        num_classes=vocab.num_classes,
        conv_channels=32,
        stride=4,
        hidden_size=64,
        predictor_dim=64,
        joiner_dim=64,
        dropout=0.0,
    )
    loss = RNNTLoss(blank=0)
    t0 = time.perf_counter()
    steps, last = _train(net, loss, data, vocab, max_steps, args.max_seconds, lr=3e-3)
    train_s = time.perf_counter() - t0

    stats = {
        name: {"diff": [], "end": [], "ref": 0, "errors": 0, "time": 0.0} for name in ("greedy", f"beam {args.beam}")
    }
    with torch.no_grad():
        for batch in data.val_dataloader():
            targets, target_lengths = vocab.batch_encode(batch["texts"])
            enc, enc_lengths = net.encode(batch["inputs"], batch["input_lengths"])
            al = rnnt_align(net, batch["inputs"], batch["input_lengths"], targets, target_lengths, blank=0)
            ref_spans = word_spans(al, targets, word_separator_id=space)
            t1 = time.perf_counter()
            greedy = greedy_search_hypotheses(net, enc, enc_lengths, blank=0, word_separator_id=space)
            t2 = time.perf_counter()
            beam = modified_beam_search_nbest(
                net, enc, enc_lengths, blank=0, beam=args.beam, nbest=1, word_separator_id=space
            )
            t3 = time.perf_counter()
            stats["greedy"]["time"] += t2 - t1
            stats[f"beam {args.beam}"]["time"] += t3 - t2
            for name, hyps in (("greedy", greedy), (f"beam {args.beam}", [h[0] for h in beam])):
                s = stats[name]
                for b, h in enumerate(hyps):
                    ref_tokens = targets[b, : int(target_lengths[b])].tolist()
                    ref_words, hyp_words = _words(ref_tokens, ref_spans[b]), _words(h.tokens, h.word_spans)
                    pairs, dist = _edit_pairs(hyp_words, ref_words)
                    s["ref"] += len(ref_words)
                    s["errors"] += dist
                    for i, j in pairs:
                        if hyp_words[i] == ref_words[j]:
                            s["diff"].append(abs(h.word_spans[i]["start"] - ref_spans[b][j]["start"]))
                            s["end"].append(abs(h.word_spans[i]["end"] - ref_spans[b][j]["end"]))
    rows = [
        f"RNN-T word start frames against the forced alignment (digit lines, {args.num_val} validation lines)",
        f"training: {steps} steps of 16 lines in {train_s:.0f} s (final loss {last:.3f}), {args.threads} thread(s); "
        "frames are the encoder's (4x subsampled)",
        "",
        "| decoder | words compared | start within 0 | within 1 | within 2 frames | mean abs diff "
        "| end within 2 | WER | decode s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in stats.items():
        d, e = np.asarray(s["diff"], dtype=np.float64), np.asarray(s["end"], dtype=np.float64)
        n = max(len(d), 1)
        rows.append(
            f"| {name} | {len(d)} of {s['ref']} | {100 * (d <= 0).sum() / n:.1f}% | {100 * (d <= 1).sum() / n:.1f}% "
            f"| {100 * (d <= 2).sum() / n:.1f}% | {d.mean() if len(d) else float('nan'):.2f} "
            f"| {100 * (e <= 2).sum() / n:.1f}% "
            f"| {100 * s['errors'] / max(s['ref'], 1):.1f}% | {s['time']:.2f} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(main())
