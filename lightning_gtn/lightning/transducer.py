"""``TransducerModel``: an encoder, a prediction network and a joiner, for the RNN-T losses.

It implements the transducer-network protocol of :mod:`lightning_gtn.nn.rnnt` (``encode``,
``predict``, ``select_state``, ``join``, ``simple_am``, ``simple_lm``, ``joiner_parameters``),
which the RNN-T losses (``loss=rnnt|rnnt_joiner|pruned_rnnt|tdt|multiblank``), the mixin and the transducer decoders
(:mod:`lightning_gtn.decode.transducer`) call by name.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .models import ConvRNNEncoder, _check_dropout, _check_params, _conv_rnn_params

__all__ = ["TransducerModel", "PREDICTORS"]

#: the prediction networks :class:`TransducerModel` offers
PREDICTORS = ("stateless", "lstm")


class TransducerModel(nn.Module):
    """A transducer network: :class:`ConvRNNEncoder` frames, a prediction network over the label
    history, and the joiner ``Linear(tanh(enc + pred))``.

    The encoder is :class:`ConvRNNEncoder` (convolutions, a bidirectional GRU/LSTM) whose output
    layer projects to the joiner's dimension ``joiner_dim`` (no log-softmax). The prediction
    network is either

    * ``"stateless"`` (icefall's stateless decoder): an embedding of the tokens (the blank's
      embedding is zero) and a depthwise convolution over the last ``context_size`` of them,
      ReLU, then a projection to ``joiner_dim``; its state is the last ``context_size - 1``
      tokens;
    * ``"lstm"``: an embedding, a one-layer LSTM, a projection to ``joiner_dim``; its state is the
      LSTM's ``(h, c)``.

    The joiner gives ``num_classes + extra_outputs`` scores (unnormalised: the losses apply the
    log-softmax): the tokens with the blank at ``blank``, then the extra outputs that the TDT
    loss (durations) and the multi-blank loss (big blanks) read. ``simple_am`` / ``simple_lm``
    (linear maps from ``joiner_dim`` to ``num_classes``) are the projections of k2's "simple"
    loss, which the pruned loss trains.

    Args:
        feature_dim: ``F``, features per input frame.
        num_classes: ``V``, the tokens with the blank (the vocabulary's ``num_classes``).
        conv_channels, conv_layers, kernel_size, stride, hidden_size, rnn_layers, rnn, dropout:
            the encoder's, as :class:`ConvRNNEncoder`.
        predictor: ``"stateless"`` or ``"lstm"``.
        context_size: tokens the stateless predictor sees (the current one included), >= 1.
        predictor_dim: embedding (and LSTM) size of the prediction network.
        joiner_dim: ``J``, the joiner's hidden size (encoder and predictor project to it).
        extra_outputs: joiner outputs after the ``V`` token scores (TDT: one per duration;
            multi-blank: one per big blank); filled from the loss by the Lightning layer.
        blank: the blank's id: the start symbol of the prediction network (its embedding is zero).

    Shapes:
        ``encode(inputs (B, T, F), input_lengths (B,)) -> ((B, T', J), (B,))`` with
        ``T' = ceil(T / stride)``; ``predict(tokens (N, S), state) -> ((N, S, J), state)``;
        ``join(enc (..., J), pred (..., J)) -> (..., V + extra_outputs)``.

    Example:
        >>> import torch
        >>> m = TransducerModel(feature_dim=8, num_classes=5, hidden_size=16, conv_channels=16, joiner_dim=24)
        >>> enc, lengths = m.encode(torch.randn(2, 20, 8), torch.tensor([20, 13]))
        >>> pred, state = m.predict(torch.tensor([[0, 3, 1], [0, 2, 2]]))
        >>> m.join(enc[:, :, None], pred[:, None]).shape, lengths.tolist()
        (torch.Size([2, 10, 3, 5]), [10, 7])
    """

    def __init__(
        self,
        feature_dim: int,
        num_classes: int,
        conv_channels: int = 64,
        conv_layers: int = 2,
        kernel_size: int = 5,
        stride: int = 2,
        hidden_size: int = 64,
        rnn_layers: int = 1,
        rnn: str = "gru",
        dropout: float = 0.1,
        predictor: str = "stateless",
        context_size: int = 2,
        predictor_dim: int = 64,
        joiner_dim: int = 64,
        extra_outputs: int = 0,
        blank: int = 0,
    ):
        super().__init__()
        for name, v, low in (
            ("num_classes", num_classes, 2),
            ("context_size", context_size, 1),
            ("predictor_dim", predictor_dim, 1),
            ("joiner_dim", joiner_dim, 1),
            ("extra_outputs", extra_outputs, 0),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"model.{name} must be an integer >= {low}, got {v!r}")
        # a config or checkpoint may not ask for unbounded weights
        for name, v, high in (
            ("context_size", context_size, 64),
            ("predictor_dim", predictor_dim, 1 << 16),
            ("joiner_dim", joiner_dim, 1 << 16),
        ):
            if v > high:
                raise ValueError(f"model.{name} must be at most {high}, got {v}")
        if predictor not in PREDICTORS:
            raise ValueError(f"model.predictor must be one of {PREDICTORS}, got {predictor!r}")
        if isinstance(blank, bool) or not isinstance(blank, int) or not 0 <= blank < num_classes:
            raise ValueError(f"model.blank must be a class id in [0, {num_classes}), got {blank!r}")
        dropout = _check_dropout(dropout)
        # the whole network (encoder, prediction network, joiner) is bounded before anything is built
        V, P, J = num_classes, predictor_dim, joiner_dim
        head = (
            V * P  # embedding
            + (P * context_size if predictor == "stateless" else 4 * P * (2 * P + 2))  # context or LSTM
            + (P + 1) * J  # predictor_proj
            + (J + 1) * (V + extra_outputs)  # joiner
            + 2 * (J + 1) * V  # am_proj, lm_proj
        )
        try:
            encoder = _conv_rnn_params(
                feature_dim, joiner_dim, conv_channels, conv_layers, kernel_size, hidden_size, rnn_layers, rnn
            )
        except TypeError:  # a size of the wrong type: the encoder names it below
            encoder = 0
        _check_params(
            encoder + head,
            f"model.num_classes={V} (the vocabulary's chars and the blank), model.extra_outputs={extra_outputs} "
            f"(the loss's), model.predictor_dim={P}, model.joiner_dim={J} and the encoder's sizes",
        )
        self.num_classes = num_classes
        self.extra_outputs = extra_outputs
        self.blank = blank
        self.predictor = predictor
        self.context_size = context_size
        self.encoder = ConvRNNEncoder(
            feature_dim,
            joiner_dim,
            conv_channels=conv_channels,
            conv_layers=conv_layers,
            kernel_size=kernel_size,
            stride=stride,
            hidden_size=hidden_size,
            rnn_layers=rnn_layers,
            rnn=rnn,
            dropout=dropout,
            log_softmax=False,
        )
        self.embedding = nn.Embedding(num_classes, predictor_dim, padding_idx=blank)
        self.context: Optional[nn.Conv1d] = None
        self.lstm: Optional[nn.LSTM] = None
        if predictor == "stateless":
            # depthwise: each embedding channel mixes its own last context_size values
            self.context = nn.Conv1d(predictor_dim, predictor_dim, context_size, groups=predictor_dim, bias=False)
        else:
            self.lstm = nn.LSTM(predictor_dim, predictor_dim, batch_first=True)
        self.predictor_proj = nn.Linear(predictor_dim, joiner_dim)
        self.joiner = nn.Linear(joiner_dim, num_classes + extra_outputs)
        self.am_proj = nn.Linear(joiner_dim, num_classes)
        self.lm_proj = nn.Linear(joiner_dim, num_classes)

    # ------------------------------------------------------------------ the protocol
    def encode(self, inputs: torch.Tensor, input_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(enc (B, T', J), enc_lengths (B,) int64)`` for ``inputs (B, T, F)`` and
        ``input_lengths (B,)``; padded frames of ``enc`` are not meaningful."""
        return self.encoder(inputs, input_lengths)

    def forward(self, inputs: torch.Tensor, input_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's output (what :meth:`encode` returns): a transducer has no per-frame
        emissions; the losses call the protocol methods."""
        return self.encode(inputs, input_lengths)

    def predict(self, tokens: torch.Tensor, state: Optional[Any] = None) -> tuple[torch.Tensor, Any]:
        """The prediction network over ``tokens (N, S)`` int64 following ``state``.

        Args:
            tokens: label ids in ``[0, num_classes)``; training passes the targets with the blank
                in front (``(B, U + 1)``), decoding one token per hypothesis (``S = 1``).
            state: ``None`` (the empty history: the blank), or the state returned by a previous
                call (``(N, context_size - 1)`` int64 tokens for the stateless predictor,
                ``(h, c)`` each ``(1, N, predictor_dim)`` for the LSTM).

        Returns:
            ``(pred (N, S, J), state)``, the state after the last of the ``S`` tokens.
        """
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape (N, S), got {tuple(tokens.shape)}")
        tokens = tokens.to(torch.long)
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.num_classes):
            raise ValueError(
                f"tokens must be ids in [0, {self.num_classes}), got {int(tokens.min())}..{int(tokens.max())}"
            )
        if self.context is not None:
            k = self.context_size - 1
            if state is None:
                state = tokens.new_full((tokens.shape[0], k), self.blank)
            history = torch.cat([state.to(tokens.device, torch.long), tokens], dim=1)  # (N, k + S)
            emb = self.embedding(history).transpose(1, 2)  # (N, D, k + S)
            h = torch.relu(self.context(emb)).transpose(1, 2)  # (N, S, D)
            new_state = history[:, history.shape[1] - k :]
        else:
            assert self.lstm is not None
            emb = self.embedding(tokens)
            h, new_state = self.lstm(emb, state)
        return self.predictor_proj(h), new_state

    def select_state(self, state: Any, index: torch.Tensor) -> Any:
        """The states of the hypotheses ``index (M,)`` (int64) of a batched ``state``."""
        if state is None:
            return None
        if self.context is not None:
            return state.index_select(0, index.to(state.device))
        h, c = state
        return h.index_select(1, index.to(h.device)), c.index_select(1, index.to(c.device))

    def join(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """``Linear(tanh(enc + pred))``: ``(..., J)`` and ``(..., J)`` broadcast to
        ``(..., num_classes + extra_outputs)`` scores."""
        return self.joiner(torch.tanh(enc + pred))

    def joiner_parameters(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weight (V + extra_outputs, J), bias (V + extra_outputs,))``: the joiner's output layer,
        so that :meth:`join` is ``tanh(enc + pred) @ weight.T + bias`` (what the joiner loss
        computes by chunks, never joining the whole lattice)."""
        return self.joiner.weight, self.joiner.bias

    def simple_am(self, enc: torch.Tensor) -> torch.Tensor:
        """``(B, T, J) -> (B, T, V)``: the encoder's own token scores (k2's simple loss)."""
        return self.am_proj(enc)

    def simple_lm(self, pred: torch.Tensor) -> torch.Tensor:
        """``(B, U + 1, J) -> (B, U + 1, V)``: the prediction network's own token scores."""
        return self.lm_proj(pred)
