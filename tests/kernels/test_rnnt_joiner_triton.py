"""``rnnt_joiner_loss(..., impl="triton")`` (and ``tdt_joiner_loss``, ``multiblank_rnnt_joiner_loss``):
the Triton joiner kernels against the chunked torch joiner and the materialised definitions
``rnnt_loss(tanh(enc[:, :, None] + pred[:, None]) @ W.T + b, ...)`` (``tdt_loss``, ``multiblank_rnnt_loss``).

Without a GPU the kernels run on CPU tensors under Triton's interpreter, which must be switched on
before triton is imported: :func:`test_joiner_under_the_interpreter` runs this file as a script in
ONE subprocess with ``TRITON_INTERPRET=1`` (tiny ragged cases: blank first and last, every
reduction, FastEmit, clamp, an infeasible example, several tiles of ``V`` and ``J`` and several
splits of the weight gradient's node blocks, float32 and float64, bfloat16 inputs, partial
gradients; TDT and multi-blank, their lattices' Triton kernels too). The kernels also go through
Triton's real compiler for sm_90 and sm_80 (no GPU needed), and
:func:`test_cuda_default_is_triton_and_equals_the_cpu` runs ``impl=None`` on a CUDA device where
there is one (``make gpu-check``).
"""

import os

import pytest
import torch

from lightning_gtn.functional import (
    multiblank_rnnt_joiner_loss,
    multiblank_rnnt_loss,
    rnnt_joiner_loss,
    rnnt_loss,
    tdt_joiner_loss,
    tdt_loss,
)
from lightning_gtn.kernels import rnnt_joiner_triton as jt
from lightning_gtn.losses.rnnt_joiner import JOINER_BACKENDS
from tests.kernels._compiled import compile_for_gpu
from tests.kernels._interpreted import run_interpreted

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = torch.cuda.is_available()
NAMES = ("loss", "encoder", "predictor", "weight", "bias")


def joiner_logits(enc, pred, w, b):
    return torch.tanh(enc[:, :, None] + pred[:, None]) @ w.T + b


def case(B=3, T=5, U=3, V=7, J=5, dtype=torch.float32, blank=0, seed=0):
    """Ragged inputs: example 0 at full length, the others random (a target length 0 among them)."""
    g = torch.Generator().manual_seed(seed)
    enc = torch.randn(B, T, J, generator=g, dtype=dtype)
    pred = torch.randn(B, U + 1, J, generator=g, dtype=dtype)
    w = torch.randn(V, J, generator=g, dtype=dtype) / J**0.5
    b = torch.randn(V, generator=g, dtype=dtype)
    bl = blank % V
    tg = torch.randint(0, V - 1, (B, U), generator=g)
    tg = tg + (tg >= bl).long()  # never the blank
    il = torch.randint(1, T + 1, (B,), generator=g)
    tl = torch.randint(0, U + 1, (B,), generator=g)
    il[0], tl[0] = T, U
    if B > 2:
        tl[2] = 0
    return (enc, pred, w, b), tg, il, tl


#: per loss: the joiner loss, its materialised definition, the impl of the torch joiner
LOSSES = {
    "rnnt": (rnnt_joiner_loss, rnnt_loss, "torch"),
    "tdt": (tdt_joiner_loss, tdt_loss, "numba"),
    "multiblank": (multiblank_rnnt_joiner_loss, multiblank_rnnt_loss, "numba"),
}


def run(path, tensors, tg, il, tl, upstream=None, need=(True, True, True, True), loss="rnnt", **kw):
    """``(loss, grads...)`` of ``path`` (``"triton"``, ``"torch"`` or ``"materialised"``) for
    ``loss`` (a key of :data:`LOSSES`); the gradients of the tensors not in ``need`` are None."""
    joiner, materialised, torch_impl = LOSSES[loss]
    x = tuple(t.detach().clone().requires_grad_(n) for t, n in zip(tensors, need))
    if path == "materialised":
        loss = materialised(joiner_logits(*x), tg, il, tl, **kw)
    else:
        loss = joiner(*x, tg, il, tl, impl=torch_impl if path == "torch" else path, **kw)
    s = loss.sum() if upstream is None else (loss * upstream).sum()
    wrt = [t for t in x if t.requires_grad]
    g = iter(torch.autograd.grad(s, wrt))
    return (loss.detach(),) + tuple(next(g) if n else None for n in need)


def close(got, want, what, rtol, atol):
    for name, a, c in zip(NAMES, got, want):
        if c is None:
            assert a is None, (what, name)
            continue
        assert a.dtype == c.dtype and a.shape == c.shape, (what, name, a.dtype, c.dtype, a.shape, c.shape)
        a, c = a.double(), c.double()
        fin = c.isfinite()
        assert torch.equal(a.isfinite(), fin), (what, name)
        tol = rtol if name == "loss" else rtol * 10
        err = ((a - c).abs()[fin] / (atol + tol * c.abs()[fin])).max().item() if fin.any() else 0.0
        assert err <= 1.0, (what, name, (a - c).abs().max().item())


# (keyword arguments of the case, of the loss, the upstream gradient for reduction "none")
CASES = [
    (dict(), dict(blank=0, reduction="mean"), None),
    (dict(blank=-1, seed=1), dict(blank=-1, reduction="sum"), None),
    (dict(seed=2), dict(blank=0, reduction="none", fastemit_lambda=0.5), torch.tensor([0.5, -2.0, 3.0])),
    (dict(seed=3), dict(blank=0, reduction="mean", clamp=0.05), None),
    (dict(blank=-1, seed=4), dict(blank=-1, reduction="none", clamp=0.03, fastemit_lambda=0.2), None),
    (dict(V=40, J=36, seed=5), dict(blank=0, reduction="mean", fastemit_lambda=0.1), None),  # tiles of V, J
]


# the duration lattices: (keyword arguments of the case, the loss, its keyword arguments); V = K + D
DURATION_CASES = [
    (dict(V=9, seed=20), "tdt", dict(durations=(0, 1, 2, 4), sigma=0.05, reduction="mean")),
    (dict(V=40, J=20, seed=21), "tdt", dict(blank=0, durations=(1, 2), omega=0.3, reduction="none")),
    (dict(V=9, seed=22), "multiblank", dict(big_blank_durations=(2, 3), sigma=0.05, reduction="mean_volume")),
    (
        dict(V=40, J=20, seed=23),
        "multiblank",
        dict(blank=0, big_blank_durations=(2,), big_blank_ids=(39,), reduction="sum"),
    ),
]


def _interpreted_checks() -> int:
    """Every check, the Triton joiner on CPU tensors (under the interpreter); the count run."""
    n = 0
    assert jt.self_check("cpu") is None
    small = jt.Blocks(n=16, v=16, j=16, jo=16, splits=3)  # several tiles and splits everywhere
    for blocks, cases in ((jt.DEFAULT_BLOCKS, CASES), (small, CASES[-2:])):
        jt.DEFAULT_BLOCKS = blocks
        for shape, kw, upstream in cases:
            tensors, tg, il, tl = case(**shape)
            got = run("triton", tensors, tg, il, tl, upstream, **kw)
            close(got, run("torch", tensors, tg, il, tl, upstream, **kw), f"torch {kw}", 1e-4, 1e-6)
            close(got, run("materialised", tensors, tg, il, tl, upstream, **kw), f"materialised {kw}", 1e-4, 1e-6)
            n += 1
    # an infeasible example (no frame), with and without zero_infinity
    tensors, tg, il, tl = case(seed=6)
    il[1] = 0
    for zi in (False, True):
        kw = dict(blank=0, reduction="none", zero_infinity=zi)
        got = run("triton", tensors, tg, il, tl, **kw)
        assert got[0][1].item() == (0.0 if zi else float("inf"))
        close(got, run("materialised", tensors, tg, il, tl, **kw), f"infeasible {kw}", 1e-4, 1e-6)
        n += 1
    # float64: the products in float64
    tensors, tg, il, tl = case(V=20, J=18, dtype=torch.float64, seed=7)
    kw = dict(blank=0, reduction="mean", clamp=0.1, fastemit_lambda=0.3)
    close(run("triton", tensors, tg, il, tl, **kw), run("materialised", tensors, tg, il, tl, **kw), "f64", 1e-9, 1e-12)
    n += 1
    # bfloat16 inputs, computed in float32: the torch joiner on the same inputs
    tensors, tg, il, tl = case(seed=8)
    half = tuple(t.to(torch.bfloat16) for t in tensors)
    got, want = run("triton", half, tg, il, tl, blank=0), run("torch", half, tg, il, tl, blank=0)
    assert got[0].dtype == torch.bfloat16
    close(got, want, "bfloat16", 1e-2, 1e-2)
    n += 1
    # partial gradients: the encoder and the bias only, then the weight only
    tensors, tg, il, tl = case(seed=9)
    for need in ((True, False, False, True), (False, False, True, False)):
        kw = dict(blank=0, clamp=0.05)
        got = run("triton", tensors, tg, il, tl, need=need, **kw)
        close(got, run("materialised", tensors, tg, il, tl, need=need, **kw), f"need {need}", 1e-4, 1e-6)
        n += 1
    # without gradients: the forward alone (no normalisers kept)
    tensors, tg, il, tl = case(seed=10)
    with torch.no_grad():
        got = rnnt_joiner_loss(*tensors, tg, il, tl, blank=0, impl="triton", reduction="none")
        want = rnnt_joiner_loss(*tensors, tg, il, tl, blank=0, impl="torch", reduction="none")
        close((got,), (want,), "no grad", 1e-4, 1e-6)
        kw = dict(durations=(1, 2), reduction="none")
        got = tdt_joiner_loss(*tensors, tg % 3 + 1, il, tl, impl="triton", **kw)
        want = tdt_joiner_loss(*tensors, tg % 3 + 1, il, tl, impl="numba", **kw)
        close((got,), (want,), "no grad, tdt", 1e-4, 1e-6)
    n += 1
    # the kernels' own checks: a direct call of the backward op with lengths or labels out of range
    x = tuple(t.detach() for t in tensors)
    lse, arcs = torch.zeros(3, 5, 4), torch.zeros(3, 5, 4, 2)
    back = torch.ops.lightning_gtn.rnnt_joiner_loss_backward.default
    for bad, msg in (
        ((tg, il, tl + 5), "target_lengths in \\[0, U=3\\]"),
        ((tg, il + 9, tl), "logit_lengths must lie in \\[0, T=5\\]"),
        ((tg + 7, il, tl.clamp_min(1)), "targets \\(within target_lengths\\) must lie in \\[0, 7\\)"),
    ):
        with pytest.raises(ValueError, match=msg):
            back(*x, *bad, lse, arcs, torch.ones(3), 0, -1.0, "triton", True, True, True, True)
    with pytest.raises(ValueError, match="the classes read \\[9, -1\\]"):
        jt.joiner_rows(*x, tg, il, tl, 9, torch.zeros(3, 5, 4, 2))
    n += 1
    # TDT and multi-blank: the Triton joiner and the Triton duration lattice (impl="triton")
    for blocks, cases in ((jt.Blocks(), DURATION_CASES), (small, DURATION_CASES[1::2])):
        jt.DEFAULT_BLOCKS = blocks
        for shape, loss, kw in cases:
            tensors, tg, il, tl = case(**shape)
            tg = tg % 3 + 1  # labels 1..3: never a blank, a big blank or a duration of any case
            got = run("triton", tensors, tg, il, tl, loss=loss, **kw)
            close(got, run("torch", tensors, tg, il, tl, loss=loss, **kw), f"torch {loss} {kw}", 1e-4, 1e-6)
            want = run("materialised", tensors, tg, il, tl, loss=loss, **kw)
            close(got, want, f"materialised {loss} {kw}", 1e-4, 1e-6)
            n += 1
    return n


@pytest.mark.skipif(not jt.available(), reason="needs triton")
@pytest.mark.skipif(INTERPRETED or CUDA, reason="runs the kernels directly here (CUDA test below)")
def test_joiner_under_the_interpreter():
    run_interpreted(__file__, f"joiner triton: {len(CASES) + 10 + len(DURATION_CASES) + 2} checks equal")


@pytest.mark.skipif(not jt.available() or INTERPRETED, reason="needs triton's compiler")
@pytest.mark.parametrize(
    "name, arch", [("_rows_kernel", 90), ("_dhidden_kernel", 90), ("_dweight_kernel", 90), ("_dweight_kernel", 80)]
)
def test_kernels_compile_for_the_gpu(name, arch):
    """Each kernel through Triton's real compiler for sm_90 (one for sm_80 too) in float32 (no GPU
    needed): what the interpreter does not check (``tl.dot``'s shapes and precisions, the loops'
    types)."""
    consts = dict(TF32=False, BLOCK_N=32, BLOCK_V=64, BLOCK_J=64, BLOCK_C=4)
    consts.update(
        {  # the duration groups' branch (HAS_D) in two of the three, RNN-T's in the other
            "_rows_kernel": dict(STORE_LSE=True, HAS_D=True),
            "_dhidden_kernel": dict(NEED_ENC=True, NEED_PRED=True, CLAMP=True, HAS_D=False, BLOCK_JO=128),
            "_dweight_kernel": dict(NEED_W=True, NEED_B=True, CLAMP=False, HAS_D=True, BLOCK_JO=128),
        }[name]
    )
    ints = {"R", "T", "U1", "V", "J", "S", "K", "NC", "NL", "Y_COL", "pad", "SPLITS"}
    fn = getattr(jt, name)
    kernel = compile_for_gpu(fn, torch.float32, consts, arch, ints, {"TGT", "XLEN", "YLEN"}, {"COLS"})
    assert len(kernel.asm["cubin"]) > 0


@pytest.mark.skipif(CUDA or INTERPRETED, reason="checks the refusal on a CPU without the interpreter")
def test_triton_on_cpu_without_the_interpreter_is_refused():
    tensors, tg, il, tl = case()
    with pytest.raises(ValueError, match=r"rnnt_joiner_loss: impl='triton'.*(cpu|triton package)"):
        rnnt_joiner_loss(*tensors, tg, il, tl, blank=0, impl="triton")


def test_default_implementation_per_device():
    assert JOINER_BACKENDS.offered == ("torch", "triton")
    assert JOINER_BACKENDS.default(torch.device("cpu")) == "torch"
    assert JOINER_BACKENDS.default(torch.device("meta")) == "torch"
    with pytest.raises(ValueError, match=r"Blocks: v must be a power of two >= 16"):
        jt.Blocks(v=24)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (make gpu-check runs it on a GPU machine)")
def test_cuda_default_is_triton_and_equals_the_cpu():
    if jt.available():
        assert JOINER_BACKENDS.default(torch.device("cuda")) == "triton"  # the self-check passed
    big = (dict(B=4, T=40, U=12, V=300, J=200, seed=11), dict(blank=0), None)
    # a few shapes (each tile layout and option set compiles the kernels once more on the GPU)
    runs = [(shape, "rnnt", kw, up) for shape, kw, up in [CASES[0], CASES[2], CASES[4], CASES[5], big]]
    runs += [(shape, loss, kw, None) for shape, loss, kw in DURATION_CASES[1:]]
    for shape, loss, kw, upstream in runs:
        tensors, tg, il, tl = case(**shape)
        if loss != "rnnt":
            tg = tg % 3 + 1
        want = run("torch", tensors, tg, il, tl, upstream, loss=loss, **kw)
        dev = [t.cuda() for t in (*tensors, tg, il, tl)]
        got = run(None, tuple(dev[:4]), *dev[4:], None if upstream is None else upstream.cuda(), loss=loss, **kw)
        close(tuple(None if g is None else g.cpu() for g in got), want, f"cuda {loss} {shape} {kw}", 1e-4, 1e-6)


if __name__ == "__main__":  # the child of test_joiner_under_the_interpreter
    assert INTERPRETED, "run with TRITON_INTERPRET=1"
    print(f"joiner triton: {_interpreted_checks()} checks equal")
