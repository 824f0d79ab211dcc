"""Linear: torch.nn.Linear's results and initialisation, hand-written backward."""

import pytest
import torch

from lightning_gtn.nn import Linear
from lightning_gtn.nn.linear import _linear


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(7,), (3, 7), (2, 4, 7)])
def test_matches_torch_linear(bias, shape):
    torch.manual_seed(0)
    ours = Linear(7, 5, bias=bias)
    torch.manual_seed(0)
    ref = torch.nn.Linear(7, 5, bias=bias)
    torch.testing.assert_close(ours.weight, ref.weight)  # same initialisation, same RNG draws
    if bias:
        torch.testing.assert_close(ours.bias, ref.bias)
    x = torch.randn(*shape, requires_grad=True)
    y1, y2 = ours(x), ref(x)
    torch.testing.assert_close(y1, y2)
    g = torch.randn_like(y1)
    a = torch.autograd.grad(y1, [x] + list(ours.parameters()), g)
    b = torch.autograd.grad(y2, [x] + list(ref.parameters()), g)
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v)


def test_gradcheck_float64():
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_linear, (x, w, b))
    assert torch.autograd.gradcheck(_linear, (x, w, None))


def test_needs_input_grad_is_honoured(monkeypatch):
    calls = []
    real = torch.Tensor.matmul

    def spy(self, other):
        calls.append(tuple(self.shape))
        return real(self, other)

    m = Linear(4, 3)
    x = torch.randn(2, 4)  # no grad for the input
    y = m(x)
    monkeypatch.setattr(torch.Tensor, "matmul", spy)
    y.sum().backward()
    monkeypatch.undo()
    assert calls == [(3, 2)]  # only grad_W = grad_out^T @ x; no grad_out @ W for x
    m.weight.requires_grad_(False)
    xg = torch.randn(2, 4, requires_grad=True)
    m(xg).sum().backward()
    assert m.weight.grad is not None and xg.grad is not None


def test_repr_and_no_bias():
    m = Linear(3, 2, bias=False)
    assert m.bias is None and "bias=False" in repr(m)


def test_custom_op_and_fullgraph_compile():
    x = torch.randn(2, 3, 4, requires_grad=True)
    w = torch.randn(5, 4, requires_grad=True)
    torch.library.opcheck(_linear, (x, w, torch.randn(5, requires_grad=True)))
    torch.library.opcheck(_linear, (x, w, None))
    torch.manual_seed(0)
    m = Linear(4, 5)
    eager = m(x).tanh().sum()
    ge = torch.autograd.grad(eager, [x, m.weight, m.bias])
    compiled = torch.compile(lambda t: m(t).tanh().sum(), fullgraph=True)(x)
    gc = torch.autograd.grad(compiled, [x, m.weight, m.bias])
    torch.testing.assert_close(compiled, eager)
    for a, b in zip(gc, ge):
        torch.testing.assert_close(a, b)
