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
by :func:`transitions_graph`, or the user's).

Here ``A`` is built directly as arrays, once per distinct target (cached): the token lattice of
the target has ``L + 1`` nodes and one arc per (position, matching token), found through a trie
of the tokens, and the alignment acceptor has one node per lattice arc (the token being read),
one blank node per position and a start node. Its arcs are exactly those that GTN's ``remove``
leaves, so path multiplicities, and therefore scores and gradients, equal the research
code's. With transitions, ``A`` is intersected with ``T`` (a reachable-pairs product); every
product arc keeps the id of its transitions arc as its weight index, so the learned weights
reach the scored arcs through one gather, and the normaliser ``E o T`` is the transitions
graph itself with weight index = arc id. All examples of a batch are then scored by the
library's batched forward-backward programme (:mod:`._score`), inside the
``lightning_gtn::structured_loss`` custom op.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import wfst as _wfst
from ..core import checks, criterion
from ..core.best_path import best_paths_op, max_semiring_paths, refuse_nan
from ..core.scoring import Plan, normalised_plan, unique_graphs
from ..core.scoring import score as _score_plan_full
from ..kernels import dense_numba, dense_torch, transducer_hubs
from ..kernels.batch import CompiledGraph, compile_graph
from ..wfst import Graph


def _score_plan(plan, E, w, impl, need_e, w_coef):
    return _score_plan_full(plan, E, w, impl, False, need_e, w_coef)


def _combine(logz, num_loss, zero_infinity: bool):
    """``(losses, feasible mask, its float)`` of a dense normaliser and the numerators; no path
    through either (-inf + inf) is an infeasible row (inf), not NaN."""
    losses = logz + num_loss
    losses = torch.where((logz == -np.inf) & (num_loss == np.inf), torch.full_like(losses, np.inf), losses)
    ok = torch.isfinite(losses)
    if zero_infinity:
        losses = torch.where(ok, losses, torch.zeros_like(losses))
    return losses, ok, ok.to(logz.dtype)


def _is_research_bigram(crit, num_nodes: int) -> bool:
    """Whether the criterion's transitions arrays are exactly ``transitions_graph(2, C)``'s."""
    C = crit.C
    if num_nodes != C + 2 or crit.num_arcs != C + C * C + C + 1 or crit.t_start != [0]:
        return False
    if not (crit.t_accept[C + 1] and int(crit.t_accept.sum()) == 1):
        return False
    k = np.arange(C)
    a, b = np.divmod(np.arange(C * C), C)
    n = np.arange(C + 1)
    src = np.concatenate([np.zeros(C, np.int64), a + 1, n])
    dst = np.concatenate([k + 1, b + 1, np.full(C + 1, C + 1)])
    il = np.concatenate([k, b, np.full(C + 1, -1)])
    return bool(np.array_equal(crit.t_src, src) and np.array_equal(crit.t_dst, dst) and np.array_equal(crit.t_il, il))


__all__ = [
    "transducer_loss",
    "transitions_graph",
    "segment",
    "transducer_criterion",
    "TransducerCriterion",
    "BLANK_MODES",
]

#: the research code's ``blank`` options
BLANK_MODES = ("none", "optional", "forced")
#: at most this many arcs in an n-gram transitions graph (``C ** ngram`` and fewer)
MAX_TRANSITION_ARCS = 50_000_000
#: the bytes an n-gram transitions graph may cost, estimated at :data:`BYTES_PER_TRANSITION_ARC`
#: per arc (the graph, its compiled form and the scoring's buffers); raise it to allow more
MAX_TRANSITION_BYTES = 2 << 30
#: measured: about 350 bytes per arc to build the graph and its criterion, 250 more to score it
BYTES_PER_TRANSITION_ARC = 600


# ---------------------------------------------------------------------------
# the transitions graph and the segmentation
# ---------------------------------------------------------------------------


def transitions_graph(ngram: int, num_classes: int, calc_grad: bool = False) -> Graph:
    """The research code's n-gram transitions acceptor over ``num_classes`` frame labels.

    The same nodes and arcs, in the same creation order, as gtn_applications'
    ``make_transitions_graph``: node 0 (start) is the empty history; for ``n = 1 .. ngram - 1``
    one node per history of ``n`` labels, entered from its prefix; then for every
    ``ngram``-tuple an arc from the node of its first ``ngram - 1`` labels to the node of its
    last ``ngram - 1`` labels reading the last label; for ``ngram > 1`` a final accepting node
    entered from every other node by an epsilon arc (``ngram == 1``: node 0 accepts). So a
    parameter vector of ``num_arcs`` weights is interchangeable with the research code's.

    Args:
        ngram: the order, ``>= 1``.
        num_classes: ``C`` (tokens plus blank).
        calc_grad: the graph's ``calc_grad``.

    Returns:
        A :class:`lightning_gtn.wfst.Graph` with ``sum_{n=1..ngram} C ** n`` arcs (plus the end
        arcs).

    Example:
        >>> g = transitions_graph(2, 3)
        >>> g.num_nodes(), g.num_arcs()
        (5, 16)
    """
    ngram, C = _check_ngram(ngram, allow_zero=False), int(num_classes)
    if C < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    total = sum(C**n for n in range(1, ngram + 1))
    if total > MAX_TRANSITION_ARCS:
        raise ValueError(
            f"ngram={ngram} over {C} classes makes {total} arcs, more than "
            f"MAX_TRANSITION_ARCS={MAX_TRANSITION_ARCS}"
        )
    if total * BYTES_PER_TRANSITION_ARC > MAX_TRANSITION_BYTES:
        raise ValueError(
            f"ngram={ngram} over {C} classes makes {total} transition arcs, about "
            f"{total * BYTES_PER_TRANSITION_ARC / 2**30:.1f} GiB to build and score, more than "
            f"MAX_TRANSITION_BYTES={MAX_TRANSITION_BYTES} ({MAX_TRANSITION_BYTES / 2**30:.1f} GiB); use a "
            "smaller ngram or fewer tokens, or raise lightning_gtn.losses.transducer.MAX_TRANSITION_BYTES"
        )
    off = [0]  # first node of the histories of each length n
    for n in range(1, ngram):
        off.append(off[-1] + C ** (n - 1))
    srcs, dsts, labs = [], [], []
    for n in range(1, ngram):
        idx = np.arange(C**n, dtype=np.int64)
        srcs.append(off[n - 1] + idx // C)
        dsts.append(off[n] + idx)
        labs.append(idx % C)
    idx = np.arange(C**ngram, dtype=np.int64)
    srcs.append(off[ngram - 1] + idx // C)
    dsts.append(off[ngram - 1] + idx % (C ** (ngram - 1)))
    labs.append(idx % C)
    n_nodes = off[ngram - 1] + C ** (ngram - 1) if ngram > 1 else 1
    accept = [0]
    if ngram > 1:
        end = n_nodes
        n_nodes += 1
        srcs.append(np.arange(end, dtype=np.int64))
        dsts.append(np.full(end, end, dtype=np.int64))
        labs.append(np.full(end, _wfst.epsilon, dtype=np.int64))
        accept = [end]
    src, dst, lab = (np.concatenate(a).astype(np.int32) for a in (srcs, dsts, labs))
    return Graph.from_arrays(n_nodes, [0], accept, src, dst, lab, calc_grad=calc_grad)


class _Trie:
    """Tokens (sequences of hashable graphemes) in a trie: ``matches(seq, p)`` lists
    ``(end, token_id)`` of every token spelled by ``seq[p:end]``."""

    def __init__(self, tokens: Sequence[Sequence]) -> None:
        self.children: List[dict] = [{}]
        self.ends: List[List[int]] = [[]]
        for k, tok in enumerate(tokens):
            n = 0
            for gph in tok:
                nxt = self.children[n].get(gph)
                if nxt is None:
                    nxt = len(self.children)
                    self.children[n][gph] = nxt
                    self.children.append({})
                    self.ends.append([])
                n = nxt
            self.ends[n].append(k)

    def matches(self, seq: Sequence, p: int):
        out = []
        n = 0
        children, ends = self.children, self.ends
        for q in range(p, len(seq)):
            nxt = children[n].get(seq[q])
            if nxt is None:
                break
            n = nxt
            for k in ends[n]:
                out.append((q + 1, k))
        return out


def _lattice(seq: Sequence, trie: _Trie) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arcs ``(p, q, k)`` of the token lattice of ``seq`` that lie on a complete path,
    ordered by ``p`` (then by trie order)."""
    L = len(seq)
    reach = np.zeros(L + 1, dtype=bool)
    reach[0] = True
    arcs = []
    for p in range(L):
        if reach[p]:
            for q, k in trie.matches(seq, p):
                reach[q] = True
                arcs.append((p, q, k))
    if not arcs or not reach[L]:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    a = np.asarray(arcs, dtype=np.int64)
    co = np.zeros(L + 1, dtype=bool)  # co-reachable: a path to L
    co[L] = True
    keep = np.zeros(len(a), dtype=bool)
    for i in range(len(a) - 1, -1, -1):  # arcs are ordered by p, so q > p is settled first
        if co[a[i, 1]]:
            co[a[i, 0]] = True
            keep[i] = True
    a = a[keep]
    return a[:, 0], a[:, 1], a[:, 2]


def _best_segmentation(L: int, P: np.ndarray, Q: np.ndarray, K: np.ndarray) -> Optional[List[int]]:
    """Indices of the lattice arcs of the segmentation with the fewest tokens, ties broken by
    the longer first token (then recursively), then by the lower token id; None if none."""
    INF = 1 << 60
    best = [INF] * (L + 1)
    choice = [-1] * (L + 1)
    best[L] = 0
    order = np.lexsort((K, -(Q - P), -P))  # p descending, longer first, lower id first
    for i in order.tolist():
        p, q = int(P[i]), int(Q[i])
        c = best[q] + 1
        if c < best[p]:  # strict: the first of equal counts (the longest, lowest id) stays
            best[p] = c
            choice[p] = i
    if best[0] >= INF:
        return None
    out, p = [], 0
    while p < L:
        i = choice[p]
        out.append(i)
        p = int(Q[i])
    return out


def segment(graphemes: Sequence, tokens: Sequence[Sequence]) -> List[int]:
    """One segmentation of a grapheme sequence into tokens: the one with the fewest tokens,
    ties broken by the longer first token, then recursively (then the lower token id).

    The "no decompositions" baseline of the word-piece papers (``decompositions=False`` of
    :func:`transducer_loss`).

    Args:
        graphemes: the target, a sequence of graphemes (a string, or grapheme ids).
        tokens: the token spellings, each a sequence of graphemes of the same kind
            (strings, or tuples of ids).

    Returns:
        The token ids, whose spellings concatenate to ``graphemes``.

    Raises:
        ValueError: if the tokens cannot spell ``graphemes``.

    Example:
        >>> segment("hello", ["h", "e", "l", "o", "he", "ll", "hell"])
        [6, 3]
    """
    seq = list(graphemes)
    P, Q, K = _lattice(seq, _Trie([list(t) for t in tokens]))
    seg = _best_segmentation(len(seq), P, Q, K) if len(P) or not seq else None
    if seg is None:
        raise ValueError(f"graphemes: {graphemes!r} cannot be spelled by the tokens")
    return [int(K[i]) for i in seg]


# ---------------------------------------------------------------------------
# the criterion
# ---------------------------------------------------------------------------


def _check_ngram(ngram, allow_zero: bool = True) -> int:
    lo = 0 if allow_zero else 1
    if isinstance(ngram, bool) or not isinstance(ngram, (int, np.integer)) or ngram < lo:
        raise ValueError(f"ngram must be an integer >= {lo}, got {ngram!r}")
    return int(ngram)


def _check_blank(blank, allow_repeats) -> str:
    if not isinstance(blank, str) or blank not in BLANK_MODES:
        raise ValueError(f"blank must be one of {BLANK_MODES}, got {blank!r}")
    if not allow_repeats and blank != "optional":
        raise ValueError(
            "allow_repeats=False needs blank='optional' (as in the research code), " f"got blank={blank!r}"
        )
    return blank


def token_ids(tokens, graphemes_to_idx) -> Tuple[Tuple[Tuple[int, ...], ...], int]:
    """``tokens`` as tuples of grapheme ids, and the number of graphemes (max id + 1)."""
    if not isinstance(graphemes_to_idx, dict) or not graphemes_to_idx:
        raise ValueError("graphemes_to_idx must be a non-empty dict grapheme -> integer id")
    for gph, i in graphemes_to_idx.items():
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i < 0:
            raise ValueError(f"graphemes_to_idx[{gph!r}] must be an integer id >= 0, got {i!r}")
    if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__iter__"):
        raise ValueError(f"tokens must be a list of grapheme sequences, got {type(tokens).__name__}")
    out = []
    for k, tok in enumerate(tokens):
        try:
            spelled = list(tok)
        except TypeError:
            raise ValueError(f"tokens[{k}] must be a sequence of graphemes, got {tok!r}") from None
        if not spelled:
            raise ValueError(f"tokens[{k}] is empty; every token spells at least one grapheme")
        ids = []
        for gph in spelled:
            try:
                ids.append(int(graphemes_to_idx[gph]))
            except (KeyError, TypeError):
                raise ValueError(f"tokens[{k}] = {tok!r}: grapheme {gph!r} is not in graphemes_to_idx") from None
        out.append(tuple(ids))
    if not out:
        raise ValueError("tokens must hold at least one token")
    return tuple(out), int(max(graphemes_to_idx.values())) + 1


class TransducerCriterion(criterion.Criterion):
    """The transducer's graphs for one configuration: numerators cached per target.

    Args:
        tokens: token spellings as tuples of grapheme ids.
        num_graphemes: targets lie in ``[0, num_graphemes)``.
        blank: ``"none"``, ``"optional"`` or ``"forced"``.
        allow_repeats: the research code's option.
        decompositions: all token decompositions of a target (True) or :func:`segment`'s one.
        transitions: an acceptor over the ``C`` frame labels (epsilon arcs allowed, no epsilon
            cycle), or None.
        cache_size: compiled numerator graphs kept (least recently used dropped first).
    """

    def __init__(
        self,
        tokens,
        num_graphemes: int,
        blank: str = "none",
        allow_repeats: bool = True,
        decompositions: bool = True,
        transitions: Optional[Graph] = None,
        cache_size: int = 4096,
    ):
        self.tokens = tuple(tuple(int(g) for g in t) for t in tokens)
        self.num_graphemes = int(num_graphemes)
        self.blank_mode = _check_blank(blank, allow_repeats)
        self.allow_repeats = bool(allow_repeats)
        self.decompositions = bool(decompositions)
        self.num_tokens = len(self.tokens)
        self.C = self.num_tokens + int(blank != "none")
        self.trie = _Trie(self.tokens)
        self.cache_size = int(cache_size)
        self.cache: "OrderedDict[Hashable, CompiledGraph]" = OrderedDict()
        self.lat_cache: "OrderedDict[Hashable, tuple]" = OrderedDict()  # lattices of the hub kernel
        self.lock = threading.Lock()
        self.transitions = transitions
        self.denominator: Optional[CompiledGraph] = None
        if transitions is not None:
            a = transitions.arrays()
            il = np.asarray(a.ilabel, dtype=np.int64)
            if len(il) and (il.max() >= self.C or il.min() < -1):
                bad = int(il.max()) if il.max() >= self.C else int(il.min())
                raise ValueError(
                    f"transitions: label {bad} out of range; arcs read frame labels in [0, C) "
                    f"with C={self.C} (tokens plus blank) or epsilon"
                )
            self.num_arcs = len(il)
            self.t_src = np.asarray(a.src, dtype=np.int64)
            self.t_dst = np.asarray(a.dst, dtype=np.int64)
            self.t_il = il
            self.t_start = [int(s) for s in a.start]
            acc = np.zeros(a.num_nodes, dtype=bool)
            acc[np.asarray(a.accept, dtype=np.int64)] = True
            self.t_accept = acc
            order = np.lexsort((np.arange(len(il)), il, self.t_src))
            self.t_order = order
            self.t_off = np.searchsorted(self.t_src[order], np.arange(a.num_nodes + 1))
            self.t_nodes: Dict[int, tuple] = {}
            self.t_dst_list = self.t_dst.tolist()
            g = Graph.from_arrays(a.num_nodes, a.start, a.accept, a.src, a.dst, a.ilabel, calc_grad=False)
            self.denominator = compile_graph(g, np.arange(self.num_arcs, dtype=np.int64))
        else:
            self.num_arcs = 0
        # the unigram graph (one start and accept node, one self-loop per label in label order):
        # its normaliser is dense
        self.dense_unigram = (
            transitions is not None
            and self.num_arcs == self.C
            and transitions.num_nodes() == 1
            and bool(self.t_accept[0])
            and self.t_start == [0]
            and np.array_equal(self.t_il, np.arange(self.C))
        )
        # the research bigram graph (``transitions_graph(2, C)``): its normaliser is ASG's fully
        # connected recursion with start weights, plus end weights, scored by :mod:`._asg_dense`
        # where ASG's is (see ``dense_torch.use_dense``)
        self.research_bigram = transitions is not None and _is_research_bigram(self, transitions.num_nodes())
        # the plain numerators can be scored through their hubs (:mod:`._hub_numba`) on the CPU
        self.hub_ok = self.blank_mode != "optional" or self.allow_repeats

    # -- the Criterion interface -------------------------------------------------
    def target_classes(self, C: int) -> int:
        """Targets are grapheme ids: ``[0, num_graphemes)`` whatever ``C``."""
        return self.num_graphemes

    def plan(self, seqs, lengths, C, blank):
        """The plan of a batch of grapheme targets (see :meth:`Criterion.plan`).

        Raises ``ValueError`` when ``C`` is not the number of emission classes of the tokens.
        """
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
        :meth:`_unigram_folded`) instead of arc by arc, the research bigram's by :mod:`._asg_dense`;
        on the CPU the plain numerators go through their hubs (:mod:`._hub_numba`)."""
        if (
            self.research_bigram
            and dense_torch.use_dense(self.C, E.device)
            and E.shape[1] > 0
            and bool((lengths > 0).all())
        ):
            return self._bigram_score(E, weights, seqs, lengths, impl, zero_infinity, need_e, w_coef)
        if self.transitions is None and self._use_hub(E, impl):
            num_loss, gE, _ = self._hub_numerators(E, seqs, lengths, impl, need_e, None)
            ok = torch.isfinite(num_loss)
            if not bool(ok.all()):
                if zero_infinity:
                    num_loss = torch.where(ok, num_loss, torch.zeros_like(num_loss))
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
        (:func:`._dense_numba.unigram_pass`) give the same losses; ``d/dE = d/d(E + w)``, and
        ``d/dw[c]`` sums the occupancies of label ``c``: the numerators' arcs reading it and the
        normaliser's softmax. The normaliser's softmax buffer receives the numerators' gradient."""
        need_w = w_coef is not None
        need = need_e or need_w
        w = weights.detach().reshape(-1).to(E.dtype)
        coef = None if w_coef is None else w_coef.to(E.dtype)
        if need:  # (log Z, softmax sums, softmax buffer)
            logz, psum, buf = dense_numba.unigram_pass(E, w, lengths, new_buffer=True)
        else:
            logz, psum, buf = dense_numba.unigram_pass(E, w, lengths)[0], None, None
        if self._use_hub(E, impl):
            num_loss, _, gw_lab = self._hub_numerators(E, seqs, lengths, impl, need_e, coef, w=w, gE=buf)
        else:
            num_loss, gE_n, gw_lab = self._plain_numerators(E, seqs, lengths, impl, need_e, coef, w=w)
            if gE_n is not None:
                buf.add_(gE_n)
        losses, ok, okf = _combine(logz.to(E.dtype), num_loss, zero_infinity)
        gE = gW = None
        if need:
            bad = ~ok
            if bool(bad.any()):  # infeasible rows: no gradient from either part
                buf[bad] = 0
                psum[bad] = 0
            if coef is not None:  # need_w; the numerators of infeasible rows have zero occupancies already
                gW = (torch.mv(psum.t(), coef.to(psum.dtype)).to(E.dtype) + gw_lab).reshape(weights.shape)
            if need_e:
                gE = buf
        return losses, gE, gW

    def _plain_numerators(self, E, seqs, lengths, impl, need_e, coef, w=None):
        """``(-log Z, d/dE or None, sum_b coef[b] * d/dw by label (C,) or None)`` of the plain
        numerators of ``seqs`` against ``E + w`` by the graph kernels (any device)."""
        n = len(seqs)
        graphs, ids = unique_graphs([self.numerator(s, plain=True) for s in seqs])
        plan = Plan(graphs, ids, np.arange(n), lengths, -np.ones(n), n)
        x = E.detach() if w is None else E.detach() + w
        zero_w = torch.zeros(plan.batch.num_arcs, dtype=E.dtype, device=E.device)
        losses, gE, gw = _score_plan(plan, x.contiguous(), zero_w, impl, need_e, coef)
        gw_lab = None
        if gw is not None:
            labels = torch.from_numpy(plan.batch.label.astype(np.int64)).to(E.device)
            gw_lab = torch.zeros(E.shape[2], dtype=E.dtype, device=E.device).index_add_(0, labels, gw.to(E.dtype))
        return losses, gE, gw_lab

    def _use_hub(self, E, impl) -> bool:
        return self.hub_ok and impl == "numba" and E.device.type == "cpu"

    def _lattice_arrays(self, target) -> tuple:
        """``(P, Q, K, L)`` of ``target``'s lattice as the hub kernel reads them (cached)."""
        key = tuple(int(t) for t in target)
        with self.lock:
            hit = self.lat_cache.get(key)
            if hit is not None:
                self.lat_cache.move_to_end(key)
                return hit
        P, Q, K = self.lattice(key)
        hit = (np.asarray(P, np.int64), np.asarray(Q, np.int64), np.asarray(K, np.int64), len(key))
        with self.lock:
            self.lat_cache[key] = hit
            while len(self.lat_cache) > self.cache_size:
                self.lat_cache.popitem(last=False)
        return hit

    def _hub_numerators(self, E, seqs, lengths, impl, need_e, coef, w=None, gE=None):
        """``(-log Z (B,), d/dE or None, sum_b coef[b] * label occupancies (C,) or None)`` of the
        plain numerators against ``E + w`` by :mod:`._hub_numba` (the emission gradient added
        into ``gE`` when given); rows it cannot vouch for take the graph kernels."""
        B, T, C = E.shape
        need_l = coef is not None
        logz, flag, gE, lsum = transducer_hubs.numerators(
            E,
            [self._lattice_arrays(s) for s in seqs],
            lengths,
            self.blank_mode,
            self.num_tokens,
            need_e,
            need_l,
            w=w,
            gE=gE,
        )
        losses = torch.from_numpy(-logz).to(E.dtype)
        gw_lab = None
        if need_l:
            # the loss is -log Z: its gradient is minus the occupancies
            gw_lab = torch.from_numpy(-(lsum.T @ coef.detach().cpu().numpy().astype(np.float64))).to(E.dtype)
        redo = np.nonzero(flag)[0]
        if len(redo):
            sub = torch.from_numpy(redo)
            l2, g2, gw2 = self._plain_numerators(
                E[sub], [seqs[i] for i in redo], lengths[redo], impl, need_e, None if coef is None else coef[sub], w=w
            )
            losses[sub] = l2
            if need_e:
                gE[sub] += g2
            if need_l:
                gw_lab += gw2
        return losses, gE, gw_lab

    def _numerator_scores(self, E, weights, seqs, lengths, impl, need_e, w_coef, bigram: bool = False):
        """``(weight index, weights, -log Z, grad_E, grad_w)`` of the batch's numerator graphs
        (the dense normalisers add their own terms; ``bigram``: see :meth:`numerator`)."""
        B, T, C = E.shape
        if C != self.C:
            raise ValueError(f"emissions must have C = len(tokens) + (blank != 'none') = {self.C} classes, got {C}")
        graphs, ids = unique_graphs([self.numerator(s, bigram=bigram) for s in seqs])
        plan = Plan(graphs, ids, np.arange(B), lengths, -np.ones(B), B)
        widx = torch.from_numpy(plan.batch.weight_index()).to(E.device)
        w = weights.detach().reshape(-1).to(E.dtype)
        t_coef = None if w_coef is None else w_coef.to(E.dtype)
        return (widx, w) + tuple(_score_plan(plan, E, w[widx], impl, need_e, t_coef))

    def _bigram_score(self, E, weights, seqs, lengths, impl, zero_infinity, need_e, w_coef):
        """The research bigram's normaliser by :mod:`._asg_dense`: its arcs are ASG's start row
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
        widx, w, num_loss, gE_n, gw_n = self._numerator_scores(
            x, weights, seqs, lengths, impl, need_e or need_w, w_coef, bigram=True
        )
        logz, gE_f, parts = dense_torch._full_pass(x, trans, lengths, need_e or need_w)
        losses, ok, okf = _combine(logz, num_loss, zero_infinity)
        gE = gW = None
        if need_w:  # first: it reads the full graph's occupancies gE_f
            c = w_coef.to(E.dtype) * okf
            gT = dense_torch._transition_grad(gE_f, parts, c)
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

    # -- graphs -----------------------------------------------------------------
    def numerator(self, target, plain: bool = False, bigram: bool = False) -> CompiledGraph:
        """The compiled numerator graph of ``target`` (cached): the alignment acceptor, times the
        transitions unless ``plain``; with ``bigram`` (research bigram transitions only) the
        alignment acceptor whose arcs index the start and label-after-label weights directly (its
        nodes read one label each, so the bigram state is the source node's label) and without
        the end weights' epsilon arcs (the caller adds them to the last frame)."""
        key: tuple = tuple(int(t) for t in target)
        if plain and self.transitions is not None:
            key = ("plain",) + key
        elif bigram:
            key = ("bigram",) + key
        with self.lock:
            cg = self.cache.get(key)
            if cg is not None:
                self.cache.move_to_end(key)
                return cg
        cg = self._build(key)
        with self.lock:
            self.cache[key] = cg
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        return cg

    def _build(self, key: tuple) -> CompiledGraph:
        kind = key[0] if key and isinstance(key[0], str) else None
        target = key[1:] if kind else key
        n, start, accept, src, dst, lab = self.alignment(target)
        widx = None
        if kind == "bigram":
            node_lab = np.full(n, -1, dtype=np.int64)  # the label each node reads (none for the start)
            node_lab[dst] = lab
            widx = np.where(src == 0, lab, self.C + node_lab[src] * self.C + lab)
        elif self.transitions is not None and kind != "plain":
            n, start, accept, src, dst, lab, widx = self._product(n, accept, src, dst, lab)
        g = Graph.from_arrays(n, start, accept, src, dst, lab, calc_grad=False)
        return compile_graph(g, widx)

    def lattice(self, target: Sequence[int]):
        """``(P, Q, K)``: the token lattice arcs of ``target`` used by the loss (all
        decompositions, or the one of :func:`segment`)."""
        P, Q, K = _lattice(list(target), self.trie)
        if not self.decompositions and len(P):
            seg = _best_segmentation(len(target), P, Q, K)
            idx = np.asarray(seg, dtype=np.int64)
            P, Q, K = P[idx], Q[idx], K[idx]
        return P, Q, K

    def alignment(self, target: Sequence[int]):
        """The frame-level alignment acceptor of ``target`` as arrays
        ``(num_nodes, start, accept, src, dst, label)``; no epsilon arcs.

        Node 0 is the start (token graph node 0 at lattice position 0), node ``1 + i`` reads
        lattice arc ``i``'s token, node ``1 + nA + p`` is the blank at position ``p``. Arcs are
        what ``remove(tokens o lattice)`` keeps: from the start, from each blank node and
        (repeats allowed) from each token node, the arcs of the position's hub (enter a token
        starting there, or the blank).
        """
        L = len(target)
        P, Q, K = self.lattice(target)
        nA = len(P)
        if L > 0 and nA == 0:  # not spelled by the tokens: no path
            return 1, [0], [], *(np.zeros(0, np.int64),) * 3
        mode, reps = self.blank_mode, self.allow_repeats
        has_blank = mode != "none"
        blank_lab = self.num_tokens
        off = np.searchsorted(P, np.arange(L + 2))  # lattice arcs by source position
        tok_node = 1 + np.arange(nA, dtype=np.int64)
        bl_node = 1 + nA + np.arange(L + 1, dtype=np.int64)
        n_nodes = 1 + nA + (L + 1 if has_blank else 0)
        src_l, dst_l, lab_l = [], [], []

        def hub_tokens(srcs: np.ndarray, pos: np.ndarray, exclude: Optional[np.ndarray] = None):
            cnt = off[pos + 1] - off[pos]
            s = np.repeat(srcs, cnt)
            first = np.repeat(off[pos] - (np.cumsum(cnt) - cnt), cnt)
            arc = first + np.arange(int(cnt.sum()))
            lab = K[arc]
            d = tok_node[arc]
            if exclude is not None:
                keep = lab != np.repeat(exclude, cnt)
                s, d, lab = s[keep], d[keep], lab[keep]
            src_l.append(s)
            dst_l.append(d)
            lab_l.append(lab)

        def hub_blank(srcs: np.ndarray, pos: np.ndarray):
            src_l.append(srcs)
            dst_l.append(bl_node[pos])
            lab_l.append(np.full(len(srcs), blank_lab, dtype=np.int64))

        zero = np.zeros(1, dtype=np.int64)
        positions = np.arange(L + 1, dtype=np.int64)
        # the start node
        if mode != "forced":
            hub_tokens(zero, zero)
        if has_blank:
            hub_blank(zero, zero)
        # token nodes: the self-loop, then the arcs after the token
        src_l.append(tok_node)
        dst_l.append(tok_node)
        lab_l.append(K)
        if mode == "none":
            hub_tokens(tok_node, Q)
        elif mode == "optional":
            hub_blank(tok_node, Q)
            hub_tokens(tok_node, Q, None if reps else K)
        else:  # forced: a token is always followed by a blank
            hub_blank(tok_node, Q)
        if has_blank:  # blank nodes: their position's hub (loop through the blank, or a token)
            hub_blank(bl_node, positions)
            hub_tokens(bl_node, positions)
        src = np.concatenate(src_l)
        dst = np.concatenate(dst_l)
        lab = np.concatenate(lab_l)
        accept = [0] if L == 0 else []  # token graph node 0 at the end of the lattice
        if mode != "forced":
            accept.extend(tok_node[Q == L].tolist())
        if has_blank:
            accept.append(int(bl_node[L]))
        return n_nodes, [0], accept, src, dst, lab

    def _t_node(self, v: int):
        """``(label -> transitions arc ids, epsilon arc ids)`` out of transitions node ``v``."""
        hit = self.t_nodes.get(v)
        if hit is None:
            arcs = self.t_order[self.t_off[v] : self.t_off[v + 1]]
            by_label: Dict[int, list] = {}
            eps = []
            for e, lab in zip(arcs.tolist(), self.t_il[arcs].tolist()):
                if lab < 0:
                    eps.append(e)
                else:
                    by_label.setdefault(lab, []).append(e)
            hit = self.t_nodes[v] = (by_label, eps)
        return hit

    def _product(self, n_a: int, accept_a, src_a, dst_a, lab_a):
        """``alignment o transitions`` over the reachable pairs; weight index = the
        transitions arc of each arc (epsilon arcs of the transitions keep the alignment node)."""
        order = np.argsort(src_a, kind="stable")
        a_off = np.searchsorted(src_a[order], np.arange(n_a + 1)).tolist()
        a_dst = dst_a[order].tolist()
        a_lab = lab_a[order].tolist()
        acc_a = np.zeros(n_a, dtype=bool)
        acc_a[np.asarray(accept_a, dtype=np.int64)] = True
        t_dst = self.t_dst_list
        ids: Dict[tuple, int] = {}
        pairs: List[tuple] = []
        src, dst, lab, widx = [], [], [], []

        def node(u, v):
            i = ids.get((u, v))
            if i is None:
                i = ids[(u, v)] = len(pairs)
                pairs.append((u, v))
            return i

        for s in self.t_start:
            node(0, s)
        head = 0
        while head < len(pairs):
            u, v = pairs[head]
            me = head
            head += 1
            by_label, eps = self._t_node(v)
            for j in range(a_off[u], a_off[u + 1]):
                es = by_label.get(a_lab[j])
                if es:
                    u2 = a_dst[j]
                    for e in es:
                        src.append(me)
                        dst.append(node(u2, t_dst[e]))
                        lab.append(a_lab[j])
                        widx.append(e)
            for e in eps:
                src.append(me)
                dst.append(node(u, t_dst[e]))
                lab.append(-1)
                widx.append(e)
        accept = [i for i, (u, v) in enumerate(pairs) if acc_a[u] and self.t_accept[v]]
        start = list(range(len(self.t_start)))
        return (
            len(pairs),
            start,
            accept,
            np.asarray(src, np.int64),
            np.asarray(dst, np.int64),
            np.asarray(lab, np.int64),
            np.asarray(widx, np.int64),
        )

    # -- decoding ---------------------------------------------------------------
    def best_paths(self, emissions: torch.Tensor, lengths: np.ndarray, params: Optional[torch.Tensor]):
        """``(paths (B, T), scores (B,))``: the best frame paths through the transitions
        (per-frame argmax without them), on the host, padded with -1."""
        B, T, C = emissions.shape
        refuse_nan(emissions, lengths, params, "transition_params")
        if self.denominator is None:
            return best_paths_op(emissions.detach(), None, torch.from_numpy(lengths))
        x = emissions.detach().to("cpu", checks.compute_dtype(emissions)).contiguous()
        plan = Plan([self.denominator], np.zeros(B, dtype=np.int64), np.arange(B), lengths, np.ones(B), B)
        # params come with the transitions, hence with a denominator
        w = params.detach().to("cpu", x.dtype).reshape(-1)  # type: ignore[union-attr]
        paths, scores = max_semiring_paths(x, plan, w.contiguous(), T)
        return paths.to(emissions.device), scores.to(device=emissions.device, dtype=emissions.dtype)


_CRITERIA: "OrderedDict[Hashable, tuple]" = OrderedDict()
_CRITERIA_LOCK = threading.Lock()
CRITERIA_CACHE_SIZE = 16


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
    built once per target across calls of :func:`transducer_loss`."""
    blank = _check_blank(blank, allow_repeats)
    ngram = _check_ngram(ngram)
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
        hit = _CRITERIA.get(key)  # no lock on a hit (an atomic get): torch.compile traces this function
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
        transitions = transitions_graph(ngram, len(toks) + int(blank != "none"))
    crit = TransducerCriterion(toks, n_graph, blank, allow_repeats, decompositions, transitions)
    handle = criterion.register_criterion(crit)
    with _CRITERIA_LOCK:
        _CRITERIA[key] = (crit, handle, transitions)  # the graph is held: its id stays unique
        while len(_CRITERIA) > CRITERIA_CACHE_SIZE:
            _CRITERIA.popitem(last=False)
    return crit, handle


def apply_criterion(
    crit: TransducerCriterion,
    handle: int,
    emissions: torch.Tensor,
    targets,
    input_lengths,
    target_lengths,
    transition_params: Optional[torch.Tensor],
    reduction: str,
    zero_infinity: bool,
    impl: Optional[str],
) -> torch.Tensor:
    """Checks the call's arguments and runs the loss op (shared by the function and module)."""
    B, T, C = checks.check_emissions(emissions, "emissions")
    checks.check_reduction(reduction)
    checks.check_impl(impl)
    if impl == "gtn":
        raise ValueError(
            "impl='gtn' is not offered for the transducer loss; use None, 'numba', 'numba_log', " "'torch' or 'triton'"
        )
    if C != crit.C:
        raise ValueError(
            f"emissions must have C = len(tokens) + (blank != 'none') = {crit.C} classes "
            f"(tokens, then the blank last), got shape {(B, T, C)}"
        )
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
        if transition_params.device != emissions.device:
            raise ValueError(
                f"transition_params is on {transition_params.device} but the emissions are on " f"{emissions.device}"
            )
    elif transition_params is not None:
        raise ValueError("transition_params is given but there are no transitions (ngram=0, transitions=None)")
    tg, tl = checks.targets_tensors(targets, target_lengths, B, emissions.device)
    if input_lengths is None:
        il = torch.full((B,), T, dtype=torch.int64, device=emissions.device)
    else:
        il = checks.int_tensor(input_lengths, "input_lengths")
    return criterion.structured_loss(
        emissions,
        transition_params,
        tg,
        il,
        tl,
        kind="handle",
        blank=-1,
        handle=handle,
        reduction=reduction,
        zero_infinity=zero_infinity,
        impl=impl,
    )


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
            :func:`transitions_graph` and ``transition_params`` holds one weight per arc.
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
    return apply_criterion(
        crit,
        handle,
        emissions,
        targets,
        input_lengths,
        target_lengths,
        transition_params,
        reduction,
        zero_infinity,
        impl,
    )
