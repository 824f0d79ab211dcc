"""The seam between RNN-T losses and transducer networks.

A transducer network (the encoder, a prediction network and a joiner; the Lightning layer's
``TransducerModel`` is one) offers these methods, which the losses and decoders call by name
(a duck-typed protocol: nothing here imports the network's class):

* ``encode(inputs (B, T, F), input_lengths (B,)) -> (enc (B, T', J), enc_lengths (B,))``: the
  acoustic frames, already projected to the joiner's dimension ``J``;
* ``predict(tokens (N, S) int64, state=None) -> (pred (N, S, J), state)``: the prediction
  network over label histories. For training, ``tokens`` is the targets with the blank put in
  front (``(B, U + 1)``, the start symbol is the blank, as icefall and torchaudio do); for
  decoding, ``S = 1`` and ``state`` carries the history (``None`` is the empty history);
* ``select_state(state, index (M,) int64) -> state``: the states of the chosen hypotheses;
* ``join(enc (..., J), pred (..., J)) -> logits (..., V)``: the joiner, broadcasting over the
  leading dimensions (``enc[:, :, None]`` and ``pred[:, None]`` give ``(B, T, U + 1, V)``);
* ``simple_am(enc (B, T, J)) -> (B, T, V)`` and ``simple_lm(pred (B, U + 1, J)) -> (B, U + 1, V)``:
  the linear projections of k2's "simple" loss (the pruned loss needs them).

Every RNN-T loss module derives from :class:`RNNTStructuredLoss`: it is called like torchaudio's
``RNNTLoss`` on joiner outputs, and :meth:`RNNTStructuredLoss.joint_loss` computes the loss from a
network and encoder frames (the pruned loss overrides it to avoid the full ``(B, T, U + 1, V)``
lattice).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .losses import StructuredLoss

__all__ = ["RNNTStructuredLoss", "prepend_blank"]


def prepend_blank(targets: torch.Tensor, blank: int) -> torch.Tensor:
    """``(B, U)`` targets -> ``(B, U + 1)`` prediction-network inputs: the blank first (the start
    symbol), then the targets (padding is read but never scored)."""
    if targets.ndim != 2:
        raise ValueError(f"targets must have shape (B, U), got {tuple(targets.shape)}")
    start = torch.full((targets.shape[0], 1), int(blank), dtype=torch.long, device=targets.device)
    return torch.cat([start, targets.to(torch.long)], dim=1)


class RNNTStructuredLoss(StructuredLoss):
    """Base of the RNN-T loss modules (``topology == "rnnt"``).

    ``forward(logits (B, T, U + 1, V), targets (B, U), logit_lengths (B,), target_lengths (B,))``
    is torchaudio's calling convention; :meth:`joint_loss` is what the Lightning layer calls.
    ``blank`` is the blank's class id (non-negative once built; the Lightning layer fills it from
    the vocabulary).

    ``extra_outputs`` is the number of joiner outputs after the ``V`` token scores that the loss
    reads (0 here; TDT: one per duration, multi-blank: one per big blank); the Lightning layer
    builds the network's joiner with that many. A TDT loss names its durations in ``durations``
    and a multi-blank loss its big blanks' frame counts in ``big_blank_durations`` (output
    ``V + k`` has ``durations[k]`` / ``big_blank_durations[k]``), which greedy decoding reads.
    """

    blank: Optional[int] = 0
    extra_outputs: int = 0

    def set_step(self, step: int) -> None:
        """Told the global training step before each training batch (the Lightning layer calls
        it); a loss with a warm-up schedule (the pruned loss) overrides it. A no-op here."""

    @property
    def topology(self) -> str:
        """Always ``"rnnt"``: decoded by the transducer searches, not from frame paths."""
        return "rnnt"

    def joint_loss(
        self,
        network: Any,
        encoder_out: torch.Tensor,
        encoder_lengths: torch.Tensor,
        targets: torch.Tensor,
        target_lengths: torch.Tensor,
    ) -> torch.Tensor:
        """The loss of a batch from a transducer network (see the module docstring) and its
        encoder output ``(B, T, J)``: the full lattice ``join(enc[:, :, None], pred[:, None])``
        scored by :meth:`forward`."""
        pred, _ = network.predict(prepend_blank(targets, int(self.blank or 0)), None)
        logits = network.join(encoder_out[:, :, None, :], pred[:, None, :, :])
        return self(logits, targets, encoder_lengths, target_lengths)

    def best_paths(self, emissions, input_lengths=None):
        """Not defined for transducers: decode with :mod:`lightning_gtn.decode.transducer`."""
        raise NotImplementedError("RNN-T losses decode through lightning_gtn.decode.transducer, not frame paths")
