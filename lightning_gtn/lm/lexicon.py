"""Kaldi-style pronunciation lexicons: ``word tok1 tok2 ...`` per line."""

from __future__ import annotations

import math
import os
from typing import Optional

from ..files import open_regular

__all__ = ["read_lexicon"]

MAX_LINE = 1 << 16


def _is_prob(s: str) -> bool:
    try:
        x = float(s)
    except ValueError:
        return False
    return math.isfinite(x) and 0.0 < x <= 1.0


def read_lexicon(
    path,
    *,
    probabilities: Optional[bool] = None,
    max_bytes: int = 1 << 28,
) -> dict[str, list[list[str]]]:
    """Reads a lexicon: each line is a word followed by its tokens (Kaldi's ``lexicon.txt``).

    A word on several lines has several spellings (kept in file order, duplicates dropped).
    Kaldi's ``lexiconp.txt`` has a probability between the word and its tokens; with
    ``probabilities=None`` that column is detected (every line has a number in ``(0, 1]`` in
    its second field and at least one token after it) and dropped. Blank lines and CRLF line
    ends are accepted; fields are separated by spaces or tabs.

    Args:
        path: a file path, or an open text file.
        probabilities: True: the second field is a probability (checked, dropped); False: it is
            a token; None: detect.
        max_bytes: refuse a file larger than this (checked before reading a path).

    Returns:
        ``{word: [spelling, ...]}``, each spelling a list of tokens, words in file order.

    Raises:
        ValueError: a line with a word and no tokens, a bad probability, a too large file or
            line; the message names the line number.

    Example:
        >>> import io
        >>> read_lexicon(io.StringIO("the dh ah\\nthe dh iy\\na ah\\n"))
        {'the': [['dh', 'ah'], ['dh', 'iy']], 'a': [['ah']]}
    """
    if hasattr(path, "read"):
        text = path.read(max_bytes + 1)
    else:
        p = os.fspath(path)
        size = os.path.getsize(p)
        if size > max_bytes:
            raise ValueError(f"lexicon {p!r}: {size} bytes, over max_bytes={max_bytes}")
        with open_regular(p, "lexicon", "r", encoding="utf-8") as fh:
            text = fh.read(max_bytes + 1)
    if len(text) > max_bytes:
        raise ValueError(f"lexicon: over max_bytes={max_bytes}")
    rows: list[tuple[int, list[str]]] = []
    for no, line in enumerate(text.splitlines(), start=1):
        if len(line) > MAX_LINE:
            raise ValueError(f"lexicon line {no}: longer than {MAX_LINE} characters")
        f = line.split()
        if not f:
            continue
        if len(f) < 2:
            raise ValueError(f"lexicon line {no}: word {f[0][:40]!r} has no tokens")
        rows.append((no, f))
    if probabilities is None:
        probabilities = bool(rows) and all(len(f) >= 3 and _is_prob(f[1]) for _, f in rows)
    out: dict[str, list[list[str]]] = {}
    for no, f in rows:
        word, toks = f[0], f[1:]
        if probabilities:
            if not _is_prob(f[1]):
                raise ValueError(f"lexicon line {no}: probability {f[1][:40]!r} is not a number in (0, 1]")
            toks = f[2:]
            if not toks:
                raise ValueError(f"lexicon line {no}: word {word[:40]!r} has no tokens")
        spellings = out.setdefault(word, [])
        if toks not in spellings:
            spellings.append(toks)
    return out
