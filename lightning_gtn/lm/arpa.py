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
from .ngram import BOS, LN10, MAX_ORDER, NGramLM

__all__ = ["read_arpa", "write_arpa", "BYTES_PER_NGRAM"]

BYTES_PER_NGRAM = 640
"""Memory one stored n-gram is assumed to take while reading, for the ``max_bytes`` check
(``benchmarks/bench_lm.py`` measures the peak: 390-550 bytes)."""

MAX_LINE = 1 << 16
"""Longest line (characters) an ARPA file may have."""

_COUNT = re.compile(r"^ngram\s+(\d+)\s*=\s*(\d+)$")
_SECTION = re.compile(r"^\\(\d+)-grams:$")


def _lines(path):
    """Yields (line number, stripped line), bounding the length of each line."""
    if hasattr(path, "readline"):
        f, close = path, False
    else:
        f, close = open(os.fspath(path), "r", encoding="utf-8", errors="strict", newline=None), True
    try:
        no = 0
        while True:
            try:
                line = f.readline(MAX_LINE + 1)
            except UnicodeDecodeError as e:
                raise ValueError(f"ARPA line {no + 1}: not UTF-8 ({e.reason})") from None
            if not line:
                return
            no += 1
            if len(line) > MAX_LINE and not line.endswith("\n"):
                raise ValueError(f"ARPA line {no}: longer than {MAX_LINE} characters")
            yield no, line.strip()
    finally:
        if close:
            f.close()


def _number(text: str, no: int, what: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise ValueError(f"ARPA line {no}: {what} {text[:40]!r} is not a number") from None
    return x


def read_arpa(path, *, max_bytes: int = 1 << 32, add_missing: bool = True) -> NGramLM:
    """Reads an ARPA back-off language model.

    Args:
        path: a file path, or an open text file.
        max_bytes: refuse a file whose declared n-gram counts would take more memory than this
            (``BYTES_PER_NGRAM`` per n-gram), before reading the n-grams.
        add_missing: add missing histories and special words as KenLM does (see
            :meth:`NGramLM.from_ngrams`); False makes them errors.

    Returns:
        The model (natural logs).

    Raises:
        ValueError: on malformed input; the message names the line number.

    Example:
        >>> import io
        >>> text = "\\\\data\\\\\\nngram 1=3\\n\\n\\\\1-grams:\\n-1 <s> 0\\n-0.3 </s>\\n-0.3 <unk>\\n\\\\end\\\\\\n"
        >>> read_arpa(io.StringIO(text)).order
        1
    """
    it = _lines(path)
    # header
    for no, line in it:
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
        m = _COUNT.match(line)
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
    total = sum(counts.values())
    if total * BYTES_PER_NGRAM > max_bytes:
        raise ValueError(
            f"ARPA: the header declares {total} n-grams, about {total * BYTES_PER_NGRAM} bytes "
            f"in memory, over max_bytes={max_bytes}"
        )
    tables: list[dict] = [dict() for _ in range(N)]
    expected = 1
    while True:
        if line == "\\end\\":
            break
        m = _SECTION.match(line)
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
            g = tuple(f[1 : n + 1])
            b = _number(f[n + 1], no, "back-off weight") if len(f) == n + 2 else 0.0
            if math.isnan(p) or p > 0 or (p == -math.inf and g != (BOS,)) or p == math.inf:
                raise ValueError(f"ARPA line {no}: log10 probability {f[0]!r} must be finite and <= 0")
            if not math.isfinite(b):
                raise ValueError(f"ARPA line {no}: log10 back-off weight {f[n + 1]!r} is not finite")
            if g in table:
                raise ValueError(f"ARPA line {no}: the {n}-gram {' '.join(g)!r} repeats")
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
    try:
        return NGramLM.from_ngrams(tables, add_missing=add_missing)
    except ValueError as e:
        raise ValueError(f"ARPA: {e}") from None


def _fmt(x: float) -> str:
    if x == -math.inf:
        return "-inf"
    s = "%.9g" % (x / LN10)
    return "0" if s == "-0" else s


def write_arpa(lm: NGramLM, path=None) -> str:
    """Writes ``lm`` as ARPA text (log10, 9 significant digits) and returns the text.

    Args:
        lm: the model.
        path: a file path, an open text file, or None.
    """
    N = lm.order
    W = lm.words
    tables = [
        {tuple(W[i] for i in g): v for g, v in sorted(t.items())} for t in lm._ngrams
    ]  # word-id order: the same model always gives the same text
    out = ["", "\\data\\"]
    out += [f"ngram {n}={len(t)}" for n, t in enumerate(tables, start=1)]
    for n, t in enumerate(tables, start=1):
        out += ["", f"\\{n}-grams:"]
        for g, (p, b) in t.items():
            words = " ".join(g)
            if n < N:
                out.append(f"{_fmt(p)}\t{words}\t{_fmt(b)}")
            else:
                out.append(f"{_fmt(p)}\t{words}")
    out += ["", "\\end\\", ""]
    text = "\n".join(out)
    if path is not None:
        if hasattr(path, "write"):
            path.write(text)
        else:
            with open(os.fspath(path), "w", encoding="utf-8") as f:
                f.write(text)
    return text
