"""sample and rand_equivalent."""

import random

import pytest

import lightning_gtn.wfst as gtn

LOOPY = """0
2
0 0 0 0 0.5
0 1 1 1 1.0
1 0 2 2 -1.0
1 2 3 3 2.0
2 2 4 4 0.25
"""


def assert_is_path_of(path, g):
    """The sample is a chain whose arcs, in order, form an accepting walk of g."""
    n = path.num_arcs()
    assert path.num_nodes() == n + 1 and path.start() == [0] and path.accept() == [n]
    assert [(path.srcnode(a), path.dstnode(a)) for a in range(n)] == [(a, a + 1) for a in range(n)]
    # Each arc of LOOPY-like graphs has a distinct label: recover the walk from labels.
    by_label = {g.ilabel(a): a for a in range(g.num_arcs())}
    walk = [by_label[lab] for lab in path.labels_to_list()]
    node = g.srcnode(walk[0]) if walk else None
    if walk:
        assert g.is_start(node)
        for a in walk:
            assert g.srcnode(a) == node
            node = g.dstnode(a)
        assert g.is_accept(node)
    assert path.labels_to_list(False) == [g.olabel(a) for a in walk]
    assert path.weights_to_list() == [g.weight(a) for a in walk]
    return walk


def test_samples_are_accepting_paths_and_reproducible():
    g = gtn.graph_from_text(LOOPY)
    random.seed(7)
    first = [gtn.sample(g).labels_to_list() for _ in range(30)]
    random.seed(7)
    again = [gtn.sample(g).labels_to_list() for _ in range(30)]
    assert first == again
    random.seed(8)
    lengths = set()
    for _ in range(200):
        path = gtn.sample(g)
        walk = assert_is_path_of(path, g)
        lengths.add(len(walk))
    assert len(lengths) > 3  # loops make paths of many lengths


def test_sample_gradient_counts_the_arcs_walked():
    g = gtn.graph_from_text(LOOPY)
    random.seed(3)
    for _ in range(10):
        g.zero_grad()
        path = gtn.sample(g)
        counts = [0.0] * g.num_arcs()
        for lab in path.labels_to_list():
            counts[lab] += 1.0
        gtn.backward(path)
        if path.num_arcs():
            assert g.grad().weights_to_list() == counts
    nograd = gtn.graph_from_text(LOOPY)
    nograd.calc_grad = False
    assert not gtn.sample(nograd).calc_grad


def test_max_length_bounds_the_walk():
    g = gtn.Graph()
    g.add_node(True, True)
    g.add_arc(0, 0, 1)  # an endless loop at an accept node
    random.seed(0)
    for max_length in (0, 1, 5):
        for _ in range(20):
            path = gtn.sample(g, max_length)
            assert path.num_arcs() <= max_length and path.num_nodes() == path.num_arcs() + 1
    with pytest.raises(ValueError, match="max_length"):
        gtn.sample(g, -1)


def test_samples_that_find_no_accepting_path_are_empty():
    empty = gtn.Graph()
    no_accept = gtn.graph_from_text("0\n1\n")
    no_accept_graph = gtn.Graph()
    no_accept_graph.add_node(True)
    dead_end = gtn.Graph()
    dead_end.add_node(True)
    dead_end.add_node()
    dead_end.add_node(False, True)
    dead_end.add_arc(0, 1, 0)  # node 1 leads nowhere and does not accept
    for g in (empty, no_accept_graph, dead_end):
        assert gtn.equal(gtn.sample(g), gtn.Graph())
    # A start node that accepts gives the empty path (one node, no arcs).
    p = gtn.sample(gtn.graph_from_text("0\n0\n"))
    assert p.num_nodes() == 1 and p.start() == [0] and p.accept() == [0]
    # Node 1 of no_accept is an accept node but unreachable: the walk dead-ends at 0.
    assert gtn.equal(gtn.sample(no_accept), gtn.Graph())


def test_rand_equivalent_tells_equal_graphs_from_different_ones():
    g = gtn.graph_from_text("0\n2\n0 1 0 0 1.0\n1 2 1 1 2.0\n0 2 2 2 0.5\n")
    # The same language and scores with nodes renumbered and arcs reordered.
    h = gtn.graph_from_text("0\n1\n0 1 2 2 0.5\n2 1 1 1 2.0\n0 2 0 0 1.0\n")
    random.seed(11)
    assert gtn.rand_equivalent(g, h, num_samples=50)
    w = h.weights_to_numpy()
    w[1] += 0.1
    h.set_weights(w)
    assert not gtn.rand_equivalent(g, h, num_samples=50)
    assert gtn.rand_equivalent(g, h, num_samples=50, tol=0.2)
    other = gtn.graph_from_text("0\n2\n0 1 0 0 1.0\n1 2 3 3 2.0\n0 2 2 2 0.5\n")
    assert not gtn.rand_equivalent(g, other, num_samples=50)
