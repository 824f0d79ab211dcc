"""ARPA back-off language model files: reading (untrusted input) and writing.

The format::

    \\data\\
    ngram 1=<count>
    ngram 2=<count>

    \\1-grams:
    <log10 P>  <w>  [<log10 bow>]
    ...
    \\2-grams:
    <log10 P>  <w1> <w2>  [<log10 bow>]
    ...
    \\end\\

Text before ``\\data\\`` is ignored, blank lines anywhere, CRLF line ends and tabs or spaces
between fields are accepted. Numbers become natural logs (times ln 10).

A file is untrusted, and the reader checks it line by line: every problem is a
``ValueError`` naming the line number. The declared counts are checked against ``max_bytes``
before anything is stored (an estimate of the memory the model takes), a section holding more
n-grams than declared stops at the first extra line, and one holding fewer is an error at its
end. NaN and infinite numbers are refused (except ``-inf`` as the probability of ``<s>``, which
is never predicted; some tools write it that way). An n-gram whose history is absent gets one, as
KenLM does (``NGramLM.from_ngrams(add_missing=True)``); ``add_missing=False`` refuses it.
"""

from __future__ import annotations

import math
import os
import re
import sys

from ..files import open_regular
from .symbols import BOS, EOS, LN10, MAX_ORDER, UNK

__all__ = ["parse_arpa", "format_arpa", "estimate_bytes", "MIN_LOG10_PROB", "MAX_LOG10_BACKOFF"]

BYTES_PER_NGRAM = 448
"""Memory one stored n-gram of order 1 is assumed to take (reading, the model and its
:meth:`~lightning_gtn.lm.NGramLM.arrays`), for the ``max_bytes`` check; each further word of an
n-gram adds ``BYTES_PER_WORD`` (see :func:`estimate_bytes`)."""

BYTES_PER_WORD = 48
"""Memory each word of an n-gram beyond the first is assumed to add (its id in the key tuple and
in the arrays' history tuples)."""

MAX_LINE = 1 << 16
"""Longest line (characters) an ARPA file may have."""

MIN_LOG10_PROB = -99.0
"""Lowest log10 probability (SRILM's "never"); ``-inf`` is also accepted for ``<s>``."""

MAX_LOG10_BACKOFF = 10.0
"""Back-off weights (log10) must lie in ``[MIN_LOG10_PROB, MAX_LOG10_BACKOFF]``. A back-off of
10 multiplies the lower order's probabilities by 1e10, which already means the lower orders give
the history's unseen words less than 1e-10 of their mass; beyond that the file is broken (a
back-off of 30 or 1e38 decodes garbage)."""

# the formats' own number grammar, ASCII only (Python's int()/float() also take '1_0' and
# non-ASCII digits)
_INT = r"[0-9]+"
_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_NEG_INF = ("-inf", "-infinity")
_COUNT = re.compile(rf"ngram[ \t]+({_INT})[ \t]*=[ \t]*({_INT})", re.ASCII)
_SECTION = re.compile(rf"\\({_INT})-grams:", re.ASCII)


def estimate_bytes(counts) -> int:
    """An upper bound of the memory (bytes) a model with these n-gram counts takes, reading
    included (the ``max_bytes`` check of :func:`parse_arpa`; the unigrams' word strings are
    counted while they are read).

    Each n-gram of order ``n`` may bring ``n - 2`` missing histories of orders ``2 .. n-1``,
    which the reader adds (``add_missing``), so an order-``n`` line is charged for them too.

    Args:
        counts: ``counts[n - 1]`` is the number of n-grams of order ``n``.
    """

    def one(n: int) -> int:
        return BYTES_PER_NGRAM + BYTES_PER_WORD * (n - 1)

    total = 0
    for n, c in enumerate(counts, start=1):
        total += int(c) * (one(n) + sum(one(k) for k in range(2, n)))
    return total


def _lines(path, max_chars: int):
    """Yields (line number, stripped line), bounding the length of each line and the total."""
    if hasattr(path, "readline"):
        f, close = path, False
    else:
        f, close = open_regular(path, "ARPA file", "r", encoding="utf-8", errors="strict", newline=None), True
    try:
        no = 0
        read = 0
        while True:
            try:
                line = f.readline(MAX_LINE + 1)
            except UnicodeDecodeError as e:
                raise ValueError(f"ARPA line {no + 1}: not UTF-8 ({e.reason})") from None
            if not line:
                return
            no += 1
            read += len(line)
            if len(line) > MAX_LINE and not line.endswith("\n"):
                raise ValueError(f"ARPA line {no}: longer than {MAX_LINE} characters")
            if read > max_chars:
                raise ValueError(f"ARPA line {no}: the file is longer than max_bytes={max_chars} characters")
            yield no, line.strip()
    finally:
        if close:
            f.close()


def _number(text: str, no: int, what: str) -> float:
    if text.lower() in _NEG_INF:
        return -math.inf
    if not _FLOAT.fullmatch(text):
        raise ValueError(f"ARPA line {no}: {what} {text[:40]!r} is not a number")
    return float(text)


def parse_arpa(path, *, max_bytes: int = 1 << 32, add_missing: bool = True) -> tuple[list[str], list[dict]]:
    """Reads and checks an ARPA file's n-grams (the format part of
    :func:`lightning_gtn.lm.read_arpa`, which builds the model from them).

    Args:
        path: a file path, or an open text file.
        max_bytes: refuse a file whose declared n-gram counts would take more memory than this
            (:func:`estimate_bytes`), before reading the n-grams; the unigrams' words are added
            to the estimate as they are read, and no more than ``max_bytes`` characters are read.
        add_missing: add the special words ``<s>``, ``</s>``, ``<unk>`` that the unigrams lack
            (False makes them errors).

    Returns:
        ``(words, tables)``: ``words[i]`` is word ``i``; ``tables[n - 1]`` maps an n-tuple of
        word ids to ``(ln P, ln bow)`` (natural logs, ``bow = 0`` at the highest order), as
        :class:`~lightning_gtn.lm.NGramLM` stores them.

    Raises:
        ValueError: on malformed input; the message names the line number.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
    it = _lines(path, max_bytes)
    # header
    for _no, line in it:
        if line == "\\data\\":
            break
    else:
        raise ValueError("ARPA: no \\data\\ line")
    counts: dict[int, int] = {}
    no = 0
    line = ""
    for no, line in it:
        if not line:
            continue
        m = _COUNT.fullmatch(line)
        if not m:
            break
        n, c = int(m.group(1)), int(m.group(2))
        if not 1 <= n <= MAX_ORDER:
            raise ValueError(f"ARPA line {no}: order {n} outside [1, {MAX_ORDER}]")
        if n in counts:
            raise ValueError(f"ARPA line {no}: the count of order {n} is given twice")
        counts[n] = c
    else:
        raise ValueError(f"ARPA line {no}: the file ends inside the \\data\\ header")
    if not counts:
        raise ValueError(f"ARPA line {no}: no 'ngram N=count' lines in the header")
    N = max(counts)
    if sorted(counts) != list(range(1, N + 1)):
        raise ValueError(f"ARPA: the header must give the counts of orders 1..{N}, got {sorted(counts)}")
    declared_counts = [counts[n] for n in range(1, N + 1)]
    used = estimate_bytes(declared_counts) + estimate_bytes([3])  # + added <s> </s> <unk>
    if used > max_bytes:
        raise ValueError(
            f"ARPA: the header declares {sum(declared_counts)} n-grams (orders 1..{N}: {declared_counts}), "
            f"about {used} bytes in memory with the histories they may need, over max_bytes={max_bytes}"
        )
    tables: list[dict] = [dict() for _ in range(N)]
    words: list[str] = []
    ids: dict[str, int] = {}
    expected = 1
    while True:
        if line == "\\end\\":
            break
        m = _SECTION.fullmatch(line)
        if not m:
            raise ValueError(f"ARPA line {no}: expected '\\{expected}-grams:' or '\\end\\', got {line[:60]!r}")
        n = int(m.group(1))
        if n != expected or n > N:
            raise ValueError(f"ARPA line {no}: section '\\{n}-grams:' out of order (expected {expected})")
        table = tables[n - 1]
        declared = counts[n]
        line = None
        for no, line in it:
            if not line:
                continue
            if line.startswith("\\"):
                break
            f = line.split()
            if len(f) not in (n + 1, n + 2):
                raise ValueError(f"ARPA line {no}: a {n}-gram line has {n + 1} or {n + 2} fields, got {len(f)}")
            if len(table) >= declared:
                raise ValueError(f"ARPA line {no}: more {n}-grams than the {declared} the header declares")
            p = _number(f[0], no, "probability")
            b = _number(f[n + 1], no, "back-off weight") if len(f) == n + 2 else 0.0
            g: tuple[int, ...]
            if n == 1:
                w = f[1]
                if w in ids:
                    raise ValueError(f"ARPA line {no}: the 1-gram {w[:60]!r} repeats")
                # the word string is stored: count it (a line may hold one very long word)
                used += sys.getsizeof(w) + BYTES_PER_WORD
                if used > max_bytes:
                    raise ValueError(
                        f"ARPA line {no}: the words read so far take about {used} bytes "
                        f"with the declared n-grams, over max_bytes={max_bytes}"
                    )
                ids[w] = len(words)
                words.append(w)
                g = (ids[w],)
            else:
                try:
                    g = tuple(ids[w] for w in f[1 : n + 1])
                except KeyError as e:
                    raise ValueError(f"ARPA line {no}: word {e.args[0][:60]!r} has no unigram") from None
            if (
                math.isnan(p)
                or p > 0
                or p == math.inf
                or (p < MIN_LOG10_PROB and not (p == -math.inf and n == 1 and f[1] == BOS))
            ):
                raise ValueError(
                    f"ARPA line {no}: log10 probability {f[0][:40]!r} must be in "
                    f"[{MIN_LOG10_PROB:g}, 0] (or -inf for <s>)"
                )
            if not MIN_LOG10_PROB <= b <= MAX_LOG10_BACKOFF:
                raise ValueError(
                    f"ARPA line {no}: log10 back-off weight {f[n + 1][:40]!r} must be in "
                    f"[{MIN_LOG10_PROB:g}, {MAX_LOG10_BACKOFF:g}]"
                )
            if n > 1 and g in table:
                raise ValueError(f"ARPA line {no}: the {n}-gram {' '.join(f[1 : n + 1])[:60]!r} repeats")
            table[g] = (p * LN10, b * LN10 if n < N else 0.0)
        else:
            raise ValueError(f"ARPA line {no}: the file ends without '\\end\\'")
        if len(table) != declared:
            raise ValueError(
                f"ARPA line {no}: section \\{n}-grams: has {len(table)} n-grams, the header declares {declared}"
            )
        expected = n + 1
    if expected != N + 1:
        raise ValueError(f"ARPA line {no}: '\\end\\' before the \\{expected}-grams: section")
    for sp in (BOS, EOS, UNK):
        if sp not in ids:
            if not add_missing:
                raise ValueError(f"ARPA: the unigram {sp!r} is missing")
            ids[sp] = len(words)
            words.append(sp)
    return words, tables


def _fmt(x: float) -> str:
    if x == -math.inf:
        return "-inf"
    s = "%.9g" % (x / LN10)
    return "0" if s == "-0" else s


def format_arpa(words: list[str], tables: list[dict], path=None) -> str:
    """Writes n-gram tables as ARPA text (log10, 9 significant digits) and returns the text
    (the format part of :func:`lightning_gtn.lm.write_arpa`).

    Args:
        words: ``words[i]`` is word ``i``.
        tables: ``tables[n - 1]`` maps an n-tuple of word ids to ``(ln P, ln bow)``.
        path: a file path, an open text file, or None.
    """
    N = len(tables)
    W = words
    tables = [
        {tuple(W[i] for i in g): v for g, v in sorted(t.items())} for t in tables
    ]  # word-id order: the same model always gives the same text
    out = ["", "\\data\\"]
    out += [f"ngram {n}={len(t)}" for n, t in enumerate(tables, start=1)]
    for n, t in enumerate(tables, start=1):
        out += ["", f"\\{n}-grams:"]
        for g, (p, b) in t.items():
            text = " ".join(g)
            if n < N:
                out.append(f"{_fmt(p)}\t{text}\t{_fmt(b)}")
            else:
                out.append(f"{_fmt(p)}\t{text}")
    out += ["", "\\end\\", ""]
    text = "\n".join(out)
    if path is not None:
        if hasattr(path, "write"):
            path.write(text)
        else:
            with open(os.fspath(path), "w", encoding="utf-8") as f:
                f.write(text)
    return text
