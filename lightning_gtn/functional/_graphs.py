"""Criterion graphs: builders, their compiled array form, the per-target cache, batching.

Every loss in :mod:`lightning_gtn.functional` builds its criterion graphs with the engine
(:class:`lightning_gtn.wfst.Graph`), then turns each one into a :class:`CompiledGraph`: flat
int32 arrays grouped the way the dynamic programme reads them (emitting arcs grouped by
destination node for the alpha pass and by source node for the beta pass, epsilon arcs in a
topological order). :func:`batch_graphs` concatenates the compiled graphs of a batch into one
:class:`GraphBatch`, which is what the kernels in :mod:`._dispatch` consume.

Compiled graphs of targets are cached in small LRU dictionaries keyed by the target tuple, so a
training loop that sees the same transcripts again pays only for the concatenation. A user's own
graphs are cached by identity and :attr:`Graph.version` (:func:`compiled_user_graph`), so
passing the same, unchanged graphs again compiles nothing.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Callable, Dict, Hashable, List, Optional, Sequence

import numpy as np

from .. import wfst as _wfst
from ..wfst import Graph
from ..wfst.criterion import ctc_graph

_INT = np.int32

__all__ = [
    "CompiledGraph",
    "GraphBatch",
    "compile_graph",
    "compiled_user_graph",
    "batch_graphs",
    "ctc_graph",
    "force_align_graph",
    "asg_full_graph",
    "asg_target_graph",
    "all_paths_graph",
    "cached",
    "clear_cache",
]


class CompiledGraph:
    """One criterion graph as arrays, grouped for the forward-backward passes.

    Node ids are local (``0 .. num_nodes - 1``), arc ids are the graph's own arc ids.

    Attributes:
        num_nodes, num_arcs: sizes.
        src, dst, label: ``(num_arcs,)`` int32; ``label == -1`` marks an epsilon arc.
        weights: ``(num_arcs,)`` float32, the graph's arc weights when compiled.
        start, accept: int32 node ids.
        in_cnt, in_arc: emitting arcs grouped by destination (counts per node, arc ids).
        out_cnt, out_arc: emitting arcs grouped by source.
        eps_in_nodes, eps_in_cnt, eps_in_arc: nodes with incoming epsilon arcs in topological
            order of the epsilon subgraph, how many each, and those arcs.
        eps_out_nodes, eps_out_cnt, eps_out_arc: nodes with outgoing epsilon arcs in reverse
            topological order, how many each, and those arcs.
        weight_index: optional ``(num_arcs,)`` int64 index of each arc's weight in an outside
            parameter vector (ASG transitions), or ``None``.
    """

    __slots__ = (
        "num_nodes",
        "num_arcs",
        "src",
        "dst",
        "label",
        "weights",
        "start",
        "accept",
        "in_cnt",
        "in_arc",
        "out_cnt",
        "out_arc",
        "eps_in_nodes",
        "eps_in_cnt",
        "eps_in_arc",
        "eps_out_nodes",
        "eps_out_cnt",
        "eps_out_arc",
        "weight_index",
        "max_label",
        "labels",
        "in_src",
        "in_lp",
        "out_dst",
        "out_lp",
        "device_tables",  # the Triton kernels' padded tables, made on first use (see _triton)
    )

    def __getstate__(self):
        # the Triton tables (and their copies on devices) are a cache: not pickled
        return {k: getattr(self, k) for k in self.__slots__ if k != "device_tables" and hasattr(self, k)}

    def __setstate__(self, state):
        for k, v in state.items():
            setattr(self, k, v)


def _topological_rank(num_nodes: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Rank of each node in a topological order of the (epsilon) arcs; ValueError on a cycle."""
    rank = np.zeros(num_nodes, dtype=np.int64)
    if len(src) == 0:
        return rank
    indeg = np.bincount(dst, minlength=num_nodes)
    order = np.argsort(src, kind="stable")
    off = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=num_nodes), out=off[1:])
    out_dst = dst[order]
    stack = [int(n) for n in np.nonzero(indeg == 0)[0]]
    indeg = indeg.copy()
    seen = 0
    while stack:
        n = stack.pop()
        rank[n] = seen
        seen += 1
        for d in out_dst[off[n] : off[n + 1]]:
            indeg[d] -= 1
            if indeg[d] == 0:
                stack.append(int(d))
    if seen != num_nodes:
        raise ValueError(
            "graphs: the epsilon arcs of a criterion graph form a cycle; the dynamic programme "
            "needs an acyclic epsilon subgraph (remove the epsilon cycle, e.g. with gtn.remove)"
        )
    return rank


def compile_graph(g: Graph, weight_index: Optional[np.ndarray] = None) -> CompiledGraph:
    """Turns an engine graph into a :class:`CompiledGraph` (input labels are what is scored)."""
    a = g.arrays()
    src, dst, il = a.src, a.dst, a.ilabel
    # A graph without nodes has no accepting path (score -inf, like one without accept nodes);
    # it is compiled as one isolated node, since the kernels size their work by nodes.
    n = max(a.num_nodes, 1)
    cg = CompiledGraph()
    cg.num_nodes = n
    cg.num_arcs = len(src)
    cg.src = np.ascontiguousarray(src, dtype=_INT)
    cg.dst = np.ascontiguousarray(dst, dtype=_INT)
    cg.label = np.ascontiguousarray(il, dtype=_INT)
    cg.weights = np.array(a.weights, dtype=np.float32)  # a snapshot: set_weight writes in place
    cg.start = np.array(a.start, dtype=_INT)
    cg.accept = np.array(a.accept, dtype=_INT)
    cg.max_label = int(il.max()) if len(il) else -1
    cg.labels = np.unique(il[il >= 0]).astype(_INT)  # distinct emitting labels
    em = np.nonzero(il >= 0)[0]
    eps = np.nonzero(il < 0)[0]
    cg.in_arc = em[np.argsort(dst[em], kind="stable")].astype(_INT)
    cg.in_cnt = np.bincount(dst[em], minlength=n).astype(_INT)
    cg.out_arc = em[np.argsort(src[em], kind="stable")].astype(_INT)
    cg.out_cnt = np.bincount(src[em], minlength=n).astype(_INT)
    # per CSR position: the other end and the position of the label in ``labels``
    cg.in_src = cg.src[cg.in_arc]
    cg.in_lp = np.searchsorted(cg.labels, cg.label[cg.in_arc]).astype(_INT)
    cg.out_dst = cg.dst[cg.out_arc]
    cg.out_lp = np.searchsorted(cg.labels, cg.label[cg.out_arc]).astype(_INT)
    if len(eps):
        rank = _topological_rank(n, src[eps].astype(np.int64), dst[eps].astype(np.int64))
        e_in = eps[np.argsort(rank[dst[eps]], kind="stable")]
        nodes, cnt = np.unique(rank[dst[e_in]], return_counts=True)
        inv = np.argsort(rank)  # node of each rank
        cg.eps_in_nodes = inv[nodes].astype(_INT)
        cg.eps_in_cnt = cnt.astype(_INT)
        cg.eps_in_arc = e_in.astype(_INT)
        e_out = eps[np.argsort(-rank[src[eps]], kind="stable")]
        nodes, first = np.unique(-rank[src[e_out]], return_index=True)
        cnt = np.diff(np.append(first, len(e_out)))
        cg.eps_out_nodes = inv[-nodes].astype(_INT)
        cg.eps_out_cnt = cnt.astype(_INT)
        cg.eps_out_arc = e_out.astype(_INT)
    else:
        z = np.zeros(0, dtype=_INT)
        cg.eps_in_nodes = cg.eps_in_cnt = cg.eps_in_arc = z
        cg.eps_out_nodes = cg.eps_out_cnt = cg.eps_out_arc = z
    cg.weight_index = None if weight_index is None else np.asarray(weight_index, dtype=np.int64)
    return cg


class GraphBatch:
    """The compiled graphs of one batch, concatenated (what the kernels read).

    Graphs are numbered ``0 .. G-1``; examples refer to them by index, so a graph shared by
    every example (ASG's transition graph) is stored once. Node ids stay local to their graph;
    ``*_off`` arrays (length ``G + 1``, or ``num_nodes_total + 1`` for the CSR offsets) locate
    each graph's part of the concatenated arrays. Arc ids are global (local id + ``arc_off``).
    """

    def __init__(self, graphs: Sequence[CompiledGraph]) -> None:
        self.graphs = list(graphs)
        G = len(graphs)

        def offsets(sizes) -> np.ndarray:
            off = np.zeros(len(sizes) + 1, dtype=np.int64)
            if len(sizes):
                np.cumsum(sizes, out=off[1:])
            return off

        def cat(arrays, dtype=_INT) -> np.ndarray:
            if not arrays:
                return np.zeros(0, dtype=dtype)
            return np.ascontiguousarray(np.concatenate(arrays), dtype=dtype)

        self.node_off = offsets([g.num_nodes for g in graphs])
        self.arc_off = offsets([g.num_arcs for g in graphs])
        self.num_nodes = [g.num_nodes for g in graphs]
        self.max_nodes = max(self.num_nodes, default=0)
        self.src = cat([g.src for g in graphs])
        self.dst = cat([g.dst for g in graphs])
        self.label = cat([g.label for g in graphs])
        self.max_label = max((g.max_label for g in graphs), default=-1)
        ao = self.arc_off
        self.in_off = offsets(cat([g.in_cnt for g in graphs], np.int64)).astype(np.int64)
        self.in_arc = cat([g.in_arc + ao[i] for i, g in enumerate(graphs)])
        self.out_off = offsets(cat([g.out_cnt for g in graphs], np.int64)).astype(np.int64)
        self.out_arc = cat([g.out_arc + ao[i] for i, g in enumerate(graphs)])
        self.in_src = cat([g.in_src for g in graphs])
        self.in_lp = cat([g.in_lp for g in graphs])
        self.out_dst = cat([g.out_dst for g in graphs])
        self.out_lp = cat([g.out_lp for g in graphs])
        self.start_off = offsets([len(g.start) for g in graphs])
        self.start = cat([g.start for g in graphs])
        self.accept_off = offsets([len(g.accept) for g in graphs])
        self.accept = cat([g.accept for g in graphs])
        self.eps_in_node_off = offsets([len(g.eps_in_nodes) for g in graphs])
        self.eps_in_nodes = cat([g.eps_in_nodes for g in graphs])
        self.eps_in_off = offsets(cat([g.eps_in_cnt for g in graphs], np.int64))
        self.eps_in_arc = cat([g.eps_in_arc + ao[i] for i, g in enumerate(graphs)])
        self.eps_out_node_off = offsets([len(g.eps_out_nodes) for g in graphs])
        self.eps_out_nodes = cat([g.eps_out_nodes for g in graphs])
        self.eps_out_off = offsets(cat([g.eps_out_cnt for g in graphs], np.int64))
        self.eps_out_arc = cat([g.eps_out_arc + ao[i] for i, g in enumerate(graphs)])
        self.lab_off = offsets([len(g.labels) for g in graphs])
        self.labels = cat([g.labels for g in graphs])
        self.max_labels = int(max((len(g.labels) for g in graphs), default=0))
        self.has_eps = bool(len(self.eps_in_arc))
        self.max_in = int(max((g.in_cnt.max(initial=0) for g in graphs), default=0))
        self.max_out = int(max((g.out_cnt.max(initial=0) for g in graphs), default=0))
        self.max_eps = int(
            max(
                (max(g.eps_in_cnt.max(initial=0), g.eps_out_cnt.max(initial=0)) for g in graphs),
                default=0,
            )
        )
        self._weights = None

    @property
    def num_arcs(self) -> int:
        return int(self.arc_off[-1])

    def weights(self) -> np.ndarray:
        """The compiled weights of all graphs, concatenated (float32, global arc order)."""
        if self._weights is None:
            self._weights = np.ascontiguousarray(
                np.concatenate([g.weights for g in self.graphs]) if self.graphs else np.zeros(0),
                dtype=np.float32,
            )
        return self._weights

    def weight_index(self) -> np.ndarray:
        """Concatenated ``weight_index`` of the graphs (all must have one)."""
        return np.concatenate([g.weight_index for g in self.graphs]) if self.graphs else np.zeros(0, np.int64)


def batch_graphs(graphs: Sequence[CompiledGraph]) -> GraphBatch:
    """Concatenates compiled graphs into one :class:`GraphBatch`."""
    return GraphBatch(graphs)


# ---------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------


class _LRU:
    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.data: "OrderedDict[Hashable, CompiledGraph]" = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], CompiledGraph]) -> CompiledGraph:
        with self.lock:
            v = self.data.get(key)
            if v is not None:
                self.data.move_to_end(key)
                return v
        v = make()
        with self.lock:
            self.data[key] = v
            if len(self.data) > self.maxsize:
                self.data.popitem(last=False)
        return v


_CACHES: Dict[str, _LRU] = {}
CACHE_SIZE = 4096  # compiled graphs per kind; a CTC graph of 50 tokens takes about 12 kB


def set_cache_size(n: int) -> None:
    """Bounds each criterion-graph cache to ``n`` compiled graphs (``n >= 1``)."""
    global CACHE_SIZE
    if int(n) < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    CACHE_SIZE = int(n)
    for c in _CACHES.values():
        with c.lock:
            c.maxsize = CACHE_SIZE
            while len(c.data) > CACHE_SIZE:
                c.data.popitem(last=False)


def cached(kind: str, key: Hashable, make: Callable[[], CompiledGraph]) -> CompiledGraph:
    """The compiled graph of ``(kind, key)``, built by ``make()`` on a miss (LRU per kind)."""
    c = _CACHES.get(kind)
    if c is None:
        c = _CACHES.setdefault(kind, _LRU(CACHE_SIZE))
    return c.get(key, make)


def clear_cache() -> None:
    """Empties every criterion-graph cache (user graphs' included)."""
    for c in _CACHES.values():
        with c.lock:
            c.data.clear()
    with _USER_LOCK:
        _USER_GRAPHS.clear()


USER_CACHE_SIZE = 1024  # compiled user graphs kept (least recently used dropped first)
_USER_GRAPHS: "OrderedDict[int, tuple]" = OrderedDict()  # id(g) -> (weakref to g, version, compiled)
_USER_LOCK = threading.RLock()  # re-entrant: a weakref callback may run while it is held


def compiled_user_graph(g: Graph) -> CompiledGraph:
    """The compiled form of a user's graph, compiled again only when the graph changed.

    Entries are keyed by ``id(g)``, hold a weak reference to ``g`` (an entry goes when its
    graph does) and the :attr:`Graph.version` it was compiled at; a later call with the
    same live graph at the same version returns the same :class:`CompiledGraph` object
    (so caches keyed on it, like the GPU arc tables, stay warm). At most
    ``USER_CACHE_SIZE`` graphs are kept.

    Raises:
        TypeError: if ``g`` is not a :class:`lightning_gtn.wfst.Graph`.
        ValueError: as :func:`compile_graph` (an epsilon cycle).
    """
    if not isinstance(g, Graph):
        raise TypeError(f"graphs must hold lightning_gtn.wfst.Graph objects, got {type(g).__name__}")
    key, version = id(g), g.version  # the version before compiling: a change meanwhile misses next time
    with _USER_LOCK:
        hit = _USER_GRAPHS.get(key)
        if hit is not None and hit[0]() is g and hit[1] == version:
            _USER_GRAPHS.move_to_end(key)
            return hit[2]
    cg = compile_graph(g)

    def forget(ref: weakref.ref, key: int = key) -> None:
        with _USER_LOCK:
            entry = _USER_GRAPHS.get(key)
            if entry is not None and entry[0] is ref:
                del _USER_GRAPHS[key]

    with _USER_LOCK:
        _USER_GRAPHS[key] = (weakref.ref(g, forget), version, cg)
        _USER_GRAPHS.move_to_end(key)
        while len(_USER_GRAPHS) > USER_CACHE_SIZE:
            _USER_GRAPHS.popitem(last=False)
    return cg


# ---------------------------------------------------------------------------
# Builders (engine graphs)
# ---------------------------------------------------------------------------


def force_align_graph(target: Sequence[int]) -> Graph:
    """The acceptor where token ``i`` of ``target`` covers one or more consecutive frames.

    ``len(target) + 1`` nodes in a chain: node 0 starts, node ``L`` accepts; arc ``l -> l+1``
    reads ``target[l]`` and node ``l + 1`` loops on ``target[l]``. An empty target accepts only
    the empty input.
    """
    return build_force_align(_wfst, target)


def build_force_align(gtn, target: Sequence[int]):
    """:func:`force_align_graph` built with ``gtn.Graph`` of the given module (the engine, or
    the real ``gtn`` package for ``impl="gtn"``)."""
    target = [int(t) for t in target]
    L = len(target)
    g = gtn.Graph(False)
    g.add_node(True, L == 0)
    for i, tok in enumerate(target):
        g.add_node(False, i == L - 1)
        g.add_arc(i, i + 1, tok)
        g.add_arc(i + 1, i + 1, tok)
    return g


def all_paths_graph(num_classes: int) -> Graph:
    """One node, start and accept, looping on every label: scores every label at every frame."""
    g = Graph(False)
    g.add_node(True, True)
    for c in range(num_classes):
        g.add_arc(0, 0, c)
    return g


def asg_full_graph(num_classes: int) -> tuple:
    """ASG's fully connected transition acceptor and the index of each arc's weight.

    Node 0 is the start; node ``i + 1`` means "the last token was ``i``" and accepts. Arc
    ``0 -> i+1`` reads ``i`` with weight ``transitions[0, i]``; arc ``j+1 -> i+1`` reads ``i``
    with weight ``transitions[i + 1, j]``. Returns ``(graph, weight_index)`` where
    ``weight_index[a]`` is the flat (row-major) index into ``transitions`` of arc ``a``.
    """
    C = int(num_classes)
    i = np.arange(C, dtype=_INT)
    # start arcs, then for each destination token i all source tokens j
    src = np.concatenate([np.zeros(C, _INT), np.tile(i + 1, C)])
    dst = np.concatenate([i + 1, np.repeat(i + 1, C)])
    lab = np.concatenate([i, np.repeat(i, C)])
    g = Graph.from_arrays(C + 1, [0], np.arange(1, C + 1), src, dst, lab, calc_grad=False)
    widx = np.arange(len(src), dtype=np.int64)  # arc order matches the row-major layout
    return g, widx


def asg_target_graph(target: Sequence[int], num_classes: int) -> tuple:
    """The force-align graph of ``target`` intersected with ASG's transitions.

    ``L + 1`` nodes in a chain; entering token ``l`` scores ``transitions[y_l + 1, y_{l-1}]``
    (``transitions[0, y_0]`` for the first), staying on it ``transitions[y_l + 1, y_l]``.
    Returns ``(graph, weight_index)`` as :func:`asg_full_graph`.
    """
    target = [int(t) for t in target]
    C = int(num_classes)
    g = force_align_graph(target)
    widx = []
    prev = None
    for tok in target:
        widx.append(tok if prev is None else (tok + 1) * C + prev)  # enter
        widx.append((tok + 1) * C + tok)  # stay
        prev = tok
    return g, np.asarray(widx, dtype=np.int64)


def target_key(target) -> tuple:
    return tuple(int(t) for t in target)


def compiled_ctc(target: Sequence[int], blank: int) -> CompiledGraph:
    key = (target_key(target), int(blank))
    return cached("ctc", key, lambda: compile_graph(ctc_graph(key[0], key[1])))


def compiled_force_align(target: Sequence[int]) -> CompiledGraph:
    key = target_key(target)
    return cached("align", key, lambda: compile_graph(force_align_graph(key)))


def compiled_all_paths(num_classes: int) -> CompiledGraph:
    return cached("all", int(num_classes), lambda: compile_graph(all_paths_graph(num_classes)))


def compiled_asg_full(num_classes: int) -> CompiledGraph:
    return cached("asg_full", int(num_classes), lambda: compile_graph(*asg_full_graph(num_classes)))


def compiled_asg_target(target: Sequence[int], num_classes: int) -> CompiledGraph:
    key = (target_key(target), int(num_classes))
    return cached("asg", key, lambda: compile_graph(*asg_target_graph(key[0], key[1])))


def graphs_for(targets: List[Sequence[int]], make: Callable) -> List[CompiledGraph]:
    return [make(t) for t in targets]
