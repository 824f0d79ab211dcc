"""The alignment-free sequence criterion of GTN's PyTorch example."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from . import _common
from ._graphs import compiled_all_paths, compiled_force_align

__all__ = ["sequence_loss"]


class _SequenceFunction(_common.ScoreFunction):
    """Per-example losses ``(B,)``: ``log Z(all paths) - log Z(target paths)``."""


def sequence_plan(seqs, lengths: np.ndarray, C: int) -> _common.Plan:
    full = compiled_all_paths(C)
    return _common.normalised_plan(full, [compiled_force_align(t) for t in seqs], lengths)


def sequence_loss(
    emissions: torch.Tensor,
    targets,
    input_lengths,
    target_lengths=None,
    reduction: str = "mean",
    zero_infinity: bool = False,
    backend: str = "native",
    _impl: Optional[str] = None,
) -> torch.Tensor:
    """The alignment-free sequence criterion: each target token covers one or more frames.

    This is the loss GTN's documentation builds as its PyTorch example: no blank, no
    transitions; the target graph is a chain whose node ``l + 1`` is entered by reading
    ``target[l]`` and loops on it; the normaliser is the forward score of the emissions alone
    (every label at every frame). So
    ``loss = sum_t logsumexp_c emissions[t, c] - logsumexp over the target's alignments``,
    i.e. the negative log-probability of the target under per-frame softmax outputs.

    Args:
        emissions: ``(B, T, C)`` frame scores. float32/float64; float16/bfloat16 in float32.
        targets: padded ``(B, S)``, concatenated 1-D, or a list of B sequences; labels in ``[0, C)``.
        input_lengths: ``(B,)`` frames per example, ``<= T``.
        target_lengths: ``(B,)``; needed with tensor targets.
        reduction: ``"none"`` -> ``(B,)``; ``"sum"``; ``"mean"``: each loss divided by its
            target length (at least 1), then averaged.
        zero_infinity: targets longer than their input give 0 instead of ``inf``.
        backend: ``"native"`` or ``"gtn"``.

    Returns:
        Loss in the emissions' dtype and device.
    """
    B, T, C = _common.check_call(emissions, "emissions", reduction)
    lengths, seqs, tlen = _common.lengths_and_targets(input_lengths, targets, target_lengths, (B, T, C),
                                                      emissions.device)
    if _common.use_gtn(backend):
        from ._gtn_backend import gtn_sequence_losses

        losses = gtn_sequence_losses(emissions, seqs, lengths, zero_infinity)
        return _common.reduce_losses(losses, reduction, tlen)
    impl = _common.pick_impl(emissions, _impl)
    x = emissions.to(_common.compute_dtype(emissions))
    plan = sequence_plan(seqs, lengths, C)
    losses = _SequenceFunction.apply(x, _common.graph_weights(plan, x), plan, impl, bool(zero_infinity), False)
    return _common.reduce_losses(losses, reduction, tlen).to(emissions.dtype)
