"""The shared core of every loss: a :class:`Plan` of signed forward scores per emission row,
scored with its gradients in one call.

``loss[b] = sum over the examples e of row b of sign[e] * log Z[e]``, where example ``e`` scores
one compiled criterion graph against ``emissions[b, :len_e]``. :func:`score` returns the losses
and, on request, their gradients with respect to the emissions (per row) and the arc weights
(weighted by per-row coefficients), so that the custom ops of :mod:`.criterion` compute everything a
backward needs in their forward.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from ..kernels import graph_triton
from ..kernels.compiled_graphs import CompiledGraph, GraphBatch
from . import checks, dispatch
from .impl import Backends

__all__ = ["Plan", "normalised_plan", "unique_graphs", "graph_weights", "pick_impl", "score"]


class Plan:
    """Examples of a loss: which graph scores which emission row, with which sign.

    Args:
        graphs: the distinct compiled graphs.
        ex_graph, ex_row, ex_len, ex_sign: ``(N,)`` per example: graph index, emission row,
            frames, sign.
        B: the number of emission rows.
    """

    def __init__(self, graphs: Sequence[CompiledGraph], ex_graph, ex_row, ex_len, ex_sign, B: int) -> None:
        self.batch = GraphBatch(graphs)
        order = np.argsort(np.asarray(ex_row), kind="stable")
        self.problem = dispatch.Problem(
            self.batch, np.asarray(ex_graph)[order], np.asarray(ex_row)[order], np.asarray(ex_len)[order]
        )
        self.sign = np.asarray(ex_sign, dtype=np.float64)[order]
        self.B = B


def unique_graphs(per_example: Sequence[CompiledGraph]):
    """Deduplicated graph list and the index of each example's graph."""
    index: dict = {}
    graphs: list[CompiledGraph] = []
    ids = np.empty(len(per_example), dtype=np.int64)
    for i, g in enumerate(per_example):
        j = index.get(id(g))
        if j is None:
            j = index[id(g)] = len(graphs)
            graphs.append(g)
        ids[i] = j
    return graphs, ids


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


#: how ``impl`` resolves for the graph DP (:mod:`.dispatch`): numba on the CPU, Triton on CUDA
#: once :func:`.dispatch.triton_self_check` passes there, torch elsewhere
GRAPH_BACKENDS = Backends(
    "graph scoring",
    checks.NATIVE_BACKENDS,
    triton_available=graph_triton.available,
    self_check=dispatch.triton_self_check,
)


def pick_impl(x: torch.Tensor, impl: Optional[str]) -> str:
    """The scoring implementation for emissions ``x``: :data:`GRAPH_BACKENDS`'s choice (the losses
    checked ``impl`` against their criterion; a direct caller of an op may not have)."""
    return GRAPH_BACKENDS.pick(x.device, impl)


def score(
    plan: Plan,
    E: torch.Tensor,
    w: torch.Tensor,
    impl: str,
    zero_infinity: bool,
    need_e: bool,
    w_coef: Optional[torch.Tensor] = None,
):
    """Losses of a plan and their gradients.

    Args:
        plan: the examples.
        E: ``(B, T, C)`` float32/float64 emissions.
        w: ``(num_arcs,)`` arc weights in E's dtype and on its device.
        impl: a resolved implementation (see :func:`pick_impl`).
        zero_infinity: rows with no path get loss 0 instead of ``inf`` (never a row whose
            terms read an infinite score: its loss stays infinite or NaN).
        need_e: also return ``d loss[b] / d E[b]`` for every row (a ``(B, T, C)`` tensor).
        w_coef: ``(B,)`` coefficients; when given, also return
            ``sum_b w_coef[b] * d loss[b] / d w`` (a ``(num_arcs,)`` tensor).

    Returns:
        ``(losses (B,), grad_E or None, grad_w or None)`` on E's device, E's dtype. Rows with no
        path (infinite loss) have zero gradients.
    """
    E = E.detach().contiguous()
    w = w.detach().contiguous()
    p = plan.problem
    dev, dtype = E.device, E.dtype
    rows = torch.from_numpy(p.ex_row).to(dev)
    sign = torch.from_numpy(plan.sign).to(device=dev, dtype=dtype)
    need_w = w_coef is not None
    if impl == "numba":
        logz, gE, occ = dispatch.fused(p, E, w, plan.sign, need_e, need_w)
        st = None
    else:
        st = dispatch.forward(p, E, w, "numba" if impl == "numba_log" else impl)
        logz, gE, occ = st.logz, None, None
    # infeasible pieces: -inf contributions must not turn into nan (inf - inf) for a row
    contrib = sign * logz
    contrib = torch.where((logz == -np.inf) & (sign != 0), torch.full_like(logz, np.inf), contrib)
    losses = torch.zeros(plan.B, dtype=dtype, device=dev).index_add_(0, rows, contrib)
    ok = ~torch.isinf(losses)
    if zero_infinity:
        # only an infeasible row (+inf: a term without a path) is zeroed; a row that reads an
        # infinite score (a +inf emission or weight: a term of log Z = +inf) keeps its loss
        inf_in = torch.zeros(plan.B, dtype=dtype, device=dev).index_add_(
            0, rows, ((logz == np.inf) & (sign != 0)).to(dtype)
        )
        zero = (losses == np.inf) & (inf_in == 0)
        losses = torch.where(zero, torch.zeros_like(losses), losses)
    okf = ok.to(dtype)
    gw = None
    if st is not None:  # log-domain state: the backward pass, once per set of coefficients
        ecoef = sign * okf[rows]
        if w_coef is not None:  # need_w
            wcoef = sign * (okf * w_coef.to(device=dev, dtype=dtype))[rows]
            if need_e and bool(torch.equal(wcoef, ecoef)):
                gE, gw = dispatch.backward(st, ecoef, True, True)
            else:
                gE = dispatch.backward(st, ecoef, True, False)[0] if need_e else None
                gw = dispatch.backward(st, wcoef, False, True)[1]
        elif need_e:
            gE = dispatch.backward(st, ecoef, True, False)[0]
    else:
        if need_e and gE is not None and not bool(ok.all()):
            gE.mul_(okf.reshape(-1, 1, 1))  # the kernel's own buffer: infeasible rows zeroed in place
        if w_coef is not None:  # need_w
            values, arc_ids, ex = occ
            coef = (okf * w_coef.to(dtype))[torch.from_numpy(p.ex_row)] * torch.from_numpy(plan.sign).to(values.dtype)
            gw = torch.zeros(plan.batch.num_arcs, dtype=values.dtype).index_add_(0, arc_ids, values * coef[ex])
    if gE is not None:
        gE = gE.to(dtype)
    if gw is not None:
        gw = gw.to(device=dev, dtype=dtype)
    return losses, (gE if need_e else None), gw
