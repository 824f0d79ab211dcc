"""Losses from any criterion graphs a user builds with :mod:`lightning_gtn.wfst`."""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import numpy as np
import torch

from ..core import checks, criterion
from ..core.criterion_graphs import compiled_user_graph
from ..core.scoring import Plan, pick_impl
from ..wfst import Graph

__all__ = ["graph_loss", "compile_criteria", "check_labels"]


class _FixedPlan(criterion.Criterion):
    """A plan made before the call (the user's graph objects); arc weights are given as is."""

    def __init__(self, plan: Plan) -> None:
        self._plan = plan

    def score(self, E, weights, seqs, lengths, blank, impl, zero_infinity, need_e, w_coef):
        from ..core.scoring import score

        return score(self._plan, E, weights, impl, zero_infinity, need_e, w_coef)


class _GraphLossFunction(torch.autograd.Function):
    """``out`` of :func:`graph_loss` (reduced inside, see :func:`._ops.run_loss`)."""

    @staticmethod
    def forward(
        ctx, emissions, arc_weights, crit, lengths, divisors, reduction, zero_infinity, impl, need_w, graphs, arc_off
    ):
        need_e = bool(ctx.needs_input_grad[0])
        out, gE, gw = criterion.run_loss(
            crit, emissions, arc_weights, None, lengths, divisors, 0, reduction, zero_infinity, impl, need_e, need_w
        )
        ctx.save_for_backward(emissions, arc_weights)
        ctx.gE, ctx.gw = gE, gw
        ctx.args = (crit, lengths, reduction, zero_infinity, impl, need_w, graphs, arc_off)
        return out

    @staticmethod
    def backward(ctx, g_out):
        emissions, arc_weights = ctx.saved_tensors
        crit, lengths, reduction, zero_infinity, impl, need_w, graphs, arc_off = ctx.args
        gE = gw = None
        if reduction == "none":
            if ctx.gE is not None:
                gE = ctx.gE * g_out.reshape(-1, 1, 1)
            if need_w:
                gw = crit.score(emissions, arc_weights, None, lengths, 0, impl, zero_infinity, False, g_out)[2]
        else:
            if ctx.gE is not None:
                gE = ctx.gE * g_out
            if need_w and ctx.gw is not None:
                gw = ctx.gw * g_out
        if gw is not None:
            host = gw.detach().to("cpu", torch.float32).numpy()
            for j, g in enumerate(graphs):
                if g.calc_grad:  # GTN's convention: the graph's own gradient, see Graph.grad()
                    g.add_grad(host[arc_off[j] : arc_off[j + 1]])
        return (gE, gw if ctx.needs_input_grad[1] else None) + (None,) * 9


def _as_graph_list(graphs, B: int, name: str) -> List[Graph]:
    if isinstance(graphs, Graph):
        return [graphs] * B
    if graphs is None:
        raise ValueError(f"{name}: expected one Graph or a list of B={B} graphs, got None")
    graphs = list(graphs)
    if len(graphs) != B:
        raise ValueError(f"{name} must be one Graph or a list of B={B} graphs, got {len(graphs)}")
    for g in graphs:
        if not isinstance(g, Graph):
            raise ValueError(f"{name} must hold lightning_gtn.wfst.Graph objects, got {type(g).__name__}")
    return graphs


def compile_criteria(graphs: Sequence[Graph], C: int, name: str = "graphs"):
    """The distinct graph objects of ``graphs`` (first-appearance order), their compiled
    forms (labels checked against ``C``), and the index of each input graph among them."""
    order: List[Graph] = []
    index = {}
    ids = []
    for g in graphs:
        if id(g) not in index:
            index[id(g)] = len(order)
            order.append(g)
        ids.append(index[id(g)])
    compiled = [check_labels(compiled_user_graph(g), C, name) for g in order]
    return order, compiled, np.asarray(ids, dtype=np.int64)


def check_labels(cg, C: int, name: str):
    """``cg`` (a compiled graph) when its labels lie in ``[0, C)`` or are -1 (epsilon); else
    ValueError naming ``name``. The kernels index emissions with these labels."""
    if cg.max_label >= C or (cg.num_arcs and cg.label.min() < -1):
        bad = cg.max_label if cg.max_label >= C else int(cg.label.min())
        raise ValueError(
            f"{name}: arc label {bad} out of range; labels must lie in [0, C) with C={C} " "(or be -1 for epsilon)"
        )
    return cg


def graph_loss(
    emissions: torch.Tensor,
    targets=None,
    input_lengths=None,
    target_lengths=None,
    *,
    graphs: Union[Graph, Sequence[Graph]],
    denominators: Union[None, Graph, Sequence[Graph]] = None,
    weights: Optional[Sequence[torch.Tensor]] = None,
    reduction: str = "mean",
    zero_infinity: bool = False,
    impl: Optional[str] = None,
) -> torch.Tensor:
    """Negative log-score of criterion graphs against dense emissions, batched.

    For example ``b`` the loss is ``-forward_score(intersect(graphs[b], E_b))`` where ``E_b`` is
    the linear graph of ``emissions[b, :input_lengths[b]]`` (GTN's ``linear_graph``), plus
    ``forward_score(intersect(denominators[b], E_b))`` when denominators are given. The
    graphs' input labels are matched against the ``C`` emission classes; epsilon arcs
    (label -1) are followed without reading a frame (they must not form a cycle); several
    start and accept nodes are fine. Compiled graphs are cached per graph object and version,
    so passing the same graphs again compiles nothing.

    Gradients: the emissions get theirs through autograd. Arc weights get theirs in one of two
    ways: pass ``weights`` (one ``(num_arcs,)`` tensor per distinct graph object, in the order
    the graphs first appear in ``graphs`` then ``denominators``) and autograd delivers
    ``d loss / d weights``; and every graph created with ``calc_grad=True`` also receives its
    gradient in ``graph.grad()`` (accumulated, as ``gtn.backward`` does) when the loss is
    back-propagated.

    This function takes graph objects, so it runs eagerly; under ``torch.compile`` use
    :class:`lightning_gtn.nn.TargetGraphLoss`, whose graphs are built from the targets inside
    a custom op.

    Args:
        emissions: ``(B, T, C)`` scores, float32/float64 (float16/bfloat16 in float32).
        targets: optional; only their lengths are used (for ``"mean"``), when
            ``target_lengths`` is not given: a list of B sequences.
        input_lengths: ``(B,)`` integer frames per example, ``<= T`` (default: all ``T``).
        target_lengths: optional ``(B,)``: ``"mean"`` divides each loss by it (clamped to 1).
        graphs: keyword-only; one acceptor per example (or a single graph used by all),
            labels in ``[0, C)`` or -1.
        denominators: optional graphs whose forward score is added (e.g. a normaliser).
        weights: optional tensors replacing the graphs' own weights (see above).
        reduction: ``"none"`` -> ``(B,)``, ``"sum"``, or ``"mean"`` (divided by the target
            lengths when known, then averaged over the batch).
        zero_infinity: examples with no path give 0 instead of ``inf``.
        impl: None, ``"numba"``, ``"numba_log"``, ``"torch"`` or ``"triton"``.

    Returns:
        Loss in the emissions' dtype and device.
    """
    B, T, C = checks.check_emissions(emissions, "emissions")
    checks.check_reduction(reduction)
    if checks.check_impl(impl) == "gtn":
        raise ValueError("graph_loss: impl='gtn' is not available; use None, 'numba', 'numba_log', 'torch' or 'triton'")
    dev = emissions.device
    lengths = (
        np.full(B, T, dtype=np.int64)
        if input_lengths is None
        else checks.as_lengths(input_lengths, B, "input_lengths", dev, max_value=T)
    )
    divisors = None
    if target_lengths is not None:
        divisors = checks.as_lengths(target_lengths, B, "target_lengths", dev)
    elif targets is not None:
        divisors = np.asarray([len(t) for t in checks.split_targets(targets, None, B, dev, 2**62)], dtype=np.int64)
    nums = _as_graph_list(graphs, B, "graphs")
    dens = None if denominators is None else _as_graph_list(denominators, B, "denominators")
    impl = pick_impl(emissions, impl)
    dtype = checks.compute_dtype(emissions)
    x = emissions.to(dtype)
    order, compiled, ids = compile_criteria(nums + (dens or []), C)
    rows = np.concatenate([np.arange(B)] * (2 if dens is not None else 1))
    sign = np.concatenate([-np.ones(B)] + ([np.ones(B)] if dens is not None else []))
    ex_len = np.concatenate([lengths] * (2 if dens is not None else 1))
    plan = Plan(compiled, ids, rows, ex_len, sign, B)
    if weights is not None:
        weights = list(weights)
        if len(weights) != len(order):
            raise ValueError(f"weights must hold one tensor per distinct graph ({len(order)}), got {len(weights)}")
        parts = []
        for g, wt in zip(order, weights):
            if not isinstance(wt, torch.Tensor) or tuple(wt.shape) != (g.num_arcs(),):
                raise ValueError(f"weights: expected a tensor of shape (num_arcs,) = ({g.num_arcs()},) per graph")
            if wt.device != x.device:
                raise ValueError(f"weights are on {wt.device} but emissions on {x.device}")
            parts.append(wt.to(dtype))
        w = torch.cat(parts) if parts else torch.zeros(0, dtype=dtype, device=x.device)
    else:
        w = torch.from_numpy(plan.batch.weights()).to(device=x.device, dtype=dtype)
    need_w = bool(torch.is_grad_enabled() and (w.requires_grad or any(g.calc_grad for g in order)))
    if need_w and not w.requires_grad:
        # only graphs with calc_grad want the gradient: a private leaf makes autograd call backward
        w = w.detach().requires_grad_(True)
    out = _GraphLossFunction.apply(
        x,
        w,
        _FixedPlan(plan),
        lengths,
        divisors,
        reduction,
        bool(zero_infinity),
        impl,
        need_w,
        order,
        plan.batch.arc_off,
    )
    return out.to(emissions.dtype)
