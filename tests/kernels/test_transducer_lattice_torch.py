"""The torch transducer lattice: brute-force path enumeration (both semirings, boundaries),
float64 gradcheck, and the torch losses built on it against the numba kernels (float64, values
and gradients, fuzzed shapes and ragged lengths, FastEmit, clamp)."""

import math

import numpy as np
import pytest
import torch

import lightning_gtn.functional as lgf
import lightning_gtn.k2 as k2
from lightning_gtn.kernels.mutual_information import mi_numba, mi_torch
from lightning_gtn.kernels.transducer_lattice_torch import lattice_logz, lattice_posteriors

# (dt, du) of the arc kinds of each variant
KINDS = {
    "regular": ((1, 0), (0, 1)),
    "k2_modified": ((1, 1), (0, 1)),
    "multiblank": ((1, 3, 2, 0), (0, 0, 0, 1)),
    "tdt": ((0, 1, 2, 1, 2), (1, 1, 1, 0, 0)),
}


def _paths(NT, NU, dt, du, begin, end):
    """Every path from ``begin`` to ``end`` inside the rectangle, as lists of ``(t, u, k)``."""
    out = []

    def walk(t, u, arcs):
        if (t, u) == end:
            out.append(list(arcs))
        for k, (a, b) in enumerate(zip(dt, du)):
            t2, u2 = t + a, u + b
            if t2 <= end[0] and u2 <= end[1]:
                walk(t2, u2, arcs + [(t, u, k)])

    walk(begin[0], begin[1], [])
    return out


def _brute(scores, dt, du, begin, end, semiring):
    """``(logZ, posteriors)`` of one example by enumeration (scores ``(NT, NU, A)`` float64)."""
    NT, NU, A = scores.shape
    paths = _paths(NT, NU, dt, du, begin, end)
    post = np.zeros((NT, NU, A))
    if not paths:
        return -math.inf, post
    vals = np.array([sum(scores[t, u, k] for t, u, k in p) for p in paths])
    if semiring == "max":
        best = int(np.argmax(vals))
        for t, u, k in paths[best]:
            post[t, u, k] = 1.0
        return float(vals[best]), post
    m = vals.max()
    logz = m + math.log(np.exp(vals - m).sum())
    for p, v in zip(paths, vals):
        for t, u, k in p:
            post[t, u, k] += math.exp(v - logz)
    return logz, post


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("semiring", ["log", "max"])
def test_brute_force_with_boundaries(kind, semiring):
    dt, du = KINDS[kind]
    g = torch.Generator().manual_seed(len(kind) + len(semiring))
    B, NT, NU = 5, 5, 4
    scores = torch.randn(B, NT, NU, len(dt), generator=g, dtype=torch.float64)
    scores[1, 2, 1, 0] = -math.inf  # a missing arc
    begin = torch.tensor([[0, 0], [0, 0], [1, 1], [2, 0], [3, 2]])
    end = torch.tensor([[4, 3], [3, 2], [4, 3], [4, 2], [3, 2]])  # the last: begin == end
    logz, post = lattice_posteriors(scores, dt, du, begin, end, semiring=semiring)
    assert post is not None
    for b in range(B):
        want, want_post = _brute(scores[b].numpy(), dt, du, tuple(begin[b].tolist()), tuple(end[b].tolist()), semiring)
        assert logz[b].item() == pytest.approx(want, rel=1e-12, abs=1e-12)
        np.testing.assert_allclose(post[b].numpy(), want_post, rtol=1e-10, atol=1e-12)


def test_no_path_is_minus_inf_with_zero_posteriors():
    # only arcs of (1, 1): the corner (3, 1) cannot be reached from (0, 0)
    scores = torch.randn(1, 4, 3, 1, dtype=torch.float64, requires_grad=True)
    logz = lattice_logz(scores, (1,), (1,), torch.tensor([[0, 0]]), torch.tensor([[3, 1]]))
    assert logz.item() == -math.inf
    torch.where(torch.isfinite(logz), logz, torch.zeros_like(logz)).sum().backward()
    assert scores.grad is not None and bool((scores.grad == 0).all())


def test_nan_inside_the_rectangle_only():
    scores = torch.randn(2, 4, 3, 2, dtype=torch.float64)
    scores[0, 1, 1, 0] = math.nan  # inside example 0's rectangle
    scores[1, 3, 2, 1] = math.nan  # outside example 1's rectangle (it ends at (2, 1))
    begin, end = torch.zeros(2, 2, dtype=torch.long), torch.tensor([[3, 2], [2, 1]])
    logz, post = lattice_posteriors(scores, (1, 0), (0, 1), begin, end)
    assert post is not None
    assert math.isnan(logz[0].item()) and bool(torch.isnan(post[0]).all())
    assert math.isfinite(logz[1].item()) and bool(torch.isfinite(post[1]).all())


@pytest.mark.parametrize("kind", ["regular", "tdt"])
def test_gradcheck_float64(kind):
    dt, du = KINDS[kind]
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 4, 3, len(dt), generator=g, dtype=torch.float64, requires_grad=True)
    begin = torch.tensor([[0, 0], [1, 0]])
    end = torch.tensor([[3, 2], [3, 1]])
    assert torch.autograd.gradcheck(lambda s: lattice_logz(s, dt, du, begin, end), (scores,))


def test_bad_arguments_name_themselves():
    s = torch.zeros(1, 3, 2, 2)
    z = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="dt and du"):
        lattice_posteriors(s, (1,), (0,), z, z)
    with pytest.raises(ValueError, match="dt \\+ du >= 1"):
        lattice_posteriors(s, (1, 0), (0, 0), z, z)
    with pytest.raises(ValueError, match="begin and end"):
        lattice_posteriors(s, (1, 0), (0, 1), z, torch.tensor([[3, 1]]))
    with pytest.raises(ValueError, match="semiring"):
        lattice_posteriors(s, (1, 0), (0, 1), z, z, semiring="tropical")


# -- the torch losses against the numba kernels (float64) ----------------------------------------


def _fuzz(seed, V):
    rng = np.random.default_rng(seed)
    B, T, U = int(rng.integers(1, 4)), int(rng.integers(1, 8)), int(rng.integers(0, 5))
    x = torch.tensor(rng.standard_normal((B, T, U + 1, V)) * 2, dtype=torch.float64)
    tl = torch.tensor(rng.integers(1, T + 1, B))
    tl[0] = T
    ul = torch.tensor(rng.integers(0, U + 1, B))
    ul[-1] = U
    return rng, x, tl, ul, U


def _loss_and_grad(fn, x, impl):
    xr = x.clone().requires_grad_()
    loss = fn(xr, impl)
    w = torch.linspace(0.5, 1.5, loss.numel(), dtype=loss.dtype).reshape(loss.shape)
    fin = torch.isfinite(loss)
    (torch.where(fin, loss, torch.zeros_like(loss)) * w).sum().backward()
    assert xr.grad is not None
    return loss.detach(), xr.grad


def _same(fn, x):
    ln, gn = _loss_and_grad(fn, x, "numba")
    lt, gt = _loss_and_grad(fn, x, "torch")
    torch.testing.assert_close(lt, ln, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(gt, gn, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_rnnt_torch_equals_numba(seed):
    rng, x, tl, ul, U = _fuzz(seed, 5)
    y = torch.tensor(rng.integers(1, 5, (x.shape[0], max(U, 1))))
    blank = 0
    lam, clamp = [(0.0, -1.0), (0.3, -1.0), (0.0, 0.05), (0.2, 0.1)][seed % 4]
    fused = seed != 5

    def fn(xr, impl):
        return lgf.rnnt_loss(xr, y, tl, ul, blank=blank, clamp=clamp, reduction="none", fused_log_softmax=fused,
                             fastemit_lambda=lam, impl=impl)  # fmt: skip

    _same(fn, x if fused else x.log_softmax(-1))


@pytest.mark.parametrize("seed", range(5))
def test_multiblank_torch_equals_numba(seed):
    rng, x, tl, ul, U = _fuzz(10 + seed, 7)
    y = torch.tensor(rng.integers(0, 3, (x.shape[0], max(U, 1))))
    lam, clamp = [(0.0, -1.0), (0.25, -1.0), (0.0, 0.02), (0.1, 0.05), (0.0, -1.0)][seed]

    def fn(xr, impl):
        return lgf.multiblank_rnnt_loss(xr, y, tl, ul, blank=6, big_blank_durations=[2, 3, 4], sigma=0.05,
                                        reduction="none", fastemit_lambda=lam, clamp=clamp, impl=impl)  # fmt: skip

    _same(fn, x)


@pytest.mark.parametrize("seed", range(5))
def test_tdt_torch_equals_numba(seed):
    rng, x, tl, ul, U = _fuzz(20 + seed, 9)  # 4 labels (blank 3), 5 durations
    y = torch.tensor(rng.integers(0, 3, (x.shape[0], max(U, 1))))
    lam, clamp = [(0.0, -1.0), (0.3, -1.0), (0.0, 0.02), (0.1, 0.05), (0.0, -1.0)][seed]
    omega = 0.25 if seed == 4 else 0.0

    def fn(xr, impl):
        return lgf.tdt_loss(xr, y, tl, ul, blank=3, durations=[0, 1, 2, 3, 4], sigma=0.02, omega=omega,
                            reduction="none", fastemit_lambda=lam, clamp=clamp, impl=impl)  # fmt: skip

    _same(fn, x)


@pytest.mark.parametrize("modified", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_mi_torch_equals_numba_with_boundaries(modified, seed):
    rng = np.random.default_rng(30 + seed)
    B, S, T = 4, int(rng.integers(0, 5)), int(rng.integers(1, 7))
    px = torch.tensor(rng.standard_normal((B, S, T if modified else T + 1)))
    py = torch.tensor(rng.standard_normal((B, S + 1, T)))
    if not modified:
        px[:, :, T] = -math.inf  # k2's convention for the regular recursion
    s0 = rng.integers(0, S + 1, B)
    t0 = rng.integers(0, T + 1, B)
    s1 = np.array([rng.integers(a, S + 1) for a in s0])
    t1 = np.array([rng.integers(a, T + 1) for a in t0])
    s0[0], t0[0], s1[0], t1[0] = 0, 0, S, T
    bnd = torch.tensor(np.stack([s0, t0, s1, t1], 1))
    sn, gxn, gyn = mi_numba(px, py, bnd, True)
    st, gxt, gyt = mi_torch(px, py, bnd, True)
    torch.testing.assert_close(st, sn, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(gxt, gxn, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(gyt, gyn, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("rnnt_type", ["regular", "modified", "constrained"])
def test_k2_simple_loss_torch_equals_numba(rnnt_type):
    rng = np.random.default_rng(40)
    B, S, T, C = 3, 3, 6, 5
    lm = torch.tensor(rng.standard_normal((B, S + 1, C)))
    am = torch.tensor(rng.standard_normal((B, T, C)))
    symbols = torch.tensor(rng.integers(1, C, (B, S)))
    bnd = torch.tensor([[0, 0, 3, 6], [0, 0, 2, 5], [0, 0, 1, 4]])
    out = {}
    for impl in ("numba", "torch"):
        lmr, amr = lm.clone().requires_grad_(), am.clone().requires_grad_()
        loss = k2.rnnt_loss_simple(lmr, amr, symbols, 0, bnd, rnnt_type=rnnt_type, reduction="sum", impl=impl)
        loss.backward()
        out[impl] = (loss.detach(), lmr.grad, amr.grad)
    for a, b in zip(out["torch"], out["numba"]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_half_scores_run_in_float32():
    g = torch.Generator().manual_seed(4)
    scores = torch.randn(2, 5, 3, 2, generator=g)
    begin, end = torch.zeros(2, 2, dtype=torch.long), torch.tensor([[4, 2], [3, 1]])
    want, want_post = lattice_posteriors(scores.half().float(), (1, 0), (0, 1), begin, end)
    got, post = lattice_posteriors(scores.half(), (1, 0), (0, 1), begin, end)
    assert got.dtype == torch.float16 and post is not None and want_post is not None
    torch.testing.assert_close(got.float(), want, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(post.float(), want_post, rtol=1e-3, atol=1e-3)
