"""Modified beam search for RNN-T (transducer) networks, with optional n-gram shallow fusion.

The network is any object with the transducer protocol of :mod:`lightning_gtn.nn.rnnt`
(``predict(tokens (N, S), state) -> ((N, S, J), state)``, ``select_state(state, index)``,
``join(enc (..., J), pred (..., J)) -> (..., V)``); nothing here imports its class.

**The search** (icefall's "modified beam search"): every frame ``t`` each hypothesis either
emits the blank or one token, and either way moves on to frame ``t + 1`` (at most one symbol per
frame). With ``max_symbols_per_frame = M > 1`` a hypothesis that emitted a token may emit up to
``M`` tokens at the same frame before it moves on (the greedy search's ``max_symbols_per_frame``
rule: the ``M``-th token moves on without a blank). After each expansion the ``beam`` best
candidates of an utterance survive and hypotheses with the same tokens (and the same frame
position) merge: their probabilities add (``logaddexp``), so a hypothesis' score is the log-sum
over the alignments of its tokens that the beam kept.

**Scores**: ``log P_am`` (the joiner's ``log_softmax``) summed along the alignment, plus on every
non-blank token ``lm_weight * log P_lm(token | history) + length_bonus``, plus at the end
``lm_weight * log P_lm(</s> | history)`` when the LM has a ``final_score``. The LM is any object
with ``start_state()`` and ``score(state, token_id) -> (logprob, new_state)`` over the network's
token ids (hashable states); :class:`TokenLM` adapts a :class:`lightning_gtn.lm.NGramLM` over
token texts (e.g. a character n-gram estimated from training transcripts) to it.

**States**: a ``predict`` call returns a batched state; hypotheses point at its rows and read
them with ``select_state``. After each frame the rows of all hypotheses are gathered into one
state object, concatenated along the batch dimension that ``select_state`` is seen to index (a
tensor, or tuples/lists of tensors, e.g. an LSTM's ``(h, c)``), so every frame costs one
``predict`` and one ``join`` call for all hypotheses of all utterances. States of any other kind
are never concatenated: one ``predict`` call per state object the new tokens' parents point at.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from ..kernels.logmath import log_add
from .context_graph import ContextGraph
from .times import token_times
from .transducer import MAX_SYMBOLS_PER_FRAME

__all__ = [
    "MAX_BEAM",
    "TokenLM",
    "TransducerHypothesis",
    "best_hypotheses",
    "modified_beam_search",
    "modified_beam_search_nbest",
]

#: the widest beam: the hypotheses kept per utterance bound the search's memory and time
MAX_BEAM = 1 << 16


# ----------------------------------------------------------------------------- the token LM
class TokenLM:
    """A token-level n-gram LM for shallow fusion: an :class:`lightning_gtn.lm.NGramLM` whose
    words are token texts, seen through the network's token ids.

    ``tokens[i]`` is the text of token id ``i``: a space becomes ``space`` (``|``, as
    ``lightning-gtn-lm --chars`` writes character models); ``None`` or ``""`` marks a token the
    LM never scores (the blank). A text the LM does not know scores as ``<unk>``.

    Args:
        lm: the n-gram model (natural logs).
        tokens: the text of each of the ``V`` token ids.
        space: the LM word of the space character.

    Example:
        >>> lm = TokenLM.estimate(["ab ab", "ab"], [None, "a", "b", " "], order=2)
        >>> s = lm.start_state()
        >>> logp, s = lm.score(s, 1)
        >>> round(math.exp(lm.score(s, 2)[0]), 2) > 0.5
        True
    """

    def __init__(self, lm, tokens: Sequence[Optional[str]], *, space: str = "|") -> None:
        if not hasattr(lm, "score") or not hasattr(lm, "word_id"):
            raise ValueError(f"lm must be a lightning_gtn.lm.NGramLM, got {type(lm).__name__}")
        if isinstance(tokens, str) or not isinstance(tokens, Sequence) or len(tokens) == 0:
            raise ValueError("tokens must be a non-empty sequence with the text (or None) of each token id")
        self.lm = lm
        self.tokens = list(tokens)
        self.space = space
        ids = []
        for i, t in enumerate(self.tokens):
            if t is None or t == "":
                ids.append(-1)
            elif not isinstance(t, str):
                raise ValueError(f"tokens[{i}] must be a str or None, got {type(t).__name__}")
            else:
                ids.append(lm.word_id(self.word_of(t)))
        self._word = np.asarray(ids, dtype=np.int64)
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def word_of(self, text: str) -> str:
        """The LM word of a token's text (white space becomes ``space``)."""
        return self.space if text.isspace() else "".join(self.space if c.isspace() else c for c in text)

    @classmethod
    def estimate(
        cls,
        texts: Iterable[str],
        tokens: Sequence[Optional[str]],
        *,
        order: int = 3,
        method: str = "kneser_ney",
        space: str = "|",
    ) -> "TokenLM":
        """A character (token-text) n-gram estimated from ``texts`` with :func:`lightning_gtn.lm.estimate`.

        Each text is split into the token texts of ``tokens`` by longest match (characters for a
        character vocabulary); runs of white space are one ``space`` word; characters no token
        covers are skipped.
        """
        from lightning_gtn.lm import estimate

        vocab = sorted({t for t in tokens if t}, key=len, reverse=True)
        sents = []
        for text in texts:
            words: list[str] = []
            s = " ".join(str(text).split())
            i = 0
            while i < len(s):
                hit = next((t for t in vocab if s.startswith(t, i)), None)
                if hit is None:
                    i += 1
                    continue
                words.append(space if hit.isspace() else hit)
                i += len(hit)
            if words:
                sents.append(words)
        if not sents:
            raise ValueError("texts: no sentence has a token of the vocabulary")
        return cls(estimate(sents, order=order, method=method), tokens, space=space)

    @property
    def num_tokens(self) -> int:
        """``V``, the number of token ids."""
        return len(self.tokens)

    def start_state(self) -> int:
        """The LM state after ``<s>``."""
        return int(self.lm.start_state())

    def score(self, state: int, token: int) -> tuple[float, int]:
        """``(ln P(token | state), next state)`` for a token id (the blank: ValueError)."""
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < len(self.tokens):
            raise ValueError(f"token must be an id in [0, {len(self.tokens)}), got {token!r}")
        w = int(self._word[token])
        if w < 0:
            raise ValueError(f"token {token} has no text for the LM (the blank?)")
        logp, nxt = self.lm.score(state, w)
        return float(logp), int(nxt)

    def scores(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """``(logp (V,) float64, next (V,) int64)`` of every token id after ``state`` (cached;
        tokens without text get ``logp = 0`` and ``next = state``)."""
        hit = self._cache.get(state)
        if hit is None:
            V = len(self.tokens)
            logp = np.zeros(V, dtype=np.float64)
            nxt = np.full(V, state, dtype=np.int64)
            for i in range(V):
                w = int(self._word[i])
                if w >= 0:
                    p, n = self.lm.score(state, w)
                    logp[i], nxt[i] = p, n
            hit = self._cache[state] = (logp, nxt)
        return hit

    def final_score(self, state: int) -> float:
        """``ln P(</s> | state)``."""
        return float(self.lm.final_score(state))


class _GenericLM:
    """Any ``start_state()`` / ``score(state, token)`` object, with per-state vectors cached."""

    def __init__(self, lm, V: int, blank: int) -> None:
        if hasattr(lm, "word_id") and not isinstance(lm, TokenLM):
            raise ValueError(
                "lm: an NGramLM scores word ids, not the network's token ids; wrap it as "
                "TokenLM(lm, tokens) with the text of each token id (None for the blank)"
            )
        for m in ("start_state", "score"):
            if not callable(getattr(lm, m, None)):
                raise ValueError(f"lm must have start_state() and score(state, token) methods; it lacks {m}")
        self.lm, self.V, self.blank = lm, V, blank
        self._cache: dict[Any, tuple[np.ndarray, list]] = {}
        self.final = getattr(lm, "final_score", None)
        self.vector = lm.scores if isinstance(lm, TokenLM) else None
        if isinstance(lm, TokenLM) and lm.num_tokens != V:
            raise ValueError(f"lm: the TokenLM has {lm.num_tokens} tokens, the joiner V={V}")

    def start_state(self) -> Hashable:
        return self.lm.start_state()

    def scores(self, state) -> tuple[np.ndarray, list]:
        hit = self._cache.get(state)
        if hit is None:
            nxt: list
            if self.vector is not None:
                lp_vec, nxt_vec = self.vector(state)
                logp = lp_vec.copy()
                nxt = list(nxt_vec.tolist())
            else:
                logp = np.zeros(self.V, dtype=np.float64)
                nxt = [state] * self.V
                for v in range(self.V):
                    if v != self.blank:
                        p, n = self.lm.score(state, v)
                        logp[v], nxt[v] = float(p), n
            if np.isnan(logp).any() or np.isposinf(logp).any():
                raise ValueError("lm: score returned NaN or +inf (log-probabilities expected)")
            logp[self.blank] = 0.0
            hit = self._cache[state] = (logp, nxt)
        return hit


# ----------------------------------------------------------------------------- the search
@dataclass
class TransducerHypothesis:
    """One result of :func:`modified_beam_search_nbest`.

    Attributes:
        tokens: the token ids, blank-free.
        score: the search score: ``log P_am`` (summed over the alignments the beam kept), plus
            ``lm_weight`` times the LM log-probability (``</s>`` included), ``length_bonus``
            per token and the context graph's bonus (if any).
        lm_score: the LM's natural-log probability of ``tokens`` (``</s>`` included when the LM
            has ``final_score``), unweighted; 0 without an LM.
        timesteps: the frame at which each token was emitted (non-decreasing), on the best
            single alignment among those merged into the hypothesis (with a beam wider than all
            candidates: the Viterbi alignment of ``tokens`` in the search's topology).
        token_ends: ``timesteps + 1`` (exclusive; a token occupies no frames of its own).
        token_scores: each token's ``log P_am`` (the joiner's ``log_softmax`` over the ``V``
            classes) at its emission step.
        token_confidences: ``exp(token_scores)``, the probability the joiner gave the token there.
        word_spans: the tokens grouped into words (``word_separator_id``, else one per token) as
            :func:`lightning_gtn.align.forced.word_spans` does: dicts ``{"word_index", "start",
            "end", "score", "confidence", "token_range"}``, ``confidence`` the mean of the tokens'.
        durations: TDT greedy search only: the duration chosen with each token (frames skipped
            after it, 0 stays on the frame); None otherwise.
        num_frames: the utterance's frames (``encoder_lengths[b]``).
    """

    tokens: list[int]
    score: float
    lm_score: float = 0.0
    timesteps: list[int] = field(default_factory=list)
    token_ends: list[int] = field(default_factory=list)
    token_scores: list[float] = field(default_factory=list)
    token_confidences: list[float] = field(default_factory=list)
    word_spans: list[dict] = field(default_factory=list)
    durations: Optional[list[int]] = None
    num_frames: int = 0


_UNKNOWN = object()


class _Hyp:
    __slots__ = (
        "tokens",
        "score",
        "lm_state",
        "lm_score",
        "ref",
        "parent",
        "new_token",
        "frames",
        "logps",
        "vit",
        "ctx",
    )

    def __init__(self, tokens, score, lm_state, lm_score, ref, parent=None, new_token=-1, ctx=0):
        self.tokens = tokens
        self.score = score
        self.lm_state = lm_state
        self.lm_score = lm_score
        self.ref = ref  # (object id, row): this hypothesis' prediction output and state
        self.parent = parent  # the parent's ref when a predict call is still due
        self.new_token = new_token
        self.frames: tuple = ()  # the emission frame of each token
        self.logps: tuple = ()  # each token's log P_am there
        self.vit = score  # the score of the best single alignment merged in (frames is its)
        self.ctx = ctx  # the context graph's state code: 2 x state + (a word is open)


def _check_args(model, encoder_out, encoder_lengths, blank, beam, lm_weight, max_symbols_per_frame, length_bonus):
    for m in ("predict", "select_state", "join"):
        if not callable(getattr(model, m, None)):
            raise ValueError(f"model must offer the transducer protocol (predict, select_state, join); it lacks {m}")
    if not isinstance(encoder_out, torch.Tensor) or encoder_out.dim() != 3 or not encoder_out.is_floating_point():
        what = (
            f"shape {tuple(encoder_out.shape)} {encoder_out.dtype}"
            if isinstance(encoder_out, torch.Tensor)
            else type(encoder_out).__name__
        )
        raise ValueError(f"encoder_out must be a float tensor of shape (B, T, J), got {what}")
    B, T, _ = encoder_out.shape
    if isinstance(encoder_lengths, torch.Tensor):
        if encoder_lengths.is_floating_point() or encoder_lengths.dtype == torch.bool or encoder_lengths.is_complex():
            raise ValueError(f"encoder_lengths must hold integers of shape (B,) = ({B},), got {encoder_lengths.dtype}")
        lengths = encoder_lengths.detach().cpu().numpy()
    else:
        lengths = np.asarray(encoder_lengths)
        if lengths.dtype == object or not np.issubdtype(lengths.dtype, np.integer) or lengths.dtype == np.bool_:
            raise ValueError(f"encoder_lengths must hold integers of shape (B,) = ({B},), got {encoder_lengths!r}")
    if lengths.shape != (B,):
        raise ValueError(f"encoder_lengths must have shape (B,) = ({B},), got {tuple(lengths.shape)}")
    lengths = lengths.astype(np.int64)
    if B and (lengths.min() < 0 or lengths.max() > T):
        raise ValueError(f"encoder_lengths must lie in [0, T={T}], got min {lengths.min()}, max {lengths.max()}")
    if isinstance(blank, bool) or not isinstance(blank, (int, np.integer)) or blank < 0:
        raise ValueError(f"blank must be a non-negative token id, got {blank!r}")
    for name, v, hi in (
        ("beam", beam, MAX_BEAM),
        ("max_symbols_per_frame", max_symbols_per_frame, MAX_SYMBOLS_PER_FRAME),
    ):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= hi:
            raise ValueError(f"{name} must be an integer in [1, {hi}], got {v!r}")
    for name, v in (("lm_weight", lm_weight), ("length_bonus", length_bonus)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not math.isfinite(v):
            raise ValueError(f"{name} must be a finite float, got {v!r}")
    return lengths


def modified_beam_search_nbest(
    model,
    encoder_out: torch.Tensor,
    encoder_lengths,
    *,
    blank: int,
    beam: int = 4,
    lm=None,
    lm_weight: float = 0.0,
    max_symbols_per_frame: int = 1,
    length_bonus: float = 0.0,
    nbest: Optional[int] = None,
    word_separator_id: Optional[int] = None,
    context: Optional[ContextGraph] = None,
) -> list[list[TransducerHypothesis]]:
    """Modified beam search (see the module docstring); the ``nbest`` best hypotheses per utterance.

    Args:
        model: a transducer network (``predict``, ``select_state``, ``join``).
        encoder_out: ``(B, T, J)`` float encoder frames (``model.encode``'s first output).
        encoder_lengths: ``(B,)`` integer frames per utterance, in ``[0, T]``.
        blank: keyword-only; the blank's token id in ``[0, V)`` (also the prediction network's
            start symbol).
        beam: hypotheses kept per utterance (>= 1; 1 is greedy search).
        lm: None, a :class:`TokenLM`, or any object with ``start_state()`` and
            ``score(state, token_id) -> (logprob, new_state)`` (optionally ``final_score(state)``).
        lm_weight: the LM's weight (shallow fusion); 0 ignores ``lm``.
        max_symbols_per_frame: tokens a hypothesis may emit at one frame (>= 1; 1 is icefall's
            modified beam search).
        length_bonus: added per emitted token (counters the LM's preference for short outputs).
        nbest: hypotheses returned per utterance (default ``beam``), best first.
        word_separator_id: the token that separates words in ``word_spans`` (None: one word
            per token).
        context: context biasing: a :class:`lightning_gtn.decode.context_graph.ContextGraph`
            over the ``V`` token ids (its ``token_kind`` says which ids separate or start words),
            walked beside each hypothesis; its bonus is part of ``score``. None: no biasing.

    Returns:
        Per utterance a list of :class:`TransducerHypothesis`, best first.

    Raises:
        ValueError: naming the argument at fault; also when the joiner's output has NaN or its
            last dimension ``V`` does not contain ``blank``.
    """
    lengths = _check_args(
        model, encoder_out, encoder_lengths, blank, beam, lm_weight, max_symbols_per_frame, length_bonus
    )
    beam, M, blank = int(beam), int(max_symbols_per_frame), int(blank)
    nbest = beam if nbest is None else nbest
    if isinstance(nbest, bool) or not isinstance(nbest, (int, np.integer)) or nbest < 1:
        raise ValueError(f"nbest must be an integer >= 1, got {nbest!r}")
    lm_weight, length_bonus = float(lm_weight), float(length_bonus)
    if context is not None and not isinstance(context, ContextGraph):
        raise ValueError(f"context must be a ContextGraph or None, got {type(context).__name__}")
    ctx = context if context is not None and not context.empty else None
    B = encoder_out.shape[0]
    dev = encoder_out.device
    use_lm = lm is not None and lm_weight != 0.0
    with torch.no_grad():
        start = torch.full((1, 1), blank, dtype=torch.long, device=dev)
        pred0, state0 = model.predict(start, None)
        objs: dict[int, tuple[torch.Tensor, Any]] = {0: (pred0[:, 0], state0)}
        next_obj = 1
        glm: Optional[_GenericLM] = None
        layout: Any = _UNKNOWN  # the states' batch dimensions (see _state_layout); False: none
        lm0: Any = None
        ctx0 = 2 * ctx.start if ctx is not None else 0
        hyps: list[list[_Hyp]] = [[_Hyp((), 0.0, None, 0.0, (0, 0), ctx=ctx0)] for _ in range(B)]
        V = -1
        for t in range(int(lengths.max(initial=0))):
            live = [b for b in range(B) if t < lengths[b]]
            done: dict[int, dict[tuple, _Hyp]] = {b: {} for b in live}
            active: dict[int, list[_Hyp]] = {b: hyps[b] for b in live}
            for r in range(M):
                flat = [(b, h) for b in live for h in active.get(b, ())]
                if not flat:
                    break
                bidx = torch.tensor([b for b, _ in flat], dtype=torch.long, device=dev)
                pred = torch.stack([objs[h.ref[0]][0][h.ref[1]] for _, h in flat])
                logits = model.join(encoder_out[bidx, t], pred)
                if logits.dim() != 2 or logits.shape[0] != len(flat):
                    raise ValueError(f"model.join must return (N, V) logits here, got {tuple(logits.shape)}")
                logp = torch.log_softmax(logits.double(), -1).cpu()
                logp_np = logp.numpy()
                if V < 0:
                    V = int(logp.shape[1])
                    if blank >= V:
                        raise ValueError(f"blank must be in [0, V={V}), got {blank}")
                    if context is not None and context.num_tokens != V:
                        raise ValueError(
                            f"context: the graph is over {context.num_tokens} tokens, the joiner has V={V}"
                        )
                    if use_lm:
                        glm = _GenericLM(lm, V, blank)
                        lm0 = glm.start_state()
                        for hs in hyps:
                            for h in hs:
                                h.lm_state = lm0
                if torch.isnan(logp).any():
                    raise ValueError("model.join returned NaN logits")
                # extra scores of the non-blank expansions: LM and length bonus
                extra = torch.full((len(flat), V), length_bonus, dtype=torch.float64)
                extra[:, blank] = 0.0
                lm_rows = None
                if glm is not None:
                    lm_rows = [glm.scores(h.lm_state) for _, h in flat]
                    extra += lm_weight * torch.from_numpy(np.stack([lp for lp, _ in lm_rows]))
                ctx_rows = None
                if ctx is not None:  # the context graph's bonus of each token
                    ctx_rows = _context_rows(ctx, [h.ctx for _, h in flat], blank)
                    extra += torch.from_numpy(ctx_rows[1])
                    ctx_next = ctx_rows[0]
                cand = logp + extra + torch.tensor([h.score for _, h in flat], dtype=torch.float64)[:, None]
                new_active: dict[int, list[_Hyp]] = {}
                # one top-k for all utterances: row e holds e's done pool, then its candidates
                # (hypotheses x V), padded with -inf; padding is recognised by position
                ex = [b for b in live if active.get(b)]
                counts = [len(active[b]) for b in ex]
                pools = [list(done[b].values()) for b in ex]
                P, R = max(len(q) for q in pools), max(counts)
                pool_sc = torch.full((len(ex), P), -math.inf, dtype=torch.float64)
                if P:
                    for e, q in enumerate(pools):
                        pool_sc[e, : len(q)] = torch.tensor([h.score for h in q], dtype=torch.float64)
                starts = np.cumsum([0] + counts[:-1])
                idx = torch.from_numpy(starts[:, None] + np.arange(R)[None, :])
                valid = torch.from_numpy(np.arange(R)[None, :] < np.asarray(counts)[:, None])
                idx = torch.where(valid, idx, torch.full_like(idx, cand.shape[0]))
                padded = torch.cat([cand, torch.full((1, V), -math.inf, dtype=torch.float64)])[idx]  # (E, R, V)
                allsc = torch.cat([pool_sc, padded.reshape(len(ex), R * V)], 1)
                k = min(beam, int(allsc.shape[1]))
                top = torch.topk(allsc, k, dim=1)
                top_v, top_i = top.values.tolist(), top.indices.tolist()
                for e, b in enumerate(ex):
                    pool, n, pos = pools[e], counts[e], int(starts[e])
                    keep_done: dict[tuple, _Hyp] = {}
                    nxt_active: dict[tuple, _Hyp] = {}
                    for sc, j in zip(top_v[e], top_i[e]):
                        if j < P:
                            if j < len(pool):
                                _merge(keep_done, pool[j])
                            continue
                        i, v = divmod(j - P, V)
                        if i >= n:
                            continue  # padding
                        parent = flat[pos + i][1]
                        if v == blank:
                            kept = _Hyp(parent.tokens, sc, parent.lm_state, parent.lm_score, parent.ref, ctx=parent.ctx)
                            kept.frames, kept.logps = parent.frames, parent.logps
                            kept.vit = parent.vit + sc - parent.score
                            _merge(keep_done, kept)
                            continue
                        lm_state, lm_score = parent.lm_state, parent.lm_score
                        if lm_rows is not None:
                            lp, nx = lm_rows[pos + i]
                            lm_state, lm_score = nx[v], lm_score + float(lp[v])
                        hctx = parent.ctx if ctx_rows is None else ctx_next[pos + i, v]
                        child = _Hyp(parent.tokens + (v,), sc, lm_state, lm_score, None, parent.ref, v, hctx)
                        child.frames, child.logps = parent.frames + (t,), parent.logps + (float(logp_np[pos + i, v]),)
                        child.vit = parent.vit + sc - parent.score
                        _merge(nxt_active if r < M - 1 else keep_done, child)
                    done[b] = keep_done
                    if nxt_active:
                        new_active[b] = list(nxt_active.values())
                # one predict call per state object the new tokens' parents point at
                due = [h for b in live for h in list(done[b].values()) + new_active.get(b, []) if h.ref is None]
                groups: dict[int, list[_Hyp]] = {}
                for h in due:
                    groups.setdefault(h.parent[0], []).append(h)
                for oid, hs in groups.items():
                    rows_idx = torch.tensor([h.parent[1] for h in hs], dtype=torch.long, device=dev)
                    st = model.select_state(objs[oid][1], rows_idx)
                    toks = torch.tensor([[h.new_token] for h in hs], dtype=torch.long, device=dev)
                    p, s = model.predict(toks, st)
                    objs[next_obj] = (p[:, 0], s)
                    for row, h in enumerate(hs):
                        h.ref, h.parent = (next_obj, row), None
                    next_obj += 1
                active = {b: hs for b, hs in new_active.items()}
            for b in live:
                hyps[b] = list(done[b].values())
            used = {h.ref[0] for hs in hyps for h in hs}
            for oid in [o for o in objs if o not in used]:
                del objs[oid]
            if len(objs) > 1 and layout is not False:
                if layout is _UNKNOWN:  # learn once how the states concatenate (False: they do not)
                    oid = next(iter(objs))
                    layout = _state_layout(model, objs[oid][1], int(objs[oid][0].shape[0]), dev)
                if layout is not False:
                    objs, next_obj = _compact(model, objs, hyps, layout, next_obj, dev), next_obj + 1
    out: list[list[TransducerHypothesis]] = []
    for b in range(B):
        res = []
        for h in hyps[b]:
            sc, lms = h.score, h.lm_score
            if glm is not None and glm.final is not None:
                f = float(glm.final(h.lm_state))
                sc, lms = sc + lm_weight * f, lms + f
            if ctx is not None:
                sc += ctx.end_bonus(int(h.ctx) // 2, bool(h.ctx % 2))
            hyp = TransducerHypothesis(list(h.tokens), sc, lms, num_frames=int(lengths[b]))
            token_times(hyp, list(h.frames), list(h.logps), word_separator_id)
            res.append(hyp)
        res.sort(key=lambda x: -x.score)
        out.append(res[:nbest])
    return out


def _context_rows(ctx: ContextGraph, codes: list, blank: int) -> tuple:
    """``(next codes, bonus)``, each ``(N, V)``: what each token does to each hypothesis' context
    state code (``2 x state + open word``); one gather from the graph's dense tables."""
    tables = ctx.token_codes(blank)
    if tables is None:
        rows = [ctx.token_row(int(c) // 2, bool(c % 2), blank) for c in codes]
        nxt = np.stack([2 * r[0] + r[2] for r in rows])
        return nxt, np.stack([r[1] for r in rows])
    idx = np.fromiter(codes, dtype=np.int64, count=len(codes))
    return tables[0][idx], tables[1][idx]


def _state_layout(model, state, N: int, dev) -> Any:
    """How a batched prediction-network state concatenates, learnt from ``select_state``: the
    state's structure (None, a tensor, nested tuples/lists of them) with each tensor replaced by
    its batch dimension, the one that ``select_state`` resizes from ``N`` rows to ``M``. False when
    the state is anything else or the dimension is ambiguous; the search then keeps one state
    object per ``predict`` call and reads hypotheses with ``select_state`` alone."""
    M = 3 if N == 2 else 2
    try:
        probe = model.select_state(state, torch.zeros(M, dtype=torch.long, device=dev))
    except Exception:  # noqa: BLE001 - an unusual state: fall back to per-object predict calls
        return False

    def walk(a, b):
        if a is None and b is None:
            return None
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.dim() != b.dim():
                return False
            dims = [d for d in range(a.dim()) if a.shape[d] == N and b.shape[d] == M]
            same = all(a.shape[d] == b.shape[d] for d in range(a.dim()) if d not in dims)
            return dims[0] if len(dims) == 1 and same else False
        if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
            parts = [walk(x, y) for x, y in zip(a, b)]
            return False if any(p is False for p in parts) else (type(a), parts)
        return False

    return walk(state, probe)


def _cat_states(states: list, layout) -> Any:
    """Concatenates batched states along the batch dimensions of ``layout`` (:func:`_state_layout`)."""
    if layout is None:
        return None
    if isinstance(layout, int):
        return torch.cat(states, dim=layout)
    kind, parts = layout
    return kind(_cat_states([s[i] for s in states], p) for i, p in enumerate(parts))


def _compact(model, objs: dict, hyps: list, layout, new_id: int, dev) -> dict:
    """All hypotheses' predictions and states in one object ``new_id`` (rows in hypothesis order),
    so that the next frame's ``predict`` is one call."""
    order = [h for hs in hyps for h in hs]
    by_obj: dict[int, list[int]] = {}
    for h in order:
        by_obj.setdefault(h.ref[0], []).append(h.ref[1])
    preds, states, where = [], [], {}
    row = 0
    for oid, rows in by_obj.items():
        uniq = sorted(set(rows))
        idx = torch.tensor(uniq, dtype=torch.long, device=dev)
        preds.append(objs[oid][0].index_select(0, idx))
        states.append(model.select_state(objs[oid][1], idx))
        for k, r in enumerate(uniq):
            where[(oid, r)] = row + k
        row += len(uniq)
    pred = torch.cat(preds)
    state = _cat_states(states, layout)
    for h in order:
        h.ref = (new_id, where[h.ref])
    return {new_id: (pred, state)}


def _merge(pool: dict[tuple, _Hyp], h: _Hyp) -> None:
    """Adds ``h`` to ``pool``; a hypothesis with the same tokens absorbs it (log-add of scores)."""
    old = pool.get(h.tokens)
    if old is None:
        pool[h.tokens] = h
        return
    hi, lo = (old.score, h.score) if old.score >= h.score else (h.score, old.score)
    if h.vit > old.vit:  # the frames of the best single alignment
        old.frames, old.logps, old.vit = h.frames, h.logps, h.vit
    old.score = log_add(hi, lo)
    if old.ref is None and h.ref is not None:  # keep a computed state when there is one
        old.ref, old.parent, old.new_token = h.ref, None, -1


def modified_beam_search(
    model,
    encoder_out: torch.Tensor,
    encoder_lengths,
    *,
    blank: int,
    beam: int = 4,
    lm=None,
    lm_weight: float = 0.0,
    max_symbols_per_frame: int = 1,
    length_bonus: float = 0.0,
    context: Optional[ContextGraph] = None,
) -> list[list[int]]:
    """The best hypothesis' token ids (blank-free) per utterance: :func:`modified_beam_search_nbest`
    with ``nbest=1`` (same arguments).

    Example:
        >>> import torch
        >>> class Toy:  # a joiner that prefers token 1 at every frame, no memory
        ...     def predict(self, tokens, state=None):
        ...         return torch.zeros(tokens.shape[0], tokens.shape[1], 3), None
        ...     def select_state(self, state, index):
        ...         return None
        ...     def join(self, enc, pred):
        ...         return enc + pred
        >>> enc = torch.tensor([[[0.0, 2.0, 0.0], [3.0, 0.0, 0.0]]])  # (B=1, T=2, V=J=3)
        >>> modified_beam_search(Toy(), enc, torch.tensor([2]), blank=0)
        [[1]]
    """
    res = modified_beam_search_nbest(
        model,
        encoder_out,
        encoder_lengths,
        blank=blank,
        beam=beam,
        lm=lm,
        lm_weight=lm_weight,
        max_symbols_per_frame=max_symbols_per_frame,
        length_bonus=length_bonus,
        nbest=1,
        context=context,
    )
    return [r[0].tokens if r else [] for r in res]


def best_hypotheses(nbest: list, num_frames: Sequence[int]) -> list:
    """The first (best) hypothesis of each utterance's list from :func:`modified_beam_search_nbest`;
    an utterance whose beam died out (an empty list) gets an empty :class:`TransducerHypothesis`
    of score ``-inf`` over its ``num_frames[b]`` frames (the writers give it no words).

    Example:
        >>> h = best_hypotheses([[]], [3])[0]
        >>> h.tokens, h.score, h.num_frames
        ([], -inf, 3)
    """
    if len(nbest) != len(num_frames):
        raise ValueError(f"num_frames must give one length per utterance ({len(nbest)}), got {len(num_frames)}")
    return [h[0] if h else TransducerHypothesis([], -math.inf, num_frames=int(n)) for h, n in zip(nbest, num_frames)]
