"""Graph's public array API, its version counter, and the checks on graphs built from outside data."""

import ctypes
import io
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

import lightning_gtn.wfst as gtn
from lightning_gtn.wfst.graph import MAX_UNREFERENCED_NODES, GraphArrays


def small_graph():
    g = gtn.Graph()
    g.add_node(True)
    g.add_node()
    g.add_node(False, True)
    g.add_arc(0, 1, 0, 1, 0.5)
    g.add_arc(1, 2, gtn.epsilon, 2, -1.0)
    g.add_arc(0, 2, 3, 3, 2.0)
    return g


# -- from_arrays / arrays ---------------------------------------------------------------------


def test_arrays_round_trip_and_read_only():
    g = small_graph()
    a = g.arrays()
    assert isinstance(a, GraphArrays)
    assert a.num_nodes == 3
    assert a.start.tolist() == [0] and a.accept.tolist() == [2]
    assert a.src.tolist() == [0, 1, 0] and a.dst.tolist() == [1, 2, 2]
    assert a.ilabel.tolist() == [0, -1, 3] and a.olabel.tolist() == [1, 2, 3]
    assert a.weights.tolist() == [0.5, -1.0, 2.0]
    for arr in a[1:]:
        assert not arr.flags.writeable
    with pytest.raises(ValueError):
        a.weights[0] = 1.0
    h = gtn.Graph.from_arrays(*a)
    assert gtn.equal(g, h)
    assert h.start() == g.start() and h.accept() == g.accept()
    assert gtn.forward_score(h).item() == pytest.approx(gtn.forward_score(g).item())


def test_arrays_are_snapshots_that_writes_never_reach():
    g = small_graph()
    before = gtn.forward_score(g).item()
    a = g.arrays()
    assert not np.shares_memory(a.src, g.arrays().src)
    g.set_weight(0, 7.0)  # a snapshot: later changes do not show
    assert a.weights[0] == 0.5
    g.set_weight(0, 0.5)
    for arr in (a.src, a.dst, a.ilabel, a.olabel, a.weights):
        arr.flags.writeable = True  # numpy allows it on the copy; the graph keeps its own memory
    a.dst[:] = 10**9
    a.src[:] = -(10**9)
    a.weights[:] = np.nan
    assert gtn.forward_score(g).item() == pytest.approx(before)


ATTACK_ARRAYS = r"""
import numpy as np
import lightning_gtn.wfst as gtn
g = gtn.linear_graph(50, 4)
ref = gtn.forward_score(g).item()
a = g.arrays()
for arr in (a.src, a.dst, a.ilabel):
    arr.flags.writeable = True
    arr[:] = 2**30
assert gtn.forward_score(g).item() == ref
src = np.arange(100, dtype=np.int32)
dst = src + 1
lab = np.zeros(100, dtype=np.int32)
w = np.zeros(100, dtype=np.float32)
h = gtn.Graph.from_arrays(101, [0], [100], src, dst, lab, weights=w)
ref = gtn.forward_score(h).item()
src[:] = 2**30
dst[:] = -(2**30)
lab[:] = -7
w[:] = np.nan
assert gtn.forward_score(h).item() == ref
assert gtn.viterbi_score(h).item() == ref
print("fuzzed")
"""


def test_writes_into_arrays_never_reach_the_kernels(tmp_path):
    # Finding 7 of the second probe: a write through a re-enabled view segfaulted forward_score.
    script = tmp_path / "attack.py"
    script.write_text(ATTACK_ARRAYS)
    from tests._child import run_as_child

    run_as_child(str(script), timeout=300)


def test_from_arrays_copies_and_acceptor_default():
    src = np.array([0, 1], dtype=np.int32)
    dst = np.array([1, 2], dtype=np.int32)
    lab = np.array([4, gtn.epsilon], dtype=np.int32)
    w = np.array([1.0, 2.0], dtype=np.float32)
    g = gtn.Graph.from_arrays(3, [0], [2], src, dst, lab, weights=w, calc_grad=False)
    a = g.arrays()
    assert not np.shares_memory(a.src, src) and not np.shares_memory(a.ilabel, lab)
    assert not np.shares_memory(a.weights, w)
    lab[0] = 9
    assert g.labels_to_list(False) == [4, -1]
    assert not g.calc_grad
    # other dtypes are converted; no weights means zeros
    h = gtn.Graph.from_arrays(3, (0,), (2,), [0, 1], [1, 2], np.array([4, -1], dtype=np.int64))
    assert h.weights_to_list() == [0.0, 0.0] and h.labels_to_list() == [4, -1]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(num_nodes=-1), "num_nodes"),
        (dict(num_nodes=True), "num_nodes"),
        (dict(num_nodes=2.0), "num_nodes"),
        (dict(start=[3]), "start"),
        (dict(start=[0, 0]), "start"),
        (dict(accept=[-1]), "accept"),
        (dict(src=[0, 5]), "src"),
        (dict(dst=[0, -1]), "dst"),
        (dict(dst=[0]), "dst"),
        (dict(ilabel=[0, -2]), "ilabel"),
        (dict(ilabel=[0.5, 1.0]), "ilabel"),
        (dict(ilabel=[0, 2**31]), "ilabel"),
        (dict(olabel=[0, -5]), "olabel"),
        (dict(olabel=[0]), "olabel"),
        (dict(weights=[1.0]), "weights"),
        (dict(weights=["a", "b"]), "weights"),
        (dict(weights=[[1.0, 2.0]]), "weights"),
        (dict(src=[[0, 1]]), "src"),
        (dict(src="01"), "src"),
    ],
)
def test_from_arrays_rejects_bad_fields(kwargs, field):
    args = dict(num_nodes=3, start=[0], accept=[2], src=[0, 1], dst=[1, 2], ilabel=[0, 1], olabel=None, weights=None)
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        gtn.Graph.from_arrays(**args)


def test_from_arrays_copies_read_only_weights():
    w = np.array([1.0], dtype=np.float32)
    w.flags.writeable = False
    g = gtn.Graph.from_arrays(2, [0], [1], [0], [1], [0], weights=w)
    g.set_weight(0, 3.0)  # must not fail on the caller's read-only array
    assert w[0] == 1.0 and g.weight(0) == 3.0


# -- add_grad ------------------------------------------------------------------------------


def test_add_grad_public():
    g = small_graph()
    g.add_grad([1.0, 2.0, 3.0])
    g.add_grad(np.ones(3))
    assert g.grad().weights_to_list() == [2.0, 3.0, 4.0]
    with pytest.raises(RuntimeError, match="Invalid grad size"):
        g.add_grad([1.0])
    with pytest.raises(RuntimeError, match="Invalid grad size"):
        g.add_grad(["x", "y", "z"])
    h = small_graph()
    h.calc_grad = False
    h.add_grad([1.0, 2.0, 3.0])  # ignored, as in GTN
    assert not h.is_grad_available()


# -- version --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mutate",
    [
        lambda g: g.add_node(),
        lambda g: g.add_arc(0, 1, 2),
        lambda g: g.set_weights([1.0, 2.0, 3.0]),
        lambda g: g.set_weight(1, 9.0),
        lambda g: g.arc_sort(),
        lambda g: g.arc_sort(True),
        lambda g: g.mark_arc_sorted(),
        lambda g: g.make_accept(1),
        lambda g: g.__setstate__(small_graph().__getstate__()),
    ],
)
def test_version_grows_on_every_change(mutate):
    g = small_graph()
    v = g.version
    assert isinstance(v, int)
    assert g.version == v  # reading changes nothing
    g.num_arcs(), g.arrays(), g.weights_to_list(), repr(g), gtn.forward_score(g)
    assert g.version == v
    mutate(g)
    assert g.version > v


def test_version_is_read_only():
    g = small_graph()
    with pytest.raises(AttributeError):
        g.version = 0


# -- __setstate__ ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda s: s.update(arcs=([0, 1, 0], [1, 100000, 2], [0, -1, 3], [1, 2, 3])), "dst"),
        (lambda s: s.update(arcs=([-1, 1, 0], [1, 2, 2], [0, -1, 3], [1, 2, 3])), "src"),
        (lambda s: s.update(arcs=([0, 1], [1, 2, 2], [0, -1, 3], [1, 2, 3])), "dst"),
        (lambda s: s.update(arcs=([0, 1, 0], [1, 2, 2], [0, -7, 3], [1, 2, 3])), "ilabel"),
        (lambda s: s.update(arcs=([0, 1, 0], [1, 2, 2])), "arcs"),
        (lambda s: s.update(start_ids=[3]), "start"),
        (lambda s: s.update(accept_ids=[2, 2]), "accept"),
        (lambda s: s.update(num_nodes="3"), "num_nodes"),
        (lambda s: s.update(num_nodes=2**31 - 2), "num_nodes"),
        (lambda s: s.update(weights=[1.0]), "weights"),
        (lambda s: s.update(weights=None), "weights"),
        (lambda s: s.update(sorted=(1, 2)), "sorted"),
        (lambda s: s.update(order=([0, 0, 1], [0, 1, 2])), "order"),
        (lambda s: s.update(order=([0, 1, 2], [0, 1, 2])), "order"),  # not grouped by source
        (lambda s: s.update(order=([0, 1, 9], [0, 2, 1])), "order"),
        (lambda s: s.pop("arcs"), "arcs"),
        (lambda s: s.update(calc_grad="yes"), "calc_grad"),
    ],
)
def test_setstate_rejects_bad_state(change, field):
    state = small_graph().__getstate__()
    change(state)
    g = gtn.Graph()
    with pytest.raises(ValueError, match=field):
        g.__setstate__(state)


def test_setstate_keeps_valid_arc_order():
    g = small_graph()
    g.arc_sort(True)
    h = pickle.loads(pickle.dumps(g))
    assert [h.out_arcs(i) for i in range(3)] == [g.out_arcs(i) for i in range(3)]
    assert h.olabel_sorted and not h.ilabel_sorted


def _unsorted_pair():
    """A transducer whose arcs out of node 0 read labels 2, 0, 1 (not sorted), and an acceptor."""
    g1 = gtn.Graph()
    g1.add_node(True)
    g1.add_node(False, True)
    for lab, w in ((2, 1.0), (0, 2.0), (1, 3.0)):
        g1.add_arc(0, 1, lab, lab, w)
    g2 = gtn.Graph()
    g2.add_node(True)
    g2.add_node(False, True)
    for lab, w in ((0, 0.5), (1, 4.0), (2, 8.0)):
        g2.add_arc(0, 1, lab, lab, w)
    g2.arc_sort()
    return g1, g2


def test_setstate_does_not_trust_a_false_sorted_flag():
    # Finding 6: a graph restored with sorted=(True, True) over unsorted arcs made compose
    # silently wrong. A flag is kept only where the arcs really are in label order.
    g1, g2 = _unsorted_pair()
    want = gtn.forward_score(gtn.compose(g1, g2)).item()
    state = g1.__getstate__()
    state["sorted"] = (True, True)
    h = gtn.Graph()
    h.__setstate__(state)
    assert not h.ilabel_sorted and not h.olabel_sorted
    assert gtn.forward_score(gtn.compose(h, g2)).item() == pytest.approx(want)
    # a flag that holds survives (the state of an arc-sorted graph)
    g1.arc_sort(True)
    k = pickle.loads(pickle.dumps(g1))
    assert k.olabel_sorted
    assert gtn.forward_score(gtn.compose(k, g2)).item() == pytest.approx(want)


# -- load / loadtxt -------------------------------------------------------------------------------


def test_load_refuses_huge_declared_node_count(tmp_path):
    path = tmp_path / "g.bin"
    path.write_bytes(struct.pack("<6i", 2**31 - 1, 0, 1, 1, 0, 0))  # 24 bytes
    with pytest.raises(ValueError, match="unused"):
        gtn.load(path)
    # the same header with a modest count loads
    path.write_bytes(struct.pack("<6i", 3, 0, 1, 1, 0, 2))
    assert gtn.load(path).num_nodes() == 3


def test_load_rejects_text_mode_file(tmp_path):
    path = tmp_path / "g.bin"
    gtn.save(str(path), small_graph())
    with open(path, "r", encoding="latin-1") as f, pytest.raises(TypeError, match="binary mode"):
        gtn.load(f)


def test_loadtxt_refuses_huge_node_ids():
    with pytest.raises(ValueError, match="unused"):
        gtn.loadtxt(io.StringIO("0\n2147483646\n"))
    with pytest.raises(ValueError, match="line 3"):
        gtn.loadtxt(io.StringIO("0\n1\n0 99999999999 0\n"))
    with pytest.raises(ValueError, match="line 1"):
        gtn.loadtxt(io.StringIO("2147483647\n1\n"))
    with pytest.raises(ValueError, match="line 3"):
        gtn.loadtxt(io.StringIO("0\n1\n0 1 4294967296\n"))
    # many nodes are fine when arcs name them
    text = "0\n2000\n" + "".join(f"{i} {i + 1} 0\n" for i in range(2000))
    assert gtn.loadtxt(io.StringIO(text)).num_nodes() == 2001
    assert gtn.loadtxt(io.StringIO(f"0\n{MAX_UNREFERENCED_NODES - 5}\n")).num_nodes() == MAX_UNREFERENCED_NODES - 4


# -- set_weights addresses ------------------------------------------------------------------------


@pytest.mark.parametrize("address", [-1, 1, 12345, 2**16 - 4, 2**47 - 4, 2**47, 2**64 + 8, -(2**63)])
def test_set_weights_refuses_impossible_addresses(address):
    g = small_graph()
    with pytest.raises(ValueError, match="address"):
        g.set_weights(address)
    with pytest.raises(ValueError, match="address"):
        g.set_weights(np.int64(address) if -(2**63) <= address < 2**63 else address)
    assert g.weights_to_list() == [0.5, -1.0, 2.0]


def test_set_weights_address_in_range_is_read():
    g = small_graph()
    t = torch.tensor([1.5, float("nan"), -2.0])
    g.set_weights(t.data_ptr())
    w = g.weights_to_list()
    assert w[0] == 1.5 and np.isnan(w[1]) and w[2] == -2.0
    buf = (ctypes.c_float * 3)(4.0, 5.0, 6.0)
    g.set_weights(ctypes.addressof(buf))
    assert g.weights_to_list() == [4.0, 5.0, 6.0]


def test_set_weights_rejects_bool_and_garbage():
    g = small_graph()
    with pytest.raises(TypeError):
        g.set_weights(True)
    with pytest.raises(ValueError):
        g.set_weights(["a", "b", "c"])
    with pytest.raises(TypeError):
        g.set_weights(object())
    e = gtn.Graph()
    e.set_weights(0)  # an empty tensor's data_ptr() is 0: fine without arcs
    assert e.weights_to_list() == []


# -- no import cycle ---------------------------------------------------------------------------------


def test_graph_module_does_not_import_utils():
    code = (
        "import sys; import lightning_gtn.wfst.graph as m; "
        "g = m.Graph(); g.add_node(True); repr(g); "
        "assert 'lightning_gtn.wfst.utils' not in sys.modules, sorted(sys.modules)"
    )
    # importing the package imports utils; import graph.py alone through a stub package
    stub = (
        "import importlib.util, sys, types, pathlib, lightning_gtn; "
        "root = pathlib.Path(lightning_gtn.__file__).parent / 'wfst'; "
        "pkg = types.ModuleType('lightning_gtn.wfst'); pkg.__path__ = [str(root)]; "
        "sys.modules['lightning_gtn.wfst'] = pkg; "
    )
    res = subprocess.run([sys.executable, "-c", stub + code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_add_arc_refuses_labels_beyond_int32():
    g = small_graph()
    for bad in (2**31, -2):
        with pytest.raises(ValueError, match="label"):
            g.add_arc(0, 1, bad)
        with pytest.raises(ValueError, match="label"):
            g.add_arc(0, 1, 0, bad)
    assert g.num_arcs() == 3 and g.labels_to_list() == [0, -1, 3]  # the graph still works


# -- bounded reads and the text format's number grammar (second probe, findings 5 and 18) ------


@pytest.mark.parametrize("reader", ["load", "loadtxt"])
def test_readers_refuse_a_device(reader):
    # /dev/zero has size 0 by getsize and never ends: a device is not read at all
    fn = getattr(gtn, reader)
    with pytest.raises(ValueError, match="not a regular file"):
        fn("/dev/zero", max_bytes=4096)


def test_readers_stop_at_max_bytes_on_a_stream():
    big = "0\n1\n" + "0 1 0 0 0.5\n" * 1000
    with pytest.raises(ValueError, match="max_bytes=100"):
        gtn.loadtxt(io.StringIO(big), max_bytes=100)
    assert gtn.loadtxt(io.StringIO(big)).num_arcs() == 1000
    data = io.BytesIO()
    gtn.save(data, small_graph())
    raw = data.getvalue()
    with pytest.raises(ValueError, match="max_bytes"):
        gtn.load(io.BytesIO(raw), max_bytes=len(raw) - 1)
    assert gtn.equal(gtn.load(io.BytesIO(raw), max_bytes=len(raw)), small_graph())
    with pytest.raises(ValueError, match="max_bytes"):
        gtn.load(io.BytesIO(raw), max_bytes=0)


@pytest.mark.parametrize(
    "text",
    [
        "1_0\n1\n0 1 0\n",  # Python's int() reads 10
        "0\n1\n0 1 \u0665\n",  # an Arabic-Indic digit
        "0\n1\n0 1 0 0 1_0.5\n",
        "0\n1\n0 1 0x1\n",
        "0\n1\n0 1 0 0 0x1p3\n",
    ],
)
def test_loadtxt_reads_only_the_format_numbers(text):
    with pytest.raises(ValueError, match="line"):
        gtn.loadtxt(io.StringIO(text))


def test_loadtxt_still_reads_signs_exponents_and_infinities():
    g = gtn.loadtxt(io.StringIO("0\n+1\n0 1 0 0 -1.5e2\n0 1 1 1 inf\n0 1 2 2 .5\n"))
    assert g.weights_to_list() == [-150.0, float("inf"), 0.5]
