"""The word-piece transducer loss (gtn_applications' ``Transducer`` criterion), batched.

The research criterion (Hannun et al., "Differentiable weighted finite-state transducers";
``criterions/transducer.py`` of facebookresearch/gtn_applications) scores a grapheme target
against emissions over a set of *tokens* (letters, word pieces) plus an optional blank, the
blank being the last class ``len(tokens)``. Its loss of an example is

    ``-log Z(E o T o A)`` without transitions, ``-(log Z(E o T o A) - log Z(E o T))`` with them,

where ``A`` is the frame-level alignment acceptor ``project_input(remove(tokens o
project_output(target o lexicon)))``: every decomposition of the grapheme target into tokens
(the lexicon spells each token) and every frame alignment of each decomposition (the token
graph: blank ``"none"`` / ``"optional"`` / ``"forced"``, repeats allowed or not). ``T`` is an
optional transitions acceptor over frame labels with learned arc weights (an n-gram graph made
by :func:`full_ngram_transitions`, or the user's).

The criterion is in three parts:

* :mod:`.transducer_graphs` builds ``A`` directly as arrays, once per distinct target (cached),
  with the same arcs as GTN's ``remove`` leaves (so path multiplicities, scores and gradients
  equal the research code's), and its product with ``T``, whose arcs index the learned weights;
* :mod:`.transducer_numerators` scores the numerators: through their hubs on the CPU, else by
  the graph kernels;
* :mod:`lightning_gtn.core.normalisers` scores the normalisers ``E o T`` that allow it densely
  (the unigram; the research bigram as ASG's fully connected recursion plus end weights); any
  other ``T`` is scored as a graph with weight index = arc id.

This module holds the :class:`TransducerCriterion` (which of those paths a batch takes), its
cache per configuration (:func:`transducer_criterion`) and the public functions. All examples of
a batch are scored by the library's batched forward-backward programme inside the
``lightning_gtn::structured_loss`` custom op.
"""

from __future__ import annotations

import functools
import math
import threading
import warnings
import weakref
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from ..core import checks, criterion, normalisers
from ..core.best_path import BestPathsArgs, best_paths_op, max_semiring_paths, refuse_nan
from ..core.cache import LRU
from ..core.scoring import Plan, normalised_plan, unique_graphs
from ..wfst import Graph
from . import transducer_numerators as numerators
from .transducer_graphs import (
    BLANK_MODES,
    TransducerGraphs,
    check_blank,
    check_ngram,
    full_ngram_transitions,
    segment,
    token_ids,
)

__all__ = [
    "transducer_loss",
    "transducer_best_paths",
    "full_ngram_transitions",
    "transitions_graph",
    "segment",
    "transducer_criterion",
    "TransducerCriterion",
    "BLANK_MODES",
    "check_blank",
    "check_ngram",
    "token_ids",
]


def transitions_graph(ngram: int, num_classes: int, calc_grad: bool = False) -> Graph:
    """Deprecated: the old name of :func:`full_ngram_transitions` (the same graph), kept for one
    release. :func:`lightning_gtn.wfst.ngram.transitions_graph` is another function: an n-gram
    estimated from data."""
    warnings.warn(
        "lightning_gtn.functional.transitions_graph is deprecated and will be removed; use "
        "lightning_gtn.functional.full_ngram_transitions (the same graph)",
        DeprecationWarning,
        stacklevel=2,
    )
    return full_ngram_transitions(ngram, num_classes, calc_grad)


# ---------------------------------------------------------------------------
# the criterion
# ---------------------------------------------------------------------------


class TransducerCriterion(TransducerGraphs, criterion.Criterion):
    """The transducer criterion of one configuration: its graphs (:class:`TransducerGraphs`,
    same arguments) and how a batch is scored.

    Without transitions the numerators are the whole loss (through their hubs on the CPU with
    ``impl="numba"``). With transitions, the unigram (one node looping on every label) folds its
    weights into the emissions and has a dense normaliser; the research bigram
    (``full_ngram_transitions(2, C)``) is scored as ASG's fully connected normaliser plus end
    weights where ASG's is; any other transitions graph goes through the graph kernels.
    """

    name = "transducer_loss"

    def check_options(self, C: int, blank, weights, device: torch.device):
        """The emissions must have this configuration's ``C`` classes; ``weights`` are the
        learned ``transition_params`` (see :func:`transducer_loss`)."""
        _check_num_classes(self, C, f"C = {C}")
        _check_transition_params(self, weights, device)
        return -1, weights

    # -- the Criterion interface -------------------------------------------------
    def target_classes(self, C: int) -> int:
        """Targets are graphemes: ``[0, num_graphemes)``."""
        return self.num_graphemes

    def plan(self, seqs, lengths, C, blank):
        """The numerators of ``seqs`` (minus), and with transitions the normaliser (plus) with
        the weight index of every arc."""
        if C != self.C:
            raise ValueError(f"emissions must have C = len(tokens) + (blank != 'none') = {self.C} classes, got {C}")
        nums = [self.numerator(s) for s in seqs]
        B = len(seqs)
        if self.denominator is None:
            graphs, ids = unique_graphs(nums)
            return Plan(graphs, ids, np.arange(B), lengths, -np.ones(B), B), None
        plan = normalised_plan(self.denominator, nums, lengths)
        return plan, plan.batch.weight_index()

    def score(self, E, weights, seqs, lengths, blank, impl, zero_infinity, need_e, w_coef):
        """As :meth:`criterion.Criterion.score`; the unigram normaliser (one node looping on every
        label: ``log Z = sum_t logsumexp_c(E[t, c] + w[c])``) is computed densely (see
        :meth:`_unigram_folded`) instead of arc by arc, the research bigram's as a fully connected
        normaliser (:meth:`_bigram_score`); on the CPU the plain numerators go through their hubs
        (:func:`.transducer_numerators.hub_numerators`)."""
        if (
            self.research_bigram
            and normalisers.use_fully_connected(self.C, E.device)
            and E.shape[1] > 0
            and bool((lengths > 0).all())
        ):
            return self._bigram_score(E, weights, seqs, lengths, impl, zero_infinity, need_e, w_coef)
        if self.transitions is None and numerators.use_hub(self, E, impl):
            num_loss, gE, _ = numerators.hub_numerators(self, E, seqs, lengths, impl, need_e, None)
            ok = torch.isfinite(num_loss)
            if not bool(ok.all()):
                if zero_infinity:  # infeasible only: -inf from a +inf emission stays
                    num_loss = torch.where(num_loss == math.inf, torch.zeros_like(num_loss), num_loss)
                if gE is not None:
                    gE[~ok] = 0
            return num_loss, gE, None
        if not self.dense_unigram:
            return super().score(E, weights, seqs, lengths, blank, impl, zero_infinity, need_e, w_coef)
        return self._unigram_folded(E, weights, seqs, lengths, impl, zero_infinity, need_e, w_coef)

    def _unigram_folded(self, E, weights, seqs, lengths, impl, zero_infinity, need_e, w_coef):
        """The unigram criterion with its weights folded into the emissions: every arc reading
        label ``c`` carries ``w[c]``, so the plain alignment graphs (no weights: the cheaper loops)
        scored against ``E + w`` and a weightless unigram normaliser over ``E + w``
        (:class:`lightning_gtn.core.normalisers.Unigram`) give the same losses; ``d/dE = d/d(E + w)``,
        and ``d/dw[c]`` sums the occupancies of label ``c``: the numerators' arcs reading it and the
        normaliser's softmax. The normaliser's softmax buffer receives the numerators' gradient."""
        need_w = w_coef is not None
        need = need_e or need_w
        w = weights.detach().reshape(-1).to(E.dtype)
        coef = None if w_coef is None else w_coef.to(E.dtype)
        uni = normalisers.Unigram(E, w, lengths, need)
        if numerators.use_hub(self, E, impl):
            num_loss, _, gw_lab = numerators.hub_numerators(
                self, E, seqs, lengths, impl, need_e, coef, w=w, gE=uni.grad_emissions
            )
        else:
            num_loss, gE_n, gw_lab = numerators.plain_numerators(self, E, seqs, lengths, impl, need_e, coef, w=w)
            if gE_n is not None:
                uni.grad_emissions.add_(gE_n)
        losses, ok, okf = normalisers.combine(uni.logz.to(E.dtype), num_loss, zero_infinity)
        gE = gW = None
        if need:
            bad = ~ok
            if bool(bad.any()):  # infeasible rows: no gradient from either part
                uni.drop(bad)
            if coef is not None:  # need_w; the numerators of infeasible rows have zero occupancies already
                gW = (uni.weights_grad(coef).to(E.dtype) + gw_lab).reshape(weights.shape)
            if need_e:
                gE = uni.grad_emissions
        return losses, gE, gW

    def _bigram_score(self, E, weights, seqs, lengths, impl, zero_infinity, need_e, w_coef):
        """The research bigram's normaliser as ASG's fully connected one
        (:class:`lightning_gtn.core.normalisers.FullyConnected`): its arcs are ASG's start row
        (``w[:C]``), its ``C x C`` label-after-label matrix (``w[C + a * C + b]``: ``b`` after ``a``)
        and end weights (epsilon arcs to the final node, ``w[C + C^2 + 1 + a]`` after label ``a``),
        which are added to each example's last frame; the numerators read the same frames through
        their bigram graphs (:meth:`numerator`). Every length must be positive (length 0 takes the
        graph path)."""
        B, T, C = E.shape
        need_w = w_coef is not None
        w = weights.detach().reshape(-1).to(E.dtype)
        trans = torch.cat([w[:C].unsqueeze(0), w[C : C + C * C].reshape(C, C).t()], dim=0)  # (C + 1, C)
        end = w[C + C * C + 1 : C + C * C + 1 + C]
        rows = torch.arange(B, device=E.device)
        last = torch.from_numpy(np.asarray(lengths, dtype=np.int64) - 1).to(E.device)
        x = E.detach().clone()
        x[rows, last] += end
        # the numerators read the same end-weighted frames, through their bigram graphs
        widx, w, num_loss, gE_n, gw_n = numerators.weighted_numerators(
            self, x, weights, seqs, lengths, impl, need_e or need_w, w_coef, bigram=True
        )
        full = normalisers.FullyConnected(x, trans, lengths, need_e or need_w)
        gE_f = full.grad_emissions
        losses, ok, okf = normalisers.combine(full.logz, num_loss, zero_infinity)
        gE = gW = None
        if need_w:  # first: it reads the full graph's occupancies gE_f
            c = w_coef.to(E.dtype) * okf
            gT = full.transitions_grad(c)
            gW = torch.zeros_like(w)
            gW[:C] = gT[0]
            gW[C : C + C * C] = gT[1:].t().reshape(-1)
            gW[C + C * C + 1 : C + C * C + 1 + C] = ((gE_f[rows, last] + gE_n[rows, last]) * c.unsqueeze(1)).sum(0)
            if gw_n is not None:
                gW = gW.index_add_(0, widx, gw_n)
            gW = gW.reshape(weights.shape)
        if need_e:
            gE = gE_f.mul_(okf.reshape(-1, 1, 1))
            gE = gE.add_(gE_n if bool(ok.all()) else gE_n.mul_(okf.reshape(-1, 1, 1)))
        return losses, gE, gW

    # -- decoding ---------------------------------------------------------------
    def best_paths(self, emissions: torch.Tensor, lengths: np.ndarray, params: Optional[torch.Tensor]):
        """``(paths (B, T), scores (B,))``: the best frame paths through the transitions
        (per-frame argmax without them), on the host, padded with -1."""
        B, T, C = emissions.shape
        refuse_nan(emissions, lengths, params, "transition_params")
        if self.denominator is None:
            return best_paths_op(
                *BestPathsArgs(emissions=emissions.detach(), transitions=None, input_lengths=torch.from_numpy(lengths))
            )
        x = emissions.detach().to("cpu", checks.compute_dtype(emissions)).contiguous()
        plan = Plan([self.denominator], np.zeros(B, dtype=np.int64), np.arange(B), lengths, np.ones(B), B)
        # params come with the transitions, hence with a denominator
        w = params.detach().to("cpu", x.dtype).reshape(-1)  # type: ignore[union-attr]
        paths, scores = max_semiring_paths(x, plan, w.contiguous(), T)
        return paths.to(emissions.device), scores.to(device=emissions.device, dtype=emissions.dtype)


#: the configurations whose criteria :func:`transducer_criterion` keeps (least recently used
#: dropped first)
CRITERIA_CACHE_SIZE = 16
#: configuration key -> (criterion, handle, transitions graph): keeps the recent ones alive
_CRITERIA: LRU[tuple] = LRU(CRITERIA_CACHE_SIZE)
#: configuration key -> (weak reference to the criterion, handle) of every live criterion: one
#: that the LRU dropped but a module (:class:`lightning_gtn.nn.TransducerLoss`) still holds is
#: found here, also while torch.compile traces :func:`transducer_criterion` (which cannot build one)
_LIVE: Dict[tuple, tuple] = {}
_LIVE_LOCK = threading.RLock()  # reentrant: a criterion may die (and _forget run) inside an insert


def _forget(key: tuple, ref: weakref.ref) -> None:
    with _LIVE_LOCK:
        live = _LIVE.get(key)
        if live is not None and live[0] is ref:
            del _LIVE[key]


def transducer_criterion(
    tokens,
    graphemes_to_idx,
    ngram: int = 0,
    transitions: Optional[Graph] = None,
    blank: str = "none",
    allow_repeats: bool = True,
    decompositions: bool = True,
):
    """``(criterion, handle)`` for a configuration, cached (the last
    ``CRITERIA_CACHE_SIZE`` configurations): the numerator graphs of a configuration are
    built once per target across calls of :func:`transducer_loss` and
    :func:`transducer_best_paths` (and :class:`lightning_gtn.nn.TransducerLoss`, which passes its
    own transitions graph). A configuration is its arguments, the transitions graph by identity
    and version; the arguments are checked as :func:`transducer_loss` does.

    Returns:
        ``(TransducerCriterion, handle)``: the handle names the criterion in the loss op
        (:func:`lightning_gtn.core.criterion.register_criterion`)."""
    blank = check_blank(blank, allow_repeats)
    ngram = check_ngram(ngram)
    if ngram > 0 and transitions is not None:
        raise ValueError("pass ngram > 0 or transitions, not both (as in the research code)")
    if transitions is not None and not isinstance(transitions, Graph):
        raise ValueError(f"transitions must be a lightning_gtn.wfst.Graph, got {type(transitions).__name__}")
    tkey = None if transitions is None else (id(transitions), transitions.version)
    key: Optional[tuple]
    try:  # a cheap key first (hashable tokens and graphemes): the ids are made on a miss only
        key = (
            tuple(t if isinstance(t, str) else tuple(t) for t in tokens),
            tuple(graphemes_to_idx.items()) if isinstance(graphemes_to_idx, dict) else None,
            ngram,
            tkey,
            blank,
            bool(allow_repeats),
            bool(decompositions),
        )
        # no lock on a hit (atomic gets): torch.compile traces this function
        hit = _CRITERIA.peek(key)
        if hit is None:
            live = _LIVE.get(key)
            if live is not None:
                crit = live[0]()
                if crit is not None:
                    return crit, live[1]
    except TypeError:  # unhashable graphemes: checked (and reported) by token_ids
        key, hit = None, None
    if hit is not None:
        return hit[0], hit[1]
    toks, n_graph = token_ids(tokens, graphemes_to_idx)
    if key is None:
        key = (toks, n_graph, ngram, tkey, blank, bool(allow_repeats), bool(decompositions))
    return _new_criterion(key, toks, n_graph, ngram, transitions, blank, allow_repeats, decompositions)


def _new_criterion(key, toks, n_graph, ngram, transitions, blank, allow_repeats, decompositions):
    if ngram > 0:
        transitions = full_ngram_transitions(ngram, len(toks) + int(blank != "none"))
    crit = TransducerCriterion(toks, n_graph, blank, allow_repeats, decompositions, transitions)
    handle = criterion.register_criterion(crit)
    if _CRITERIA.maxsize != CRITERIA_CACHE_SIZE:
        _CRITERIA.resize(CRITERIA_CACHE_SIZE)
    _CRITERIA.put(key, (crit, handle, transitions))  # the graph is held: its id stays unique
    with _LIVE_LOCK:
        _LIVE[key] = (weakref.ref(crit, functools.partial(_forget, key)), handle)
    return crit, handle


def _check_num_classes(crit: TransducerCriterion, C: int, got: str) -> None:
    if C != crit.C:
        raise ValueError(
            f"emissions must have C = len(tokens) + (blank != 'none') = {crit.C} classes "
            f"(tokens, then the blank last), got {got}"
        )


def _check_classes(crit: TransducerCriterion, emissions: torch.Tensor) -> Tuple[int, int, int]:
    B, T, C = checks.check_emissions(emissions, "emissions")
    _check_num_classes(crit, C, f"shape {(B, T, C)}")
    return B, T, C


def _check_transition_params(
    crit: TransducerCriterion, transition_params: Optional[torch.Tensor], device: Optional[torch.device]
) -> None:
    """``transition_params`` must be ``(num_arcs,)`` floats (on ``device`` unless None) when the
    criterion has transitions, None otherwise."""
    if crit.denominator is not None:
        if (
            not isinstance(transition_params, torch.Tensor)
            or transition_params.numel() != crit.num_arcs
            or transition_params.dim() != 1
        ):
            got = (
                tuple(transition_params.shape)
                if isinstance(transition_params, torch.Tensor)
                else type(transition_params).__name__
            )
            raise ValueError(
                f"transition_params must be a tensor of shape (num_arcs,) = ({crit.num_arcs},) "
                f"(one weight per transitions arc), got {got}"
            )
        if not transition_params.is_floating_point():
            raise ValueError(f"transition_params must be a floating point tensor, got {transition_params.dtype}")
        if device is not None and transition_params.device != device:
            raise ValueError(f"transition_params is on {transition_params.device} but the emissions are on {device}")
    elif transition_params is not None:
        raise ValueError("transition_params is given but there are no transitions (ngram=0, transitions=None)")


def transducer_loss(
    emissions: torch.Tensor,
    targets,
    input_lengths=None,
    target_lengths=None,
    *,
    tokens: Sequence[Sequence],
    graphemes_to_idx: dict,
    ngram: int = 0,
    transitions: Optional[Graph] = None,
    transition_params: Optional[torch.Tensor] = None,
    blank: str = "none",
    allow_repeats: bool = True,
    decompositions: bool = True,
    reduction: str = "mean",
    zero_infinity: bool = False,
    impl: Optional[str] = None,
) -> torch.Tensor:
    """The word-piece transducer loss of gtn_applications' ``Transducer``, batch first.

    Loss of example ``b``: ``-log Z(E_b o A_b)``, or with transitions
    ``-(log Z(E_b o T o A_b) - log Z(E_b o T))``, where ``E_b`` is
    ``emissions[b, :input_lengths[b]]``, ``A_b`` accepts every frame labelling that reads, through
    the token graph (``blank``, ``allow_repeats``), as a decomposition of ``targets[b]`` into
    tokens, and ``T`` is the transitions acceptor with weights ``transition_params``. The
    emissions are used as given: the research module (and :class:`lightning_gtn.nn.TransducerLoss`)
    applies ``log_softmax`` first when there are no transitions. A ``torch.library`` custom op:
    works under ``torch.compile(fullgraph=True)``.

    Reductions are this library's: ``"none"`` -> ``(B,)``, ``"sum"``, ``"mean"`` (each loss
    divided by its target length, at least 1, then the batch mean). The research code's
    ``"mean"`` is the same; its ``"none"`` returns the batch mean of the raw losses, which is
    ``"sum"`` divided by ``B`` here.

    Args:
        emissions: ``(B, T, C)`` scores, ``C = len(tokens) + (blank != "none")``, the blank last.
            float32/float64; float16/bfloat16 are scored in float32.
        targets: grapheme ids (not token ids): padded ``(B, S)``, concatenated 1-D, or a list of
            B sequences, in ``[0, max(graphemes_to_idx.values()) + 1)``.
        input_lengths: ``(B,)`` frames per example (None: all ``T``).
        target_lengths: ``(B,)`` graphemes per example; needed with tensor targets.
        tokens: the token spellings (strings or sequences of graphemes), e.g. letters and word
            pieces.
        graphemes_to_idx: grapheme -> id.
        ngram: order of the learned transitions over frame labels (0: none); the graph is
            :func:`full_ngram_transitions` and ``transition_params`` holds one weight per arc.
        transitions: instead of ``ngram``, an acceptor over frame labels (epsilon arcs
            allowed; its own weights are ignored, ``transition_params`` gives them in arc id
            order).
        transition_params: ``(num_arcs,)`` weights of the transitions (required with them);
            receives a gradient when it requires one.
        blank: ``"none"``, ``"optional"`` or ``"forced"`` (a blank between tokens and at both
            ends).
        allow_repeats: False forbids a token right after itself without a blank (needs
            ``blank="optional"``).
        decompositions: False scores only :func:`segment`'s segmentation of each target.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        zero_infinity: infeasible examples (not spelled by the tokens, too few frames) give 0
            instead of ``inf``; their gradient is zero either way.
        impl: None, ``"numba"``, ``"numba_log"``, ``"torch"`` or ``"triton"``.

    Returns:
        A scalar, or ``(B,)`` for ``reduction="none"``, in the emissions' dtype and device.

    Example:
        >>> import torch
        >>> from lightning_gtn.functional import transducer_loss
        >>> g2i = {"a": 0, "b": 1}
        >>> lp = torch.randn(2, 6, 4).log_softmax(-1)  # tokens a, b, ab + blank
        >>> loss = transducer_loss(lp, [[0, 1], [1]], tokens=["a", "b", "ab"], graphemes_to_idx=g2i,
        ...                        blank="optional")
        >>> loss.shape
        torch.Size([])
    """
    crit, handle = transducer_criterion(
        tokens, graphemes_to_idx, ngram, transitions, blank, allow_repeats, decompositions
    )
    T = checks.check_emissions(emissions, "emissions")[1]
    if input_lengths is None:
        input_lengths = torch.full((emissions.shape[0],), T, dtype=torch.int64, device=emissions.device)
    return criterion.apply_loss(
        crit,
        emissions,
        targets,
        input_lengths,
        target_lengths,
        weights=transition_params,
        blank=-1,
        reduction=reduction,
        zero_infinity=zero_infinity,
        impl=impl,
    )


def transducer_best_paths(
    emissions: torch.Tensor,
    input_lengths=None,
    *,
    tokens: Sequence[Sequence],
    graphemes_to_idx: dict,
    ngram: int = 0,
    transitions: Optional[Graph] = None,
    transition_params: Optional[torch.Tensor] = None,
    blank: str = "none",
    allow_repeats: bool = True,
    decompositions: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The best frame label paths of the transducer's emissions: through the transitions
    acceptor ``T`` with weights ``transition_params`` (max semiring), or without transitions the
    per-frame argmax. The configuration arguments are :func:`transducer_loss`'s (the criterion
    is shared with it); not differentiable.

    Args:
        emissions: ``(B, T, C)`` scores, ``C = len(tokens) + (blank != "none")``, the blank last.
        input_lengths: ``(B,)`` frames per example (None: all ``T``).
        tokens, graphemes_to_idx, ngram, transitions, blank, allow_repeats, decompositions: as
            :func:`transducer_loss`.
        transition_params: ``(num_arcs,)`` weights of the transitions (required with them).

    Returns:
        ``(paths (B, T) int64 padded with -1, scores (B,))`` on the emissions' device, the
        scores in their dtype.

    Example:
        >>> import torch
        >>> from lightning_gtn.functional import transducer_best_paths
        >>> x = torch.tensor([[[0.0, 2.0, 0.0, 1.0], [3.0, 0.0, 0.0, 1.0]]])  # tokens a, b, ab + blank
        >>> paths, scores = transducer_best_paths(x, tokens=["a", "b", "ab"], graphemes_to_idx={"a": 0, "b": 1},
        ...                                       blank="optional")
        >>> paths.tolist()
        [[1, 0]]
    """
    crit, _ = transducer_criterion(tokens, graphemes_to_idx, ngram, transitions, blank, allow_repeats, decompositions)
    B, T, C = _check_classes(crit, emissions)
    _check_transition_params(crit, transition_params, None)
    il = torch.full((B,), T, dtype=torch.int64) if input_lengths is None else input_lengths
    lengths = checks.as_lengths(il, B, "input_lengths", emissions.device, max_value=T)
    with torch.no_grad():
        return crit.best_paths(emissions.detach(), lengths, transition_params)
