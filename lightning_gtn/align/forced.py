"""Batched forced alignment of dense emissions to known transcripts, and its outputs.

:func:`forced_align` finds, for every example, the best frame-level path through the criterion
graph of its target (CTC's graph with a blank, the force-align chain without one, ASG's target
graph with transitions, optionally with *star* nodes that absorb untranscribed stretches) and
reports per-frame labels and per-token spans, scores and confidences. All examples are scored by
one batched max-plus programme with backpointers (:mod:`lightning_gtn.kernels.viterbi_paths`): on
the CPU a compiled kernel (for plain CTC one without graphs, torchaudio's recursion restricted to
the feasible band, on ``torch.get_num_threads()`` threads), padded tables and one step per frame
for all examples on other devices. Memory on the CPU is bounded per example by checkpointing (at
most :data:`~lightning_gtn.kernels.viterbi_paths.MAX_ALIGN_BYTES`, 2 GiB, else a ValueError naming
T, S and the bytes).

:func:`word_spans` groups token spans into words; :func:`to_json` and :func:`to_ctm` format
the result (:func:`lightning_gtn.align.plot.plot_alignment` draws it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import wfst as _wfst
from ..core import checks
from ..core.criterion_graphs import cached, compiled_asg_target, compiled_ctc, compiled_force_align, target_key
from ..core.scoring import unique_graphs
from ..core.words import length_ranges, separator_ranges, word_records
from ..kernels.compiled_graphs import GraphBatch, Problem, compile_graph
from ..kernels.viterbi_paths import ctc_states, viterbi_arcs
from ..opargs import op_schema

__all__ = [
    "Alignment",
    "forced_align",
    "align_graph",
    "word_spans",
    "hypotheses_alignment",
    "to_records",
    "to_json",
    "to_ctm",
]

_NO_TOKEN = -1  # a blank frame or padding
_STAR = -2  # a frame absorbed by the star


@dataclass
class Alignment:
    """The result of :func:`forced_align` (batched, padded tensors on the emissions' device).

    Attributes:
        labels: ``(B, T)`` int64 label of each frame on the best path (the blank for blank
            frames; for a star frame, the best non-blank label it absorbed); -1 past each
            example's length and for every frame of an infeasible example.
        token_start: ``(B, S)`` int64 first frame of each target token (inclusive).
        token_end: ``(B, S)`` int64 end frame of each target token (exclusive).
        token_score: ``(B, S)`` sum of the log-probabilities of the token's frames.
        token_confidence: ``(B, S)`` mean over the token's frames of ``exp(log-probability)``:
            the average per-frame posterior of the token when the emissions are
            ``log_softmax`` outputs (with other scores it is just ``exp`` of them averaged).
        score: ``(B,)`` the best path's score (frame scores, plus star penalties and ASG
            transitions where used); ``-inf`` for an infeasible example.
        input_lengths: ``(B,)`` int64 frames of each example.
        target_lengths: ``(B,)`` int64 tokens of each target.
        star_frames: ``(B, T)`` bool mask of the frames absorbed by the star (``star`` given),
            else None.

    Entries past a target's length, and all tokens of an infeasible example, have
    ``token_start = token_end = -1``, ``token_score = 0`` and ``token_confidence = 0``.
    ``S`` is the width of padded ``(B, S)`` targets, else the longest target.
    """

    labels: torch.Tensor
    token_start: torch.Tensor
    token_end: torch.Tensor
    token_score: torch.Tensor
    token_confidence: torch.Tensor
    score: torch.Tensor
    input_lengths: torch.Tensor
    target_lengths: torch.Tensor
    star_frames: Optional[torch.Tensor] = None

    def to(self, device) -> "Alignment":
        """A copy with every tensor on ``device``."""
        moved: Dict[str, Optional[torch.Tensor]] = {
            f.name: (None if getattr(self, f.name) is None else getattr(self, f.name).to(device)) for f in fields(self)
        }
        return Alignment(**moved)  # type: ignore[arg-type]  # only star_frames may be None, as in self

    def __len__(self) -> int:
        return int(self.score.shape[0])


# ---------------------------------------------------------------------------
# Graphs
# ---------------------------------------------------------------------------


def align_graph(target: Sequence[int], blank: Optional[int], star_label: Optional[int] = None) -> "_wfst.Graph":
    """The alignment acceptor of ``target`` (epsilon-free).

    Without ``star_label`` it is CTC's graph (``blank`` an int: nodes ``0 .. 2L``, even nodes
    read the blank, odd node ``2l + 1`` reads token ``l``, both loop) or the force-align chain
    (``blank=None``: node ``l + 1`` reads token ``l`` and loops). With ``star_label`` one star
    node per gap ``l = 0 .. L`` follows (node ids after the base graph's): entered by reading
    the star from the node before gap ``l`` (the blank ``2l`` and token ``2l - 1`` with a
    blank; node ``l`` without), it loops on the star, leaves to token ``l`` (and back to the
    blank ``2l`` by reading the blank), and the last one accepts.

    Args:
        target: token ids (never ``blank``).
        blank: the blank id, or None.
        star_label: the label of the star column (``C`` for the augmented emissions), or None.
    """
    y = [int(t) for t in target]
    L = len(y)
    if star_label is None:
        if blank is None:
            from ..core.criterion_graphs import force_align_graph

            return force_align_graph(y)
        return _wfst.criterion.ctc_graph(y, blank)
    star = int(star_label)
    g = _wfst.Graph(False)
    if blank is None:
        for n in range(L + 1):
            g.add_node(n == 0, n == L)
        for i, tok in enumerate(y):
            g.add_arc(i, i + 1, tok)
            g.add_arc(i + 1, i + 1, tok)
        for gap in range(L + 1):
            s = g.add_node(False, gap == L)
            g.add_arc(gap, s, star)
            g.add_arc(s, s, star)
            if gap < L:
                g.add_arc(s, gap + 1, y[gap])
        return g
    S = 2 * L + 1
    for n in range(S):
        g.add_node(n == 0, n >= S - 2)
    for n in range(S):
        lab = blank if n % 2 == 0 else y[(n - 1) // 2]
        g.add_arc(n, n, lab)
        if n > 0:
            g.add_arc(n - 1, n, lab)
        if n % 2 and n > 1 and lab != y[(n - 1) // 2 - 1]:
            g.add_arc(n - 2, n, lab)
    for gap in range(L + 1):
        s = g.add_node(False, gap == L)
        g.add_arc(2 * gap, s, star)
        if gap > 0:
            g.add_arc(2 * gap - 1, s, star)
        g.add_arc(s, s, star)
        g.add_arc(s, 2 * gap, blank)
        if gap < L:
            g.add_arc(s, 2 * gap + 1, y[gap])
    return g


def _node_tokens(L: int, blank: Optional[int], star: bool) -> np.ndarray:
    """Token index of each node of :func:`align_graph` (-1: blank or start, -2: star)."""
    if blank is None:
        base = np.arange(-1, L, dtype=np.int64)
    else:
        n = np.arange(2 * L + 1)
        base = np.where(n % 2 == 1, (n - 1) // 2, _NO_TOKEN).astype(np.int64)
    if star:
        base = np.concatenate([base, np.full(L + 1, _STAR, dtype=np.int64)])
    return base


def _compiled(target: tuple, blank: Optional[int], star_label: Optional[int], C: int, asg: bool):
    if asg:
        return compiled_asg_target(target, C)
    if star_label is None:
        return compiled_force_align(target) if blank is None else compiled_ctc(target, blank)
    key = (target, -1 if blank is None else int(blank), int(star_label))
    return cached("align_star", key, lambda: compile_graph(align_graph(target, blank, star_label)))


def _min_frames(y: Sequence[int], blank: Optional[int]) -> int:
    """Frames the shortest path of ``y`` needs: one per token, plus a blank between equal
    neighbours with a blank."""
    if blank is None:
        return len(y)
    return len(y) + sum(1 for a, b in zip(y, y[1:]) if a == b)


# ---------------------------------------------------------------------------
# forced_align
# ---------------------------------------------------------------------------


def _check_star(star) -> Optional[float]:
    if star is None:
        return None
    if isinstance(star, torch.Tensor) and star.dim() == 0 and star.is_floating_point():
        star = float(star)
    if (
        isinstance(star, (bool, np.bool_))
        or not isinstance(star, (int, float, np.integer, np.floating))
        or not math.isfinite(float(star))
    ):
        raise ValueError(f"star must be None or a finite float (the log-score added to each star frame), got {star!r}")
    return float(star)


def forced_align(
    emissions: torch.Tensor,
    targets,
    input_lengths,
    target_lengths=None,
    *,
    blank: Optional[int] = 0,
    star: Optional[float] = None,
    transitions: Optional[torch.Tensor] = None,
    impl: Optional[str] = None,
) -> Alignment:
    """The best alignment of each target to its emissions, batched.

    Each target gets its criterion graph (cached per target): CTC's graph when ``blank`` is
    an int (blanks between and around tokens, a blank required between equal neighbours);
    the force-align chain when ``blank`` is None (the ASG / sequence convention: each token
    covers one or more frames, equal neighbours stay apart only by the target itself, e.g.
    with a repeat token); ASG's target graph with ``transitions``. All graphs are then scored
    against the emissions by one batched Viterbi with backpointers, and the best path is read
    back per frame and per token.

    With ``star`` (a float), a wildcard may absorb untranscribed stretches before, between and
    after the tokens, as in Star Temporal Classification (see
    :mod:`lightning_gtn.losses.stc`): each star frame scores its best non-blank label
    plus ``star`` (the star's log-penalty, e.g. ``math.log(p)`` with STC's ``p``; negative
    values make the star costly). In the max semiring STC's "star except the next token"
    column changes nothing (the token's own self-loop is at least as good), so one star
    column is used.

    Args:
        emissions: ``(B, T, C)`` log-probabilities (``log_softmax`` outputs; any float dtype,
            any device; float16/bfloat16 are scored in float32). NaN or ``+inf`` values are
            errors.
        targets: padded ``(B, S)``, concatenated 1-D with ``target_lengths``, or a list of B
            sequences; labels in ``[0, C)``, never ``blank``.
        input_lengths: ``(B,)`` integer frames per example, ``0 <= input_lengths[b] <= T``.
        target_lengths: ``(B,)`` tokens per example; needed with tensor targets.
        blank: keyword-only; the blank id in ``[0, C)``, or None for no blank.
        star: None, or the star's log-penalty per frame (finite float).
        transitions: ASG's ``(C + 1, C)`` transition scores (``blank=None`` only, not with
            ``star``); the path score then includes them.
        impl: None (numba on the CPU, torch elsewhere), ``"numba"`` (CPU tensors) or
            ``"torch"`` (any device).

    Returns:
        An :class:`Alignment` on the emissions' device; scores in the emissions' dtype
        (float32 for half precision). An example with no path of its length (too many
        tokens for its frames) gets score ``-inf``, labels -1 and no token spans; no error.

    The search is a ``torch.library`` custom op (``lightning_gtn::forced_align``): with padded
    ``(B, S)`` targets the call works inside ``torch.compile(..., fullgraph=True)``.

    Example:
        >>> import torch
        >>> from lightning_gtn.functional import forced_align
        >>> lp = torch.randn(2, 12, 5).log_softmax(-1)
        >>> al = forced_align(lp, [[1, 2, 2], [3]], torch.tensor([12, 7]))
        >>> al.labels.shape, al.token_start.shape
        (torch.Size([2, 12]), torch.Size([2, 3]))
        >>> bool((al.token_end[0] > al.token_start[0]).all())
        True
    """
    B, T, C = checks.check_emissions(emissions, "emissions")
    blank = checks.check_label(blank, "blank", C, allow_none=True)
    star = _check_star(star)
    if impl not in (None, "numba", "torch"):
        raise ValueError(f"impl must be None, 'numba' or 'torch', got {impl!r}")
    dev = emissions.device
    if impl == "numba" and dev.type != "cpu":
        raise ValueError(f"impl='numba' needs CPU tensors, got emissions on {dev}")
    if transitions is not None:
        if blank is not None:
            raise ValueError("transitions are ASG's: pass blank=None with them")
        if star is not None:
            raise ValueError("star is not supported together with transitions")
        from ..losses.asg import check_transitions

        check_transitions(transitions, C, dev)
        transitions = transitions.detach()
    tg, tl = checks.targets_tensors(targets, target_lengths, B, dev)
    if tg.dim() == 1:  # concatenated: padded here (eager), the op takes (B, S)
        seqs = checks.split_targets(tg, tl, B, dev, C, blank)
        tg, tl = checks.targets_tensors(seqs, None, B, dev)
    elif tg.dim() != 2:
        raise ValueError(f"targets must have shape (B, S) or (sum(target_lengths),), got {tuple(tg.shape)}")
    il = checks.int_tensor(input_lengths, "input_lengths")
    args = ForcedAlignArgs(
        emissions=emissions.detach(),
        targets=tg,
        input_lengths=il,
        target_lengths=tl,
        transitions=transitions,
        blank=-1 if blank is None else blank,
        star=star,
        impl=impl or "",
    )
    out = _forced_align_op(*args)
    labels, start, end, tscore, conf, score, star_frames = out
    return Alignment(
        labels=labels,
        token_start=start,
        token_end=end,
        token_score=tscore,
        token_confidence=conf,
        score=score,
        input_lengths=il.to(dev),
        target_lengths=tl.to(dev),
        star_frames=star_frames if star is not None else None,
    )


class ForcedAlignArgs(NamedTuple):
    """The arguments of ``lightning_gtn::forced_align``."""

    emissions: torch.Tensor
    targets: torch.Tensor
    input_lengths: torch.Tensor
    target_lengths: torch.Tensor
    transitions: Optional[torch.Tensor]
    blank: int
    star: Optional[float]
    impl: str


@torch.library.custom_op("lightning_gtn::forced_align", mutates_args=())
@op_schema(ForcedAlignArgs)
def _forced_align_op(
    emissions: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    transitions: Optional[torch.Tensor],
    blank: int,
    star: Optional[float],
    impl: str,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(labels, token_start, token_end, token_score, token_confidence, score, star_frames)``
    of :func:`forced_align` (``blank=-1``: no blank; ``impl=""``: the default); padded
    ``(B, S)`` targets; ``star_frames`` all False without a star."""
    return _forced_align_impl(
        emissions, targets, input_lengths, target_lengths, transitions, None if blank < 0 else blank, star, impl or None
    )


@_forced_align_op.register_fake
def _forced_align_fake(*inputs):
    a = ForcedAlignArgs(*inputs)
    emissions = a.emissions
    B, T = emissions.shape[:2]
    S = a.targets.shape[1]
    dt = _out_dtype(emissions)
    return (
        emissions.new_empty((B, T), dtype=torch.int64),
        emissions.new_empty((B, S), dtype=torch.int64),
        emissions.new_empty((B, S), dtype=torch.int64),
        emissions.new_empty((B, S), dtype=dt),
        emissions.new_empty((B, S), dtype=dt),
        emissions.new_empty((B,), dtype=dt),
        emissions.new_empty((B, T), dtype=torch.bool),
    )


def _forced_align_impl(emissions, targets, input_lengths, target_lengths, transitions, blank, star, impl):
    """The real implementation behind the custom op (arguments checked as in forced_align)."""
    B, T, C = emissions.shape
    dev = emissions.device
    if targets.dim() != 2:
        raise ValueError(f"targets must be padded (B, S) here, got shape {tuple(targets.shape)}")
    blank = checks.check_label(blank, "blank", C, allow_none=True)  # the op may be called directly
    lengths = checks.as_lengths(input_lengths, B, "input_lengths", dev, max_value=T)
    seqs = checks.split_targets(targets, target_lengths, B, dev, C, blank)
    cdt = checks.compute_dtype(emissions)
    x = emissions.detach().to(cdt)
    if x.numel():
        top = float(x.max())  # one reduction: max propagates NaN
        if math.isnan(top) or top == math.inf:
            raise ValueError("emissions must not contain NaN or +inf")
    if transitions is not None and not bool(torch.isfinite(transitions.detach()).all()):
        raise ValueError("transitions must be finite")
    star_lab = None
    xs = x
    if star is not None:
        tok = x if blank is None else x.index_fill(-1, torch.tensor([blank], device=dev), -math.inf)
        best, star_lab = tok.max(-1)  # (B, T): the best non-blank label of each frame
        xs = torch.cat([x, (best + star).unsqueeze(-1)], -1)
    star_label = C if star is not None else None
    use_numba = impl == "numba" or (impl is None and dev.type == "cpu")
    if use_numba and star is None and transitions is None and blank is not None:
        return _ctc_fast(x, seqs, lengths, blank, int(targets.shape[1]), _out_dtype(emissions))
    # graphs of the feasible examples only: an infeasible one costs nothing and gives -inf
    need = np.array([_min_frames(s, blank) for s in seqs], dtype=np.int64)
    rows = np.nonzero(need <= lengths)[0] if B else np.zeros(0, np.int64)
    asg = transitions is not None
    keys = [target_key(seqs[b]) for b in rows]
    per_ex = [_compiled(k, blank, star_label, C, asg) for k in keys]
    graphs, ids = unique_graphs(per_ex)
    batch = GraphBatch(graphs)
    problem = Problem(batch, ids, rows, lengths[rows])
    if asg:
        widx = torch.from_numpy(batch.weight_index())
        w = transitions.detach().to(device="cpu", dtype=cdt).reshape(-1)[widx]
    else:
        w = torch.from_numpy(batch.weights()).to(cdt)
    if use_numba:
        arcs_e, score_e = viterbi_arcs(problem, xs.cpu().contiguous(), w, "numba")
    else:
        arcs_e, score_e = viterbi_arcs(problem, xs.contiguous(), w.to(dev), "torch")
    # per-arc tables: token index (dst node's), label
    glen = np.zeros(len(graphs), dtype=np.int64)
    glen[ids] = [len(k) for k in keys]
    node_tok = [_node_tokens(int(n), blank, star is not None) for n in glen]
    arc_tok = np.concatenate([nt[g.dst] for nt, g in zip(node_tok, graphs)]) if graphs else np.zeros(0, np.int64)
    arc_tok_t = torch.from_numpy(np.append(arc_tok, _NO_TOKEN)).to(dev)
    arc_lab_t = torch.from_numpy(np.append(batch.label.astype(np.int64), -1)).to(dev)
    rows_t = torch.from_numpy(rows).to(dev)
    arcs = torch.full((B, T), -1, dtype=torch.int64, device=dev)
    score = torch.full((B,), -math.inf, dtype=cdt, device=dev)
    if len(rows):
        arcs[rows_t] = arcs_e.to(dev)
        score[rows_t] = score_e.to(device=dev, dtype=cdt)
    idx = torch.where(arcs >= 0, arcs, torch.full_like(arcs, len(arc_tok)))
    tok = arc_tok_t[idx]  # (B, T)
    labels = arc_lab_t[idx]
    star_frames = None
    if star_lab is not None:  # star is not None
        star_frames = tok == _STAR
        labels = torch.where(star_frames, star_lab, labels)
    frame_score = x.gather(2, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    valid = labels >= 0
    frame_score = torch.where(valid, frame_score, torch.zeros_like(frame_score))
    if star_frames is None:
        star_frames = torch.zeros((B, T), dtype=torch.bool, device=dev)
    start, end, tscore, conf = _token_spans(tok, frame_score, int(targets.shape[1]))
    dt = _out_dtype(emissions)
    return labels, start, end, tscore.to(dt), conf.to(dt), score.to(dt), star_frames


def _ctc_fast(x, seqs, lengths, blank: int, S: int, dt):
    """CTC on the CPU without graphs (:func:`~lightning_gtn.kernels.viterbi_paths.ctc_states`):
    the outputs of :func:`_forced_align_impl` from the node of every frame."""
    B, T, _ = x.shape
    tl = np.array([len(s) for s in seqs], dtype=np.int64)
    tg = np.zeros((B, max(int(tl.max(initial=0)), 1)), dtype=np.int64)
    for b, s in enumerate(seqs):
        tg[b, : len(s)] = s
    states, score = ctc_states(x.contiguous(), tg, tl, lengths, blank)
    odd = (states % 2) == 1
    tok = torch.where(odd, (states - 1) // 2, torch.full_like(states, _NO_TOKEN))
    lab_tok = torch.from_numpy(tg).gather(1, tok.clamp(min=0))
    labels = torch.where(
        states < 0, torch.full_like(states, -1), torch.where(odd, lab_tok, torch.full_like(states, blank))
    )
    frame_score = x.gather(2, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    frame_score = torch.where(labels >= 0, frame_score, torch.zeros_like(frame_score))
    start, end, tscore, conf = _token_spans(tok, frame_score, S)
    star_frames = torch.zeros((B, T), dtype=torch.bool)
    return labels, start, end, tscore.to(dt), conf.to(dt), score.to(dt), star_frames


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32


def _token_spans(tok: torch.Tensor, frame_score: torch.Tensor, S: int):
    """Per-token start, end, score, confidence from the per-frame token index ``tok`` (B, T)."""
    B, T = tok.shape
    dev = tok.device
    bins = torch.where(tok >= 0, tok, torch.full_like(tok, S))  # S: the bin of non-token frames
    t = torch.arange(T, device=dev).expand(B, T)
    count = torch.zeros((B, S + 1), dtype=torch.int64, device=dev).scatter_add_(1, bins, torch.ones_like(bins))
    start = torch.full((B, S + 1), T, dtype=torch.int64, device=dev).scatter_reduce_(1, bins, t, "amin")
    end = torch.full((B, S + 1), -1, dtype=torch.int64, device=dev).scatter_reduce_(1, bins, t, "amax") + 1
    tsum = torch.zeros((B, S + 1), dtype=frame_score.dtype, device=dev).scatter_add_(1, bins, frame_score)
    psum = torch.zeros((B, S + 1), dtype=frame_score.dtype, device=dev).scatter_add_(1, bins, frame_score.exp())
    count, start, end, tsum, psum = (v[:, :S] for v in (count, start, end, tsum, psum))
    has = count > 0
    none = torch.full_like(start, -1)
    start = torch.where(has, start, none)
    end = torch.where(has, end, none)
    conf = torch.where(has, psum / count.clamp(min=1), torch.zeros_like(psum))
    tsum = torch.where(has, tsum, torch.zeros_like(tsum))
    return start, end, tsum, conf


# ---------------------------------------------------------------------------
# Words and outputs
# ---------------------------------------------------------------------------


def _seqs_of(alignment: Alignment, targets) -> List[List[int]]:
    B = len(alignment)
    tl = alignment.target_lengths.cpu()
    dev = alignment.labels.device  # targets may sit there or on the CPU
    if isinstance(targets, (torch.Tensor, np.ndarray)) or (
        isinstance(targets, (list, tuple)) and targets and np.isscalar(targets[0])
    ):
        return checks.split_targets(targets, tl, B, dev, 2**62)
    seqs = checks.split_targets(targets, None, B, dev, 2**62)
    if [len(s) for s in seqs] != tl.tolist():
        raise ValueError("targets: the lengths differ from the alignment's target_lengths")
    return seqs


def word_spans(
    alignment: Alignment,
    targets,
    *,
    word_separator_id: Optional[int] = None,
    word_lengths: Optional[Sequence[Sequence[int]]] = None,
) -> List[List[Dict]]:
    """Groups the token spans of an alignment into words.

    Words are the maximal runs of tokens other than ``word_separator_id`` (separators belong
    to no word), or consecutive groups of ``word_lengths[b][i]`` tokens (word boundaries from a
    lexicon), or, with neither, one word per token.

    Args:
        alignment: from :func:`forced_align`.
        targets: the targets given to it (padded ``(B, S)``, concatenated 1-D or B sequences).
        word_separator_id: keyword-only; the token that separates words (e.g. the space).
        word_lengths: keyword-only; per example, the number of tokens of each word (summing to
            the target's length).

    Returns:
        Per example a list of dicts ``{"word_index", "start", "end", "score", "confidence",
        "token_range"}``: first frame, end frame (exclusive), the sum of the token scores, the
        frame-weighted mean of the token confidences and ``(first token, end token)``
        (exclusive). An infeasible example (score ``-inf``) has no words.

    Example:
        >>> import torch
        >>> from lightning_gtn.functional import forced_align, word_spans
        >>> lp = torch.randn(1, 20, 5).log_softmax(-1)
        >>> al = forced_align(lp, [[1, 2, 4, 3]], [20])
        >>> [w["token_range"] for w in word_spans(al, [[1, 2, 4, 3]], word_separator_id=4)[0]]
        [(0, 2), (3, 4)]
    """
    if word_separator_id is not None and word_lengths is not None:
        raise ValueError("pass word_separator_id or word_lengths, not both")
    seqs = _seqs_of(alignment, targets)
    B = len(seqs)
    if word_lengths is not None and len(word_lengths) != B:
        raise ValueError(f"word_lengths: expected B={B} lists of word lengths, got {len(word_lengths)}")
    start = alignment.token_start.cpu().tolist()
    end = alignment.token_end.cpu().tolist()
    tscore = alignment.token_score.cpu().double().tolist()
    conf = alignment.token_confidence.cpu().double().tolist()
    ok = torch.isfinite(alignment.score).cpu().tolist()
    out: List[List[Dict]] = []
    for b, y in enumerate(seqs):
        if word_lengths is not None:
            ranges = length_ranges(word_lengths[b], len(y), f"word_lengths[{b}]")
        else:
            ranges = separator_ranges(y, word_separator_id)
        out.append(word_records(ranges, start[b], end[b], tscore[b], conf[b]) if ok[b] else [])
    return out


#: the most frame labels (B x frames) :func:`hypotheses_alignment` allocates
_MAX_LABEL_CELLS = 1 << 31
_HYP_FIELDS = ("tokens", "timesteps", "token_ends", "token_scores", "token_confidences", "score", "num_frames")


def _is_hypotheses(x) -> bool:
    if isinstance(x, Alignment) or not isinstance(x, (list, tuple)):
        return False
    if not x:
        return True  # no utterances
    h = x[0][0] if isinstance(x[0], (list, tuple)) and x[0] else x[0]
    return all(hasattr(h, f) for f in _HYP_FIELDS)


def _best_of(hypotheses) -> list:
    out = []
    for b, h in enumerate(hypotheses):
        if isinstance(h, (list, tuple)):
            if not h:
                raise ValueError(f"hypotheses[{b}] is an empty list (one hypothesis or an n-best list per utterance)")
            h = h[0]
        if not all(hasattr(h, f) for f in _HYP_FIELDS):
            raise ValueError(f"hypotheses[{b}] is not a decoder hypothesis (it lacks one of {_HYP_FIELDS})")
        n, T = len(h.tokens), int(h.num_frames)
        if T < 0:
            raise ValueError(f"hypotheses[{b}]: num_frames must be >= 0, got {T}")
        if any(len(getattr(h, f)) != n for f in _HYP_FIELDS[1:5]):
            raise ValueError(f"hypotheses[{b}]: its token fields differ in length (fill them with a decoder)")
        if n and (min(h.timesteps) < 0 or max(h.token_ends) > T):
            raise ValueError(f"hypotheses[{b}]: token frames outside [0, num_frames={T}]")
        out.append(h)
    return out


def hypotheses_alignment(hypotheses: Sequence) -> Alignment:
    """The :class:`Alignment` of decoded hypotheses, one per utterance (or an n-best list per
    utterance: its first, the best), so that :func:`word_spans` and the writers read them.

    A hypothesis is any decoder result with ``tokens``, ``timesteps``, ``token_ends``,
    ``token_scores``, ``token_confidences``, ``score`` and ``num_frames``
    (:class:`lightning_gtn.decode.Hypothesis` of the CTC decoders,
    :class:`lightning_gtn.decode.transducer_beam.TransducerHypothesis` of the transducer ones).
    Token spans, scores and confidences are the hypothesis'; ``labels`` holds each token's id on
    its frames and -1 elsewhere; ``score`` is the search's score (``-inf`` for a beam that died
    out: no words); the tensors are on the CPU, ``S`` the longest hypothesis.
    """
    hyps = _best_of(hypotheses)
    B = len(hyps)
    T = max([int(h.num_frames) for h in hyps], default=0)
    S = max([len(h.tokens) for h in hyps], default=0)
    if B * T > _MAX_LABEL_CELLS:
        raise ValueError(
            f"hypotheses: B={B} x num_frames={T} labels exceed {_MAX_LABEL_CELLS} (the frames table bound)"
        )
    labels = torch.full((B, T), _NO_TOKEN, dtype=torch.int64)
    start = torch.full((B, S), -1, dtype=torch.int64)
    end = torch.full((B, S), -1, dtype=torch.int64)
    tscore = torch.zeros(B, S, dtype=torch.float64)
    conf = torch.zeros(B, S, dtype=torch.float64)
    for b, h in enumerate(hyps):
        n = len(h.tokens)
        if n:
            start[b, :n] = torch.tensor(h.timesteps, dtype=torch.int64)
            end[b, :n] = torch.tensor(h.token_ends, dtype=torch.int64)
            tscore[b, :n] = torch.tensor(h.token_scores, dtype=torch.float64)
            conf[b, :n] = torch.tensor(h.token_confidences, dtype=torch.float64)
        for tok, t0, t1 in zip(h.tokens, h.timesteps, h.token_ends):
            labels[b, t0:t1] = int(tok)
    return Alignment(
        labels,
        start,
        end,
        tscore,
        conf,
        torch.tensor([float(h.score) for h in hyps], dtype=torch.float64),
        torch.tensor([int(h.num_frames) for h in hyps], dtype=torch.int64),
        torch.tensor([len(h.tokens) for h in hyps], dtype=torch.int64),
    )


def _resolve(
    alignment, targets, word_separator_id, word_lengths
) -> Tuple[Alignment, List[List[int]], List[List[Dict]]]:
    """``(alignment, token sequences, words)`` of an :class:`Alignment` and its targets, or of
    decoder hypotheses (then ``targets`` must be None; their own ``word_spans`` unless a
    grouping is given)."""
    if not _is_hypotheses(alignment):
        if targets is None:
            raise ValueError("targets: required with an Alignment (None only with decoder hypotheses)")
        seqs = _seqs_of(alignment, targets)
        return (
            alignment,
            seqs,
            word_spans(alignment, seqs, word_separator_id=word_separator_id, word_lengths=word_lengths),
        )
    if targets is not None:
        raise ValueError("targets: must be None with decoder hypotheses (their tokens are the targets)")
    hyps = _best_of(alignment)
    al = hypotheses_alignment(hyps)
    seqs = [[int(t) for t in h.tokens] for h in hyps]
    if word_separator_id is None and word_lengths is None and all(hasattr(h, "word_spans") for h in hyps):
        words = [[dict(w) for w in h.word_spans] if math.isfinite(h.score) else [] for h in hyps]
    else:
        words = word_spans(al, seqs, word_separator_id=word_separator_id, word_lengths=word_lengths)
    return al, seqs, words


def _token_text(tokens, i: int) -> str:
    if tokens is None:
        return str(i)
    try:
        return str(tokens[i])
    except (IndexError, KeyError):
        raise ValueError(f"tokens: no entry for token id {i}") from None


def _check_frame_shift(frame_shift) -> float:
    if (
        isinstance(frame_shift, bool)
        or not isinstance(frame_shift, (int, float))
        or not (math.isfinite(frame_shift) and frame_shift > 0)
    ):
        raise ValueError(f"frame_shift must be a positive number of seconds, got {frame_shift!r}")
    return float(frame_shift)


def _utt_ids(utterance_ids, B: int) -> List[str]:
    if utterance_ids is None:
        return [f"utt{b}" for b in range(B)]
    ids = [str(u) for u in utterance_ids]
    if len(ids) != B:
        raise ValueError(f"utterance_ids: expected B={B} ids, got {len(ids)}")
    for u in ids:
        if not u or any(c.isspace() for c in u):
            raise ValueError(f"utterance_ids: ids must be non-empty without white space, got {u!r}")
    return ids


def _join(tokens, ids: Sequence[int], joiner: str) -> str:
    return joiner.join(_token_text(tokens, i) for i in ids)


def to_records(
    alignment: Union[Alignment, Sequence],
    targets=None,
    *,
    frame_shift: float = 0.01,
    tokens: Union[None, Sequence[str], Mapping[int, str]] = None,
    utterance_ids: Optional[Sequence[str]] = None,
    word_separator_id: Optional[int] = None,
    word_lengths: Optional[Sequence[Sequence[int]]] = None,
    joiner: str = "",
) -> List[Dict]:
    """The alignment as plain Python data, one dict per utterance (what :func:`to_json` writes).

    Each dict: ``{"utterance", "num_frames", "score" (None when infeasible), "tokens": [{"index",
    "id", "text", "start_frame", "end_frame", "start", "end", "score", "confidence"}], "words":
    [{... as word_spans ..., "text", "start_time", "end_time"}], "star_frames" (with star)}``;
    times are seconds (``frame * frame_shift``), end frames and times exclusive.

    Decoder results are written the same way: pass B hypotheses (or B n-best lists, the first
    of each is written) as ``alignment`` and no ``targets`` (see :func:`hypotheses_alignment`);
    their words are their own ``word_spans`` unless ``word_separator_id`` or ``word_lengths``
    regroups them, and ``score`` is the search's score.

    Args:
        alignment, targets: as :func:`word_spans`; or decoder hypotheses and None.
        frame_shift: seconds per frame (positive).
        tokens: text of each token id (a list or a mapping); default the id itself.
        utterance_ids: B names (no white space); default ``utt0, utt1, ...``.
        word_separator_id, word_lengths: word grouping, as :func:`word_spans`.
        joiner: string put between the token texts of a word.
    """
    fs = _check_frame_shift(frame_shift)
    al, seqs, words = _resolve(alignment, targets, word_separator_id, word_lengths)
    B = len(seqs)
    names = _utt_ids(utterance_ids, B)
    start = al.token_start.cpu().tolist()
    end = al.token_end.cpu().tolist()
    tscore = al.token_score.cpu().double().tolist()
    conf = al.token_confidence.cpu().double().tolist()
    score = al.score.cpu().double().tolist()
    n_frames = al.input_lengths.cpu().tolist()
    star = None if al.star_frames is None else al.star_frames.cpu()
    out = []
    for b, y in enumerate(seqs):
        ok = math.isfinite(score[b])
        toks = []
        if ok:
            for i, tid in enumerate(y):
                toks.append(
                    {
                        "index": i,
                        "id": int(tid),
                        "text": _token_text(tokens, tid),
                        "start_frame": start[b][i],
                        "end_frame": end[b][i],
                        "start": round(start[b][i] * fs, 6),
                        "end": round(end[b][i] * fs, 6),
                        "score": tscore[b][i],
                        "confidence": conf[b][i],
                    }
                )
        ws = []
        for w in words[b]:
            i0, i1 = w["token_range"]
            ws.append(
                dict(
                    w,
                    token_range=[i0, i1],
                    text=_join(tokens, y[i0:i1], joiner),
                    start_time=round(w["start"] * fs, 6),
                    end_time=round(w["end"] * fs, 6),
                )
            )
        rec = {
            "utterance": names[b],
            "num_frames": int(n_frames[b]),
            "score": score[b] if ok else None,
            "tokens": toks,
            "words": ws,
        }
        if star is not None:
            rec["star_frames"] = int(star[b].sum())
        out.append(rec)
    return out


def to_json(alignment: Union[Alignment, Sequence], targets=None, *, indent: Optional[int] = None, **kwargs) -> str:
    """The records of :func:`to_records` as a JSON string (arguments as there: an alignment and
    its targets, or decoder hypotheses).

    Example:
        >>> import json, torch
        >>> from lightning_gtn.functional import forced_align, to_json
        >>> lp = torch.randn(1, 10, 4).log_softmax(-1)
        >>> al = forced_align(lp, [[1, 2]], [10])
        >>> rec = json.loads(to_json(al, [[1, 2]], frame_shift=0.04, tokens="_ab c"))[0]
        >>> [t["text"] for t in rec["tokens"]]
        ['a', 'b']
    """
    return json.dumps(to_records(alignment, targets, **kwargs), indent=indent)


def to_ctm(
    alignment: Union[Alignment, Sequence],
    targets=None,
    *,
    frame_shift: float = 0.01,
    tokens: Union[None, Sequence[str], Mapping[int, str]] = None,
    utterance_ids: Optional[Sequence[str]] = None,
    word_separator_id: Optional[int] = None,
    word_lengths: Optional[Sequence[Sequence[int]]] = None,
    joiner: str = "",
    channel: str = "1",
) -> str:
    """Kaldi CTM lines, one per word: ``utt channel start duration word confidence``.

    Start and duration are seconds (3 decimals), confidence is the word's ``confidence`` (4
    decimals): of an alignment its mean per-frame posterior, of decoder hypotheses as their
    ``word_spans`` define it. Infeasible utterances write no lines. Words as :func:`word_spans`
    (default: one per token), or the hypotheses' own (see :func:`to_records`); a word's text is
    its tokens' texts joined by ``joiner`` (spaces inside are replaced by ``_`` to keep the
    columns).

    Returns:
        The lines joined by newlines (with a final newline when not empty).
    """
    fs = _check_frame_shift(frame_shift)
    if not channel or any(c.isspace() for c in str(channel)):
        raise ValueError(f"channel must be non-empty without white space, got {channel!r}")
    recs = to_records(
        alignment,
        targets,
        frame_shift=fs,
        tokens=tokens,
        utterance_ids=utterance_ids,
        word_separator_id=word_separator_id,
        word_lengths=word_lengths,
        joiner=joiner,
    )
    lines = []
    for r in recs:
        for w in r["words"]:
            text = "_".join(w["text"].split()) or "_"
            lines.append(
                f"{r['utterance']} {channel} {w['start'] * fs:.3f} {(w['end'] - w['start']) * fs:.3f} "
                f"{text} {w['confidence']:.4f}"
            )
    return "\n".join(lines) + ("\n" if lines else "")
