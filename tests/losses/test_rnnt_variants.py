"""Multi-blank RNN-T and TDT: published values (NeMo, warp-transducer), brute-force path
enumeration, numba against the torch reference, gradcheck, reductions, bad inputs, compile."""

import math

import numpy as np
import pytest
import torch

import lightning_gtn.functional as lgf
import lightning_gtn.nn as lgn
from lightning_gtn import trust
from tests.losses._rnnt_cases import B1_COST_BLANK0, B1_GRADS_BLANK0, B1_LOGITS, TDT_COST, TDT_GRADS

# -- independent references ----------------------------------------------------------------------


def brute_multiblank(lp, y, T, blank, bigs):
    """-log of the summed scores of every multi-blank path, enumerated one by one.

    ``lp`` are ``(T, U + 1, V)`` log-probabilities; ``bigs`` are ``(class, duration)`` pairs."""
    U = len(y)
    total = []

    def walk(t, u, s):
        if u < U:
            walk_to(t, u + 1, s + lp[t, u, y[u]])
        for c, d in [(blank, 1)] + list(bigs):
            if t + d == T and u == U:
                total.append(s + lp[t, u, c])
            elif t + d < T:
                walk_to(t + d, u, s + lp[t, u, c])

    def walk_to(t, u, s):
        walk(t, u, s)

    walk(0, 0, 0.0)
    return -math.log(sum(math.exp(v) for v in total)) if total else math.inf


def brute_tdt(lab, dur, y, T, blank, durations):
    """-log of the summed scores of every TDT path: a token of duration d from ``(t, u)`` goes to
    ``(t + d, u + 1)`` (only onto a frame < T), a blank of duration d >= 1 to ``(t + d, u)``; the
    path ends with a blank landing exactly on T at u = U."""
    U = len(y)
    total = []

    def walk(t, u, s):
        for i, d in enumerate(durations):
            if u < U and t + d < T:
                walk(t + d, u + 1, s + lab[t, u, y[u]] + dur[t, u, i])
            if d >= 1:
                sc = s + lab[t, u, blank] + dur[t, u, i]
                if u == U and t + d == T:
                    total.append(sc)
                elif t + d < T:
                    walk(t + d, u, sc)

    walk(0, 0, 0.0)
    return -math.log(sum(math.exp(v) for v in total)) if total else math.inf


def rnnt_dp(lp, y, T, blank):
    """The regular RNN-T loss by its textbook recursion (tokens keep the frame, blank advances)."""
    U = len(y)
    a = np.full((T, U + 1), -np.inf)
    a[0, 0] = 0.0
    for t in range(T):
        for u in range(U + 1):
            c = [a[t, u]] if (t, u) == (0, 0) else []
            if t > 0:
                c.append(a[t - 1, u] + lp[t - 1, u, blank])
            if u > 0:
                c.append(a[t, u - 1] + lp[t, u - 1, y[u - 1]])
            if c:
                a[t, u] = np.logaddexp.reduce(c)
    return -(a[T - 1, U] + lp[T - 1, U, blank])


def _batch(rng, B, T, U, V, K=None, dtype=torch.float64):
    x = torch.tensor(rng.standard_normal((B, T, U + 1, V)), dtype=dtype)
    tl = torch.tensor(rng.integers(1, T + 1, B))
    tl[0] = T
    ul = torch.tensor(rng.integers(0, U + 1, B))
    ul[0] = U
    return x, tl, ul


# -- published values ----------------------------------------------------------------------------

# NeMo's fixed TDT case (TDT_*) and the small RNN-T case with blank 0 (B1_*, no big blanks) are written,
# with their sources, in tests/losses/_rnnt_cases.py


IMPLS = ["numba", "torch"]


@pytest.mark.parametrize("impl", IMPLS)
def test_nemo_tdt_fixed_case(impl):
    x = torch.zeros(1, 3, 2, 7, requires_grad=True)
    loss = lgf.tdt_loss(x, torch.tensor([[0]]), torch.tensor([3]), torch.tensor([1]), blank=3,
                        durations=[0, 1, 2], sigma=0.05, reduction="sum", impl=impl)  # fmt: skip
    loss.backward()
    assert loss.item() == pytest.approx(TDT_COST, rel=1e-6)
    torch.testing.assert_close(x.grad[0], torch.tensor(TDT_GRADS), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_multiblank_without_big_blanks_is_rnnt_published_case(impl):
    x = torch.tensor([B1_LOGITS], requires_grad=True)
    loss = lgf.multiblank_rnnt_loss(x, torch.tensor([[1, 2]]), torch.tensor([2]), torch.tensor([2]), blank=0,
                                    big_blank_durations=[], reduction="sum", impl=impl)  # fmt: skip
    loss.backward()
    assert loss.item() == pytest.approx(B1_COST_BLANK0, rel=1e-6)
    torch.testing.assert_close(x.grad[0], torch.tensor(B1_GRADS_BLANK0), rtol=1e-4, atol=1e-6)


# -- brute force ---------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_multiblank_brute_force(impl, rng):
    B, T, U, V = 3, 5, 2, 7  # tokens 0..2, big blanks 3 (d=4), 4 (d=3), 5 (d=2), blank 6
    durs = [2, 3, 4]
    x, tl, ul = _batch(rng, B, T, U, V)
    y = torch.tensor(rng.integers(0, 3, (B, U)))
    got = lgf.multiblank_rnnt_loss(x, y, tl, ul, blank=6, big_blank_durations=durs, sigma=0.05, reduction="none",
                                   impl=impl)  # fmt: skip
    lp = (x.log_softmax(-1) - 0.05).numpy()
    for b in range(B):
        want = brute_multiblank(lp[b], y[b, : ul[b]].tolist(), int(tl[b]), 6, [(5 - i, d) for i, d in enumerate(durs)])
        assert got[b].item() == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("durations", [[0, 1, 2, 3], [1, 2], [0, 2]])
def test_tdt_brute_force(impl, durations, rng):
    B, T, U, K = 3, 5, 2, 4  # blank 1 (not last: any id works)
    D = len(durations)
    x, tl, ul = _batch(rng, B, T, U, K + D)
    y = torch.tensor(rng.choice([0, 2, 3], (B, U)))
    got = lgf.tdt_loss(x, y, tl, ul, blank=1, durations=durations, sigma=0.1, reduction="none", impl=impl)
    lab = (x[..., :K].log_softmax(-1) - 0.1).numpy()
    dur = x[..., K:].log_softmax(-1).numpy()
    for b in range(B):
        want = brute_tdt(lab[b], dur[b], y[b, : ul[b]].tolist(), int(tl[b]), 1, durations)
        if math.isinf(want):
            assert math.isinf(got[b].item())
        else:
            assert got[b].item() == pytest.approx(want, rel=1e-9)


def test_multiblank_no_big_blanks_equals_rnnt_recursion(rng):
    B, T, U, V = 3, 4, 3, 5
    x, tl, ul = _batch(rng, B, T, U, V)
    y = torch.tensor(rng.integers(1, V, (B, U)))
    got = lgf.multiblank_rnnt_loss(x, y, tl, ul, blank=0, reduction="none")
    lp = x.log_softmax(-1).numpy()
    for b in range(B):
        assert got[b].item() == pytest.approx(rnnt_dp(lp[b], y[b, : ul[b]].tolist(), int(tl[b]), 0), rel=1e-9)


def test_tdt_omega_mixes_the_regular_rnnt_loss(rng):
    B, T, U, K, durs = 2, 4, 2, 4, [0, 1, 2]
    x, tl, ul = _batch(rng, B, T, U, K + len(durs))
    y = torch.tensor(rng.integers(1, K, (B, U)))
    # omega = 1: the regular RNN-T loss of the label logits alone (no sigma, durations ignored)
    one = lgf.tdt_loss(x, y, tl, ul, blank=0, durations=durs, sigma=0.3, omega=1.0, reduction="none")
    rnnt = lgf.multiblank_rnnt_loss(x[..., :K], y, tl, ul, blank=0, reduction="none")
    torch.testing.assert_close(one, rnnt)
    zero = lgf.tdt_loss(x, y, tl, ul, blank=0, durations=durs, sigma=0.3, omega=0.0, reduction="none")
    mixed = lgf.tdt_loss(x, y, tl, ul, blank=0, durations=durs, sigma=0.3, omega=0.25, reduction="none")
    torch.testing.assert_close(mixed, 0.75 * zero + 0.25 * rnnt)


# -- FastEmit and clamp ---------------------------------------------------------------------------


def tdt_paths(T, U, blank, durations):
    """Every complete TDT path as its arcs ``(t, u, label or None for the target, duration index,
    is a token)``, enumerated one by one."""
    out = []

    def walk(t, u, arcs):
        for i, d in enumerate(durations):
            if u < U and t + d < T:
                walk(t + d, u + 1, arcs + [(t, u, None, i, True)])
            if d >= 1:
                a = arcs + [(t, u, blank, i, False)]
                if u == U and t + d == T:
                    out.append(a)
                elif t + d < T:
                    walk(t + d, u, a)

    walk(0, 0, [])
    return out


def fastemit_reference(x, y, blank, durations, lam):
    """``(cost, gradient)`` of one example by FastEmit's definition on enumerated paths: each arc's
    posterior (from the paths' scores) times ``1 + lam`` for a token arc, 1 for a blank, times the
    gradient of that arc's score (autograd through both log-softmaxes); the cost ``-(1 + lam) log Z``."""
    K = x.shape[-1] - len(durations)
    x = x.detach().clone().requires_grad_(True)
    lab, dur = x[..., :K].log_softmax(-1), x[..., K:].log_softmax(-1)
    paths = tdt_paths(x.shape[0], len(y), blank, durations)
    arc_scores = [[lab[t, u, y[u] if c is None else c] + dur[t, u, i] for t, u, c, i, _ in p] for p in paths]
    scores = torch.stack([torch.stack(a).sum() for a in arc_scores])
    post = scores.softmax(0).detach()  # each path's posterior
    weighted = [sum((1.0 + lam if arc[4] else 1.0) * s for arc, s in zip(p, a)) for p, a in zip(paths, arc_scores)]
    surrogate = -(post * torch.stack(weighted)).sum()
    (g,) = torch.autograd.grad(surrogate, x)
    return -(1.0 + lam) * torch.logsumexp(scores, 0).item(), g


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("lam", [0.0, 0.7])
def test_tdt_fastemit_scales_the_token_arcs_gradient(impl, lam, rng):
    T, U, K, durs, blank = 4, 2, 4, [0, 1, 2], 1
    x = torch.tensor(rng.standard_normal((1, T, U + 1, K + len(durs))))
    y = [0, 3]
    xi = x.clone().requires_grad_(True)
    loss = lgf.tdt_loss(xi, torch.tensor([y]), [T], [U], blank=blank, durations=durs, reduction="sum",
                        fastemit_lambda=lam, impl=impl)  # fmt: skip
    loss.backward()
    cost, g = fastemit_reference(x[0], y, blank, durs, lam)
    assert loss.item() == pytest.approx(cost, rel=1e-9)
    torch.testing.assert_close(xi.grad[0], g, rtol=1e-7, atol=1e-10)
    if lam:  # the blank-only gradient differs from the plain loss's: the option bites
        plain = x.clone().requires_grad_(True)
        lgf.tdt_loss(plain, torch.tensor([y]), [T], [U], blank=blank, durations=durs, reduction="sum").backward()
        assert not torch.allclose(plain.grad, xi.grad)


def _grads(fn, x, *args, **kw):
    xi = x.clone().requires_grad_(True)
    loss = fn(xi, *args, **kw)
    loss.sum().backward()
    return loss.detach(), xi.grad


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("lam, clamp", [(0.0, -1.0), (0.6, -1.0), (0.0, 0.04), (0.4, 0.06)])
def test_no_big_blanks_and_omega_one_equal_rnnt_with_the_options(impl, reduction, lam, clamp, rng):
    B, T, U, K, durs = 3, 5, 3, 5, [0, 1]
    x, tl, ul = _batch(rng, B, T, U, K + len(durs))
    y = torch.tensor(rng.integers(1, K, (B, U)))
    kw = dict(reduction=reduction, fastemit_lambda=lam, clamp=clamp)
    want = _grads(lgf.rnnt_loss, x[..., :K], y, tl, ul, blank=0, impl="numba", **kw)
    # multi-blank RNN-T without big blanks is the regular RNN-T lattice
    mb = _grads(lgf.multiblank_rnnt_loss, x[..., :K], y, tl, ul, blank=0, impl=impl, **kw)
    torch.testing.assert_close(mb[0], want[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mb[1], want[1], rtol=1e-12, atol=1e-12)
    # TDT has no duration set giving that lattice (a blank and a token share the duration
    # softmax); with omega=1 it is the regular RNN-T loss of its label logits
    tdt = _grads(lgf.tdt_loss, x, y, tl, ul, blank=0, durations=durs, omega=1.0, impl=impl, **kw)
    torch.testing.assert_close(tdt[0], want[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tdt[1][..., :K], want[1], rtol=1e-12, atol=1e-12)
    assert not tdt[1][..., K:].any()
    if clamp > 0:  # clamp bites: an entry sits on the bound, none past it (before the 1 / B scaling)
        top = mb[1].abs().max().item() * (B if reduction == "mean" else 1)
        assert top == pytest.approx(clamp, rel=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_tdt_clamp_clips_each_examples_gradient(impl, rng):
    B, T, U, K, durs = 2, 5, 2, 4, [0, 1, 2]
    x, tl, ul = _batch(rng, B, T, U, K + len(durs))
    y = torch.tensor(rng.integers(1, K, (B, U)))
    kw = dict(blank=0, durations=durs, sigma=0.05, omega=0.3, impl=impl)
    free = _grads(lgf.tdt_loss, x, y, tl, ul, reduction="none", **kw)
    clipped = _grads(lgf.tdt_loss, x, y, tl, ul, reduction="sum", clamp=0.05, **kw)
    torch.testing.assert_close(clipped[0], free[0].sum())
    torch.testing.assert_close(clipped[1], free[1].clamp(-0.05, 0.05))
    assert clipped[1].abs().max().item() == 0.05
    mean = _grads(lgf.tdt_loss, x, y, tl, ul, reduction="mean", clamp=0.05, **kw)
    torch.testing.assert_close(mean[1], clipped[1] / B)


def test_fastemit_numba_equals_torch_with_big_blanks_and_omega(rng):
    B, T, U, K, durs = 3, 6, 3, 5, [0, 1, 3]
    x, tl, ul = _batch(rng, B, T, U, K + len(durs))
    y = torch.tensor(rng.integers(0, K - 1, (B, U)))
    for fn, kw in [
        (lgf.tdt_loss, dict(blank=K - 1, durations=durs, sigma=0.05, omega=0.2)),
        (lgf.multiblank_rnnt_loss, dict(blank=-1, big_blank_durations=[2, 3], sigma=0.05)),
    ]:
        a = _grads(fn, x, y, tl, ul, reduction="mean_volume", fastemit_lambda=0.3, clamp=0.1, impl="numba", **kw)
        b = _grads(fn, x, y, tl, ul, reduction="mean_volume", fastemit_lambda=0.3, clamp=0.1, impl="torch", **kw)
        torch.testing.assert_close(a[0], b[0])
        torch.testing.assert_close(a[1], b[1])
        plain = fn(x, y, tl, ul, reduction="mean_volume", impl="numba", **kw)
        torch.testing.assert_close(a[0], 1.3 * plain)


@pytest.mark.parametrize(
    "fn, kw", [(lgf.tdt_loss, dict(blank=3, durations=[0, 1, 2])), (lgf.multiblank_rnnt_loss, dict(blank=3))]
)
@pytest.mark.parametrize(
    "change, match",
    [
        (dict(fastemit_lambda=-0.1), "fastemit_lambda"),
        (dict(fastemit_lambda=float("inf")), "fastemit_lambda"),
        (dict(fastemit_lambda="0.1"), "fastemit_lambda"),
        (dict(clamp=float("nan")), "clamp"),
        (dict(clamp=None), "clamp"),
    ],
)
def test_fastemit_and_clamp_bad_values(fn, kw, change, match):
    x, y, tl, ul = _ok()
    fn(x, y, tl, ul, fastemit_lambda=0.5, clamp=1.0, **kw)  # the good values pass
    with pytest.raises(ValueError, match=match):
        fn(x, y, tl, ul, **kw, **change)


# -- numba against torch, gradients --------------------------------------------------------------


@pytest.mark.parametrize("fused", [True, False])
def test_numba_equals_torch(fused, rng):
    B, T, U, K, durs = 3, 6, 4, 5, [0, 1, 3]
    x, tl, ul = _batch(rng, B, T, U, K + len(durs))
    if not fused:
        x = torch.cat([x[..., :K].log_softmax(-1), x[..., K:].log_softmax(-1)], -1)
    y = torch.tensor(rng.integers(0, K - 1, (B, U)))
    for fn, kw in [
        (lgf.tdt_loss, dict(blank=K - 1, durations=durs, sigma=0.05, omega=0.2)),
        (lgf.multiblank_rnnt_loss, dict(blank=-1, big_blank_durations=[2, 3], sigma=0.05)),
    ]:
        out = {}
        for impl in IMPLS:
            xi = x.clone().requires_grad_(True)
            loss = fn(xi, y, tl, ul, reduction="sum", fused_log_softmax=fused, impl=impl, **kw)
            loss.backward()
            out[impl] = (loss.detach(), xi.grad)
        torch.testing.assert_close(out["numba"][0], out["torch"][0])
        torch.testing.assert_close(out["numba"][1], out["torch"][1])


def test_gradcheck_float64(rng):
    x, tl, ul = _batch(rng, 2, 3, 2, 7)
    y = torch.tensor([[0, 1], [2, 0]])
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda z: lgf.tdt_loss(z, y, tl, ul, blank=3, durations=[0, 1, 2], sigma=0.05, omega=0.3, reduction="none"),
        (x,),
    )
    assert torch.autograd.gradcheck(
        lambda z: lgf.multiblank_rnnt_loss(z, y, tl, ul, blank=6, big_blank_durations=[2, 3], reduction="mean"),
        (x,),
    )


def test_float32_matches_float64(rng):
    x, tl, ul = _batch(rng, 2, 5, 3, 6)
    y = torch.tensor(rng.integers(0, 2, (2, 3)))
    kw = dict(blank=2, durations=[0, 1, 2], reduction="none")
    a = lgf.tdt_loss(x, y, tl, ul, **kw)
    b = lgf.tdt_loss(x.float(), y, tl, ul, **kw)
    assert b.dtype == torch.float32
    torch.testing.assert_close(a, b.double(), rtol=1e-5, atol=1e-5)


# -- reductions, infinities, U > T, NaN ----------------------------------------------------------


def test_reductions(rng):
    x, tl, ul = _batch(rng, 3, 4, 3, 7)
    ul = torch.tensor([3, 1, 2])
    y = torch.tensor(rng.integers(0, 3, (3, 3)))
    kw = dict(blank=3, durations=[0, 1, 2])
    none = lgf.tdt_loss(x, y, tl, ul, reduction="none", **kw)
    assert none.shape == (3,)
    torch.testing.assert_close(lgf.tdt_loss(x, y, tl, ul, reduction="sum", **kw), none.sum())
    torch.testing.assert_close(lgf.tdt_loss(x, y, tl, ul, reduction="mean", **kw), none.mean())
    torch.testing.assert_close(lgf.tdt_loss(x, y, tl, ul, reduction="mean_volume", **kw), none.sum() / 6)
    grads = []
    for red in ["sum", "mean"]:
        xi = x.clone().requires_grad_(True)
        lgf.multiblank_rnnt_loss(xi, y, tl, ul, blank=6, big_blank_durations=[2], reduction=red).backward()
        grads.append(xi.grad)
    torch.testing.assert_close(grads[1], grads[0] / 3)
    # "none": the incoming gradient weighs each example
    xi = x.clone().requires_grad_(True)
    w = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    (lgf.tdt_loss(xi, y, tl, ul, reduction="none", **kw) * w).sum().backward()
    assert xi.grad[1].abs().sum() == 0 and xi.grad[2].abs().sum() > 0


@pytest.mark.parametrize("impl", IMPLS)
def test_infeasible_and_zero_infinity(impl, rng):
    x, _, _ = _batch(rng, 2, 3, 1, 5)
    y = torch.tensor([[0], [0]])
    tl, ul = torch.tensor([3, 0]), torch.tensor([1, 1])
    # durations [2] only: 0 -> 2 -> 4 never lands on T = 3; and the second example has no frames
    kw = dict(blank=1, durations=[2], reduction="none", impl=impl)
    assert torch.isinf(lgf.tdt_loss(x, y, tl, ul, **kw)).all()
    xi = x.clone().requires_grad_(True)
    out = lgf.tdt_loss(xi, y, tl, ul, zero_infinity=True, **kw)
    assert (out == 0).all()
    out.sum().backward()
    assert torch.isfinite(xi.grad).all() and xi.grad.abs().sum() == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_more_labels_than_frames(impl, rng):
    x, _, _ = _batch(rng, 1, 2, 5, 6)
    y = torch.tensor([[0, 1, 2, 1, 0]])
    tl, ul = torch.tensor([2]), torch.tensor([5])
    mb = lgf.multiblank_rnnt_loss(x, y, tl, ul, blank=5, big_blank_durations=[2], reduction="none", impl=impl)
    lp = x.log_softmax(-1).numpy()[0]
    assert mb.item() == pytest.approx(brute_multiblank(lp, [0, 1, 2, 1, 0], 2, 5, [(4, 2)]), rel=1e-9)
    td = lgf.tdt_loss(x, y, tl, ul, blank=3, durations=[0, 1], reduction="none", impl=impl)
    assert math.isfinite(td.item())


def test_nan_in_nan_out(rng):
    x, tl, ul = _batch(rng, 2, 3, 2, 6)
    tl = torch.tensor([3, 2])
    x[1, 0, 0, 0] = float("nan")
    x.requires_grad_(True)
    out = lgf.tdt_loss(x, torch.tensor([[0, 1], [1, 0]]), tl, ul, blank=2, durations=[0, 1, 2], reduction="none")
    assert math.isfinite(out[0].item()) and math.isnan(out[1].item())
    # a NaN outside an example's lattice (a padded frame) is not read
    z = torch.zeros(1, 3, 2, 6, dtype=torch.float64)
    z[0, 2] = float("nan")
    assert math.isfinite(lgf.tdt_loss(z, torch.tensor([[0]]), [2], [1], blank=2, durations=[0, 1, 2]).item())


# -- bad inputs ----------------------------------------------------------------------------------


def _ok():
    return torch.zeros(2, 3, 3, 7), torch.tensor([[0, 1], [1, 0]]), torch.tensor([3, 2]), torch.tensor([2, 1])


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(durations=[]), "durations"),
        (dict(durations=[0, -1]), "durations"),
        (dict(durations=[2, 1, 0]), "durations"),
        (dict(durations=[0, 0, 1]), "durations"),
        (dict(durations=[0.0, 1.0, 2.0]), "durations"),
        (dict(durations=[0]), "durations"),
        (dict(durations="012"), "durations"),
        (dict(durations=[True, 2, 3]), "durations"),
        (dict(blank=4), "blank"),
        (dict(blank=1.0), "blank"),
        (dict(sigma=float("nan")), "sigma"),
        (dict(sigma="0.1"), "sigma"),
        (dict(omega=1.5), "omega"),
        (dict(reduction="mean_batch"), "reduction"),
        (dict(impl="triton"), "impl"),
        (dict(logits=torch.zeros(2, 3, 7)), "logits"),
        (dict(logits=torch.zeros(2, 3, 3, 7, dtype=torch.long)), "logits"),
        (dict(logits=torch.zeros(2, 3, 3, 3)), "logits"),
        (dict(targets=torch.tensor([[0, 5], [1, 0]])), "targets"),
        (dict(targets=torch.tensor([[0, 3], [1, 0]])), "targets"),
        (dict(targets=torch.tensor([[0, -1], [1, 0]])), "targets"),
        (dict(targets=torch.tensor([0, 1, 1])), "targets"),
        (dict(targets=torch.tensor([[0.0, 1.0], [1.0, 0.0]])), "targets"),
        (dict(logit_lengths=torch.tensor([4, 2])), "logit_lengths"),
        (dict(logit_lengths=torch.tensor([-1, 2])), "logit_lengths"),
        (dict(logit_lengths=torch.tensor([3])), "logit_lengths"),
        (dict(target_lengths=torch.tensor([3, 1])), "target_lengths"),
        (dict(target_lengths=torch.tensor([2.0, 1.0])), "target_lengths"),
    ],
)
def test_tdt_bad_inputs(change, match):
    x, y, tl, ul = _ok()
    kw = dict(logits=x, targets=y, logit_lengths=tl, target_lengths=ul, blank=3, durations=[0, 1, 2])
    kw.update(change)
    with pytest.raises(ValueError, match=match):
        lgf.tdt_loss(**kw)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(big_blank_durations=[0, 2]), "big_blank_durations"),
        (dict(big_blank_durations=[4, 2]), "big_blank_durations"),
        (dict(big_blank_durations=[2.5]), "big_blank_durations"),
        (dict(big_blank_durations=None), "big_blank_durations"),
        (dict(blank=1, big_blank_durations=[2, 3]), "blank"),
        (dict(blank=7), "blank"),
        (dict(big_blank_ids=[5]), "big_blank_ids"),
        (dict(big_blank_ids=[6, 5]), "big_blank_ids"),
        (dict(big_blank_ids=[5, 9]), "big_blank_ids"),
        (dict(targets=torch.tensor([[0, 5], [1, 0]])), "targets"),  # a big blank
        (dict(targets=torch.tensor([[0, 6], [1, 0]])), "targets"),  # the blank
    ],
)
def test_multiblank_bad_inputs(change, match):
    x, y, tl, ul = _ok()
    kw = dict(logits=x, targets=y, logit_lengths=tl, target_lengths=ul, blank=6, big_blank_durations=[2, 3])
    kw.update(change)
    with pytest.raises(ValueError, match=match):
        lgf.multiblank_rnnt_loss(**kw)


# -- modules, compile, registry ------------------------------------------------------------------


class _Net:
    """A tiny transducer network: the seam of lightning_gtn.nn.rnnt (predict, join)."""

    def __init__(self, V, J=4):
        g = torch.Generator().manual_seed(0)
        self.emb = torch.randn(10, J, generator=g, dtype=torch.float64)
        self.out = torch.randn(J, V, generator=g, dtype=torch.float64, requires_grad=True)

    def predict(self, tokens, state=None):
        return self.emb[tokens], state

    def join(self, enc, pred):
        return torch.tanh(enc + pred) @ self.out


def test_modules(rng):
    C = 4  # the vocabulary: blank 0, tokens 1..3
    tdt = lgn.TDTLoss(blank=0, durations=[0, 1, 2], sigma=0.05)
    mb = lgn.MultiBlankRNNTLoss(blank=0, big_blank_durations=[2, 3])
    assert tdt.topology == mb.topology == "rnnt"
    assert tdt.extra_outputs == 3 and mb.extra_outputs == 2
    enc = torch.tensor(rng.standard_normal((2, 4, 4)))
    y, tl, ul = torch.tensor([[1, 2], [3, 0]]), torch.tensor([4, 3]), torch.tensor([2, 1])
    for loss in (tdt, mb):
        net = _Net(C + loss.extra_outputs)
        out = loss.joint_loss(net, enc, tl, y, ul)
        out.backward()
        assert math.isfinite(out.item()) and net.out.grad.abs().sum() > 0
    # the vocabulary's layout (blank 0): the big blanks are the extra outputs, V - 1 - i
    x = torch.tensor(rng.standard_normal((2, 4, 3, C + 2)))
    want = lgf.multiblank_rnnt_loss(x, y, tl, ul, blank=0, big_blank_durations=[2, 3], big_blank_ids=[5, 4])
    torch.testing.assert_close(mb(x, y, tl, ul), want)
    assert "durations=[0, 1, 2]" in repr(tdt)
    with pytest.raises(ValueError, match="durations"):
        lgn.TDTLoss(durations=[2, 1])
    with pytest.raises(ValueError, match="sigma"):
        lgn.MultiBlankRNNTLoss(sigma=float("inf"))
    with pytest.raises(ValueError, match="blank"):
        lgn.MultiBlankRNNTLoss(blank=1.5)
    with pytest.raises(ValueError, match="blank"):
        lgn.TDTLoss(blank=True)
    with pytest.raises(ValueError, match="reduction"):
        lgn.TDTLoss(reduction="avg")
    for name in ("MultiBlankRNNTLoss", "TDTLoss"):
        trust.check_target(f"lightning_gtn.nn.{name}", "loss._target_")


def test_modules_default_to_the_functions_blank(rng):
    """The modules' blank defaults to the functions' (-1: the last class, NeMo's layout); the
    calls that need the id itself (the prediction network's start symbol, the greedy search's
    blank) say so."""
    import inspect

    for mod, fn in ((lgn.MultiBlankRNNTLoss, lgf.multiblank_rnnt_loss), (lgn.TDTLoss, lgf.tdt_loss)):
        assert inspect.signature(mod).parameters["blank"].default == -1
        assert inspect.signature(fn).parameters["blank"].default == -1
    assert inspect.signature(lgn.RNNTLoss).parameters["blank"].default == -1
    tdt, mb = lgn.TDTLoss(durations=[0, 1, 2]), lgn.MultiBlankRNNTLoss(big_blank_durations=[2, 3])
    assert tdt.blank == mb.blank == -1
    y, tl, ul = torch.tensor([[1, 2], [3, 0]]), torch.tensor([4, 3]), torch.tensor([2, 1])
    x = torch.tensor(rng.standard_normal((2, 4, 3, 6 + 3)))  # 6 label classes (blank last), 3 durations
    torch.testing.assert_close(tdt(x, y, tl, ul), lgf.tdt_loss(x, y, tl, ul, blank=5, durations=[0, 1, 2]))
    z = x[..., :7]  # tokens 0..3, big blanks 4 (3 frames) and 5 (2 frames), the blank 6
    torch.testing.assert_close(mb(z, y, tl, ul), lgf.multiblank_rnnt_loss(z, y, tl, ul, 6, [2, 3]))
    enc = torch.tensor(rng.standard_normal((2, 4, 4)))
    for loss in (tdt, mb):
        with pytest.raises(ValueError, match=r"blank=-1\)\.joint_loss needs the blank's class id"):
            loss.joint_loss(_Net(4 + loss.extra_outputs), enc, tl, y, ul)
        with pytest.raises(ValueError, match=r"blank=-1\)\.decoding needs the blank's class id"):
            loss.decoding(4)


def test_torch_compile_fullgraph():
    x = torch.randn(2, 3, 3, 7, requires_grad=True)
    y, tl, ul = torch.tensor([[0, 1], [1, 0]]), torch.tensor([3, 2]), torch.tensor([2, 1])

    def step(z):
        return lgf.tdt_loss(z * 2.0, y, tl, ul, blank=3, durations=[0, 1, 2], sigma=0.05)

    want = step(x)
    (g_want,) = torch.autograd.grad(want, x)
    got = torch.compile(step, fullgraph=True, backend="eager")(x)
    (g_got,) = torch.autograd.grad(got, x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(g_got, g_want)


def test_batched_equals_one_by_one(rng):
    x, tl, ul = _batch(rng, 3, 4, 2, 6)
    y = torch.tensor(rng.integers(0, 4, (3, 2)))
    kw = dict(blank=5, big_blank_durations=[2], reduction="none")
    full = lgf.multiblank_rnnt_loss(x, y, tl, ul, **kw)
    for b in range(3):
        T, U = int(tl[b]), int(ul[b])
        one = lgf.multiblank_rnnt_loss(x[b : b + 1, :T, : U + 1], y[b : b + 1, :U], [T], [U], **kw)
        torch.testing.assert_close(one[0], full[b])


def test_edge_shapes_and_huge_durations(rng):
    # an empty batch, no frames at all, durations far beyond T (never landing, no overflow)
    empty = lgf.tdt_loss(torch.zeros(0, 3, 2, 5), torch.zeros(0, 1, dtype=torch.long), [], [], blank=0,
                         durations=[0, 1])  # fmt: skip
    assert empty.item() == 0.0
    none = lgf.multiblank_rnnt_loss(torch.zeros(1, 0, 1, 3), torch.zeros(1, 0, dtype=torch.long), [0], [0], blank=0,
                                    reduction="none")  # fmt: skip
    assert math.isinf(none.item())
    x, _, _ = _batch(rng, 1, 3, 1, 5)
    big = lgf.tdt_loss(x, torch.tensor([[1]]), [3], [1], blank=0, durations=[0, 1, 2**62], reduction="none")
    lab, dur = (x[..., :2].log_softmax(-1)).numpy(), x[..., 2:].log_softmax(-1).numpy()
    assert big.item() == pytest.approx(brute_tdt(lab[0], dur[0], [1], 3, 0, [0, 1, 2**62]), rel=1e-9)


def test_op_refuses_a_bad_arc_description():
    from lightning_gtn.losses.rnnt_variants import duration_lattice_op

    x = torch.zeros(1, 2, 2, 4)
    args = (x, torch.tensor([[0]]), torch.tensor([2]), torch.tensor([1]))
    with pytest.raises(ValueError, match="blank ids"):
        duration_lattice_op(*args, 4, 0, [0], [-1], [7], [1], [-1], 0.0, 0.0, True, "sum", False, "", False)
    with pytest.raises(ValueError, match="duration indices"):
        duration_lattice_op(*args, 3, 1, [0], [3], [2], [1], [-1], 0.0, 0.0, True, "sum", False, "", False)


def test_durations_are_bounded_in_length_and_value():
    """A durations list of 3M entries took 68 s and 2.9 GB before asking for 786 GB; a duration
    of 2^64 was a torch schema error: both are refused by name, before anything is built."""

    from lightning_gtn.core import checks

    MultiBlankRNNTLoss, TDTLoss = lgn.MultiBlankRNNTLoss, lgn.TDTLoss

    n = checks.MAX_DURATIONS + 1
    for make in (
        lambda: TDTLoss(durations=range(3_000_000)),
        lambda: TDTLoss(durations=list(range(n))),
        lambda: MultiBlankRNNTLoss(big_blank_durations=list(range(1, n + 1))),
        lambda: lgf.tdt_loss(torch.zeros(1, 1, 1, n + 2), torch.zeros(1, 0), [1], [0], durations=list(range(n))),
    ):
        with pytest.raises(ValueError, match="at most MAX_DURATIONS=1024 durations"):
            make()
    for make in (
        lambda: MultiBlankRNNTLoss(big_blank_durations=[2, 2**64]),
        lambda: MultiBlankRNNTLoss(big_blank_durations=[2, 2**63 - 1]),
        lambda: TDTLoss(durations=[0, 1, checks.MAX_DURATION + 1]),
        lambda: lgf.multiblank_rnnt_loss(
            torch.zeros(1, 1, 1, 4), torch.zeros(1, 0, dtype=torch.long), [1], [0], big_blank_durations=[2**64]
        ),
    ):
        with pytest.raises(ValueError, match=r"in \[[01], MAX_DURATION=4611686018427387904\] \(frames\), got"):
            make()


@pytest.mark.parametrize("impl", ["numba", "torch"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_an_infinite_logit_gives_nan_as_torch_log_softmax_does(impl, zero_infinity):
    """numba's fused normaliser read a +inf logit as a node no path may cross and gave a finite
    loss (the torch reference: NaN, as torch.log_softmax); both are NaN now, zero_infinity or not."""
    lg = torch.randn(2, 5, 3, 6)
    lg[1, 1, 1, 1] = math.inf
    tg, tl = torch.tensor([[1, 2], [1, 2]]), torch.tensor([2, 2])
    kw = dict(reduction="none", impl=impl, zero_infinity=zero_infinity)
    tdt = lgf.tdt_loss(lg, tg, [5, 5], tl, blank=0, durations=[0, 1], **kw)
    mb = lgf.multiblank_rnnt_loss(lg[..., :5], tg, [5, 5], tl, blank=4, big_blank_durations=[2], **kw)
    for out in (tdt, mb):
        assert torch.isfinite(out[0]) and torch.isnan(out[1]), out
