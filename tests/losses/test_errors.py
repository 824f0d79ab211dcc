"""Bad input gives a ValueError naming the argument and the expected shape."""

import pytest
import torch

from lightning_gtn.functional import asg_loss, ctc_loss, sequence_loss

X = torch.randn(2, 5, 4).log_softmax(-1)
TG = torch.tensor([[1, 2], [3, 0]])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(log_probs=torch.randn(5, 4)), r"log_probs must have shape \(B, T, C\)"),
        (dict(input_lengths=[5, 5, 5]), r"input_lengths must have shape \(B,\) = \(2,\)"),
        (dict(input_lengths=[6, 5]), r"input_lengths must be <= T=5"),
        (dict(input_lengths=[-1, 5]), r"input_lengths must be >= 0"),
        (dict(target_lengths=[2]), r"target_lengths must have shape \(B,\)"),
        (dict(target_lengths=[3, 1]), r"target_lengths must be <= S=2"),
        (dict(targets=torch.tensor([[1, 9], [3, 0]])), r"label 9 out of range \[0, C\) with C=4"),
        (dict(targets=torch.tensor([[1, 0], [3, 0]]), target_lengths=[2, 1]), r"blank=0"),
        (dict(targets=torch.tensor([[[1]]])), r"targets must have shape \(B, S\) or"),
        (dict(targets=torch.tensor([1, 2])), r"sum\(target_lengths\)=3"),
        (dict(targets=torch.tensor([[1, 2]])), r"targets must have shape \(B, S\) with B=2"),
        (dict(blank=4), r"blank must be an integer label in \[0, C\)"),
        (dict(reduction="avg"), r"reduction must be one of"),
        (dict(input_lengths=torch.tensor([5.0, 5.0])), r"input_lengths must hold integers"),
    ],
)
def test_ctc_errors(kwargs, match):
    args = dict(log_probs=X, targets=TG, input_lengths=[5, 5], target_lengths=[2, 1])
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ctc_loss(**args)


def test_asg_transitions_shape():
    with pytest.raises(ValueError, match=r"transitions must be a tensor of shape \(C \+ 1, C\) = \(5, 4\)"):
        asg_loss(X, [[1], [2]], [5, 5], transitions=torch.zeros(4, 4))


def test_impl_name():
    with pytest.raises(ValueError, match="impl"):
        sequence_loss(X, [[1], [2]], [5, 5], impl="k2")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mismatched_devices():
    with pytest.raises(ValueError, match="transitions is on"):
        asg_loss(X.cuda(), [[1], [2]], [5, 5], transitions=torch.zeros(5, 4))


def test_mismatched_devices_meta():
    # a second device type exists everywhere: "meta"; targets there are rejected by name
    with pytest.raises(ValueError, match="transitions is on meta"):
        asg_loss(X, [[1], [2]], [5, 5], transitions=torch.zeros(5, 4, device="meta"))
