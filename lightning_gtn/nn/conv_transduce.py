"""``ConvTransduce1D``: the WFST convolution layer as an ``nn.Module``."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from ..functional import KernelBank, conv_transduce1d

__all__ = ["ConvTransduce1D"]


class ConvTransduce1D(nn.Module):
    """A 1-D convolution whose kernels are WFSTs (the research code's ``ConvTransduce1D``).

    Each output class ``k`` has a kernel graph built from ``lexicon[k]``, a sequence of
    input-class ids (see :func:`lightning_gtn.losses.conv_transduce.kernel_graph`). The
    ``(B, T, C_in)`` inputs are zero-padded by ``kernel_size // 2`` frames on both sides;
    ``output[b, t, k]`` is the forward score (or, with ``viterbi=True``, the best path's score)
    of the ``kernel_size`` frames starting at padded frame ``t * stride`` against kernel ``k``,
    divided by the scale. All windows and kernels are scored in one batched call on the inputs'
    device (:func:`lightning_gtn.losses.conv_transduce.conv_transduce1d`).

    Args:
        lexicon: ``C_out`` sequences of input-class ids (``[]`` reads only blanks).
        kernel_size: odd window length, at least every entry's length plus one per repeated
            neighbour (``ValueError`` otherwise).
        stride: frames between windows; ``T' = ceil(T / stride)``.
        blank_idx: the blank's input class.
        blank_optional: blanks between distinct tokens and after the last one are optional.
        learn_params: learn one weight per kernel arc (``kernel_params``, an ``nn.Parameter``
            of zeros, in the research graphs' arc order); else the arcs weigh 0.
        scale: ``"none"``, ``"sqrt"`` (divide by ``sqrt(kernel_size)``) or ``"linear"``
            (divide by ``kernel_size``).
        normalize: ``"none"``; ``"pre"``: ``log_softmax`` of the padded inputs, ``exp`` of the
            outputs; ``"post"``: ``softmax`` of the outputs over ``C_out``.
        viterbi: the best path's score instead of the forward score.
        spike: each token reads exactly one frame (no token self-loops).
        impl: the scoring implementation (None: the device's default), see
            :func:`lightning_gtn.losses.conv_transduce.conv_transduce1d`.

    Shape:
        inputs ``(B, T, C_in)`` float with ``C_in`` above every lexicon id and ``blank_idx``;
        output ``(B, ceil(T / stride), C_out)`` in the inputs' dtype and device.

    Example:
        >>> import torch
        >>> from lightning_gtn.nn import ConvTransduce1D
        >>> layer = ConvTransduce1D([[1], [2], [1, 2], []], kernel_size=5, stride=2, blank_idx=0,
        ...                         learn_params=True)
        >>> layer(torch.randn(3, 11, 4)).shape
        torch.Size([3, 6, 4])
        >>> layer.kernel_params.shape
        torch.Size([21])
    """

    def __init__(
        self,
        lexicon: Sequence[Sequence[int]],
        kernel_size: int,
        stride: int,
        blank_idx: int,
        blank_optional: bool = True,
        learn_params: bool = False,
        scale: str = "none",
        normalize: str = "none",
        viterbi: bool = False,
        spike: bool = False,
        impl: Optional[str] = None,
    ):
        super().__init__()
        self.kernel_size, self.stride = KernelBank.check_window(kernel_size, stride, scale, normalize)
        self.bank = KernelBank(lexicon, blank_idx, blank_optional, spike)
        self.bank.check_kernel_size(self.kernel_size)
        self.lexicon = [list(x) for x in self.bank.lexicon]
        self.blank_idx = self.bank.blank_idx
        self.blank_optional = self.bank.blank_optional
        self.spike = self.bank.spike
        self.scale = scale
        self.normalize = normalize
        self.viterbi = bool(viterbi)
        self.impl = impl
        self.kernel_params = nn.Parameter(torch.zeros(self.bank.num_arcs)) if learn_params else None

    @property
    def out_features(self) -> int:
        """``C_out``, the number of lexicon entries."""
        return self.bank.num_kernels

    def output_lengths(self, input_lengths: torch.Tensor) -> torch.Tensor:
        """``ceil(T / stride)`` for each example."""
        return torch.div(input_lengths + self.stride - 1, self.stride, rounding_mode="floor")

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """``(B, ceil(T / stride), C_out)`` scores of ``inputs`` ``(B, T, C_in)``, in their dtype and device."""
        return conv_transduce1d(
            inputs,
            self.bank,
            self.kernel_size,
            self.stride,
            self.blank_idx,
            kernel_params=self.kernel_params,
            scale=self.scale,
            normalize=self.normalize,
            viterbi=self.viterbi,
            impl=self.impl,
        )

    def extra_repr(self) -> str:
        """The options shown by ``repr``."""
        return (
            f"out_features={self.out_features}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"blank_idx={self.blank_idx}, blank_optional={self.blank_optional}, spike={self.spike}, "
            f"learn_params={self.kernel_params is not None}, scale={self.scale!r}, "
            f"normalize={self.normalize!r}, viterbi={self.viterbi}"
        )
