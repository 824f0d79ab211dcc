"""A linear layer whose autograd Function has a hand-written backward."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import nn

from ..opargs import grads, op_schema

__all__ = ["Linear"]


class LinearArgs(NamedTuple):
    """The arguments of ``lightning_gtn::linear``."""

    x: torch.Tensor
    weight: torch.Tensor
    bias: Optional[torch.Tensor]


@torch.library.custom_op("lightning_gtn::linear", mutates_args=())
@op_schema(LinearArgs)
def _linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``y = x @ W^T + b`` over any leading dims (a custom op: opaque to ``torch.compile``)."""
    return torch.nn.functional.linear(x, weight, bias)


@_linear.register_fake
def _linear_fake(*inputs):
    a = LinearArgs(*inputs)
    return a.x.new_empty((*a.x.shape[:-1], a.weight.shape[0]))


def _linear_setup(ctx, inputs, output):
    a = LinearArgs(*inputs)
    ctx.save_for_backward(a.x, a.weight)
    ctx.has_bias = a.bias is not None


def _linear_backward(ctx, grad_out):
    """The hand-written backward: only the gradients autograd asks for."""
    x, weight = ctx.saved_tensors
    need = LinearArgs(*ctx.needs_input_grad)
    gx = gw = gb = None
    if need.x:
        gx = grad_out.matmul(weight)
    if need.weight or (ctx.has_bias and need.bias):
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        if need.weight:
            gw = g2.t().matmul(x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and need.bias:
            gb = g2.sum(0)
    return grads(LinearArgs, x=gx, weight=gw, bias=gb)


_linear.register_autograd(_linear_backward, setup_context=_linear_setup)


class Linear(nn.Module):
    """``torch.nn.Linear``'s layer (same parameters, initialisation and results), own backward.

    Args:
        in_features, out_features: sizes.
        bias: whether to add a learned bias.
        device, dtype: of the parameters.

    Shape:
        ``(*, in_features)`` -> ``(*, out_features)``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty((out_features, in_features), **kw))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **kw))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch.nn.Linear's initialisation: kaiming-uniform weights, uniform(+-1/sqrt(fan_in)) bias."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T + bias``: ``(*, in_features)`` -> ``(*, out_features)``."""
        return _linear(*LinearArgs(x=x, weight=self.weight, bias=self.bias))

    def extra_repr(self) -> str:
        """The options shown by ``repr``."""
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
