"""Best label paths through dense emissions in the max semiring, and the custom op behind them.

:func:`best_paths_op` is the ``torch.library`` op behind ``best_paths`` (per-frame argmax, or
through ASG's transitions); :func:`max_semiring_paths` runs a plan's graphs in the max semiring
and reads back the frame labels, for the decoders and the transducer.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from ..opargs import op_schema
from . import checks, dispatch
from .criterion import nan_rows
from .criterion_graphs import compiled_asg_full
from .scoring import Plan

__all__ = ["best_paths_op", "best_paths_impl", "max_semiring_paths", "refuse_nan"]


def max_semiring_paths(x: torch.Tensor, plan: Plan, w: torch.Tensor, T: int):
    """Best paths of a plan's graphs in the max semiring, read back as frame labels.

    Args:
        x: emissions ``(B, T, C)`` on the CPU, float32 or float64.
        plan: one graph per example (``plan.B`` examples).
        w: the plan's arc weights ``(num_arcs,)`` in ``x``'s dtype.
        T: frames of the output paths.

    Returns:
        ``(paths (B, T) int64 padded with -1, scores (B,) in x's dtype)``.
    """
    st = dispatch.forward(plan.problem, x, w.contiguous(), "numba", semiring="max")
    B = plan.B
    paths = torch.full((B, T), -1, dtype=torch.int64)
    for b, lab in enumerate(dispatch.viterbi_labels(st)):
        if lab is not None and len(lab):
            paths[b, : len(lab)] = torch.from_numpy(lab)
    scores = st.logz.to(x.dtype)
    return paths, scores


def best_paths_impl(emissions: torch.Tensor, transitions: Optional[torch.Tensor], input_lengths: torch.Tensor):
    """The real implementation of :func:`best_paths_op`."""
    B, T, C = emissions.shape
    lengths = checks.as_lengths(input_lengths, B, "input_lengths", emissions.device, max_value=T)
    refuse_nan(emissions, lengths, transitions, "transitions")  # inside the op: also under torch.compile
    dev = emissions.device
    with torch.no_grad():
        if transitions is None:
            best, idx = emissions.max(-1)
            valid = torch.arange(T, device=dev)[None, :] < torch.from_numpy(lengths).to(dev)[:, None]
            paths = torch.where(valid, idx, torch.full_like(idx, -1))
            scores = torch.where(valid, best, torch.zeros_like(best)).sum(1)
            return paths, scores
        x = emissions.detach().to("cpu", checks.compute_dtype(emissions)).contiguous()
        cg = compiled_asg_full(C)
        plan = Plan([cg], np.zeros(B, dtype=np.int64), np.arange(B), lengths, np.ones(B), B)
        w = transitions.detach().to("cpu", x.dtype).reshape(-1)[torch.from_numpy(cg.weight_index)]
        paths, scores = max_semiring_paths(x, plan, w, T)
        return paths.to(dev), scores.to(device=dev, dtype=emissions.dtype)


def refuse_nan(
    emissions: torch.Tensor,
    lengths: np.ndarray,
    weights: Optional[torch.Tensor] = None,
    weights_name: str = "transitions",
) -> None:
    """ValueError when an emission within an example's length, or a weight, is NaN: a best
    path through NaN scores is undefined (the max would silently skip them)."""
    rows = nan_rows(emissions.detach(), None, lengths)
    if rows is not None:
        b = int(torch.nonzero(rows)[0, 0])
        raise ValueError(f"emissions contains NaN (example {b}, within its input length); " "cannot decode NaN scores")
    if weights is not None and bool(torch.isnan(weights.detach()).any()):
        raise ValueError(f"{weights_name} contains NaN; cannot decode NaN scores")


class BestPathsArgs(NamedTuple):
    """The arguments of ``lightning_gtn::best_paths``."""

    emissions: Tensor
    transitions: Optional[Tensor]
    input_lengths: Tensor


@torch.library.custom_op("lightning_gtn::best_paths", mutates_args=())
@op_schema(BestPathsArgs)
def best_paths_op(emissions: Tensor, transitions: Optional[Tensor], input_lengths: Tensor) -> Tuple[Tensor, Tensor]:
    """``(paths (B, T) int64, scores (B,))``: the best label path of each example's first
    ``input_lengths[b]`` frames (per-frame argmax, or through ASG's transitions), padded with -1."""
    return best_paths_impl(emissions, transitions, input_lengths)


@best_paths_op.register_fake
def _best_paths_fake(*inputs):
    e = BestPathsArgs(*inputs).emissions
    B, T = e.shape[:2]
    return e.new_empty((B, T), dtype=torch.int64), e.new_empty((B,))
