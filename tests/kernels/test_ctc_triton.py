"""The Triton CTC kernel (``impl="triton_ctc"``, the CUDA default) against the CPU kernel
(``impl="numba_ctc"``) and torch's ``ctc_loss``.

Without a GPU the kernels run on CPU tensors under Triton's interpreter, which must be switched on
before triton is imported: :func:`test_equals_numba_and_torch_under_the_interpreter` runs this file
as a script in ONE subprocess with ``TRITON_INTERPRET=1`` (small ragged batches in float32 and
float64, every reduction, repeats, empty and infeasible targets, states in several blocks, NaN
emissions, T=2000 with S=200). :func:`test_kernels_compile_for_the_gpu` compiles both kernels to
GPU code (no GPU needed); :func:`test_cuda_default_is_triton_ctc` runs ``impl=None`` on a CUDA
device against the CPU kernel (``make gpu-check``).
"""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as TF

from lightning_gtn.functional import ctc_loss
from lightning_gtn.kernels import ctc_numba, ctc_triton

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _batch(seed, B, T, C, S, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g, dtype=dtype)
    il = torch.randint(0, T + 1, (B,), generator=g)
    il[0] = T
    tl = torch.randint(0, S + 1, (B,), generator=g)
    tl[0] = S
    tg = torch.randint(1, C, (B, S), generator=g)
    tg[0, 1] = tg[0, 0]  # a repeat: needs a blank between
    return x, tg, il, tl


def _run(x, tg, il, tl, impl, device="cpu", **kw):
    """``(loss, d loss.sum() / d logits)`` through log_softmax, on ``device``."""
    z = x.detach().clone().to(device).requires_grad_(True)
    out = ctc_loss(z.log_softmax(-1), tg, il, tl, impl=impl, **kw)
    out.sum().backward()
    return out.detach().cpu(), z.grad.cpu()


def _close(a, b, what, tol):
    a, b = a.double(), b.double()
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert torch.allclose(a, b, rtol=tol, atol=tol, equal_nan=True), (what, (a - b).abs().nan_to_num().max().item())


def _interpreted_checks() -> int:
    """Every case, triton_ctc against numba_ctc and torch on CPU tensors; the count run."""
    n = 0
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
        x, tg, il, tl = _batch(0, 4, 10, 6, 4, dtype)
        for reduction in ("none", "mean", "sum"):
            for zi in (False, True) if dtype == torch.float64 else (reduction != "sum",):
                kw = dict(reduction=reduction, zero_infinity=zi)
                got, want = _run(x, tg, il, tl, "triton_ctc", **kw), _run(x, tg, il, tl, "numba_ctc", **kw)
                _close(got[0], want[0], ("value", dtype, reduction, zi), tol)
                _close(got[1], want[1], ("grad", dtype, reduction, zi), tol)
                if zi:  # torch's infinite rows have NaN gradients without zero_infinity
                    xt = x.detach().clone().requires_grad_(True)
                    ref = TF.ctc_loss(xt.log_softmax(-1).transpose(0, 1), tg, il, tl, **kw)
                    ref.sum().backward()
                    _close(got[0], ref.detach(), ("torch value", dtype, reduction), tol)
                    _close(got[1], xt.grad, ("torch grad", dtype, reduction), tol)
                n += 1
    # infeasible rows (too few frames, repeats needing blanks), empty targets, T = 0
    x = torch.randn(4, 6, 5, dtype=torch.float64)
    tg = torch.tensor([[1, 1, 1, 2], [1, 2, 3, 4], [0, 0, 0, 0], [2, 3, 0, 0]])
    il, tl = torch.tensor([5, 3, 4, 0]), torch.tensor([4, 4, 0, 2])  # [1, 1, 1, 2] needs 6 frames
    for zi in (False, True):
        got, want = (
            _run(x, tg, il, tl, "triton_ctc", reduction="none", zero_infinity=zi),
            _run(x, tg, il, tl, "numba_ctc", reduction="none", zero_infinity=zi),
        )
        assert bool(torch.isinf(got[0][[0, 1, 3]]).all()) != zi and got[0][2] > 0, got[0]
        assert torch.equal(got[0].isinf(), want[0].isinf())
        _close(got[0], want[0], ("infeasible", zi), 1e-10)
        assert not got[1][[0, 1, 3]].any(), "infeasible rows have zero gradients"
        _close(got[1], want[1], ("infeasible grad", zi), 1e-10)
        n += 1
    # concatenated 1-D targets and a list of sequences give the padded targets' result
    x, tg, il, tl = _batch(1, 3, 6, 5, 3)
    flat = torch.cat([tg[b, : tl[b]] for b in range(3)])
    seqs = [tg[b, : tl[b]].tolist() for b in range(3)]
    ref = _run(x, tg, il, tl, "triton_ctc", reduction="none")
    for t in (flat, seqs):
        got = _run(x, t, il, tl, "triton_ctc", reduction="none")
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
        n += 1
    # states in several blocks: the kernel called directly with small blocks, against numba's
    x, tg, il, tl = _batch(2, 3, 8, 7, 6)
    E = x.log_softmax(-1)
    coef = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    off = torch.arange(3) * 6
    arrays = (tg.reshape(-1).numpy(), off.numpy(), tl.numpy(), il.numpy())
    want = ctc_numba.ctc_cost_grad(E, *arrays, 0, coef.numpy(), True, 6)
    for bs in (2, 8):
        got = ctc_triton.ctc_triton(E, tg.reshape(-1), off, tl, il, 0, coef, True, block_s=bs)
        _close(got[0], want[0], ("blocks value", bs), 1e-10)
        _close(got[1], want[1], ("blocks grad", bs), 1e-10)
        n += 1
    # another blank than 0, no gradient requested
    x, tg, il, tl = _batch(3, 3, 6, 5, 3)
    tg = tg - 1  # labels in [0, 4): blank 4
    with torch.no_grad():
        got = ctc_loss(x.log_softmax(-1), tg, il, tl, blank=4, reduction="none", impl="triton_ctc")
    want = ctc_loss(x.log_softmax(-1), tg, il, tl, blank=4, reduction="none", impl="numba_ctc")
    _close(got, want.detach(), "blank 4", 1e-10)
    n += 1
    # NaN in, NaN out: the row with a NaN emission within its frames, whichever class it is in
    x, tg, il, tl = _batch(4, 3, 6, 5, 3)
    il[1] = 4
    x[0, 3, 4] = float("nan")
    x[1, 5, 2] = float("nan")  # past row 1's frames: not read
    got = _run(x, tg, il, tl, "triton_ctc", reduction="none")
    want = _run(x, tg, il, tl, "numba_ctc", reduction="none")
    assert got[0][0].isnan() and not got[0][1:].isnan().any(), got[0]
    _close(got[0], want[0], "nan value", 1e-10)
    lp = x.detach().clone().requires_grad_(True)
    ctc_loss(lp, tg, il, tl, reduction="none", impl="triton_ctc").sum().backward()
    assert lp.grad[0].isnan().all() and not lp.grad[1:].isnan().any()
    n += 1
    assert ctc_triton.self_check(torch.device("cpu")) is None
    with torch.inference_mode():  # the first call of a process may come in any grad mode
        assert ctc_triton.self_check(torch.device("cpu")) is None
    return n + 2


def _long_checks() -> int:
    """T = 2000 frames, C = 5, a target of 200 labels (401 states), float32 (where the rows'
    scales matter) against numba's float64 arithmetic."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 2000, 5, generator=g)
    tg = torch.randint(1, 5, (1, 200), generator=g)
    il, tl = torch.tensor([2000]), torch.tensor([200])
    got = _run(x, tg, il, tl, "triton_ctc", reduction="none")
    want = _run(x, tg, il, tl, "numba_ctc", reduction="none")
    assert torch.isfinite(got[0]).all() and float(want[0][0]) > 1000
    _close(got[0], want[0], "long value", 1e-6 * float(want[0][0]))
    _close(got[1], want[1], "long grad", 1e-3)
    return 1


def _child(*args: str) -> str:
    """This file run as a script under Triton's interpreter with ``args``; its output."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, os.path.abspath(__file__), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


@pytest.mark.slow
def test_equals_numba_and_torch_under_the_interpreter():
    assert "ctc triton: " in _child()


@pytest.mark.slow
def test_long_input_under_the_interpreter():
    assert "ctc triton long: 1" in _child("long")


@pytest.mark.skipif(not ctc_triton.available() or INTERPRETED, reason="needs triton's compiler")
@pytest.mark.parametrize(
    "name, one_block", [("_lattice_kernel", True), ("_lattice_kernel", False), ("_grad_kernel", None)]
)
@pytest.mark.parametrize("dtype, capability", [("fp32", 90), ("fp64", 90), ("fp32", 80)])
def test_kernels_compile_for_the_gpu(name, one_block, dtype, capability):
    """Triton IR -> PTX -> cubin (ptxas) for Hopper and Ampere; no GPU needed."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(ctc_triton, name)
    if name == "_lattice_kernel":  # states in one block of 1024, or several of 256
        consts = dict(NEED_E=True, BLOCK_S=1024 if one_block else 256, ONE_BLOCK=one_block)
    else:
        consts = dict(BLOCK_T=4, BLOCK_C=32, BLOCK_L=32)
    ints = {"T", "C", "SP", "blank"}
    int_ptrs = {"lab", "off", "tlen", "ilen"}

    def kind(a):
        if a in consts:
            return "constexpr"
        if a in ints:
            return "i32"
        if a == "nan_row":
            return "*i32"
        return "*i64" if a in int_ptrs else f"*{dtype}"

    sig = {a: kind(a) for a in fn.arg_names}
    cx = {(fn.arg_names.index(k),): v for k, v in consts.items()}
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cx), target=GPUTarget("cuda", capability, 32))
    assert len(kernel.asm["cubin"]) > 0
    if name == "_lattice_kernel":  # frames are separated by block barriers
        assert "bar.sync" in kernel.asm["ptx"] or "barrier.sync" in kernel.asm["ptx"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_default_is_triton_ctc(recwarn):
    from lightning_gtn.losses import ctc as ctc_mod

    x, tg, il, tl = _batch(6, 8, 60, 9, 12)
    for dtype, tol in ((torch.float32, 1e-4), (torch.float64, 1e-9)):
        for reduction in ("none", "mean"):
            got = _run(x.to(dtype), tg, il, tl, None, device="cuda", reduction=reduction, zero_infinity=True)
            want = _run(x.to(dtype), tg, il, tl, "numba_ctc", reduction=reduction, zero_infinity=True)
            _close(got[0], want[0], ("cuda value", dtype, reduction), tol)
            _close(got[1], want[1], ("cuda grad", dtype, reduction), tol)
    assert ctc_mod.criterion.CRITERIA["ctc"].own_kernel(torch.device("cuda"), None) == "triton_ctc"
    assert not [w for w in recwarn if "self-check" in str(w.message)]


if __name__ == "__main__":  # the child of test_equals_numba_and_torch_under_the_interpreter
    assert INTERPRETED, "run with TRITON_INTERPRET=1"
    if sys.argv[1:] == ["long"]:
        print(f"ctc triton long: {_long_checks()}")
    else:
        print(f"ctc triton: {_interpreted_checks()} cases equal to numba")


@pytest.mark.parametrize("wrong", [None, "loss", "gradient"])
def test_the_self_check_refuses_a_kernel_that_disagrees_with_the_numba_kernel(monkeypatch, wrong):
    import numpy as np

    def fake(E, lab, off, tl, il, blank, coef, need_e, block_s=None):  # the numba kernel, one value off
        host = [np.asarray(a.cpu(), dtype=np.int64) for a in (lab, off, tl, il)]
        losses, grad = ctc_numba.ctc_cost_grad(E.double().contiguous(), *host, blank, None, need_e)
        if wrong is None:
            return losses, grad
        if wrong == "loss":
            losses = losses.clone()
            losses[0] += 0.01
        else:
            grad = grad.clone()
            grad[1, 2, 3] += 0.01
        return losses, grad

    monkeypatch.setattr(ctc_triton, "ctc_triton", fake)
    assert (ctc_triton.self_check(torch.device("cpu")) is None) == (wrong is None)
