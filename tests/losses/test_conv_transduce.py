"""The functional WFST convolution (conv_transduce1d, kernel_graph): gradcheck and kernel graphs.

The layer's own tests (against the research reference, errors, compile) are in
tests/nn/test_conv_transduce.py, whose helpers build the layers used here.
"""

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
