"""sequence_loss (the alignment-free criterion of the GTN docs) against brute-force
enumeration, the engine, and itself."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lightning_gtn.wfst as gtn
from lightning_gtn.functional import force_align_graph, sequence_loss

from ._brute import IMPLS, LENS, TARGETS, _inputs, seq_ref


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


def test_sequence_against_engine_graphs():
    x, _ = _inputs(4, B=1, T=6, C=4)
    target = [1, 3]
    ours = sequence_loss(x, [target], [6], reduction="none").item()
    em = gtn.linear_graph(6, 4, calc_grad=False)
    em.set_weights(x[0].detach().float().contiguous().numpy())
    ref = gtn.forward_score(em).item() - gtn.forward_score(gtn.intersect(force_align_graph(target), em)).item()
    assert abs(ours - ref) < 1e-4


def test_nan_gives_nan():
    x = torch.full((1, 4, 3), float("nan"), requires_grad=True)
    loss = sequence_loss(x, [[0, 1]], [4], reduction="none")
    assert math.isnan(loss.item())
    loss.sum().backward()


@pytest.mark.parametrize("impl", IMPLS)
def test_gradcheck_float64(impl):
    x, _ = _inputs(7, B=2, T=4, C=3)
    tg = [[0, 2], [1]]
    assert torch.autograd.gradcheck(lambda a: sequence_loss(a, tg, [4, 3], reduction="none", impl=impl), (x,))


def test_infeasible_and_zero_infinity():
    x, _ = _inputs(6)
    z = sequence_loss(x[:2], [[0, 1, 2, 0, 1], [1]], [4, 3], reduction="none", zero_infinity=True)
    assert z[0].item() == 0.0
    (g,) = torch.autograd.grad(z.sum(), x)
    assert torch.all(g[0] == 0) and torch.any(g[1] != 0)


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 4), st.integers(1, 8), st.integers(1, 4), st.integers(0, 10_000))
def test_batched_equals_one_by_one(B, T, C, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    lens = torch.randint(1, T + 1, (B,), generator=g).tolist()
    targets = [
        torch.randint(0, C, (int(torch.randint(0, l + 1, (1,), generator=g)),), generator=g).tolist() for l in lens
    ]
    seq = sequence_loss(x, targets, lens, reduction="none")
    for b in range(B):
        torch.testing.assert_close(
            seq[b : b + 1], sequence_loss(x[b : b + 1], [targets[b]], [lens[b]], reduction="none")
        )
