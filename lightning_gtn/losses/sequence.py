"""The alignment-free sequence criterion of GTN's PyTorch example."""

from __future__ import annotations

from typing import Optional

import torch

from ..core import criterion
from ..core.criterion_graphs import compiled_all_paths, compiled_force_align
from ..core.scoring import normalised_plan

__all__ = ["sequence_loss"]


class _Sequence(criterion.Criterion):
    """Row ``b``: ``log Z(all paths) - log Z(target paths)``."""

    kind = "seq"
    name = "sequence_loss"
    backends = criterion.NATIVE_BACKENDS + ("gtn",)

    def gtn_losses(self, emissions, weights, seqs, lengths, blank, zero_infinity):
        from ..core.gtn_backend import gtn_sequence_losses

        return gtn_sequence_losses(emissions, seqs, lengths, zero_infinity)

    def plan(self, seqs, lengths, C, blank):
        return normalised_plan(compiled_all_paths(C), [compiled_force_align(t) for t in seqs], lengths), None


criterion.CRITERIA["seq"] = _Sequence()


def sequence_loss(
    emissions: torch.Tensor,
    targets,
    input_lengths,
    target_lengths=None,
    *,
    reduction: str = "mean",
    zero_infinity: bool = False,
    impl: Optional[str] = None,
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
        input_lengths: ``(B,)`` integer frames per example, ``<= T``.
        target_lengths: ``(B,)``; needed with tensor targets.
        reduction: ``"none"`` -> ``(B,)``; ``"sum"``; ``"mean"``: each loss divided by its
            target length (at least 1), then averaged.
        zero_infinity: targets longer than their input give 0 instead of ``inf``.
        impl: as :func:`~lightning_gtn.functional.ctc_loss`.

    Returns:
        Loss in the emissions' dtype and device.
    """
    return criterion.apply_loss(
        criterion.CRITERIA["seq"],
        emissions,
        targets,
        input_lengths,
        target_lengths,
        reduction=reduction,
        zero_infinity=zero_infinity,
        impl=impl,
    )
