"""The Triton kernels against the numba kernels on the CPU (values and gradients).

They run on a CUDA device when there is one. Without one they run on the CPU under Triton's
interpreter (``TRITON_INTERPRET=1``, which must be set before triton is imported): the test
:func:`test_kernels_under_the_interpreter` re-runs this file that way in a subprocess, so CI
(no GPU) checks the kernels' logic too. Every specialisation of the kernels is also compiled
for sm_80/sm_90 by Triton's real compiler, which needs no GPU. Skipped where triton is not
installed.
"""

import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import lightning_gtn.wfst as gtn
from lightning_gtn.core import dispatch, scoring
from lightning_gtn.functional import asg_loss, ctc_loss, graph_loss, sequence_loss
from lightning_gtn.kernels import graph_triton
from lightning_gtn.kernels.graph_triton import triton

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else ("cpu" if INTERPRETED else None)
needs_kernels = pytest.mark.skipif(
    not graph_triton.available() or DEVICE is None, reason="needs triton and a CUDA device (or TRITON_INTERPRET=1)"
)

TARGETS = [[1, 2, 2], [3, 1], [5, 4, 3, 2], []]
LENS = [12, 9, 11, 5]


def _emissions(dtype, B=4, T=12, C=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, C, generator=g, dtype=dtype).log_softmax(-1)


def _both(fn, x, *params):
    """``fn(x, *params, impl)`` with numba on the CPU and triton on DEVICE: losses and gradients."""
    out = []
    for impl, dev in (("numba", "cpu"), ("triton", DEVICE)):
        xi = x.detach().to(dev).requires_grad_(True)
        ps = [p.detach().to(dev).requires_grad_(True) for p in params]
        loss = fn(xi, *ps, impl)
        weights = torch.linspace(0.5, 1.5, loss.numel(), dtype=loss.dtype, device=dev)
        grads = torch.autograd.grad((loss * weights).sum(), [xi, *ps])
        out.append([loss.detach().cpu()] + [g.cpu() for g in grads])
    return out


def _close(a, b, dtype):
    tol = 1e-9 if dtype == torch.float64 else 2e-5
    for u, v in zip(a, b):
        torch.testing.assert_close(v, u, rtol=tol, atol=tol, equal_nan=True)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ctc(dtype):
    x = _emissions(dtype)
    tg = torch.tensor([t + [0] * (4 - len(t)) for t in TARGETS])
    tl = torch.tensor([len(t) for t in TARGETS])

    def fn(x, impl):
        dev = x.device
        return ctc_loss(x, tg.to(dev), torch.tensor(LENS, device=dev), tl.to(dev), reduction="none", impl=impl)

    a, b = _both(fn, x)
    assert torch.isfinite(a[0]).all()
    _close(a, b, dtype)


@needs_kernels
def test_ctc_infeasible_and_zero_infinity():
    x = _emissions(torch.float64)
    tg = torch.tensor([[1, 1, 1, 1]] * 4)
    il = torch.tensor([12, 6, 3, 7])  # repeats need blanks between them: 7 frames at least
    for zi in (False, True):

        def fn(x, impl, zi=zi):
            dev = x.device
            return ctc_loss(
                x,
                tg.to(dev),
                il.to(dev),
                torch.full((4,), 4, device=dev),
                reduction="none",
                zero_infinity=zi,
                impl=impl,
            )

        a, b = _both(fn, x)
        assert torch.isinf(a[0][1:3]).all() != zi
        _close(a, b, torch.float64)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_asg_with_transition_gradient(dtype):
    x = _emissions(dtype)
    tr = torch.randn(7, 6, generator=torch.Generator().manual_seed(3), dtype=dtype) * 0.5

    def fn(x, tr, impl):
        return asg_loss(
            x, TARGETS[:3] + [[2]], torch.tensor(LENS, device=x.device), transitions=tr, reduction="none", impl=impl
        )

    a, b = _both(fn, x, tr)
    assert a[2].abs().sum() > 0
    _close(a, b, dtype)


@needs_kernels
def test_asg_in_chunks(monkeypatch):
    # a tile smaller than a node's arcs: the kernels read the arc tables in chunks
    monkeypatch.setattr(graph_triton, "MAX_TILE", 8)
    assert graph_triton._blocks(7, 7)[1] < 7
    test_asg_with_transition_gradient(torch.float64)


@needs_kernels
def test_sequence_criterion():
    x = _emissions(torch.float64)

    def fn(x, impl):
        return sequence_loss(x, TARGETS[:3] + [[4]], torch.tensor(LENS, device=x.device), reduction="none", impl=impl)

    _close(*_both(fn, x), torch.float64)


def _mixed_label_graph():
    # arcs into node 1 carry different labels (0 and 2): the per-arc emission gradient path
    g = gtn.Graph(False)
    g.add_node(True)
    g.add_node(False, True)
    g.add_node(False, True)
    g.add_arc(0, 1, 0, 0, 0.2)
    g.add_arc(0, 1, 2, 2, -0.3)
    g.add_arc(1, 1, 1, 1, 0.1)
    g.add_arc(1, 2, 3, 3, 0.0)
    g.add_arc(2, 1, 0, 0, 0.4)
    g.add_arc(2, 2, 2, 2, -0.1)
    g.add_arc(0, 0, 1, 1, 0.0)
    return g


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_graph_loss_arc_labels_and_weight_gradient(dtype):
    g = _mixed_label_graph()
    tables = graph_triton.build_tables(scoring.Plan([_compile(g)], [0], [0], [3], [1.0], 1).problem, "cpu")
    assert tables.node_lab is None
    x = _emissions(dtype, C=4)
    w0 = torch.tensor(g.weights_to_list(), dtype=dtype)

    def fn(x, w, impl):
        return graph_loss(
            x,
            input_lengths=torch.tensor(LENS, device=x.device),
            graphs=[g] * 4,
            weights=[w],
            reduction="none",
            impl=impl,
        )

    a, b = _both(fn, x, w0)
    assert a[2].abs().sum() > 0
    _close(a, b, dtype)


def _compile(g):
    from lightning_gtn.kernels.compiled_graphs import compile_graph

    return compile_graph(g)


@needs_kernels
def test_epsilon_graphs_fall_back_to_torch():
    g = gtn.Graph(False)
    g.add_node(True)
    g.add_node(False, True)
    g.add_arc(0, 1, gtn.epsilon, gtn.epsilon, 0.5)
    g.add_arc(0, 0, 1, 1, 0.0)
    g.add_arc(1, 1, 2, 2, 0.0)
    plan = scoring.Plan([_compile(g)], [0], [0], [5], [1.0], 1)
    x = _emissions(torch.float64, B=1, T=5, C=3).to(DEVICE)
    st = dispatch.forward(plan.problem, x, torch.tensor([0.5, 0.0, 0.0], dtype=torch.float64, device=DEVICE), "triton")
    assert st.impl == "torch"
    ref = dispatch.forward(plan.problem, x.cpu(), torch.tensor([0.5, 0.0, 0.0], dtype=torch.float64), "numba")
    torch.testing.assert_close(st.logz.cpu(), ref.logz)


@needs_kernels
def test_graphs_too_large_for_one_program_fall_back_to_torch(monkeypatch):
    plan = scoring.Plan([_compile(_mixed_label_graph())], [0], [0], [4], [1.0], 1)
    x = _emissions(torch.float64, B=1, T=4, C=4).to(DEVICE)
    w = torch.zeros(plan.batch.num_arcs, dtype=torch.float64, device=DEVICE)
    assert dispatch.forward(plan.problem, x, w, "triton").impl == "triton"
    monkeypatch.setattr(graph_triton, "MAX_NODES", 2)  # the graph has 3 nodes
    st = dispatch.forward(plan.problem, x, w, "triton")
    assert st.impl == "torch"
    ref = dispatch.forward(plan.problem, x.cpu(), w.cpu(), "numba")
    torch.testing.assert_close(st.logz.cpu(), ref.logz)


def _random_graph(rng, num_nodes, num_arcs, C):
    """An epsilon-free acceptor with random arcs, one or two start and accept nodes (some nodes
    may be unreachable or dead ends), and random weights."""
    g = gtn.Graph(False)
    starts = set(rng.choice(num_nodes, size=rng.integers(1, 3), replace=False).tolist())
    accepts = set(rng.choice(num_nodes, size=rng.integers(1, 3), replace=False).tolist())
    for n in range(num_nodes):
        g.add_node(n in starts, n in accepts)
    for _ in range(num_arcs):
        lab = int(rng.integers(C))
        g.add_arc(int(rng.integers(num_nodes)), int(rng.integers(num_nodes)), lab, lab, float(rng.normal()))
    return g


@needs_kernels
@pytest.mark.parametrize("seed", range(4))
def test_random_graphs_scores_and_gradients(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    C, B = 4, 3
    graphs = [_random_graph(rng, int(rng.integers(2, 7)), int(rng.integers(3, 14)), C) for _ in range(B)]
    weights = [torch.tensor(g.weights_to_list(), dtype=torch.float64) for g in graphs]
    lengths = torch.tensor(rng.integers(0, 7, size=B))
    x = _emissions(torch.float64, B=B, T=6, C=C, seed=seed)
    if seed % 2:
        monkeypatch.setattr(graph_triton, "MAX_TILE", 8)  # the chunked path

    def fn(x, *w, impl):
        return graph_loss(
            x,
            input_lengths=lengths.to(x.device),
            graphs=graphs,
            weights=list(w),
            reduction="none",
            zero_infinity=True,
            impl=impl,
        )

    a, b = _both(lambda x, *rest: fn(x, *rest[:-1], impl=rest[-1]), x, *weights)
    assert (a[0] != 0).any() and a[1].abs().sum() > 0  # some example has paths
    _close(a, b, torch.float64)
    # the max semiring too
    plan = scoring.Plan([_compile(g) for g in graphs], range(B), range(B), lengths.numpy(), [1.0] * B, B)
    w = torch.cat(weights)
    ref = dispatch.forward(plan.problem, x, w, "numba", semiring="max").logz
    got = dispatch.forward(plan.problem, x.to(DEVICE), w.to(DEVICE), "triton", semiring="max").logz
    torch.testing.assert_close(got.cpu(), ref)


@needs_kernels
def test_max_semiring_matches_numba():
    from lightning_gtn.core.criterion_graphs import compiled_asg_full

    cg = compiled_asg_full(5)
    x = _emissions(torch.float64, B=3, T=9, C=5)
    w = torch.randn(cg.num_arcs, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    plan = scoring.Plan([cg], [0, 0, 0], [0, 1, 2], [9, 4, 0], [1.0] * 3, 3)
    a = dispatch.forward(plan.problem, x, w, "numba", semiring="max").logz
    b = dispatch.forward(plan.problem, x.to(DEVICE), w.to(DEVICE), "triton", semiring="max").logz
    torch.testing.assert_close(b.cpu(), a)


@needs_kernels
def test_nan_emissions_give_nan():
    x = _emissions(torch.float32)
    x[1, 3, 3] = math.nan  # a label of example 1's target
    tg = torch.tensor([[1, 2], [3, 1], [5, 4], [2, 2]])
    loss = ctc_loss(
        x.to(DEVICE),
        tg.to(DEVICE),
        torch.tensor(LENS, device=DEVICE),
        torch.full((4,), 2, device=DEVICE),
        reduction="none",
        impl="triton",
    ).cpu()
    assert math.isnan(loss[1]) and torch.isfinite(loss[[0, 2, 3]]).all()


@needs_kernels
def test_default_impl_on_cuda_is_triton():
    x = torch.zeros(1, 1, 1, device=DEVICE)
    assert scoring.pick_impl(x, None) == ("triton" if DEVICE == "cuda" else "numba")


@pytest.mark.skipif(not graph_triton.available(), reason="needs triton")
@pytest.mark.skipif(INTERPRETED or torch.cuda.is_available(), reason="runs the kernels directly here")
def test_kernels_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", last)
    assert passed and int(passed.group(1)) >= 13 and "failed" not in last, proc.stdout[-2000:]


def _pointer_and_scalar_types(fn, dtype):
    fp = "*fp64" if dtype == torch.float64 else "*fp32"
    ints = {"sEb", "sEt", "S", "T1"}
    int_ptrs = {
        "ex_graph",
        "ex_row",
        "ex_len",
        "in_src",
        "in_lab",
        "in_arc",
        "out_dst",
        "out_lab",
        "out_arc",
        "start",
        "accept",
        "node_lab",
        "g_nodes",
        "g_k",
    }
    long_ptrs = {"g_tab", "g_node", "g_arc", "ex_occ"}
    return {
        a: "i32" if a in ints else "*i32" if a in int_ptrs else "*i64" if a in long_ptrs else fp for a in fn.arg_names
    }


def _variants():
    for dtype in (torch.float32, torch.float64):
        for one_k in (True, False):
            for use_max in (False, True):
                yield (
                    "_forward_kernel",
                    dtype,
                    dict(BLOCK_S=512, BLOCK_K=4 if one_k else 8, ONE_K=one_k, USE_MAX=use_max),
                )
            for node_e, arc_e, need_w in (
                (True, False, False),
                (False, True, False),
                (True, False, True),
                (False, True, True),
                (False, False, True),
            ):
                yield (
                    "_backward_kernel",
                    dtype,
                    dict(
                        BLOCK_S=1024, BLOCK_K=4 if one_k else 2, ONE_K=one_k, NODE_E=node_e, ARC_E=arc_e, NEED_W=need_w
                    ),
                )


VARIANTS = list(_variants())


@pytest.mark.skipif(not graph_triton.available() or INTERPRETED, reason="needs triton's compiler")
@pytest.mark.parametrize(
    "name, dtype, consts, capability",
    [(*v, 90) for v in VARIANTS] + [(*v, 80) for v in VARIANTS[:6:2]],
    ids=lambda v: str(v)
    if not isinstance(v, dict)
    else "-".join(f"{k}={int(x) if isinstance(x, bool) else x}" for k, x in v.items() if k != "BLOCK_S"),
)
def test_kernel_variant_compiles_for_the_gpu(name, dtype, consts, capability):
    """The real compiler path (Triton IR -> PTX -> cubin with ptxas) for every specialisation the
    loss functions can ask for (28), on Hopper and a few on Ampere. Compiling needs no GPU, so CI
    checks this too."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(graph_triton, name)
    sig = {a: ("constexpr" if a in consts else t) for a, t in _pointer_and_scalar_types(fn, dtype).items()}
    cx = {(fn.arg_names.index(k),): v for k, v in consts.items()}
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cx), target=GPUTarget("cuda", capability, 32))
    assert len(kernel.asm["cubin"]) > 0
    ptx = kernel.asm["ptx"]
    assert "bar.sync" in ptx or "barrier.sync" in ptx  # frames are separated by block barriers
    # gradient sums need no ordering: relaxed reductions, no fences (Triton 3.7+ writes them as
    # fire-and-forget `red`, Triton 3.6 as `atom` with the result unused: both unordered)
    atomics = set(re.findall(r"\b(?:red|atom)\.[\w.]+", ptx))
    assert all(".relaxed." in a and ".add." in a for a in atomics), atomics
    assert bool(atomics) == (name == "_backward_kernel")  # emission and/or weight gradients


@needs_kernels
def test_self_check_passes_and_catches_a_wrong_kernel(monkeypatch):
    problem = dispatch._self_check()
    assert dispatch._self_check_error(problem, torch.device(DEVICE)) is None
    real = graph_triton.forward

    def off_by_a_little(*args, **kwargs):
        alpha, logz = real(*args, **kwargs)
        return alpha, logz + 1e-4

    monkeypatch.setattr(graph_triton, "forward", off_by_a_little)
    assert "scores differ" in dispatch._self_check_error(problem, torch.device(DEVICE))


@pytest.mark.skipif(not graph_triton.available(), reason="needs triton")
def test_failed_self_check_warns_and_uses_torch(monkeypatch):
    def broken(problem, device):
        raise RuntimeError("no kernel image is available")

    from lightning_gtn.core import impl as impl_mod

    monkeypatch.setattr(dispatch, "_self_check_error", broken)
    monkeypatch.setattr(impl_mod, "_CHECKED", {})
    with pytest.warns(RuntimeWarning, match="self-check on cuda:7.*no kernel image"):
        assert scoring.GRAPH_BACKENDS.default(torch.device("cuda:7")) == "torch"
    assert scoring.GRAPH_BACKENDS.default(torch.device("cuda:7")) == "torch"  # decided once per device
    monkeypatch.setattr(dispatch, "_self_check_error", lambda problem, device: None)
    monkeypatch.setattr(impl_mod, "_CHECKED", {})
    assert scoring.GRAPH_BACKENDS.default(torch.device("cuda:7")) == "triton"


@pytest.mark.skipif(not graph_triton.available(), reason="needs triton")
def test_tables_are_cached_per_graph_and_not_pickled():
    import pickle

    from lightning_gtn.core.criterion_graphs import compiled_ctc

    cg = compiled_ctc((1, 2, 2), 0)
    plan = scoring.Plan([cg, compiled_ctc((3,), 0)], [0, 1], [0, 1], [5, 5], [1.0, 1.0], 2)
    a = graph_triton.build_tables(plan.problem, "cpu")
    assert cg.device_tables["on_device"]["cpu"]["in_node"].numel() == 7 * a.g_kin[0]
    b = graph_triton.build_tables(plan.problem, "cpu")
    for name in ("in_src", "in_lab", "in_arc", "out_dst", "out_lab", "out_arc", "start", "accept", "node_lab"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert a.g_arc.tolist() == [0, cg.num_arcs]  # the second graph's arcs follow the first's
    copy = pickle.loads(pickle.dumps(cg))
    assert getattr(copy, "device_tables", None) is None and copy.num_arcs == cg.num_arcs
