"""Small emission models: ``forward(inputs, input_lengths) -> (emissions, output_lengths)``."""

from __future__ import annotations

import torch
from torch import nn

from lightning_gtn.nn import Linear

__all__ = ["ConvRNNEncoder"]


class ConvRNNEncoder(nn.Module):
    """Convolutions over time, a bidirectional GRU or LSTM, and a :class:`lightning_gtn.nn.Linear`
    output layer giving log-probabilities.

    Args:
        feature_dim: ``F``, features per input frame.
        num_classes: ``C``, emission classes (the vocabulary's ``num_classes``).
        conv_channels: channels of each 1-D convolution.
        conv_layers: number of convolutions (kernel ``kernel_size``, ReLU after each).
        kernel_size: odd kernel width; padding keeps ``T``.
        stride: stride of the first convolution (time subsampling); output length
            ``ceil(T / stride)``.
        hidden_size: recurrent hidden size per direction.
        rnn_layers: stacked recurrent layers.
        rnn: ``"gru"`` or ``"lstm"``.
        dropout: dropout before the output layer (and between recurrent layers).
        log_softmax: return log-probabilities (True) or raw scores.

    Shapes:
        inputs ``(B, T, F)`` float, zero-padded; input_lengths ``(B,)`` int64 on any device.
        Returns emissions ``(B, T', C)`` and output lengths ``(B,)`` int64 on the inputs' device.
    """

    def __init__(
        self,
        feature_dim: int,
        num_classes: int,
        conv_channels: int = 64,
        conv_layers: int = 2,
        kernel_size: int = 3,
        stride: int = 1,
        hidden_size: int = 96,
        rnn_layers: int = 1,
        rnn: str = "gru",
        dropout: float = 0.0,
        log_softmax: bool = True,
    ):
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"model.kernel_size must be odd, got {kernel_size}")
        if rnn not in ("gru", "lstm"):
            raise ValueError(f"model.rnn must be 'gru' or 'lstm', got {rnn!r}")
        layers: list[nn.Module] = []
        channels = feature_dim
        for i in range(conv_layers):
            layers += [
                nn.Conv1d(channels, conv_channels, kernel_size, stride=stride if i == 0 else 1,
                          padding=kernel_size // 2),
                nn.ReLU(),
            ]
            channels = conv_channels
        self.conv = nn.Sequential(*layers)
        self.stride = stride if conv_layers > 0 else 1
        rnn_cls = nn.GRU if rnn == "gru" else nn.LSTM
        self.rnn = rnn_cls(
            channels, hidden_size, num_layers=rnn_layers, batch_first=True, bidirectional=True,
            dropout=dropout if rnn_layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(dropout)
        self.output = Linear(2 * hidden_size, num_classes)
        self.log_softmax = log_softmax
        self.num_classes = num_classes

    def output_lengths(self, input_lengths: torch.Tensor) -> torch.Tensor:
        """``ceil(T / stride)`` for each example."""
        return torch.div(input_lengths + self.stride - 1, self.stride, rounding_mode="floor")

    def forward(self, inputs: torch.Tensor, input_lengths: torch.Tensor):
        if inputs.ndim != 3:
            raise ValueError(f"inputs must be (B, T, F), got shape {tuple(inputs.shape)}")
        h = inputs.transpose(1, 2)  # (B, F, T)
        lengths = input_lengths.to(inputs.device)
        for layer in self.conv:
            h = layer(h)
            if isinstance(layer, nn.ReLU):
                # Zero the padding after each layer, so padded frames never leak into valid ones
                # (a padded batch gives each example the outputs it gets alone).
                lengths = self.output_lengths(input_lengths.to(h.device)) if self.stride > 1 else lengths
                lengths = lengths.clamp(min=1, max=h.shape[-1])
                mask = torch.arange(h.shape[-1], device=h.device)[None, :] < lengths[:, None]
                h = h * mask[:, None, :].to(h.dtype)
        h = h.transpose(1, 2)  # (B, T', H)
        lengths = self.output_lengths(input_lengths.to(h.device)).clamp(min=1, max=h.shape[1])
        packed = nn.utils.rnn.pack_padded_sequence(
            h, lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        out, _ = self.rnn(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=h.shape[1])
        # The output layer and log-softmax run in float32 even under autocast (bf16-mixed): the
        # structured losses need precise scores, and it keeps the custom Linear's backward in
        # one dtype.
        with torch.autocast(device_type=out.device.type, enabled=False):
            scores = self.output(self.dropout(out.float()))
            if self.log_softmax:
                scores = scores.log_softmax(-1)
        return scores, lengths.to(inputs.device)
