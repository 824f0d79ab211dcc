"""Beam search over T o L o G (topology, lexicon, n-gram LM), composed on the fly, in numba."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Sequence

import numpy as np

from ..kernels import beam_search_numba
from ..wfst.parallel import parallel_map
from . import times
from .context_graph import ContextGraph, token_kinds
from .greedy import _as_emissions, _as_lengths, _check_topology
from .lexicon import Lexicon

__all__ = ["BeamSearchDecoder", "Hypothesis", "check_lm_arrays"]

_I32 = np.iinfo(np.int32).max


@dataclass
class Hypothesis:
    """One decoding result.

    Attributes:
        words: the words (lexicon mode: lexicon words; lexicon-free: the text split at the separator).
        tokens: the emitted token ids (ASG's repeat token expanded to the token it repeats).
        timesteps: the frame at which each token was first emitted (same length as ``tokens``).
        score: ``am_score + lm_weight * lm_score + word_score * len(words) + bonuses`` (hotwords,
            unk scores, context biasing).
        am_score: acoustic log-score (log-sum over the merged alignments).
        lm_score: natural-log LM probability of the words, ``</s>`` included (0 without an LM).
        text: the words joined by the word separator (lexicon-free: the tokens' text).
        fallback: no complete hypothesis survived the beam (lexicon mode: every survivor was
            inside a word at the last frame; or none survived): this is the best survivor, its
            open word spelled from its tokens (then the last of ``words`` is no lexicon word), or
            an empty hypothesis of score ``-inf`` when the beam died out.
        token_ends: each token's end frame (exclusive): its first frame and the frames after it
            whose best class is its frame label, up to the next token's first frame.
        token_scores: the sum of the log-probabilities of each token's frame label over
            ``[timesteps[i], token_ends[i])``.
        token_confidences: the mean of their ``exp``: the token's mean per-frame posterior.
        word_spans: one dict per word of ``words``, as :func:`lightning_gtn.align.forced.word_spans`
            gives them (``{"word_index", "start", "end", "score", "confidence",
            "token_range"}``; ``confidence`` the frame-weighted mean of the tokens').
        num_frames: the utterance's frames.
    """

    words: List[str]
    tokens: List[int]
    timesteps: List[int]
    score: float
    am_score: float
    lm_score: float
    text: str = field(default="")
    fallback: bool = False
    token_ends: List[int] = field(default_factory=list)
    token_scores: List[float] = field(default_factory=list)
    token_confidences: List[float] = field(default_factory=list)
    word_spans: List[dict] = field(default_factory=list)
    num_frames: int = 0


def check_lm_arrays(a, num_words: Optional[int] = None):
    """Range-checks an ``LMArrays`` tuple (see :class:`BeamSearchDecoder`) and returns typed copies.

    Raises:
        ValueError: naming the field, if a shape, dtype or index is out of range.
    """
    try:
        for name in ("state_offsets", "arc_word", "arc_next", "backoff_state"):
            v = np.asarray(getattr(a, name))
            if v.size and v.dtype.kind not in "iu":  # a float would be truncated, not refused
                raise ValueError(f"{name} must hold integers, got {v.dtype}")
            if name != "state_offsets" and v.size and (v.min() < -(2**31) or v.max() >= 2**31):
                raise ValueError(f"{name} holds values outside int32")  # a cast would wrap them
        st_off = np.ascontiguousarray(a.state_offsets, dtype=np.int64)
        arc_word = np.ascontiguousarray(a.arc_word, dtype=np.int32)
        arc_logp = np.ascontiguousarray(a.arc_logp, dtype=np.float32)
        arc_next = np.ascontiguousarray(a.arc_next, dtype=np.int32)
        bo_logp = np.ascontiguousarray(a.backoff_logp, dtype=np.float32)
        bo_state = np.ascontiguousarray(a.backoff_state, dtype=np.int32)
        ints = [int(a.start_state), int(a.bos), int(a.eos), int(a.unk)]
    except (AttributeError, TypeError, ValueError) as exc:
        raise ValueError(f"lm.arrays() must return an LMArrays tuple of numpy arrays and ints: {exc}") from None
    S = bo_logp.shape[0]
    A = arc_word.shape[0]
    for name, arr, n in (
        ("state_offsets", st_off, S + 1),
        ("arc_logp", arc_logp, A),
        ("arc_next", arc_next, A),
        ("backoff_state", bo_state, S),
    ):
        if arr.ndim != 1 or arr.shape[0] != n:
            raise ValueError(f"LM arrays: {name} must have shape ({n},), got {arr.shape}")
    if S == 0:
        raise ValueError("LM arrays: the LM has no state")
    if st_off[0] != 0 or st_off[-1] != A or (np.diff(st_off) < 0).any():
        raise ValueError("LM arrays: state_offsets must rise from 0 to len(arc_word)")
    if A and (arc_next.min() < 0 or arc_next.max() >= S):
        raise ValueError(f"LM arrays: arc_next out of range [0, {S})")
    if (bo_state < -1).any() or (bo_state >= S).any():
        raise ValueError(f"LM arrays: backoff_state out of range [-1, {S})")
    if np.isnan(arc_logp).any() or np.isnan(bo_logp).any() or np.isposinf(arc_logp).any() or np.isposinf(bo_logp).any():
        raise ValueError("LM arrays: NaN or +inf log-probabilities")
    if A and arc_word.min() < 0:
        raise ValueError("LM arrays: negative arc_word")
    if num_words is not None and A and arc_word.max() >= num_words:
        raise ValueError(f"LM arrays: arc_word out of range [0, {num_words})")
    if not 0 <= ints[0] < S:
        raise ValueError(f"LM arrays: start_state {ints[0]} out of range [0, {S})")
    # the back-off chain must end at -1 (no cycle)
    cur = bo_state.astype(np.int64)  # follow every chain one step at a time (depth <= order)
    for _ in range(S + 1):
        live = cur >= 0
        if not live.any():
            break
        cur[live] = bo_state[cur[live]]
    else:
        raise ValueError("LM arrays: backoff_state has a cycle")
    return st_off, arc_word, arc_logp, arc_next, bo_logp, bo_state, ints


class BeamSearchDecoder:
    """Beam search over T o L o G for dense emissions, with a lexicon and an n-gram LM.

    The composition is done on the fly: a hypothesis is (lexicon trie node, LM state, last frame
    token, word history) with its scores; reaching a word end in the trie applies the LM through
    its back-off arrays (G and L o G are never built). Hypotheses with the same state and the same
    word history are merged by log-add (as CTC prefix search and pyctcdecode do), so a
    hypothesis' acoustic score sums its alignments. Each frame keeps the hypotheses within
    ``beam_threshold`` of the best, at most ``beam_size`` of them (flashlight's meanings of beam
    size and beam threshold). While a word is being spelled, its pruning score carries
    ``lm_weight`` x the best unigram log-probability of the words below its trie node (flashlight's
    LM smearing), replaced by the real LM score when the word ends: look-ahead changes only which
    hypotheses survive, never a returned score. A returned ``score`` is ``am_score + lm_weight *
    lm_score + word_score * len(words)`` plus hotword bonuses and unk scores; with a wide beam
    the best hypothesis is the exact best word sequence under that score (alignments summed).

    Topologies: ``"ctc"`` (``blank`` id, default 0), ``"asg"`` (no blank, repeated frames merge,
    optional ``repeat`` token meaning "the previous token again"), ``"transducer"`` (the
    word-piece transducer of the GTN papers scored framewise: blank last by default, tokens may be
    multi-character word pieces).

    Modes: with a ``lexicon``, output words are lexicon words and ``lm`` is a word LM (a token
    equal to ``word_separator`` may appear between words as silence). With ``lexicon_free=True``,
    any token sequence is allowed, ``lm`` (optional) is a token-level LM whose words are the token
    strings, and words are the text split at ``word_separator`` (a token starting with the
    separator, like a sentencepiece piece, starts a new word).

    Args:
        tokens: the C output token strings (the blank's string is ignored).
        topology: ``"ctc"``, ``"asg"`` or ``"transducer"``.
        blank: blank id (CTC default 0, transducer default C - 1; None for ASG).
        repeat: ASG's repeat token id, or None.
        lexicon: a :class:`Lexicon` or a dict word -> spellings, or None.
        lm: an object with ``arrays()`` returning the LM contract's ``LMArrays`` and ``word_id``
            (``lightning_gtn.lm.NGramLM``), or None.
        lm_weight: weight of the natural-log LM score.
        word_score: added per word.
        unk_score: added to lexicon words the LM maps to ``<unk>``; -inf forbids them.
        beam_size: hypotheses kept per frame.
        beam_threshold: hypotheses scoring more than this below the best are dropped.
        token_beam: only the ``token_beam`` best tokens of each frame are expanded (None: all).
        token_min_logp: tokens of a frame below this log-probability are not expanded, except the
            frame's best (pyctcdecode's ``token_min_logp``); None: no such limit.
        nbest: hypotheses returned per utterance.
        hotwords: word -> bonus (any sign) added each time the word is emitted (lexicon mode:
            the words must be in the lexicon; lexicon-free: spelled with the one-character
            tokens, the word closed by a separator, a word-starting token or the end). They are
            phrases of the context graph (each spelling between two word boundaries) worth
            ``bonus x k / L`` after ``k`` of the word's ``L`` tokens and exactly ``bonus`` once it
            is complete, so a returned score carries the bonus once per emitted word, while a
            partial match earns its share during the search and gives it back if the word is
            not completed (this changes which hypotheses survive pruning, not returned scores).
            Lexicon words spelled alike share the bonus. With ``context`` too, both are one graph
            (a state on several phrases is worth the largest of their worths there).
        word_separator: the string that separates words (lexicon-free text, silence token).
        lexicon_free: decode without a lexicon (required when ``lm`` is given without one).
        transitions: ASG only: the ``(C + 1, C)`` transition scores of the ASG loss
            (``transitions[0, y]`` starts on frame label y, ``transitions[i + 1, j]`` is added when
            frame label i follows frame label j, staying included), as a tensor or array; None: none.
        context: context biasing (see :mod:`lightning_gtn.decode.context_graph`): a
            :class:`ContextGraph` over these tokens, or a list of phrases (strings of words,
            spelled by the lexicon or, lexicon-free, by the token texts; or lists of token ids),
            or None. The graph reads each word's tokens and a boundary at each word's end; its
            bonus is part of ``score``.
        context_score: the bonus per matched token of a ``context`` given as phrases.
        context_cap: the most one match may earn (None: the graph's default).
        max_work_bytes: the most working memory one utterance may take (its buffers grow with
            ``beam_size``, the tokens and the frames); more is a ValueError, never an allocation.

    Example:
        >>> import torch
        >>> dec = BeamSearchDecoder(["_", "a", "b"], blank=0, lexicon={"ab": [[1, 2]], "ba": [[2, 1]]})
        >>> x = torch.tensor([[[-3.0, -0.1, -2.5], [-0.5, -2.0, -1.0], [-2.0, -3.0, -0.2]]])
        >>> dec.decode(x)[0][0].words
        ['ab']
    """

    # set in __init__ (declared here: mypy checks the methods before it has inferred __init__)
    tokens: List[str]
    topology: str
    blank: int
    repeat: int
    token_min_logp: float
    beam_size: int
    nbest: int
    max_work_bytes: int
    token_beam: int
    beam_threshold: float
    lm_weight: float
    word_score: float
    unk_score: float
    word_separator: str
    sep: int
    lexicon_free: bool
    lexicon: Optional[Lexicon]
    lm: Any
    _trans: np.ndarray
    context: Optional[ContextGraph]
    _ctx: tuple

    def __init__(
        self,
        tokens: Sequence[str],
        *,
        topology: str = "ctc",
        blank: Optional[int] = None,
        repeat: Optional[int] = None,
        lexicon=None,
        lm=None,
        lm_weight: float = 0.5,
        word_score: float = 0.0,
        unk_score: float = -math.inf,
        beam_size: int = 50,
        beam_threshold: float = 25.0,
        token_beam: Optional[int] = None,
        token_min_logp: Optional[float] = None,
        nbest: int = 1,
        hotwords: Optional[Mapping[str, float]] = None,
        word_separator: str = " ",
        lexicon_free: bool = False,
        transitions=None,
        context=None,
        context_score: float = 0.5,
        context_cap: Optional[float] = None,
        max_work_bytes: int = 1 << 30,
    ) -> None:
        if isinstance(tokens, str) or not all(isinstance(t, str) for t in tokens):
            raise ValueError("tokens must be a list of strings (one per output class)")
        self.tokens = list(tokens)
        C = len(self.tokens)
        if C == 0:
            raise ValueError("tokens is empty")
        self.topology = topology
        self.blank, self.repeat = _check_topology(topology, C, blank, repeat)
        for name, v, lo in (("beam_size", beam_size, 1), ("nbest", nbest, 1)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo or v > 1_000_000:
                raise ValueError(f"{name} must be an integer in [1, 1000000], got {v!r}")
        if token_beam is not None and (
            isinstance(token_beam, bool) or not isinstance(token_beam, (int, np.integer)) or token_beam < 1
        ):
            raise ValueError(f"token_beam must be a positive integer or None, got {token_beam!r}")
        for name, x in (("lm_weight", lm_weight), ("word_score", word_score), ("beam_threshold", beam_threshold)):
            if not isinstance(x, numbers.Real) or math.isnan(x) or math.isinf(x) and name != "beam_threshold":
                raise ValueError(f"{name} must be a finite number, got {x!r}")
        if not isinstance(unk_score, numbers.Real) or math.isnan(unk_score) or unk_score == math.inf:
            raise ValueError(f"unk_score must be a number or -inf, got {unk_score!r}")
        if token_min_logp is not None and (not isinstance(token_min_logp, numbers.Real) or math.isnan(token_min_logp)):
            raise ValueError(f"token_min_logp must be a number or None, got {token_min_logp!r}")
        self.token_min_logp = -math.inf if token_min_logp is None else float(token_min_logp)
        if beam_threshold < 0:
            raise ValueError(f"beam_threshold must be >= 0, got {beam_threshold}")
        self.beam_size, self.nbest = int(beam_size), int(nbest)
        if isinstance(max_work_bytes, bool) or not isinstance(max_work_bytes, (int, np.integer)) or max_work_bytes < 1:
            raise ValueError(f"max_work_bytes must be a positive integer, got {max_work_bytes!r}")
        self.max_work_bytes = int(max_work_bytes)
        self.token_beam = 0 if token_beam is None else int(token_beam)
        self.beam_threshold, self.lm_weight, self.word_score = (
            float(beam_threshold),
            float(lm_weight),
            float(word_score),
        )
        self.unk_score = float(unk_score)
        if not isinstance(word_separator, str) or not word_separator:
            raise ValueError(f"word_separator must be a non-empty string, got {word_separator!r}")
        self.word_separator = word_separator
        seps = [i for i, t in enumerate(self.tokens) if t == word_separator and i != self.blank]
        self.sep = seps[0] if seps else -1
        if lexicon is not None and lexicon_free:
            raise ValueError("lexicon_free=True decodes without a lexicon; pass lexicon=None")
        if lexicon is None and lm is not None and not lexicon_free:
            raise ValueError("an lm without a lexicon is a token-level LM: pass lexicon_free=True (or a lexicon)")
        self.lexicon_free = lexicon is None
        if lexicon is not None and not isinstance(lexicon, Lexicon):
            lexicon = Lexicon(lexicon)
        self.lexicon = lexicon
        self.lm = lm
        self._trans = np.zeros((0, 0), dtype=np.float64)
        if transitions is not None:
            if topology != "asg":
                raise ValueError(f"transitions are ASG's; topology={topology!r} takes transitions=None")
            if hasattr(transitions, "detach"):
                transitions = transitions.detach().cpu().double().numpy()
            tr = np.asarray(transitions)
            if tr.shape != (C + 1, C) or not np.issubdtype(tr.dtype, np.floating):
                raise ValueError(
                    f"transitions must be a float array of shape (C + 1, C) = ({C + 1}, {C}), "
                    f"got {tr.dtype} {tr.shape}"
                )
            if not np.isfinite(tr).all():
                raise ValueError("transitions must be finite")
            self._trans = np.ascontiguousarray(tr, dtype=np.float64)
        self._build(C)
        self._set_context(context, context_score, context_cap, self._hotword_phrases(hotwords))

    def _hotword_phrases(self, hotwords) -> tuple[list[list[int]], list[float]]:
        """``hotwords`` as context phrases of token ids with their totals: each spelling of each
        word (the lexicon's, or lexicon-free its one-character tokens) between two boundaries,
        worth the word's bonus once complete (see :class:`ContextGraph`'s ``totals``)."""
        if not hotwords:
            return [], []
        if not isinstance(hotwords, Mapping):
            raise ValueError(f"hotwords must be a dict word -> bonus, got {type(hotwords).__name__}")
        C, lex = len(self.tokens), self.lexicon
        if lex is None:
            single = {
                t: i for i, t in enumerate(self.tokens) if len(t) == 1 and i not in (self.blank, self.repeat, self.sep)
            }
            for w in hotwords:
                if not isinstance(w, str) or not w or self.word_separator in w:
                    raise ValueError(f"hotwords: {w!r} must be a non-empty word without the separator")
            lex = Lexicon.from_words(list(hotwords), single)  # raises for a word of other characters
        spell = lex.spellings()
        phrases: list[list[int]] = []
        totals: list[float] = []
        for w, bonus in hotwords.items():
            if w not in spell:
                raise ValueError(f"hotwords: {w!r} is not in the lexicon")
            if isinstance(bonus, bool) or not isinstance(bonus, numbers.Real) or not math.isfinite(bonus):
                raise ValueError(f"hotwords[{w!r}] must be a finite number, got {bonus!r}")
            for sp in spell[w]:
                phrases.append([C, *sp, C])
                totals.append(float(bonus))
        return phrases, totals

    def _set_context(self, context, score, cap, hot: tuple[list[list[int]], list[float]]) -> None:
        C = len(self.tokens)
        if context is not None and not isinstance(context, ContextGraph):
            skip = [v for v in (self.blank, self.repeat) if v >= 0]
            context = ContextGraph.from_phrases(
                context,
                self.tokens,
                score=score,
                cap=cap,
                lexicon=self.lexicon,
                word_separator=self.word_separator,
                skip=skip,
            )
        if context is not None and context.num_tokens != C:
            raise ValueError(f"context: the graph is over {context.num_tokens} tokens, the decoder has C={C}")
        if hot[0]:  # hotwords join the context phrases in one graph
            phrases = list(context.phrases) if context is not None else []
            totals = list(context.totals) if context is not None else []
            context = ContextGraph(
                phrases + hot[0],
                C,
                score=context.score if context is not None else 0.0,
                cap=context.cap if context is not None else None,
                token_kind=token_kinds(self.tokens, self.word_separator),
                totals=totals + hot[1],
            )
        self.context = context
        if context is None or context.empty:
            context = ContextGraph([], C)
        self._ctx = context.kernel_arrays()

    def _build(self, C: int) -> None:
        lex = self.lexicon
        if lex is not None:
            if lex.max_token >= C:
                raise ValueError(f"lexicon: token id {lex.max_token} out of range [0, C) with C={C}")
            for name, v in (("blank", self.blank), ("repeat", self.repeat), ("word separator", self.sep)):
                if v >= 0 and (lex.child_token == v).any():
                    raise ValueError(f"lexicon: spellings use the {name} token {v} ({self.tokens[v]!r})")
            self._trie = (lex.child_offsets, lex.child_token, lex.child_node, lex.word_offsets, lex.node_word)
            nw = np.diff(lex.word_offsets)
            self._max_words = int(nw.max()) if len(nw) else 0
            max_children = int(np.diff(lex.child_offsets).max())
            self._per_hyp = 3 + (min(C, max_children) + 1) * (1 + self._max_words)
            W = len(lex.words)
        else:
            z64, z32 = np.zeros(2, dtype=np.int64), np.zeros(0, dtype=np.int32)
            self._trie = (z64, z32, z32, z64, z32)
            self._max_words = 0
            self._per_hyp = 3 + C
            W = 0
        extra = np.full(W, self.word_score, dtype=np.float64)
        word_lm = np.zeros(W, dtype=np.int32)
        tok_lm = np.zeros(C, dtype=np.int32)
        if self.lm is not None:
            lm_words = getattr(self.lm, "words", None)
            nlm = len(lm_words) if lm_words is not None else None
            (st_off, arc_word, arc_logp, arc_next, bo_logp, bo_state, ints) = check_lm_arrays(self.lm.arrays(), nlm)
            self._lm = (True, st_off, arc_word, arc_logp, arc_next, bo_logp, bo_state, ints[0], ints[2])
            unk = ints[3]
            for i, w in enumerate(lex.words if lex is not None else []):
                word_lm[i] = self._lm_id(w, nlm)
                if word_lm[i] == unk:
                    extra[i] += self.unk_score
            for c, t in enumerate(self.tokens):
                tok_lm[c] = self._lm_id(t, nlm)
        else:
            z = np.zeros(0, dtype=np.float32)
            self._lm = (
                False,
                np.zeros(2, dtype=np.int64),
                np.zeros(0, dtype=np.int32),
                z,
                np.zeros(0, dtype=np.int32),
                np.zeros(1, dtype=np.float32),
                np.full(1, -1, dtype=np.int32),
                0,
                0,
            )
        self._word_lm, self._word_extra, self._tok_lm = word_lm, extra, tok_lm
        self._smear = self._smearing(lex, C)
        self._below = (
            beam_search_numba.below_kernel(lex.child_offsets, lex.child_node, lex.word_offsets, lex.node_word, extra)
            if lex is not None
            else np.zeros(1, dtype=np.int64)
        )
        sepstr = self.word_separator
        self._tok_starts = np.array([t.startswith(sepstr) and t != sepstr for t in self.tokens], dtype=np.bool_)

    def _smearing(self, lex, C: int) -> np.ndarray:
        """Per trie node, ``lm_weight`` x the best unigram log-prob of the allowed words below it
        (0 at the root; -inf where every word below is forbidden): the pruning look-ahead."""
        if lex is None:
            return np.zeros(1, dtype=np.float64)
        if self.lm is not None:
            has_lm, st_off, aw, alp, an, bol, bos = self._lm[:7]
            roots = np.flatnonzero(bos == -1)
            root = int(roots[0]) if len(roots) else 0
        else:
            has_lm, st_off, aw, alp, an, bol, bos = self._lm[:7]
            root = 0
        return beam_search_numba.smear_kernel(
            lex.child_offsets,
            lex.child_node,
            lex.word_offsets,
            lex.node_word,
            self._word_lm,
            self._word_extra,
            has_lm,
            root,
            st_off,
            aw,
            alp,
            an,
            bol,
            bos,
            self.lm_weight,
        )

    def _lm_id(self, word: str, nlm) -> int:
        i = int(self.lm.word_id(word))
        if i < 0 or (nlm is not None and i >= nlm) or i > _I32:
            raise ValueError(f"lm.word_id({word!r}) = {i} out of range")
        return i

    def _work_bytes(self, T: int) -> int:
        """Upper bound of the kernel's buffers for one utterance of T frames (bytes): per candidate
        its slot, 8 ints, hash, 4 floats and score (120); the merge table (16 per slot); per
        record 4 ints (32); per hypothesis its 6 ints, hash, 4 floats and the beam cut's heap
        slot (96)."""
        cap = self.beam_size * self._per_hyp
        tsize = 1 << max(1, (2 * cap - 1).bit_length())
        return cap * 120 + tsize * 16 + (T * self.beam_size + 1) * 32 + self.beam_size * 96

    def _decode_one(self, x: np.ndarray, T: int, complete: bool = True):
        return beam_search_numba.beam_kernel(
            x,
            T,
            self.blank,
            self.repeat,
            self.sep,
            self.lexicon_free,
            *self._trie,
            self._smear,
            self._word_lm,
            self._word_extra,
            self._tok_lm,
            self._tok_starts,
            self.word_score,
            *self._lm,
            self.lm_weight,
            self.beam_size,
            self.beam_threshold,
            self.token_beam,
            self.token_min_logp,
            self.nbest,
            self._per_hyp,
            self._trans,
            self._below,
            complete,
            *self._ctx,
        )

    def decode(self, emissions, lengths=None) -> List[List[Hypothesis]]:
        """Decodes a batch.

        Args:
            emissions: ``(B, T, C)`` log-probabilities (torch tensor or numpy array, any float
                dtype and device: decoded on the host in float32).
            lengths: ``(B,)`` valid frames of each utterance in ``[0, T]``; None: all T.

        Returns:
            ``B`` lists of at most ``nbest`` :class:`Hypothesis`, best first, distinct word
            histories; never empty: an utterance with no complete hypothesis gets one with
            ``fallback=True`` (see :class:`Hypothesis`).
        """
        x = _as_emissions(emissions)
        B, T, C = x.shape
        if C != len(self.tokens):
            raise ValueError(f"emissions have C={C} classes but the decoder has {len(self.tokens)} tokens")
        lens = _as_lengths(lengths, B, T)
        need = self._work_bytes(int(lens.max()) if B else 0)
        if need > self.max_work_bytes:
            raise ValueError(
                f"beam_size={self.beam_size} with T={T} frames and C={C} tokens needs about "
                f"{need / 2**20:.0f} MiB per utterance, more than max_work_bytes="
                f"{self.max_work_bytes / 2**20:.0f} MiB: lower beam_size (or raise max_work_bytes)"
            )
        raw = parallel_map(self._decode_one, [x[b] for b in range(B)], [int(n) for n in lens])
        out = [self._hyps(r, x[b], int(lens[b])) for b, r in enumerate(raw)]
        for b, hyps in enumerate(out):
            if not hyps:  # every survivor was inside a word (or none survived): the best of them
                hyps += self._hyps(self._decode_one(x[b], int(lens[b]), False), x[b], int(lens[b]), fallback=True)[:1]
            if not hyps:
                inf = -math.inf
                hyps.append(Hypothesis([], [], [], inf, inf, inf, "", fallback=True, num_frames=int(lens[b])))
        return out

    def _hyps(self, r, x: np.ndarray, T: int, fallback: bool = False) -> List[Hypothesis]:
        n_out, out_rec, out_f, rp, rt, rf, rw = r
        out = []
        runs = times.best_runs(x, T)  # shared by the utterance's hypotheses
        for k in range(n_out):
            toks, frames, wids = [], [], []
            i = int(out_rec[k])
            while i >= 0:
                toks.append(int(rt[i]))
                frames.append(int(rf[i]))
                wids.append(int(rw[i]))
                i = int(rp[i])
            toks.reverse()
            frames.reverse()
            wids.reverse()
            if self.lexicon_free or self.lexicon is None:  # the same: lexicon_free is lexicon is None
                text = "".join(self.tokens[t] for t in toks)
                words = [w for w in text.split(self.word_separator) if w]
                ranges = times.start_ranges(toks, self.sep, self._tok_starts)
            else:
                words = [self.lexicon.words[w] for w in wids if w >= 0]
                ends = [i for i, w in enumerate(wids) if w >= 0]
                open_word = "".join(self.tokens[t] for t in toks[ends[-1] + 1 if ends else 0 :] if t != self.sep)
                if open_word:  # a fallback's unfinished word, as spelled
                    words.append(open_word)
                text = self.word_separator.join(words)
                ranges = times.lexicon_ranges(toks, wids, self.sep)
            scores = (float(out_f[k, 0]), float(out_f[k, 1]), float(out_f[k, 2]))
            out.append(
                times.fill_frame_times(
                    Hypothesis(words, toks, frames, *scores, text, fallback), x, T, ranges, self.repeat, runs
                )
            )
        return out
