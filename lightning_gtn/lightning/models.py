"""Small emission models: ``forward(inputs, input_lengths) -> (emissions, output_lengths)``."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from lightning_gtn.integers import check_int
from lightning_gtn.nn import Linear

__all__ = ["ConvEncoder", "ConvRNNEncoder", "ConvTransduceEncoder", "MAX_PARAMS"]


#: the most weights an encoder built from a config or a checkpoint may have (1 GiB as float32)
MAX_PARAMS = 1 << 28


def _check_params(count: int, sizes: str = "these sizes") -> None:
    """A ValueError when a model of ``count`` weights would exceed :data:`MAX_PARAMS` (checked
    before anything is allocated: a config or checkpoint may not ask for unbounded memory);
    ``sizes`` names the settings that make them (``"model.joiner_dim=65536, ..."``)."""
    if count > MAX_PARAMS:
        raise ValueError(
            f"model: {sizes} make {count:,} weights, over the limit of {MAX_PARAMS:,} "
            "(lightning_gtn.lightning.models.MAX_PARAMS)"
        )


def _check_dropout(value) -> float:
    """``model.dropout`` as a float in ``[0, 1)`` (NaN, bools and strings are errors)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) < 1.0:
        raise ValueError(f"model.dropout must be a number in [0, 1), got {value!r}")
    return float(value)


def _conv_rnn_params(
    feature_dim: int,
    num_classes: int,
    conv_channels: int,
    conv_layers: int,
    kernel_size: int,
    hidden_size: int,
    rnn_layers: int,
    rnn: str,
) -> int:
    """An upper estimate of the weights of a :class:`ConvRNNEncoder` of these sizes (within 10%)."""
    gates = 3 if rnn == "gru" else 4
    conv_in = [feature_dim] + [conv_channels] * max(conv_layers - 1, 0)
    rnn_in = [conv_channels if conv_layers else feature_dim] + [2 * hidden_size] * (rnn_layers - 1)
    return (
        sum(c * conv_channels * kernel_size + conv_channels for c in conv_in[:conv_layers])
        + sum(2 * gates * hidden_size * (i + hidden_size + 2) for i in rnn_in)
        + (2 * hidden_size + 1) * num_classes
    )


class _SeparableBlock(nn.Module):
    """``x + dropout(act(pointwise(depthwise(norm(x)))))`` on ``(B, T, C)`` frames.

    The depthwise convolution runs as a ``(1, k)`` 2-D convolution on a channels-last view of the
    ``(B, T, C)`` tensor (no copy): on CPU that is several times faster than ``Conv1d`` with
    ``groups=C`` on ``(B, C, T)``, and the pointwise convolution is a plain matrix product.
    """

    def __init__(self, channels: int, kernel_size: int, dropout: float, activation: str):
        super().__init__()
        self.norm = nn.LayerNorm(channels)
        self.depthwise = nn.Conv2d(
            channels, channels, (1, kernel_size), padding=(0, kernel_size // 2), groups=channels, bias=False
        )
        # a channels-last weight keeps the convolution on the fast channels-last path
        weight = self.depthwise.weight.detach().contiguous(memory_format=torch.channels_last)
        self.depthwise.weight = nn.Parameter(weight)
        self.pointwise = nn.Linear(channels, channels)
        self.act = nn.GELU() if activation == "gelu" else nn.ReLU()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x`` ``(B, T, C)``, ``mask`` ``(B, T, 1)`` (1 on valid frames) -> ``(B, T, C)``."""
        h = self.norm(x) * mask  # padded frames are zero before the convolution reads them
        h = self.depthwise(h.transpose(1, 2).unsqueeze(2)).squeeze(2).transpose(1, 2)
        h = self.dropout(self.act(self.pointwise(h)))
        return x + h


class _StridedEncoder(nn.Module):
    """What the CTC encoders share: ``stride``, :meth:`output_lengths`, and the output layer
    (``dropout``, ``output``, ``log_softmax``) applied in float32.

    ``forward(inputs, input_lengths)`` encodes a padded batch: ``inputs`` ``(B, T, F)`` features and
    ``input_lengths`` ``(B,)`` valid frames give ``(emissions (B, T', num_classes), lengths (B,))``
    with ``T' = ceil(T / stride)``, log-probabilities when ``log_softmax`` is set.
    """

    stride: int
    dropout: nn.Module
    output: nn.Module
    log_softmax: bool

    def output_lengths(self, input_lengths: torch.Tensor) -> torch.Tensor:
        """``ceil(T / stride)`` for each example."""
        return torch.div(input_lengths + self.stride - 1, self.stride, rounding_mode="floor")

    def _scores(self, h: torch.Tensor, norm: Optional[nn.Module] = None) -> torch.Tensor:
        """``norm`` (if any), the output layer and log-softmax, in float32 even under autocast
        (bf16-mixed): the structured losses need precise scores, and it keeps the custom Linear's
        backward in one dtype."""
        with torch.autocast(device_type=h.device.type, enabled=False):
            h = h.float() if norm is None else norm(h.float())
            scores = self.output(self.dropout(h))
            return scores.log_softmax(-1) if self.log_softmax else scores


class ConvEncoder(_StridedEncoder):
    """An all-convolutional encoder: a strided input convolution, residual blocks of depthwise
    separable 1-D convolutions, and a :class:`lightning_gtn.nn.Linear` output layer giving
    log-probabilities.

    Each block is pre-norm and residual: ``x + dropout(act(pointwise(depthwise(LayerNorm(x)))))``,
    with a depthwise convolution of ``kernel_size`` frames over time and a pointwise (``C x C``)
    layer. The receptive field is ``blocks * (kernel_size - 1) + 1`` output frames (``stride``
    input frames each), widened by the input convolution's ``input_kernel`` input frames.
    Convolutions over whole sequences are large matrix products, which a CPU runs several times
    faster per operation than a recurrent layer's steps.

    Args:
        feature_dim: ``F``, features per input frame.
        num_classes: ``C``, emission classes (the vocabulary's ``num_classes``).
        channels: channels of every block (1 to 4096).
        blocks: residual blocks (0 to 64).
        kernel_size: odd depthwise kernel width in frames (1 to 63); padding keeps ``T'``.
        input_kernel: odd kernel width of the input convolution (1 to 63).
        stride: stride of the input convolution (1 to 8); output length ``ceil(T / stride)``.
        dropout: dropout in each block and before the output layer, in ``[0, 1)``.
        activation: ``"relu"`` or ``"gelu"``.
        log_softmax: return log-probabilities (True) or raw scores.

    Shapes:
        inputs ``(B, T, F)`` float, zero-padded; input_lengths ``(B,)`` int64 on any device.
        Returns emissions ``(B, T', C)`` and output lengths ``(B,)`` int64 on the inputs' device.
        Padded frames never reach valid ones: in eval mode a padded batch gives each example
        the emissions it gets alone.
    """

    def __init__(
        self,
        feature_dim: int,
        num_classes: int,
        channels: int = 256,
        blocks: int = 8,
        kernel_size: int = 11,
        input_kernel: int = 5,
        stride: int = 2,
        dropout: float = 0.1,
        activation: str = "relu",
        log_softmax: bool = True,
    ):
        super().__init__()
        check_int(feature_dim, "model.feature_dim", 1, 1 << 16)
        check_int(num_classes, "model.num_classes", 1, 1 << 20)
        check_int(channels, "model.channels", 1, 4096)
        check_int(blocks, "model.blocks", 0, 64)
        for name, k in (("kernel_size", kernel_size), ("input_kernel", input_kernel)):
            if check_int(k, f"model.{name}", 1, 63) % 2 != 1:
                raise ValueError(f"model.{name} must be odd, got {k}")
        check_int(stride, "model.stride", 1, 8)
        dropout = _check_dropout(dropout)
        if activation not in ("relu", "gelu"):
            raise ValueError(f"model.activation must be 'relu' or 'gelu', got {activation!r}")
        block = channels * kernel_size + channels * channels + 4 * channels  # depthwise, pointwise, norm
        _check_params(feature_dim * channels * input_kernel + blocks * block + (channels + 1) * (num_classes + 2))
        self.stride = stride
        self.input = nn.Conv1d(feature_dim, channels, input_kernel, stride=stride, padding=input_kernel // 2)
        self.input_act = nn.GELU() if activation == "gelu" else nn.ReLU()
        self.blocks = nn.ModuleList(_SeparableBlock(channels, kernel_size, dropout, activation) for _ in range(blocks))
        self.norm = nn.LayerNorm(channels)
        self.dropout = nn.Dropout(dropout)
        self.output = Linear(channels, num_classes)
        self.log_softmax = log_softmax
        self.num_classes = num_classes

    def forward(self, inputs: torch.Tensor, input_lengths: torch.Tensor):
        """Encodes a padded batch (see :class:`_StridedEncoder`)."""
        if inputs.ndim != 3:
            raise ValueError(f"inputs must be (B, T, F), got shape {tuple(inputs.shape)}")
        if input_lengths.shape != inputs.shape[:1]:
            raise ValueError(f"input_lengths must be ({inputs.shape[0]},), got shape {tuple(input_lengths.shape)}")
        lengths = input_lengths.to(inputs.device).clamp(min=0, max=inputs.shape[1])
        valid = torch.arange(inputs.shape[1], device=inputs.device)[None, :] < lengths[:, None]
        x = inputs * valid[:, :, None].to(inputs.dtype)  # whatever the padding holds, it reads as zeros
        h = self.input_act(self.input(x.transpose(1, 2))).transpose(1, 2)  # (B, T', C)
        lengths = self.output_lengths(lengths).clamp(min=1, max=h.shape[1])
        mask = (torch.arange(h.shape[1], device=h.device)[None, :] < lengths[:, None])[:, :, None].to(h.dtype)
        for block in self.blocks:
            h = block(h, mask)
        return self._scores(h, self.norm), lengths.to(inputs.device)


class ConvRNNEncoder(_StridedEncoder):
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
        check_int(feature_dim, "model.feature_dim", 1, 1 << 16)
        check_int(num_classes, "model.num_classes", 1, 1 << 20)
        check_int(conv_channels, "model.conv_channels", 1, 8192)
        check_int(conv_layers, "model.conv_layers", 0, 64)
        check_int(stride, "model.stride", 1, 8)
        check_int(hidden_size, "model.hidden_size", 1, 8192)
        check_int(rnn_layers, "model.rnn_layers", 1, 64)
        if check_int(kernel_size, "model.kernel_size", 1, 63) % 2 != 1:
            raise ValueError(f"model.kernel_size must be odd, got {kernel_size}")
        if rnn not in ("gru", "lstm"):
            raise ValueError(f"model.rnn must be 'gru' or 'lstm', got {rnn!r}")
        dropout = _check_dropout(dropout)
        _check_params(
            _conv_rnn_params(
                feature_dim, num_classes, conv_channels, conv_layers, kernel_size, hidden_size, rnn_layers, rnn
            )
        )
        layers: list[nn.Module] = []
        channels = feature_dim
        for i in range(conv_layers):
            layers += [
                nn.Conv1d(
                    channels, conv_channels, kernel_size, stride=stride if i == 0 else 1, padding=kernel_size // 2
                ),
                nn.ReLU(),
            ]
            channels = conv_channels
        self.conv = nn.Sequential(*layers)
        self.stride = stride if conv_layers > 0 else 1
        rnn_cls = nn.GRU if rnn == "gru" else nn.LSTM
        self.rnn = rnn_cls(
            channels,
            hidden_size,
            num_layers=rnn_layers,
            batch_first=True,
            bidirectional=True,
            dropout=dropout if rnn_layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(dropout)
        self.output = Linear(2 * hidden_size, num_classes)
        self.log_softmax = log_softmax
        self.num_classes = num_classes

    def forward(self, inputs: torch.Tensor, input_lengths: torch.Tensor):
        """Encodes a padded batch (see :class:`_StridedEncoder`)."""
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
        packed = nn.utils.rnn.pack_padded_sequence(h, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=h.shape[1])
        return self._scores(out), lengths.to(inputs.device)


class ConvTransduceEncoder(nn.Module):
    """A :class:`ConvRNNEncoder` giving letter log-probabilities, then a
    :class:`lightning_gtn.nn.ConvTransduce1D` mapping letters to ``num_classes`` outputs.

    The encoder scores ``letters + 1`` letter classes with **the letter blank at id 0** and the
    letters at ``1 .. letters``. Each output class ``k`` owns a kernel graph of ``lexicon[k]``, a
    sequence of letter ids (``[]``: the blank output, whose kernel reads only letter blanks). With
    ``lexicon=None`` the lexicon is the identity of the letters: output 0 is the blank kernel and
    output ``j`` reads letter ``j`` (``letters = num_classes - 1``), which matches the blank-at-0
    vocabularies of the blank losses (``loss=ctc``, ``loss=stc``). Letter frames past an
    example's length are zeroed before the transducer (as its own zero padding), so an example
    gets the same outputs in any batch.

    Args:
        feature_dim: ``F``, features per input frame.
        num_classes: ``C``, output classes (the loss vocabulary's ``num_classes``).
        lexicon: ``num_classes`` sequences of letter ids in ``[0, letters]``, or None (identity).
        letters: letter classes besides the blank; default ``num_classes - 1`` without a lexicon,
            else the largest id in the lexicon.
        transduce_kernel_size, transduce_stride: the transducer's window (odd, at least every
            entry's length plus its repeats) and stride (output length ``ceil(T_enc / stride)``).
        blank_optional, learn_params, scale, viterbi, spike: as :class:`~lightning_gtn.nn.ConvTransduce1D`
            (its ``normalize`` is ``"none"``: it reads log-probabilities and its scores go
            through ``log_softmax``).
        conv_channels, conv_layers, kernel_size, stride, hidden_size, rnn_layers, rnn, dropout:
            the letter encoder's, as :class:`ConvRNNEncoder`.

    Shapes:
        inputs ``(B, T, F)`` float, zero-padded; input_lengths ``(B,)`` int64.
        Returns log-probabilities ``(B, T'', C)`` (``T'' = ceil(ceil(T / stride) /
        transduce_stride)``) and output lengths ``(B,)`` int64 on the inputs' device.

    Example:
        >>> import torch
        >>> m = ConvTransduceEncoder(feature_dim=8, num_classes=5, hidden_size=16, conv_channels=16)
        >>> out, lengths = m(torch.randn(2, 20, 8), torch.tensor([20, 13]))
        >>> out.shape, lengths.tolist()
        (torch.Size([2, 10, 5]), [10, 7])
    """

    def __init__(
        self,
        feature_dim: int,
        num_classes: int,
        lexicon=None,
        letters: int | None = None,
        transduce_kernel_size: int = 3,
        transduce_stride: int = 1,
        blank_optional: bool = True,
        learn_params: bool = True,
        scale: str = "none",
        viterbi: bool = False,
        spike: bool = False,
        conv_channels: int = 64,
        conv_layers: int = 2,
        kernel_size: int = 5,
        stride: int = 2,
        hidden_size: int = 64,
        rnn_layers: int = 1,
        rnn: str = "gru",
        dropout: float = 0.0,
    ):
        super().__init__()
        from lightning_gtn.nn import ConvTransduce1D

        if lexicon is None:
            if letters is None:
                letters = num_classes - 1
            if num_classes - 1 != letters:
                raise ValueError(
                    f"model.letters must be num_classes - 1 = {num_classes - 1} with the identity "
                    f"lexicon (model.lexicon: null), got {letters}"
                )
            lexicon = [[]] + [[j] for j in range(1, letters + 1)]
        else:
            lexicon = [[int(v) for v in entry] for entry in lexicon]
            if len(lexicon) != num_classes:
                raise ValueError(
                    f"model.lexicon must have one entry per output class ({num_classes}), " f"got {len(lexicon)}"
                )
            top = max((max(e) for e in lexicon if e), default=0)
            letters = top if letters is None else int(letters)
            if top > letters:
                raise ValueError(f"model.lexicon uses letter id {top}, above model.letters={letters}")
        if letters < 1:
            raise ValueError(f"model.letters must be at least 1, got {letters}")
        self.letters = int(letters)
        self.num_classes = num_classes
        self.encoder = ConvRNNEncoder(
            feature_dim,
            self.letters + 1,
            conv_channels=conv_channels,
            conv_layers=conv_layers,
            kernel_size=kernel_size,
            stride=stride,
            hidden_size=hidden_size,
            rnn_layers=rnn_layers,
            rnn=rnn,
            dropout=dropout,
            log_softmax=True,
        )
        self.transduce = ConvTransduce1D(
            lexicon,
            transduce_kernel_size,
            transduce_stride,
            0,
            blank_optional=blank_optional,
            learn_params=learn_params,
            scale=scale,
            normalize="none",
            viterbi=viterbi,
            spike=spike,
        )

    def forward(self, inputs: torch.Tensor, input_lengths: torch.Tensor):
        """Letter emissions from the encoder, transduced to word-piece scores.

        Args:
            inputs: ``(B, T, F)`` features.
            input_lengths: ``(B,)`` valid frames of each example.

        Returns:
            ``(log_probs (B, T'', num_classes), lengths (B,))``, ``T''`` the frames after the
            encoder's and the transducer's strides.
        """
        letters, lengths = self.encoder(inputs, input_lengths)  # (B, T', letters + 1) log-probabilities
        valid = torch.arange(letters.shape[1], device=letters.device)[None, :] < lengths[:, None]
        letters = letters * valid.unsqueeze(-1).to(letters.dtype)
        scores = self.transduce(letters)
        out_lengths = self.transduce.output_lengths(lengths).clamp(min=1, max=scores.shape[1])
        return scores.log_softmax(-1), out_lengths
