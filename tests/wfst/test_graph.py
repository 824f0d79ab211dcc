"""The Graph class: construction, accessors, sorting, weights, gradients' bookkeeping."""

import ctypes
import sys
import threading

import numpy as np
import pytest
import torch

import lightning_gtn.wfst as gtn
from lightning_gtn.wfst.graph import GraphIndexError


def small():
    g = gtn.Graph(False)
    g.add_node(True)
    g.add_node()
    g.add_node()
    g.add_node()
    g.add_node(False, True)
    g.add_arc(0, 1, 0)
    g.add_arc(0, 2, 1)
    g.add_arc(src_node=1, dst_node=2, label=0)
    g.add_arc(1, 1, ilabel=1, olabel=2, weight=2.1)
    g.add_arc(2, 3, 2)
    return g


def test_construction_and_counts():
    g = small()
    assert (g.num_nodes(), g.num_arcs(), g.num_start(), g.num_accept()) == (5, 5, 1, 1)
    assert g.labels_to_list() == [0, 1, 0, 1, 2]
    assert g.labels_to_list(False) == [0, 1, 0, 2, 2]
    np.testing.assert_allclose(g.weights_to_list(), [0, 0, 0, 2.1, 0], rtol=1e-6)
    assert g.start() == [0] and g.accept() == [4]
    assert g.is_start(0) and not g.is_start(1) and g.is_accept(4)
    assert not g.calc_grad


def test_ids_are_returned_in_order():
    g = gtn.Graph()
    assert [g.add_node() for _ in range(3)] == [0, 1, 2]
    assert [g.add_arc(0, 1, 5), g.add_arc(1, 2, 3, 4, 1.0)] == [0, 1]
    assert (g.srcnode(1), g.dstnode(1), g.ilabel(1), g.olabel(1), g.weight(1)) == (1, 2, 3, 4, 1.0)
    assert g.label(0) == 5


def test_make_accept_appends_once():
    g = gtn.Graph()
    for _ in range(3):
        g.add_node()
    g.make_accept(2)
    g.make_accept(0)
    g.make_accept(2)
    assert g.accept() == [2, 0] and g.num_accept() == 2


def test_unknown_nodes_are_named_in_the_error():
    g = small()
    with pytest.raises(ValueError, match=r"src_node=7 is not a node .* 5 nodes"):
        g.add_arc(7, 0, 1)
    with pytest.raises(IndexError, match=r"dst_node=-1"):
        g.add_arc(0, -1, 1)
    with pytest.raises(GraphIndexError):
        g.out_arcs(5)
    with pytest.raises(IndexError, match="arc=5"):
        g.weight(5)
    with pytest.raises(TypeError, match="src_node"):
        g.add_arc("a", 1, 0)
    with pytest.raises(ValueError, match="src_node"):
        g.add_arc(0.5, 1, 0)
    with pytest.raises(ValueError, match="not a node of this graph .*none yet"):
        gtn.Graph().add_arc(0, 0, 0)
    assert g.num_arcs() == 5  # nothing was added by the failed calls
    assert len(g.weights_to_list()) == 5


def test_bad_labels_are_named_in_the_error():
    g = small()
    with pytest.raises(ValueError, match="ilabel=-2"):
        g.add_arc(0, 1, -2)
    with pytest.raises(ValueError, match="olabel=-5"):
        g.add_arc(0, 1, 1, -5)
    with pytest.raises(TypeError, match="needs a label"):
        g.add_arc(0, 1)
    g.add_arc(0, 1, gtn.epsilon)
    assert g.labels_to_list()[-1] == -1


def test_in_and_out_arcs_keep_insertion_order():
    g = gtn.Graph()
    for _ in range(3):
        g.add_node()
    g.add_arc(0, 1, 5)
    g.add_arc(0, 2, 1)
    g.add_arc(1, 2, 0)
    g.add_arc(0, 1, 3)
    assert g.out_arcs(0) == [0, 1, 3] and g.in_arcs(2) == [1, 2]
    assert (g.num_out(0), g.num_in(1), g.num_in(0)) == (3, 2, 0)


def test_arc_sort_orders_each_node_by_label_without_renumbering():
    g = gtn.Graph()
    for _ in range(3):
        g.add_node()
    g.add_arc(0, 1, 5, 0)
    g.add_arc(0, 2, 1, 9)
    g.add_arc(0, 1, 3, 4)
    g.add_arc(2, 1, 0, 1)
    g.arc_sort()
    assert g.ilabel_sorted and not g.olabel_sorted
    assert g.out_arcs(0) == [1, 2, 0]
    assert g.in_arcs(1) == [3, 2, 0]
    assert g.labels_to_list() == [5, 1, 3, 0]  # arc ids unchanged
    g.arc_sort(olabel=True)
    assert g.olabel_sorted and not g.ilabel_sorted
    assert g.out_arcs(0) == [0, 2, 1]
    g.add_arc(1, 2, 0)  # a new arc clears the flags and the order follows insertion again
    assert not g.ilabel_sorted and not g.olabel_sorted
    assert g.out_arcs(0) == [0, 1, 2]


def test_mark_arc_sorted_sets_flags_only():
    g = small()
    g.mark_arc_sorted()
    g.mark_arc_sorted(True)
    assert g.ilabel_sorted and g.olabel_sorted
    assert g.out_arcs(0) == [0, 1]


# -- weights ---------------------------------------------------------------------------------


def test_set_weights_from_list_numpy_tensor_and_address():
    g = small()
    new = [1.1, -3.4, 0.0, 0.5, 7.0]
    g.set_weights(new)
    np.testing.assert_allclose(g.weights_to_list(), new, rtol=1e-6)
    arr = np.array(new[::-1], dtype=np.float64)  # converted to float32
    g.set_weights(arr)
    np.testing.assert_allclose(g.weights_to_numpy(), arr, rtol=1e-6)
    assert g.weights_to_numpy().dtype == np.float32
    t = torch.arange(5, dtype=torch.float32) * 0.5
    g.set_weights(t)
    np.testing.assert_array_equal(g.weights_to_numpy(), t.numpy())
    t2 = torch.randn(5)
    g.set_weights(t2.data_ptr())  # the integer address of float32 memory
    np.testing.assert_array_equal(g.weights_to_numpy(), t2.numpy())
    a = np.array([9, 8, 7, 6, 5], dtype=np.float32)
    g.set_weights(a.__array_interface__["data"][0])
    np.testing.assert_array_equal(g.weights_to_numpy(), a)
    a[0] = -1.0  # the graph copied the memory
    assert g.weight(0) == 9.0


def test_set_weights_from_a_batch_of_emissions():
    emissions = torch.randn(2, 4, 3)
    g = gtn.linear_graph(4, 3)
    g.set_weights(emissions[1].contiguous().data_ptr())
    np.testing.assert_array_equal(g.weights_to_numpy().reshape(4, 3), emissions[1].numpy())
    g.set_weights(emissions[0].numpy())  # (T, C) arrays are flattened row-major
    np.testing.assert_array_equal(g.weights_to_numpy().reshape(4, 3), emissions[0].numpy())


def test_set_weights_of_the_wrong_length_names_the_argument():
    g = small()
    with pytest.raises(ValueError, match=r"weights: expected 5 values .* got 4"):
        g.set_weights([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match="weights"):
        g.set_weights(np.zeros(6, dtype=np.float32))
    with pytest.raises(ValueError, match="null address"):
        g.set_weights(0)
    assert g.weights_to_list()[3] == pytest.approx(2.1)


def test_weights_address_reads_the_live_weights():
    g = small()
    n = g.num_arcs()
    view = np.frombuffer((ctypes.c_float * n).from_address(g.weights()), np.float32)
    np.testing.assert_allclose(view, [0, 0, 0, 2.1, 0], rtol=1e-6)


def test_weights_to_numpy_is_a_copy_and_weights_to_tensor_is_not():
    g = small()
    arr = g.weights_to_numpy()
    arr[0] = 42.0
    assert g.weight(0) == 0.0
    t = g.weights_to_tensor()
    assert t.dtype == torch.float32 and t.shape == (5,)
    t[0] = 3.0  # shares memory with the graph
    assert g.weight(0) == 3.0
    c = g.weights_to_tensor(copy=True)
    c[1] = 5.0
    assert g.weight(1) == 0.0


def test_set_weight_and_item():
    g = gtn.scalar_graph(2.5)
    assert g.item() == 2.5
    g.set_weight(0, -1.0)
    assert g.item() == -1.0
    with pytest.raises(ValueError, match="more than 1 arc"):
        small().item()
    with pytest.raises(ValueError, match="no arcs"):
        gtn.Graph().item()


# -- gradients' bookkeeping ----------------------------------------------------------------------


def test_grad_errors_are_runtime_errors():
    g = gtn.scalar_graph(1.0, calc_grad=False)
    with pytest.raises(RuntimeError, match="disabled"):
        g.grad()
    g = gtn.scalar_graph(1.0)
    assert not g.is_grad_available()
    with pytest.raises(RuntimeError, match="not calculated"):
        g.grad()


def test_grad_shares_structure_and_zero_grad_clears_it():
    g = small()
    g.calc_grad = True
    gtn.backward(g)
    grad = g.grad()
    assert g.is_grad_available()
    assert gtn.equal(grad, grad) and grad.num_arcs() == g.num_arcs()
    assert grad.labels_to_list() == g.labels_to_list()
    assert grad.weights_to_list() == [1.0] * 5
    assert not grad.calc_grad
    g.zero_grad()
    assert not g.is_grad_available()


def test_turning_calc_grad_off_drops_the_gradient():
    g = gtn.scalar_graph(1.0)
    gtn.backward(g)
    g.calc_grad = False
    assert not g.is_grad_available()
    g.calc_grad = True
    with pytest.raises(RuntimeError):
        g.grad()


def test_id_is_shared_by_handles():
    g = small()
    assert g.id() == g._alias().id() and g.id() != small().id()


# -- devices ---------------------------------------------------------------------------------------


def test_graphs_live_on_the_cpu():
    g = small()
    assert not g.is_cuda() and g.cpu() is g and g.to(gtn.CPU) is g
    assert g.device == gtn.Device(gtn.CPU)
    with pytest.raises(RuntimeError, match="CPU"):
        g.cuda()
    with pytest.raises(RuntimeError):
        g.to(gtn.Device(gtn.CUDA, 0))
    assert gtn.Device(gtn.CUDA, 0) == gtn.Device(gtn.CUDA, 0)
    assert gtn.Device(gtn.CPU) != gtn.Device(gtn.CUDA, 0)
    assert gtn.Device(gtn.CUDA, 0) != gtn.Device(gtn.CUDA, 1)
    assert not gtn.cuda.is_available()


def test_creations_take_the_old_positional_calc_grad():
    # GTN's PyTorch loss example calls linear_graph(T, C, requires_grad), the signature of
    # releases before devices; current GTN has the device third. Both run here.
    for flag in (False, True):
        assert gtn.linear_graph(2, 3, flag).calc_grad is flag
        assert gtn.linear_graph(2, 3, gtn.Device(gtn.CPU), flag).calc_grad is flag
        assert gtn.scalar_graph(1.5, flag).calc_grad is flag
        assert gtn.scalar_graph(1.5, gtn.CPU, flag).calc_grad is flag
    assert gtn.linear_graph(2, 3, gtn.CPU).calc_grad is True
    with pytest.raises(RuntimeError, match="CPU"):
        gtn.linear_graph(2, 3, gtn.Device(gtn.CUDA, 0), False)


# -- threads ---------------------------------------------------------------------------------------


def test_concurrent_first_reads_of_a_fresh_graph_agree():
    # Arcs added one by one are merged into arrays on the first read; threads that read
    # a freshly built graph at once (a shared criterion graph, say) must all see it whole.
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        _concurrent_reads()
    finally:
        sys.setswitchinterval(old)


def _concurrent_reads():
    for _ in range(5):
        g = gtn.Graph()
        g.add_node(True)
        g.add_node(False, True)
        for i in range(20000):
            g.add_arc(0, 1, i % 7, i % 5, float(i))
        barrier = threading.Barrier(4)
        seen = []

        def read(g, barrier, seen):
            barrier.wait()
            seen.append((g.num_arcs(), len(g.labels_to_list()), len(g.weights_to_list())))

        threads = [threading.Thread(target=read, args=(g, barrier, seen)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen == [(20000, 20000, 20000)] * 4
        assert g.num_arcs() == 20000 and g.weight(19999) == 19999.0


def test_cuda_module_reports_no_cuda_like_a_cpu_only_gtn():
    assert not gtn.cuda.is_available()
    for fn, args in (
        (gtn.cuda.device_count, ()),
        (gtn.cuda.get_device, ()),
        (gtn.cuda.set_device, (0,)),
        (gtn.cuda.synchronize, ()),
    ):
        with pytest.raises(RuntimeError, match="CUDA not available"):
            fn(*args)
        with pytest.raises(ValueError):
            fn(*args)
