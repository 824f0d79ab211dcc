"""forward_score, viterbi_score, viterbi_path: path enumeration, GTN's edge cases and ties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import lightning_gtn.wfst as gtn

from . import brute
from .brute import graph_from_text
from .test_compose import small_graphs

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

COMPLEX = """
0 1
3 4
0 1 0 0 2
0 2 1 1 1
1 2 0 0 2
2 3 0 0 1
2 3 1 1 1
1 4 0 0 2
2 4 1 1 3
3 4 0 0 2
"""


# -- against path enumeration ------------------------------------------------------------------


@SETTINGS
@given(small_graphs(max_nodes=6, max_arcs=12))
def test_forward_score_and_gradient_match_enumeration(g):
    expect = brute.forward_score(g)
    out = gtn.forward_score(g)
    if expect == -math.inf:
        assert out.item() == -math.inf
    else:
        assert out.item() == pytest.approx(expect, rel=1e-6, abs=1e-5)
    gtn.backward(out)
    got = g.grad().weights_to_list()
    assert not any(math.isnan(x) for x in got)
    assert got == pytest.approx(brute.forward_grad(g), abs=1e-5)


@SETTINGS
@given(small_graphs(max_nodes=6, max_arcs=12))
def test_viterbi_score_and_gradient_follow_a_best_path(g):
    best = brute.best_paths(g)
    out = gtn.viterbi_score(g)
    assert out.item() == pytest.approx(brute.viterbi_score(g), abs=1e-6)
    gtn.backward(out)
    grad = g.grad().weights_to_list()
    if not best:
        assert grad == [0.0] * g.num_arcs()
    else:
        assert grad in [brute.arc_counts(p, g.num_arcs()) for p in best]


@SETTINGS
@given(small_graphs(max_nodes=6, max_arcs=12))
def test_viterbi_path_is_a_best_path_laid_out_as_a_chain(g):
    best = brute.best_paths(g)
    path = gtn.viterbi_path(g)
    if not best:
        assert path.num_nodes() == 0 and path.num_arcs() == 0
        return
    k = path.num_arcs()
    assert path.num_nodes() == k + 1
    assert path.start() == [0] and path.accept() == [k]
    assert [(path.srcnode(a), path.dstnode(a)) for a in range(k)] == [(a, a + 1) for a in range(k)]
    arcs = brute.arcs_of(g)
    # The path copies the labels and weights of one of the best paths, in order.
    copies = [[(arcs[a][2], arcs[a][3], arcs[a][4]) for a in p.arcs] for p in best]
    got = list(zip(path.labels_to_list(), path.labels_to_list(False), path.weights_to_list()))
    assert got in copies
    assert gtn.viterbi_score(path).item() == gtn.viterbi_score(g).item()
    # Its gradient lands on the arcs it copies.
    gtn.backward(path)
    assert g.grad().weights_to_list() in [brute.arc_counts(p, g.num_arcs()) for p in best]


def _fd(fn, g, eps=1e-3):
    w = g.weights_to_numpy().astype(np.float64)
    out = []
    for a in range(len(w)):
        hi, lo = w.copy(), w.copy()
        hi[a] += eps
        lo[a] -= eps
        g.set_weights(hi.astype(np.float32))
        f_hi = fn(g).item()
        g.set_weights(lo.astype(np.float32))
        f_lo = fn(g).item()
        out.append((f_hi - f_lo) / (2 * eps))
    g.set_weights(w.astype(np.float32))
    return out


@pytest.mark.parametrize("fn", [gtn.forward_score, gtn.viterbi_score])
def test_finite_differences(fn):
    g = graph_from_text(COMPLEX)
    g.set_weights([2.0, 1.1, 2.3, 1.05, 0.7, 2.2, 3.4, 2.05])  # no ties for viterbi
    gtn.backward(fn(g))
    assert g.grad().weights_to_list() == pytest.approx(_fd(fn, g), abs=2e-2)


def test_gradient_is_scaled_by_the_incoming_gradient():
    g = graph_from_text(COMPLEX)
    for fn in (gtn.forward_score, gtn.viterbi_score):
        g.zero_grad()
        gtn.backward(fn(g))
        unit = np.array(g.grad().weights_to_list())
        g.zero_grad()
        out = fn(g)
        seed = gtn.scalar_graph(-2.5)
        gtn.backward(out, seed)
        assert g.grad().weights_to_list() == pytest.approx((-2.5 * unit).tolist(), abs=1e-6)


# -- GTN's values on its documented cases --------------------------------------------------------


def test_known_values():
    g = graph_from_text(COMPLEX)
    assert gtn.forward_score(g).item() == pytest.approx(8.36931, abs=1e-4)
    assert gtn.viterbi_score(g).item() == 7.0
    simple = graph_from_text("""
        0
        2
        0 1 0 0 1
        0 1 1 1 2
        0 1 2 2 3
        1 2 0 0 1
        1 2 1 1 2
        1 2 2 2 3
    """)
    assert gtn.forward_score(simple).item() == pytest.approx(6.8152, abs=1e-4)
    assert gtn.viterbi_score(simple).item() == 6.0


def test_empty_graph_and_graph_without_accepting_path():
    g = gtn.Graph()
    assert gtn.forward_score(g).item() == -math.inf
    assert gtn.viterbi_score(g).item() == -math.inf
    assert gtn.equal(gtn.viterbi_path(g), g)
    # Arcs but no way from a start node to an accept node: -inf and zero gradients.
    g = graph_from_text("""
        0
        3
        0 1 0 0 1
        2 3 0 0 1
    """)
    for fn in (gtn.forward_score, gtn.viterbi_score):
        g.zero_grad()
        out = fn(g)
        assert out.item() == -math.inf
        gtn.backward(out)
        assert g.grad().weights_to_list() == [0.0, 0.0]
    assert gtn.viterbi_path(g).num_nodes() == 0


def test_start_node_that_accepts_adds_the_empty_path():
    g = gtn.Graph()
    g.add_node(True, True)
    assert gtn.forward_score(g).item() == 0.0
    assert gtn.viterbi_score(g).item() == 0.0
    assert gtn.equal(gtn.viterbi_path(g), g)
    g = graph_from_text("""
        0
        0 1
        0 1 0 0 1.5
    """)
    assert gtn.forward_score(g).item() == pytest.approx(math.log(1 + math.exp(1.5)))
    gtn.backward(gtn.forward_score(g))
    assert g.grad().weights_to_list() == pytest.approx([math.exp(1.5) / (1 + math.exp(1.5))])


def test_non_start_node_without_in_arcs_contributes_nothing():
    # GTN's C++ release: such a node simply scores -inf (older Python tests expected an error).
    g = graph_from_text("""
        0
        2
        1 2 0
    """)
    assert gtn.forward_score(g).item() == -math.inf
    g.add_arc(0, 2, 0, 0, 1.0)
    out = gtn.forward_score(g)
    assert out.item() == pytest.approx(1.0)
    gtn.backward(out)
    assert g.grad().weights_to_list() == [0.0, 1.0]


def test_infinite_weights_behave_like_gtn():
    g = graph_from_text("""
        0
        1
        0 1 0 0 -inf
        0 1 1 1 -inf
    """)
    out = gtn.forward_score(g)
    assert out.item() == -math.inf
    gtn.backward(out)
    assert g.grad().weights_to_list() == [0.0, 0.0]
    g = graph_from_text("""
        0
        1
        0 1 0 0 -inf
        0 1 1 1 1.0
    """)
    gtn.backward(gtn.forward_score(g))
    assert g.grad().weights_to_list() == [0.0, 1.0]
    g = graph_from_text("""
        0
        1
        0 1 0 0 inf
        0 1 1 1 0
    """)
    out = gtn.forward_score(g)
    assert out.item() == math.inf
    gtn.backward(out)
    assert all(math.isnan(x) for x in g.grad().weights_to_list())


def test_long_graphs_stay_finite(rng):
    # 5000 frames of scores near -40: exp() of the path total underflows in any precision,
    # the per-node log-sum-exp does not.
    T, C = 5000, 4
    em = (rng.standard_normal((T, C)) - 40).astype(np.float32)
    g = gtn.linear_graph(T, C)
    g.set_weights(em)
    out = gtn.forward_score(g)
    expect = np.logaddexp.reduce(em.astype(np.float64), axis=1).sum()
    assert out.item() == pytest.approx(expect, rel=1e-6)
    gtn.backward(out)
    post = np.array(g.grad().weights_to_list()).reshape(T, C)
    assert np.allclose(post.sum(axis=1), 1.0, atol=1e-4)
    soft = np.exp(em - np.logaddexp.reduce(em.astype(np.float64), axis=1, keepdims=True))
    assert np.allclose(post, soft, atol=1e-5)


# -- cycles ------------------------------------------------------------------------------------


CYCLES = {
    "self-loop on a start and accept node": """
        0
        0
        0 0 1
    """,
    "self-loop inside": """
        0
        2
        0 1 0
        1 2 0
        1 1 0
    """,
    "self-loop on the accept node": """
        0
        2
        0 1 0
        1 2 0
        2 2 0
    """,
    "cycle through the start node": """
        0
        2
        0 1 0
        1 2 0
        2 0 0
    """,
}


@pytest.mark.parametrize("name", sorted(CYCLES))
@pytest.mark.parametrize("fn", [gtn.forward_score, gtn.viterbi_score, gtn.viterbi_path])
def test_cycles_before_an_accept_node_raise_value_error(name, fn):
    g = graph_from_text(CYCLES[name])
    with pytest.raises(ValueError, match="cycle"):
        fn(g)


def test_cycles_that_lead_to_no_accept_node_are_allowed():
    g = graph_from_text("""
        0
        1
        0 1 0 0 1
        1 2 0 0 1
        2 2 0 0 1
    """)
    assert gtn.forward_score(g).item() == pytest.approx(1.0)
    assert gtn.viterbi_score(g).item() == pytest.approx(1.0)
    gtn.backward(gtn.forward_score(g))
    assert g.grad().weights_to_list() == [1.0, 0.0, 0.0]


# -- ties and layout, as GTN ------------------------------------------------------------------------


def test_viterbi_ties_go_to_the_first_in_arc_and_the_first_accept_node():
    g = graph_from_text("""
        0
        1
        0 1 0 0 1
        0 1 1 1 1
    """)
    gtn.backward(gtn.viterbi_score(g))
    assert g.grad().weights_to_list() == [1.0, 0.0]
    path = gtn.viterbi_path(g)
    assert path.labels_to_list() == [0]
    g = gtn.Graph()
    g.add_node(True)
    g.add_node()
    g.add_node()
    g.make_accept(2)
    g.make_accept(1)
    g.add_arc(0, 1, 0, 0, 1)
    g.add_arc(0, 2, 1, 1, 1)
    assert g.accept() == [2, 1]
    gtn.backward(gtn.viterbi_score(g))
    assert g.grad().weights_to_list() == [0.0, 1.0]  # accept list order: node 2 first
    assert gtn.viterbi_path(g).labels_to_list() == [1]


def test_start_node_ties_differ_between_score_and_path_as_in_gtn():
    # Node 1 is a start node reached by an arc of weight 0: viterbi_score's gradient picks
    # the arc (in-arcs are compared first), viterbi_path keeps the empty path.
    g = graph_from_text("""
        0 1
        1
        0 1 0 0 0
    """)
    gtn.backward(gtn.viterbi_score(g))
    assert g.grad().weights_to_list() == [1.0]
    path = gtn.viterbi_path(g)
    assert path.num_nodes() == 1 and path.num_arcs() == 0
    assert path.start() == [0] and path.accept() == [0]


def test_viterbi_path_layout_and_gradient():
    g = graph_from_text(COMPLEX)
    g.set_weights([2, 1, 2, 1, 3, 2, 3, 2])
    path = gtn.viterbi_path(g)
    expect = graph_from_text("""
        0
        4
        0 1 0 0 2
        1 2 0 0 2
        2 3 1 1 3
        3 4 0 0 2
    """)
    assert gtn.equal(path, expect)
    # Different gradients on the path's arcs reach the arcs they copy.
    gtn.backward(
        path,
        graph_from_text("""
        0
        4
        0 1 0 0 1
        1 2 0 0 2
        2 3 1 1 3
        3 4 0 0 4
    """),
    )
    assert g.grad().weights_to_list() == [1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 0.0, 4.0]


def test_results_need_a_gradient_when_the_input_does():
    g = graph_from_text(COMPLEX, calc_grad=False)
    for fn in (gtn.forward_score, gtn.viterbi_score, gtn.viterbi_path):
        assert not fn(g).calc_grad
    g = graph_from_text(COMPLEX, calc_grad=True)
    for fn in (gtn.forward_score, gtn.viterbi_score, gtn.viterbi_path):
        assert fn(g).calc_grad


def test_sorted_arcs_give_the_same_scores():
    g = graph_from_text(COMPLEX)
    before = (gtn.forward_score(g).item(), gtn.viterbi_score(g).item())
    g.arc_sort(True)
    assert (gtn.forward_score(g).item(), gtn.viterbi_score(g).item()) == pytest.approx(before)


def _nan_graph():
    """0 -a0-> 1 -a1(NaN)-> 2 (accept), and 0 -a2(1.5)-> 2: one path is NaN, one finite."""
    g = gtn.Graph()
    g.add_node(True)
    g.add_node()
    g.add_node(False, True)
    g.add_arc(0, 1, 0, 0, 1.0)
    g.add_arc(1, 2, 1, 1, float("nan"))
    g.add_arc(0, 2, 2, 2, 1.5)
    return g


def test_nan_weights_propagate_to_the_scores():
    # Finding 10 of the second probe: forward_score dropped the NaN path (-inf or the finite
    # path's value), viterbi_score returned 1.5 and viterbi_path the finite path.
    g = _nan_graph()
    assert math.isnan(gtn.forward_score(g).item())
    assert math.isnan(gtn.viterbi_score(g).item())
    with pytest.raises(ValueError, match="NaN"):
        gtn.viterbi_path(g)
    single = gtn.Graph()
    single.add_node(True)
    single.add_node(False, True)
    single.add_arc(0, 1, 0, 0, float("nan"))
    assert math.isnan(gtn.forward_score(single).item())
    assert math.isnan(gtn.viterbi_score(single).item())
    # through intersect the NaN path stays
    h = gtn.Graph()
    h.add_node(True)
    h.add_node()
    h.add_node(False, True)
    h.add_arc(0, 1, 0)
    h.add_arc(1, 2, 1)
    h.add_arc(0, 2, 2)
    assert math.isnan(gtn.forward_score(gtn.intersect(g, h)).item())
    assert math.isnan(gtn.forward_score(gtn.compose(g, h)).item())
    # a NaN on a path that reaches no accept node changes nothing
    g.add_node()
    g.add_arc(0, 3, 4, 4, float("nan"))
    g.set_weight(1, 0.25)
    assert gtn.forward_score(g).item() == pytest.approx(math.log(math.exp(1.25) + math.exp(1.5)))
