"""The alignment-free sequence criterion of GTN's PyTorch example."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from . import _common
from ._graphs import compiled_all_paths, compiled_force_align

__all__ = ["sequence_loss"]


class _SequenceFunction(torch.autograd.Function):
    """Per-example losses ``(B,)``: ``log Z(all paths) - log Z(target paths)``."""

    @staticmethod
    def forward(ctx, emissions, arc_weights, plan, impl, zero_infinity):
        return _common.score_forward(ctx, emissions, arc_weights, plan, impl, zero_infinity)

    @staticmethod
    def backward(ctx, grad_losses):
        gE, _ = _common.score_backward(ctx, grad_losses, ctx.needs_input_grad[0], False)
        return gE, None, None, None, None


def sequence_plan(seqs, lengths: np.ndarray, C: int) -> _common.Plan:
    B = len(seqs)
    full = compiled_all_paths(C)
    per = [full] * B + [compiled_force_align(t) for t in seqs]
    graphs, ids = _common.unique_graphs(per)
    rows = np.concatenate([np.arange(B), np.arange(B)])
    sign = np.concatenate([np.ones(B), -np.ones(B)])
    return _common.Plan(graphs, ids, rows, np.concatenate([lengths, lengths]), sign, B)


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
    B, T, C = _common.check_emissions(emissions, "emissions")
    _common.check_reduction(reduction)
    lengths = _common.as_lengths(input_lengths, B, "input_lengths", emissions.device, max_value=T)
    seqs = _common.split_targets(targets, target_lengths, B, emissions.device, C)
    tlen = np.asarray([len(s) for s in seqs], dtype=np.int64)
    if backend == "gtn":
        from ._gtn_backend import gtn_sequence_losses

        losses = gtn_sequence_losses(emissions, seqs, lengths, zero_infinity)
        return _common.reduce_losses(losses, reduction, tlen)
    if backend != "native":
        raise ValueError(f"backend must be 'native' or 'gtn', got {backend!r}")
    impl = _common.pick_impl(emissions, _impl)
    dtype = _common.compute_dtype(emissions)
    plan = sequence_plan(seqs, lengths, C)
    x = emissions.to(dtype)
    w = torch.from_numpy(plan.batch.weights()).to(device=x.device, dtype=dtype)
    losses = _SequenceFunction.apply(x, w, plan, impl, bool(zero_infinity))
    return _common.reduce_losses(losses, reduction, tlen).to(emissions.dtype)
