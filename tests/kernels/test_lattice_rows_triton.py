"""The Triton lattices walked by time rows (one scan per row) against the library's numba kernels.

:func:`test_row_lattices_under_the_interpreter` runs this file as a script in ONE subprocess with
``TRITON_INTERPRET=1`` (Triton's interpreter on CPU tensors): regular RNN-T, k2's px/py recursion
(regular and modified, boundaries) and the duration lattice (TDT, multi-blank), values and
gradients equal to numba's, with ragged lengths, ``-inf`` arcs, long ``T``, float32 and float64,
and the anti-diagonal fallback where a row does not fit one block (which kernel ran is counted).
The interpreter runs a program's threads in lock step, so it cannot check the block barriers: the
real compiler does, below, for sm_90 and sm_80 (no GPU needed).
"""

import math
import os
import sys

import numpy as np
import pytest
import torch

from lightning_gtn.functional import multiblank_rnnt_loss, tdt_loss
from lightning_gtn.kernels import rnnt_triton as rt
from lightning_gtn.kernels.mutual_information import mi_numba
from lightning_gtn.kernels.rnnt_numba import rnnt_cost_grad
from tests.kernels._compiled import compile_for_gpu
from tests.kernels._interpreted import run_interpreted

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"  # the kernels' device: CPU tensors only under the interpreter
ROW_KERNELS = ["_lattice_rows_kernel", "_mi_rows_kernel", "_dlattice_rows_kernel"]
DIAGONAL_KERNELS = ["_lattice_kernel", "_mi_kernel", "_dlattice_kernel"]


class _Launches:
    """Counts the launches of one kernel (``kernel[grid](...)``) and passes them on."""

    def __init__(self, kernel):
        self.kernel, self.n = kernel, 0

    def __getitem__(self, grid):
        self.n += 1
        return self.kernel[grid]


def _count_launches(patch=setattr) -> dict:
    counters = {}
    for name in ROW_KERNELS + DIAGONAL_KERNELS:
        counters[name] = _Launches(getattr(rt, name))
        patch(rt, name, counters[name])
    return counters


def _moved(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_moved(v, device) for v in x)
    return x


def _on_device(fn, *args, **kw):
    """``fn`` on :data:`DEVICE` copies of its tensor arguments; its tensors back on the CPU."""
    return _moved(fn(*_moved(args, DEVICE), **kw), "cpu")


def _launched(counters, name: str) -> int:
    """Launches of ``name`` since the last call, the counters reset."""
    n = counters[name].n
    for c in counters.values():
        c.n = 0
    return n


def _close(got, want, what, dtype, tol=None):
    """float64 within 1e-9; float32 within 1e-4 unless ``tol`` says otherwise."""
    tol = tol or (1e-9 if dtype == torch.float64 else 1e-4)
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert torch.allclose(got, want, rtol=tol, atol=tol, equal_nan=True), (what, (got - want).abs().max().item())


def _numba_rnnt(x, tg, xl, yl, blank, fused):
    """Costs ``-log P`` and ``d cost[b] / d x`` by the numba kernel."""
    xn = x.detach().contiguous().numpy()
    grad = np.empty_like(xn)
    costs = rnnt_cost_grad(
        xn, tg.numpy().astype(np.int64), xl.numpy().astype(np.int64), yl.numpy().astype(np.int64),
        blank, fused, 0.0, -1.0, None, grad,
    )  # fmt: skip
    return torch.from_numpy(costs), torch.from_numpy(grad)


def _ragged(B, T, U1, V, dtype, seed, xl, yl):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, U1, V, generator=g, dtype=dtype)
    tg = torch.randint(0, V, (B, U1 - 1), generator=g)
    return x, tg, torch.tensor(xl), torch.tensor(yl)


def _rnnt_case(counters, x, tg, xl, yl, blank, fused, what, kernel="_lattice_rows_kernel", grad_tol=None, **kw):
    costs, grads = _on_device(rt.rnnt_triton, x, tg, xl, yl, blank, fused_log_softmax=fused, **kw)
    assert _launched(counters, kernel) == 1, (what, kernel)
    want_c, want_g = _numba_rnnt(x.double(), tg, xl, yl, blank, fused)  # numba's lattice runs in float64
    _close(costs, want_c, f"{what}: costs", x.dtype)
    _close(grads, want_g, f"{what}: gradients", x.dtype, grad_tol)
    return costs


def _check_rnnt(counters) -> int:
    n = 0
    for dtype in (torch.float64, torch.float32):
        # ragged: a full example, U > T, no target, lengths below the padded sizes
        x, tg, xl, yl = _ragged(4, 5, 6, 6, dtype, 0, [5, 3, 2, 4], [5, 5, 0, 2])
        costs = _rnnt_case(counters, x, tg % 5, xl, yl, 5, True, f"rnnt {dtype}")
        assert torch.isfinite(costs).all()
        n += 1
    # -inf arcs (log-probabilities given): dead blanks and dead targets cut some paths; example
    # 2's final blank is dead, so it has no path at all (cost inf, gradient 0)
    for dtype in (torch.float64, torch.float32):
        x, tg, xl, yl = _ragged(3, 6, 5, 5, dtype, 1, [6, 4, 3], [4, 2, 2])
        lp = x.log_softmax(-1)
        lp[0, 2, :3, 0] = -math.inf  # blanks of row 2, nodes u < 3
        lp[0, 4, :2, 0] = -math.inf
        lp[1, :, 1, tg[1, 1]] = -math.inf  # the target y_1 in every frame but one
        lp[1, 2, 1, tg[1, 1]] = 0.0
        lp[2, 2, 2, 0] = -math.inf  # (T_b - 1, U_b)'s blank: the only way out
        costs = _rnnt_case(counters, lp, tg, xl, yl, 0, False, f"rnnt -inf arcs {dtype}")
        assert torch.isfinite(costs[:2]).all() and math.isinf(costs[2]) and costs[2] > 0
        n += 1
    # a NaN logit inside example 1's lattice: its cost and gradient are NaN, the others untouched
    x, tg, xl, yl = _ragged(3, 5, 4, 6, torch.float32, 9, [5, 4, 3], [3, 2, 2])
    x[1, 2, 1, 3] = math.nan
    costs = _rnnt_case(counters, x, tg % 5, xl, yl, 5, True, "rnnt NaN")
    assert math.isnan(costs[1]) and torch.isfinite(costs[[0, 2]]).all()
    n += 1
    # U + 1 above one block: the anti-diagonal wavefront (block_u, or MAX_ROW_U)
    x, tg, xl, yl = _ragged(2, 4, 6, 5, torch.float64, 3, [4, 3], [5, 3])
    _rnnt_case(counters, x, tg % 4, xl, yl, 4, True, "rnnt block_u < U + 1", "_lattice_kernel", block_u=4)
    saved, rt.MAX_ROW_U = rt.MAX_ROW_U, 4
    try:
        _rnnt_case(counters, x, tg % 4, xl, yl, 4, True, "rnnt U + 1 > MAX_ROW_U", "_lattice_kernel")
        try:
            _on_device(rt.rnnt_triton, x, tg % 4, xl, yl, 4, lattice="rows")
        except ValueError as e:
            assert "lattice='rows'" in str(e)
        else:
            raise AssertionError("lattice='rows' with a row over one block did not raise")
    finally:
        rt.MAX_ROW_U = saved
    _launched(counters, "_lattice_kernel")
    return n + 1


def _check_mi(counters) -> int:
    n = 0
    g = torch.Generator().manual_seed(4)
    B, S, T = 4, 3, 5
    bnd = torch.tensor([[0, 0, S, T], [1, 0, 3, 3], [0, 2, 2, 5], [2, 3, 2, 3]])  # the last box: one node
    for modified in (False, True):
        for dtype in (torch.float64, torch.float32):
            px = torch.randn(B, S, T if modified else T + 1, generator=g, dtype=dtype)
            py = torch.randn(B, S + 1, T, generator=g, dtype=dtype)
            px[0, 1, 2:4] = -math.inf  # dead symbol arcs
            py[1, 2, 1] = -math.inf
            px[2, 1, 3] = math.nan  # inside box 2: a NaN score
            scores, (gx, gy) = _on_device(rt.mutual_information_triton, px, py, bnd)
            assert _launched(counters, "_mi_rows_kernel") == 1
            assert math.isnan(scores[2]) and not torch.isnan(scores[[0, 1, 3]]).any()
            want, wx, wy = mi_numba(px.double(), py.double(), bnd, True)
            what = f"mi modified={modified} {dtype}"
            _close(scores, want, what, dtype)
            # the gradient of a NaN score is 0 here (numba's is NaN), as documented for the kernel
            assert (gx[2] == 0).all() and (gy[2] == 0).all()
            live = [0, 1, 3]
            _close(gx[live], wx[live], what + " px_grad", dtype)
            _close(gy[live], wy[live], what + " py_grad", dtype)
            n += 1
        # S + 1 above one block: the wavefront
        scores, (gx, gy) = _on_device(rt.mutual_information_triton, px, py, bnd, block=2)
        assert _launched(counters, "_mi_kernel") == 1
        _close(scores, want, f"mi modified={modified} fallback", torch.float32)
        _close(gx[live], wx[live], f"mi modified={modified} fallback px_grad", torch.float32)
        n += 1
    return n


def _numba_loss(fn, x, tg, xl, yl, **kw):
    """``(costs, d costs.sum() / d x)`` of ``fn`` by numba, in float64."""
    z = x.detach().double().requires_grad_()
    out = fn(z, tg, xl, yl, impl="numba", reduction="none", **kw)
    out.sum().backward()
    return out.detach(), z.grad


def _check_durations(counters) -> int:
    n = 0
    for durations, dtype in (([0, 1, 2], torch.float64), ([1, 3], torch.float64), ([0, 2, 3], torch.float32)):
        D = len(durations)
        x, tg, xl, yl = _ragged(4, 6, 5, 5 + D, dtype, 5, [6, 3, 2, 5], [4, 4, 0, 2])
        tg = tg % 4
        costs, grads = _on_device(rt.tdt_triton, x, tg, xl, yl, 4, durations, sigma=0.05)
        assert _launched(counters, "_dlattice_rows_kernel") == 1
        want_c, want_g = _numba_loss(tdt_loss, x, tg, xl, yl, blank=4, durations=durations, sigma=0.05)
        # durations [1, 3]: every emission takes a frame, so 4 targets in 3 frames have no path
        assert math.isinf(costs[1]) == (0 not in durations)
        _close(costs, want_c, f"tdt {durations}", dtype)
        _close(grads, want_g, f"tdt {durations} gradients", dtype)
        n += 1
    x, tg, xl, yl = _ragged(4, 7, 5, 6, torch.float64, 6, [7, 4, 2, 5], [4, 4, 0, 2])
    tg = tg % 3  # tokens 0..2; the big blanks are 4 (2 frames) and 3 (4 frames), the blank is 5
    costs, grads = _on_device(rt.multiblank_triton, x, tg, xl, yl, 5, [2, 4], sigma=0.1)
    assert _launched(counters, "_dlattice_rows_kernel") == 1
    want_c, want_g = _numba_loss(multiblank_rnnt_loss, x, tg, xl, yl, blank=5, big_blank_durations=[2, 4], sigma=0.1)
    _close(costs, want_c, "multiblank", torch.float64)
    _close(grads, want_g, "multiblank gradients", torch.float64)
    return n + 1


def _check_long_t(counters) -> int:
    """T = 300 rows, small U, float32. alpha and beta near -500 carry float32's rounding (~4e-4 in
    ``alpha + beta - log P`` here, the same in the wavefront, which does the same arithmetic):
    gradients within 1e-3 of numba's float64."""
    x, tg, xl, yl = _ragged(2, 300, 4, 5, torch.float32, 2, [300, 257], [3, 2])
    _rnnt_case(counters, x, tg % 4, xl, yl, 4, True, "rnnt long T", grad_tol=1e-3)
    g = torch.Generator().manual_seed(8)
    px, py = torch.randn(2, 3, 301, generator=g), torch.randn(2, 4, 300, generator=g)
    bnd = torch.tensor([[0, 0, 3, 300], [0, 0, 2, 211]])
    scores, (gx, gy) = _on_device(rt.mutual_information_triton, px, py, bnd)
    assert _launched(counters, "_mi_rows_kernel") == 1
    want, wx, wy = mi_numba(px.double(), py.double(), bnd, True)
    for what, a, b in (("scores", scores, want), ("px_grad", gx, wx), ("py_grad", gy, wy)):
        _close(a, b, f"mi long T {what}", torch.float32, 1e-3)
    x, tg, xl, yl = _ragged(2, 300, 3, 4 + 3, torch.float32, 7, [300, 180], [2, 1])
    tg = tg % 3
    want_c, want_g = _numba_loss(tdt_loss, x, tg, xl, yl, blank=3, durations=[0, 1, 2])
    costs, grads = _on_device(rt.tdt_triton, x, tg, xl, yl, 3, [0, 1, 2])
    assert _launched(counters, "_dlattice_rows_kernel") == 1
    _close(costs, want_c, "tdt long T", torch.float32)
    _close(grads, want_g, "tdt long T gradients", torch.float32, 1e-3)
    return 3


def _check_gpu_table() -> int:
    """``make gpu-check``'s lattice table, run here on a tiny shape with a stand-in timer: every
    case runs both walks and finds them equal."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "benchmarks"))
    import bench_rnnt

    table = bench_rnnt.gpu_lattice_table(1, device=DEVICE, shapes=[(2, 5, 3, 6)], timer=lambda fn, r: (fn(), 1e-3)[1])
    lines = [ln for ln in table.splitlines() if ln.startswith("| 2, 5, 3, 6 |")]
    assert len(lines) == 5 and all("| 1.00 |" in ln for ln in lines), table
    return 1


def _checks(long_t: bool, patch=setattr) -> int:
    counters = _count_launches(patch)
    if long_t:
        return _check_long_t(counters)
    return _check_rnnt(counters) + _check_mi(counters) + _check_durations(counters) + _check_gpu_table()


@pytest.mark.skipif(not rt.available(), reason="needs triton")
@pytest.mark.skipif(INTERPRETED or torch.cuda.is_available(), reason="runs the kernels directly here")
def test_row_lattices_under_the_interpreter():
    run_interpreted(__file__, "rows: 17 checks equal to numba")


@pytest.mark.skipif(not rt.available() or not CUDA, reason="needs triton and a CUDA device")
def test_row_lattices_on_cuda(monkeypatch):
    """The same checks on a GPU (``make gpu-check``), where the block barriers are real."""
    assert _checks(False, monkeypatch.setattr) == 17 and _checks(True, monkeypatch.setattr) == 3


@pytest.mark.slow
@pytest.mark.skipif(not rt.available(), reason="needs triton")
@pytest.mark.skipif(INTERPRETED or torch.cuda.is_available(), reason="runs the kernels directly here")
def test_row_lattices_long_t_under_the_interpreter():
    run_interpreted(__file__, "rows: 3 checks equal to numba", args=["long"])


def test_lattice_option_is_checked():
    with pytest.raises(ValueError, match="lattice must be"):
        rt._walk_rows("wavefront", 5, None, "rnnt_triton")
    assert rt._walk_rows("auto", rt.MAX_ROW_U, None, "x") and not rt._walk_rows("auto", rt.MAX_ROW_U + 1, None, "x")
    assert not rt._walk_rows("auto", 6, 4, "x") and not rt._walk_rows("diagonals", 2, None, "x")
    with pytest.raises(ValueError, match="lattice='rows' needs a row of at most 4 nodes, got 6"):
        rt._walk_rows("rows", 6, 4, "x")


_INTS = {"T", "U1", "S", "T1"}
_LONG_PTRS = {"xlen", "ylen", "bnd"}
_INT_PTRS = {"BDUR", "EDUR"}
COMPILED = [  # (kernel, dtype, constexprs): every branch of each row kernel
    ("_lattice_rows_kernel", torch.float32, dict(BLOCK_U=128)),
    ("_lattice_rows_kernel", torch.float64, dict(BLOCK_U=256)),
    ("_mi_rows_kernel", torch.float32, dict(MODIFIED=False, BLOCK=64)),
    ("_mi_rows_kernel", torch.float32, dict(MODIFIED=True, BLOCK=64)),
    ("_dlattice_rows_kernel", torch.float32, dict(KB=3, KE=2, BLOCK_U=128)),
]


@pytest.mark.skipif(not rt.available() or INTERPRETED, reason="needs triton's compiler")
@pytest.mark.parametrize("arch", [90, 80])
@pytest.mark.parametrize("name, dtype, consts", COMPILED, ids=[f"{c[0]}-{i}" for i, c in enumerate(COMPILED)])
def test_row_kernel_compiles_for_the_gpu(name, dtype, consts, arch):
    """Triton IR -> PTX -> cubin for sm_90 and sm_80 (no GPU needed). The regular recursions' rows
    are warp-level scans (shuffles); the modified and duration rows read earlier rows back after
    a block barrier."""
    fn = getattr(rt, name)
    kernel = compile_for_gpu(fn, dtype, consts, arch, _INTS, _LONG_PTRS, _INT_PTRS)
    assert len(kernel.asm["cubin"]) > 0
    ptx = kernel.asm["ptx"]
    if not consts.get("MODIFIED"):
        assert "shfl.sync" in ptx  # the scan
    if consts.get("MODIFIED") or name == "_dlattice_rows_kernel":
        assert "bar.sync" in ptx or "barrier.sync" in ptx


if __name__ == "__main__":  # the child of test_row_lattices_under_the_interpreter
    assert INTERPRETED, "run with TRITON_INTERPRET=1"
    print(f"rows: {_checks(sys.argv[1:] == ['long'])} checks equal to numba")
