"""Graphs pickle and deep-copy (GTN's cannot: DDP spawn and DataLoader workers need it)."""

import copy
import multiprocessing as mp
import pickle

import numpy as np
import pytest

import lightning_gtn.wfst as gtn


def sample_graph(calc_grad=True):
    g = gtn.Graph(calc_grad)
    for i in range(5):
        g.add_node(i in (0, 2), i == 4)
    g.make_accept(1)  # accept ids out of node order
    g.add_arc(0, 1, 3, 1, 0.25)
    g.add_arc(0, 2, 1, gtn.epsilon, -1.5)
    g.add_arc(1, 4, 0, 0, 2.0)
    g.add_arc(0, 3, 2, 2, np.inf)
    g.add_arc(3, 4, gtn.epsilon, 5, 1e-8)
    return g


def assert_same(g, h):
    assert gtn.equal(g, h)
    assert h.start() == g.start() and h.accept() == g.accept()
    assert h.labels_to_list(False) == g.labels_to_list(False)
    assert h.weights_to_numpy().tobytes() == g.weights_to_numpy().tobytes()
    assert h.calc_grad == g.calc_grad
    assert (h.ilabel_sorted, h.olabel_sorted) == (g.ilabel_sorted, g.olabel_sorted)
    for n in range(g.num_nodes()):
        assert h.out_arcs(n) == g.out_arcs(n) and h.in_arcs(n) == g.in_arcs(n)


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_round_trip(protocol):
    for calc_grad in (True, False):
        g = sample_graph(calc_grad)
        assert_same(g, pickle.loads(pickle.dumps(g, protocol=protocol)))


def test_pickle_keeps_arc_sort_order_and_flags():
    g = sample_graph()
    g.arc_sort(olabel=True)
    h = pickle.loads(pickle.dumps(g))
    assert h.olabel_sorted and not h.ilabel_sorted
    assert h.out_arcs(0) == [1, 0, 3]  # output labels -1, 1, 2
    assert_same(g, h)
    lin = gtn.linear_graph(3, 4)
    h = pickle.loads(pickle.dumps(lin))
    assert h.ilabel_sorted and h.olabel_sorted


def test_unpickled_graph_is_independent_and_usable():
    g = sample_graph()
    h = pickle.loads(pickle.dumps(g))
    h.set_weights(np.zeros(5, dtype=np.float32))
    h.add_arc(4, 0, 1)
    assert g.num_arcs() == 5 and g.weight(0) == 0.25
    assert h.num_arcs() == 6
    out = gtn.union([h, g])
    gtn.backward(out)
    assert h.grad().weights_to_list() == [1.0] * 6


def test_a_computed_graph_pickles_as_a_leaf():
    a, b = sample_graph(), sample_graph()
    u = gtn.union([a, b])
    h = pickle.loads(pickle.dumps(u))
    assert_same(u, h)
    assert h.calc_grad and not h.is_grad_available()
    gtn.backward(h)  # its history stays behind: the inputs get nothing
    assert not a.is_grad_available() and not b.is_grad_available()
    assert h.grad().weights_to_list() == [1.0] * 10


def test_deepcopy_and_copy():
    g = sample_graph()
    g.arc_sort()
    d = copy.deepcopy(g)
    assert_same(g, d)
    d.set_weight(0, 9.0)
    assert g.weight(0) == 0.25
    holder = copy.deepcopy({"a": g, "b": g})
    assert holder["a"] is holder["b"]  # the memo keeps shared graphs shared
    c = copy.copy(g)  # a shallow copy is another handle on the same graph, as in GTN
    c.set_weight(0, 7.0)
    assert g.weight(0) == 7.0 and c.id() == g.id()


def _score_in_child(g):
    return g.num_arcs(), g.weights_to_list(), g.labels_to_list(False), g.accept()


def test_graphs_cross_process_boundaries_with_spawn():
    g = sample_graph()
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        ((n, w, labels, accept),) = pool.map(_score_in_child, [g])
    assert n == 5 and accept == [4, 1]
    assert labels == g.labels_to_list(False)
    np.testing.assert_array_equal(np.array(w, dtype=np.float32), g.weights_to_numpy())
