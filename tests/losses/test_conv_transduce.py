"""The functional WFST convolution (conv_transduce1d, kernel_graph): gradcheck and kernel graphs.

The layer's own tests (against the research reference, errors, compile) are in
tests/nn/test_conv_transduce.py, whose helpers build the layers used here.
"""

import pytest
import torch

from lightning_gtn.functional import conv_transduce1d, kernel_graph
from lightning_gtn.losses.conv_transduce import min_kernel_size
from lightning_gtn.nn import ConvTransduce1D
from tests.nn.test_conv_transduce import close, data, make_layer


def test_gradcheck():
    layer = make_layer([[1], [1, 2], []], 3, 2, learn_params=True)
    x = data(2, 5, 3).requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda a, p: conv_transduce1d(a, layer.bank, 3, 2, 0, kernel_params=p), (x, layer.kernel_params)
    )
    # only the kernel weights need a gradient: the same one, and none for the inputs
    layer(x).sum().backward()
    want = layer.kernel_params.grad.clone()
    layer.kernel_params.grad = None
    xd = x.detach()
    layer(xd).sum().backward()
    assert xd.grad is None
    close(layer.kernel_params.grad, want, "kernel grad without input grad", 1e-12)


def test_kernel_graph_arc_order_and_min_size():
    g = kernel_graph([1, 2], 0)
    assert g.labels_to_list() == [0, 1, 1, 0, 0, 2, 2, 0, 0, 2]
    assert min_kernel_size([1, 1, 2, 2, 2]) == 8 and min_kernel_size([]) == 0
    assert ConvTransduce1D([[1], [2, 3]], 3, 1, 0, learn_params=True).kernel_params.shape == (15,)


def test_the_layer_goes_through_the_one_prologue(apply_loss_calls):
    x = torch.randn(2, 10, 4).log_softmax(-1).requires_grad_()
    conv_transduce1d(x, [[1], [2, 3], []], kernel_size=3, stride=2, blank_idx=0, viterbi=True).sum().backward()
    ConvTransduce1D([[1], [2, 3]], 3, 2, 0, learn_params=True)(x).sum().backward()
    assert [type(c).__name__ for c, _ in apply_loss_calls] == ["_ConvTransduce", "_ConvTransduce"]
    # a layer: no reduction, no targets; the prologue names the function and the input
    with pytest.raises(ValueError, match="^conv_transduce1d: impl='gtn' is not available"):
        conv_transduce1d(x, [[1]], kernel_size=3, stride=1, blank_idx=0, impl="gtn")
    with pytest.raises(ValueError, match=r"^inputs must have shape \(B, T, C\)"):
        conv_transduce1d(x[0], [[1]], kernel_size=3, stride=1, blank_idx=0)
