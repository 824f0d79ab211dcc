"""The dedicated CTC kernel (``impl="numba_ctc"``, the CPU default) against the criterion-graph
path, torch's ctc_loss, brute force, and itself one example at a time."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_gtn.core import criterion
from lightning_gtn.functional import ctc_loss
from lightning_gtn.kernels import ctc_numba

from ..losses._brute import ctc_ref


def _ragged(seed, B, T, C, S, dtype=torch.float64, scale=2.0):
    """Random scores, ragged lengths (row 0 full), targets with repeats (labels in [1, 3))."""
    g = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(B, T, C, generator=g, dtype=dtype)
    il = torch.randint(0, T + 1, (B,), generator=g)
    il[0] = T
    tl = torch.randint(0, S + 1, (B,), generator=g)
    tg = torch.randint(1, min(C, 3), (B, S), generator=g)  # few labels: many repeats
    return x, tg, il, tl


def _grad(loss, x, B):
    w = torch.linspace(0.5, 1.5, B, dtype=loss.dtype) if loss.dim() else torch.tensor(1.0, dtype=loss.dtype)
    (g,) = torch.autograd.grad((loss * w).sum(), x)
    return g


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_the_graph_path(reduction, zero_infinity, dtype):
    # ragged lengths, T = 0 rows, S = 0 rows, repeated labels, infeasible rows (short inputs)
    B, T, C, S = 7, 30, 5, 12
    x, tg, il, tl = _ragged(1, B, T, C, S, dtype)
    il[1], tl[2], il[3], tl[3] = 0, 0, 4, 9  # T = 0; S = 0; infeasible
    lp = x.log_softmax(-1).requires_grad_(True)
    ours = ctc_loss(lp, tg, il, tl, reduction=reduction, zero_infinity=zero_infinity, impl="numba_ctc")
    g_ours = _grad(ours, lp, B)
    for impl in ("numba", "numba_log"):
        ref = ctc_loss(lp, tg, il, tl, reduction=reduction, zero_infinity=zero_infinity, impl=impl)
        assert ours.dtype == ref.dtype == dtype
        tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
        torch.testing.assert_close(ours, ref, **tol)
        if zero_infinity or reduction == "none":
            torch.testing.assert_close(g_ours, _grad(ref, lp, B), **tol)
    if reduction == "none":
        assert math.isinf(ours[3].item()) != zero_infinity
        assert ours[1].item() == math.inf or zero_infinity  # T = 0 with a target: no path
        assert (g_ours[3] == 0).all() and (g_ours[0, :, 0] != 0).any()


def test_concatenated_targets_equal_padded():
    B, T, C, S = 5, 25, 6, 8
    x, tg, il, tl = _ragged(2, B, T, C, S)
    flat = torch.cat([tg[b, : tl[b]] for b in range(B)])
    lp = x.log_softmax(-1).requires_grad_(True)
    a = ctc_loss(lp, tg, il, tl, reduction="none", zero_infinity=True)
    b = ctc_loss(lp, flat, il, tl, reduction="none", zero_infinity=True)
    c = ctc_loss(lp, [tg[b, : tl[b]].tolist() for b in range(B)], il, tl, reduction="none", zero_infinity=True)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, c)
    torch.testing.assert_close(_grad(a, lp, B), _grad(b, lp, B))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_torch_ctc_loss(seed):
    B, T, C, S = 6, 40, 7, 15
    x, tg, il, tl = _ragged(seed, B, T, C, S)
    tg = torch.randint(1, C, (B, S), generator=torch.Generator().manual_seed(seed))
    x.requires_grad_(True)
    ours = ctc_loss(x.log_softmax(-1), tg, il, tl, reduction="none", zero_infinity=True)
    ref = TF.ctc_loss(x.log_softmax(-1).transpose(0, 1), tg, il, tl, reduction="none", zero_infinity=True)
    torch.testing.assert_close(ours, ref)
    # torch's gradient is in logit space: compare both through log_softmax
    torch.testing.assert_close(_grad(ours, x, B), _grad(ref, x, B))
    m_ours = ctc_loss(x.log_softmax(-1), tg, il, tl, zero_infinity=True)
    m_ref = TF.ctc_loss(x.log_softmax(-1).transpose(0, 1), tg, il, tl, zero_infinity=True)
    torch.testing.assert_close(m_ours, m_ref)


def test_brute_force_on_raw_scores():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    targets = [[1, 2], [2, 2], [], [1, 1, 2]]
    il = [5, 5, 3, 5]
    flat = torch.tensor([v for t in targets for v in t])
    ours = ctc_loss(x, flat, il, [len(t) for t in targets], reduction="none", impl="numba_ctc")
    ref = torch.stack([ctc_ref(x[b, : il[b]], targets[b]) for b in range(4)])
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(torch.autograd.grad(ours.sum(), x)[0], torch.autograd.grad(ref.sum(), x)[0])


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    tg = torch.tensor([[1, 2, 2], [3, 1, 0], [2, 0, 0]])

    def f(inp):
        return ctc_loss(inp, tg, [6, 5, 0], [3, 2, 0], reduction="none", impl="numba_ctc")

    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradcheck(lambda inp: ctc_loss(inp, tg, [6, 5, 3], [3, 2, 1], impl="numba_ctc"), (x,))


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_nan_in_nan_out(zero_infinity):
    x = torch.randn(3, 8, 5).log_softmax(-1)
    x[0, 2, 4] = float("nan")  # within row 0's length: NaN loss and gradient row
    x[1, 7, 1] = float("nan")  # past row 1's length (6): not read
    lp = x.requires_grad_(True)
    tg = torch.tensor([[1, 2], [1, 2], [3, 3]])
    loss = ctc_loss(lp, tg, [8, 6, 8], [2, 2, 2], reduction="none", zero_infinity=zero_infinity)
    assert math.isnan(loss[0].item()) and torch.isfinite(loss[1:]).all()
    (g,) = torch.autograd.grad(loss.nan_to_num(0.0).sum() + loss[0], lp)
    assert torch.isnan(g[0]).all() and torch.isfinite(g[1:]).all()
    mean = ctc_loss(lp, tg, [8, 6, 8], [2, 2, 2], zero_infinity=zero_infinity)
    assert math.isnan(mean.item())
    # an infeasible row (3 frames, a target that needs 4) that reads a NaN is NaN, not inf or 0;
    # the same row without the NaN in its frames is infinite (or 0 under zero_infinity)
    rows = ctc_loss(
        lp[:2], torch.tensor([[1, 1, 2], [1, 1, 2]]), [3, 3], [3, 3], reduction="none", zero_infinity=zero_infinity
    )
    assert math.isnan(rows[0].item())
    assert rows[1].item() == (0.0 if zero_infinity else math.inf)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_scored_in_float32(dtype):
    x, tg, il, tl = _ragged(5, 4, 20, 6, 5, torch.float32)
    lp = x.log_softmax(-1).to(dtype).requires_grad_(True)
    ours = ctc_loss(lp, tg, il, tl, reduction="none", zero_infinity=True)
    assert ours.dtype == dtype
    ref = ctc_loss(lp.detach().float(), tg, il, tl, reduction="none", zero_infinity=True)
    torch.testing.assert_close(ours, ref.to(dtype))
    (g,) = torch.autograd.grad(ours.float().sum(), lp)
    assert g.dtype == dtype


def test_long_peaky_input_stays_exact():
    # a confident all-blank model: far-apart magnitudes; the result must match the log domain
    T, C, L = 150, 6, 40
    g = torch.Generator().manual_seed(6)
    x = torch.full((2, T, C), -300.0, dtype=torch.float64)
    x[:, :, 0] = 0.0
    x = (x + 0.1 * torch.randn(2, T, C, generator=g, dtype=torch.float64)).log_softmax(-1).requires_grad_(True)
    tg = torch.randint(1, C, (2, L), generator=g)
    il, tl = torch.tensor([T, T - 7]), torch.tensor([L, L - 3])
    ours = ctc_loss(x, tg, il, tl, reduction="none", impl="numba_ctc")
    ref = ctc_loss(x, tg, il, tl, reduction="none", impl="numba_log")
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(_grad(ours, x, 2), _grad(ref, x, 2))


def test_scaled_pass_refuses_what_underflows_and_the_log_domain_takes_over():
    # one segment spanning all states (W = S) cannot hold these magnitudes: the occupancy check
    # fails, and the log-domain pass gives the exact answer
    T, C, L = 200, 4, 60
    g = torch.Generator().manual_seed(7)
    x = torch.full((1, T, C), -700.0, dtype=torch.float64)
    x[:, :, 0] = 0.0
    x = x + torch.randn(1, T, C, generator=g, dtype=torch.float64)
    labels = torch.randint(1, C, (L,), generator=g).numpy()
    E = x.numpy()
    gE = np.zeros_like(E)
    S = 2 * L + 1
    work = np.empty(T * S), np.empty(T * (L + 1)), np.empty(T)
    ok, _ = ctc_numba._scaled(0, T, L, 0, E, labels, 0, np.ones(1), True, gE, ctc_numba.OCCUPANCY_TOL, S, *work)
    assert not ok and not gE.any()  # nothing written when the pass fails
    loss = ctc_numba._log_domain(0, T, L, 0, E, labels, 0, np.ones(1), True, gE)
    ref = ctc_loss(x, torch.from_numpy(labels)[None], [T], [L], reduction="none", impl="numba_log")
    assert abs(loss - ref.item()) <= 1e-9 * abs(ref.item())


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 5), st.integers(0, 12), st.integers(2, 5), st.integers(0, 5), st.integers(0, 10_000))
def test_batched_equals_one_by_one(B, T, C, S, seed):
    x, tg, il, tl = _ragged(seed, B, T, C, S)
    x.requires_grad_(True)
    full = ctc_loss(x, tg, il, tl, reduction="none")
    (gfull,) = torch.autograd.grad(full.nan_to_num(0.0, 0.0).sum(), x)
    for b in range(B):
        xb = x[b : b + 1, : int(il[b])]
        one = ctc_loss(xb, tg[b : b + 1], il[b : b + 1], tl[b : b + 1], reduction="none")
        torch.testing.assert_close(full[b : b + 1], one)
        (gb,) = torch.autograd.grad(one.nan_to_num(0.0, 0.0).sum(), x)
        torch.testing.assert_close(gfull[b], gb[b])


def test_threads_split_the_batch(monkeypatch):
    monkeypatch.setattr(ctc_numba, "PARALLEL_MIN_WORK", 0)  # every batch shared over the pool
    x, tg, il, tl = _ragged(8, 9, 30, 5, 10)
    x.requires_grad_(True)
    a = ctc_loss(x, tg, il, tl, reduction="none", zero_infinity=True)
    monkeypatch.setattr(ctc_numba, "PARALLEL_MIN_WORK", 10**18)
    b = ctc_loss(x, tg, il, tl, reduction="none", zero_infinity=True)
    assert torch.equal(a, b)


def test_kernel_checks_every_index():
    E = torch.zeros(2, 4, 3)
    ok = dict(
        labels=np.array([1, 2, 1], dtype=np.int64),
        offsets=np.array([0, 2], dtype=np.int64),
        target_lengths=np.array([2, 1], dtype=np.int64),
        input_lengths=np.array([4, 3], dtype=np.int64),
        blank=0,
    )
    ctc_numba.check_ctc_arrays(E, **ok)
    bad = [
        {"labels": np.array([1, 3, 1], dtype=np.int64)},  # label >= C
        {"labels": np.array([1, 0, 1], dtype=np.int64)},  # the blank
        {"offsets": np.array([0, 3], dtype=np.int64)},  # past the labels
        {"target_lengths": np.array([-1, 1], dtype=np.int64)},
        {"input_lengths": np.array([5, 3], dtype=np.int64)},  # > T
        {"input_lengths": np.array([4, 3], dtype=np.int32)},  # not int64
        {"blank": 3},
    ]
    for change in bad:
        with pytest.raises(ValueError, match="ctc kernel"):
            ctc_numba.check_ctc_arrays(E, **{**ok, **change})
    with pytest.raises(ValueError, match="ctc kernel"):  # padded rows: lengths within the row
        ctc_numba.check_ctc_arrays(E, **{**ok, "target_lengths": np.array([3, 0], dtype=np.int64)}, stride=2)


def test_op_called_directly_checks_its_values():
    x = torch.randn(2, 5, 4).log_softmax(-1)
    op = criterion.kernel_loss_op
    tg, il, tl = torch.tensor([[1, 2], [3, 0]]), torch.tensor([5, 4]), torch.tensor([2, 1])
    out, _ = op(x, tg, il, tl, "ctc", 0, 0, "none", False, "numba_ctc", False)
    torch.testing.assert_close(out, ctc_loss(x, tg, il, tl, reduction="none", impl="numba"))
    with pytest.raises(ValueError, match="label 7 out of range"):
        op(x, torch.tensor([[1, 7], [3, 0]]), il, tl, "ctc", 0, 0, "none", False, "numba_ctc", False)
    with pytest.raises(ValueError, match="input_lengths must be <= T"):
        op(x, tg, torch.tensor([6, 4]), tl, "ctc", 0, 0, "none", False, "numba_ctc", False)
    with pytest.raises(ValueError, match="target_lengths must be <= S"):
        op(x, tg, il, torch.tensor([3, 1]), "ctc", 0, 0, "none", False, "numba_ctc", False)
    with pytest.raises(ValueError, match="not one of its own kernels"):
        op(x, tg, il, tl, "ctc", 0, 0, "none", False, "numba", False)
    with pytest.raises(ValueError, match="blank"):
        op(x, tg, il, tl, "ctc", 0, 9, "none", False, "numba_ctc", False)


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_opcheck_kernel_loss(reduction):
    x = torch.randn(2, 6, 4, dtype=torch.float64).log_softmax(-1).requires_grad_(True)
    args = (x, torch.tensor([[1, 2], [3, 0]]), torch.tensor([6, 4]), torch.tensor([2, 1]), "ctc", 0, 0)
    torch.library.opcheck(criterion.kernel_loss_op, args + (reduction, False, "numba_ctc", True))


def test_compiled_fullgraph_equals_eager():
    x = torch.randn(3, 10, 5, dtype=torch.float64)
    tg, il, tl = torch.tensor([[1, 2, 2], [3, 4, 0], [2, 0, 0]]), torch.tensor([10, 8, 5]), torch.tensor([3, 2, 1])

    def step(inp):
        return ctc_loss(inp.log_softmax(-1), tg, il, tl)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    a = x.clone().requires_grad_(True)
    b = x.clone().requires_grad_(True)
    la, lb = compiled(a), step(b)
    la.backward()
    lb.backward()
    torch.testing.assert_close(la, lb)
    torch.testing.assert_close(a.grad, b.grad)


def test_impl_names():
    x = torch.randn(1, 4, 3).log_softmax(-1)
    with pytest.raises(ValueError, match="needs CPU tensors"):
        ctc_loss(x.to("meta"), torch.tensor([[1]]), [4], [1], impl="numba_ctc")
    from lightning_gtn.functional import sequence_loss

    with pytest.raises(ValueError, match="not available"):
        sequence_loss(x, [[1]], [4], impl="numba_ctc")


def test_backward_scales_and_accumulates():
    x, tg, il, tl = _ragged(9, 3, 12, 5, 4)
    lp = x.log_softmax(-1).detach().requires_grad_(True)
    loss = ctc_loss(lp, tg, il, tl, zero_infinity=True)
    (g1,) = torch.autograd.grad(loss, lp, retain_graph=True)
    (g3,) = torch.autograd.grad(3.0 * loss, lp, retain_graph=True)
    torch.testing.assert_close(g3, 3.0 * g1)
    loss.backward(retain_graph=True)
    loss.backward()  # a second backward accumulates: the saved gradient was not changed
    torch.testing.assert_close(lp.grad, 2.0 * g1)
    assert g1.abs().sum() > 0
