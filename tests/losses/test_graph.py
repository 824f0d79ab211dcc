"""graph_loss on user graphs: epsilon arcs, several start/accept nodes, weight gradients."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lightning_gtn.wfst as gtn
from lightning_gtn.functional import graph_loss

IMPLS = ["numba", "numba_log", "torch"]


def _eps_graph(calc_grad=False):
    # two start nodes, two accept nodes, epsilon arcs in a chain (0 -eps-> 1 -eps-> 2)
    g = gtn.Graph(calc_grad)
    g.add_node(True)  # 0
    g.add_node(True)  # 1
    g.add_node(False, True)  # 2
    g.add_node(False, True)  # 3
    g.add_arc(0, 1, gtn.epsilon, gtn.epsilon, 0.3)
    g.add_arc(1, 2, gtn.epsilon, gtn.epsilon, -0.2)
    g.add_arc(0, 0, 0, 0, 0.1)
    g.add_arc(1, 1, 1, 1, -0.4)
    g.add_arc(1, 3, 2, 2, 0.5)
    g.add_arc(3, 3, 0, 0, 0.0)
    g.add_arc(2, 2, 2, 2, 0.2)
    g.add_arc(3, 2, 1, 1, 0.7)
    return g


def _paths(g, T):
    """Brute force: (arc list) of every accepting path reading exactly T labels."""
    src, dst, il, _ = (np.asarray(a) for a in g._s.arrays())
    out = []

    def walk(node, t, arcs):
        if t == T and g.is_accept(node):
            out.append(list(arcs))
        for a in range(len(src)):
            if src[a] != node:
                continue
            if il[a] == gtn.epsilon:
                walk(int(dst[a]), t, arcs + [a])
            elif t < T:
                walk(int(dst[a]), t + 1, arcs + [a])

    for s in g.start():
        walk(s, 0, [])
    return out


def _brute(g, x, w):
    il = g.labels_to_list()
    scores = []
    for arcs in _paths(g, x.shape[0]):
        s = torch.zeros((), dtype=x.dtype)
        t = 0
        for a in arcs:
            s = s + w[a]
            if il[a] != gtn.epsilon:
                s = s + x[t, il[a]]
                t += 1
        scores.append(s)
    return -torch.logsumexp(torch.stack(scores), 0) if scores else torch.tensor(math.inf, dtype=x.dtype)


@pytest.mark.parametrize("impl", IMPLS)
def test_epsilon_graph_against_brute_force_with_weight_grads(impl):
    g = _eps_graph()
    x = torch.randn(3, 4, 3, dtype=torch.float64, requires_grad=True)
    w = torch.tensor(g.weights_to_list(), dtype=torch.float64, requires_grad=True)
    lens = [4, 2, 0]
    ours = graph_loss(x, input_lengths=lens, graphs=g, weights=[w], reduction="none", impl=impl)
    ref = torch.stack([_brute(g, x[b, : lens[b]], w) for b in range(3)])
    torch.testing.assert_close(ours, ref)
    g1 = torch.autograd.grad(ours.sum(), (x, w))
    g2 = torch.autograd.grad(ref.sum(), (x, w))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


def test_graph_grad_lands_in_graph_like_gtn_backward():
    g = _eps_graph(calc_grad=True)
    x = torch.randn(1, 3, 3)
    loss = graph_loss(x, input_lengths=[3], graphs=[g], reduction="sum")
    loss.backward()
    # the engine's one-example reference: -forward_score(intersect(g, emissions))
    g2 = _eps_graph(calc_grad=True)
    em = gtn.linear_graph(3, 3, calc_grad=False)
    em.set_weights(x[0].contiguous().numpy())
    ref = gtn.negate(gtn.forward_score(gtn.intersect(g2, em)))
    assert abs(ref.item() - loss.item()) < 1e-4
    gtn.backward(ref)
    np.testing.assert_allclose(g.grad().weights_to_numpy(), g2.grad().weights_to_numpy(), atol=1e-5)


def test_denominators_and_infeasible():
    num = gtn.Graph(False)
    num.add_node(True)
    num.add_node(False, True)
    num.add_arc(0, 1, 1)
    den = gtn.Graph(False)
    den.add_node(True, True)
    for c in range(3):
        den.add_arc(0, 0, c)
    x = torch.randn(2, 2, 3, dtype=torch.float64)
    loss = graph_loss(x, input_lengths=[1, 2], graphs=[num, num], denominators=den, reduction="none")
    expected0 = torch.logsumexp(x[0, 0], 0) - x[0, 0, 1]
    torch.testing.assert_close(loss[0], expected0)
    assert math.isinf(loss[1].item())  # num reads exactly one frame
    assert graph_loss(x, input_lengths=[1, 2], graphs=[num, num], reduction="none", zero_infinity=True)[1].item() == 0.0


@pytest.mark.parametrize("impl", IMPLS)
def test_gradcheck(impl):
    g = _eps_graph()
    x = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
    w = torch.tensor(g.weights_to_list(), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b: graph_loss(a, input_lengths=[3, 2], graphs=g, weights=[b], reduction="none", impl=impl), (x, w)
    )


def test_epsilon_cycle_is_an_error():
    g = gtn.Graph(False)
    g.add_node(True)
    g.add_node(False, True)
    g.add_arc(0, 1, gtn.epsilon)
    g.add_arc(1, 0, gtn.epsilon)
    with pytest.raises(ValueError, match="cycle"):
        graph_loss(torch.randn(1, 2, 2), input_lengths=[2], graphs=g, reduction="none")


def test_label_out_of_range():
    g = gtn.Graph(False)
    g.add_node(True, True)
    g.add_arc(0, 0, 5)
    with pytest.raises(ValueError, match="C=3"):
        graph_loss(torch.randn(1, 2, 3), input_lengths=[2], graphs=g, reduction="none")


@st.composite
def _random_graph(draw):
    n = draw(st.integers(1, 4))
    g = gtn.Graph(False)
    starts = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    accepts = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    starts[0] = True
    for i in range(n):
        g.add_node(starts[i], accepts[i])
    for _ in range(draw(st.integers(0, 8))):
        s, d = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        label = draw(st.integers(-1, 2))
        if label == -1 and s >= d:  # epsilon arcs only forward: no epsilon cycles
            continue
        g.add_arc(s, d, label, label, draw(st.floats(-1, 1)))
    return g


@settings(max_examples=25, deadline=None)
@given(_random_graph(), st.integers(0, 3), st.integers(0, 1000))
def test_random_graphs_count_paths_and_agree_across_impls(g, T, seed):
    # zero emissions and zero weights: exp(-loss) counts the accepting paths of T frames
    w0 = torch.zeros(g.num_arcs(), dtype=torch.float64)
    zero = torch.zeros(1, T, 3, dtype=torch.float64)
    count = len(_paths(g, T))
    loss = graph_loss(zero, input_lengths=[T], graphs=g, weights=[w0], reduction="none")
    assert (math.isinf(loss.item()) and count == 0) or abs(math.exp(-loss.item()) - count) < 1e-9 * max(count, 1)
    # random emissions and the graph's weights: every implementation gives the brute force
    x = torch.randn(1, T, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    w = torch.tensor(g.weights_to_list(), dtype=torch.float64)
    ref = _brute(g, x[0], w)
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    ref = _brute(g, xr[0], wr)
    ref_grads = torch.autograd.grad(ref, (xr, wr), allow_unused=True) if ref.requires_grad else None
    for impl in IMPLS:
        xi, wi = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        out = graph_loss(xi, input_lengths=[T], graphs=g, weights=[wi], reduction="none", zero_infinity=True, impl=impl)
        if math.isinf(ref.item()):
            assert out.item() == 0.0
            continue
        assert abs(out.item() - ref.item()) < 1e-9
        if ref_grads is not None and out.requires_grad:
            for ours, theirs in zip(torch.autograd.grad(out, (xi, wi)), ref_grads):
                expected = torch.zeros_like(ours) if theirs is None else theirs
                torch.testing.assert_close(ours, expected)


@pytest.mark.parametrize("impl", [None, "numba_log", "torch"])
def test_graphs_without_nodes_have_no_path(impl):
    # Finding 14 of the second probe: graph_loss(lp, None, il, graphs=[Graph(), Graph()]) raised
    # ZeroDivisionError. A graph without nodes has no accepting path: its loss is inf, as for a
    # graph without accept nodes, and zero_infinity zeroes it with a zero gradient.
    lp = torch.randn(2, 5, 3).log_softmax(-1).requires_grad_()
    il = torch.tensor([5, 5])
    loss = graph_loss(lp, None, il, graphs=[gtn.Graph(), gtn.Graph()], reduction="none", impl=impl)
    assert torch.isinf(loss).all()
    mixed = graph_loss(lp, None, il, graphs=[gtn.Graph(), gtn.linear_graph(5, 3)], reduction="none", impl=impl)
    assert torch.isinf(mixed[0]) and torch.isfinite(mixed[1])
    z = graph_loss(lp, None, il, graphs=[gtn.Graph(), gtn.Graph()], zero_infinity=True, impl=impl)
    z.backward()
    assert z.item() == 0.0 and lp.grad.abs().sum().item() == 0.0
