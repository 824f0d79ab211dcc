"""gtn.criterion: the CTC graph and the CTC loss of one example (checked against torch)."""

import math

import numpy as np
import pytest
import torch

import lightning_gtn.wfst as gtn
from lightning_gtn.wfst.criterion import ctc_graph


def emissions_graph(log_probs):
    T, C = log_probs.shape
    g = gtn.linear_graph(T, C)
    g.set_weights(np.ascontiguousarray(log_probs, dtype=np.float32))
    return g


def test_ctc_graph_structure():
    g = ctc_graph([1, 1, 2], blank_idx=0)
    assert g.num_nodes() == 7 and g.start() == [0] and g.accept() == [5, 6]
    assert not g.calc_grad
    arcs = {(g.srcnode(a), g.dstnode(a), g.ilabel(a)) for a in range(g.num_arcs())}
    loops = {(s, s, lab) for s, lab in enumerate([0, 1, 0, 1, 0, 2, 0])}
    steps = {(s - 1, s, lab) for s, lab in enumerate([0, 1, 0, 1, 0, 2, 0]) if s > 0}
    skips = {(3, 5, 2)}  # no skip between the repeated 1s
    assert arcs == loops | steps | skips
    assert g.labels_to_list() == g.labels_to_list(False)
    empty = ctc_graph([], blank_idx=3)
    assert empty.num_nodes() == 1 and empty.accept() == [0] and empty.labels_to_list() == [3]


def test_ctc_loss_small_cases():
    # One path only: blank-free target [0, 0] needs a blank between, T = 3.
    lp = np.log(np.array([[1, 0], [0, 1], [1, 0]], dtype=np.float64) + 1e-30)
    loss = gtn.criterion.ctc_loss(emissions_graph(lp), [0, 0], 1)
    assert loss.item() == pytest.approx(0.0, abs=1e-5)
    # Uniform emissions: 5 alignments of [1, 2] in 3 frames over 4 labels.
    lp = np.full((3, 4), math.log(0.25))
    loss = gtn.criterion.ctc_loss(emissions_graph(lp), [1, 2], 3)
    assert loss.item() == pytest.approx(-math.log(5 * 0.25**3), rel=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_ctc_loss_and_gradient_match_torch(seed):
    rng = np.random.default_rng(seed)
    T, C, blank = 12, 5, 0
    target = [int(x) for x in rng.integers(1, C, size=4)]
    logits = torch.tensor(rng.standard_normal((T, C)), dtype=torch.float64, requires_grad=True)
    log_probs = torch.log_softmax(logits, dim=-1)
    ref = torch.nn.functional.ctc_loss(
        log_probs[:, None, :],
        torch.tensor([target]),
        torch.tensor([T]),
        torch.tensor([len(target)]),
        blank=blank,
        reduction="sum",
    )
    ref.backward()
    em = emissions_graph(log_probs.detach().numpy())
    loss = gtn.criterion.ctc_loss(em, target, blank)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    gtn.backward(loss)
    # torch's CTC gradient is in logit space: chain ours through log_softmax to compare.
    d_lp = torch.tensor(em.grad().weights_to_numpy().reshape(T, C), dtype=torch.float64)
    (ours,) = torch.autograd.grad(torch.log_softmax(logits, -1), logits, d_lp)
    np.testing.assert_allclose(ours.numpy(), logits.grad.numpy(), atol=1e-5)


def test_ctc_loss_is_infinite_when_the_target_does_not_fit():
    lp = np.full((2, 3), math.log(1 / 3))
    loss = gtn.criterion.ctc_loss(emissions_graph(lp), [1, 1], 0)  # needs 3 frames
    assert loss.item() == math.inf
