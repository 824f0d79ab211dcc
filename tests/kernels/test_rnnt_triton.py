"""The Triton RNN-T kernels against published values and a plain PyTorch dynamic programme.

They run on a CUDA device when there is one. Without one they run on the CPU under Triton's
interpreter (``TRITON_INTERPRET=1``, which must be set before triton is imported):
:func:`test_kernels_under_the_interpreter` re-runs this file that way in a subprocess, so CI (no
GPU) checks the kernels' logic. Each kernel is also compiled for sm_90 by Triton's real compiler,
which needs no GPU. Skipped where triton is not installed.
"""

import math
import os
import re
import subprocess
import sys

import pytest
import torch

from lightning_gtn.kernels import rnnt_triton as rt
from lightning_gtn.kernels.rnnt_triton import (
    multiblank_triton,
    mutual_information_triton,
    rnnt_triton,
    tdt_triton,
)
from tests.kernels._compiled import compile_for_gpu
from tests.losses._rnnt_cases import (
    B1_COST_BLANK0,
    B1_COST_BLANK_LAST,
    B1_GRADS_BLANK0,
    B1_GRADS_BLANK0_CLAMP,
    B1_GRADS_BLANK_LAST,
    B1_LOGITS,
    B2_COSTS,
    B2_GRADS,
    B2_LOGITS,
    TDT_COST,
    TDT_GRADS,
)

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else ("cpu" if INTERPRETED else None)
needs_kernels = pytest.mark.skipif(
    not rt.available() or DEVICE is None, reason="needs triton and a CUDA device (or TRITON_INTERPRET=1)"
)


# ---------------------------------------------------------------- the reference


def _alpha_loglik(lpb, lpe):
    """log P(y | x) of one example from its ``(T, U + 1)`` blank and ``(T, U)`` emit log-probs."""
    T, U1 = lpb.shape
    ninf = lpb.new_tensor(-math.inf)
    alpha = [[None] * U1 for _ in range(T)]
    for t in range(T):
        for u in range(U1):
            if t == 0 and u == 0:
                alpha[t][u] = lpb.new_tensor(0.0)
                continue
            a = alpha[t - 1][u] + lpb[t - 1, u] if t > 0 else ninf
            e = alpha[t][u - 1] + lpe[t, u - 1] if u > 0 else ninf
            alpha[t][u] = torch.logaddexp(a, e)
    return alpha[T - 1][U1 - 1] + lpb[T - 1, U1 - 1]


def reference(logits, targets, xl, yl, blank, fused=True, clamp=-1.0, lam=0.0):
    """Costs and per-example gradients by autograd through log_softmax and the alpha recursion
    (in float64). FastEmit (NeMo's definition): the arcs' posteriors are taken from the plain
    lattice, then each emitting arc's log-prob gradient is scaled by ``1 + lam``."""
    x = logits.detach().double().cpu().requires_grad_(True)
    lp = x.log_softmax(-1) if fused else x
    costs, grads = [], torch.zeros_like(x)
    for b in range(x.shape[0]):
        Tb, Ub = int(xl[b]), int(yl[b])
        if Tb == 0:
            costs.append(math.inf)
            continue
        y = targets[b, :Ub].long().cpu()
        blank_lp = lp[b, :Tb, : Ub + 1, blank]
        emit_lp = lp[b, :Tb, torch.arange(Ub), y] if Ub else lp.new_zeros(Tb, 0)
        bl, el = blank_lp.detach().requires_grad_(True), emit_lp.detach().requires_grad_(True)
        ll = _alpha_loglik(bl, el)
        pb, pe = torch.autograd.grad(ll, (bl, el), allow_unused=True)
        pe = torch.zeros_like(el) if pe is None else pe
        surrogate = -(pb * blank_lp).sum() - (1 + lam) * (pe * emit_lp).sum()
        (g,) = torch.autograd.grad(surrogate, x, retain_graph=True)
        grads += g
        costs.append(-(1 + lam) * float(ll))
    if clamp > 0:
        grads = grads.clamp(-clamp, clamp)
    return torch.tensor(costs, dtype=torch.float64), grads


def _run(logits, targets, xl, yl, blank, **kw):
    dev = DEVICE
    costs, grads = rnnt_triton(logits.to(dev), targets.to(dev), xl.to(dev), yl.to(dev), blank, **kw)
    return costs.cpu(), (grads.cpu() if grads is not None else None)


def _close(got, want, dtype):
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol)


# ---------------------------------------------------------------- published values

# (the published cases are written in tests/losses/_rnnt_cases.py)


def _b1(dtype):
    x = torch.tensor([B1_LOGITS], dtype=dtype)
    return x, torch.tensor([[1, 2]]), torch.tensor([2]), torch.tensor([2])


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torchaudio_b1_t2_u3_d5_blank_last(dtype):
    x, tg, xl, yl = _b1(dtype)
    costs, grads = _run(x, tg, xl, yl, blank=4)
    assert costs.dtype == grads.dtype == dtype
    torch.testing.assert_close(costs.double(), torch.tensor([B1_COST_BLANK_LAST], dtype=torch.float64))
    torch.testing.assert_close(
        grads.double(), torch.tensor([B1_GRADS_BLANK_LAST], dtype=torch.float64), atol=1e-6, rtol=0
    )


@needs_kernels
def test_self_check_passes_and_catches_a_wrong_kernel(monkeypatch):
    assert rt.self_check(DEVICE) is None
    real = rt.rnnt_triton

    def off(*args, **kwargs):
        costs, grads = real(*args, **kwargs)
        return costs, grads * 1.01

    monkeypatch.setattr(rt, "rnnt_triton", off)
    assert "gradient" in rt.self_check(DEVICE)


@needs_kernels
def test_nemo_small_blank0_clamp_and_fastemit():
    x, tg, xl, yl = _b1(torch.float32)
    costs, grads = _run(x, tg, xl, yl, blank=0)
    torch.testing.assert_close(costs, torch.tensor([B1_COST_BLANK0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(grads, torch.tensor([B1_GRADS_BLANK0]), atol=1e-6, rtol=0)
    costs, grads = _run(x, tg, xl, yl, blank=0, clamp=0.1)
    torch.testing.assert_close(costs, torch.tensor([B1_COST_BLANK0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(grads, torch.tensor([B1_GRADS_BLANK0_CLAMP]), atol=1e-6, rtol=0)
    for lam in (1.0, 0.01):
        costs, grads = _run(x, tg, xl, yl, blank=0, clamp=0.1, fastemit_lambda=lam)
        torch.testing.assert_close(costs, torch.tensor([B1_COST_BLANK0 * (1 + lam)]), atol=1e-5, rtol=0)
        _close(grads, reference(x, tg, xl, yl, 0, clamp=0.1, lam=lam)[1], torch.float32)


@needs_kernels
def test_torchaudio_b2_t4_u3_d3():
    x = torch.tensor(B2_LOGITS, dtype=torch.float32).reshape(2, 4, 3, 3)
    costs, grads = _run(x, torch.tensor([[1, 2], [1, 1]]), torch.tensor([4, 4]), torch.tensor([2, 2]), blank=0)
    torch.testing.assert_close(costs, torch.tensor(B2_COSTS, dtype=torch.float32))
    torch.testing.assert_close(grads, torch.tensor(B2_GRADS).reshape(2, 4, 3, 3), atol=1e-6, rtol=0)


# ---------------------------------------------------------------- against the reference


def _ragged(dtype, V=7, seed=0):
    """Four examples on a (T=4, U=5) grid: a full one, U > T, a target of length 0, and logit and
    target lengths below the padded sizes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 4, 6, V, generator=g, dtype=dtype)
    tg = torch.randint(0, V, (4, 5), generator=g)
    return x, tg, torch.tensor([4, 3, 2, 3]), torch.tensor([3, 5, 0, 2])


@needs_kernels
@pytest.mark.parametrize(
    "dtype, fused, blank, extra",
    [
        (torch.float64, True, 0, {}),
        # chunked vocabulary and diagonals, FastEmit and clamp
        (torch.float64, True, 6, {"block_v": 4, "block_u": 4, "fastemit_lambda": 0.3, "clamp": 0.15}),
        (torch.float64, False, 3, {"fastemit_lambda": 0.3, "clamp": 0.15}),
        (torch.float32, False, 0, {"block_v": 2, "block_u": 2}),
    ],
)
def test_ragged_batch_equals_reference(dtype, fused, blank, extra):
    x, tg, xl, yl = _ragged(dtype)
    if not fused:
        x = x.log_softmax(-1)
    costs, grads = _run(x, tg, xl, yl, blank, fused_log_softmax=fused, **extra)
    lam, clamp = extra.get("fastemit_lambda", 0.0), extra.get("clamp", -1.0)
    want_c, want_g = reference(x, tg, xl, yl, blank, fused=fused, clamp=clamp, lam=lam)
    assert torch.isfinite(costs).all()
    _close(costs, want_c, dtype)
    _close(grads, want_g, dtype)
    pad = torch.ones_like(grads, dtype=torch.bool)
    for b in range(4):
        pad[b, : int(xl[b]), : int(yl[b]) + 1] = False
    assert (grads[pad] == 0).all()  # nothing outside the lengths
    if clamp > 0:
        assert grads.abs().max() <= clamp and (grads.abs() == clamp).any()
    elif fused:  # the gradient of a normalised row sums to 0 over V
        torch.testing.assert_close(grads.sum(-1), torch.zeros_like(grads.sum(-1)), atol=1e-5, rtol=0)


@needs_kernels
def test_no_grad_inplace_and_empty_paths():
    x, tg, xl, yl = _ragged(torch.float64, seed=2)
    xl = torch.tensor([4, 0, 1, 3])  # example 1 has no frame: no path
    full_c, full_g = _run(x, tg, xl, yl, 0)
    assert math.isinf(full_c[1]) and full_c[1] > 0 and (full_g[1] == 0).all()
    costs, none = _run(x, tg, xl, yl, 0, need_grad=False)
    assert none is None
    torch.testing.assert_close(costs, full_c)
    xi = x.clone().to(DEVICE)
    costs, grads = rnnt_triton(xi, tg.to(DEVICE), xl.to(DEVICE), yl.to(DEVICE), 0, inplace=True)
    assert grads.data_ptr() == xi.data_ptr()
    torch.testing.assert_close(grads.cpu(), full_g, rtol=0, atol=0)
    torch.testing.assert_close(costs.cpu(), full_c, rtol=0, atol=0)
    want_c, want_g = reference(x, tg, xl, yl, 0)
    _close(full_c[[0, 2, 3]], want_c[[0, 2, 3]], torch.float64)
    _close(full_g, want_g, torch.float64)


@needs_kernels
def test_bad_inputs_raise_before_any_kernel():
    x, tg, xl, yl = _ragged(torch.float32)
    x, tg, xl, yl = x.to(DEVICE), tg.to(DEVICE), xl.to(DEVICE), yl.to(DEVICE)
    bad = [
        dict(logits=x[0]),
        dict(logits=x.half()),
        dict(targets=tg[:, :3]),
        dict(targets=tg.float()),
        dict(logit_lengths=xl[:3]),
        dict(logit_lengths=torch.tensor([4, 5, 2, 3], device=DEVICE)),
        dict(logit_lengths=torch.tensor([4, -1, 2, 3], device=DEVICE)),
        dict(target_lengths=torch.tensor([3, 6, 0, 2], device=DEVICE)),
        dict(target_lengths=torch.tensor([3, 5, -1, 2], device=DEVICE)),
        dict(targets=torch.where(tg == tg, 7, tg)),  # id == V
        dict(targets=torch.where(tg == tg, -1, tg)),
        dict(blank=7),
        dict(blank=-1),
        dict(clamp=float("nan")),
        dict(fastemit_lambda=float("inf")),
    ]
    for over in bad:
        args = dict(logits=x, targets=tg, logit_lengths=xl, target_lengths=yl, blank=0)
        args.update(over)
        with pytest.raises(ValueError):
            rnnt_triton(**args)
    # padding past target_lengths is never read, so it may hold anything
    tg2 = tg.clone()
    tg2[2, :] = -5
    costs, _ = rnnt_triton(x, tg2, xl, yl, 0)
    assert torch.isfinite(costs).all()


@pytest.mark.skipif(not rt.available() or torch.cuda.is_available() or INTERPRETED, reason="checks the CPU refusal")
def test_cpu_tensors_without_the_interpreter_are_refused():
    x, tg, xl, yl = _ragged(torch.float32)
    with pytest.raises(ValueError, match="CUDA"):
        rnnt_triton(x, tg, xl, yl, 0)


# ---------------------------------------------------------------- the interpreter and the compiler


@pytest.mark.skipif(not rt.available(), reason="needs triton")
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
    assert passed and int(passed.group(1)) >= 18 and "failed" not in last, proc.stdout[-2000:]


_INTS = {"R", "T", "U1", "V", "blank", "S", "T1", "C", "D"}
_LONG_PTRS = {"tgt", "xlen", "ylen", "bnd"}
_INT_PTRS = {"BCOL", "BDUR", "BDI", "EDUR", "EDI"}
VARIANTS = [  # each kernel once, with every optional branch compiled in
    ("_rows_kernel", torch.float32, dict(FUSED=True, ONE_PASS=False, BLOCK_R=4, BLOCK_V=1024)),
    ("_lattice_kernel", torch.float64, dict(BLOCK_U=64)),
    ("_grad_kernel", torch.float32, dict(FUSED=True, CLAMP=True, EMIT_SCALE=True, BLOCK_R=8, BLOCK_V=512)),
    ("_mi_kernel", torch.float32, dict(MODIFIED=True, BLOCK=64)),
    ("_drows_kernel", torch.float32, dict(KB=2, KE=3, HAS_D=True, ONE_PASS=False, BLOCK_R=4, BLOCK_V=1024, BLOCK_D=4)),
    ("_dlattice_kernel", torch.float32, dict(KB=3, KE=1, BLOCK_U=64)),
    (
        "_dgrad_kernel",
        torch.float32,
        dict(KB=2, KE=3, HAS_D=True, CLAMP=True, EMIT_SCALE=True, EMIT_DUR=True, BLOCK_R=8, BLOCK_V=512, BLOCK_D=4),
    ),
]


@pytest.mark.skipif(not rt.available() or INTERPRETED, reason="needs triton's compiler")
@pytest.mark.parametrize("name, dtype, consts", VARIANTS, ids=[f"{v[0]}-{i}" for i, v in enumerate(VARIANTS)])
def test_kernel_compiles_for_the_gpu(name, dtype, consts):
    """The real compiler path (Triton IR -> PTX -> cubin) for sm_90; it needs no GPU."""
    kernel = compile_for_gpu(getattr(rt, name), dtype, consts, 90, _INTS, _LONG_PTRS, _INT_PTRS)
    assert len(kernel.asm["cubin"]) > 0
    if "lattice" in name or name == "_mi_kernel":  # diagonals are separated by block barriers
        ptx = kernel.asm["ptx"]
        assert "bar.sync" in ptx or "barrier.sync" in ptx


# ---------------------------------------------------------------- k2's mutual-information recursion


def mi_reference(px, py, boundary):
    """Scores and gradients of k2's recursion by autograd over Python loops (float64)."""
    px = px.detach().double().requires_grad_(True)
    py = py.detach().double().requires_grad_(True)
    modified = px.shape[2] == py.shape[2]
    scores = []
    for b, (sb, tb, se, te) in enumerate(boundary.tolist()):
        p = {(sb, tb): px.new_tensor(0.0)}
        for s in range(sb, se + 1):
            for t in range(tb, te + 1):
                if (s, t) == (sb, tb):
                    continue
                terms = []  # unreachable nodes are None: no -inf enters autograd
                tx = t - 1 if modified else t
                if s > sb and tx >= tb and p[(s - 1, tx)] is not None:
                    terms.append(p[(s - 1, tx)] + px[b, s - 1, tx])
                if t > tb and p[(s, t - 1)] is not None:
                    terms.append(p[(s, t - 1)] + py[b, s, t - 1])
                p[(s, t)] = torch.logsumexp(torch.stack(terms), 0) if terms else None
        scores.append(px.new_tensor(-math.inf) if p[(se, te)] is None else p[(se, te)])
    scores = torch.stack(scores)
    gx, gy = torch.autograd.grad(scores.sum(), (px, py), allow_unused=True)
    gx = torch.zeros_like(px) if gx is None else gx
    gy = torch.zeros_like(py) if gy is None else gy
    return scores.detach(), gx, gy


@needs_kernels
@pytest.mark.parametrize("modified, block", [(False, None), (True, 2)])
def test_mutual_information_equals_reference(modified, block):
    g = torch.Generator().manual_seed(3)
    B, S, T = 4, 3, 4
    px = torch.randn(B, S, T if modified else T + 1, generator=g, dtype=torch.float64)
    py = torch.randn(B, S + 1, T, generator=g, dtype=torch.float64)
    bnd = torch.tensor([[0, 0, S, T], [1, 0, 3, 3], [0, 2, 2, 4], [2, 3, 2, 3]])  # the last box is one node
    scores, (gx, gy) = mutual_information_triton(px.to(DEVICE), py.to(DEVICE), bnd.to(DEVICE), block=block)
    want, wx, wy = mi_reference(px, py, bnd)
    assert scores[3] == 0 and torch.isfinite(scores).all()
    _close(scores.cpu(), want, torch.float64)
    _close(gx.cpu(), wx, torch.float64)
    _close(gy.cpu(), wy, torch.float64)
    # no boundary: the whole grid; float32; no gradient requested
    s32, none = mutual_information_triton(px.float().to(DEVICE), py.float().to(DEVICE), need_grad=False)
    assert none is None
    full = torch.tensor([[0, 0, S, T]] * B)
    _close(s32.cpu(), mi_reference(px, py, full)[0], torch.float32)


@needs_kernels
def test_mutual_information_bad_inputs():
    px, py = torch.zeros(2, 3, 5, device=DEVICE), torch.zeros(2, 4, 4, device=DEVICE)
    ok = torch.tensor([[0, 0, 3, 4], [0, 0, 2, 2]], device=DEVICE)
    for args in (
        (px[0], py, ok),
        (px, py[:, :3], ok),
        (px.double(), py, ok),
        (px, py, ok[:1]),
        (px, py, torch.tensor([[0, 0, 4, 4], [0, 0, 2, 2]], device=DEVICE)),  # s_end > S
        (px, py, torch.tensor([[0, 0, 3, 5], [0, 0, 2, 2]], device=DEVICE)),  # t_end > T
        (px, py, torch.tensor([[2, 0, 1, 4], [0, 0, 2, 2]], device=DEVICE)),  # s_begin > s_end
        (px, py, torch.tensor([[0, -1, 3, 4], [0, 0, 2, 2]], device=DEVICE)),
    ):
        with pytest.raises(ValueError):
            mutual_information_triton(*args)
    assert torch.isfinite(mutual_information_triton(px, py, ok)[0]).all()


# ---------------------------------------------------------------- TDT and multi-blank

# (NeMo's fixed TDT case, TDT_COST / TDT_GRADS, is written in tests/losses/_rnnt_cases.py)


def duration_reference(x, tg, xl, yl, blanks, emits, D, sigma=0.0, lam=0.0, clamp=-1.0):
    """A transducer with frame-skipping arcs, by autograd: ``blanks`` are ``(token, frames, duration
    column or None)``, ``emits`` ``(frames, duration column or None)``; the token log-probs (first
    ``V`` columns) and the duration log-probs (last ``D``) are log-softmaxed separately."""
    x = x.detach().double().requires_grad_(True)
    V = x.shape[-1] - D
    tok = x[..., :V].log_softmax(-1) - sigma
    dur = x[..., V:].log_softmax(-1) if D else None
    costs, surrogate = [], x.new_zeros(())
    for b in range(x.shape[0]):
        Tb, Ub = int(xl[b]), int(yl[b])
        arcs = []  # (src, dst or None for the end, token part, duration part, is_emit)
        for t in range(Tb):
            for u in range(Ub + 1):
                for col, frames, di in blanks:
                    if t + frames < Tb or (t + frames == Tb and u == Ub):
                        dst = (t + frames, u) if t + frames < Tb else None
                        arcs.append(((t, u), dst, tok[b, t, u, col], dur[b, t, u, di] if di is not None else 0, False))
                if u < Ub:
                    for frames, di in emits:
                        if t + frames < Tb:
                            w_dur = dur[b, t, u, di] if di is not None else 0
                            arcs.append(((t, u), (t + frames, u + 1), tok[b, t, u, int(tg[b, u])], w_dur, True))
        leaves = [(a[2] + a[3]).detach().requires_grad_(True) for a in arcs]
        alpha = {(0, 0): x.new_zeros(())}
        final = []
        # arcs from lower to higher t + u (a blank advances t, an emission u): a topological order
        order = sorted(range(len(arcs)), key=lambda i: (arcs[i][0][0] + arcs[i][0][1], arcs[i][0]))
        incoming = {}
        for i in order:
            src, dst = arcs[i][0], arcs[i][1]
            if src not in alpha:
                if src not in incoming:  # unreachable
                    continue
                alpha[src] = torch.logsumexp(torch.stack(incoming[src]), 0)
            val = alpha[src] + leaves[i]
            (final if dst is None else incoming.setdefault(dst, [])).append(val)
        if not final:  # no path: an infinite cost and no gradient
            costs.append(math.inf)
            continue
        ll = torch.logsumexp(torch.stack(final), 0)
        post = torch.autograd.grad(ll, leaves, allow_unused=True)
        for a, p in zip(arcs, post):
            if p is None:  # an arc of an unreachable node
                continue
            scale = 1 + lam if a[4] else 1.0
            surrogate = surrogate - p * (scale * a[2] + a[3])
        costs.append(-(1 + lam) * float(ll))
    (g,) = torch.autograd.grad(surrogate, x)
    if clamp > 0:
        g[..., :V] = g[..., :V].clamp(-clamp, clamp)
    return torch.tensor(costs, dtype=torch.float64), g


@needs_kernels
def test_tdt_nemo_fixed_case():
    x = torch.zeros(1, 3, 2, 7)
    costs, grads = tdt_triton(
        x.to(DEVICE), torch.tensor([[0]], device=DEVICE), torch.tensor([3], device=DEVICE),
        torch.tensor([1], device=DEVICE), blank=3, durations=[0, 1, 2], sigma=0.05,
    )  # fmt: skip
    torch.testing.assert_close(costs.cpu(), torch.tensor([TDT_COST]), atol=1e-5, rtol=0)
    torch.testing.assert_close(grads.cpu(), torch.tensor([TDT_GRADS]), atol=1e-6, rtol=0)


@needs_kernels
@pytest.mark.parametrize("durations, lam, clamp", [([0, 1, 2], 0.0, -1.0), ([1, 3], 0.2, 0.1)])
def test_tdt_equals_reference(durations, lam, clamp):
    D = len(durations)
    x, tg, xl, yl = _ragged(torch.float64, V=5 + D, seed=4)
    tg = tg % 5
    costs, grads = tdt_triton(
        x.to(DEVICE), tg.to(DEVICE), xl.to(DEVICE), yl.to(DEVICE), 4, durations, sigma=0.05,
        fastemit_lambda=lam, clamp=clamp, block_u=4,
    )  # fmt: skip
    blanks = [(4, d, i) for i, d in enumerate(durations) if d > 0]
    emits = [(d, i) for i, d in enumerate(durations)]
    want_c, want_g = duration_reference(x, tg, xl, yl, blanks, emits, D, sigma=0.05, lam=lam, clamp=clamp)
    # durations [1, 3]: every emission takes a frame, so 5 targets in 3 frames have no path
    assert math.isinf(want_c[1]) == (0 not in durations)
    _close(costs.cpu(), want_c, torch.float64)
    _close(grads.cpu(), want_g, torch.float64)


@needs_kernels
def test_multiblank_equals_reference():
    x, tg, xl, yl = _ragged(torch.float64, V=6, seed=5)
    tg = tg % 3  # tokens 0..2; the big blanks are 3 (4 frames) and 4 (2 frames), the blank is 5
    costs, grads = multiblank_triton(
        x.to(DEVICE), tg.to(DEVICE), xl.to(DEVICE), yl.to(DEVICE), 5, [2, 4], sigma=0.1, block_v=4
    )
    want_c, want_g = duration_reference(x, tg, xl, yl, [(5, 1, None), (4, 2, None), (3, 4, None)], [(0, None)], 0, 0.1)
    _close(costs.cpu(), want_c, torch.float64)
    _close(grads.cpu(), want_g, torch.float64)
    # with no big blank reachable it is the plain RNN-T loss shifted by sigma per arc
    with pytest.raises(ValueError):
        multiblank_triton(x.to(DEVICE), tg.to(DEVICE), xl.to(DEVICE), yl.to(DEVICE), 1, [2, 4])
    with pytest.raises(ValueError):
        tdt_triton(x.to(DEVICE), tg.to(DEVICE), xl.to(DEVICE), yl.to(DEVICE), 0, [0])
