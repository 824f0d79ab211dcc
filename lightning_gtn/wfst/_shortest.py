"""forward_score, viterbi_score and viterbi_path on single graphs (compiled loops).

The list overloads live in :mod:`lightning_gtn.wfst.functions`.
"""

from __future__ import annotations

import numpy as np

from . import _numba_loops as K
from ._compose import adjacency
from .graph import _FLOAT, _INT, Graph

__all__ = ["forward_score", "viterbi_score", "viterbi_path"]


def _prepare(g: Graph, name: str):
    s = g._s
    src, dst, _, _ = s.arrays()
    in_off, in_arcs, out_off, out_arcs = adjacency(g)
    start = np.asarray(s.start_ids, dtype=_INT)
    accept = np.asarray(s.accept_ids, dtype=_INT)
    order, count, ok = K.topological_order(s.num_nodes, src, dst, in_off, out_off, out_arcs, accept)
    if not ok:
        raise ValueError(
            f"{name}: the graph has a cycle (a self-loop or a longer cycle) that leads to an "
            "accept node, so its paths cannot be summed; the graph must be acyclic"
        )
    return s, src, dst, in_off, in_arcs, out_off, out_arcs, start, accept, order, count


def _scalar(value: float, calc_grad: bool) -> Graph:
    z = np.zeros(1, dtype=_INT)
    return Graph._from_arrays(2, [0], [1], z, z + 1, z, z.copy(), np.array([value], dtype=_FLOAT), calc_grad=calc_grad)


def _shortest_distance(g: Graph, tropical: bool, name: str) -> Graph:
    s, src, dst, in_off, in_arcs, out_off, out_arcs, start, accept, order, count = _prepare(g, name)
    total, scores, best_arc, best_accept, ratio, node_sum = K.forward(
        s.num_nodes, src, g._weights(), in_off, in_arcs, order, count, start, accept, tropical
    )
    out = _scalar(total, g.calc_grad)
    if tropical:

        def grad(inputs, deltas):
            inputs[0]._add_grad(K.viterbi_grad(len(src), src, best_arc, best_accept, float(deltas._weights()[0])))

    else:

        def grad(inputs, deltas):
            inputs[0]._add_grad(
                K.forward_grad(
                    s.num_nodes,
                    dst,
                    out_off,
                    out_arcs,
                    order,
                    count,
                    accept,
                    scores,
                    ratio,
                    node_sum,
                    total,
                    float(deltas._weights()[0]),
                )
            )

    out._set_grad_func([g._alias(weights=False)], grad)
    return out


def forward_score(g: Graph) -> Graph:
    """The log-sum-exp of the weights of all accepting paths, as a scalar graph.

    Computed in float64 with a max-shifted log-sum-exp at every node (stable for long
    graphs), returned as float32. A graph without an accepting path scores ``-inf`` and
    then gives every arc a zero gradient. The gradient of an arc is its posterior
    probability (times the incoming gradient). The backward pass reuses quantities of the
    forward pass, so it differentiates the weights as they were when the score was taken
    (GTN re-reads them, which only differs if they were changed in between). GTN's C++
    also zeroes every gradient when the graph's highest-numbered node is unreachable from a
    start node (its backward tests that node's score where it means the total); this
    engine gives the true gradient there.

    Raises:
        ValueError: when a cycle (a self-loop included) leads to an accept node. GTN's
            Python tests expect this error; its last C++ release returns an arbitrary
            number instead. Cycles that lead to no accept node are allowed.
    """
    return _shortest_distance(g, False, "forward_score")


def viterbi_score(g: Graph) -> Graph:
    """The largest total weight of an accepting path, as a scalar graph.

    The gradient is the incoming gradient on every arc of that path and 0 elsewhere. Ties
    go as in GTN: at each node the first in-arc (in the node's in-arc order) with the
    strictly largest score, the empty path at a start node only when strictly better, and
    the first accept node with the strictly largest score. ``-inf`` (zero gradient) when
    no path accepts; NaN when a NaN arc weight lies on a path that reaches an accept node.

    Raises:
        ValueError: when a cycle leads to an accept node (see :func:`forward_score`).
    """
    return _shortest_distance(g, True, "viterbi_score")


def viterbi_path(g: Graph) -> Graph:
    """The best accepting path as a graph: nodes ``0..k`` in a chain, arcs in path order.

    Node 0 is the start node and node ``k`` the accept node (one node that is both when
    the best path is empty); the arcs keep ``g``'s labels and weights. Without an
    accepting path the result has no nodes. Ties go as in GTN's ``viterbiPath``: a node
    keeps its first best in-arc, and a start node keeps the empty path unless an in-arc
    is strictly better; the first best accept node wins.

    Gradients of the path's arcs flow back to the arcs of ``g`` they copy. (GTN pairs
    them in reverse order, which only matters when the path's arcs get different
    gradients; this engine pairs each arc with its own source.)

    Raises:
        ValueError: when a cycle leads to an accept node (see :func:`forward_score`), or
            when an arc weight is NaN.
    """
    s, src, dst, in_off, in_arcs, out_off, out_arcs, start, accept, order, count = _prepare(g, "viterbi_path")
    w = g._weights()
    if len(w) and np.isnan(w.sum(dtype=np.float64)) and np.isnan(w).any():
        # NaN in, NaN out: no path can be called best (viterbi_score gives NaN)
        raise ValueError(
            f"viterbi_path: the graph has NaN arc weights (arc {int(np.flatnonzero(np.isnan(w))[0])}); "
            "its best path is undefined"
        )
    found, arcs = K.best_path(s.num_nodes, src, w, in_off, in_arcs, order, count, start, accept)
    _, _, il, ol = s.arrays()
    k = len(arcs)
    if found:
        nodes = np.arange(k, dtype=_INT)
        out = Graph._from_arrays(k + 1, [0], [k], nodes, nodes + 1, il[arcs], ol[arcs], w[arcs], calc_grad=g.calc_grad)
    else:
        out = Graph._from_arrays(0, [], [], arcs, arcs, arcs, arcs, np.zeros(0, dtype=_FLOAT), calc_grad=g.calc_grad)
    n_arcs = len(src)

    def grad(inputs, deltas):
        inputs[0]._add_grad(K.scatter_add(arcs, deltas._weights(), n_arcs))

    out._set_grad_func([g._alias(weights=False)], grad)
    return out
