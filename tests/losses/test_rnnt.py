"""rnnt_loss against the anchor projects' published values (torchaudio / warp-transducer, NeMo),
brute-force path enumeration, float64 gradcheck, its two implementations against each other, and
its argument checks; nn.RNNTLoss."""

import itertools
import math

import pytest
import torch

import lightning_gtn.nn as lnn
from lightning_gtn import trust
from lightning_gtn.functional import rnnt_loss
from lightning_gtn.kernels.rnnt_torch import rnnt_costs_torch
from tests.losses._rnnt_cases import (
    B1_COST_BLANK0,
    B1_COST_BLANK_LAST,
    B1_GRADS_BLANK0_CLAMP,
    B1_GRADS_BLANK_LAST,
    B1_LOGITS,
    B2_COSTS,
    B2_GRADS,
    B2_LOGITS,
)

IMPLS = ["numba", "torch"]

# ---------------------------------------------------------------------------
# published values
# ---------------------------------------------------------------------------

# (the published cases, with their sources, are written in tests/losses/_rnnt_cases.py)


def _b1(dtype=torch.float32):
    x = torch.tensor(B1_LOGITS, dtype=dtype).reshape(1, 2, 3, 5).requires_grad_()
    return x, torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([2], dtype=torch.int32), torch.tensor([2])


@pytest.mark.parametrize("impl", IMPLS)
def test_torchaudio_b1_t2_u3_d5(impl):
    x, tg, il, tl = _b1()
    costs = rnnt_loss(x, tg, il, tl, reduction="none", impl=impl)
    costs.sum().backward()
    torch.testing.assert_close(costs, torch.tensor([B1_COST_BLANK_LAST]), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad, torch.tensor(B1_GRADS_BLANK_LAST).reshape(1, 2, 3, 5), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torchaudio_b2_t4_u3_d3_blank0(impl, dtype):
    x = torch.tensor(B2_LOGITS, dtype=dtype).reshape(2, 4, 3, 3).requires_grad_()
    tg = torch.tensor([[1, 2], [1, 1]], dtype=torch.int32)
    costs = rnnt_loss(x, tg, torch.tensor([4, 4]), torch.tensor([2, 2]), blank=0, reduction="none", impl=impl)
    costs.sum().backward()
    torch.testing.assert_close(costs, torch.tensor(B2_COSTS, dtype=dtype), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(x.grad, torch.tensor(B2_GRADS, dtype=dtype).reshape(2, 4, 3, 3), rtol=0, atol=2e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_nemo_clamp(impl):
    x, tg, il, tl = _b1()
    loss = rnnt_loss(x, tg, il, tl, blank=0, clamp=0.1, reduction="sum", impl=impl)
    loss.backward()
    assert loss.item() == pytest.approx(B1_COST_BLANK0, rel=1e-6)
    torch.testing.assert_close(x.grad, torch.tensor(B1_GRADS_BLANK0_CLAMP).reshape(1, 2, 3, 5), rtol=1e-5, atol=1e-6)


def _fastemit_reference(x, tg, il, tl, blank, lam, clamp):
    """NeMo's FastEmit gradient built independently: autograd through the torch reference with the
    emit log-probabilities' gradient scaled by 1 + lam (their value unchanged), then clipped."""
    xr = x.detach().clone().requires_grad_()
    rnnt_costs_torch(xr, tg.long(), il.long(), tl.long(), blank, True, lam).sum().backward()
    return xr.grad.clamp(-clamp, clamp) if clamp > 0 else xr.grad


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("lam", [1.0, 0.01])
def test_nemo_fastemit_clamp(impl, lam):
    x, tg, il, tl = _b1()
    loss = rnnt_loss(x, tg, il, tl, blank=0, clamp=0.1, reduction="sum", fastemit_lambda=lam, impl=impl)
    loss.backward()
    assert loss.item() == pytest.approx(B1_COST_BLANK0 * (1 + lam), rel=1e-5)
    torch.testing.assert_close(x.grad, _fastemit_reference(x, tg, il, tl, 0, lam, 0.1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_fastemit_gradient_random(impl):
    x, tg, il, tl = _batch(3, 3, 5, 4, 6, blank=2)
    lam = 0.3
    x.requires_grad_()
    rnnt_loss(x, tg, il, tl, blank=2, reduction="sum", fastemit_lambda=lam, impl=impl).backward()
    ref = _fastemit_reference(x, tg, il, tl, 2, lam, -1.0)
    torch.testing.assert_close(x.grad, ref)
    # FastEmit moves gradient mass: not the plain loss's gradient
    plain = _fastemit_reference(x, tg, il, tl, 2, 0.0, -1.0)
    assert (x.grad - plain).abs().max() > 1e-3


# ---------------------------------------------------------------------------
# brute force: every monotone path through the (T, U + 1) grid
# ---------------------------------------------------------------------------


def _brute_cost(lp, y, blank):
    """``-log sum_paths exp(score)``: a path interleaves T - 1 blanks and U labels, then ends
    with the blank out of (T - 1, U)."""
    T, U = lp.shape[0], len(y)
    scores = []
    for emits in itertools.combinations(range(T - 1 + U), U):
        t = u = 0
        s = 0.0
        for step in range(T - 1 + U):
            if step in emits:
                s += lp[t, u, y[u]].item()
                u += 1
            else:
                s += lp[t, u, blank].item()
                t += 1
        s += lp[T - 1, U, blank].item()
        scores.append(s)
    return -torch.logsumexp(torch.tensor(scores, dtype=torch.float64), 0).item()


def _batch(seed, B, T, U, V, blank=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=dtype)
    tg = torch.randint(0, V - 1, (B, U), generator=g)
    tg = tg + (tg >= blank).long()  # never the blank
    il = torch.randint(1, T + 1, (B,), generator=g)
    il[0] = T
    tl = torch.randint(0, U + 1, (B,), generator=g)
    tl[0] = U
    return x, tg, il, tl


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T,U,blank", [(3, 2, 0), (2, 4, 3), (4, 0, 1), (1, 3, 2)])  # U > T included
def test_brute_force(impl, T, U, blank):
    x, tg, il, tl = _batch(T * 10 + U, 3, T, U, 5, blank)
    costs = rnnt_loss(x, tg, il, tl, blank=blank, reduction="none", impl=impl)
    lp = x.log_softmax(-1)
    for b in range(3):
        ref = _brute_cost(lp[b, : il[b], : tl[b] + 1], tg[b, : tl[b]].tolist(), blank)
        assert costs[b].item() == pytest.approx(ref, rel=1e-10, abs=1e-10)
    # not fused: the same values from log-probabilities
    costs_lp = rnnt_loss(lp, tg, il, tl, blank=blank, reduction="none", fused_log_softmax=False, impl=impl)
    torch.testing.assert_close(costs_lp, costs)


# ---------------------------------------------------------------------------
# gradients
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fused", [True, False])
def test_gradcheck_float64(impl, fused):
    x, tg, il, tl = _batch(7, 2, 3, 2, 4, blank=1)
    if not fused:
        x = x.log_softmax(-1)
    x.requires_grad_()
    for reduction in ("none", "mean"):
        assert torch.autograd.gradcheck(
            lambda z, r=reduction: rnnt_loss(z, tg, il, tl, 1, -1.0, r, fused, impl=impl),
            (x,),
            eps=1e-6,
            atol=1e-6,
            fast_mode=True,
        )


def test_non_fused_gradient_is_torchaudios():
    """fused_log_softmax=False: d cost / d log-prob of each arc (minus its posterior), 0 elsewhere."""
    x, tg, il, tl = _batch(9, 2, 4, 3, 5, blank=0)
    lp = x.log_softmax(-1).requires_grad_()
    rnnt_loss(lp, tg, il, tl, blank=0, reduction="sum", fused_log_softmax=False).backward()
    ref = lp.detach().clone().requires_grad_()
    rnnt_costs_torch(ref, tg, il, tl, 0, False).sum().backward()
    torch.testing.assert_close(lp.grad, ref.grad)
    assert (lp.grad <= 1e-12).all()  # only minus the arc posteriors


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("fused,clamp,lam", [(True, -1.0, 0.0), (True, 0.05, 0.5), (False, 0.2, 0.25)])
def test_numba_equals_torch(reduction, fused, clamp, lam):
    x, tg, il, tl = _batch(11, 4, 6, 4, 7, blank=6, dtype=torch.float32)
    if not fused:
        x = x.log_softmax(-1)
    out, grads = [], []
    for impl in IMPLS:
        z = x.clone().requires_grad_()
        loss = rnnt_loss(z, tg, il, tl, 6, clamp, reduction, fused, fastemit_lambda=lam, impl=impl)
        (loss.sum() if reduction == "none" else loss).backward()
        out.append(loss)
        grads.append(z.grad)
    torch.testing.assert_close(out[0], out[1])
    torch.testing.assert_close(grads[0], grads[1])
    assert grads[0].abs().sum() > 0


@pytest.mark.parametrize("impl", IMPLS)
def test_reductions(impl):
    x, tg, il, tl = _batch(12, 3, 4, 3, 5)
    grads = {}
    vals = {}
    for reduction in ("none", "mean", "sum"):
        z = x.clone().requires_grad_()
        vals[reduction] = rnnt_loss(z, tg, il, tl, blank=0, reduction=reduction, impl=impl)
        vals[reduction].sum().backward()
        grads[reduction] = z.grad
    # "mean" is the batch mean of the costs (torchaudio), not divided by target lengths
    torch.testing.assert_close(vals["mean"], vals["none"].mean())
    torch.testing.assert_close(vals["sum"], vals["none"].sum())
    torch.testing.assert_close(grads["mean"], grads["none"] / 3)
    torch.testing.assert_close(grads["sum"], grads["none"])
    # a weighted backward through "none" scales each example's gradient
    z = x.clone().requires_grad_()
    w = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    (rnnt_loss(z, tg, il, tl, blank=0, reduction="none", impl=impl) * w).sum().backward()
    torch.testing.assert_close(z.grad, grads["none"] * w.reshape(3, 1, 1, 1))


def test_blank_last_equals_blank_first_permuted():
    x, tg, il, tl = _batch(13, 3, 4, 3, 5, blank=0)
    perm = torch.tensor([1, 2, 3, 4, 0])  # class c of the blank-0 problem is class inv[c] here
    inv = torch.argsort(perm)
    x0 = x.clone().requires_grad_()
    x1 = x[..., perm].clone().requires_grad_()
    c0 = rnnt_loss(x0, tg, il, tl, blank=0, reduction="none")
    c1 = rnnt_loss(x1, inv[tg], il, tl, blank=-1, reduction="none")
    torch.testing.assert_close(c0, c1)
    c0.sum().backward()
    c1.sum().backward()
    torch.testing.assert_close(x1.grad, x0.grad[..., perm])


# ---------------------------------------------------------------------------
# lengths: zero frames, empty targets, U > T, zero_infinity
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_zero_frames_and_zero_infinity(impl):
    x, tg, il, tl = _batch(14, 3, 3, 2, 4)
    il = torch.tensor([3, 0, 2])
    for zi in (False, True):
        z = x.clone().requires_grad_()
        costs = rnnt_loss(z, tg, il, tl, blank=0, reduction="none", zero_infinity=zi, impl=impl)
        costs.sum().backward()
        assert costs[1].item() == (0.0 if zi else math.inf)
        assert torch.isfinite(costs[[0, 2]]).all()
        assert torch.isfinite(z.grad).all() and (z.grad[1] == 0).all()
        assert z.grad[0].abs().sum() > 0
    # a -inf blank log-probability at the last node makes an example infeasible too
    lp = x.log_softmax(-1)
    lp[0, il[0] - 1, tl[0], 0] = -math.inf
    z = lp.clone().requires_grad_()
    costs = rnnt_loss(z, tg, il, tl, blank=0, reduction="none", fused_log_softmax=False, impl=impl)
    costs.sum().backward()
    assert costs[0].item() == math.inf and (z.grad[0] == 0).all() and torch.isfinite(z.grad).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_targets_and_padding_gets_no_gradient(impl):
    x, tg, il, tl = _batch(15, 2, 4, 3, 5)
    il, tl = torch.tensor([4, 2]), torch.tensor([0, 1])
    z = x.clone().requires_grad_()
    costs = rnnt_loss(z, tg, il, tl, blank=0, reduction="none", impl=impl)
    costs.sum().backward()
    lp = x.log_softmax(-1)
    assert costs[0].item() == pytest.approx(-lp[0, :4, 0, 0].sum().item())  # blanks only
    assert (z.grad[0, :, 1:] == 0).all() and (z.grad[1, 2:] == 0).all() and (z.grad[1, :, 2:] == 0).all()


# ---------------------------------------------------------------------------
# NaN, dtypes, argument checks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_in_gives_nan_out(impl):
    x, tg, il, tl = _batch(16, 3, 4, 2, 5)
    il = torch.tensor([4, 3, 4])
    x[1, 1, 0, 3] = math.nan  # read by example 1
    x[2, 3, 2, 1] = math.nan if tl[2] < 2 else 0.0  # in example 2's padding when tl[2] < 2
    x[0, 3, 0, 2] = 0.0
    for clamp in (-1.0, 0.1):
        z = x.clone().requires_grad_()
        costs = rnnt_loss(z, tg, il, tl, blank=0, reduction="none", clamp=clamp, impl=impl)
        costs.sum().backward()
        assert math.isnan(costs[1].item()) and torch.isnan(z.grad[1, :3, : tl[1] + 1]).all()
        assert torch.isfinite(costs[[0, 2]]).all() and torch.isfinite(z.grad[[0, 2]]).all()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_minus_inf_logits_mask_a_class(impl, dtype):
    """A class whose logits are all -inf (masked) is the same as that class removed."""
    x, tg, il, tl = _batch(22, 2, 4, 3, 6, blank=0, dtype=dtype)
    tg = tg.clamp(max=4)  # class 5 is never a target
    masked = x.clone()
    masked[..., 5] = -math.inf
    a = masked.requires_grad_()
    b = x[..., :5].clone().requires_grad_()
    ca = rnnt_loss(a, tg, il, tl, blank=0, reduction="none", impl=impl)
    cb = rnnt_loss(b, tg, il, tl, blank=0, reduction="none", impl=impl)
    torch.testing.assert_close(ca, cb)
    ca.sum().backward()
    cb.sum().backward()
    assert (a.grad[..., 5] == 0).all()
    torch.testing.assert_close(a.grad[..., :5], b.grad)


def test_int32_int64_and_half():
    x, tg, il, tl = _batch(17, 2, 3, 2, 4, dtype=torch.float32)
    a = rnnt_loss(x, tg.int(), il.int(), tl.int(), blank=0)
    b = rnnt_loss(x, tg, il, tl, blank=0)
    torch.testing.assert_close(a, b)
    h = x.to(torch.bfloat16).requires_grad_()
    out = rnnt_loss(h, tg, il, tl, blank=0)
    out.backward()
    assert out.dtype == torch.bfloat16 and h.grad.dtype == torch.bfloat16


def _good():
    x, tg, il, tl = _batch(18, 2, 3, 2, 4, dtype=torch.float32)
    return dict(logits=x, targets=tg, logit_lengths=il, target_lengths=tl, blank=0)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(logits=torch.zeros(2, 3, 4)), r"logits must have shape \(B, T, U \+ 1, V\)"),
        (dict(logits=torch.zeros(2, 3, 3, 4, dtype=torch.long)), "floating point"),
        (dict(logits=[[0.0]]), "torch.Tensor"),
        (dict(targets=torch.zeros(2, 2)), "targets must be an int32 or int64"),
        (dict(targets=torch.zeros(3, 2, dtype=torch.long)), r"targets must have shape \(B, U\)"),
        (dict(targets=torch.zeros(2, dtype=torch.long)), r"targets must have shape \(B, U\)"),
        (dict(logit_lengths=torch.tensor([3, 4])), r"logit_lengths must lie in \[0, T\]"),
        (dict(logit_lengths=torch.tensor([3, -1])), r"logit_lengths must lie in \[0, T\]"),
        (dict(logit_lengths=torch.tensor([3.0, 2.0])), "logit_lengths must be an int32 or int64"),
        (dict(logit_lengths=torch.tensor([3])), r"logit_lengths must have shape \(B,\)"),
        (dict(target_lengths=torch.tensor([3, 1])), r"target_lengths must lie in \[0, U\]"),
        (dict(target_lengths=torch.tensor([-2, 1])), r"target_lengths must lie in \[0, U\]"),
        (dict(targets=torch.tensor([[1, 4], [1, 2]]), target_lengths=torch.tensor([2, 2])), "out of range"),
        (dict(targets=torch.tensor([[1, -1], [1, 2]]), target_lengths=torch.tensor([2, 2])), "out of range"),
        (dict(targets=torch.tensor([[1, 0], [1, 2]]), target_lengths=torch.tensor([2, 2])), "equal to blank"),
        (dict(targets=torch.tensor([[1], [1]]), target_lengths=torch.tensor([2, 1])), "target_lengths must be <= S"),
        (dict(blank=4), r"blank must lie in \[-V, V\)"),
        (dict(blank=-5), r"blank must lie in \[-V, V\)"),
        (dict(blank=1.0), "blank must be an integer"),
        (dict(blank=True), "blank must be an integer"),
        (dict(reduction="avg"), "reduction must be one of"),
        (dict(impl="gtn"), "impl must be None or one of"),
        (dict(clamp=float("nan")), "clamp must be finite"),
        (dict(fastemit_lambda=-0.5), "fastemit_lambda must be >= 0"),
        (dict(fused_log_softmax=1), "fused_log_softmax must be a bool"),
    ],
)
def test_bad_inputs(change, match):
    args = _good()
    args.update(change)
    with pytest.raises(ValueError, match=match):
        rnnt_loss(**args)


def test_u_larger_than_t_and_torch_compile():
    x, tg, il, tl = _batch(19, 2, 2, 5, 6, dtype=torch.float32)  # U = 5 > T = 2 is legal
    lin = torch.nn.Linear(6, 6).double().float()

    def step(z):
        return rnnt_loss(lin(z), tg, il, tl, blank=0)

    eager = step(x)
    eager.backward()
    g_eager = lin.weight.grad.clone()
    lin.weight.grad = None
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(x)  # dynamo + fake op + autograd
    compiled.backward()
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(lin.weight.grad, g_eager)
    assert torch.isfinite(eager)


def test_opcheck():
    """The custom op's schema, fake implementation and autograd registration (torch.library.opcheck)."""
    from lightning_gtn.losses.rnnt import rnnt_loss_op

    x = torch.randn(2, 4, 3, 5, requires_grad=True)
    args = (x, torch.tensor([[1, 2], [3, 0]]), torch.tensor([4, 3]), torch.tensor([2, 1]), 0, -1.0, "mean")
    torch.library.opcheck(rnnt_loss_op, args + (True, False, 0.0, "numba", True))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_inplace_grad(impl, reduction):
    x, tg, il, tl = _batch(20, 3, 4, 3, 5, dtype=torch.float32)
    a = x.clone().requires_grad_()
    la = rnnt_loss(a, tg, il, tl, blank=0, reduction=reduction, clamp=0.3, impl=impl)
    (la.sum() * 2).backward()
    b = x.clone().requires_grad_()
    lb = rnnt_loss(b, tg, il, tl, blank=0, reduction=reduction, clamp=0.3, impl=impl, inplace_grad=True)
    torch.testing.assert_close(lb, la)
    assert not torch.equal(b.detach(), x)  # the logits were overwritten (by the gradient)
    (lb.sum() * 2).backward()
    torch.testing.assert_close(b.grad, a.grad)
    if impl == "numba":
        assert b.grad.data_ptr() == b.data_ptr()  # no second (B, T, U + 1, V) buffer


# ---------------------------------------------------------------------------
# nn.RNNTLoss
# ---------------------------------------------------------------------------


def test_module():
    x, tg, il, tl = _batch(21, 2, 3, 2, 5)
    m = lnn.RNNTLoss(blank=-1, clamp=0.5, reduction="sum", fastemit_lambda=0.1)
    assert isinstance(m, lnn.RNNTStructuredLoss) and m.topology == "rnnt" and m.blank == -1
    tg4 = tg.clamp(max=3)
    torch.testing.assert_close(m(x, tg4, il, tl), rnnt_loss(x, tg4, il, tl, -1, 0.5, "sum", fastemit_lambda=0.1))
    assert lnn.RNNTLoss(blank=0).blank == 0
    built = trust.instantiate({"_target_": "lightning_gtn.nn.RNNTLoss", "blank": 0}, "loss", "loss")
    assert isinstance(built, lnn.RNNTLoss) and built.blank == 0  # on the checkpoint allow-list
    with pytest.raises(ValueError, match="joint_loss needs the blank"):
        m.joint_loss(None, x, il, tg, tl)
    for bad in (dict(reduction="x"), dict(impl="gtn"), dict(blank=0.5), dict(fastemit_lambda=-1.0)):
        with pytest.raises(ValueError):
            lnn.RNNTLoss(**bad)


# ---------------------------------------------------------------------------
# fuzz: malformed inputs raise ValueError, nothing else (in process: every index the kernel
# reads is range-checked in Python first; tests/losses/test_fuzz.py runs the other losses in a child)
# ---------------------------------------------------------------------------


def test_fuzz_malformed_inputs():
    """Random shapes, dtypes, lengths, ids, blanks, options, NaN/inf: a result or a ValueError."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    odd = st.sampled_from([-1, -(2**31), 2**31, 2**40, 2**63 - 1])

    @st.composite
    def case(draw):
        B, T, U, V = draw(st.integers(0, 3)), draw(st.integers(0, 4)), draw(st.integers(0, 3)), draw(st.integers(1, 4))
        shape = draw(st.one_of(st.just((B, T, U + 1, V)), st.lists(st.integers(0, 3), max_size=5).map(tuple)))
        dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.int64]))
        x = torch.randn(shape).to(dtype) if dtype != torch.int64 else torch.randint(0, 3, shape)
        if draw(st.booleans()) and x.numel() and x.is_floating_point():
            x.view(-1)[draw(st.integers(0, x.numel() - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        if draw(st.booleans()) and x.is_floating_point():
            x.requires_grad_(True)

        def ints(shape_, lo, hi):
            return draw(
                st.one_of(
                    st.lists(st.integers(lo, hi), min_size=math.prod(shape_), max_size=math.prod(shape_)).map(
                        lambda v: torch.tensor(v, dtype=torch.long).reshape(shape_)
                    ),
                    st.lists(
                        st.one_of(st.integers(lo - 3, hi + 3), odd),
                        min_size=math.prod(shape_),
                        max_size=math.prod(shape_),
                    ).map(lambda v: torch.tensor(v).reshape(shape_)),
                    st.just(torch.rand(shape_)),
                    st.lists(st.integers(0, 3), max_size=3).map(torch.tensor),
                    st.none(),
                    st.just("x"),
                )
            )

        return dict(
            logits=x,
            targets=ints((B, U), 0, V - 1),
            logit_lengths=ints((B,), 0, T),
            target_lengths=ints((B,), 0, U),
            blank=draw(st.one_of(st.integers(-V - 1, V), odd, st.none(), st.just(0.5))),
            clamp=draw(st.sampled_from([-1.0, 0.5, math.nan, "a"])),
            reduction=draw(st.sampled_from(["mean", "sum", "none", "avg"])),
            fused_log_softmax=draw(st.sampled_from([True, False, 1])),
            zero_infinity=draw(st.booleans()),
            fastemit_lambda=draw(st.sampled_from([0.0, 0.3, -1.0])),
            impl=draw(st.sampled_from([None, "numba", "torch", "triton"])),
            inplace_grad=draw(st.booleans()),
        )

    cfg = settings(
        max_examples=25, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )

    @cfg
    @given(case())
    def run(args):
        try:
            out = rnnt_loss(**args)
        except ValueError:
            return
        if out.requires_grad:
            out.sum().backward()

    run()
