"""Greedy (best-frame) decoding of dense emissions for the CTC, ASG and transducer topologies."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch

__all__ = ["greedy_decode", "greedy_hypotheses", "DECODER_TOPOLOGIES"]

#: topologies understood by the decoders
DECODER_TOPOLOGIES = ("ctc", "asg", "transducer")


def _as_emissions(emissions, name: str = "emissions") -> np.ndarray:
    """(B, T, C) float32 C-contiguous numpy copy of a tensor or array, NaN rejected."""
    if isinstance(emissions, torch.Tensor):
        if not emissions.is_floating_point():
            raise ValueError(f"{name} must be a floating point tensor of shape (B, T, C), got {emissions.dtype}")
        x = emissions.detach().to("cpu", torch.float32).numpy()
    elif isinstance(emissions, np.ndarray):
        if not np.issubdtype(emissions.dtype, np.floating):
            raise ValueError(f"{name} must be a floating point array of shape (B, T, C), got {emissions.dtype}")
        x = emissions.astype(np.float32, copy=False)
    else:
        raise ValueError(
            f"{name} must be a torch.Tensor or numpy array of shape (B, T, C), got {type(emissions).__name__}"
        )
    if x.ndim != 3:
        raise ValueError(f"{name} must have shape (B, T, C) (batch first), got {x.ndim} dims: {tuple(x.shape)}")
    if x.shape[2] == 0:
        raise ValueError(f"{name} must have C >= 1 classes, got shape {tuple(x.shape)}")
    x = np.ascontiguousarray(x)
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ValueError(f"{name} contains NaN or +inf (log-probabilities expected)")
    return x


def _as_lengths(lengths, B: int, T: int) -> np.ndarray:
    if lengths is None:
        return np.full(B, T, dtype=np.int64)
    if isinstance(lengths, torch.Tensor):
        if lengths.is_floating_point() or lengths.dtype == torch.bool or lengths.is_complex():
            raise ValueError(f"lengths must hold integers, got {lengths.dtype}")
        arr = lengths.detach().cpu().numpy()
    else:
        arr = np.asarray(lengths)
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.integer)) or arr.dtype == np.bool_:
            raise ValueError(f"lengths must be integers of shape (B,) = ({B},), got {lengths!r}")
    if arr.ndim != 1 or arr.shape[0] != B:
        raise ValueError(f"lengths must have shape (B,) = ({B},), got {tuple(arr.shape)}")
    arr = arr.astype(np.int64)
    if B and (arr.min() < 0 or arr.max() > T):
        raise ValueError(f"lengths must be in [0, T] with T={T}, got min {int(arr.min())}, max {int(arr.max())}")
    return arr


def _check_topology(topology: str, C: int, blank, repeat) -> tuple:
    """``(blank or -1, repeat or -1)`` for ``topology`` over C tokens, with range checks."""
    if topology not in DECODER_TOPOLOGIES:
        raise ValueError(f"topology must be one of {DECODER_TOPOLOGIES}, got {topology!r}")
    for name, v in (("blank", blank), ("repeat", repeat)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
            raise ValueError(f"{name} must be an integer token id or None, got {v!r}")
    if topology == "asg":
        if blank is not None:
            raise ValueError(f"topology='asg' has no blank; got blank={blank}")
        b = -1
    else:
        if blank is None:
            blank = 0 if topology == "ctc" else C - 1
        if not 0 <= blank < C:
            raise ValueError(f"blank={blank} out of range [0, C) with C={C}")
        b = int(blank)
        if repeat is not None:
            raise ValueError(f"repeat is an ASG token; topology={topology!r} takes repeat=None")
    r = -1
    if repeat is not None:
        if not 0 <= repeat < C:
            raise ValueError(f"repeat={repeat} out of range [0, C) with C={C}")
        r = int(repeat)
    return b, r


def greedy_decode(
    emissions, lengths=None, *, topology: str = "ctc", blank: Optional[int] = None, repeat: Optional[int] = None
) -> List[List[int]]:
    """Best token of each frame, then the topology's collapse: the baseline decoder.

    CTC and the word-piece transducer merge repeated frames and drop the blank; ASG merges
    repeated frames and replaces its optional ``repeat`` token by the token before it.

    Args:
        emissions: ``(B, T, C)`` log-probabilities (tensor or numpy array, any float dtype, any
            device: read on the host).
        lengths: ``(B,)`` integer valid frames per utterance, each in ``[0, T]``; None: all T.
        topology: ``"ctc"``, ``"asg"`` or ``"transducer"``.
        blank: the blank id (CTC default 0, transducer default C - 1; must be None for ASG).
        repeat: ASG's repeat token id, or None.

    Returns:
        ``B`` lists of token ids.

    Example:
        >>> import torch
        >>> x = torch.tensor([[[0.0, -9, -9], [-9, 0.0, -9], [-9, 0.0, -9], [0.0, -9, -9], [-9, 0.0, -9]]])
        >>> greedy_decode(x, topology="ctc", blank=0)
        [[1, 1]]
    """
    x = _as_emissions(emissions)
    b, r = _check_topology(topology, x.shape[2], blank, repeat)
    lens = _as_lengths(lengths, x.shape[0], x.shape[1])
    return [seq for seq, _ in _best_paths(x, lens, b, r)]


def _best_paths(x: np.ndarray, lens: np.ndarray, b: int, r: int) -> List[Tuple[List[int], List[int]]]:
    """Per utterance the collapsed best-frame path: ``(tokens, first frame of each token)``."""
    B, T, _ = x.shape
    best = x.argmax(-1) if T else np.zeros((B, 0), dtype=np.int64)
    out: List[Tuple[List[int], List[int]]] = []
    for i in range(B):
        seq: List[int] = []
        frames: List[int] = []
        prev = -1
        for t, lab in enumerate(best[i, : lens[i]].tolist()):
            if lab != prev and lab != b:
                if lab == r:
                    if seq:
                        seq.append(seq[-1])
                        frames.append(t)
                else:
                    seq.append(lab)
                    frames.append(t)
            prev = lab
        out.append((seq, frames))
    return out


def greedy_hypotheses(
    emissions,
    lengths=None,
    *,
    topology: str = "ctc",
    blank: Optional[int] = None,
    repeat: Optional[int] = None,
    tokens: Optional[Sequence[str]] = None,
    word_separator: str = " ",
    word_separator_id: Optional[int] = None,
) -> List[Any]:
    """:func:`greedy_decode` (same first arguments), each result a
    :class:`~lightning_gtn.decode.beam.Hypothesis` with token and word times.

    ``timesteps`` is the first frame of each token's run on the best-frame path and
    ``token_ends`` the end of that run (exclusive); ``token_scores`` sums the run's
    log-probabilities of its frame label (ASG's ``repeat`` for a repeated token) and
    ``token_confidences`` is their mean ``exp``; ``score`` and ``am_score`` are the best
    path's log-probability (every frame's best score summed), ``lm_score`` is 0.

    Words: with ``tokens`` (the C token strings) ``text`` is the tokens' text and ``words`` it
    split at ``word_separator``, grouped as the lexicon-free :class:`BeamSearchDecoder` groups
    them (a token equal to the separator separates words, one starting with it begins one);
    without, ``words`` and ``text`` are empty and ``word_spans`` groups the tokens at
    ``word_separator_id`` (None: one word per token).

    Example:
        >>> import torch
        >>> x = torch.tensor([[[0.0, -9, -9], [-9, 0.0, -9], [-9, 0.0, -9], [0.0, -9, -9], [-9, 0.0, -9]]])
        >>> h = greedy_hypotheses(x, topology="ctc", blank=0)[0]
        >>> h.tokens, h.timesteps, h.token_ends
        ([1, 1], [1, 4], [3, 5])
    """
    from ..core.words import separator_ranges, start_ranges
    from .beam import Hypothesis
    from .times import fill_frame_times

    x = _as_emissions(emissions)
    B, T, C = x.shape
    b, r = _check_topology(topology, C, blank, repeat)
    lens = _as_lengths(lengths, B, T)
    if tokens is not None:
        if isinstance(tokens, str) or len(tokens) != C or not all(isinstance(t, str) for t in tokens):
            raise ValueError(f"tokens must be a list of C={C} strings (one per output class)")
        if not isinstance(word_separator, str) or not word_separator:
            raise ValueError(f"word_separator must be a non-empty string, got {word_separator!r}")
        seps = [i for i, t in enumerate(tokens) if t == word_separator and i != b]
        sep = seps[0] if seps else -1
        starts = [t.startswith(word_separator) and t != word_separator for t in tokens]
    out = []
    for i, (seq, frames) in enumerate(_best_paths(x, lens, b, r)):
        n = int(lens[i])
        score = float(x[i, np.arange(n), x[i, :n].argmax(-1)].astype(np.float64).sum()) if n else 0.0
        if tokens is not None:
            text = "".join(tokens[t] for t in seq)
            words = [w for w in text.split(word_separator) if w]
            ranges = start_ranges(seq, sep, starts)
        else:
            text, words, ranges = "", [], separator_ranges(seq, word_separator_id)
        hyp = Hypothesis(words, seq, frames, score, score, 0.0, text)
        out.append(fill_frame_times(hyp, x[i], n, ranges, r))
    return out
