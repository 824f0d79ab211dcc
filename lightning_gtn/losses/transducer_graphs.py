"""The transducer's graphs: the research n-gram transitions graph, token lattices and
segmentations, and the alignment acceptors a :class:`TransducerGraphs` builds (and caches) per
target, alone or times the transitions.

The alignment acceptor of a target is ``project_input(remove(tokens o project_output(target o
lexicon)))`` of gtn_applications' ``Transducer``, built directly as arrays: the token lattice of
the target has ``L + 1`` nodes and one arc per (position, matching token), found through a trie
of the tokens, and the acceptor has one node per lattice arc (the token being read), one blank
node per position and a start node. Its arcs are exactly those that GTN's ``remove`` leaves, so
path multiplicities, and therefore scores and gradients, equal the research code's. With
transitions, it is intersected with them (a reachable-pairs product); every product arc keeps
the id of its transitions arc as its weight index, so the learned weights reach the scored arcs
through one gather, and the normaliser is the transitions graph itself with weight index = arc
id.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import wfst as _wfst
from ..core.cache import LRU
from ..core.checks import BLANK_MODES, check_blank, check_ngram, token_ids
from ..kernels.compiled_graphs import CompiledGraph, compile_graph
from ..wfst import Graph

__all__ = [
    "BLANK_MODES",
    "MAX_TRANSITION_ARCS",
    "MAX_TRANSITION_BYTES",
    "BYTES_PER_TRANSITION_ARC",
    "full_ngram_transitions",
    "segment",
    "check_blank",
    "check_ngram",
    "token_ids",
    "is_research_bigram",
    "TransducerGraphs",
]

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


def full_ngram_transitions(ngram: int, num_classes: int, calc_grad: bool = False) -> Graph:
    """The research code's n-gram transitions acceptor over ``num_classes`` frame labels.

    The same nodes and arcs, in the same creation order, as gtn_applications'
    ``make_transitions_graph``: node 0 (start) is the empty history; for ``n = 1 .. ngram - 1``
    one node per history of ``n`` labels, entered from its prefix; then for every
    ``ngram``-tuple an arc from the node of its first ``ngram - 1`` labels to the node of its
    last ``ngram - 1`` labels reading the last label; for ``ngram > 1`` a final accepting node
    entered from every other node by an epsilon arc (``ngram == 1``: node 0 accepts). So a
    parameter vector of ``num_arcs`` weights is interchangeable with the research code's.

    Every history of every length is a node and every ``ngram``-tuple an arc (``C ** ngram`` of
    them): not to be confused with :func:`lightning_gtn.wfst.ngram.transitions_graph`, an n-gram
    estimated from data, which keeps only the histories seen.

    Args:
        ngram: the order, ``>= 1``.
        num_classes: ``C`` (tokens plus blank).
        calc_grad: the graph's ``calc_grad``.

    Returns:
        A :class:`lightning_gtn.wfst.Graph` with ``sum_{n=1..ngram} C ** n`` arcs (plus the end
        arcs).

    Example:
        >>> g = full_ngram_transitions(2, 3)
        >>> g.num_nodes(), g.num_arcs()
        (5, 16)
    """
    ngram, C = check_ngram(ngram, allow_zero=False), int(num_classes)
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
            "smaller ngram or fewer tokens, or raise lightning_gtn.losses.transducer_graphs.MAX_TRANSITION_BYTES"
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
    :func:`~lightning_gtn.losses.transducer.transducer_loss`).

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


def is_research_bigram(crit: "TransducerGraphs", num_nodes: int) -> bool:
    """Whether the transitions arrays of ``crit`` are exactly ``full_ngram_transitions(2, C)``'s."""
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


# ---------------------------------------------------------------------------
# the graphs of one configuration
# ---------------------------------------------------------------------------


class TransducerGraphs:
    """The transducer's graphs for one configuration: the transitions (arrays and the compiled
    normaliser) and the numerators, built and cached per target.

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
        self.blank_mode = check_blank(blank, allow_repeats)
        self.allow_repeats = bool(allow_repeats)
        self.decompositions = bool(decompositions)
        self.num_tokens = len(self.tokens)
        self.C = self.num_tokens + int(blank != "none")
        self.trie = _Trie(self.tokens)
        self.cache_size = int(cache_size)
        self.cache: LRU[CompiledGraph] = LRU(self.cache_size)
        self.lat_cache: LRU[tuple] = LRU(self.cache_size)  # lattices of the hub kernel
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
        # the research bigram graph (``full_ngram_transitions(2, C)``): its normaliser is ASG's
        # fully connected recursion with start weights, plus end weights
        self.research_bigram = transitions is not None and is_research_bigram(self, transitions.num_nodes())

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
        return self.cache.get(key, lambda: self._build(key))

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

    def lattice_arrays(self, target) -> tuple:
        """``(P, Q, K, L)`` of ``target``'s lattice as the hub kernel reads them (cached)."""
        key = tuple(int(t) for t in target)

        def make():
            P, Q, K = self.lattice(key)
            return (np.asarray(P, np.int64), np.asarray(Q, np.int64), np.asarray(K, np.int64), len(key))

        return self.lat_cache.get(key, make)

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
