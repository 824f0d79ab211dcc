"""compose, intersect and remove on single graphs (GTN's algorithms, compiled loops).

The list overloads live in :mod:`lightning_gtn.wfst.functions`.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from . import _numba_loops as K
from .graph import _INT, Graph, epsilon

__all__ = ["compose", "intersect", "remove", "adjacency"]


def adjacency(g: Graph):
    """``(in_offsets, in_arcs, out_offsets, out_arcs)`` of ``g`` (int32), cached on the graph.

    Arcs of a node are listed in arc-id order, or in label order after ``arc_sort``.
    """
    s = g._s
    cached = s._csr
    if cached is not None:
        return cached
    if s._order is not None:  # arc_sort chose the order inside each node
        return s.csr()
    src, dst, _, _ = s.arrays()
    cached = K.csr(s.num_nodes, src, dst)
    s._csr = cached
    return cached


def _ids(ids) -> np.ndarray:
    return np.asarray(ids, dtype=_INT).reshape(-1)


def _dense_limit(s1, s2) -> int:
    """How many product states may be indexed densely (an int32 each, as GTN does).

    GTN always allocates ``3 * N1 * N2`` entries; past a few million that is mostly empty
    space, so large products whose graphs are comparatively small use a hash map.
    """
    size = s1.num_nodes + s2.num_nodes + s1.num_arcs() + s2.num_arcs()
    return min(K.DENSE_STATES, max(1 << 22, 64 * size))


def _lower_bounds(g: Graph, labels: np.ndarray, side: str):
    """``lower_bound_table`` of ``g``'s out-arc lists by ``labels``, cached on the graph.

    A large graph composed with many small ones (a token or lexicon graph with each
    example's path) would otherwise pay a pass over all its arcs on every call. The entry
    is only reused while the graph keeps the same adjacency and label arrays.
    """
    s = g._s
    csr = adjacency(g)
    cache = s._lbt if s._lbt is not None else {}
    hit = cache.get(side)
    if hit is not None and hit[0] is csr and hit[1] is labels:
        return hit[2], hit[3]
    table, width = K.lower_bound_table(s.num_nodes, csr[2], csr[3], labels)
    cache[side] = (csr, labels, table, width)
    s._lbt = cache
    return table, width


_NO_TABLE = (np.zeros(0, dtype=_INT), 0)


def _compose(g1: Graph, g2: Graph, kind: int, dense_limit: Optional[int] = None) -> Graph:
    s1, s2 = g1._s, g2._s
    src1, dst1, il1, ol1 = s1.arrays()
    src2, dst2, il2, ol2 = s2.arrays()
    if dense_limit is None:
        dense_limit = _dense_limit(s1, s2)
    out_off1, out_arcs1 = adjacency(g1)[2:]
    out_off2, out_arcs2 = adjacency(g2)[2:]
    tab1, w1 = _lower_bounds(g1, ol1, "o") if kind in (K.SEARCH_FIRST, K.DOUBLY) else _NO_TABLE
    tab2, w2 = _lower_bounds(g2, il2, "i") if kind in (K.SEARCH_SECOND, K.DOUBLY) else _NO_TABLE
    num_nodes, num_start, node_acc, src, dst, arc1, arc2 = K.compose(
        s1.num_nodes,
        dst1,
        ol1,
        out_off1,
        out_arcs1,
        _ids(s1.start_ids),
        _ids(s1.accept_ids),
        bool(s1.olabel_sorted),
        tab1,
        w1,
        s2.num_nodes,
        dst2,
        il2,
        out_off2,
        out_arcs2,
        _ids(s2.start_ids),
        _ids(s2.accept_ids),
        bool(s2.ilabel_sorted),
        tab2,
        w2,
        kind,
        dense_limit,
    )
    il, ol, w = K.compose_arcs(arc1, arc2, il1, g1._weights(), ol2, g2._weights())
    out = Graph._from_arrays(
        num_nodes,
        range(num_start),
        np.flatnonzero(node_acc).tolist(),
        src,
        dst,
        il,
        ol,
        w,
        calc_grad=g1.calc_grad or g2.calc_grad,
    )
    # Output arcs are grouped by source node in node order; store the adjacency now so
    # forward_score does not need to sort half a million arcs again.
    out._s._csr = K.csr_grouped(num_nodes, src, dst)

    def grad(inputs, deltas):
        d = deltas._weights()
        for inp, amap in zip(inputs, (arc1, arc2)):
            if inp.calc_grad:
                inp._add_grad(K.scatter_add(amap, d, inp.num_arcs()))

    out._set_grad_func([g1._alias(weights=False), g2._alias(weights=False)], grad)
    return out


def _matcher(sorted1: bool, sorted2: bool) -> int:
    if sorted1 and sorted2:
        return K.DOUBLY
    if sorted1:
        return K.SEARCH_FIRST
    if sorted2:
        return K.SEARCH_SECOND
    return K.UNSORTED


def compose(g1: Graph, g2: Graph) -> Graph:
    """Composes transducers: paths of ``g1`` whose output labels are input labels of ``g2``.

    An output arc joins an arc of ``g1`` and an arc of ``g2`` with
    ``g1.olabel == g2.ilabel`` (input label from ``g1``, output label from ``g2``, the sum
    of both weights), or follows an epsilon arc of one graph alone (output label epsilon
    on ``g1``'s side, input label epsilon on ``g2``'s side). Epsilon paths are filtered as
    in GTN so that no path is counted twice, and only states that can reach a pair of
    accept nodes become nodes. Nodes are numbered in breadth-first order from the pairs
    of start nodes and arcs follow GTN's order, so results equal GTN's node for node.

    Arcs sorted with ``g1.arc_sort(True)`` and ``g2.arc_sort()`` are matched by label
    lookups instead of nested loops (faster; the same graph up to node and arc order, which
    then follows GTN's sorted matchers). ``mark_arc_sorted`` on arcs that are not in order
    makes GTN's binary searches miss matches; the engine misses them the same way while
    expanding nodes, but GTN's separate co-accessibility pass can miss others, so for such
    graphs the two may differ.

    Gradients flow to ``g1`` and ``g2`` (to those with ``calc_grad``); the result needs a
    gradient when either does.
    """
    return _compose(g1, g2, _matcher(g1._s.olabel_sorted, g2._s.ilabel_sorted))


def intersect(g1: Graph, g2: Graph) -> Graph:
    """Intersects acceptors: the paths whose label sequences both graphs accept.

    This is :func:`compose` of the acceptors (GTN runs the same code); arcs count as
    sorted when either label order was sorted.
    """
    s1, s2 = g1._s, g2._s
    return _compose(g1, g2, _matcher(s1.ilabel_sorted or s1.olabel_sorted, s2.ilabel_sorted or s2.olabel_sorted))


def _remove_grad(inputs, deltas):
    raise RuntimeError("[gtn::remove] gradient compuation not implemented")


def remove(g: Graph, ilabel: int = epsilon, olabel: int = epsilon) -> Graph:
    """Removes the arcs labelled ``ilabel:olabel``, joining the nodes they connected.

    Follows GTN: a node stays when it is a start node or has an in-arc with another label;
    each kept node gets the other arcs of every node it reaches through removed arcs, and
    becomes an accept node when one of those is. All arcs of the result weigh 0 (GTN does
    not carry weights through removed arcs), and back-propagating through the result
    raises ``RuntimeError``. The result needs a gradient when ``g`` does.
    """
    s = g._s
    src, dst, il, ol = s.arrays()
    in_off, in_arcs, out_off, out_arcs = adjacency(g)
    new_id, count, accept_order, osrc, odst, oarc = K.remove(
        s.num_nodes,
        src,
        dst,
        il,
        ol,
        in_off,
        in_arcs,
        out_off,
        out_arcs,
        _ids(s.start_ids),
        _ids(s.accept_ids),
        int(ilabel),
        int(olabel),
    )
    starts = new_id[np.asarray(s.start_ids, dtype=np.int64)] if s.start_ids else []
    starts = sorted(int(x) for x in starts)
    out = Graph._from_arrays(
        count,
        starts,
        accept_order.tolist(),
        osrc,
        odst,
        il[oarc],
        ol[oarc],
        np.zeros(len(oarc), dtype=np.float32),
        calc_grad=g.calc_grad,
    )
    out._set_grad_func([g._alias(weights=False)], _remove_grad)
    return out
