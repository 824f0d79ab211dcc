"""Validation, target handling and the shared core of the loss Functions."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from . import _dispatch, _triton
from ._graphs import CompiledGraph, GraphBatch

REDUCTIONS = ("none", "mean", "sum")


# ---------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------


def check_emissions(x, name: str = "log_probs") -> Tuple[int, int, int]:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape (B, T, C), got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"{name} must have shape (B, T, C) (batch first), got {x.dim()} dims: {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating point tensor, got {x.dtype}")
    return tuple(x.shape)


def check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def check_call(x, name: str, reduction: str) -> Tuple[int, int, int]:
    """:func:`check_emissions` then :func:`check_reduction`; returns ``(B, T, C)``."""
    shape = check_emissions(x, name)
    check_reduction(reduction)
    return shape


def use_gtn(backend: str) -> bool:
    """True for ``backend="gtn"``, False for ``"native"``; ValueError otherwise."""
    if backend == "gtn":
        return True
    if backend != "native":
        raise ValueError(f"backend must be 'native' or 'gtn', got {backend!r}")
    return False


def _host_device_ok(t: torch.Tensor, device: torch.device) -> bool:
    return t.device.type == "cpu" or t.device == device


def as_lengths(x, B: int, name: str, device: torch.device, max_value: Optional[int] = None) -> np.ndarray:
    """Lengths ``(B,)`` as int64 numpy (tensor on the emissions' device or the CPU, or a sequence)."""
    if isinstance(x, torch.Tensor):
        if not _host_device_ok(x, device):
            raise ValueError(f"{name} is on {x.device} but the emissions are on {device}; "
                             f"put {name} on {device} or the CPU")
        if x.is_floating_point() or x.is_complex():
            raise ValueError(f"{name} must hold integers, got {x.dtype}")
        if x.dim() != 1 or x.shape[0] != B:
            raise ValueError(f"{name} must have shape (B,) = ({B},), got {tuple(x.shape)}")
        arr = x.detach().cpu().numpy().astype(np.int64)
    else:
        try:
            arr = np.asarray(list(x), dtype=np.int64)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a 1-D tensor or sequence of B={B} integers") from None
        if arr.shape != (B,):
            raise ValueError(f"{name} must have shape (B,) = ({B},), got {arr.shape}")
    if len(arr) and arr.min() < 0:
        raise ValueError(f"{name} must be >= 0, got {int(arr.min())}")
    if max_value is not None and len(arr) and arr.max() > max_value:
        raise ValueError(f"{name} must be <= T={max_value} (the emissions' time dimension), got {int(arr.max())}")
    return arr


def split_targets(targets, target_lengths, B: int, device: torch.device, num_classes: int,
                  blank: Optional[int] = None, name: str = "targets") -> List[List[int]]:
    """Targets as lists of ints: padded ``(B, S)`` or concatenated 1-D (torch's two layouts).

    A list of B sequences is accepted too (then ``target_lengths`` may be None).
    """
    if (target_lengths is not None and not isinstance(targets, (torch.Tensor, np.ndarray)) and len(targets)
            and not np.isscalar(targets[0])):
        # a list of B sequences with lengths: check they agree, then use the sequences
        seqs = [list(map(int, t)) for t in targets]
        lengths = as_lengths(target_lengths, B, "target_lengths", device)
        if len(seqs) != B or any(len(s) != n for s, n in zip(seqs, lengths)):
            raise ValueError(f"{name}: a list of B={B} sequences whose lengths equal target_lengths is expected")
        target_lengths = None
        targets = seqs
    if target_lengths is None:
        if isinstance(targets, torch.Tensor):
            if targets.dim() == 2:
                raise ValueError("target_lengths is required with padded targets of shape (B, S)")
            raise ValueError("target_lengths is required with concatenated 1-D targets")
        seqs = [list(map(int, t)) for t in targets]
        if len(seqs) != B:
            raise ValueError(f"{name}: expected B={B} sequences, got {len(seqs)}")
    else:
        lengths = as_lengths(target_lengths, B, "target_lengths", device)
        if isinstance(targets, torch.Tensor):
            if not _host_device_ok(targets, device):
                raise ValueError(f"{name} is on {targets.device} but the emissions are on {device}")
            if targets.is_floating_point():
                raise ValueError(f"{name} must hold integer labels, got {targets.dtype}")
            arr = targets.detach().cpu().numpy().astype(np.int64)
        else:
            arr = np.asarray(targets, dtype=np.int64)
        if arr.ndim == 2:
            if arr.shape[0] != B:
                raise ValueError(f"{name} must have shape (B, S) with B={B}, got {arr.shape}")
            if len(lengths) and lengths.max() > arr.shape[1]:
                raise ValueError(f"target_lengths must be <= S={arr.shape[1]} (targets of shape (B, S)), "
                                 f"got {int(lengths.max())}")
            mask = np.arange(arr.shape[1])[None, :] < lengths[:, None]
            flat = arr[mask]
            rows = arr.tolist()
            seqs = [rows[b][: lengths[b]] for b in range(B)]
        elif arr.ndim == 1:
            total = int(lengths.sum())
            if arr.shape[0] != total:
                raise ValueError(f"concatenated 1-D {name} must have sum(target_lengths)={total} labels, "
                                 f"got shape {arr.shape}")
            flat = arr
            lst = arr.tolist()
            off = np.concatenate([[0], np.cumsum(lengths)]).tolist()
            seqs = [lst[off[b] : off[b + 1]] for b in range(B)]
        else:
            raise ValueError(f"{name} must have shape (B, S) or (sum(target_lengths),), got {arr.shape}")
        if len(flat):
            lo, hi = int(flat.min()), int(flat.max())
            if lo < 0 or hi >= num_classes:
                bad = lo if lo < 0 else hi
                raise ValueError(f"{name}: label {bad} out of range [0, C) with C={num_classes}")
            if blank is not None and (flat == blank).any():
                raise ValueError(f"{name}: label equal to blank={blank} found; targets must not contain the blank")
        return seqs
    for s in seqs:
        for v in s:
            if not 0 <= v < num_classes:
                raise ValueError(f"{name}: label {v} out of range [0, C) with C={num_classes}")
            if blank is not None and v == blank:
                raise ValueError(f"{name}: label equal to blank={blank} found; targets must not contain the blank")
    return seqs


def lengths_and_targets(input_lengths, targets, target_lengths, shape: Tuple[int, int, int],
                        device: torch.device, blank: Optional[int] = None):
    """Checked ``(lengths (B,), target sequences, target lengths (B,))`` of a loss call.

    ``shape`` is the emissions' ``(B, T, C)``: lengths must be ``<= T``, labels in ``[0, C)``.
    """
    B, T, C = shape
    lengths = as_lengths(input_lengths, B, "input_lengths", device, max_value=T)
    seqs = split_targets(targets, target_lengths, B, device, C, blank=blank)
    tlen = np.asarray([len(s) for s in seqs], dtype=np.int64)
    return lengths, seqs, tlen


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def pick_impl(x: torch.Tensor, impl: Optional[str]) -> str:
    """The scoring implementation: numba on the CPU; elsewhere :func:`._dispatch.device_impl`
    (Triton on CUDA when installed and self-checked, else torch)."""
    if impl is None:
        if x.device.type == "cpu":
            return "numba"
        return _dispatch.device_impl(x.device)
    if impl not in ("numba", "numba_log", "torch", "triton"):
        raise ValueError(f"_impl must be 'numba', 'numba_log', 'torch' or 'triton', got {impl!r}")
    if impl.startswith("numba") and x.device.type != "cpu":
        raise ValueError(f"_impl={impl!r} needs CPU tensors")
    if impl == "triton" and not _triton.available():
        raise ValueError("_impl='triton' needs the triton package")
    return impl


# ---------------------------------------------------------------------------
# the shared core: per-row sum of signed forward scores
# ---------------------------------------------------------------------------


class Plan:
    """Examples of a loss: which graph scores which emission row, with which sign.

    ``loss[b] = sum over examples e of row b of sign[e] * logZ[e]``.
    """

    def __init__(self, graphs: Sequence[CompiledGraph], ex_graph, ex_row, ex_len, ex_sign, B: int) -> None:
        self.batch = GraphBatch(graphs)
        order = np.argsort(np.asarray(ex_row), kind="stable")
        self.problem = _dispatch.Problem(self.batch, np.asarray(ex_graph)[order], np.asarray(ex_row)[order],
                                      np.asarray(ex_len)[order])
        self.sign = np.asarray(ex_sign, dtype=np.float64)[order]
        self.B = B
        # read where the loss is called (inside Function.forward grad mode is always off)
        self.grad_enabled = torch.is_grad_enabled()


def normalised_plan(full: CompiledGraph, targets: Sequence[CompiledGraph], lengths: np.ndarray) -> Plan:
    """Row ``b`` scores ``log Z(full) - log Z(targets[b])`` over ``lengths[b]`` frames."""
    B = len(targets)
    graphs, ids = unique_graphs([full] * B + list(targets))
    rows = np.concatenate([np.arange(B), np.arange(B)])
    sign = np.concatenate([np.ones(B), -np.ones(B)])
    return Plan(graphs, ids, rows, np.concatenate([lengths, lengths]), sign, B)


def graph_weights(plan: Plan, x: torch.Tensor) -> torch.Tensor:
    """The plan's own arc weights ``(num_arcs,)`` in ``x``'s dtype and on its device."""
    return torch.from_numpy(plan.batch.weights()).to(device=x.device, dtype=x.dtype)


def unique_graphs(per_example: Sequence[CompiledGraph]):
    """Deduplicated graph list and the index of each example's graph."""
    index = {}
    graphs = []
    ids = np.empty(len(per_example), dtype=np.int64)
    for i, g in enumerate(per_example):
        k = id(g)
        j = index.get(k)
        if j is None:
            j = index[k] = len(graphs)
            graphs.append(g)
        ids[i] = j
    return graphs, ids


def score_forward(ctx, E: torch.Tensor, w: torch.Tensor, plan: Plan, impl: str, zero_infinity: bool,
                  need_w: bool = False):
    """Shared forward: returns per-row losses ``(B,)``; stores what backward needs on ``ctx``.

    On the CPU (``impl="numba"``) the fused scaled kernel computes the emission gradient and,
    when ``need_w``, the arc occupancies right away; ``impl="numba_log"`` forces the log-domain
    kernels (alphas stored, betas in backward).
    """
    E = E.contiguous()
    w = w.detach().contiguous()
    p = plan.problem
    ctx.fused_grad = None
    ctx.state = None
    ctx.arc_occ = None
    if impl == "numba":
        need_e = bool(ctx.needs_input_grad[0]) and plan.grad_enabled
        logz, ctx.fused_grad, ctx.arc_occ = _dispatch.fused(p, E, w, plan.sign, need_e, need_w)
        ctx.fused = True
    else:
        st = _dispatch.forward(p, E, w, "numba" if impl == "numba_log" else impl)
        ctx.state = st
        ctx.fused = False
        logz = st.logz
    rows = torch.from_numpy(p.ex_row).to(E.device)
    sign = torch.from_numpy(plan.sign).to(device=E.device, dtype=E.dtype)
    # infeasible pieces: -inf contributions must not turn into nan (inf - inf) for a row
    contrib = sign * logz
    contrib = torch.where((logz == -np.inf) & (sign != 0), torch.full_like(logz, np.inf), contrib)
    losses = torch.zeros(plan.B, dtype=E.dtype, device=E.device).index_add_(0, rows, contrib)
    bad = torch.isinf(losses)
    if zero_infinity:
        losses = torch.where(bad, torch.zeros_like(losses), losses)
    ctx.plan = plan
    ctx.bad = bad
    return losses


def score_backward(ctx, grad_losses: torch.Tensor, need_e: bool, need_w: bool):
    st, plan = ctx.state, ctx.plan
    p = plan.problem
    g = torch.where(ctx.bad, torch.zeros_like(grad_losses), grad_losses)
    if ctx.fused:  # the gradients are ready: scale them by the incoming gradient
        gE = gw = None
        if need_e and ctx.fused_grad is not None:
            gE = ctx.fused_grad * g.to(ctx.fused_grad.dtype).reshape(-1, 1, 1)
        if need_w and ctx.arc_occ is not None:
            values, arc_ids, ex = ctx.arc_occ
            coef = g.to(values.dtype)[torch.from_numpy(p.ex_row)] * torch.from_numpy(plan.sign).to(values.dtype)
            gw = torch.zeros(plan.batch.num_arcs, dtype=values.dtype).index_add_(0, arc_ids, values * coef[ex])
        return gE, gw
    dev = st.E.device
    g = g.to(st.E.dtype)
    rows = torch.from_numpy(p.ex_row).to(dev)
    coef = g[rows] * torch.from_numpy(plan.sign).to(device=dev, dtype=st.E.dtype)
    gE, gw = _dispatch.backward(st, coef, need_e, need_w)
    return gE, gw


class ScoreFunction(torch.autograd.Function):
    """Per-row losses ``(B,)`` of a :class:`Plan`: ``sum over the row's examples of sign * log Z``.

    ``apply(emissions (B, T, C), arc_weights (num_arcs,), plan, impl, zero_infinity, need_w)``;
    ``need_w`` asks the forward to keep what the arc weights' gradient needs.
    """

    @staticmethod
    def forward(ctx, emissions, arc_weights, plan, impl, zero_infinity, need_w):
        return score_forward(ctx, emissions, arc_weights, plan, impl, zero_infinity, need_w=need_w)

    @staticmethod
    def backward(ctx, grad_losses):
        gE, gw = score_backward(ctx, grad_losses, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        return gE, gw, None, None, None, None


def reduce_losses(losses: torch.Tensor, reduction: str, divisors: Optional[np.ndarray]) -> torch.Tensor:
    """Applies ``reduction``; "mean" divides by ``divisors`` (clamped to >= 1) first, when given."""
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    if divisors is not None:
        d = torch.from_numpy(np.maximum(divisors, 1)).to(device=losses.device, dtype=losses.dtype)
        losses = losses / d
    return losses.mean()
