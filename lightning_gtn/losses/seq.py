"""The alignment-free sequence criterion of GTN's PyTorch example."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..core import checks, criterion
from ..core.criterion_graphs import compiled_all_paths, compiled_force_align
from ..core.scoring import normalised_plan, reduce_losses

__all__ = ["sequence_loss"]


class _Sequence(criterion.Criterion):
    """Row ``b``: ``log Z(all paths) - log Z(target paths)``."""

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
    B, T, C = checks.check_emissions(emissions, "emissions")
    checks.check_reduction(reduction)
    checks.check_impl(impl)
    if impl == "gtn":
        from ..core.gtn_backend import gtn_sequence_losses

        lengths = checks.as_lengths(input_lengths, B, "input_lengths", emissions.device, max_value=T)
        seqs = checks.split_targets(targets, target_lengths, B, emissions.device, C)
        losses = gtn_sequence_losses(emissions, seqs, lengths, zero_infinity)
        return reduce_losses(losses, reduction, np.asarray([len(s) for s in seqs]))
    tg, tl = checks.targets_tensors(targets, target_lengths, B, emissions.device)
    il = checks.int_tensor(input_lengths, "input_lengths")
    return criterion.structured_loss(
        emissions, None, tg, il, tl, kind="seq", reduction=reduction, zero_infinity=zero_infinity, impl=impl
    )
