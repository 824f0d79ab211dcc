"""Token and word times and confidences of decoded hypotheses (the fields the decoders fill).

Transducer tokens are emitted *at* a frame: a token's span is ``[t, t + 1)``, its score the
joiner's log-probability of it at that step, its confidence ``exp`` of that. A CTC-style token
(CTC, ASG, the framewise word-piece transducer) starts at the frame it is first emitted and runs
on over the following frames whose best class is its frame label, up to the next token's first
frame: greedy decoding's run of the token exactly, and the same rule for the beam search's
tokens. Its score is the sum of its frames' log-probabilities and its confidence their mean
``exp`` (the mean per-frame posterior, as :func:`lightning_gtn.align.forced.forced_align`
defines ``token_confidence``). Words group tokens (:mod:`lightning_gtn.core.words`); a word's
confidence is the frame-weighted mean of its tokens' (a transducer word: their mean).
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ..core.words import separator_ranges, start_ranges, word_records

__all__ = [
    "best_runs",
    "token_times",
    "frame_token_times",
    "frame_labels",
    "lexicon_ranges",
    "fill_frame_times",
    "start_ranges",
]


def _check_separator(word_separator_id: Optional[int]) -> Optional[int]:
    if word_separator_id is None:
        return None
    if isinstance(word_separator_id, bool) or not isinstance(word_separator_id, (int, np.integer)):
        raise ValueError(f"word_separator_id must be a token id or None, got {word_separator_id!r}")
    return int(word_separator_id)


def token_times(
    hyp: Any,
    frames: Sequence[int],
    logps: Sequence[float],
    word_separator_id: Optional[int] = None,
    durations: Optional[Sequence[int]] = None,
) -> Any:
    """Fills a transducer hypothesis' ``timesteps``, ``token_ends`` (``+ 1``), ``token_scores``
    (``logps``), ``token_confidences`` (``exp``), ``durations`` and ``word_spans`` (tokens
    grouped at ``word_separator_id``, else one word per token); returns ``hyp``."""
    sep = _check_separator(word_separator_id)
    if len(frames) != len(hyp.tokens) or len(logps) != len(hyp.tokens):
        raise ValueError(f"token_times: {len(hyp.tokens)} tokens but {len(frames)} frames, {len(logps)} scores")
    hyp.timesteps = [int(t) for t in frames]
    hyp.token_ends = [t + 1 for t in hyp.timesteps]
    hyp.token_scores = [float(s) for s in logps]
    hyp.token_confidences = [math.exp(s) for s in hyp.token_scores]
    if durations is not None:
        hyp.durations = [int(d) for d in durations]
    ranges = separator_ranges(hyp.tokens, sep)
    hyp.word_spans = word_records(ranges, hyp.timesteps, hyp.token_ends, hyp.token_scores, hyp.token_confidences)
    return hyp


def frame_labels(tokens: Sequence[int], repeat: int) -> List[int]:
    """The frame label of each emitted token: ASG's ``repeat`` token (``>= 0``) stands for a
    token equal to the one before it; otherwise the token itself."""
    return [repeat if repeat >= 0 and i and v == tokens[i - 1] else int(v) for i, v in enumerate(tokens)]


def best_runs(x: np.ndarray, T: int) -> Tuple[np.ndarray, np.ndarray]:
    """``(best, run_end)`` of one utterance's ``(T_max, C)`` log-probabilities over its first
    ``T`` frames: each frame's best class and the end (exclusive) of the run of equal best classes
    that the frame belongs to. Computed once per utterance, shared by its hypotheses."""
    best = x[:T].argmax(-1) if T else np.zeros(0, dtype=np.int64)
    change = np.flatnonzero(best[1:] != best[:-1]) + 1  # the frames where a new run begins
    bounds = np.append(change, T)
    return best, bounds[np.searchsorted(change, np.arange(T), side="right")]


def frame_token_times(
    x: np.ndarray,
    T: int,
    tokens: Sequence[int],
    starts: Sequence[int],
    repeat: int = -1,
    runs: Optional[Tuple[np.ndarray, np.ndarray]] = None,
) -> Tuple[List[int], List[float], List[float]]:
    """Ends, scores and confidences of CTC-style tokens (see the module docstring).

    Args:
        x: ``(T_max, C)`` log-probabilities of one utterance.
        T: its valid frames.
        tokens: the emitted tokens (ASG's repeat already expanded).
        starts: each token's first frame (non-decreasing, in ``[0, T)``).
        repeat: ASG's repeat id, or -1.
        runs: :func:`best_runs` of ``x`` and ``T`` when already computed.

    Returns:
        ``(ends, scores, confidences)``: per token the exclusive end frame, the sum of the
        log-probabilities of its frame label over ``[start, end)`` and their mean ``exp``.
    """
    n = len(tokens)
    if len(starts) != n:
        raise ValueError(f"{n} tokens but {len(starts)} start frames")
    if n == 0:
        return [], [], []
    s = np.asarray(starts, dtype=np.int64)
    bad = np.flatnonzero((s < 0) | (s >= T))
    if len(bad):
        raise ValueError(f"token {int(bad[0])} starts at frame {int(s[bad[0]])}, outside [0, {T})")
    labels = np.asarray(frame_labels(tokens, repeat), dtype=np.int64)
    best, run_end = runs if runs is not None else best_runs(x, T)
    stop = np.append(s[1:], T)  # the next token's first frame
    nxt = np.minimum(s + 1, T - 1)
    # the run goes on over the frames after the start whose best class is the token's label
    goes_on = (s + 1 < stop) & (best[nxt] == labels)
    e = np.where(goes_on, np.minimum(stop, run_end[nxt]), s + 1)
    length = e - s
    first = np.cumsum(length) - length
    frames = np.arange(int(length.sum())) - np.repeat(first, length) + np.repeat(s, length)
    vals = x[frames, np.repeat(labels, length)].astype(np.float64)
    scores = np.add.reduceat(vals, first)
    confs = np.add.reduceat(np.exp(vals), first) / length
    return e.tolist(), scores.tolist(), confs.tolist()


def lexicon_ranges(tokens: Sequence[int], word_ids: Sequence[int], separator: int) -> List[Tuple[int, int]]:
    """Words of a lexicon beam search's hypothesis: each word ends at the token whose record
    carries its word id (``>= 0``) and begins at the first token after the previous word that is
    not the ``separator`` (silence); tokens after the last word, separators left out, are the
    open word of a fallback."""
    ranges: List[Tuple[int, int]] = []
    i0: Optional[int] = None
    for i, (v, w) in enumerate(zip(tokens, word_ids)):
        if i0 is None and v != separator:
            i0 = i
        if w >= 0 and i0 is not None:
            ranges.append((i0, i + 1))
            i0 = None
    if i0 is not None:
        ranges.append((i0, len(tokens)))
    return ranges


def fill_frame_times(
    hyp: Any,
    x: np.ndarray,
    T: int,
    ranges: Sequence[Tuple[int, int]],
    repeat: int = -1,
    runs: Optional[Tuple[np.ndarray, np.ndarray]] = None,
) -> Any:
    """Fills a CTC-style hypothesis' ``token_ends``, ``token_scores``, ``token_confidences``,
    ``word_spans`` (from ``ranges``) and ``num_frames`` from its ``tokens`` and ``timesteps``
    (:func:`frame_token_times`, ``runs`` as there); returns ``hyp``."""
    ends, scores, confs = frame_token_times(x, T, hyp.tokens, hyp.timesteps, repeat, runs)
    hyp.token_ends, hyp.token_scores, hyp.token_confidences = ends, scores, confs
    hyp.word_spans = word_records(ranges, hyp.timesteps, ends, scores, confs)
    hyp.num_frames = int(T)
    return hyp
