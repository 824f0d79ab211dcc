"""ASG's fully connected normaliser (dense_torch: the numba recursion and the matrix products)
against brute force, the arc-by-arc graph kernels, and through asg_loss against the all-graph
path. Every test of the normaliser runs on both implementations."""

import itertools

import numpy as np
import pytest
import torch

from lightning_gtn.core import dispatch, scoring
from lightning_gtn.core.criterion_graphs import compiled_asg_full
from lightning_gtn.functional import asg_loss
from lightning_gtn.kernels import dense_torch
from lightning_gtn.kernels.dense_torch import asg_full_scores
from tests.losses._brute import asg_path_score, lse


@pytest.fixture(autouse=True, params=["numba", "torch"])
def dense_impl(request, monkeypatch):
    """Each test once per implementation of the dense recursion on the CPU."""
    monkeypatch.setattr(dense_torch, "NUMBA_MAX_CLASSES", 10**9 if request.param == "numba" else -1)
    return request.param


def _threshold(monkeypatch, value):
    """Dense normaliser from ``value`` classes on (0: always, 10**9: never), on every device."""
    monkeypatch.setattr(dense_torch, "DENSE_MIN_CLASSES", value)
    monkeypatch.setattr(dense_torch, "CPU_DENSE_MIN_CLASSES", value)


def _graph_full_scores(x, tr, lengths):
    """log Z, d(sum log Z)/dx and /dtr of the full graph with the arc-by-arc numba kernels."""
    B, T, C = x.shape
    plan = scoring.Plan([compiled_asg_full(C)], np.zeros(B, np.int64), np.arange(B), lengths, np.ones(B), B)
    widx = torch.from_numpy(plan.batch.weight_index())
    st = dispatch.forward(plan.problem, x.contiguous(), tr.reshape(-1)[widx].contiguous(), "numba")
    gE, gw = dispatch.backward(st, torch.ones(B, dtype=x.dtype), True, True)
    gT = torch.zeros((C + 1) * C, dtype=x.dtype).index_add_(0, widx, gw).reshape(C + 1, C)
    return st.logz, gE, gT


def _inputs(B, T, C, seed=0, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g, dtype=dtype) * scale
    tr = torch.randn(C + 1, C, generator=g, dtype=dtype) * scale
    return x, tr


def test_brute_force_values_and_grads():
    C, T = 3, 4
    x, tr = _inputs(2, T, C)
    lengths = np.array([4, 2])
    logz, gE, gT = asg_full_scores(x, tr, lengths, True)
    xr, trr = x.clone().requires_grad_(True), tr.clone().requires_grad_(True)
    ref = torch.stack(
        [
            lse(
                [
                    asg_path_score(xr[b, : lengths[b]], trr, p)
                    for p in itertools.product(range(C), repeat=int(lengths[b]))
                ],
                xr,
            )
            for b in range(2)
        ]
    )
    torch.testing.assert_close(logz, ref.detach())
    rE, rT = torch.autograd.grad(ref.sum(), (xr, trr))
    torch.testing.assert_close(gE, rE)
    torch.testing.assert_close(gT, rT)


@pytest.mark.parametrize("C", [1, 5, 40])
def test_matches_graph_kernels_with_ragged_and_empty_lengths(C):
    x, tr = _inputs(4, 9, C, seed=C)
    lengths = torch.tensor([9, 1, 0, 6])
    logz, gE, gT = asg_full_scores(x, tr, lengths, True)
    rz, rE, rT = _graph_full_scores(x, tr, lengths.numpy())
    assert logz[2] == -float("inf") and rz[2] == -float("inf")  # no path through 0 frames
    torch.testing.assert_close(logz, rz)
    torch.testing.assert_close(gE, rE)
    torch.testing.assert_close(gT, rT)
    assert gE[1, 1:].abs().sum() == 0 and gE[2].abs().sum() == 0  # nothing past each length
    torch.testing.assert_close(gE[:, :, :].sum(2)[0], torch.ones(9, dtype=x.dtype))  # one label per frame
    z, none_e, none_t = asg_full_scores(x, tr, lengths, False)
    assert none_e is None and none_t is None
    torch.testing.assert_close(z, logz)


def test_float32_large_scores_stay_accurate():
    # wide score ranges: the per-frame and per-row scales must keep every term in range
    x, tr = _inputs(2, 30, 300, seed=3, scale=20.0)
    lengths = [30, 17]
    logz, gE, gT = asg_full_scores(x.float(), tr.float(), lengths, True)
    rz, rE, rT = asg_full_scores(x, tr, lengths, True)
    rz2, _, _ = _graph_full_scores(x, tr, np.array(lengths))
    torch.testing.assert_close(rz, rz2)
    assert logz.dtype == torch.float32 and torch.isfinite(logz).all()
    torch.testing.assert_close(logz.double(), rz, rtol=1e-5, atol=1e-3)
    assert (gE.double() - rE).abs().max() < 1e-4
    assert (gT.double() - rT).abs().max() < 1e-4


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_gradcheck_of_asg_loss_on_the_dense_path(monkeypatch, reduction):
    _threshold(monkeypatch, 0)
    x, tr = _inputs(2, 5, 4, seed=5)
    x.requires_grad_(True)
    tr.requires_grad_(True)
    f = lambda a, b: asg_loss(a, [[1, 2], [3]], [5, 3], transitions=b, reduction=reduction)
    assert torch.autograd.gradcheck(f, (x, tr))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_asg_loss_dense_normaliser_matches_graph_path(monkeypatch, reduction, zero_infinity):
    C = 6
    x, tr = _inputs(5, 7, C, seed=11)
    targets = [[0, 1, 1], [5], [2, 3, 4, 2, 3, 4, 1, 0], [], [3, 3]]  # the third is too long
    lengths = [7, 4, 7, 0, 0]

    def run(threshold):
        _threshold(monkeypatch, threshold)
        xa, ta = x.clone().requires_grad_(True), tr.clone().requires_grad_(True)
        loss = asg_loss(
            xa, transitions=ta, targets=targets, input_lengths=lengths, reduction=reduction, zero_infinity=zero_infinity
        )
        fin = loss[torch.isfinite(loss)].sum() if reduction == "none" else loss
        if not torch.isfinite(fin):
            return loss, None
        return loss, torch.autograd.grad(fin * 1.5, (xa, ta))

    a, ga = run(0)
    b, gb = run(10**9)
    torch.testing.assert_close(a, b)
    if ga is None:
        assert gb is None
    else:
        for u, v in zip(ga, gb):
            torch.testing.assert_close(u, v)


def test_asg_loss_large_alphabet_float32_against_graph_path_in_float64(monkeypatch):
    C = 150
    x, tr = _inputs(2, 12, C, seed=2)
    tg = [[1, 149, 7], [0, 0, 3, 4]]
    ls = []
    for threshold, dtype in ((0, torch.float32), (10**9, torch.float64)):
        _threshold(monkeypatch, threshold)
        xa = x.to(dtype).requires_grad_(True)
        ta = tr.to(dtype).requires_grad_(True)
        loss = asg_loss(xa, transitions=ta, targets=tg, input_lengths=[12, 9], reduction="sum")
        ls.append((loss.double(), *[g.double() for g in torch.autograd.grad(loss, (xa, ta))]))
    for u, v in zip(*ls):
        assert (u - v).abs().max() < 1e-4


def test_dead_frames_and_dead_rows():
    # a frame where every label is -inf leaves no path (log Z = -inf, no gradient); a row of -inf
    # transitions makes its label unreachable after the first frame (not NaN)
    C = 4
    x, tr = _inputs(3, 6, C, seed=7)
    x[1, 3] = -float("inf")
    tr[1 + 2] = -float("inf")  # label 2 after anything
    lengths = torch.tensor([6, 6, 3])
    logz, gE, gT = asg_full_scores(x, tr, lengths, True)
    rz, rE, rT = _graph_full_scores(x, tr, lengths.numpy())
    assert logz[1] == -float("inf") and rz[1] == -float("inf")
    torch.testing.assert_close(logz[[0, 2]], rz[[0, 2]])
    assert torch.isfinite(gE).all() and torch.isfinite(gT).all()
    torch.testing.assert_close(gE[[0, 2]], rE[[0, 2]])
    assert gE[1].abs().sum() == 0
    assert gE[0, 1:, 2].abs().max() == 0  # label 2 only at frame 0


def test_nan_emissions_give_nan_not_a_crash():
    x, tr = _inputs(2, 5, 3, seed=1)
    x[0, 2, 1] = float("nan")
    logz, gE, gT = asg_full_scores(x, tr, [5, 5], True)
    assert torch.isnan(logz[0]) and torch.isfinite(logz[1])


def test_lengths_out_of_range_are_refused(dense_impl):
    x, tr = _inputs(2, 5, 3)
    if dense_impl == "numba":  # the kernel indexes frames by the lengths
        with pytest.raises(ValueError, match="lengths"):
            asg_full_scores(x, tr, [6, 5], True)
        with pytest.raises(ValueError, match="lengths"):
            asg_full_scores(x, tr, [-1, 5], True)
