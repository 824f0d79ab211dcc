"""The last checks before the compiled kernels: numba and the raw vector loads index without
bounds checks, so whatever path reaches a kernel (a graph cached for another C, a custom op
called directly through ``torch.ops.lightning_gtn``, LM arrays of the wrong integer type) must
meet a ValueError first, never an out-of-range read."""

import numpy as np
import pytest
import torch

import lightning_gtn.functional as F
import lightning_gtn.k2  # noqa: F401  (registers the mutual-information op)
import lightning_gtn.wfst as gtn


def _reads(label):
    def builder(target):
        g = gtn.Graph(False)
        g.add_node(True, True)
        g.add_arc(0, 0, label)
        return g

    return builder


def test_a_cached_target_graph_is_checked_against_each_call_c():
    crit = F.TargetGraphCriterion(_reads(9))
    x10 = torch.randn(1, 4, 10).log_softmax(-1)
    assert torch.isfinite(F.target_graph_loss(x10, [[1]], [4], criterion=crit, reduction="none")).all()
    x3 = torch.randn(1, 4, 3).log_softmax(-1)  # the same target: its graph comes from the cache
    with pytest.raises(ValueError, match="reads label 9 but the emissions have C=3"):
        F.target_graph_loss(x3, [[1]], [4], criterion=crit, reduction="none")


@pytest.mark.parametrize("blank", [7, 2**30])
def test_structured_loss_op_called_directly_checks_the_blank(blank):
    x = torch.randn(1, 4, 3).log_softmax(-1)
    args = (torch.tensor([[1]]), torch.tensor([4]), torch.tensor([1]), "ctc", blank, 0, "none", False, "numba")
    with pytest.raises(ValueError, match=f"reads label {blank} but the emissions have C=3"):
        torch.ops.lightning_gtn.structured_loss(x, None, *args, False, False)


@pytest.mark.parametrize("impl", ["", "torch"])
@pytest.mark.parametrize("blank", [7, 2**40])
def test_forced_align_op_called_directly_checks_the_blank(impl, blank):
    x = torch.randn(1, 4, 3).log_softmax(-1)
    with pytest.raises(ValueError, match="blank must be an integer label in"):
        torch.ops.lightning_gtn.forced_align(
            x, torch.tensor([[1]]), torch.tensor([4]), torch.tensor([1]), None, blank, None, impl
        )


def test_conv_transduce_ops_called_directly_check_labels_weights_and_saved_scores():
    op = torch.ops.lightning_gtn
    bank = F.KernelBank([[1, 2]], blank_idx=2**30)
    with pytest.raises(ValueError, match="reads label 1073741824 but the emissions have C=3"):
        op.conv_transduce(torch.randn(2, 3, 3), torch.zeros(bank.num_arcs), bank.handle, "log", "numba")
    bank = F.KernelBank([[1, 2]], blank_idx=3)
    windows = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match=f"expected {bank.num_arcs} arc weights, got 1"):
        op.conv_transduce(windows, torch.zeros(1), bank.handle, "log", "numba")
    w = torch.zeros(bank.num_arcs)
    scores, alpha, _ = op.conv_transduce(windows, w, bank.handle, "log", "numba")
    none = torch.empty(0, dtype=torch.int64)
    with pytest.raises(ValueError, match="saved forward scores, got 1"):
        op.conv_transduce_backward(
            torch.ones_like(scores),
            windows,
            w,
            scores,
            alpha[:1].clone(),
            none,
            bank.handle,
            "log",
            "numba",
            True,
            True,
        )


def test_mutual_information_op_called_directly_checks_shapes():
    B, S, T = 1, 3, 4
    bnd = torch.tensor([[0, 0, S, T]])
    mi = torch.ops.lightning_gtn.mutual_information
    with pytest.raises(ValueError, match=r"py \(B, S \+ 1, T\)"):
        mi(torch.randn(B, S, T + 1), torch.randn(B, 1, T), bnd, True, "numba")
    with pytest.raises(ValueError, match=r"px must be \(B, S, T \+ 1\)"):
        mi(torch.randn(B, S, 2), torch.randn(B, S + 1, T), bnd, True, "numba")
    with pytest.raises(ValueError, match=r"boundary must have shape \(B, 4\) = \(1, 4\)"):
        mi(torch.randn(B, S, T + 1), torch.randn(B, S + 1, T), torch.zeros(2, 4, dtype=torch.int64), True, "numba")


def test_lm_arrays_that_a_cast_would_wrap_or_truncate_are_refused():
    from lightning_gtn.decode import check_lm_arrays
    from lightning_gtn.lm import estimate

    lm = estimate(["a b", "b a"], order=2)
    a = lm.arrays()
    check_lm_arrays(a, len(lm.words))
    wrapped = a._replace(arc_next=a.arc_next.astype(np.int64) + 2**32)
    with pytest.raises(ValueError, match="arc_next holds values outside int32"):
        check_lm_arrays(wrapped, len(lm.words))
    with pytest.raises(ValueError, match="state_offsets must hold integers, got float64"):
        check_lm_arrays(a._replace(state_offsets=a.state_offsets.astype(np.float64) + 0.7), len(lm.words))
