"""The RNN-T kernels directly: numba against the hand-written torch recursions and both against
autograd through the torch reference; the in-place gradient buffer; the kernel's own guards."""

import numpy as np
import pytest
import torch

from lightning_gtn.kernels.rnnt_numba import rnnt_cost_grad
from lightning_gtn.kernels.rnnt_torch import rnnt_cost_grad_torch, rnnt_costs_torch


def _case(seed, B=3, T=5, U=4, V=6, blank=2, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=dtype)
    tg = torch.randint(0, V - 1, (B, U), generator=g)
    tg = tg + (tg >= blank).long()
    il = torch.tensor([T, T - 2, 1])[:B]
    tl = torch.tensor([U, 1, U])[:B]  # the last one: U > T
    return x, tg, il, tl


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("lam,clamp", [(0.0, -1.0), (0.7, 0.02)])
def test_numba_equals_torch_recursions_and_autograd(fused, lam, clamp):
    x, tg, il, tl = _case(1)
    if not fused:
        x = x.log_softmax(-1)
    scale = np.array([0.5, 2.0, 1.0])
    g = np.empty_like(x.numpy())
    costs = rnnt_cost_grad(x.numpy(), tg.numpy(), il.numpy(), tl.numpy(), 2, fused, lam, clamp, scale, g)
    c_t, g_t = rnnt_cost_grad_torch(x, tg, il, tl, 2, fused, lam, clamp, torch.from_numpy(scale))
    np.testing.assert_allclose(costs, c_t.numpy(), rtol=1e-12)
    np.testing.assert_allclose(g, g_t.numpy(), rtol=1e-10, atol=1e-12)
    # autograd through the reference (emit gradients scaled by 1 + lam), clipped, then scaled
    xr = x.clone().requires_grad_()
    c_ref = rnnt_costs_torch(xr, tg, il, tl, 2, fused, lam)
    c_ref.sum().backward()
    ref = xr.grad.clamp(-clamp, clamp) if clamp > 0 else xr.grad
    ref = ref * torch.from_numpy(scale).reshape(3, 1, 1, 1)
    np.testing.assert_allclose(costs, c_ref.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(g, ref.numpy(), rtol=1e-9, atol=1e-12)


def test_costs_without_gradient_and_in_place_buffer():
    x, tg, il, tl = _case(2, dtype=torch.float32)
    a = x.numpy().copy()
    only = rnnt_cost_grad(a, tg.numpy(), il.numpy(), tl.numpy(), 2, True, 0.0, -1.0, None, None)
    g = np.empty_like(a)
    sep = rnnt_cost_grad(a, tg.numpy(), il.numpy(), tl.numpy(), 2, True, 0.0, -1.0, None, g)
    np.testing.assert_array_equal(only, sep)
    np.testing.assert_array_equal(a, x.numpy())  # the logits are untouched with a separate buffer
    inplace = rnnt_cost_grad(a, tg.numpy(), il.numpy(), tl.numpy(), 2, True, 0.0, -1.0, None, a)
    np.testing.assert_array_equal(inplace, sep)
    np.testing.assert_array_equal(a, g)  # the gradient now lives in the logits' buffer


def test_float32_close_to_float64():
    x, tg, il, tl = _case(3, B=2, T=40, U=12, V=30)
    args = (tg.numpy(), il.numpy(), tl.numpy(), 2, True, 0.0, -1.0, None)
    g64 = np.empty(x.shape)
    g32 = np.empty(x.shape, dtype=np.float32)
    c64 = rnnt_cost_grad(x.numpy(), *args, g64)
    c32 = rnnt_cost_grad(x.float().numpy(), *args, g32)
    np.testing.assert_allclose(c32, c64, rtol=1e-5)
    np.testing.assert_allclose(g32, g64, atol=1e-5)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(il=np.array([6, 1, 1])), "lengths"),
        (dict(tl=np.array([5, 1, 1])), "lengths"),
        (dict(tl=np.array([-1, 1, 1])), "lengths"),
        (dict(blank=6), "blank"),
        (dict(tg=np.full((3, 4), 6)), "target ids"),
        (dict(tg=np.zeros((3, 2), dtype=np.int64)), "shorter"),
        (dict(x=np.zeros((3, 5, 5, 6), dtype=np.float32)[:, ::-1]), "C-contiguous"),
    ],
)
def test_kernel_guards(change, match):
    x, tg, il, tl = _case(4, dtype=torch.float32)
    args = dict(x=x.numpy(), tg=tg.numpy(), il=il.numpy(), tl=tl.numpy(), blank=2)
    args.update(change)
    with pytest.raises(ValueError, match=match):
        rnnt_cost_grad(args["x"], args["tg"], args["il"], args["tl"], args["blank"], True, 0.0, -1.0, None, None)
