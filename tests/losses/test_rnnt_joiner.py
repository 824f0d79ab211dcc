"""rnnt_joiner_loss against its definition: rnnt_loss of the materialised joiner output."""

from __future__ import annotations

import pytest
import torch

from lightning_gtn.functional import rnnt_joiner_loss, rnnt_loss
from lightning_gtn.losses import rnnt_joiner

REDUCTIONS = ("none", "mean", "sum")


def joiner_logits(enc, pred, w, b):
    return torch.tanh(enc[:, :, None] + pred[:, None]) @ w.T + b


def case(B=3, T=6, U=4, V=7, J=5, dtype=torch.float64, blank=0, seed=0, ragged=True):
    g = torch.Generator().manual_seed(seed)
    enc = torch.randn(B, T, J, generator=g, dtype=dtype).requires_grad_()
    pred = torch.randn(B, U + 1, J, generator=g, dtype=dtype).requires_grad_()
    w = torch.randn(V, J, generator=g, dtype=dtype).requires_grad_()
    b = torch.randn(V, generator=g, dtype=dtype).requires_grad_()
    bl = blank % V
    tg = torch.randint(0, V - 1, (B, U), generator=g)
    tg = tg + (tg >= bl).long()  # never the blank
    if ragged:
        il = torch.randint(1, T + 1, (B,), generator=g)
        il[0] = T
        tl = torch.randint(0, U + 1, (B,), generator=g)
        tl[0] = U
    else:
        il, tl = torch.full((B,), T), torch.full((B,), U)
    return (enc, pred, w, b), tg, il, tl


def both(tensors, tg, il, tl, upstream=None, **kw):
    """``(loss, grads)`` of the joiner loss and of the materialised definition."""
    out = []
    for fn in ("joiner", "ref"):
        if fn == "joiner":
            loss = rnnt_joiner_loss(*tensors, tg, il, tl, **kw)
        else:
            loss = rnnt_loss(joiner_logits(*tensors), tg, il, tl, **kw)
        s = loss.sum() if upstream is None else (loss * upstream).sum()
        out.append((loss.detach(), torch.autograd.grad(s, tensors)))
    return out


def assert_close(got, want, rtol, atol=0.0, what=""):
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("blank", [0, -1])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_float64_matches_the_materialised_loss(blank, reduction):
    tensors, tg, il, tl = case(blank=blank)
    (l1, g1), (l2, g2) = both(tensors, tg, il, tl, blank=blank, reduction=reduction)
    assert_close(l1, l2, 1e-7, what="loss")
    for n, a, c in zip(("encoder", "predictor", "weight", "bias"), g1, g2):
        assert_close(a, c, 1e-7, 1e-12, what=n)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_float32_matches_the_materialised_loss(reduction):
    tensors, tg, il, tl = case(B=4, T=9, U=5, V=11, J=8, dtype=torch.float32, seed=1)
    (l1, g1), (l2, g2) = both(tensors, tg, il, tl, blank=0, reduction=reduction)
    assert_close(l1, l2, 1e-4, what="loss")
    for n, a, c in zip(("encoder", "predictor", "weight", "bias"), g1, g2):
        assert_close(a, c, 1e-3, 1e-5, what=n)


@pytest.mark.parametrize("kw", [dict(clamp=0.02), dict(fastemit_lambda=0.5), dict(clamp=0.05, fastemit_lambda=0.2)])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_clamp_and_fastemit_as_rnnt_loss(kw, reduction):
    tensors, tg, il, tl = case(seed=2)
    upstream = torch.tensor([0.5, -2.0, 3.0], dtype=torch.float64) if reduction == "none" else None
    (l1, g1), (l2, g2) = both(tensors, tg, il, tl, upstream, blank=0, reduction=reduction, **kw)
    assert_close(l1, l2, 1e-7, what="loss")
    for n, a, c in zip(("encoder", "predictor", "weight", "bias"), g1, g2):
        assert_close(a, c, 1e-7, 1e-12, what=n)
    if "clamp" in kw:  # the clamp bites: the unclamped gradient differs
        plain = torch.autograd.grad(rnnt_joiner_loss(*tensors, tg, il, tl, blank=0, reduction=reduction).sum(), tensors)
        assert not torch.allclose(plain[2], g1[2])


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_infeasible_row(zero_infinity):
    tensors, tg, il, tl = case(seed=3)
    il = il.clone()
    il[1] = 0  # no frame: no path
    (l1, g1), (l2, g2) = both(tensors, tg, il, tl, blank=0, reduction="none", zero_infinity=zero_infinity)
    assert l1[1].item() == (0.0 if zero_infinity else float("inf"))
    assert torch.equal(l1.isinf(), l2.isinf())
    fin = l1.isfinite()
    assert_close(l1[fin], l2[fin], 1e-7, what="loss")
    for n, a, c in zip(("encoder", "predictor", "weight", "bias"), g1, g2):
        assert_close(a, c, 1e-7, 1e-12, what=n)
    assert g1[0][1].abs().sum() == 0 and g1[1][1].abs().sum() == 0


@pytest.mark.parametrize("nodes", [1, 3, 10, 12])  # one node; runs across frames; 2 whole frames; 2 + a partial chunk
def test_small_chunks_equal_one_chunk(monkeypatch, nodes):
    tensors, tg, il, tl = case(seed=4)  # J=5, V=7: 8 * 2 * (7 + 5) = 192 bytes a float64 node; U + 1 = 5
    monkeypatch.setattr(rnnt_joiner, "JOINER_CHUNK_BYTES", 1 << 30)
    assert rnnt_joiner.chunk_nodes(5, 7, 8) >= 6 * 5
    big = rnnt_joiner_loss(*tensors, tg, il, tl, blank=0, clamp=0.1, fastemit_lambda=0.1)
    gb = torch.autograd.grad(big, tensors)
    monkeypatch.setattr(rnnt_joiner, "JOINER_CHUNK_BYTES", nodes * 192 + 191)
    assert rnnt_joiner.chunk_nodes(5, 7, 8) == nodes
    small = rnnt_joiner_loss(*tensors, tg, il, tl, blank=0, clamp=0.1, fastemit_lambda=0.1)
    gs = torch.autograd.grad(small, tensors)
    assert_close(small, big, 1e-12, what="loss")
    for a, c in zip(gs, gb):
        assert_close(a, c, 1e-12, 1e-14)


def test_gradcheck_float64():
    tensors, tg, il, tl = case(B=2, T=3, U=2, V=4, J=3, seed=5)
    for reduction in ("mean", "none"):
        assert torch.autograd.gradcheck(
            lambda *x, r=reduction: rnnt_joiner_loss(*x, tg, il, tl, blank=0, reduction=r), tensors
        )


@pytest.mark.parametrize("seed", range(4))
def test_fuzzed_shapes_and_lengths(seed):
    g = torch.Generator().manual_seed(100 + seed)
    bounds = ((1, 5), (1, 9), (0, 6), (2, 9), (1, 7))
    B, T, U, V, J = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in bounds)
    blank = int(torch.randint(-V, V, (1,), generator=g))
    tensors, tg, il, tl = case(B, T, U, V, J, blank=blank, seed=200 + seed)
    (l1, g1), (l2, g2) = both(tensors, tg, il, tl, blank=blank, reduction="sum")
    assert_close(l1, l2, 1e-7, what=f"loss B,T,U,V,J={B, T, U, V, J}")
    for a, c in zip(g1, g2):
        assert_close(a, c, 1e-7, 1e-12, what=f"grad B,T,U,V,J={B, T, U, V, J}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_are_computed_in_float32(dtype):
    tensors, tg, il, tl = case(dtype=torch.float32, seed=6)
    half = tuple(x.detach().to(dtype).requires_grad_() for x in tensors)
    loss = rnnt_joiner_loss(*half, tg, il, tl, blank=0)
    assert loss.dtype == dtype
    want = rnnt_joiner_loss(*(x.detach().float() for x in half), tg, il, tl, blank=0)
    assert_close(loss.float(), want, 1e-2, what="loss")
    gs = torch.autograd.grad(loss, half)
    assert all(g.dtype == dtype and g.isfinite().all() for g in gs)


def test_no_grad_and_partial_grads():
    tensors, tg, il, tl = case(seed=7)
    with torch.no_grad():
        l0 = rnnt_joiner_loss(*tensors, tg, il, tl, blank=0)
    enc, pred, w, b = tensors
    frozen = (enc, pred.detach(), w.detach(), b)
    loss = rnnt_joiner_loss(*frozen, tg, il, tl, blank=0)
    ge, gb = torch.autograd.grad(loss, (enc, b))
    want = torch.autograd.grad(rnnt_loss(joiner_logits(*frozen), tg, il, tl, blank=0), (enc, b))
    assert_close(l0, loss.detach(), 1e-12)
    assert_close(ge, want[0], 1e-7, 1e-12)
    assert_close(gb, want[1], 1e-7, 1e-12)


def test_compiles_fullgraph():
    tensors, tg, il, tl = case(B=2, T=4, U=2, V=5, J=3, seed=8)

    def step(enc, pred, w, b):
        return rnnt_joiner_loss(enc * 1.0, pred, w, b, tg, il, tl, blank=0, fastemit_lambda=0.1)

    loss = torch.compile(step, fullgraph=True, backend="aot_eager")(*tensors)
    got = torch.autograd.grad(loss, tensors)
    want_loss = step(*tensors)
    want = torch.autograd.grad(want_loss, tensors)
    assert_close(loss, want_loss, 1e-12)
    for a, c in zip(got, want):
        assert_close(a, c, 1e-12, 1e-14)


def test_bad_inputs():
    (enc, pred, w, b), tg, il, tl = case()
    cases = [
        ((enc[0], pred, w, b), {}, r"encoder must have shape \(B, T, J\)"),
        ((enc, pred[:, :, :2], w, b), {}, r"predictor must have shape \(B, U \+ 1, J\) with B=3, J=5"),
        ((enc, pred, w[:, :2], b), {}, r"weight must have shape \(V, J\) with J=5"),
        ((enc, pred, w, b[:3]), {}, r"bias must have shape \(V,\) with V=7"),
        ((enc, pred.float(), w, b), {}, r"predictor must have the encoder's dtype"),
        ((enc, pred, w, tg[0]), {}, r"bias must be a floating point tensor"),
        ((enc, pred, w, b), {"blank": 7}, r"blank must lie in \[-V, V\) with V=7"),
        ((enc, pred, w, b), {"fastemit_lambda": -1.0}, r"fastemit_lambda must be >= 0"),
        ((enc, pred, w, b), {"clamp": float("nan")}, r"clamp must be finite"),
        ((enc, pred, w, b), {"reduction": "avg"}, r"reduction"),
        ((enc, pred, w, b), {"impl": "numba"}, r"rnnt_joiner_loss: impl must be None or one of \('torch', 'triton'\)"),
    ]
    for tensors, kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            rnnt_joiner_loss(*tensors, tg, il, tl, **{"blank": 0, **kw})
    with pytest.raises(ValueError, match=r"logit_lengths must lie in \[0, T\] with T=6"):
        rnnt_joiner_loss(enc, pred, w, b, tg, il + 10, tl, blank=0)
    with pytest.raises(ValueError, match=r"target_lengths must lie in \[0, U\] with U=4"):
        rnnt_joiner_loss(enc, pred, w, b, tg, il, tl + 10, blank=0)
    with pytest.raises(ValueError, match=r"targets"):
        rnnt_joiner_loss(enc, pred, w, b, torch.zeros_like(tg), il, tl, blank=0)  # the blank as a label
    with pytest.raises(ValueError, match=r"targets must have shape \(B, U\)"):
        rnnt_joiner_loss(enc, pred, w, b, tg[0], il, tl, blank=0)
    with pytest.raises(TypeError, match="unexpected options"):
        rnnt_joiner.apply_loss(rnnt_joiner.RNNT_JOINER, (enc, pred, w, b), tg, il, tl, blank=0, durations=[1])


def test_lattice_bound_is_checked_before_allocating(monkeypatch):
    (enc, pred, w, b), tg, il, tl = case()
    monkeypatch.setattr(rnnt_joiner, "MAX_JOINER_NODES", 3 * 6 * 5 - 1)
    with pytest.raises(ValueError, match=r"B \* T \* \(U \+ 1\) = 3 \* 6 \* 5 = 90 nodes is over the limit of 89"):
        rnnt_joiner_loss(enc, pred, w, b, tg, il, tl, blank=0)


def test_module_joint_loss_equals_rnnt_loss_of_the_network():
    from lightning_gtn.lightning import TransducerModel
    from lightning_gtn.nn import RNNTJoinerLoss, RNNTLoss

    torch.manual_seed(0)
    net = TransducerModel(feature_dim=6, num_classes=5, hidden_size=8, conv_channels=8, joiner_dim=12, dropout=0.0)
    x, xl = torch.randn(2, 16, 6), torch.tensor([16, 11])
    tg, tl = torch.tensor([[1, 2, 3], [4, 1, 0]]), torch.tensor([3, 2])
    out = []
    for loss in (RNNTJoinerLoss(blank=0, fastemit_lambda=0.1), RNNTLoss(blank=0, fastemit_lambda=0.1)):
        net.zero_grad()
        enc, el = net.encode(x, xl)
        value = loss.joint_loss(net, enc, el, tg, tl)
        value.backward()
        out.append((value.detach(), [p.grad.clone() for p in net.parameters() if p.grad is not None]))
    (l1, g1), (l2, g2) = out
    assert_close(l1, l2, 1e-5, what="loss")
    assert len(g1) == len(g2) > 0
    for a, c in zip(g1, g2):
        assert_close(a, c, 1e-4, 1e-6)
    assert "joiner_parameters" in RNNTJoinerLoss.network_methods
    with pytest.raises(ValueError, match=r"RNNTJoinerLoss\(blank=-1\)\.joint_loss needs the blank's class id"):
        RNNTJoinerLoss().joint_loss(net, enc, el, tg, tl)
    with pytest.raises(ValueError, match="impl must be None, 'torch' or 'triton'"):
        RNNTJoinerLoss(impl="numba")


def test_torch_lattice_gives_the_numba_lattice(monkeypatch):
    # the lattice off the CPU (rnnt_torch), run here on CPU tensors
    tensors, tg, il, tl = case(seed=9)
    il = il.clone()
    il[2] = 0  # an infeasible row too
    want = rnnt_joiner_loss(*tensors, tg, il, tl, blank=0, reduction="none", fastemit_lambda=0.2, zero_infinity=True)
    gw = torch.autograd.grad(want.sum(), tensors)
    monkeypatch.setattr(rnnt_joiner, "lattice_on_numba", lambda device: False)
    got = rnnt_joiner_loss(*tensors, tg, il, tl, blank=0, reduction="none", fastemit_lambda=0.2, zero_infinity=True)
    gg = torch.autograd.grad(got.sum(), tensors)
    assert_close(got, want, 1e-10, what="loss")
    for a, c in zip(gg, gw):
        assert_close(a, c, 1e-9, 1e-12)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_opcheck(reduction):
    (enc, pred, w, b), tg, il, tl = case(B=2, T=4, U=2, V=5, J=3, seed=10)
    op = torch.ops.lightning_gtn.rnnt_joiner_loss.default
    args = rnnt_joiner.RNNTJoinerArgs(enc, pred, w, b, tg, il, tl, 0, -1.0, reduction, False, 0.1, "torch", True)
    torch.library.opcheck(op, tuple(args))
    _, lse, arcs = op(*args)
    back = torch.ops.lightning_gtn.rnnt_joiner_loss_backward.default
    coef = torch.tensor([0.5, 2.0], dtype=torch.float64)
    bargs = rnnt_joiner.RNNTJoinerBackwardArgs(
        enc.detach(), pred.detach(), w.detach(), b.detach(), tg, il, tl, lse, arcs, coef, 0, 0.3, "torch",
        True, False, True, False,
    )  # fmt: skip
    torch.library.opcheck(back, tuple(bargs))
