"""asg_loss against brute-force enumeration, the engine, and itself."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lightning_gtn.wfst as gtn
from lightning_gtn.functional import asg_loss, asg_target_graph

from ._brute import IMPLS, LENS, TARGETS, _inputs, asg_ref


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


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_reductions(reduction):
    x, tr = _inputs(5)
    none = asg_loss(x[:3], TARGETS[:3], LENS[:3], transitions=tr, reduction="none")
    red = asg_loss(x[:3], TARGETS[:3], LENS[:3], transitions=tr, reduction=reduction)
    lens = torch.tensor([max(len(t), 1) for t in TARGETS[:3]], dtype=torch.float64)
    expected = none.sum() if reduction == "sum" else (none / lens).mean()
    torch.testing.assert_close(red, expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision(dtype):
    x = torch.randn(2, 6, 3).to(dtype).requires_grad_(True)
    tr = torch.zeros(4, 3, dtype=dtype, requires_grad=True)
    loss = asg_loss(x, [[0, 1], [2]], [6, 5], transitions=tr)
    assert loss.dtype == dtype
    loss.backward()
    assert x.grad.dtype == dtype and tr.grad.dtype == dtype


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


@pytest.mark.parametrize("impl", IMPLS)
def test_gradcheck_float64(impl):
    x, tr = _inputs(7, B=2, T=4, C=3)
    tg = [[0, 2], [1]]
    assert torch.autograd.gradcheck(
        lambda a, b: asg_loss(a, tg, [4, 3], transitions=b, reduction="none", impl=impl), (x, tr)
    )


def test_infeasible():
    x, tr = _inputs(6)
    loss = asg_loss(x[:2], [[0, 1, 2, 0, 1], [1]], [4, 3], transitions=tr, reduction="none")
    assert math.isinf(loss[0].item()) and math.isfinite(loss[1].item())


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
    for b in range(B):
        one = asg_loss(x[b : b + 1], [targets[b]], [lens[b]], transitions=tr, reduction="none")
        torch.testing.assert_close(full[b : b + 1], one)
