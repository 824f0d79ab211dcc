"""Grouping of timed tokens into words, shared by forced alignment and the decoders.

A token here has a first frame ``start``, an exclusive end frame ``end``, a ``score`` (a sum of
log-probabilities) and a ``confidence`` in ``[0, 1]``. A word is a range of consecutive tokens
``[i0, i1)``; its record is what :func:`lightning_gtn.align.forced.word_spans` returns.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["separator_ranges", "length_ranges", "start_ranges", "word_records"]


def separator_ranges(tokens: Sequence[int], separator: Optional[int]) -> List[Tuple[int, int]]:
    """The maximal runs of tokens other than ``separator`` (which belongs to no word) as
    ``(first, end)`` ranges; with ``separator=None`` one word per token."""
    if separator is None:
        return [(i, i + 1) for i in range(len(tokens))]
    ranges: List[Tuple[int, int]] = []
    i0: Optional[int] = None
    for i, v in enumerate(list(tokens) + [separator]):
        if v == separator:
            if i0 is not None:
                ranges.append((i0, i))
            i0 = None
        elif i0 is None:
            i0 = i
    return ranges


def length_ranges(lengths: Sequence[int], total: int, name: str = "word_lengths") -> List[Tuple[int, int]]:
    """Consecutive groups of ``lengths[i]`` tokens (positive, summing to ``total``)."""
    wl = [int(n) for n in lengths]
    if any(n < 1 for n in wl) or sum(wl) != total:
        raise ValueError(f"{name} must be positive and sum to the target length {total}, got {wl}")
    out, i0 = [], 0
    for n in wl:
        out.append((i0, i0 + n))
        i0 += n
    return out


def start_ranges(tokens: Sequence[int], separator: int, starts_word: Any) -> List[Tuple[int, int]]:
    """Words of a token text: runs between ``separator`` tokens (``-1``: none), where a token
    whose ``starts_word[token]`` is True (a piece that begins with the separator's text, as
    sentencepiece writes them; a sequence or array indexed by token id) also begins a new word."""
    ranges: List[Tuple[int, int]] = []
    i0: Optional[int] = None
    for i, v in enumerate(tokens):
        if v == separator:
            if i0 is not None:
                ranges.append((i0, i))
            i0 = None
            continue
        if starts_word[v] and i0 is not None:
            ranges.append((i0, i))
            i0 = None
        if i0 is None:
            i0 = i
    if i0 is not None:
        ranges.append((i0, len(tokens)))
    return ranges


def word_records(
    ranges: Sequence[Tuple[int, int]],
    start: Sequence[int],
    end: Sequence[int],
    score: Sequence[float],
    confidence: Sequence[float],
) -> List[Dict]:
    """One dict per word range: ``{"word_index", "start" (its first token's start), "end" (its
    last token's end, exclusive), "score" (the sum of the token scores), "confidence" (the mean
    of the token confidences weighted by each token's frames, ``end - start``), "token_range"}``."""
    words = []
    for wi, (i0, i1) in enumerate(ranges):
        frames = [end[i] - start[i] for i in range(i0, i1)]
        n = sum(frames)
        words.append(
            {
                "word_index": wi,
                "start": int(start[i0]),
                "end": int(end[i1 - 1]),
                "score": float(sum(score[i0:i1])),
                "confidence": float(sum(c * f for c, f in zip(confidence[i0:i1], frames)) / max(n, 1)),
                "token_range": (i0, i1),
            }
        )
    return words
