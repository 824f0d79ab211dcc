"""The RNN-T lattice losses go through the one prologue, ``core.criterion.apply_loss``: each
public function (and each module) reaches it once with its criterion and options, and the
options it checks are the loss's own."""

from __future__ import annotations

import pytest
import torch

import lightning_gtn.functional as lgf
import lightning_gtn.nn as lgn
from lightning_gtn.losses.rnnt import RNNTCriterion
from lightning_gtn.losses.rnnt_variants import MultiblankCriterion, TDTCriterion


def _batch(V):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 3, V, generator=g, dtype=torch.float64, requires_grad=True)
    return x, torch.tensor([[1, 2], [3, 0]]), torch.tensor([4, 3]), torch.tensor([2, 1])


CASES = [
    (
        "rnnt_loss",
        RNNTCriterion,
        5,
        lambda: lambda x, *a: lgf.rnnt_loss(x, *a, blank=0, clamp=0.5, fastemit_lambda=0.1),
    ),
    (
        "rnnt_loss inplace_grad",
        RNNTCriterion,
        5,
        lambda: lambda x, *a: lgf.rnnt_loss(x, *a, blank=0, inplace_grad=True),
    ),
    ("nn.RNNTLoss", RNNTCriterion, 5, lambda: lgn.RNNTLoss(blank=0)),
    ("multiblank_rnnt_loss", MultiblankCriterion, 7, lambda: lambda x, *a: lgf.multiblank_rnnt_loss(x, *a, -1, [2, 3])),
    ("nn.MultiBlankRNNTLoss", MultiblankCriterion, 7, lambda: lgn.MultiBlankRNNTLoss(0, [2, 3])),
    ("tdt_loss", TDTCriterion, 8, lambda: lambda x, *a: lgf.tdt_loss(x, *a, durations=[0, 1, 2], omega=0.2)),
    ("nn.TDTLoss", TDTCriterion, 8, lambda: lgn.TDTLoss(0, durations=[0, 1, 2])),
]


@pytest.mark.parametrize("name, kind, V, make", CASES, ids=[c[0] for c in CASES])
def test_every_loss_reaches_apply_loss(apply_loss_calls, name, kind, V, make):
    calls = apply_loss_calls
    x, *rest = _batch(V)
    y = x.detach().clone().requires_grad_()
    call = make()  # a module's constructor checks its options with one call of its own
    calls.clear()
    loss = call(y, *rest)
    loss.backward()
    assert [type(c) for c, _ in calls] == [kind]  # once, with the family's criterion
    assert y.grad is not None and torch.isfinite(y.grad).all() and y.grad.abs().sum() > 0
    opts = set(calls[0][1])
    assert {"blank", "reduction", "zero_infinity", "impl", "fused_log_softmax"} <= opts
    own = {
        RNNTCriterion: {"clamp", "fastemit_lambda", "inplace_grad"},
        MultiblankCriterion: {"big_blank_durations", "sigma", "big_blank_ids"},
        TDTCriterion: {"durations", "sigma", "omega"},
    }[kind]
    assert own <= opts


def test_inplace_grad_keeps_the_logits_storage():
    """The prologue's cast is the identity for float32/float64: the gradient is the logits'
    own storage, equal to that of a plain call; other dtypes are refused as before."""
    x, *rest = _batch(5)
    a = x.detach().clone().requires_grad_()
    lgf.rnnt_loss(a, *rest, blank=0).backward()
    for dtype in (torch.float32, torch.float64):
        b = x.detach().to(dtype).clone().requires_grad_()
        ptr = b.data_ptr()
        lgf.rnnt_loss(b, *rest, blank=0, inplace_grad=True).backward()
        assert b.grad.data_ptr() == ptr
        torch.testing.assert_close(b.grad, a.grad.to(dtype))
    h = x.detach().half().requires_grad_()
    with pytest.raises(ValueError, match=r"^inplace_grad=True needs contiguous float32/float64 logits, got"):
        lgf.rnnt_loss(h, *rest, blank=0, inplace_grad=True)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x, *a: lgf.rnnt_loss(x, *a, blank=0, fastemit_lambda=-0.5), r"^fastemit_lambda must be >= 0"),
        (lambda x, *a: lgf.rnnt_loss(x, *a, blank=0, inplace_grad=1), r"^inplace_grad must be a bool"),
        (lambda x, *a: lgf.rnnt_loss(x, *a, blank=5), r"^blank must lie in \[-V, V\) with V=5"),
        (lambda x, *a: lgf.multiblank_rnnt_loss(x, *a, 1, [2, 3]), r"^blank=1 leaves no room for 2 big blanks"),
        (
            lambda x, *a: lgf.multiblank_rnnt_loss(x, *a, 0, [2], big_blank_ids=[0]),
            r"^big_blank_ids must be distinct classes other than blank=0",
        ),
        (lambda x, *a: lgf.tdt_loss(x, *a, blank=2, durations=[0, 1, 2, 3]), r"^blank must lie in \[-K, K\) with K=1"),
        (lambda x, *a: lgf.tdt_loss(x, *a, blank="0"), r"^blank must be an integer class id"),
        (lambda x, *a: lgf.tdt_loss(x, *a, reduction="mean_batch"), r"^reduction must be one of"),
    ],
)
def test_prologue_errors_name_the_argument(call, match):
    x, *rest = _batch(5)
    with pytest.raises(ValueError, match=match):
        call(x, *rest)
