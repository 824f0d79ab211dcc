"""compose, intersect and remove: GTN's exact output, path-enumeration reference, gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lightning_gtn.wfst as gtn

from . import brute
from .brute import graph_from_text

EPS = gtn.epsilon
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def small_graphs(draw, labels=(EPS, 0, 1, 2), acceptor=False, max_nodes=5, max_arcs=10):
    """Random small acyclic graphs: node ids shuffled (so they are not a topological order),
    epsilons, several (or no) start and accept nodes, start nodes that also accept."""
    n = draw(st.integers(1, max_nodes))
    rank = draw(st.permutations(range(n)))
    g = gtn.Graph()
    starts = draw(st.sets(st.integers(0, n - 1), max_size=2))
    accepts = draw(st.sets(st.integers(0, n - 1), max_size=3))
    if draw(st.booleans()):  # usually a start at the top and an accept at the bottom
        starts.add(rank[0])
        accepts.add(rank[n - 1])
    for i in range(n):
        g.add_node(i in starts, i in accepts)
    for _ in range(draw(st.integers(0, max_arcs))):
        u, v = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        if u == v:
            continue
        u, v = min(u, v), max(u, v)  # acyclic in rank order
        il = draw(st.sampled_from(labels))
        ol = il if acceptor else draw(st.sampled_from(labels))
        g.add_arc(rank[u], rank[v], il, ol, draw(st.integers(-8, 8)) / 4)
    return g


def assert_same_relation(got, expect):
    assert set(got) == set(expect)
    for key in expect:
        assert got[key] == pytest.approx(expect[key], abs=1e-5)


def assert_trim(g: gtn.Graph):
    """Every node of g lies on a path from a start node to an accept node."""
    fwd = set(g.start())
    stack = list(fwd)
    while stack:
        n = stack.pop()
        for a in g.out_arcs(n):
            d = g.dstnode(a)
            if d not in fwd:
                fwd.add(d)
                stack.append(d)
    bwd = set(g.accept())
    stack = list(bwd)
    while stack:
        n = stack.pop()
        for a in g.in_arcs(n):
            s = g.srcnode(a)
            if s not in bwd:
                bwd.add(s)
                stack.append(s)
    assert fwd == bwd == set(range(g.num_nodes()))


def composed_grads(g1, g2):
    """Exact gradients of forward_score(compose(g1, g2)) from pairs of paths."""
    p2_by_input = {}
    for p in brute.accepting_paths(g2):
        p2_by_input.setdefault(p.inputs, []).append(p)
    pairs = [(p1, p2) for p1 in brute.accepting_paths(g1) for p2 in p2_by_input.get(p1.outputs, [])]
    z = brute.logsumexp(p1.weight + p2.weight for p1, p2 in pairs)
    d1, d2 = [0.0] * g1.num_arcs(), [0.0] * g2.num_arcs()
    for p1, p2 in pairs:
        post = math.exp(p1.weight + p2.weight - z)
        for a in p1.arcs:
            d1[a] += post
        for a in p2.arcs:
            d2[a] += post
    return z, d1, d2


def sort_as(g, how):
    if how == "ilabel":
        g.arc_sort()
    elif how == "olabel":
        g.arc_sort(True)
    return g


# -- GTN's exact output ----------------------------------------------------------------------


LINEAR_2x2 = """
0
2
0 1 0 0 1
0 1 1 1 2
1 2 0 0 3
1 2 1 1 4
"""

ONE_TOKEN = """
0
1
0 0 0 0 0.5
0 1 1 1 0.25
1 1 0 0 0.125
"""


@pytest.mark.parametrize("sort1", ["none", "ilabel", "olabel"])
@pytest.mark.parametrize("sort2", ["none", "ilabel", "olabel"])
def test_intersect_gives_gtns_nodes_and_arcs_in_gtns_order(sort1, sort2):
    g1 = sort_as(graph_from_text(LINEAR_2x2), sort1)
    g2 = sort_as(graph_from_text(ONE_TOKEN), sort2)
    out = gtn.intersect(g1, g2)
    # Breadth-first from the start pair (0, 0): (1, 0) and (1, 1) in matcher order, then
    # the accept pair (2, 1); the pair (2, 0) cannot reach an accept pair and is dropped.
    assert out.num_nodes() == 4
    assert out.start() == [0] and out.accept() == [3]
    assert [(out.srcnode(a), out.dstnode(a)) for a in range(out.num_arcs())] == [(0, 1), (0, 2), (1, 3), (2, 3)]
    assert out.labels_to_list() == [0, 1, 1, 0]
    assert out.labels_to_list(False) == [0, 1, 1, 0]
    assert out.weights_to_list() == [1.5, 2.25, 4.25, 3.125]
    gtn.backward(out)
    assert g1.grad().weights_to_list() == [1.0, 1.0, 1.0, 1.0]
    assert g2.grad().weights_to_list() == [1.0, 2.0, 1.0]


def test_compose_follows_epsilons_in_gtns_order():
    g1 = graph_from_text("""
        0
        2
        0 1 0 -1 1.5
        1 2 1 5 2.5
    """)
    g2 = graph_from_text("""
        0
        1
        0 1 5 7 0.5
    """)
    out = gtn.compose(g1, g2)
    assert out.num_nodes() == 3
    assert out.start() == [0] and out.accept() == [2]
    assert [(out.srcnode(a), out.dstnode(a)) for a in range(2)] == [(0, 1), (1, 2)]
    assert out.labels_to_list() == [0, 1]
    assert out.labels_to_list(False) == [EPS, 7]
    assert out.weights_to_list() == [1.5, 3.0]


def test_compose_matches_both_epsilon_sides_once():
    # g1 writes "x" after an epsilon output; g2 reads an epsilon before "x". The epsilon
    # filter must produce exactly one path for this pair of paths, not two.
    g1 = graph_from_text("""
        0
        2
        0 1 1 -1 1
        1 2 2 5 2
    """)
    g2 = graph_from_text("""
        0
        2
        0 1 -1 8 4
        1 2 5 9 8
    """)
    out = gtn.compose(g1, g2)
    rel = brute.relation(out)
    assert rel == {((1, 2), (8, 9)): [15.0]}
    assert gtn.forward_score(out).item() == pytest.approx(15.0)


def test_epsilon_epsilon_arcs_match_each_other():
    g1 = graph_from_text("""
        0
        1
        0 1 3 -1 1
    """)
    g2 = graph_from_text("""
        0
        1
        0 1 -1 4 2
    """)
    out = gtn.compose(g1, g2)
    assert brute.relation(out) == {((3,), (4,)): [3.0]}


def test_calc_grad_of_result_and_gradients_per_input():
    g1 = graph_from_text(LINEAR_2x2, calc_grad=False)
    g2 = graph_from_text(ONE_TOKEN, calc_grad=True)
    out = gtn.intersect(g1, g2)
    assert out.calc_grad
    gtn.backward(gtn.forward_score(out))
    assert g2.is_grad_available() and not g1.is_grad_available()
    none = gtn.intersect(graph_from_text(LINEAR_2x2, False), graph_from_text(ONE_TOKEN, False))
    assert not none.calc_grad


def test_empty_graphs_compose_to_empty_graphs():
    empty = gtn.Graph()
    g = graph_from_text(ONE_TOKEN)
    for a, b in [(empty, g), (g, empty), (empty, empty)]:
        out = gtn.compose(a, b)
        assert out.num_nodes() == 0 and out.num_arcs() == 0
    # No pair of paths agrees: nothing is co-accessible, so no node at all (not even starts).
    other = graph_from_text("""
        0
        1
        0 1 2
    """)
    out = gtn.intersect(g, other)
    assert out.num_nodes() == 0


def test_start_pair_that_accepts_is_an_accept_node():
    g1 = graph_from_text("""
        0
        0 1
        0 1 1
    """)
    g2 = graph_from_text("""
        0
        0
    """)
    out = gtn.intersect(g1, g2)
    assert out.num_nodes() == 1 and out.num_arcs() == 0
    assert out.start() == [0] and out.accept() == [0]
    assert gtn.forward_score(out).item() == 0.0


def test_sorted_flags_that_lie_give_gtns_binary_search_result():
    # mark_arc_sorted without sorting: GTN's matchers then binary-search an unsorted list
    # (std::lower_bound) and may miss matches; the engine probes the same way.
    g1 = graph_from_text("""
        0
        1
        0 1 2
        0 1 0
        0 1 1
    """)
    zero = graph_from_text("""
        0
        1
        0 1 0
    """)
    one = graph_from_text("""
        0
        1
        0 1 1
    """)
    assert gtn.intersect(g1, zero).num_arcs() == 1
    g1.mark_arc_sorted()
    zero.mark_arc_sorted()
    one.mark_arc_sorted()
    # Searching labels [2, 0, 1]: the lower bound of 0 lands on the 2 (missed), the lower
    # bound of 1 on the 1 (found).
    assert gtn.intersect(g1, zero).num_arcs() == 0
    assert gtn.intersect(g1, one).num_arcs() == 1


# -- against path enumeration ------------------------------------------------------------------


@SETTINGS
@given(
    small_graphs(labels=(EPS, 0, 1)),
    small_graphs(labels=(EPS, 0, 1)),
    st.sampled_from(["none", "olabel"]),
    st.sampled_from(["none", "ilabel"]),
)
def test_compose_relation_matches_pairs_of_paths(g1, g2, sort1, sort2):
    sort_as(g1, sort1)
    sort_as(g2, sort2)
    out = gtn.compose(g1, g2)
    assert_same_relation(brute.relation(out), brute.composed_relation(g1, g2))
    assert_trim(out)


@SETTINGS
@given(small_graphs(labels=(EPS, 0, 1)), small_graphs(labels=(EPS, 0, 1)), st.sampled_from([0, 1, 2, 3]))
def test_hash_map_state_store_gives_the_same_graph(g1, g2, kind):
    # Above DENSE_STATES product states the kernel indexes states through a hash map;
    # force that path on small graphs and compare with the dense one, arc for arc.
    from lightning_gtn.wfst import _compose

    dense = _compose._compose(g1, g2, kind)
    hashed = _compose._compose(g1, g2, kind, dense_limit=0)
    assert gtn.equal(dense, hashed)
    assert dense.weights_to_list() == hashed.weights_to_list()


def test_cached_lower_bounds_follow_changes_to_the_graph():
    # compose keeps each sorted graph's lower-bound table; adding arcs or re-sorting must
    # not reuse a stale one. Compare every step with a fresh copy of the graph.
    big = graph_from_text("""
        0
        0 1
        0 1 1 1 0.5
        0 1 2 2 1.0
        1 1 1 1 -0.5
    """)
    path = graph_from_text("""
        0
        2
        0 1 1 1 0
        1 2 1 1 0
    """)

    def check():
        fresh = gtn.loadtxt(__import__("io").StringIO(gtn.graph_to_text(big, summary=False)))
        if big.ilabel_sorted:
            fresh.arc_sort()
        got, want = gtn.compose(path, big), gtn.compose(path, fresh)
        assert gtn.equal(got, want) and got.weights_to_list() == want.weights_to_list()
        return got

    big.arc_sort()
    assert check().num_arcs() == 2
    big.add_arc(0, 1, 0, 0, 2.0)  # label 0 now sorts first: every position of node 0 moves
    assert not big.ilabel_sorted
    check()
    big.arc_sort()
    assert check().num_arcs() == 2  # a stale table would look for label 1 at label 0's place
    big.add_arc(1, 0, 3, 3, 0.0)
    big.arc_sort(True)
    check()


@SETTINGS
@given(small_graphs(acceptor=True, labels=(0, 1, 2)), small_graphs(acceptor=True, labels=(0, 1, 2)))
def test_all_matchers_give_the_same_graph_up_to_order(g1, g2):
    plain = gtn.intersect(g1, g2)
    expect = brute.relation(plain)
    for s1, s2 in [("ilabel", "none"), ("none", "ilabel"), ("ilabel", "olabel")]:
        a, b = gtn.clone(g1), gtn.clone(g2)
        sort_as(a, s1)
        sort_as(b, s2)
        out = gtn.intersect(a, b)
        assert (out.num_nodes(), out.num_arcs()) == (plain.num_nodes(), plain.num_arcs())
        assert_same_relation(brute.relation(out), expect)
        assert gtn.isomorphic(out, plain)


@SETTINGS
@given(small_graphs(labels=(EPS, 0, 1)), small_graphs(labels=(EPS, 0, 1)))
def test_gradients_of_forward_score_through_compose_match_path_pairs(g1, g2):
    z, d1, d2 = composed_grads(g1, g2)
    score = gtn.forward_score(gtn.compose(g1, g2))
    if z == -math.inf:
        assert score.item() == -math.inf
    else:
        assert score.item() == pytest.approx(z, abs=1e-4, rel=1e-5)
    gtn.backward(score)
    assert g1.grad().weights_to_list() == pytest.approx(d1, abs=1e-5)
    assert g2.grad().weights_to_list() == pytest.approx(d2, abs=1e-5)


def _fd_grad(fn, g, eps=1e-2):
    w = g.weights_to_numpy().astype(np.float64)
    out = []
    for a in range(len(w)):
        hi, lo = w.copy(), w.copy()
        hi[a] += eps
        lo[a] -= eps
        g.set_weights(hi.astype(np.float32))
        f_hi = fn().item()
        g.set_weights(lo.astype(np.float32))
        f_lo = fn().item()
        out.append((f_hi - f_lo) / (2 * eps))
    g.set_weights(w.astype(np.float32))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_finite_differences_of_compose_and_intersect(seed):
    rng = np.random.default_rng(seed)
    lin = gtn.linear_graph(4, 3)
    lin.set_weights(rng.standard_normal(12).astype(np.float32))
    tok = graph_from_text("""
        0
        2
        0 0 0
        0 1 1
        1 1 1
        1 2 2
        2 2 0
        0 2 2
    """)
    tok.set_weights(rng.standard_normal(tok.num_arcs()).astype(np.float32))
    trans = graph_from_text("""
        0
        1
        0 0 0 2
        0 1 1 -1
        1 1 2 0
        0 1 -1 1
    """)
    trans.set_weights(rng.standard_normal(trans.num_arcs()).astype(np.float32))
    cases = [
        (lambda: gtn.forward_score(gtn.intersect(lin, tok)), [lin, tok]),
        (lambda: gtn.forward_score(gtn.compose(gtn.intersect(lin, tok), trans)), [lin, tok, trans]),
    ]
    for fn, inputs in cases:
        for g in inputs:
            g.zero_grad()
        gtn.backward(fn())
        for g in inputs:
            assert g.grad().weights_to_list() == pytest.approx(_fd_grad(fn, g), abs=2e-3)


def test_bigger_random_intersection_matches_dense_dynamic_programme(rng):
    # A CTC-style check on a realistic size: intersect emissions with a token graph and
    # compare the forward score with a plain numpy recursion over (frame, token state).
    T, C = 60, 5
    target = [1, 3, 3, 2]
    em = rng.standard_normal((T, C)).astype(np.float32)
    lin = gtn.linear_graph(T, C)
    lin.set_weights(em)
    ctc = gtn.criterion.ctc_graph(target, 0)
    got = gtn.forward_score(gtn.intersect(lin, ctc)).item()
    labels = [0 if s % 2 == 0 else target[s // 2] for s in range(2 * len(target) + 1)]
    S = len(labels)
    alpha = np.full(S, -np.inf)
    alpha[0] = em[0, labels[0]]
    alpha[1] = em[0, labels[1]]
    for t in range(1, T):
        new = np.full(S, -np.inf)
        for s in range(S):
            cands = [alpha[s]]
            if s > 0:
                cands.append(alpha[s - 1])
            if s > 1 and labels[s] != 0 and labels[s] != labels[s - 2]:
                cands.append(alpha[s - 2])
            new[s] = np.logaddexp.reduce(cands) + em[t, labels[s]]
        alpha = new
    assert got == pytest.approx(np.logaddexp(alpha[-1], alpha[-2]), rel=1e-5)


def test_large_products_use_a_hash_map_with_the_same_result():
    # More than DENSE_STATES product states: the state store switches to a hash map.
    from lightning_gtn.wfst import _compose, _numba_loops

    n = int(math.isqrt(_numba_loops.DENSE_STATES // 3)) + 2
    g1 = gtn.linear_graph(n - 1, 1)
    g2 = gtn.linear_graph(n - 1, 1)
    assert 3 * g1.num_nodes() * g2.num_nodes() > _compose._dense_limit(g1._s, g2._s)
    out = gtn.intersect(g1, g2)
    assert (out.num_nodes(), out.num_arcs()) == (n, n - 1)
    assert out.accept() == [n - 1]


# -- remove ------------------------------------------------------------------------------------


def test_remove_joins_nodes_over_epsilons_in_gtns_order():
    g = graph_from_text("""
        0
        3
        0 1 -1 -1 1
        1 2 1 1 2
        0 2 2 2 3
        2 3 -1 -1 4
    """)
    out = gtn.remove(g)
    assert out.num_nodes() == 2
    assert out.start() == [0] and out.accept() == [1]
    assert [(out.srcnode(a), out.dstnode(a)) for a in range(out.num_arcs())] == [(0, 1), (0, 1)]
    assert out.labels_to_list() == [2, 1]
    assert out.weights_to_list() == [0.0, 0.0]  # GTN drops weights


def test_remove_other_labels_and_gradient_rules():
    g = graph_from_text("""
        0
        2
        0 1 2 1 1.5
        1 2 0 1 2.5
    """)
    out = gtn.remove(g, 2, 1)
    assert gtn.equal(
        out,
        graph_from_text("""
        0
        1
        0 1 0 1
    """),
    )
    assert out.calc_grad
    with pytest.raises(RuntimeError, match="gradient compuation not implemented"):
        gtn.backward(gtn.forward_score(out))
    g.calc_grad = False
    assert not gtn.remove(g, 2, 1).calc_grad


@SETTINGS
@given(small_graphs(labels=(EPS, 0, 1)))
def test_remove_keeps_the_relation_without_epsilons(g):
    out = gtn.remove(g)
    keys = {k for k in brute.relation(g)}
    assert {k for k in brute.relation(out)} == keys
    assert all(il != EPS or ol != EPS for il, ol in zip(out.labels_to_list(), out.labels_to_list(False)))
