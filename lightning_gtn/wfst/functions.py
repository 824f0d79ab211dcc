"""Graph operations with GTN's names, semantics and list overloads.

Every operation that accepts one graph (or a pair) also accepts lists of graphs (or of
pairs), and then runs once per item on the engine's bounded thread pool, as GTN's
bindings do with ``parallelMap``.

Structural operations record an *arc map* (for each output arc, the input arc it came
from), so their backward is one scatter-add of the output gradient.
"""

from __future__ import annotations

from typing import List, Sequence, Union

import numpy as np

from . import _compose, _shortest
from .graph import _FLOAT, _INT, MAX_NODES, Graph, _deep_copy, epsilon
from .parallel import parallel_map

__all__ = [
    "negate",
    "add",
    "subtract",
    "clone",
    "project_input",
    "project_output",
    "concat",
    "closure",
    "union",
    "intersect",
    "compose",
    "remove",
    "forward_score",
    "viterbi_score",
    "viterbi_path",
]


def _is_list(x) -> bool:
    return isinstance(x, (list, tuple))


def _check_graph(g, name: str) -> Graph:
    if not isinstance(g, Graph):
        raise TypeError(f"{name} must be a gtn.Graph, got {type(g).__name__}")
    return g


def _unary(fn, name: str):
    def op(g):
        if _is_list(g):
            return parallel_map(lambda x: fn(_check_graph(x, "g")), g)
        return fn(_check_graph(g, "g"))

    op.__name__ = name
    op.__qualname__ = name
    op.__doc__ = fn.__doc__
    return op


def _binary(fn, name: str):
    def op(g1, g2):
        if _is_list(g1) or _is_list(g2):
            if not (_is_list(g1) and _is_list(g2)):
                raise TypeError(f"{name}: pass two graphs or two lists of graphs")
            if len(g1) != len(g2):
                raise ValueError(f"{name}: graphs1 has {len(g1)} graphs but graphs2 has {len(g2)}")
            return parallel_map(lambda a, b: fn(_check_graph(a, "g1"), _check_graph(b, "g2")), g1, g2)
        return fn(_check_graph(g1, "g1"), _check_graph(g2, "g2"))

    op.__name__ = name
    op.__qualname__ = name
    op.__doc__ = fn.__doc__
    return op


# -- scalar operations -----------------------------------------------------------


def _negate(g: Graph) -> Graph:
    """Negates a scalar graph (one arc): the result's weight is ``-g.item()``."""
    if g.num_arcs() != 1:
        raise RuntimeError("[gtn::negate] input must have only one arc")
    out = _deep_copy(g)
    out._w.set(-g._weights())
    out._set_grad_func([g], lambda inputs, d: inputs[0]._add_grad(-d._weights()))
    return out


def _add(g1: Graph, g2: Graph) -> Graph:
    """Adds two scalar graphs. Like GTN, the result needs a gradient iff ``g1`` does."""
    if g1.num_arcs() != 1 or g2.num_arcs() != 1:
        raise RuntimeError("[gtn::add] inputs must have only one arc")
    out = _deep_copy(g1)
    out._w.set(g1._weights() + g2._weights())

    def grad(inputs, d):
        inputs[0]._add_grad(d)
        inputs[1]._add_grad(d)

    out._set_grad_func([g1, g2], grad)
    return out


def _subtract(g1: Graph, g2: Graph) -> Graph:
    """Subtracts scalar graph ``g2`` from ``g1``. The result needs a gradient iff ``g1`` does."""
    if g1.num_arcs() != 1 or g2.num_arcs() != 1:
        raise RuntimeError("[gtn::subtract] inputs must have only one arc")
    out = _deep_copy(g1)
    out._w.set(g1._weights() - g2._weights())

    def grad(inputs, d):
        inputs[0]._add_grad(d)
        inputs[1]._add_grad(-d._weights())

    out._set_grad_func([g1, g2], grad)
    return out


# -- copies and projections ------------------------------------------------------------


def _identity_grad(inputs, d):
    inputs[0]._add_grad(d._weights())


def _clone(g: Graph, projection: str = "none") -> Graph:
    """A deep copy of ``g``; gradients of the copy flow back to ``g``."""
    out = _deep_copy(g)
    s = out._s
    if projection != "none":
        src, dst, il, ol = s.arrays()
        # Arcs inside a node stay in the order of the copy; a sorted flag must describe
        # the new labels (GTN keeps the old flags, which can be wrong after projecting).
        if projection == "output":
            s._arrays = (src, dst, ol.copy(), ol)
            s.ilabel_sorted = s.olabel_sorted
        else:
            s._arrays = (src, dst, il, il.copy())
            s.olabel_sorted = s.ilabel_sorted
    out._set_grad_func([g._alias(weights=False)], _identity_grad)
    return out


def _project_input(g: Graph) -> Graph:
    """A copy of ``g`` whose output labels are its input labels (an acceptor)."""
    return _clone(g, "input")


def _project_output(g: Graph) -> Graph:
    """A copy of ``g`` whose input labels are its output labels (an acceptor)."""
    return _clone(g, "output")


# -- rational operations ------------------------------------------------------------------


def _gather_grad(inputs: List[Graph], d: Graph, offsets: Union[Sequence[int], np.ndarray]) -> None:
    """Hands each input the slice of the output gradient that its arcs became."""
    w = d._weights()
    for inp, off in zip(inputs, offsets):
        if inp.calc_grad:
            inp._add_grad(w[off : off + inp.num_arcs()])


def _from_op(inputs: Sequence[Graph], num_nodes, start_ids, accept_ids, src, dst, il, ol, w) -> Graph:
    calc = any(x.calc_grad for x in inputs)
    if num_nodes > MAX_NODES:  # node ids are int32
        raise ValueError(f"the result would have {num_nodes} nodes, more than int32 ids allow ({MAX_NODES})")
    return Graph._from_arrays(num_nodes, start_ids, accept_ids, src, dst, il, ol, w, calc_grad=calc)


def _union(graphs: Sequence[Graph]) -> Graph:
    """The union of graphs: nodes and arcs of each, in order, side by side."""
    graphs = [_check_graph(g, "graphs[i]") for g in graphs]
    node_off = np.cumsum([0] + [g.num_nodes() for g in graphs])
    arc_off = np.cumsum([0] + [g.num_arcs() for g in graphs])
    parts = [g._s.arrays() for g in graphs]
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, dtype=_INT)
    src = cat([p[0] + node_off[i] for i, p in enumerate(parts)])
    dst = cat([p[1] + node_off[i] for i, p in enumerate(parts)])
    il = cat([p[2] for p in parts])
    ol = cat([p[3] for p in parts])
    w = np.concatenate([g._weights() for g in graphs]) if graphs else np.zeros(0, dtype=_FLOAT)
    # GTN adds the nodes one by one, so start and accept ids come out in node order.
    starts = [int(s + node_off[i]) for i, g in enumerate(graphs) for s in sorted(g._s.start_ids)]
    accepts = [int(a + node_off[i]) for i, g in enumerate(graphs) for a in sorted(g._s.accept_ids)]
    out = _from_op(graphs, int(node_off[-1]), starts, accepts, src, dst, il, ol, w)
    out._set_grad_func([g._alias(weights=False) for g in graphs], lambda inp, d: _gather_grad(inp, d, arc_off))
    return out


def _concat(graphs: Sequence[Graph]) -> Graph:
    """Concatenates graphs: accept nodes of each connect by epsilon arcs to the next one's starts.

    ``concat([])`` accepts only the empty string (one node, start and accept).
    """
    graphs = [_check_graph(g, "graphs[i]") for g in graphs]
    if not graphs:
        out = Graph(False)  # nothing to differentiate, as in GTN
        out.add_node(True, True)
        return out
    node_off = np.cumsum([0] + [g.num_nodes() for g in graphs])
    srcs, dsts, ils, ols, ws = [], [], [], [], []
    arc_off = []
    pos = 0
    for i, g in enumerate(graphs):
        src, dst, il, ol = g._s.arrays()
        arc_off.append(pos)
        srcs.append(src + node_off[i])
        dsts.append(dst + node_off[i])
        ils.append(il)
        ols.append(ol)
        ws.append(g._weights())
        pos += len(src)
        if i > 0:  # epsilon arcs from the previous graph's accepts to this one's starts
            prev = graphs[i - 1]
            pairs = [(a, s) for a in prev._s.accept_ids for s in g._s.start_ids]
            e_src = np.array([a + node_off[i - 1] for a, _ in pairs], dtype=_INT)
            e_dst = np.array([s + node_off[i] for _, s in pairs], dtype=_INT)
            eps = np.full(len(pairs), epsilon, dtype=_INT)
            srcs.append(e_src)
            dsts.append(e_dst)
            ils.append(eps)
            ols.append(eps)
            ws.append(np.zeros(len(pairs), dtype=_FLOAT))
            pos += len(pairs)
    starts = sorted(graphs[0]._s.start_ids)  # node order, as GTN's
    accepts = [int(a + node_off[-2]) for a in sorted(graphs[-1]._s.accept_ids)]
    out = _from_op(
        graphs,
        int(node_off[-1]),
        starts,
        accepts,
        *(np.concatenate(x) for x in (srcs, dsts, ils, ols, ws)),
    )
    out._set_grad_func([g._alias(weights=False) for g in graphs], lambda inp, d: _gather_grad(inp, d, arc_off))
    return out


def _closure(g: Graph) -> Graph:
    """The Kleene closure: a new start-and-accept node 0, epsilon arcs into ``g``'s starts and
    from its accepts back to node 0."""
    src, dst, il, ol = g._s.arrays()
    starts, accepts = g._s.start_ids, g._s.accept_ids
    e_src = np.array([0] * len(starts) + [a + 1 for a in accepts], dtype=_INT)
    e_dst = np.array([s + 1 for s in starts] + [0] * len(accepts), dtype=_INT)
    eps = np.full(len(e_src), epsilon, dtype=_INT)
    out = _from_op(
        [g],
        g.num_nodes() + 1,
        [0],
        [0],
        np.concatenate([src + 1, e_src]),
        np.concatenate([dst + 1, e_dst]),
        np.concatenate([il, eps]),
        np.concatenate([ol, eps]),
        np.concatenate([g._weights(), np.zeros(len(e_src), dtype=_FLOAT)]),
    )
    out._set_grad_func([g._alias(weights=False)], lambda inp, d: _gather_grad(inp, d, [0]))
    return out


negate = _unary(_negate, "negate")
add = _binary(_add, "add")
subtract = _binary(_subtract, "subtract")
clone = _unary(_clone, "clone")
project_input = _unary(_project_input, "project_input")
project_output = _unary(_project_output, "project_output")
closure = _unary(_closure, "closure")
intersect = _binary(_compose.intersect, "intersect")
compose = _binary(_compose.compose, "compose")
forward_score = _unary(_shortest.forward_score, "forward_score")
viterbi_score = _unary(_shortest.viterbi_score, "viterbi_score")
viterbi_path = _unary(_shortest.viterbi_path, "viterbi_path")


def union(graphs):
    """The union of a list of graphs (or, for a list of lists, of each inner list)."""
    if graphs and all(_is_list(x) for x in graphs):
        return parallel_map(_union, graphs)
    return _union(graphs)


def concat(g1, g2=None):
    """``concat(g1, g2)``, ``concat([g, ...])``, or lists of either (one result per item)."""
    if g2 is not None:
        if _is_list(g1):
            return parallel_map(lambda a, b: _concat([a, b]), g1, g2)
        return _concat([g1, g2])
    if g1 and all(_is_list(x) for x in g1):
        return parallel_map(_concat, g1)
    return _concat(g1)


def remove(g, ilabel=epsilon, olabel=None, **kwargs):
    """Removes arcs labelled ``ilabel:olabel`` (default epsilon), joining their ends.

    ``remove(g)``, ``remove(g, label)``, ``remove(g, ilabel, olabel)``, or
    ``remove([g, ...], [label, ...])``. As in GTN, the result's arcs carry weight 0 and it
    has no gradient (backward through it raises ``RuntimeError``).
    """
    g = kwargs.pop("graphs", g)
    ilabel = kwargs.pop("labels", kwargs.pop("label", ilabel))
    if kwargs:
        raise TypeError(f"remove() got unexpected arguments {list(kwargs)}")
    if _is_list(g):
        labels = list(ilabel) if _is_list(ilabel) else [ilabel]
        return parallel_map(lambda x, lab: _compose.remove(_check_graph(x, "g"), lab, lab), g, labels)
    return _compose.remove(_check_graph(g, "g"), ilabel, ilabel if olabel is None else olabel)
