"""Word pieces learned from training transcripts: a byte-pair-style trainer, a file format
that round-trips any piece, and greedy (longest-match-first) segmentation.

The word-piece transducer (:mod:`lightning_gtn.losses.transducer`) scores emissions over
a token set of word pieces; this module makes that set from the training transcripts and
saves it with a run. It is engine-level: plain Python, no torch or Lightning.

Pieces are learned the BPE way: every word of the transcripts starts as its graphemes
(Python characters), and the most frequent pair of neighbouring pieces is merged, again and
again, until ``num_pieces`` pieces exist or no pair occurs ``min_count`` times. Merges never
cross the word separator, which stays a piece of its own, and every grapheme that occurs is a
piece, so every transcript (and every word made of known graphemes) can be spelled.

Example:
    >>> pieces = train_word_pieces(["the cat", "the hat", "that cat"], 12)
    >>> pieces[:8]
    [' ', 'a', 'c', 'e', 'h', 't', 'at', 'th']
    >>> [pieces[i] for i in greedy_segment("that", pieces)]
    ['th', 'at']
"""

from __future__ import annotations

import functools
import heapq
import os
from collections import Counter
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from .files import open_regular
from .integers import check_int

__all__ = [
    "train_word_pieces",
    "save_word_pieces",
    "load_word_pieces",
    "greedy_segment",
    "DEFAULT_MAX_BYTES",
]

DEFAULT_MAX_BYTES = 16 * 2**20
"""The largest word-piece file :func:`load_word_pieces` reads unless told otherwise (16 MiB)."""

_PROGRESS_MIN_CHARS = 1_000_000  # inputs this large get a progress bar (when tqdm is installed)


# -- training -------------------------------------------------------------------------------------


def _check_texts(texts) -> List[str]:
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Iterable):
        raise TypeError(f"texts must be a sequence of str (one transcript each), got {type(texts).__name__}")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(t).__name__}")
    return texts


def _progress(total: int, enabled: bool):
    """A tqdm bar when asked for and installed, else a do-nothing stand-in."""
    if enabled:
        try:
            from tqdm.auto import tqdm

            return tqdm(total=total, desc="word pieces", unit="merge", leave=False)
        except ImportError:  # tqdm is optional
            pass

    class _Null:
        def update(self, n: int = 1) -> None:
            pass

        def close(self) -> None:
            pass

    return _Null()


def train_word_pieces(
    texts: Sequence[str],
    num_pieces: int,
    *,
    min_count: int = 2,
    word_boundary: str = " ",
    progress: Optional[bool] = None,
) -> List[str]:
    """Learns word pieces from transcripts by merging frequent neighbouring pieces (BPE).

    Words are the transcripts split at ``word_boundary`` (empty words dropped) and counted;
    each starts as its graphemes. Each step merges the pair of neighbouring pieces that
    occurs most often over all words (ties go to the lexically smallest pair), until
    ``num_pieces`` distinct pieces exist or the best pair occurs fewer than ``min_count``
    times. Merges happen inside words only, so no piece crosses a word boundary.

    Args:
        texts: the training transcripts, a sequence of str.
        num_pieces: how many pieces to learn in all, graphemes included; at least the
            number of distinct graphemes (the word boundary counts as one).
        min_count: a pair is merged only if it occurs at least this many times.
        word_boundary: the one-character word separator; always a piece of its own, even if
            no transcript contains it.
        progress: show a tqdm progress bar (if tqdm is installed); ``None`` shows one for
            inputs of a million characters or more.

    Returns:
        The pieces: first the graphemes, sorted (the word boundary among them), then the
        learned pieces in the order they were merged. Fewer than ``num_pieces`` when
        ``min_count`` stops the merging first. Deterministic for given arguments.

    Raises:
        TypeError: if ``texts`` is not a sequence of str or an int argument is not an int.
        ValueError: if ``num_pieces`` is smaller than the number of graphemes, ``min_count``
            is below 1, or ``word_boundary`` is not a single character.

    Example:
        >>> train_word_pieces(["aaa aa"], 4, min_count=1)
        [' ', 'a', 'aa', 'aaa']
    """
    texts = _check_texts(texts)
    if not isinstance(word_boundary, str) or len(word_boundary) != 1:
        raise ValueError(f"word_boundary must be a single character, got {word_boundary!r}")
    check_int(num_pieces, "num_pieces", 1)
    check_int(min_count, "min_count", 1)

    word_counts: Counter = Counter()
    for t in texts:
        word_counts.update(w for w in t.split(word_boundary) if w)
    graphemes = sorted({c for w in word_counts for c in w} | {word_boundary})
    if num_pieces < len(graphemes):
        raise ValueError(
            f"num_pieces must be at least the number of distinct graphemes ({len(graphemes)}, "
            f"the word boundary included), got {num_pieces}"
        )
    pieces = list(graphemes)
    known = set(pieces)
    if num_pieces == len(pieces):
        return pieces

    # Words in a fixed order (the Counter's order depends only on the input's order).
    words: List[List[str]] = [list(w) for w in word_counts]
    freq: List[int] = [word_counts[w] for w in word_counts]
    pair_count: Dict[Tuple[str, str], int] = {}
    pair_words: Dict[Tuple[str, str], set] = {}
    for i, syms in enumerate(words):
        for p in zip(syms, syms[1:]):
            pair_count[p] = pair_count.get(p, 0) + freq[i]
            pair_words.setdefault(p, set()).add(i)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)

    if progress is None:
        progress = sum(map(len, texts)) >= _PROGRESS_MIN_CHARS
    bar = _progress(num_pieces - len(pieces), bool(progress))
    try:
        while len(pieces) < num_pieces and heap:
            neg, pair = heapq.heappop(heap)
            if pair_count.get(pair, 0) != -neg:
                continue  # a stale entry: the pair's count changed since it was pushed
            if -neg < min_count:
                break
            merged = pair[0] + pair[1]
            a, b = pair
            delta: Dict[Tuple[str, str], int] = {}
            # pair_words may list words that lost the pair since (kept lazily): they are skipped.
            for i in pair_words.pop(pair):
                old = words[i]
                n = len(old)
                k = 0
                new: List[str] = []
                hit = False
                while k < n:
                    if k + 1 < n and old[k] == a and old[k + 1] == b:
                        new.append(merged)
                        k += 2
                        hit = True
                    else:
                        new.append(old[k])
                        k += 1
                if not hit:
                    continue
                f = freq[i]
                for p in zip(old, old[1:]):
                    delta[p] = delta.get(p, 0) - f
                for p in zip(new, new[1:]):
                    delta[p] = delta.get(p, 0) + f
                    if merged in p:
                        ws = pair_words.get(p)
                        if ws is None:
                            pair_words[p] = {i}
                        else:
                            ws.add(i)
                words[i] = new
            for p, d in delta.items():
                if d == 0 or p == pair:
                    continue
                c = pair_count.get(p, 0) + d
                if c > 0:
                    pair_count[p] = c
                    heapq.heappush(heap, (-c, p))
                else:
                    pair_count.pop(p, None)
                    pair_words.pop(p, None)
            pair_count.pop(pair, None)
            if merged not in known:  # ("a", "bc") and ("ab", "c") both make "abc"
                known.add(merged)
                pieces.append(merged)
                bar.update(1)
    finally:
        bar.close()
    return pieces


# -- segmentation ---------------------------------------------------------------------------------


def _check_pieces(pieces, name: str = "pieces") -> Tuple[str, ...]:
    if isinstance(pieces, (str, bytes)) or not isinstance(pieces, Iterable):
        raise TypeError(f"{name} must be a sequence of str, got {type(pieces).__name__}")
    pieces = tuple(pieces)
    seen = set()
    for i, p in enumerate(pieces):
        if not isinstance(p, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(p).__name__}")
        if not p:
            raise ValueError(f"{name}[{i}] is empty; pieces must be non-empty strings")
        if p in seen:
            raise ValueError(f"{name}[{i}] = {p!r} is a duplicate; pieces must be distinct")
        seen.add(p)
    return pieces


@functools.lru_cache(maxsize=8)
def _trie(pieces: Tuple[str, ...]) -> dict:
    # Nested dicts keyed by character; the key None holds the id of the piece ending there.
    # Cached, so segmenting many words with one piece list checks and builds it once.
    _check_pieces(pieces)
    root: dict = {}
    for i, p in enumerate(pieces):
        node = root
        for c in p:
            node = node.setdefault(c, {})
        node[None] = i
    return root


def greedy_segment(word: str, pieces: Sequence[str]) -> List[int]:
    """Splits ``word`` into pieces, longest match first, left to right.

    At each position the longest piece that matches there is taken. With every grapheme a
    piece (as :func:`train_word_pieces` guarantees) this always succeeds; it need not give
    the fewest pieces (the transducer's own ``segment`` does that).

    Args:
        word: the text to split (a word, or a whole transcript: the word boundary is a piece).
        pieces: the pieces, distinct non-empty strings.

    Returns:
        The piece ids (indices into ``pieces``); ``"".join(pieces[i] for i in ids) == word``.

    Raises:
        ValueError: if some grapheme of ``word`` starts no piece, or ``pieces`` has empty or
            repeated entries.
        TypeError: if ``word`` is not a str or ``pieces`` not a sequence of str.

    Example:
        >>> greedy_segment("abab", ["a", "b", "ab", "aba"])
        [3, 1]
    """
    if not isinstance(word, str):
        raise TypeError(f"word must be a str, got {type(word).__name__}")
    if isinstance(pieces, (str, bytes)) or not isinstance(pieces, Iterable):
        raise TypeError(f"pieces must be a sequence of str, got {type(pieces).__name__}")
    key = tuple(pieces)
    try:
        root = _trie(key)
    except TypeError:  # an unhashable entry: let the check name it
        _check_pieces(key)
        raise
    out: List[int] = []
    k = 0
    n = len(word)
    node: Optional[dict]
    while k < n:
        node, best, best_end = root, None, k
        j = k
        while j < n:
            node = node.get(word[j])
            if node is None:
                break
            j += 1
            if None in node:
                best, best_end = node[None], j
        if best is None:
            raise ValueError(f"word {word!r}: the grapheme {word[k]!r} at position {k} is not covered by any piece")
        out.append(best)
        k = best_end
    return out


# -- files ----------------------------------------------------------------------------------------

_ESCAPES = {"\\": "\\\\", " ": "\\s"}


def _escape(piece: str) -> str:
    out = []
    for c in piece:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif not c.isprintable():  # newlines, tabs, other spaces, controls, unassigned
            out.append(f"\\U{ord(c):08x}")
        else:
            out.append(c)
    return "".join(out)


def _unescape(line: str, lineno: int, where: str) -> str:
    out = []
    k = 0
    n = len(line)
    while k < n:
        c = line[k]
        if c != "\\":
            if not c.isprintable():
                raise ValueError(f"{where}: line {lineno}: raw character U+{ord(c):04X}; escape it as \\U{ord(c):08x}")
            out.append(c)
            k += 1
            continue
        nxt = line[k + 1 : k + 2]
        if nxt == "\\":
            out.append("\\")
            k += 2
        elif nxt == "s":
            out.append(" ")
            k += 2
        elif nxt == "U":
            digits = line[k + 2 : k + 10]
            if len(digits) != 8 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise ValueError(f"{where}: line {lineno}: \\U must be followed by 8 hex digits")
            code = int(digits, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise ValueError(f"{where}: line {lineno}: \\U{digits} is not a Unicode scalar value")
            out.append(chr(code))
            k += 10
        else:
            raise ValueError(
                f"{where}: line {lineno}: unknown escape {line[k:k + 2]!r} (expected \\\\, \\s or \\UXXXXXXXX)"
            )
    return "".join(out)


def save_word_pieces(pieces: Sequence[str], path) -> None:
    """Writes pieces to a UTF-8 text file, one a line, in order.

    A backslash is written ``\\\\``, a space ``\\s``, and any other character that is not
    printable (newline, tab, no-break space, controls) ``\\UXXXXXXXX`` (8 hex digits), so
    every piece, the space piece included, survives :func:`load_word_pieces` unchanged and
    no line has leading or trailing whitespace.

    Args:
        pieces: distinct non-empty strings.
        path: the file to write (a path or path-like).

    Raises:
        ValueError: if ``pieces`` is empty or has empty or repeated entries.

    Example:
        >>> import tempfile, os
        >>> f = os.path.join(tempfile.mkdtemp(), "pieces.txt")
        >>> save_word_pieces([" ", "a", "th"], f)
        >>> open(f, encoding="utf-8").read().split()
        ['\\\\s', 'a', 'th']
        >>> load_word_pieces(f)
        [' ', 'a', 'th']
    """
    pieces = _check_pieces(pieces)
    if not pieces:
        raise ValueError("pieces must not be empty")
    text = "".join(_escape(p) + "\n" for p in pieces)
    with open(os.fspath(path), "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def load_word_pieces(path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> List[str]:
    """Reads pieces written by :func:`save_word_pieces`.

    The file is read only up to ``max_bytes`` (larger ones are refused before anything is
    parsed), must be UTF-8, and every line must be one escaped, non-empty piece (a final
    newline is optional; Windows line ends are accepted).

    Args:
        path: the file to read.
        max_bytes: refuse files larger than this many bytes (default 16 MiB).

    Returns:
        The pieces, in file order.

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: if the file is too large, not UTF-8, empty, or has an empty line, a
            malformed escape, a raw control character, or a repeated piece (the message names
            the line).
    """
    check_int(max_bytes, "max_bytes", 1)
    where = os.fspath(path)
    with open_regular(where, "word-piece file") as f:
        data = f.read(max_bytes + 1)  # bounded even for files that grow
    if len(data) > max_bytes:
        raise ValueError(f"{where!r}: word-piece file larger than max_bytes={max_bytes}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where!r}: not UTF-8 ({e.reason} at byte {e.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise ValueError(f"{where!r}: no word pieces in the file")
    pieces: List[str] = []
    seen: Dict[str, int] = {}
    for lineno, line in enumerate(lines, 1):
        if line.endswith("\r"):
            line = line[:-1]
        if not line:
            raise ValueError(f"{where!r}: line {lineno} is empty (pieces are non-empty; write a space as \\s)")
        piece = _unescape(line, lineno, repr(where))
        if piece in seen:
            raise ValueError(f"{where!r}: line {lineno} repeats the piece {piece!r} of line {seen[piece]}")
        seen[piece] = lineno
        pieces.append(piece)
    return pieces
