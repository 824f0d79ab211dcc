"""``impl="triton"`` through the public RNN-T functions: rnnt_loss, tdt_loss, multiblank_rnnt_loss
and k2's rnnt_loss / rnnt_loss_simple / mutual_information_recursion.

Without a GPU the Triton kernels run on CPU tensors under Triton's interpreter, which must be
switched on before triton is imported: :func:`test_public_functions_under_the_interpreter` runs
this file as a script in ONE subprocess with ``TRITON_INTERPRET=1`` (a few tiny float64 cases,
values and gradients equal to ``impl="numba"``). :func:`test_cuda_default_is_triton_and_equals_numba`
runs ``impl=None`` on a CUDA device (where the dispatcher picks the Triton kernels) against numba on
the CPU; ``make gpu-check`` runs it on a machine with a GPU.
"""

import os

import pytest
import torch

import lightning_gtn.k2 as k2
from lightning_gtn.functional import multiblank_rnnt_loss, rnnt_loss, tdt_loss
from lightning_gtn.kernels import rnnt_triton
from lightning_gtn.losses.rnnt import RNNT_BACKENDS
from tests.kernels._compiled import compile_for_gpu
from tests.kernels._interpreted import run_interpreted

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = torch.cuda.is_available()


def _close(a, b, what, tol=1e-9):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert torch.allclose(a, b, rtol=tol, atol=tol, equal_nan=True), (what, (a - b).abs().max().item())


def _inputs(V=8, dtype=torch.float64, device="cpu"):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 4, V, generator=g, dtype=dtype)  # (B, T, U + 1, V), ragged lengths below
    tg = torch.randint(1, 4, (3, 3), generator=g)  # never a blank of any case
    xl, yl = torch.tensor([5, 4, 2]), torch.tensor([3, 2, 0])
    return x.to(device), tg, xl, yl


def _run(fn, x, tg, xl, yl, impl, **kw):
    """``(out, d out.sum() / d x)`` of ``fn`` on a leaf copy of ``x``."""
    z = x.detach().clone().requires_grad_()
    out = fn(z, tg, xl, yl, impl=impl, **kw)
    out.sum().backward()
    return out.detach(), z.grad


RNNT_CASES = [  # fused and not, blank 0 and -1, clamp, FastEmit, every reduction, the gradient in place
    dict(blank=0, inplace_grad=True),
    dict(blank=-1, fused_log_softmax=False, reduction="none"),
    dict(blank=0, clamp=0.05, fastemit_lambda=0.5, reduction="sum"),
]
TDT_CASES = [
    dict(durations=[0, 1, 2], sigma=0.05, omega=0.3, reduction="none"),
    dict(durations=[0, 1, 2], fastemit_lambda=0.4, clamp=0.03, reduction="mean"),
]
MB_CASES = [
    dict(big_blank_durations=[2, 3], sigma=0.05, reduction="mean_volume"),
    dict(big_blank_durations=[2], fastemit_lambda=0.4, clamp=0.03, reduction="none"),
]


def _interpreted_checks() -> int:
    """Every case, triton against numba on CPU tensors (under the interpreter); the count run."""
    n = 0
    x, tg, xl, yl = _inputs()
    for kw in RNNT_CASES:
        want, got = _run(rnnt_loss, x, tg, xl, yl, "numba", **kw), _run(rnnt_loss, x, tg, xl, yl, "triton", **kw)
        _close(got[0], want[0], f"rnnt_loss {kw}")
        _close(got[1], want[1], f"rnnt_loss grad {kw}")
        n += 1
    for fn, cases in ((tdt_loss, TDT_CASES), (multiblank_rnnt_loss, MB_CASES)):
        for kw in cases:
            want, got = _run(fn, x, tg, xl, yl, "numba", **kw), _run(fn, x, tg, xl, yl, "triton", **kw)
            _close(got[0], want[0], f"{fn.__name__} {kw}")
            _close(got[1], want[1], f"{fn.__name__} grad {kw}")
            n += 1
    # k2: the simple loss (modified recursion, a boundary, return_grad) and the full loss (regular)
    g = torch.Generator().manual_seed(1)
    lm, am = (
        torch.randn(3, 4, 8, generator=g, dtype=torch.float64),
        torch.randn(3, 5, 8, generator=g, dtype=torch.float64),
    )
    sym = torch.randint(1, 8, (3, 3), generator=g)
    bnd = torch.tensor([[0, 0, 3, 5], [0, 0, 2, 4], [0, 0, 1, 3]])
    res = []
    for impl in ("numba", "triton"):
        lz, az = lm.clone().requires_grad_(), am.clone().requires_grad_()
        loss, (gx, gy) = k2.rnnt_loss_simple(
            lz, az, sym, 0, boundary=bnd, rnnt_type="modified", return_grad=True, impl=impl
        )
        loss.backward()
        z = x.detach().clone().requires_grad_()
        full = k2.rnnt_loss(z, sym, 0, boundary=bnd, reduction="none", impl=impl)
        full.sum().backward()
        res.append((loss.detach(), gx, gy, lz.grad, az.grad, full.detach(), z.grad))
    for name, a, b in zip(("simple", "px_grad", "py_grad", "lm grad", "am grad", "full", "full grad"), *res):
        _close(b, a, f"k2 {name}")
    n += 1
    px, py = (
        torch.randn(2, 3, 5, generator=g, dtype=torch.float64),
        torch.randn(2, 4, 4, generator=g, dtype=torch.float64),
    )
    b2 = torch.tensor([[0, 0, 3, 4], [1, 0, 2, 3]])
    s0, (gx0, gy0) = k2.mutual_information_recursion(px, py, b2, return_grad=True, impl="numba")
    s1, (gx1, gy1) = k2.mutual_information_recursion(px, py, b2, return_grad=True, impl="triton")
    for name, a, b in (("scores", s0, s1), ("px_grad", gx0, gx1), ("py_grad", gy0, gy1)):
        _close(b, a, f"mutual_information_recursion {name}")
    return n + 1


@pytest.mark.skipif(not rnnt_triton.available(), reason="needs triton")
@pytest.mark.skipif(INTERPRETED or CUDA, reason="runs the kernels directly here (CUDA test below)")
def test_public_functions_under_the_interpreter():
    run_interpreted(__file__, "wired: 9 groups equal to numba")


@pytest.mark.skipif(not rnnt_triton.available() or INTERPRETED, reason="needs triton's compiler")
@pytest.mark.parametrize("name", ["_drows_kernel", "_dgrad_kernel"])
def test_unfused_duration_kernels_compile_for_the_gpu(name):
    """The duration kernels' ``NORMALISE=False`` branch (``fused_log_softmax=False`` of tdt_loss and
    multiblank_rnnt_loss, added for this wiring) through Triton's real compiler for sm_90 (no GPU)."""
    consts = dict(KB=2, KE=1, HAS_D=True, BLOCK_R=8, BLOCK_V=256, BLOCK_D=4, NORMALISE=False)
    consts.update(dict(ONE_PASS=False) if name == "_drows_kernel" else dict(CLAMP=False, EMIT_SCALE=False))
    ints, longs, int_ptrs = (
        {"R", "T", "U1", "V", "C", "D"},
        {"tgt", "xlen", "ylen"},
        {"BCOL", "BDUR", "BDI", "EDUR", "EDI"},
    )
    kernel = compile_for_gpu(getattr(rnnt_triton, name), torch.float32, consts, 90, ints, longs, int_ptrs)
    assert len(kernel.asm["cubin"]) > 0


@pytest.mark.skipif(CUDA or INTERPRETED, reason="checks the refusal on a CPU without the interpreter")
def test_triton_on_cpu_without_the_interpreter_is_refused():
    x, tg, xl, yl = _inputs()
    pattern = r"impl='triton'.*(cpu|triton package)"
    with pytest.raises(ValueError, match=pattern):
        rnnt_loss(x, tg, xl, yl, blank=0, impl="triton")
    with pytest.raises(ValueError, match=pattern):
        tdt_loss(x, tg, xl, yl, durations=[0, 1, 2], impl="triton")
    with pytest.raises(ValueError, match=pattern):
        multiblank_rnnt_loss(x, tg, xl, yl, big_blank_durations=[2], impl="triton")
    with pytest.raises(ValueError, match=pattern):
        k2.mutual_information_recursion(torch.zeros(1, 2, 4), torch.zeros(1, 3, 3), impl="triton")
    with pytest.raises(ValueError, match=pattern):
        k2.rnnt_loss(x, tg[:, :3] + 1, 0, impl="triton")


def test_default_implementation_per_device():
    assert RNNT_BACKENDS.default(torch.device("cpu")) == "numba"
    assert RNNT_BACKENDS.default(torch.device("meta")) == "torch"  # not CUDA: the reference
    with pytest.raises(ValueError, match="rnnt_loss: impl='numba'.*meta"):
        RNNT_BACKENDS.pick(torch.device("meta"), "numba")
    with pytest.raises(ValueError, match="impl must be None or one of"):
        rnnt_loss(*_inputs(), impl="cuda")


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (make gpu-check runs it on a GPU machine)")
def test_cuda_default_is_triton_and_equals_numba():
    if rnnt_triton.available():
        assert RNNT_BACKENDS.default(torch.device("cuda")) == "triton"  # the self-check passed
    x, tg, xl, yl = _inputs()
    for fn, cases in ((rnnt_loss, RNNT_CASES), (tdt_loss, TDT_CASES), (multiblank_rnnt_loss, MB_CASES)):
        for kw in cases:
            want = _run(fn, x, tg, xl, yl, "numba", **kw)
            got = _run(fn, x.cuda(), tg.cuda(), xl.cuda(), yl.cuda(), None, **kw)
            assert got[1].device.type == "cuda"
            _close(got[0], want[0], f"{fn.__name__} {kw}", tol=1e-7)
            _close(got[1], want[1], f"{fn.__name__} grad {kw}", tol=1e-7)
    g = torch.Generator().manual_seed(1)
    lm, am = torch.randn(3, 4, 8, generator=g), torch.randn(3, 5, 8, generator=g)
    sym = torch.randint(1, 8, (3, 3), generator=g)
    want = k2.rnnt_loss_simple(lm, am, sym, 0, reduction="none", return_grad=True)
    got = k2.rnnt_loss_simple(lm.cuda(), am.cuda(), sym.cuda(), 0, reduction="none", return_grad=True)
    _close(got[0], want[0], "k2 simple (float32)", tol=1e-4)
    _close(got[1][0], want[1][0], "k2 simple px_grad (float32)", tol=1e-4)


def test_no_kernel_argument_shadows_the_launchers_own_names():
    """Triton 3.6's launcher binds a kernel's arguments inside a generated function whose locals
    are ``params``, ``specialization`` and ``options``; a kernel argument of one of those names is
    replaced by the launcher's own value there ("failed to specialize argument of type: dict",
    seen on an H200 with torch 2.11). No kernel of the package may use them."""
    import importlib
    import pkgutil

    import lightning_gtn.kernels as kernels

    triton = pytest.importorskip("triton")
    found = []
    for info in pkgutil.iter_modules(kernels.__path__):
        if "triton" not in info.name:
            continue
        mod = importlib.import_module(f"lightning_gtn.kernels.{info.name}")
        for name, fn in vars(mod).items():
            if isinstance(fn, triton.runtime.jit.JITFunction):
                found.append(name)
                bad = {"params", "specialization", "options"} & set(fn.arg_names)
                assert not bad, (info.name, name, bad)
    assert len(found) >= 6, found


if __name__ == "__main__":  # the child of test_public_functions_under_the_interpreter
    assert INTERPRETED, "run with TRITON_INTERPRET=1"
    print(f"wired: {_interpreted_checks()} groups equal to numba")
