"""WER of greedy vs beam vs lexicon vs lexicon + LM decoding of a trained text-task model.

Not part of ``make bench`` (it needs a trained checkpoint)::

    .venv/bin/lightning-gtn-train data=text hydra.run.dir=outputs/ctc_text
    .venv/bin/python benchmarks/decode_text.py --checkpoint outputs/ctc_text/checkpoints/best.ckpt

The validation lines of the checkpoint's own data config are run through the model once; the
same emissions are then decoded by: the loss's greedy best path; ``lightning_gtn.decode``'s beam
search without lexicon or LM; with the lexicon of the training transcripts' words; with that
lexicon and a word 3-gram (interpolated Kneser-Ney, ``lightning_gtn.lm.estimate``) of the
training transcripts; and, when ``pyctcdecode`` (and ``kenlm`` for the LM row) can be imported,
by pyctcdecode with the same ARPA file, unigrams, beam width and LM weight. Prints a markdown
table: WER, CER and decoding time per utterance (one thread, numba compilation excluded).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch


def _load(path):
    from lightning_gtn.evaluate import load_model
    from lightning_gtn.lightning import TextLinesDataModule

    model = load_model(path)
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    dm = TextLinesDataModule(**ckpt["datamodule_hyper_parameters"])
    return model.eval(), dm


def _emissions(model, dm):
    dm.setup("fit")
    out = []
    with torch.no_grad():
        for batch in dm.val_dataloader():
            e, n = model.emissions(batch["inputs"], batch["input_lengths"])
            out.append((e.float(), n, list(batch["texts"])))
    return out


def _score(hyps, refs):
    from torchmetrics.text import CharErrorRate, WordErrorRate

    return float(WordErrorRate()(hyps, refs)), float(CharErrorRate()(hyps, refs))


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--beam", type=int, default=16)
    p.add_argument("--lm-weight", type=float, default=0.5)
    p.add_argument("--word-score", type=float, default=0.0)
    p.add_argument("--order", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from lightning_gtn.lightning.decoding import build_decoder, decode_texts, resolve_decoder
    from lightning_gtn.wfst.parallel import set_num_threads

    set_num_threads(1)
    model, dm = _load(args.checkpoint)
    batches = _emissions(model, dm)
    refs = [t for _, _, texts in batches for t in texts]
    tmp = Path(tempfile.mkdtemp())
    train_texts = list(dm.train_set.texts)
    cfg = resolve_decoder(
        {
            "name": "beam_lm",
            "beam_size": args.beam,
            "lm_weight": args.lm_weight,
            "word_score": args.word_score,
            "lm_order": args.order,
        },
        lambda: train_texts,
        tmp,
    )
    rows = []

    def run(name, fn):
        fn(batches[0][0][:1], batches[0][1][:1])  # compile
        t0 = time.perf_counter()
        hyps = [h for e, n, _ in batches for h in fn(e, n)]
        dt = (time.perf_counter() - t0) / len(refs)
        wer, cer = _score(hyps, refs)
        rows.append((name, wer, cer, dt))

    loss, vocab = model.structured_loss, model.vocabulary
    model.configure_decoder(None)
    run("greedy (the loss's best path)", model.decode)
    beam = build_decoder({"name": "beam", "beam_size": args.beam}, loss, vocab)
    run(f"beam {args.beam}, no lexicon, no LM", lambda e, n: decode_texts(beam, e, n))
    lex = build_decoder(dict(cfg, lm_weight=0.0), loss, vocab)
    run(f"beam {args.beam} + lexicon ({len(lex.lexicon)} words)", lambda e, n: decode_texts(lex, e, n))
    lm = build_decoder(cfg, loss, vocab)
    run(
        f"beam {args.beam} + lexicon + {args.order}-gram KN LM (weight {args.lm_weight})",
        lambda e, n: decode_texts(lm, e, n),
    )
    try:
        from pyctcdecode import build_ctcdecoder
    except ImportError:
        build_ctcdecoder = None
    toks, blank = lm.tokens, lm.blank
    if (
        build_ctcdecoder is not None
        and blank is not None
        and all(len(t) == 1 for i, t in enumerate(toks) if i != blank)
    ):
        # CTC, or the letter-token transducer (blank last): pyctcdecode reads them as CTC
        labels = ["" if i == blank else t for i, t in enumerate(toks)]
        words = sorted({w for t in train_texts for w in t.split()})
        try:
            import kenlm  # noqa: F401

            pdec = build_ctcdecoder(
                labels,
                kenlm_model_path=str(tmp / "lm.arpa"),
                unigrams=words,
                alpha=args.lm_weight,
                beta=args.word_score,
            )
            name = f"pyctcdecode beam {args.beam} + KenLM (same ARPA, unigrams, weight)"
        except ImportError:
            pdec = build_ctcdecoder(labels)
            name = f"pyctcdecode beam {args.beam}, no LM (kenlm not importable)"

        def py(e, n):
            return [pdec.decode(e[b, : int(n[b])].numpy(), beam_width=args.beam) for b in range(e.shape[0])]

        run(name, py)
    lines = ["| decoder | val WER | val CER | ms / line |", "|---|---:|---:|---:|"]
    lines += [f"| {n} | {w * 100:.2f}% | {c * 100:.2f}% | {t * 1e3:.2f} |" for n, w, c, t in rows]
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
