"""LF-MMI topologies and numerators, checked against alignments enumerated from their definitions.

The reference here never reads the graphs: :func:`alignments` writes down, for a token sequence
``y`` and ``T`` frames, every frame-class sequence that spells ``y`` (one entry per topology
path) straight from the definition of each topology (module docstring of
``lightning_gtn.core.topologies``); the graphs' paths are enumerated separately and compared.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

import lightning_gtn.wfst as gtn
from lightning_gtn.core.topologies import MMI_TOPOLOGIES, num_classes, numerator_graph, topology_graph
from lightning_gtn.wfst.criterion import ctc_graph


def _pieces(y, topology):
    """The segments an alignment of ``y`` is made of: ``(class, min_frames, max_frames)``."""
    big = 1 << 30
    if topology in ("ctc", "modified_ctc"):
        out = [(0, 0, big)]
        for i, k in enumerate(y):
            out.append((k, 1, big))
            must = topology == "ctc" and i + 1 < len(y) and y[i + 1] == k
            out.append((0, 1 if must else 0, big))
        return out
    if topology == "hmm1":
        return [(k - 1, 1, big) for k in y]
    out = []
    for k in y:  # hmm2
        out += [(2 * (k - 1), 1, 1), (2 * (k - 1) + 1, 0, big)]
    return out


def alignments(y, T, topology):
    """Every class sequence of ``T`` frames spelling ``y``, once per way of spending the frames
    on the segments (= once per topology path)."""
    pieces = _pieces(list(y), topology)

    def rec(i, left):
        if i == len(pieces):
            if left == 0:
                yield ()
            return
        c, lo, hi = pieces[i]
        for m in range(lo, min(hi, left) + 1):
            for rest in rec(i + 1, left - m):
                yield (c,) * m + rest

    yield from rec(0, T)


def readings(N, T, topology):
    """``Counter{(class sequence, token sequence): number of paths}`` over every token sequence."""
    out: Counter = Counter()
    for L in range(T + 1):
        for y in itertools.product(range(1, N + 1), repeat=L):
            for x in alignments(y, T, topology):
                out[(x, y)] += 1
    return out


def graph_paths(g, T):
    """``Counter{(input labels, output labels without epsilons): count}`` over the paths of ``T``
    arcs from a start to an accept node (depth-first over the arcs)."""
    a = g.arrays()
    out_arcs: dict[int, list[int]] = {}
    for i, s in enumerate(a.src.tolist()):
        out_arcs.setdefault(s, []).append(i)
    acc = set(a.accept.tolist())
    res: Counter = Counter()

    def rec(node, depth, xs, ys):
        if depth == T:
            if node in acc:
                res[(tuple(xs), tuple(v for v in ys if v != gtn.epsilon))] += 1
            return
        for i in out_arcs.get(node, ()):
            xs.append(int(a.ilabel[i]))
            ys.append(int(a.olabel[i]))
            rec(int(a.dst[i]), depth + 1, xs, ys)
            xs.pop()
            ys.pop()

    for s in a.start.tolist():
        rec(s, 0, [], [])
    return res


@pytest.mark.parametrize("topology", MMI_TOPOLOGIES)
def test_topology_paths_are_the_alignments(topology):
    N = 2
    g = topology_graph(N, topology)
    assert g.num_start() == 1
    C = num_classes(N, topology)
    labels = g.labels_to_numpy()
    assert labels.min() >= 0 and labels.max() < C  # no input epsilon
    for T in range(0, 5):
        assert graph_paths(g, T) == readings(N, T, topology), (topology, T)


def test_topology_sizes():
    for N in (1, 3, 7):
        assert topology_graph(N, "ctc").num_arcs() == (N + 1) ** 2
        assert topology_graph(N, "modified_ctc").num_arcs() == 4 * N + 1
        assert topology_graph(N, "hmm1").num_arcs() == N * N + 2 * N
        assert topology_graph(N, "hmm2").num_arcs() == 2 * N * N + 3 * N
    assert [num_classes(5, t) for t in MMI_TOPOLOGIES] == [6, 6, 5, 10]


@pytest.mark.parametrize("topology", MMI_TOPOLOGIES)
def test_numerator_paths_are_the_alignments_once(topology):
    N = 2
    for y in [(), (1,), (1, 1), (2, 1), (1, 1, 2)]:
        g = numerator_graph(list(y), N, topology)
        assert np.all(g.weights_to_numpy() == 0)
        for T in range(0, 6):
            want = Counter(set(alignments(y, T, topology)))  # each class sequence once
            got = Counter(x for (x, _), c in graph_paths(g, T).items() for _ in range(c))
            assert got == want, (topology, y, T)


def test_ctc_numerator_scores_like_ctc_graph():
    rng = np.random.default_rng(0)
    N = 4
    for y in ([], [1], [2, 2], [1, 2, 2, 3, 1], [4, 4, 4]):
        num = numerator_graph(y, N, "ctc")
        ref = ctc_graph(y, 0)
        for T in (len(y) * 2 + 1, 9):
            em = gtn.linear_graph(T, N + 1)
            em.set_weights(rng.standard_normal(T * (N + 1)).astype(np.float32))
            a = gtn.forward_score(gtn.intersect(num, em)).item()
            b = gtn.forward_score(gtn.intersect(ref, em)).item()
            assert a == pytest.approx(b, rel=1e-5, abs=1e-5), (y, T)


def test_bad_arguments():
    for bad in (0, -1, True, 2.0, "3"):
        with pytest.raises(ValueError, match="num_tokens"):
            topology_graph(bad, "ctc")
    with pytest.raises(ValueError, match="topology"):
        topology_graph(3, "rnnt")
    with pytest.raises(ValueError, match="topology"):
        num_classes(3, "CTC")
    with pytest.raises(ValueError, match="outside"):
        numerator_graph([1, 4], 3, "ctc")
    with pytest.raises(ValueError, match="outside"):
        numerator_graph([0], 3, "hmm1")
    with pytest.raises(ValueError, match="integer"):
        numerator_graph(["a"], 3, "ctc")
    with pytest.raises(ValueError, match="denominator"):
        numerator_graph([1], 3, "ctc", denominator="den")


@pytest.mark.parametrize("topology", MMI_TOPOLOGIES)
def test_topology_graphs_save_load_text_dot(topology, tmp_path):
    g = topology_graph(3, topology)
    gtn.save(tmp_path / "t.bin", g)
    assert gtn.equal(gtn.load(tmp_path / "t.bin"), g)
    gtn.savetxt(tmp_path / "t.txt", g)
    assert gtn.equal(gtn.loadtxt(tmp_path / "t.txt"), g)
    gtn.write_dot(g, tmp_path / "t.dot")
    assert (tmp_path / "t.dot").read_text().count("->") == g.num_arcs()
