"""Decoders' results with token and word times: the greedy searches as hypothesis objects.

:func:`greedy_hypotheses` (dense emissions: CTC, ASG, the framewise transducer) gives
:class:`~lightning_gtn.decode.beam.Hypothesis` objects, :func:`greedy_search_hypotheses`
(transducer networks: RNN-T, TDT, multi-blank) gives
:class:`~lightning_gtn.decode.transducer_beam.TransducerHypothesis` objects, with the fields the
beam searches fill (:mod:`lightning_gtn.decode.times` defines them).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np
import torch

from ..core.words import separator_ranges, start_ranges
from .beam import Hypothesis
from .greedy import _as_emissions, _as_lengths, _best_paths, _check_topology
from .times import fill_frame_times, token_times
from .transducer import _greedy
from .transducer_beam import TransducerHypothesis

__all__ = ["greedy_hypotheses", "greedy_search_hypotheses"]


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
) -> List[Hypothesis]:
    """:func:`~lightning_gtn.decode.greedy.greedy_decode` (same first arguments), each result a
    :class:`~lightning_gtn.decode.beam.Hypothesis` with token and word times.

    ``timesteps`` is the first frame of each token's run on the best-frame path and
    ``token_ends`` the end of that run (exclusive); ``token_scores`` sums the run's
    log-probabilities of its frame label (ASG's ``repeat`` for a repeated token) and
    ``token_confidences`` is their mean ``exp``; ``score`` and ``am_score`` are the best
    path's log-probability (every frame's best score summed), ``lm_score`` is 0.

    Words: with ``tokens`` (the C token strings) ``text`` is the tokens' text and ``words`` it
    split at ``word_separator``, grouped as the lexicon-free
    :class:`~lightning_gtn.decode.beam.BeamSearchDecoder` groups them (a token equal to the
    separator separates words, one starting with it begins one); without, ``words`` and
    ``text`` are empty and ``word_spans`` groups the tokens at ``word_separator_id`` (None: one
    word per token).

    Example:
        >>> import torch
        >>> x = torch.tensor([[[0.0, -9, -9], [-9, 0.0, -9], [-9, 0.0, -9], [0.0, -9, -9], [-9, 0.0, -9]]])
        >>> h = greedy_hypotheses(x, topology="ctc", blank=0)[0]
        >>> h.tokens, h.timesteps, h.token_ends
        ([1, 1], [1, 4], [3, 5])
    """
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


@torch.no_grad()
def greedy_search_hypotheses(
    model: Any,
    encoder_out: torch.Tensor,
    encoder_lengths: torch.Tensor,
    *,
    blank: int,
    max_symbols_per_frame: int = 3,
    num_classes: Optional[int] = None,
    durations: Optional[Sequence[int]] = None,
    big_blank_durations: Optional[Sequence[int]] = None,
    word_separator_id: Optional[int] = None,
) -> List[TransducerHypothesis]:
    """:func:`~lightning_gtn.decode.transducer.greedy_search` (same arguments), each result a
    :class:`~lightning_gtn.decode.transducer_beam.TransducerHypothesis` with token and word times.

    ``timesteps`` is the frame at which each token was emitted, ``token_scores`` its
    log-probability there (``log_softmax`` over the ``V`` token classes; over all outputs for
    multi-blank), ``token_confidences`` its ``exp`` (the greedy choice's probability, the largest
    of the step), ``score`` their sum, ``durations`` (TDT) the frames the search moved on after
    each token (the best duration; 1 where ``max_symbols_per_frame`` forced a move),
    ``word_spans`` the tokens grouped at ``word_separator_id`` (None: one word per token).

    Example:
        >>> import torch
        >>> class Toy:  # a joiner that reads the encoder frame only
        ...     def predict(self, tokens, state=None):
        ...         return torch.zeros(tokens.shape[0], tokens.shape[1], 3), None
        ...     def select_state(self, state, index):
        ...         return None
        ...     def join(self, enc, pred):
        ...         return enc + pred
        >>> enc = torch.tensor([[[0.0, 9.0, 0.0], [9.0, 0.0, 0.0], [0.0, 0.0, 9.0]]])  # (B=1, T=3, V=3)
        >>> h = greedy_search_hypotheses(Toy(), enc, torch.tensor([3]), blank=0, max_symbols_per_frame=1)[0]
        >>> h.tokens, h.timesteps
        ([1, 2], [0, 2])
    """
    args = (max_symbols_per_frame, num_classes, durations, big_blank_durations)
    res = _greedy(model, encoder_out, encoder_lengths, blank, *args)
    lengths = encoder_lengths.tolist()
    out = []
    for b, (toks, frames, logps, durs) in enumerate(res):
        hyp = TransducerHypothesis(toks, float(sum(logps)), num_frames=int(lengths[b]))
        out.append(token_times(hyp, frames, logps, word_separator_id, durs if durations is not None else None))
    return out
