"""``lightning-gtn-lm``: estimates an ARPA n-gram model from a text file, one sentence a line.

Example::

    lightning-gtn-lm --text transcripts.txt --order 3 --method kn --out lm.arpa
    lightning-gtn-lm --text transcripts.txt --order 6 --chars --out chars.arpa

With ``--chars`` every character is a word and a space becomes ``--space`` (``|`` by default,
wav2letter's word separator). The last line printed is one JSON object: the n-gram counts and
the perplexity of the model on its own text.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from typing import Optional, Sequence

from .estimate import estimate, perplexity

__all__ = ["main", "read_sentences"]

MAX_LINE = 1 << 20
#: the most characters a --vocab file may hold
MAX_VOCAB_BYTES = 1 << 28


def read_sentences(path, chars: bool = False, space: str = "|", max_bytes: int = 1 << 32) -> list[list[str]]:
    """Sentences of a text file: words split on white space, or characters with ``chars``.

    Args:
        path: the file (UTF-8, one sentence a line; blank lines are skipped).
        chars: make every character a token; runs of white space become one ``space`` token.
        space: the token of a space in ``chars`` mode.
        max_bytes: refuse a larger file.
    """
    out: list[list[str]] = []
    for _, line in _bounded_lines(path, "--text", max_bytes):
        words = line.split()
        if not words:
            continue
        if chars:
            toks: list[str] = []
            for k, w in enumerate(words):
                if k:
                    toks.append(space)
                toks.extend(w)
            out.append(toks)
        else:
            out.append(words)
    return out


def _bounded_lines(path, flag: str, max_bytes: int):
    """``(line number, line)`` of a regular UTF-8 file, at most ``max_bytes`` characters in all
    and :data:`MAX_LINE` a line, counted on what is read (``/dev/zero`` is refused, and a file
    growing while it is read stops at the limit)."""
    if not os.path.isfile(path):
        raise ValueError(f"{flag} {path!r}: {'not a regular file' if os.path.exists(path) else 'no such file'}")
    left = max_bytes
    with open(path, "r", encoding="utf-8") as f:
        for no in itertools.count(1):
            line = f.readline(MAX_LINE + 1)
            if not line:
                return
            if len(line) > MAX_LINE:
                raise ValueError(f"{flag} line {no}: longer than {MAX_LINE} characters")
            left -= len(line)
            if left < 0:
                raise ValueError(f"{flag} {path!r}: over max_bytes={max_bytes} characters")
            yield no, line


def _check_out(path: str) -> None:
    """Fails now, not after estimating, when ``--out`` cannot be written."""
    d = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.isdir(path):
        raise ValueError(f"--out {path!r} is a directory")
    if not os.path.isdir(d):
        raise ValueError(f"--out {path!r}: no such directory {d!r}")
    if not os.access(d, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"--out {path!r}: not writable")


def _bar(total: int, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, unit="sent", desc="counting", disable=not enabled, file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the CLI; returns the exit status."""
    p = argparse.ArgumentParser(prog="lightning-gtn-lm", description=__doc__.split("\n")[0])
    p.add_argument("--text", required=True, help="training text, one sentence a line")
    p.add_argument("--out", required=True, help="ARPA file to write")
    p.add_argument("--order", type=int, default=3)
    p.add_argument("--method", default="kn", choices=["kn", "kneser_ney", "wb", "witten_bell"])
    p.add_argument("--chars", action="store_true", help="character-level model")
    p.add_argument("--space", default="|", help="the token of a space with --chars")
    p.add_argument("--prune", type=int, nargs="+", default=None, help="minimum count per order")
    p.add_argument("--vocab", default=None, help="file of words (one a line); others become <unk>")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    try:
        _check_out(args.out)
        sentences = read_sentences(args.text, chars=args.chars, space=args.space)
        if not sentences:
            raise ValueError(f"--text {args.text!r} holds no sentence (every line is blank): nothing to estimate")
        vocab = None
        if args.vocab:
            vocab = [w for _, line in _bounded_lines(args.vocab, "--vocab", MAX_VOCAB_BYTES) for w in line.split()[:1]]
        bar = _bar(len(sentences), not args.no_progress)
        lm = estimate(
            sentences,
            order=args.order,
            method=args.method,
            prune=args.prune,
            vocab=vocab,
            progress=bar.update if bar is not None else None,
        )
        if bar is not None:
            bar.close()
        lm.to_arpa(args.out)
    except (ValueError, TypeError, OSError) as e:
        print(f"lightning-gtn-lm: error: {e}", file=sys.stderr)
        return 2
    result = {
        "out": args.out,
        "order": lm.order,
        "ngrams": lm.counts(),
        "words": len(lm.words),
        "train_perplexity": perplexity(lm, sentences),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
