"""tdt_joiner_loss and multiblank_rnnt_joiner_loss against their definitions: tdt_loss and
multiblank_rnnt_loss of the materialised joiner output."""

from __future__ import annotations

import pytest
import torch

from lightning_gtn.functional import multiblank_rnnt_joiner_loss, multiblank_rnnt_loss, tdt_joiner_loss, tdt_loss
from lightning_gtn.losses import rnnt_joiner

REDUCTIONS = ("none", "mean", "sum", "mean_volume")
NAMES = ("encoder", "predictor", "weight", "bias")
TDT_KW = dict(durations=(0, 1, 2, 4), sigma=0.05)
MB_KW = dict(big_blank_durations=(2, 3), sigma=0.05)


def joiner_logits(enc, pred, w, b):
    return torch.tanh(enc[:, :, None] + pred[:, None]) @ w.T + b


def case(B=3, T=6, U=4, V=9, J=5, labels=5, dtype=torch.float64, seed=0):
    """Tensors, targets in ``[0, labels - 1)`` (the blank, the last label class, and the classes past
    it never targets) and ragged lengths (example 0 full, one with no label)."""
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, T, J), (B, U + 1, J), (V, J), (V,))
    tensors = tuple(torch.randn(*s, generator=g, dtype=dtype).requires_grad_() for s in shapes)
    tg = torch.randint(0, labels - 1, (B, U), generator=g)
    il = torch.randint(1, T + 1, (B,), generator=g)
    il[0] = T
    tl = torch.randint(0, U + 1, (B,), generator=g)
    tl[0], tl[-1] = U, 0
    return tensors, tg, il, tl


LOSSES = {
    "tdt": (tdt_joiner_loss, tdt_loss, TDT_KW),
    "multiblank": (multiblank_rnnt_joiner_loss, multiblank_rnnt_loss, MB_KW),
}


def both(kind, tensors, tg, il, tl, upstream=None, **kw):
    """``(loss, grads)`` of the joiner loss and of the materialised definition."""
    joiner, ref, base = LOSSES[kind]
    kw = {**base, **kw}
    out = []
    for fn in ("joiner", "ref"):
        loss = joiner(*tensors, tg, il, tl, **kw) if fn == "joiner" else ref(joiner_logits(*tensors), tg, il, tl, **kw)
        s = loss.sum() if upstream is None else (loss * upstream).sum()
        out.append((loss.detach(), torch.autograd.grad(s, tensors)))
    return out


def assert_close(got, want, rtol, atol=0.0, what=""):
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def assert_both_close(res, rtol, grtol, gatol):
    (l1, g1), (l2, g2) = res
    assert_close(l1, l2, rtol, what="loss")
    for n, a, c in zip(NAMES, g1, g2):
        assert_close(a, c, grtol, gatol, what=n)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("kind", sorted(LOSSES))
def test_float64_matches_the_materialised_loss(kind, reduction):
    tensors, tg, il, tl = case()
    assert_both_close(both(kind, tensors, tg, il, tl, reduction=reduction), 1e-7, 1e-7, 1e-12)


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("kind", sorted(LOSSES))
def test_float32_matches_the_materialised_loss(kind, reduction):
    tensors, tg, il, tl = case(B=4, T=9, U=5, V=13, J=8, labels=8, dtype=torch.float32, seed=1)
    assert_both_close(both(kind, tensors, tg, il, tl, reduction=reduction), 1e-4, 1e-3, 1e-5)


@pytest.mark.parametrize("omega", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("sigma", [0.0, 0.1])
def test_tdt_sigma_omega_and_blank(sigma, omega):
    tensors, tg, il, tl = case(seed=2)
    # K = 9 - 3 = 6 label classes: the blank first (targets 1..4) or last (targets 0..3)
    for blank, t in ((0, tg + 1), (-1, tg)):
        res = both("tdt", tensors, t, il, tl, blank=blank, durations=(0, 1, 3), sigma=sigma, omega=omega)
        assert_both_close(res, 1e-7, 1e-7, 1e-12)


@pytest.mark.parametrize("kw", [dict(big_blank_durations=()), dict(big_blank_durations=(2, 4), sigma=0.0)])
def test_multiblank_big_blanks(kw):
    tensors, tg, il, tl = case(seed=3)
    assert_both_close(both("multiblank", tensors, tg, il, tl, reduction="sum", **kw), 1e-7, 1e-7, 1e-12)
    # big blanks at chosen classes, the blank first
    tg1 = tg + 3
    res = both("multiblank", tensors, tg1, il, tl, blank=0, big_blank_durations=(2, 3), big_blank_ids=[2, 1])
    assert_both_close(res, 1e-7, 1e-7, 1e-12)


@pytest.mark.parametrize("kind", sorted(LOSSES))
def test_signed_upstream_gradient(kind):
    tensors, tg, il, tl = case(seed=4)
    upstream = torch.tensor([0.5, -2.0, 0.0], dtype=torch.float64)
    assert_both_close(both(kind, tensors, tg, il, tl, upstream, reduction="none"), 1e-7, 1e-7, 1e-12)


@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("kind", sorted(LOSSES))
def test_infeasible_row(kind, zero_infinity):
    tensors, tg, il, tl = case(seed=5)
    il = il.clone()
    il[1] = 0  # no frame: no path
    (l1, g1), (l2, g2) = both(kind, tensors, tg, il, tl, reduction="none", zero_infinity=zero_infinity)
    assert l1[1].item() == (0.0 if zero_infinity else float("inf"))
    assert torch.equal(l1.isinf(), l2.isinf())
    fin = l1.isfinite()
    assert_close(l1[fin], l2[fin], 1e-7, what="loss")
    for n, a, c in zip(NAMES, g1, g2):
        assert_close(a, c, 1e-7, 1e-12, what=n)
    assert g1[0][1].abs().sum() == 0 and g1[1][1].abs().sum() == 0


@pytest.mark.parametrize("nodes", [1, 3, 10, 12])  # one node; runs across frames; 2 whole frames; a partial chunk
@pytest.mark.parametrize("kind", sorted(LOSSES))
def test_small_chunks_equal_one_chunk(monkeypatch, kind, nodes):
    joiner, _, kw = LOSSES[kind]
    tensors, tg, il, tl = case(seed=6)  # J=5, V=9: 8 * 2 * (9 + 5) = 224 bytes a float64 node; U + 1 = 5
    monkeypatch.setattr(rnnt_joiner, "JOINER_CHUNK_BYTES", 1 << 30)
    big = joiner(*tensors, tg, il, tl, **kw)
    gb = torch.autograd.grad(big, tensors)
    monkeypatch.setattr(rnnt_joiner, "JOINER_CHUNK_BYTES", nodes * 224 + 223)
    assert rnnt_joiner.chunk_nodes(5, 9, 8) == nodes
    small = joiner(*tensors, tg, il, tl, **kw)
    gs = torch.autograd.grad(small, tensors)
    assert_close(small, big, 1e-12, what="loss")
    for a, c in zip(gs, gb):
        assert_close(a, c, 1e-12, 1e-14)


@pytest.mark.parametrize("kind", sorted(LOSSES))
def test_gradcheck_float64(kind):
    joiner, _, _ = LOSSES[kind]
    tensors, tg, il, tl = case(B=2, T=3, U=2, V=6, J=3, labels=3, seed=7)
    kw = dict(durations=(0, 1, 2), sigma=0.05, omega=0.3) if kind == "tdt" else dict(big_blank_durations=(2,))
    for reduction in ("mean_volume", "none"):
        assert torch.autograd.gradcheck(
            lambda *x, r=reduction: joiner(*x, tg, il, tl, reduction=r, **kw),
            tensors,  # type: ignore[operator]
        )


@pytest.mark.parametrize("kind", sorted(LOSSES))
def test_torch_lattice_gives_the_numba_lattice(kind):
    joiner, _, kw = LOSSES[kind]
    tensors, tg, il, tl = case(seed=8)
    out = []
    for impl in ("numba", "torch"):
        loss = joiner(*tensors, tg, il, tl, reduction="none", impl=impl, **kw)
        out.append((loss.detach(), torch.autograd.grad(loss.sum(), tensors)))
    (l1, g1), (l2, g2) = out
    assert_close(l2, l1, 1e-10, what="loss")
    for a, c in zip(g2, g1):
        assert_close(a, c, 1e-9, 1e-12)


def test_no_grad_and_partial_grads():
    tensors, tg, il, tl = case(seed=9)
    with torch.no_grad():
        l0 = tdt_joiner_loss(*tensors, tg, il, tl, **TDT_KW)
    enc, pred, w, b = tensors
    frozen = (enc, pred.detach(), w.detach(), b)
    loss = tdt_joiner_loss(*frozen, tg, il, tl, **TDT_KW)
    ge, gb = torch.autograd.grad(loss, (enc, b))
    want = torch.autograd.grad(tdt_loss(joiner_logits(*frozen), tg, il, tl, **TDT_KW), (enc, b))
    assert_close(l0, loss.detach(), 1e-12)
    assert_close(ge, want[0], 1e-7, 1e-12)
    assert_close(gb, want[1], 1e-7, 1e-12)


def test_nan_input_gives_a_nan_loss_for_its_row():
    tensors, tg, il, tl = case(seed=10)
    enc = tensors[0].detach().clone()
    enc[1, 0, 0] = float("nan")
    loss = multiblank_rnnt_joiner_loss(enc, *tensors[1:], tg, il, tl, reduction="none", **MB_KW)
    assert loss[1].isnan() and loss[0].isfinite() and loss[2].isfinite()


def test_compiles_fullgraph_and_opcheck():
    tensors, tg, il, tl = case(B=2, T=4, U=2, V=7, J=3, labels=3, seed=11)

    def step(enc, pred, w, b):
        return tdt_joiner_loss(enc * 1.0, pred, w, b, tg, il, tl, durations=(0, 1, 2), omega=0.2)

    loss = torch.compile(step, fullgraph=True, backend="aot_eager")(*tensors)
    got = torch.autograd.grad(loss, tensors)
    want_loss = step(*tensors)
    want = torch.autograd.grad(want_loss, tensors)
    assert_close(loss, want_loss, 1e-12)
    for a, c in zip(got, want):
        assert_close(a, c, 1e-12, 1e-14)
    enc, pred, w, b = (x.detach() for x in tensors)
    args = rnnt_joiner.DurationJoinerArgs(
        enc, pred, w, b, tg, il, tl, 4, 3, [3], [0, 1, 2], [0, 1, 2], [1, 1], [1, 2], [1, 2], 0.05, 0.2,
        "mean_volume", False, "numba", True,
    )  # fmt: skip
    torch.library.opcheck(torch.ops.lightning_gtn.duration_joiner_loss.default, tuple(args))
    _, lse, arcs = torch.ops.lightning_gtn.duration_joiner_loss.default(*args)
    coef = torch.tensor([0.5, -2.0], dtype=torch.float64)
    bargs = rnnt_joiner.DurationJoinerBackwardArgs(
        enc, pred, w, b, tg, il, tl, lse, arcs, coef, 4, [3], True, False, True, False
    )
    torch.library.opcheck(torch.ops.lightning_gtn.duration_joiner_loss_backward.default, tuple(bargs))


def test_bad_inputs():
    (enc, pred, w, b), tg, il, tl = case()
    tdt = [
        ((enc[0], pred, w, b), {}, r"encoder must have shape \(B, T, J\)"),
        ((enc, pred, w[:, :2], b), {}, r"weight must have shape \(V, J\) with J=5"),
        ((enc, pred.float(), w, b), {}, r"predictor must have the encoder's dtype"),
        ((enc, pred, w, b), {"blank": 5}, r"blank must lie in \[-K, K\) with K=5"),
        ((enc, pred, w, b), {"durations": (1, 0)}, r"durations"),
        ((enc, pred, w, b), {"durations": tuple(range(9))}, r"V > len\(durations\)=9"),
        ((enc, pred, w, b), {"omega": 1.5}, r"omega"),
        ((enc, pred, w, b), {"reduction": "avg"}, r"reduction"),
        ((enc, pred, w, b), {"impl": "cuda"}, r"impl must be None or one of"),
    ]
    for tensors, kw, msg in tdt:
        with pytest.raises(ValueError, match=msg):
            tdt_joiner_loss(*tensors, tg, il, tl, **{**TDT_KW, **kw})
    with pytest.raises(ValueError, match=r"logit_lengths must lie in \[0, T\] with T=6"):
        tdt_joiner_loss(enc, pred, w, b, tg, il + 10, tl, **TDT_KW)
    with pytest.raises(ValueError, match=r"target_lengths must lie in \[0, U\] with U=4"):
        tdt_joiner_loss(enc, pred, w, b, tg, il, tl + 10, **TDT_KW)
    with pytest.raises(ValueError, match=r"targets"):
        tdt_joiner_loss(enc, pred, w, b, torch.full_like(tg, 4), il, tl, **TDT_KW)  # the blank as a label
    with pytest.raises(ValueError, match=r"targets"):
        tdt_joiner_loss(enc, pred, w, b, torch.full_like(tg, 6), il, tl, **TDT_KW)  # a duration class
    mb = [
        ({"big_blank_durations": (0, 2)}, r"big_blank_durations"),
        ({"blank": 1, "big_blank_durations": (2, 3)}, r"leaves no room for 2 big blanks"),
        ({"big_blank_ids": [1]}, r"big_blank_ids must have len\(big_blank_durations\)=2 ids"),
        ({"sigma": float("nan")}, r"sigma"),
    ]
    for kw, msg in mb:
        with pytest.raises(ValueError, match=msg):
            multiblank_rnnt_joiner_loss(enc, pred, w, b, tg, il, tl, **{**MB_KW, **kw})
    with pytest.raises(ValueError, match=r"targets"):
        multiblank_rnnt_joiner_loss(enc, pred, w, b, torch.full_like(tg, 7), il, tl, **MB_KW)  # a big blank
    with pytest.raises(TypeError, match="unexpected options"):
        rnnt_joiner.apply_loss(rnnt_joiner.TDT_JOINER, (enc, pred, w, b), tg, il, tl, clamp=0.1)


@pytest.mark.parametrize("seed", range(4))
def test_fuzzed_shapes_lengths_and_arcs(seed):
    g = torch.Generator().manual_seed(300 + seed)
    B, T, U, J = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 4), (1, 7), (0, 4), (1, 5)))
    durations = [(0, 1), (1, 2), (0, 2, 3), (0, 1, 2, 3, 4)][seed]
    big = [(), (2,), (3, 5), (1,)][seed]  # (1,): a big blank as long as the blank
    tensors, tg, il, tl = case(B, T, U, V=6 + len(durations), J=J, labels=6, seed=400 + seed)
    res = both("tdt", tensors, tg, il, tl, reduction="sum", durations=durations, sigma=0.0)
    assert_both_close(res, 1e-7, 1e-7, 1e-12)
    tensors, tg, il, tl = case(B, T, U, V=6 + len(big), J=J, labels=6 - len(big), seed=500 + seed)
    res = both("multiblank", tensors, tg, il, tl, reduction="mean_volume", big_blank_durations=big, sigma=0.0)
    assert_both_close(res, 1e-7, 1e-7, 1e-12)
