"""A graph shared by a whole batch (LF-MMI's denominator), compiled for the shared-graph kernels.

:func:`compile_shared` turns an epsilon-free acceptor (:class:`lightning_gtn.wfst.Graph`) into a
:class:`SharedGraph`: flat arrays sorted the way the batched recursion of
:mod:`lightning_gtn.kernels.mmi_numba` reads them. Arcs are grouped by ``(destination, label)``
(a *group*: every arc of it is multiplied by the same emission, so the forward pass adds the
arcs' contributions first and multiplies by the emission once per group), groups are sorted by
destination (CSR: the groups entering state ``d`` are ``state_off[d]:state_off[d + 1]``), and a
second copy of the arcs is sorted by source (CSR: ``src_off``) for the backward pass.

:func:`shared_graph` caches the compiled form by graph identity and :attr:`Graph.version`: the
same, unchanged graph compiles once; a changed graph (new arcs, new weights) compiles again.

Checks (ValueError naming the graph): no epsilon arc (every arc of a denominator consumes one
frame), labels ``>= 0`` (checked against the emissions' ``C`` by :meth:`SharedGraph.check_classes`),
finite weights, at most :data:`MAX_STATES` states and :data:`MAX_ARCS` arcs.
"""

from __future__ import annotations

import threading
import weakref
from typing import Dict, Optional

import numpy as np

from ..wfst import Graph
from .cache import LRU

__all__ = ["SharedGraph", "compile_shared", "shared_graph", "MAX_STATES", "MAX_ARCS", "LEAK_ITERATIONS"]

#: the most states and arcs a shared graph may have (the kernels' buffers scale with them)
MAX_STATES = 1 << 22
MAX_ARCS = 1 << 26
#: frames of the graph's own walk averaged into the leaky-HMM distribution (as Kaldi's chain code)
LEAK_ITERATIONS = 100

_I32 = np.int32


class SharedGraph:
    """An epsilon-free acceptor as the arrays of the shared-graph recursion.

    Arc probabilities are ``exp(w - shift)`` with ``shift`` the largest arc weight: every path
    has exactly one arc per frame, so ``log Z = log Z(shifted) + T * shift``.

    Attributes:
        num_states, num_arcs, num_groups: sizes (``S``, ``A``, ``G``).
        max_label: the largest arc label (-1 for no arcs).
        start, accept: ``(num_start,)`` / ``(num_accept,)`` int32 state ids.
        shift: float, the largest arc weight (0 without arcs).
        group_dst, group_label: ``(G,)`` int32, sorted by destination then label.
        state_off: ``(S + 1,)`` int32, the groups entering each state.
        group_off: ``(G + 1,)`` int32, the arcs of each group in the forward arc order.
        fwd_src: ``(A,)`` int32, source state of each arc in forward (group) order.
        fwd_prob: ``(A,)`` float64, its probability ``exp(w - shift)``.
        fwd_arc: ``(A,)`` int32, its id in the original graph.
        src_off: ``(S + 1,)`` int32, the arcs leaving each state in backward order.
        bwd_group: ``(A,)`` int32, group of each arc in backward (source) order.
        bwd_prob: ``(A,)`` float64, its probability.
        bwd_arc: ``(A,)`` int32, its id in the original graph.
    """

    def __init__(self, num_states: int, start, accept, src, dst, label, weights) -> None:
        S = int(num_states)
        A = len(src)
        self.num_states, self.num_arcs = S, A
        self.start = np.ascontiguousarray(np.unique(np.asarray(start, dtype=_I32)))
        self.accept = np.ascontiguousarray(np.unique(np.asarray(accept, dtype=_I32)))
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        label = np.asarray(label, dtype=np.int64)
        w = np.asarray(weights, dtype=np.float64)
        self.max_label = int(label.max()) if A else -1
        self.shift = float(w.max()) if A else 0.0
        prob = np.exp(w - self.shift)
        order = np.lexsort((label, dst))  # by destination, then label
        d_s, l_s = dst[order], label[order]
        new = np.ones(A, dtype=bool)
        if A:
            new[1:] = (d_s[1:] != d_s[:-1]) | (l_s[1:] != l_s[:-1])
        starts = np.flatnonzero(new)
        G = len(starts)
        self.num_groups = G
        self.group_dst = np.ascontiguousarray(d_s[starts].astype(_I32))
        self.group_label = np.ascontiguousarray(l_s[starts].astype(_I32))
        self.group_off = np.ascontiguousarray(np.append(starts, A).astype(_I32))
        self.state_off = np.ascontiguousarray(
            np.searchsorted(self.group_dst, np.arange(S + 1), side="left").astype(_I32)
        )
        self.fwd_src = np.ascontiguousarray(src[order].astype(_I32))
        self.fwd_prob = np.ascontiguousarray(prob[order])
        self.fwd_arc = np.ascontiguousarray(order.astype(_I32))
        arc_group = np.empty(A, dtype=np.int64)
        arc_group[order] = np.cumsum(new) - 1
        border = np.argsort(src, kind="stable")
        self.src_off = np.ascontiguousarray(np.searchsorted(src[border], np.arange(S + 1), side="left").astype(_I32))
        self.bwd_group = np.ascontiguousarray(arc_group[border].astype(_I32))
        self.bwd_prob = np.ascontiguousarray(prob[border])
        self.bwd_arc = np.ascontiguousarray(border.astype(_I32))
        self._leak: Optional[np.ndarray] = None
        # sums of sources (see :meth:`factored`): none here
        self.num_real = S
        self.virt_off = np.zeros(1, dtype=_I32)
        self.virt_member = np.zeros(0, dtype=_I32)
        self.real_virt_off = np.zeros(S + 1, dtype=_I32)
        self.real_virt = np.zeros(0, dtype=_I32)
        self._base: Optional["SharedGraph"] = None
        self._factored: Optional["SharedGraph"] = None
        self._lock = threading.Lock()
        self._device: Dict[str, tuple] = {}  # per-device tensors of the torch path
        self._probs: Dict[str, tuple] = {}  # (fwd_prob, bwd_prob) per numpy dtype

    def probabilities(self, dtype) -> tuple:
        """``(fwd_prob, bwd_prob)`` in ``dtype`` (converted once per dtype, then cached)."""
        key = np.dtype(dtype).str
        hit = self._probs.get(key)
        if hit is None:
            hit = (np.ascontiguousarray(self.fwd_prob.astype(dtype)), np.ascontiguousarray(self.bwd_prob.astype(dtype)))
            self._probs[key] = hit
        return hit

    def check_classes(self, C: int, name: str = "denominator") -> None:
        """ValueError unless every arc label lies in ``[0, C)`` (the kernels index emissions
        with them)."""
        if self.max_label >= C:
            raise ValueError(f"{name}: arc label {self.max_label} out of range; labels must lie in [0, C) with C={C}")

    def factored(self) -> "SharedGraph":
        """This graph with its shared sources summed first (cached; ``self`` when nothing is
        shared).

        Arcs with the same destination, label and probability leaving the same set of states
        (two or more), where that set leaves together in at least two such places, become one
        arc each from a *sum node* of the set: ``alpha[sum] = sum of alpha[member]`` is formed
        once per frame, then read by each of those arcs instead of every member. A CTC topology
        composed with a token n-gram has exactly this shape: a token state and the blank state
        after it share their history, so every arc of the n-gram leaves both with the same
        weight; summing the pair first halves those arcs. The sum nodes are states
        ``num_real ..`` of the returned graph (no arc enters them; never start or accept);
        ``virt_off`` / ``virt_member`` list each one's members, ``real_virt_off`` /
        ``real_virt`` the sum nodes of each real state (the backward adds a sum node's
        ``beta`` into its members). Graphs of more than :data:`FACTOR_MAX_ARCS` arcs are not
        factored."""
        with self._lock:
            if self._factored is None:
                self._factored = _factor_sources(self)
            return self._factored

    def leak_distribution(self) -> np.ndarray:
        """``(S,)`` float64: where the leaky HMM re-enters the graph.

        As Kaldi's chain denominator sets its initial probabilities: the graph walks
        :data:`LEAK_ITERATIONS` frames by itself (arc probabilities only, no emissions) from
        the uniform distribution over its start states, renormalised each frame, and the
        distributions of those frames are averaged. Treated as a constant (no gradient flows
        into it from the arc weights)."""
        if self._base is not None:  # a factored graph: its sum nodes get nothing
            base = self._base.leak_distribution()
            return np.concatenate([base, np.zeros(self.num_states - len(base))])
        with self._lock:
            if self._leak is None:
                self._leak = _walk_average(self)
            return self._leak


#: the most arcs of a graph that :meth:`SharedGraph.factored` looks for shared sources in
FACTOR_MAX_ARCS = 1 << 20


def _factor_sources(g: SharedGraph) -> SharedGraph:
    """The factored form of ``g`` (see :meth:`SharedGraph.factored`), or ``g`` itself."""
    A, S = g.num_arcs, g.num_states
    if A == 0 or A > FACTOR_MAX_ARCS:
        return g
    group = np.repeat(np.arange(g.num_groups, dtype=np.int64), np.diff(g.group_off))
    prob, src = g.fwd_prob, g.fwd_src.astype(np.int64)
    order = np.lexsort((src, prob, group))  # runs of the same (group, probability), sources sorted
    gs, ps, ss = group[order], prob[order], src[order]
    cut = np.ones(A + 1, dtype=bool)
    cut[1:A] = (gs[1:] != gs[:-1]) | (ps[1:] != ps[:-1])
    bounds = np.flatnonzero(cut)
    sets: Dict[bytes, list] = {}  # the source set of a run of two or more arcs -> its runs
    for r in np.flatnonzero(np.diff(bounds) >= 2):
        sets.setdefault(ss[bounds[r] : bounds[r + 1]].tobytes(), []).append(r)
    chosen = [(key, runs) for key, runs in sets.items() if len(runs) >= 2]
    if not chosen:
        return g
    keep = np.ones(A, dtype=bool)  # arcs (in ``order``) that stay as they are
    new_src, new_group, new_prob, members = [], [], [], []
    for h, (key, runs) in enumerate(chosen):
        members.append(np.frombuffer(key, dtype=np.int64))
        for r in runs:
            keep[bounds[r] : bounds[r + 1]] = False
            new_src.append(S + h)
            new_group.append(gs[bounds[r]])
            new_prob.append(ps[bounds[r]])
    H = len(chosen)
    src2 = np.concatenate([ss[keep], np.asarray(new_src, dtype=np.int64)])
    grp2 = np.concatenate([gs[keep], np.asarray(new_group, dtype=np.int64)])
    prob2 = np.concatenate([ps[keep], np.asarray(new_prob, dtype=np.float64)])
    with np.errstate(divide="ignore"):
        w2 = np.log(prob2) + g.shift
    f = SharedGraph(S + H, g.start, g.accept, src2, g.group_dst[grp2], g.group_label[grp2], w2)
    f.num_real = S
    f.virt_off = np.ascontiguousarray(np.cumsum([0] + [len(m) for m in members]).astype(_I32))
    f.virt_member = np.ascontiguousarray(np.concatenate(members).astype(_I32))
    owner = np.repeat(np.arange(H, dtype=np.int64), np.diff(f.virt_off))  # the sum node of each member entry
    by_member = np.argsort(f.virt_member, kind="stable")
    f.real_virt_off = np.ascontiguousarray(
        np.searchsorted(f.virt_member[by_member], np.arange(S + 1), side="left").astype(_I32)
    )
    f.real_virt = np.ascontiguousarray((S + owner[by_member]).astype(_I32))
    f._base = g
    f._factored = f
    return f


def _walk_average(g: SharedGraph) -> np.ndarray:
    S = g.num_states
    avg = np.zeros(S, dtype=np.float64)
    if S == 0 or len(g.start) == 0:
        return avg
    cur = np.zeros(S, dtype=np.float64)
    cur[g.start] = 1.0 / len(g.start)
    dst = g.group_dst[np.repeat(np.arange(g.num_groups), np.diff(g.group_off))]
    for _ in range(LEAK_ITERATIONS):
        avg += cur
        nxt = np.bincount(dst, weights=cur[g.fwd_src] * g.fwd_prob, minlength=S)
        tot = nxt.sum()
        if not tot > 0.0:  # a graph whose walk dies: the frames so far
            break
        cur = nxt / tot
    return avg / avg.sum()


def compile_shared(g: Graph, name: str = "denominator") -> SharedGraph:
    """The :class:`SharedGraph` of ``g`` (not cached; see :func:`shared_graph`).

    Raises:
        TypeError: ``g`` is not a :class:`lightning_gtn.wfst.Graph`.
        ValueError: an epsilon arc, a non-finite weight, or too many states/arcs.
    """
    if not isinstance(g, Graph):
        raise TypeError(f"{name} must be a lightning_gtn.wfst.Graph, got {type(g).__name__}")
    a = g.arrays()
    if a.num_nodes > MAX_STATES:
        raise ValueError(f"{name}: {a.num_nodes} states; at most {MAX_STATES} are supported")
    if len(a.src) > MAX_ARCS:
        raise ValueError(f"{name}: {len(a.src)} arcs; at most {MAX_ARCS} are supported")
    if len(a.ilabel) and int(a.ilabel.min()) < 0:
        raise ValueError(
            f"{name}: epsilon arc (label {int(a.ilabel.min())}); a shared denominator graph must consume "
            "one frame per arc (remove epsilons first, e.g. with lightning_gtn.wfst.remove)"
        )
    if len(a.weights) and not np.isfinite(a.weights).all():
        raise ValueError(f"{name}: arc weights must be finite")
    return SharedGraph(a.num_nodes, a.start, a.accept, a.src, a.dst, a.ilabel, a.weights)


CACHE_SIZE = 64  # compiled shared graphs kept (a 40k-arc graph takes about 1.5 MB)
_CACHE: LRU[tuple] = LRU(CACHE_SIZE)


def shared_graph(g: Graph, name: str = "denominator") -> SharedGraph:
    """The compiled form of ``g``, cached by ``id(g)`` and :attr:`Graph.version` (a changed
    graph compiles again; an entry goes when its graph does). Errors as :func:`compile_shared`."""
    if not isinstance(g, Graph):
        raise TypeError(f"{name} must be a lightning_gtn.wfst.Graph, got {type(g).__name__}")
    key, version = id(g), g.version
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is g and hit[1] == version:
        return hit[2]
    sg = compile_shared(g, name)
    entry: list = []

    def forget(ref: weakref.ref, key: int = key) -> None:
        if entry:
            _CACHE.discard(key, entry[0])

    entry.append((weakref.ref(g, forget), version, sg))
    _CACHE.put(key, entry[0])
    return sg
