"""backward: its argument forms, retained and freed records, which graphs get gradients."""

import numpy as np
import pytest

import lightning_gtn.wfst as gtn


def scalars(*values, calc_grad=True):
    return [gtn.scalar_graph(v, calc_grad=calc_grad) for v in values]


def test_backward_seeds_ones_and_accumulates_through_a_diamond():
    (x,) = scalars(2.0)
    y = gtn.add(gtn.negate(x), gtn.add(x, x))  # -x + 2x
    assert y.item() == 2.0
    gtn.backward(y)
    assert x.grad().item() == 1.0
    assert y.grad().item() == 1.0


def test_backward_with_a_seed_gradient():
    a, b = scalars(3.0, 4.0)
    out = gtn.subtract(a, b)
    gtn.backward(out, gtn.scalar_graph(7.0))
    assert a.grad().item() == 7.0 and b.grad().item() == -7.0


def test_retain_graph_forms():
    a, b = scalars(1.0, 2.0)
    out = gtn.add(a, b)
    gtn.backward(out, True)  # retain_graph given second, as in GTN
    out.zero_grad()
    gtn.backward(out, retain_graph=True)
    out.zero_grad()
    gtn.backward(out, gtn.scalar_graph(0.5), True)
    assert a.grad().item() == 2.5 and b.grad().item() == 2.5
    # As in GTN, the output's own gradient accumulates too: without zero_grad the next
    # backward sends its seed plus the 0.5 already there.
    gtn.backward(out)  # frees the record
    assert a.grad().item() == 4.0 and out.grad().item() == 1.5
    with pytest.raises(ValueError, match="Backward twice"):
        gtn.backward(out)
    with pytest.raises(ValueError, match="Backward twice"):
        gtn.backward(out, gtn.scalar_graph(1.0))


def test_freed_record_of_inner_operations():
    (a,) = scalars(1.0)
    inner = gtn.negate(a)
    gtn.backward(gtn.negate(inner))
    # The record of `inner` was freed by the first backward through it.
    with pytest.raises(ValueError):
        gtn.backward(gtn.add(inner, a))


def test_list_forms_and_broadcasting():
    xs = scalars(1.0, 2.0, 3.0)
    ys = scalars(4.0, 5.0, 6.0)
    outs = gtn.add(xs, ys)
    gtn.backward(outs, [gtn.scalar_graph(5.0)], [False])  # one grad, one flag: used for all
    assert [x.grad().item() for x in xs] == [5.0, 5.0, 5.0]
    assert [y.grad().item() for y in ys] == [5.0, 5.0, 5.0]

    xs = scalars(1.0, 2.0)
    outs = [gtn.negate(x) for x in xs]
    gtn.backward(outs, [1])  # a list of ints is the retain_graphs list
    for o in outs:
        o.zero_grad()
    gtn.backward(outs, retain_graphs=[0])
    assert [x.grad().item() for x in xs] == [-2.0, -2.0]
    with pytest.raises(ValueError):
        gtn.backward(outs)

    xs = scalars(1.0, 2.0)
    outs = [gtn.negate(x) for x in xs]
    gtn.backward(outs, [gtn.scalar_graph(2.0), gtn.scalar_graph(3.0)])
    assert [x.grad().item() for x in xs] == [-2.0, -3.0]

    xs = scalars(1.0)
    gtn.backward(graphs=[gtn.negate(xs[0])], grads=[gtn.scalar_graph(4.0)], retain_graphs=[0])
    assert xs[0].grad().item() == -4.0


def test_list_forms_check_lengths():
    outs = [gtn.negate(x) for x in scalars(1.0, 2.0, 3.0)]
    with pytest.raises(ValueError, match="expected 1 or 3"):
        gtn.backward(outs, [gtn.scalar_graph(1.0)] * 2)


def test_seed_gradient_of_the_wrong_size():
    g = gtn.linear_graph(2, 3)
    with pytest.raises(RuntimeError, match="6 arcs"):
        gtn.backward(g, gtn.scalar_graph(1.0))
    with pytest.raises(ValueError):  # also a ValueError: it is a bad argument
        gtn.backward(g, gtn.scalar_graph(1.0))
    nograd = gtn.linear_graph(2, 3, calc_grad=False)
    gtn.backward(nograd, gtn.scalar_graph(1.0))  # ignored, as in GTN
    with pytest.raises(TypeError, match="grad"):
        gtn.backward(g, [1.0] * 6)
    with pytest.raises(TypeError, match="g must be"):
        gtn.backward("g")


def test_scalar_ops_follow_their_first_input_for_calc_grad():
    # GTN's negate/add/subtract copy their first input, calc_grad included: with a first
    # input that needs no gradient the result records nothing, even if the second does.
    (nograd,) = scalars(1.0, calc_grad=False)
    (withgrad,) = scalars(2.0)
    for op in (gtn.add, gtn.subtract):
        out = op(nograd, withgrad)
        assert not out.calc_grad
        gtn.backward(out)
        assert not withgrad.is_grad_available()
        out = op(withgrad, nograd)
        assert out.calc_grad
        gtn.backward(out)
        assert withgrad.grad().item() == 1.0
        withgrad.zero_grad()
        with pytest.raises(RuntimeError, match="disabled"):
            nograd.grad()
    assert not gtn.negate(nograd).calc_grad and not gtn.clone(nograd).calc_grad


def test_calc_grad_can_be_switched_on_after_construction():
    g1 = gtn.Graph(False)
    g1.calc_grad = True
    g1.add_node(True)
    g1.add_node(False, True)
    g1.add_arc(0, 1, 1, 1, 1.0)
    (g2,) = scalars(1.0)
    g2.calc_grad = False
    gtn.backward(gtn.add(g1, g2))
    assert g1.grad().item() == 1.0
    with pytest.raises(RuntimeError):
        g2.grad()


def test_backward_of_a_graph_without_calc_grad_does_nothing():
    (g,) = scalars(1.0, calc_grad=False)
    gtn.backward(g)
    assert not g.is_grad_available()


def test_unused_clone_gets_no_gradient():
    a, b = scalars(3.0, 4.0)
    cloned = gtn.clone(a)
    gtn.backward(gtn.add(a, b))
    with pytest.raises(RuntimeError):
        cloned.grad()
    a.zero_grad()
    gtn.backward(gtn.add(cloned, b))
    assert gtn.equal(cloned.grad(), a.grad())


def test_long_chains_do_not_hit_the_recursion_limit():
    (x,) = scalars(1.0)
    y = x
    for _ in range(5000):
        y = gtn.negate(y)
    gtn.backward(y)
    assert x.grad().item() == 1.0  # an even number of negations


def test_gradients_accumulate_until_zero_grad():
    g = gtn.linear_graph(2, 2)
    g.set_weights(np.arange(4, dtype=np.float32))
    for _ in range(3):
        gtn.backward(gtn.clone(g))
    assert g.grad().weights_to_list() == [3.0] * 4
    g.zero_grad()
    gtn.backward(gtn.clone(g))
    assert g.grad().weights_to_list() == [1.0] * 4
