"""Losses from any criterion graphs a user builds with :mod:`lightning_gtn.wfst`."""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import numpy as np
import torch

from ..wfst import Graph
from . import _common
from ._graphs import compiled_user_graph

__all__ = ["graph_loss"]


class _GraphLossFunction(torch.autograd.Function):
    """Per-example losses ``(B,)``: ``log Z(denominator) - log Z(numerator)``."""

    @staticmethod
    def forward(ctx, emissions, arc_weights, plan, impl, zero_infinity, need_w, graphs):
        ctx.graphs = graphs
        return _common.score_forward(ctx, emissions, arc_weights, plan, impl, zero_infinity, need_w=need_w)

    @staticmethod
    def backward(ctx, grad_losses):
        need_w = ctx.needs_input_grad[1] or any(g.calc_grad for g in ctx.graphs)
        gE, gw = _common.score_backward(ctx, grad_losses, ctx.needs_input_grad[0], need_w)
        if gw is not None:
            off = ctx.plan.batch.arc_off
            host = gw.detach().to("cpu", torch.float32).numpy()
            for j, g in enumerate(ctx.graphs):
                if g.calc_grad:  # GTN's convention: the graph's own gradient, see Graph.grad()
                    g.add_grad(host[off[j] : off[j + 1]])
        return gE, (gw if ctx.needs_input_grad[1] else None), None, None, None, None, None


def _as_graph_list(graphs, B: int, name: str) -> List[Graph]:
    if isinstance(graphs, Graph):
        return [graphs] * B
    graphs = list(graphs)
    if len(graphs) != B:
        raise ValueError(f"{name} must be one Graph or a list of B={B} graphs, got {len(graphs)}")
    for g in graphs:
        if not isinstance(g, Graph):
            raise ValueError(f"{name} must hold lightning_gtn.wfst.Graph objects, got {type(g).__name__}")
    return graphs


def graph_loss(
    emissions: torch.Tensor,
    graphs: Union[Graph, Sequence[Graph]],
    input_lengths,
    reduction: str = "none",
    denominators: Union[None, Graph, Sequence[Graph]] = None,
    weights: Optional[Sequence[torch.Tensor]] = None,
    zero_infinity: bool = False,
    _impl: Optional[str] = None,
) -> torch.Tensor:
    """Negative log-score of criterion graphs against dense emissions, batched.

    For example ``b`` the loss is ``-forward_score(intersect(graphs[b], E_b))`` where ``E_b`` is
    the linear graph of ``emissions[b, :input_lengths[b]]`` (GTN's ``linear_graph``), plus
    ``forward_score(intersect(denominators[b], E_b))`` when denominators are given. The
    graphs' input labels are matched against the ``C`` emission classes; epsilon arcs
    (label -1) are followed without reading a frame (they must not form a cycle); several
    start and accept nodes are fine.

    Gradients: the emissions get theirs through autograd. Arc weights get theirs in one of two
    ways: pass ``weights`` (one ``(num_arcs,)`` tensor per distinct graph object, in the order
    the graphs first appear in ``graphs`` then ``denominators``) and autograd delivers
    ``d loss / d weights``; and every graph created with ``calc_grad=True`` also receives its
    gradient in ``graph.grad()`` (accumulated, as ``gtn.backward`` does) when the loss is
    back-propagated.

    Args:
        emissions: ``(B, T, C)`` scores, float32/float64 (float16/bfloat16 in float32).
        graphs: one acceptor per example (or a single graph used by all), labels in ``[0, C)``
            or -1.
        input_lengths: ``(B,)`` frames per example, ``<= T``.
        reduction: ``"none"`` -> ``(B,)``, ``"sum"``, or ``"mean"`` (batch average).
        denominators: optional graphs whose forward score is added (e.g. a normaliser).
        weights: optional tensors replacing the graphs' own weights (see above).
        zero_infinity: examples with no path give 0 instead of ``inf``.

    Returns:
        Loss in the emissions' dtype and device.
    """
    B, T, C = _common.check_call(emissions, "emissions", reduction)
    lengths = _common.as_lengths(input_lengths, B, "input_lengths", emissions.device, max_value=T)
    nums = _as_graph_list(graphs, B, "graphs")
    dens = None if denominators is None else _as_graph_list(denominators, B, "denominators")
    impl = _common.pick_impl(emissions, _impl)
    dtype = _common.compute_dtype(emissions)
    x = emissions.to(dtype)
    # distinct graph objects, compiled once (cached while unchanged)
    order: List[Graph] = []
    index = {}
    for g in nums + (dens or []):
        if id(g) not in index:
            index[id(g)] = len(order)
            order.append(g)
    compiled = []
    for g in order:
        cg = compiled_user_graph(g)
        if cg.max_label >= C or (cg.num_arcs and cg.label.min() < -1):
            raise ValueError(f"graphs: arc label {cg.max_label} out of range; labels must lie in [0, C) "
                             f"with C={C} (or be -1 for epsilon)")
        compiled.append(cg)
    ex_graph = [index[id(g)] for g in nums]
    rows = list(range(B))
    sign = [-1.0] * B
    if dens is not None:
        ex_graph += [index[id(g)] for g in dens]
        rows += list(range(B))
        sign += [1.0] * B
    ex_len = np.concatenate([lengths] * (2 if dens is not None else 1))
    plan = _common.Plan(compiled, ex_graph, rows, ex_len, sign, B)
    if weights is not None:
        weights = list(weights)
        if len(weights) != len(order):
            raise ValueError(f"weights must hold one tensor per distinct graph ({len(order)}), got {len(weights)}")
        parts = []
        for g, wt in zip(order, weights):
            if not isinstance(wt, torch.Tensor) or wt.shape != (g.num_arcs(),):
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
    losses = _GraphLossFunction.apply(x, w, plan, impl, bool(zero_infinity), need_w, order)
    return _common.reduce_losses(losses, reduction, None).to(emissions.dtype)
