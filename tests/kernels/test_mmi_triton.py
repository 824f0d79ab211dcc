"""The Triton kernels of the shared MMI denominator (:mod:`lightning_gtn.kernels.mmi_triton`).

Without a GPU they run on CPU tensors under Triton's interpreter, which must be switched on
before triton is imported: :func:`test_equals_numba_under_the_interpreter` runs this file as a
script in one subprocess with ``TRITON_INTERPRET=1``. The kernels also go through Triton's real
compiler for sm_90 and sm_80 (no GPU needed), and on a CUDA device (``make gpu-check``) the
default path of ``mmi_loss`` must pick them and equal the CPU kernel.
"""

import os

import numpy as np
import pytest
import torch

from lightning_gtn.core.shared_graph import shared_graph
from lightning_gtn.functional import mmi_denominator_score, mmi_loss
from lightning_gtn.kernels import mmi_triton
from tests.kernels._interpreted import run_interpreted
from tests.losses.test_mmi import bigram_den

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CLASSES = {"ctc": 4, "modified_ctc": 4, "hmm1": 3, "hmm2": 6}  # 3 tokens


def _pair(den, C, dtype, leaky, device, impl, lengths=(6, 4, 0, 5), nan_row=None):
    """``(log Z, gradient)`` of ``impl`` on ``device`` and of numba on the CPU, same inputs."""
    g = torch.Generator().manual_seed(C + len(lengths))
    x = torch.randn(len(lengths), max(lengths), C, generator=g, dtype=dtype).log_softmax(-1)
    if nan_row is not None:
        x[nan_row, 1, 0] = float("nan")
    il = torch.tensor(lengths)
    w = torch.arange(1, len(lengths) + 1, dtype=dtype)
    out = []
    for dev, im in ((device, impl), ("cpu", "numba")):
        z = x.to(dev).requires_grad_()
        s = mmi_denominator_score(z, il.to(dev), den, leaky_hmm=leaky, impl=im)
        torch.where(torch.isfinite(s), s, 0.0).mul(w.to(dev)).sum().backward()
        out.append((s.detach().cpu(), z.grad.cpu()))
    return out


def _interpreted_checks() -> int:
    n = 0
    for topo, C in CLASSES.items():
        den = bigram_den(3, topology=topo, seed=2, keep=0.7)
        assert mmi_triton.supports(shared_graph(den))
        for dtype in (torch.float32, torch.float64):
            for leaky in (0.0, 0.25):
                (z, gz), (r, gr) = _pair(den, C, dtype, leaky, "cpu", "triton")
                tol = 1e-5 if dtype == torch.float32 else 1e-11
                torch.testing.assert_close(z, r, rtol=tol, atol=tol)
                torch.testing.assert_close(gz, gr, rtol=tol, atol=tol)
                assert gz.abs().sum() > 0
                n += 1
    den = bigram_den(3, seed=3)
    (z, gz), (r, gr) = _pair(den, 4, torch.float64, 0.1, "cpu", "triton", nan_row=1)
    assert torch.isnan(z[1]) and torch.isnan(r[1]) and not gz[1].any() and not gr[1].any()
    torch.testing.assert_close(z[[0, 2, 3]], r[[0, 2, 3]])
    torch.testing.assert_close(gz, gr)
    mmi_triton.MAX_TILE = 8  # states read their arcs in chunks of one or two (ONE_K off)
    (z, gz), (r, gr) = _pair(bigram_den(4, seed=4), 5, torch.float64, 0.2, "cpu", "triton")
    torch.testing.assert_close(z, r)
    torch.testing.assert_close(gz, gr)
    tg, tl = torch.tensor([[1, 2], [3, 3], [0, 0]]), torch.tensor([2, 2, 0])
    x = torch.randn(3, 7, 5, dtype=torch.float64).log_softmax(-1)
    il = torch.tensor([7, 6, 3])
    den = bigram_den(4, seed=5)
    a = mmi_loss(x, tg, il, tl, denominator=den, leaky_hmm=0.1, impl="triton", reduction="none")
    torch.testing.assert_close(a, mmi_loss(x, tg, il, tl, denominator=den, leaky_hmm=0.1, reduction="none"))
    return n + 3


@pytest.mark.skipif(not mmi_triton.available() or INTERPRETED, reason="needs triton")
@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernels run on the GPU here (the CUDA test below)")
def test_equals_numba_under_the_interpreter():
    run_interpreted(__file__, "mmi triton: 19 cases equal to numba")


def test_node_view_splits_states_entered_under_two_labels():
    """The modified CTC topology's states are entered under two labels: its node view has a node per
    group and per state, and the same paths (weights and label sequences)."""
    ctc = mmi_triton._nodes(shared_graph(bigram_den(3, seed=1)))
    assert not ctc.split and ctc.num_nodes == shared_graph(bigram_den(3, seed=1)).num_states
    sg = shared_graph(bigram_den(3, topology="modified_ctc", seed=1))
    nd = mmi_triton._nodes(sg)
    assert nd.split and nd.num_nodes == sg.num_groups + sg.num_states
    assert mmi_triton.supports(sg) and not mmi_triton.supports(sg, need_w=True)
    # the total weight of all 3-frame paths by label sequence, on the graph and on the node view
    a = sg
    A = np.zeros((nd.num_nodes, nd.num_nodes))
    np.add.at(A, (nd.cols, nd.rows), nd.vals)
    assert (np.abs(nd.start.sum() - 1) < 1e-12) and (nd.lab[nd.start > 0] < 0).all()
    vec = nd.start @ A @ A @ A
    start = np.zeros(a.num_states)
    start[a.start] = 1 / len(a.start)
    M = np.zeros((a.num_states, a.num_states))
    ag = np.repeat(np.arange(a.num_groups), np.diff(a.group_off))
    np.add.at(M, (a.fwd_src, a.group_dst[ag]), a.fwd_prob)
    graph_mass = start @ M @ M @ M
    acc = np.zeros(a.num_states)
    acc[a.accept] = 1
    assert abs(vec @ nd.accept - graph_mass @ acc) < 1e-12 and graph_mass @ acc > 0


@pytest.mark.skipif(not mmi_triton.available() or INTERPRETED, reason="needs triton's compiler")
@pytest.mark.parametrize("name", ["_forward_kernel", "_backward_kernel"])
@pytest.mark.parametrize("dtype, one_k, leak, capability", [("fp32", True, False, 90), ("fp64", False, True, 90),
                                                            ("fp32", False, True, 80)])  # fmt: skip
def test_kernels_compile_for_the_gpu(name, dtype, one_k, leak, capability):
    """Triton IR -> PTX -> cubin (ptxas) for Hopper and Ampere; no GPU needed."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(mmi_triton, name)
    ints = {"sEb", "sEt", "S", "K", "T"}
    int_ptrs = {"lens", "ok", "lab_t", "has_t", "in_src", "out_dst"}
    consts = dict(BLOCK_S=64, BLOCK_K=16, ONE_K=one_k, LEAK=leak)
    sig = {
        a: "constexpr"
        if a in consts
        else "i32"
        if a in ints
        else "*i32"
        if a in int_ptrs
        else "*fp64"
        if a == "logz"
        else f"*{dtype}"
        for a in fn.arg_names
    }
    cx = {(fn.arg_names.index(k),): v for k, v in consts.items()}
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cx), target=GPUTarget("cuda", capability, 32))
    ptx = kernel.asm["ptx"]
    assert len(kernel.asm["cubin"]) > 0
    assert "bar.sync" in ptx or "barrier.sync" in ptx  # frames are separated by block barriers


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_default_is_triton_and_equals_the_cpu_kernel(recwarn):
    from lightning_gtn.losses import mmi as mmi_mod

    for topo, C in CLASSES.items():
        den = bigram_den(5, topology=topo, seed=6, keep=0.6)
        C = {"ctc": 6, "hmm1": 5, "hmm2": 10}[topo]
        for dtype in (torch.float32, torch.float64):
            (z, gz), (r, gr) = _pair(den, C, dtype, 0.1, "cuda", None, lengths=(40, 17, 0, 33))
            tol = 1e-4 if dtype == torch.float32 else 1e-8  # the GPU sums in another order
            torch.testing.assert_close(z, r, rtol=tol, atol=tol)
            torch.testing.assert_close(gz, gr, rtol=tol, atol=tol)
    assert mmi_mod.DEN_BACKENDS.passed("cuda:0")
    assert not [w for w in recwarn if "self-check" in str(w.message)]


if __name__ == "__main__":  # the child of test_equals_numba_under_the_interpreter
    assert INTERPRETED, "run with TRITON_INTERPRET=1"
    print(f"mmi triton: {_interpreted_checks()} cases equal to numba")
