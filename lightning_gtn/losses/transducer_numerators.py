"""The transducer's numerators scored for a batch: ``-log Z`` of each target's alignment
acceptor (:class:`~.transducer_graphs.TransducerGraphs`) and its gradients.

Three ways, picked by the criterion (:mod:`.transducer`):

* :func:`hub_numerators`: the plain alignment acceptors (no transitions, or label weights folded
  into the emissions) through their hubs on the CPU (:mod:`lightning_gtn.kernels.transducer_hubs`,
  when :func:`use_hub`); rows it cannot vouch for go to :func:`plain_numerators`.
* :func:`plain_numerators`: the same graphs by the graph kernels (any device).
* :func:`weighted_numerators`: the numerators whose arcs carry learned transition weights
  (the product with the transitions, or the research bigram's graphs) by the graph kernels.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..core.scoring import Plan, score, unique_graphs
from ..kernels import transducer_hubs
from .transducer_graphs import TransducerGraphs

__all__ = ["use_hub", "hub_numerators", "plain_numerators", "weighted_numerators"]


def _score_plan(plan, E, w, impl, need_e, w_coef):
    return score(plan, E, w, impl, False, need_e, w_coef)


def use_hub(graphs: TransducerGraphs, E: torch.Tensor, impl: Optional[str]) -> bool:
    """Whether the plain numerators of ``graphs`` are scored through their hubs: on the CPU with
    ``impl="numba"``, unless ``allow_repeats=False`` (with the optional blank: no hubs)."""
    hub_ok = graphs.blank_mode != "optional" or graphs.allow_repeats
    return hub_ok and impl == "numba" and E.device.type == "cpu"


def plain_numerators(graphs: TransducerGraphs, E, seqs, lengths, impl, need_e, coef, w=None):
    """``(-log Z, d/dE or None, sum_b coef[b] * d/dw by label (C,) or None)`` of the plain
    numerators of ``seqs`` against ``E + w`` by the graph kernels (any device)."""
    n = len(seqs)
    graphs_, ids = unique_graphs([graphs.numerator(s, plain=True) for s in seqs])
    plan = Plan(graphs_, ids, np.arange(n), lengths, -np.ones(n), n)
    x = E.detach() if w is None else E.detach() + w
    zero_w = torch.zeros(plan.batch.num_arcs, dtype=E.dtype, device=E.device)
    losses, gE, gw = _score_plan(plan, x.contiguous(), zero_w, impl, need_e, coef)
    gw_lab = None
    if gw is not None:
        labels = torch.from_numpy(plan.batch.label.astype(np.int64)).to(E.device)
        gw_lab = torch.zeros(E.shape[2], dtype=E.dtype, device=E.device).index_add_(0, labels, gw.to(E.dtype))
    return losses, gE, gw_lab


def hub_numerators(graphs: TransducerGraphs, E, seqs, lengths, impl, need_e, coef, w=None, gE=None):
    """``(-log Z (B,), d/dE or None, sum_b coef[b] * label occupancies (C,) or None)`` of the
    plain numerators against ``E + w`` by :mod:`lightning_gtn.kernels.transducer_hubs` (the
    emission gradient added into ``gE`` when given); rows it cannot vouch for take the graph
    kernels (:func:`plain_numerators`)."""
    B, T, C = E.shape
    need_l = coef is not None
    logz, flag, gE, lsum = transducer_hubs.numerators(
        E,
        [graphs.lattice_arrays(s) for s in seqs],
        lengths,
        graphs.blank_mode,
        graphs.num_tokens,
        need_e,
        need_l,
        w=w,
        gE=gE,
    )
    losses = torch.from_numpy(-logz).to(E.dtype)
    gw_lab = None
    if need_l:
        # the loss is -log Z: its gradient is minus the occupancies
        gw_lab = torch.from_numpy(-(lsum.T @ coef.detach().cpu().numpy().astype(np.float64))).to(E.dtype)
    redo = np.nonzero(flag)[0]
    if len(redo):
        sub = torch.from_numpy(redo)
        l2, g2, gw2 = plain_numerators(
            graphs,
            E[sub],
            [seqs[i] for i in redo],
            lengths[redo],
            impl,
            need_e,
            None if coef is None else coef[sub],
            w=w,
        )
        losses[sub] = l2
        if need_e:
            gE[sub] += g2
        if need_l:
            gw_lab += gw2
    return losses, gE, gw_lab


def weighted_numerators(
    graphs: TransducerGraphs, E, weights, seqs, lengths, impl, need_e, w_coef, bigram: bool = False
):
    """``(weight index, weights, -log Z, grad_E, grad_w)`` of the batch's numerator graphs with
    their transition weights (the dense normalisers add their own terms; ``bigram``: see
    :meth:`~.transducer_graphs.TransducerGraphs.numerator`)."""
    B, T, C = E.shape
    if C != graphs.C:
        raise ValueError(f"emissions must have C = len(tokens) + (blank != 'none') = {graphs.C} classes, got {C}")
    graphs_, ids = unique_graphs([graphs.numerator(s, bigram=bigram) for s in seqs])
    plan = Plan(graphs_, ids, np.arange(B), lengths, -np.ones(B), B)
    widx = torch.from_numpy(plan.batch.weight_index()).to(E.device)
    w = weights.detach().reshape(-1).to(E.dtype)
    t_coef = None if w_coef is None else w_coef.to(E.dtype)
    return (widx, w) + tuple(_score_plan(plan, E, w[widx], impl, need_e, t_coef))
