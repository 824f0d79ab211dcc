"""Random paths through graphs: GTN's ``sample`` and ``rand_equivalent``.

Randomness comes from Python's :mod:`random` module (``random.seed`` makes it
repeatable), where GTN uses C's ``rand``.
"""

from __future__ import annotations

import random

import numpy as np

from .graph import _FLOAT, _INT, Graph

__all__ = ["sample", "rand_equivalent"]


def sample(g: Graph, max_length: int = 1000) -> Graph:
    """A random accepting path of ``g``, as a linear graph.

    As GTN: the walk starts at a uniformly chosen start node; at each node it picks
    uniformly among the out-arcs and, at an accept node, the extra choice of stopping.
    After ``max_length + 1`` steps the walk is cut back to the last accept node it
    visited. A walk that reaches a node with no way on, or never visits an accept node,
    gives the empty graph (no nodes). The path's arcs copy the labels and weights of the
    arcs walked, and ``backward`` sends each path arc's gradient to the arc it copied.

    Args:
        g: the graph.
        max_length: the longest walk (in arcs) tried.
    """
    if not isinstance(g, Graph):
        raise TypeError(f"g must be a gtn.Graph, got {type(g).__name__}")
    max_length = int(max_length)
    if max_length < 0:
        raise ValueError(f"max_length must be >= 0, got {max_length}")
    s = g._s
    if not s.start_ids or not s.accept_ids:
        return Graph()
    _, dst, _, _ = s.arrays()
    _, _, out_off, out_arcs = s.csr()
    rand = random.randrange
    arcs = []
    node = s.start_ids[rand(len(s.start_ids))]
    accept_length = 0
    for length in range(max_length + 1):
        num_out = int(out_off[node + 1] - out_off[node])
        choices = num_out + s.accept[node]
        if s.accept[node]:
            accept_length = length + 1
        if choices == 0:  # a dead end
            return Graph()
        i = rand(choices)
        if i == num_out:  # stop at this accept node
            break
        arc = int(out_arcs[out_off[node] + i])
        arcs.append(arc)
        node = int(dst[arc])
    if accept_length == 0:
        return Graph()
    picked = np.array(arcs[: accept_length - 1], dtype=np.int64)
    _, _, il, ol = s.arrays()
    n = len(picked)
    chain = np.arange(n, dtype=_INT)
    path = Graph._from_arrays(
        n + 1,
        [0],
        [n],
        chain,
        chain + 1,
        il[picked],
        ol[picked],
        g._weights()[picked].astype(_FLOAT),
        calc_grad=g.calc_grad,
    )

    def grad(inputs, deltas):
        if inputs[0].calc_grad:
            out = np.zeros(inputs[0].num_arcs(), dtype=_FLOAT)
            np.add.at(out, picked, deltas._weights())
            inputs[0]._add_grad(out)

    path._set_grad_func([g._alias(weights=False)], grad)
    return path


def rand_equivalent(g1: Graph, g2: Graph, num_samples: int = 1000, tol: float = 1e-4, max_length: int = 1000) -> bool:
    """Whether two graphs look equivalent on random paths (a probabilistic check).

    As GTN: ``num_samples`` times, a path is sampled from ``g1`` or ``g2`` (chosen at
    random); both graphs are composed with the path's input and output sides, and their
    forward scores on it must agree within ``tol`` (or both compositions be empty).
    Empty samples are skipped. The default of 1000 samples is that of GTN's Python
    ``gtn.rand_equivalent`` (its C++ default is 100).
    """
    from .functions import compose, forward_score, project_input, project_output
    from .utils import equal

    empty = Graph()
    for _ in range(int(num_samples)):
        path = sample(g1 if random.randrange(2) else g2, max_length)
        path.calc_grad = False
        if equal(path, empty):
            continue
        inp = project_input(path)
        outp = project_output(path)
        scores = []
        for g in (g1, g2):
            composed = compose(inp, g)
            composed.calc_grad = False
            composed = compose(composed, outp)
            scores.append(None if equal(composed, empty) else composed)
        if (scores[0] is None) != (scores[1] is None):
            return False
        if scores[0] is None:
            continue
        a = forward_score(scores[0]).item()
        b = forward_score(scores[1]).item()
        if abs(a - b) > tol:
            return False
    return True
