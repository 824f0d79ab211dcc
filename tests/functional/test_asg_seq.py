"""asg_loss and sequence_loss against brute-force enumeration, the engine, and themselves."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lightning_gtn.wfst as gtn
from lightning_gtn.functional import asg_loss, asg_target_graph, force_align_graph, sequence_loss

from ._brute import asg_ref, seq_ref

IMPLS = ["numba", "numba_log", "torch"]
TARGETS = [[0, 1], [2], [1, 1, 0], []]
LENS = [4, 3, 4, 0]


def _inputs(seed=0, B=4, T=4, C=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g, dtype=torch.float64, requires_grad=True)
    tr = torch.randn(C + 1, C, generator=g, dtype=torch.float64, requires_grad=True)
    return x, tr


@pytest.mark.parametrize("impl", IMPLS)
def test_asg_brute_force_values_and_grads(impl):
    x, tr = _inputs()
    B = 3  # the brute force needs T >= 1 for the full graph
    ours = asg_loss(x[:B], TARGETS[:B], LENS[:B], transitions=tr, reduction="none", impl=impl)
    ref = torch.stack([asg_ref(x[b, : LENS[b]], tr, TARGETS[b]) for b in range(B)])
    torch.testing.assert_close(ours, ref)
    g1 = torch.autograd.grad(ours.sum(), (x, tr))
    g2 = torch.autograd.grad(ref.sum(), (x, tr))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("impl", IMPLS)
def test_sequence_brute_force_values_and_grads(impl):
    x, _ = _inputs(1)
    ours = sequence_loss(x, TARGETS, LENS, reduction="none", impl=impl)
    ref = torch.stack([seq_ref(x[b, : LENS[b]], TARGETS[b]) for b in range(4)])
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(torch.autograd.grad(ours.sum(), x)[0], torch.autograd.grad(ref.sum(), x)[0])


def test_sequence_loss_is_nll_under_frame_softmax():
    x, _ = _inputs(2)
    a = sequence_loss(x, TARGETS, LENS, reduction="none")
    b = sequence_loss(x.log_softmax(-1), TARGETS, LENS, reduction="none")
    torch.testing.assert_close(a, b)


def test_asg_against_engine_graphs():
    x, tr = _inputs(3, B=1, T=5, C=3)
    target = [2, 0, 0]
    ours = asg_loss(x, [target], [5], transitions=tr, reduction="none").item()
    em = gtn.linear_graph(5, 3, calc_grad=False)
    em.set_weights(x[0].detach().float().contiguous().numpy())
    full_g, widx = __import__("lightning_gtn.functional", fromlist=["asg_full_graph"]).asg_full_graph(3)
    full_g.set_weights(tr.detach().float().reshape(-1)[torch.from_numpy(widx)].numpy())
    tg_g, tidx = asg_target_graph(target, 3)
    tg_g.set_weights(tr.detach().float().reshape(-1)[torch.from_numpy(tidx)].numpy())
    ref = gtn.forward_score(gtn.intersect(full_g, em)).item() - gtn.forward_score(gtn.intersect(tg_g, em)).item()
    assert abs(ours - ref) < 1e-4


def test_sequence_against_engine_graphs():
    x, _ = _inputs(4, B=1, T=6, C=4)
    target = [1, 3]
    ours = sequence_loss(x, [target], [6], reduction="none").item()
    em = gtn.linear_graph(6, 4, calc_grad=False)
    em.set_weights(x[0].detach().float().contiguous().numpy())
    ref = gtn.forward_score(em).item() - gtn.forward_score(gtn.intersect(force_align_graph(target), em)).item()
    assert abs(ours - ref) < 1e-4


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_reductions(reduction):
    x, tr = _inputs(5)
    none = asg_loss(x[:3], TARGETS[:3], LENS[:3], transitions=tr, reduction="none")
    red = asg_loss(x[:3], TARGETS[:3], LENS[:3], transitions=tr, reduction=reduction)
    lens = torch.tensor([max(len(t), 1) for t in TARGETS[:3]], dtype=torch.float64)
    expected = none.sum() if reduction == "sum" else (none / lens).mean()
    torch.testing.assert_close(red, expected)


def test_infeasible_and_zero_infinity():
    x, tr = _inputs(6)
    loss = asg_loss(x[:2], [[0, 1, 2, 0, 1], [1]], [4, 3], transitions=tr, reduction="none")
    assert math.isinf(loss[0].item()) and math.isfinite(loss[1].item())
    z = sequence_loss(x[:2], [[0, 1, 2, 0, 1], [1]], [4, 3], reduction="none", zero_infinity=True)
    assert z[0].item() == 0.0
    (g,) = torch.autograd.grad(z.sum(), x)
    assert torch.all(g[0] == 0) and torch.any(g[1] != 0)


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 4), st.integers(1, 8), st.integers(1, 4), st.integers(0, 10_000))
def test_batched_equals_one_by_one(B, T, C, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    tr = torch.randn(C + 1, C, generator=g, dtype=torch.float64)
    lens = torch.randint(1, T + 1, (B,), generator=g).tolist()
    targets = [
        torch.randint(0, C, (int(torch.randint(0, l + 1, (1,), generator=g)),), generator=g).tolist() for l in lens
    ]
    full = asg_loss(x, targets, lens, transitions=tr, reduction="none")
    seq = sequence_loss(x, targets, lens, reduction="none")
    for b in range(B):
        one = asg_loss(x[b : b + 1], [targets[b]], [lens[b]], transitions=tr, reduction="none")
        torch.testing.assert_close(full[b : b + 1], one)
        torch.testing.assert_close(
            seq[b : b + 1], sequence_loss(x[b : b + 1], [targets[b]], [lens[b]], reduction="none")
        )


@pytest.mark.parametrize("impl", IMPLS)
def test_gradcheck_float64(impl):
    x, tr = _inputs(7, B=2, T=4, C=3)
    tg = [[0, 2], [1]]
    assert torch.autograd.gradcheck(
        lambda a, b: asg_loss(a, tg, [4, 3], transitions=b, reduction="none", impl=impl), (x, tr)
    )
    assert torch.autograd.gradcheck(lambda a: sequence_loss(a, tg, [4, 3], reduction="none", impl=impl), (x,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision(dtype):
    x = torch.randn(2, 6, 3).to(dtype).requires_grad_(True)
    tr = torch.zeros(4, 3, dtype=dtype, requires_grad=True)
    loss = asg_loss(x, [[0, 1], [2]], [6, 5], transitions=tr)
    assert loss.dtype == dtype
    loss.backward()
    assert x.grad.dtype == dtype and tr.grad.dtype == dtype


def test_nan_gives_nan():
    x = torch.full((1, 4, 3), float("nan"), requires_grad=True)
    loss = sequence_loss(x, [[0, 1]], [4], reduction="none")
    assert math.isnan(loss.item())
    loss.sum().backward()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    x, tr = _inputs(8)
    a = asg_loss(x[:3], TARGETS[:3], LENS[:3], transitions=tr, reduction="none")
    b = asg_loss(x[:3].cuda(), TARGETS[:3], LENS[:3], transitions=tr.cuda(), reduction="none")
    torch.testing.assert_close(a, b.cpu())


def test_asg_fallback_keeps_transition_gradients():
    # extreme emissions make the scaled kernel give up on some examples; the log-domain redo
    # must still deliver the per-example transition occupancies
    g = torch.Generator().manual_seed(11)
    x = (400 * torch.randn(3, 30, 4, generator=g, dtype=torch.float64)).requires_grad_(True)
    tr = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    targets = [[0, 1, 2, 3, 0, 1], [2, 2, 1], [3]]
    out = {}
    for impl in ["numba", "numba_log"]:
        loss = asg_loss(x, targets, [30, 25, 20], transitions=tr, reduction="none", impl=impl)
        out[impl] = (loss, torch.autograd.grad(loss.sum(), (x, tr)))
    torch.testing.assert_close(out["numba"][0], out["numba_log"][0])
    for a, b in zip(out["numba"][1], out["numba_log"][1]):
        torch.testing.assert_close(a, b)
