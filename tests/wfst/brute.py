"""An independent reference for the engine's heavy operations: enumerate every path.

Only for small acyclic graphs. Nothing here shares code with the engine: graphs are read
through the public accessors, and every quantity is recomputed from the list of accepting
paths in plain Python (float64).
"""

from __future__ import annotations

import math
from typing import Dict, List, Sequence, Tuple

import lightning_gtn.wfst as gtn

EPS = gtn.epsilon


class Path:
    """One accepting path: its arc ids, label strings (epsilons dropped) and weight."""

    __slots__ = ("arcs", "inputs", "outputs", "weight")

    def __init__(self, arcs, inputs, outputs, weight):
        self.arcs = tuple(arcs)
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.weight = weight

    def __repr__(self):
        return f"Path(arcs={self.arcs}, in={self.inputs}, out={self.outputs}, w={self.weight})"


def graph_from_text(text: str, calc_grad: bool = True) -> gtn.Graph:
    """A graph from GTN's text format: start ids, accept ids, then ``src dst il [ol [w]]``."""
    lines = [ln.strip() for ln in text.strip().splitlines()]
    starts = [int(x) for x in lines[0].split()]
    accepts = [int(x) for x in lines[1].split()]
    arcs = [ln.split() for ln in lines[2:] if ln]
    n = max([0] + [s + 1 for s in starts] + [a + 1 for a in accepts] + [max(int(a[0]), int(a[1])) + 1 for a in arcs])
    g = gtn.Graph(calc_grad)
    for i in range(n):
        g.add_node(i in starts, i in accepts)
    for a in arcs:
        src, dst, il = int(a[0]), int(a[1]), int(a[2])
        ol = int(a[3]) if len(a) > 3 else il
        w = float(a[4]) if len(a) > 4 else 0.0
        g.add_arc(src, dst, il, ol, w)
    return g


def arcs_of(g: gtn.Graph):
    """``[(src, dst, ilabel, olabel, weight), ...]`` in arc-id order."""
    il = g.labels_to_list()
    ol = g.labels_to_list(False)
    w = g.weights_to_list()
    return [(g.srcnode(a), g.dstnode(a), il[a], ol[a], w[a]) for a in range(g.num_arcs())]


def accepting_paths(g: gtn.Graph, limit: int = 100_000) -> List[Path]:
    """Every path from a start node to an accept node (the empty one included)."""
    arcs = arcs_of(g)
    out_arcs: Dict[int, List[int]] = {n: [] for n in range(g.num_nodes())}
    for a, (s, _, _, _, _) in enumerate(arcs):
        out_arcs[s].append(a)
    accept = {n for n in range(g.num_nodes()) if g.is_accept(n)}
    paths: List[Path] = []
    stack = [(n, ()) for n in range(g.num_nodes()) if g.is_start(n)]
    while stack:
        node, taken = stack.pop()
        if len(taken) > g.num_arcs() + 1:
            raise ValueError("graph has a cycle: the brute-force reference needs acyclic graphs")
        if node in accept:
            ins = [arcs[a][2] for a in taken if arcs[a][2] != EPS]
            outs = [arcs[a][3] for a in taken if arcs[a][3] != EPS]
            paths.append(Path(taken, ins, outs, math.fsum(arcs[a][4] for a in taken)))
            if len(paths) > limit:
                raise ValueError("too many paths for the brute-force reference")
        for a in out_arcs[node]:
            stack.append((arcs[a][1], taken + (a,)))
    return paths


def logsumexp(xs: Sequence[float]) -> float:
    xs = list(xs)
    if not xs:
        return -math.inf
    m = max(xs)
    if m in (math.inf, -math.inf):
        return m
    return m + math.log(math.fsum(math.exp(x - m) for x in xs))


def forward_score(g: gtn.Graph) -> float:
    return logsumexp(p.weight for p in accepting_paths(g))


def viterbi_score(g: gtn.Graph) -> float:
    return max((p.weight for p in accepting_paths(g)), default=-math.inf)


def forward_grad(g: gtn.Graph) -> List[float]:
    """d forward_score / d weight: the expected number of times each arc is used."""
    paths = accepting_paths(g)
    z = logsumexp(p.weight for p in paths)
    grad = [0.0] * g.num_arcs()
    if z == -math.inf:
        return grad
    for p in paths:
        post = math.exp(p.weight - z)
        for a in p.arcs:
            grad[a] += post
    return grad


def best_paths(g: gtn.Graph) -> List[Path]:
    """All accepting paths of the largest weight."""
    paths = accepting_paths(g)
    if not paths:
        return []
    m = max(p.weight for p in paths)
    return [p for p in paths if p.weight == m]


def arc_counts(path: Path, num_arcs: int) -> List[float]:
    grad = [0.0] * num_arcs
    for a in path.arcs:
        grad[a] += 1.0
    return grad


def relation(g: gtn.Graph) -> Dict[Tuple[tuple, tuple], List[float]]:
    """The weighted relation a graph defines: label strings -> sorted path weights."""
    rel: Dict[Tuple[tuple, tuple], List[float]] = {}
    for p in accepting_paths(g):
        rel.setdefault((p.inputs, p.outputs), []).append(p.weight)
    return {k: sorted(v) for k, v in rel.items()}


def composed_relation(g1: gtn.Graph, g2: gtn.Graph) -> Dict[Tuple[tuple, tuple], List[float]]:
    """The relation of ``compose(g1, g2)`` from pairs of paths.

    Each pair of accepting paths whose middle strings agree (``g1``'s outputs equal
    ``g2``'s inputs, epsilons dropped) must appear exactly once in the composition,
    with the sum of both weights.
    """
    p2_by_input: Dict[tuple, List[Path]] = {}
    for p in accepting_paths(g2):
        p2_by_input.setdefault(p.inputs, []).append(p)
    rel: Dict[Tuple[tuple, tuple], List[float]] = {}
    for p1 in accepting_paths(g1):
        for p2 in p2_by_input.get(p1.outputs, []):
            rel.setdefault((p1.inputs, p2.outputs), []).append(p1.weight + p2.weight)
    return {k: sorted(v) for k, v in rel.items()}
