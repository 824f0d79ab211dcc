"""The flat arrays every kernel reads: compiled criterion graphs, their batch, the problem.

A criterion graph (:class:`lightning_gtn.wfst.Graph`) is compiled into a :class:`CompiledGraph`:
flat int32 arrays grouped the way the dynamic programme reads them (emitting arcs grouped by
destination node for the alpha pass and by source node for the beta pass, epsilon arcs in a
topological order). :func:`batch_graphs` concatenates the compiled graphs of a batch into one
:class:`GraphBatch`; a :class:`Problem` pairs each example with a graph, an emission row and a
length; a :class:`State` is what a forward pass keeps for its backward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from ..wfst import Graph

if TYPE_CHECKING:  # annotations only: this module computes with numpy
    import torch

INDEX_DTYPE = np.int32  # the dtype of every node, arc and label index array
_INT = INDEX_DTYPE

__all__ = ["CompiledGraph", "GraphBatch", "compile_graph", "batch_graphs", "Problem", "State", "Subset", "INDEX_DTYPE"]


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
    num_nodes: int
    num_arcs: int
    src: np.ndarray
    dst: np.ndarray
    label: np.ndarray
    weights: np.ndarray
    start: np.ndarray
    accept: np.ndarray
    in_cnt: np.ndarray
    in_arc: np.ndarray
    out_cnt: np.ndarray
    out_arc: np.ndarray
    eps_in_nodes: np.ndarray
    eps_in_cnt: np.ndarray
    eps_in_arc: np.ndarray
    eps_out_nodes: np.ndarray
    eps_out_cnt: np.ndarray
    eps_out_arc: np.ndarray
    weight_index: Optional[np.ndarray]
    max_label: int
    labels: np.ndarray
    in_src: np.ndarray
    in_lp: np.ndarray
    out_dst: np.ndarray
    out_lp: np.ndarray
    device_tables: Any

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
        self._weights: Optional[np.ndarray] = None

    @property
    def num_arcs(self) -> int:
        """The total number of arcs over all graphs of the batch."""
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


class Problem:
    """A batch of (graph, emission row, length) examples and what the passes need.

    Args:
        batch: the concatenated criterion graphs.
        ex_graph: ``(N,)`` graph index of each example.
        ex_row: ``(N,)`` emission row (batch index ``b``) of each example, non-decreasing.
        ex_len: ``(N,)`` number of frames of each example.
    """

    def __init__(self, batch: GraphBatch, ex_graph, ex_row, ex_len) -> None:
        self.batch = batch
        self.ex_graph = np.ascontiguousarray(ex_graph, dtype=np.int64)
        self.ex_row = np.ascontiguousarray(ex_row, dtype=np.int64)
        self.ex_len = np.ascontiguousarray(ex_len, dtype=np.int64)
        self.num_examples = len(self.ex_graph)
        sizes = (
            np.asarray(batch.num_nodes, dtype=np.int64)[self.ex_graph] if self.num_examples else np.zeros(0, np.int64)
        )
        self.ex_nodes = sizes
        self._set_alpha_off()

    def check(self, E, w, alpha=None, logz=None) -> None:
        """Raises ValueError unless every index the kernels read lies inside ``E`` ``(B, T, C)``,
        the arc weights ``w`` and, for a backward, the saved ``alpha`` and ``logz``: the last check
        before a compiled kernel, whatever path (a cached graph, a custom op called directly)
        brought the problem here."""
        bt = self.batch
        Bn, T, C = (int(v) for v in E.shape)
        if bt.max_label >= C:
            raise ValueError(f"a graph reads label {bt.max_label} but the emissions have C={C}")
        if int(w.shape[0]) != bt.num_arcs:
            raise ValueError(f"expected {bt.num_arcs} arc weights, got {int(w.shape[0])}")
        if self.num_examples:
            if self.ex_len.min() < 0 or self.ex_len.max() > T:
                raise ValueError(f"example lengths must lie in [0, T={T}]")
            if self.ex_row.min() < 0 or self.ex_row.max() >= Bn:
                raise ValueError(f"example rows must lie in [0, B={Bn})")
            if self.ex_graph.min() < 0 or self.ex_graph.max() >= len(bt.num_nodes):
                raise ValueError(f"example graphs must lie in [0, {len(bt.num_nodes)})")
        if alpha is not None and int(alpha.numel()) != int(self.alpha_off[-1]):
            raise ValueError(f"expected {int(self.alpha_off[-1])} saved forward scores, got {int(alpha.numel())}")
        if logz is not None and int(logz.numel()) != self.num_examples:
            raise ValueError(f"expected {self.num_examples} saved scores, got {int(logz.numel())}")

    def _set_alpha_off(self) -> None:
        """``alpha_off`` ``(N + 1,)``: where each example's ``(T_e + 1) * S_e`` alphas start."""
        self.alpha_off = np.zeros(self.num_examples + 1, dtype=np.int64)
        np.cumsum((self.ex_len + 1) * self.ex_nodes, out=self.alpha_off[1:])

    def chunks(self, threads: int):
        """Example ranges of similar work, never splitting one emission row across chunks."""
        N = self.num_examples
        if N == 0:
            return []
        arcs = np.diff(self.batch.arc_off)[self.ex_graph] + 1
        cost = (self.ex_len + 1) * (arcs + self.ex_nodes)
        total = int(cost.sum())
        if threads <= 1 or total < 200_000 or N == 1:
            return [(0, N)]
        cum = np.cumsum(cost)
        row_end = np.nonzero(np.append(self.ex_row[1:] != self.ex_row[:-1], True))[0] + 1  # valid cut points
        cuts = [0]
        for i in range(1, threads):
            target = total * i / threads
            j = int(np.searchsorted(cum[row_end - 1], target))
            if j < len(row_end):
                c = int(row_end[j])
                if c > cuts[-1] and c < N:
                    cuts.append(c)
        cuts.append(N)
        return [(cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)]


class Subset(Problem):
    """A view of some examples of a :class:`Problem` (same graphs, same alpha layout rules)."""

    def __init__(self, problem: "Problem", idx: np.ndarray) -> None:
        self.batch = problem.batch
        self.ex_graph = problem.ex_graph[idx]
        self.ex_row = problem.ex_row[idx]
        self.ex_len = problem.ex_len[idx]
        self.num_examples = len(idx)
        self.ex_nodes = problem.ex_nodes[idx]
        self._set_alpha_off()


class State:
    """What the forward keeps for the backward."""

    __slots__ = ("problem", "alpha", "logz", "E", "w", "impl", "extra")
    problem: Problem
    alpha: torch.Tensor  # the forward scores (flat, or padded per example: the implementation's layout)
    logz: torch.Tensor  # (N,) each example's score
    E: torch.Tensor  # (B, T, C) emissions
    w: torch.Tensor  # (num_arcs,) arc weights
    impl: str
    extra: Any  # what the implementation keeps besides (its tables)
