"""The simple operations (negate, add, subtract, clone, projections, union, concat,
closure): GTN's structure and node/arc order, calc_grad rules, list overloads, and
finite-difference checks of every gradient."""

import math

import numpy as np
import pytest

import lightning_gtn.wfst as gtn


def random_dag(rng, num_nodes=4, num_arcs=7, num_labels=3, calc_grad=True):
    """A random acyclic graph: arcs go from lower to higher node ids."""
    g = gtn.Graph(calc_grad)
    starts = {0} | ({1} if rng.random() < 0.4 else set())
    accepts = {num_nodes - 1} | ({num_nodes - 2} if rng.random() < 0.4 else set())
    for n in range(num_nodes):
        g.add_node(n in starts, n in accepts)
    for _ in range(num_arcs):
        a = int(rng.integers(0, num_nodes - 1))
        b = int(rng.integers(a + 1, num_nodes))
        il = int(rng.integers(-1, num_labels))
        ol = int(rng.integers(-1, num_labels))
        g.add_arc(a, b, il, ol, float(rng.standard_normal()))
    return g


def brute_forward_score(g):
    """log of the sum over accepting paths of exp(path weight), by enumerating paths."""
    src, dst = g._s.arrays()[:2]
    w = g.weights_to_list()
    out = {n: [a for a in range(g.num_arcs()) if src[a] == n] for n in range(g.num_nodes())}
    scores = []
    stack = [(s, 0.0) for s in g.start()]
    while stack:
        node, score = stack.pop()
        if g.is_accept(node):
            scores.append(score)
        stack.extend((int(dst[a]), score + w[a]) for a in out[node])
    if not scores:
        return -math.inf
    m = max(scores)
    return m + math.log(sum(math.exp(s - m) for s in scores))


def seeded_fd_check(op, inputs, rng, eps=1e-2):
    """Checks d(sum_j c_j * out_weight_j)/d(input weights) from backward(out, c) against
    central finite differences, for a random seed c."""
    out = op(*inputs)
    c = rng.standard_normal(out.num_arcs()).astype(np.float32)
    seed = gtn.Graph(False)  # any graph with out's number of arcs carries the seed
    seed.add_node(True, True)
    for _ in range(out.num_arcs()):
        seed.add_arc(0, 0, 0)
    seed.set_weights(c)
    gtn.backward(out, seed)

    def f():
        return float(np.dot(c.astype(np.float64), op(*inputs).weights_to_numpy().astype(np.float64)))

    for g in inputs:
        if not g.calc_grad:
            continue
        got = g.grad().weights_to_numpy()
        w = g.weights_to_numpy()
        for a in range(g.num_arcs()):
            w2 = w.copy()
            w2[a] += eps
            g.set_weights(w2)
            hi = f()
            w2[a] -= 2 * eps
            g.set_weights(w2)
            lo = f()
            g.set_weights(w)
            assert got[a] == pytest.approx((hi - lo) / (2 * eps), rel=1e-3, abs=1e-3)


def forward_fd_check(fn, inputs, eps=1e-3):
    """Checks the gradient of forward_score(fn(inputs)) against finite differences."""
    for g in inputs:
        g.zero_grad()
    gtn.backward(gtn.forward_score(fn(*inputs)))
    for g in inputs:
        if not g.calc_grad:
            continue
        got = g.grad().weights_to_numpy()
        w = g.weights_to_numpy()
        for a in range(g.num_arcs()):
            w2 = w.astype(np.float64)
            w2[a] += eps
            g.set_weights(w2)
            hi = gtn.forward_score(fn(*inputs)).item()
            w2[a] -= 2 * eps
            g.set_weights(w2)
            lo = gtn.forward_score(fn(*inputs)).item()
            g.set_weights(w)
            assert got[a] == pytest.approx((hi - lo) / (2 * eps), rel=1e-2, abs=2e-3)


def arcs(g):
    src, dst, il, ol = (a.tolist() for a in g._s.arrays())
    return list(zip(src, dst, il, ol, g.weights_to_list()))


# -- scalar operations ------------------------------------------------------------------------


def test_scalar_ops_values_and_gradients(rng):
    a, b = gtn.scalar_graph(1.5), gtn.scalar_graph(-4.0)
    assert gtn.negate(a).item() == -1.5
    assert gtn.add(a, b).item() == -2.5
    assert gtn.subtract(a, b).item() == 5.5
    seeded_fd_check(gtn.negate, [a], rng)
    for op in (gtn.add, gtn.subtract):
        a.zero_grad()
        b.zero_grad()
        seeded_fd_check(op, [a, b], rng)


def test_scalar_ops_reject_graphs_with_other_than_one_arc():
    g = gtn.linear_graph(1, 2)
    with pytest.raises(RuntimeError, match="only one arc"):
        gtn.negate(g)
    with pytest.raises(RuntimeError, match="only one arc"):
        gtn.add(gtn.scalar_graph(1.0), g)
    with pytest.raises(RuntimeError, match="only one arc"):
        gtn.subtract(g, gtn.scalar_graph(1.0))


def test_scalar_results_copy_their_first_input():
    g = gtn.Graph()
    g.add_node(True)
    g.add_node()
    g.add_node(False, True)
    g.add_arc(1, 2, 7, 3, 2.0)
    n = gtn.negate(g)
    assert n.num_nodes() == 3 and n.labels_to_list() == [7] and n.labels_to_list(False) == [3]
    assert n.start() == [0] and n.accept() == [2]


def test_list_overloads_match_single_calls():
    xs = [gtn.scalar_graph(k) for k in (1.0, 2.0, 3.0)]
    ys = [gtn.scalar_graph(k) for k in (4.0, 5.0, 6.0)]
    for op in (gtn.add, gtn.subtract):
        for out, x, y in zip(op(xs, ys), xs, ys):
            assert gtn.equal(out, op(x, y))
    for op in (gtn.negate, gtn.clone, gtn.project_input, gtn.project_output, gtn.closure):
        outs = op(xs)
        assert len(outs) == 3
        for out, x in zip(outs, xs):
            assert gtn.equal(out, op(x))
    with pytest.raises(ValueError, match="graphs1 has 3 graphs but graphs2 has 2"):
        gtn.add(xs, ys[:2])
    with pytest.raises(TypeError, match="two lists"):
        gtn.add(xs, ys[0])
    with pytest.raises(TypeError, match="gtn.Graph"):
        gtn.negate(1.0)


# -- clone and projections ------------------------------------------------------------------------


def test_clone_is_an_independent_copy(rng):
    g = random_dag(rng)
    g.arc_sort(True)
    c = gtn.clone(g)
    assert gtn.equal(c, g) and c.start() == g.start() and c.accept() == g.accept()
    assert c.olabel_sorted and c.out_arcs(0) == g.out_arcs(0)
    c.add_arc(0, 1, 2)
    c.set_weight(0, 100.0)
    assert g.num_arcs() == 7 and g.weight(0) != 100.0
    seeded_fd_check(gtn.clone, [random_dag(rng)], rng)


def test_projections_copy_one_side_of_the_labels(rng):
    g = random_dag(rng)
    pi, po = gtn.project_input(g), gtn.project_output(g)
    assert pi.labels_to_list() == pi.labels_to_list(False) == g.labels_to_list()
    assert po.labels_to_list() == po.labels_to_list(False) == g.labels_to_list(False)
    assert pi.weights_to_list() == g.weights_to_list()
    assert g.labels_to_list() != g.labels_to_list(False)  # the input really was a transducer
    seeded_fd_check(gtn.project_input, [g], rng)
    g.zero_grad()
    seeded_fd_check(gtn.project_output, [g], rng)


def test_projections_keep_sorted_flags_truthful(rng):
    g = random_dag(rng)
    g.arc_sort(olabel=True)
    po = gtn.project_output(g)
    assert po.ilabel_sorted and po.olabel_sorted  # the order follows the copied labels
    g.arc_sort(olabel=False)
    po = gtn.project_output(g)
    assert not po.ilabel_sorted  # its arcs are ordered by the old input labels
    pi = gtn.project_input(g)
    assert pi.ilabel_sorted and pi.olabel_sorted


# -- union, concat, closure -------------------------------------------------------------------------


def test_union_places_graphs_side_by_side(rng):
    g1 = random_dag(rng, num_nodes=3, num_arcs=3)
    g2 = random_dag(rng, num_nodes=4, num_arcs=5)
    g2.make_accept(0)  # accept ids out of node order: GTN lists them in node order
    u = gtn.union([g1, g2])
    assert u.num_nodes() == 7 and u.num_arcs() == 8
    assert u.start() == g1.start() + [s + 3 for s in g2.start()]
    assert u.accept() == sorted(g1.accept()) + [a + 3 for a in sorted(g2.accept())]
    shifted = [(s + 3, d + 3, i, o, w) for s, d, i, o, w in arcs(g2)]
    assert arcs(u) == arcs(g1) + shifted
    seeded_fd_check(lambda a, b: gtn.union([a, b]), [g1, g2], rng)


def test_union_of_nothing_and_of_lists():
    e = gtn.union([])
    assert e.num_nodes() == 0 and not e.calc_grad
    a, b = gtn.scalar_graph(1.0), gtn.scalar_graph(2.0)
    outs = gtn.union([[a, b], [b]])
    assert gtn.equal(outs[0], gtn.union([a, b])) and gtn.equal(outs[1], gtn.union([b]))


def test_concat_links_accepts_to_next_starts_after_each_graph(rng):
    g1 = gtn.graph_from_text("0\n1 2\n0 1 1 1 0.5\n0 2 2 2 1.5\n")
    g2 = gtn.graph_from_text("0 1\n2\n0 2 3 3 2.5\n1 2 4 4 3.5\n")
    g3 = gtn.graph_from_text("0\n1\n0 1 5 5 4.5\n")
    c = gtn.concat([g1, g2, g3])
    assert c.num_nodes() == 8 and c.start() == [0] and c.accept() == [7]
    eps = -1
    assert arcs(c) == [
        (0, 1, 1, 1, 0.5),
        (0, 2, 2, 2, 1.5),
        (3, 5, 3, 3, 2.5),
        (4, 5, 4, 4, 3.5),
        (1, 3, eps, eps, 0.0),
        (1, 4, eps, eps, 0.0),
        (2, 3, eps, eps, 0.0),
        (2, 4, eps, eps, 0.0),
        (6, 7, 5, 5, 4.5),
        (5, 6, eps, eps, 0.0),
    ]
    assert gtn.equal(gtn.concat(g1, g2), gtn.concat([g1, g2]))
    pairs = gtn.concat([g1, g2], [g3, g3])
    assert gtn.equal(pairs[0], gtn.concat(g1, g3)) and gtn.equal(pairs[1], gtn.concat(g2, g3))
    lists = gtn.concat([[g1, g2], [g3]])
    assert gtn.equal(lists[0], gtn.concat([g1, g2])) and gtn.equal(lists[1], gtn.concat([g3]))
    seeded_fd_check(lambda a, b, d: gtn.concat([a, b, d]), [g1, g2, g3], rng)


def test_concat_of_nothing_accepts_the_empty_string():
    e = gtn.concat([])
    assert e.num_nodes() == 1 and e.start() == [0] and e.accept() == [0] and e.num_arcs() == 0
    assert gtn.forward_score(e).item() == 0.0


def test_closure_adds_a_start_and_accept_node_in_front(rng):
    g = gtn.graph_from_text("0 1\n2\n0 2 1 1 0.5\n1 2 2 3 1.5\n")
    c = gtn.closure(g)
    assert c.num_nodes() == 4 and c.start() == [0] and c.accept() == [0]
    eps = -1
    assert arcs(c) == [
        (1, 3, 1, 1, 0.5),
        (2, 3, 2, 3, 1.5),
        (0, 1, eps, eps, 0.0),
        (0, 2, eps, eps, 0.0),
        (3, 0, eps, eps, 0.0),
    ]
    seeded_fd_check(gtn.closure, [g], rng)


def test_rational_ops_need_a_gradient_if_any_input_does(rng):
    a = random_dag(rng, calc_grad=False)
    b = random_dag(rng, calc_grad=True)
    for op in (lambda x, y: gtn.union([x, y]), lambda x, y: gtn.concat([x, y])):
        assert op(a, b).calc_grad and op(b, a).calc_grad
        assert not op(a, a).calc_grad
        out = op(a, b)
        gtn.backward(out)
        assert b.grad().weights_to_list() == [1.0] * b.num_arcs()
        b.zero_grad()
        with pytest.raises(RuntimeError, match="disabled"):
            a.grad()
    assert gtn.closure(b).calc_grad and not gtn.closure(a).calc_grad


# -- gradients through forward_score --------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_forward_score_matches_path_enumeration(seed):
    rng = np.random.default_rng(seed)
    g = random_dag(rng, num_nodes=5, num_arcs=9)
    assert gtn.forward_score(g).item() == pytest.approx(brute_forward_score(g), rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_gradients_of_structural_ops_through_forward_score(seed):
    rng = np.random.default_rng(100 + seed)
    g1 = random_dag(rng)
    g2 = random_dag(rng, num_nodes=3, num_arcs=4)
    nograd = random_dag(rng, calc_grad=False)
    forward_fd_check(lambda a, b, c: gtn.union([a, b, c]), [g1, g2, nograd])
    forward_fd_check(lambda a, b, c: gtn.concat([a, c, b]), [g1, g2, nograd])
    forward_fd_check(gtn.clone, [g1])
    forward_fd_check(gtn.project_input, [g2])
    forward_fd_check(gtn.project_output, [g2])
    forward_fd_check(lambda a, b: gtn.add(gtn.forward_score(a), gtn.negate(gtn.forward_score(b))), [g1, g2])
    forward_fd_check(lambda a, b: gtn.subtract(gtn.forward_score(a), gtn.forward_score(b)), [g1, g2])
    with pytest.raises(RuntimeError, match="disabled"):
        nograd.grad()
    # forward_score is the log-sum of path scores, checked here against enumeration too.
    u = gtn.union([g1, g2])
    expect = np.logaddexp(brute_forward_score(g1), brute_forward_score(g2))
    assert gtn.forward_score(u).item() == pytest.approx(expect, rel=1e-5, abs=1e-5)
    c = gtn.concat([g1, g2])
    expect = brute_forward_score(g1) + brute_forward_score(g2)
    assert gtn.forward_score(c).item() == pytest.approx(expect, rel=1e-5, abs=1e-5)


def test_gradient_of_closure_through_a_bounded_intersection():
    # closure makes a cycle; intersecting with a linear graph bounds the paths again.
    g = gtn.graph_from_text("0\n1\n0 1 0 0 1.3\n1 1 1 1 2.1\n")
    lin = gtn.linear_graph(4, 2, calc_grad=False)
    lin.set_weights(np.linspace(-1, 1, 8, dtype=np.float32))
    forward_fd_check(lambda x: gtn.intersect(gtn.closure(x), lin), [g])
