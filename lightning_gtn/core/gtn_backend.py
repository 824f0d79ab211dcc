"""``impl="gtn"``: the same losses computed by the real ``gtn`` package, GTN's way.

The pattern of GTN's PyTorch documentation: copy the emissions to the host, make one linear
graph per example whose weights are set from the tensor's memory (``set_weights(data_ptr)``,
keeping a reference to that memory), build the criterion graph, ``intersect`` and
``forward_score`` (for CTC, ``gtn.criterion.ctc_loss`` does all three), all under
``gtn.parallel_for`` over the batch; the backward calls
``gtn.backward`` per example and copies the gradients back to the input's device.

This path is a cross-check and a bridge for code that already depends on ``gtn``; the native
backend is the fast one. Only ``import gtn`` is used here, so anything that provides GTN's
API under that name (including ``lightning_gtn.wfst``) can stand in for it.
"""

from __future__ import annotations

import importlib
from typing import Any, List

import numpy as np
import torch

from .criterion_graphs import build_force_align

__all__ = ["gtn_ctc_losses", "gtn_asg_losses", "gtn_sequence_losses", "import_gtn"]


def import_gtn():
    """``import gtn``, or an ImportError that says what to do instead."""
    try:
        import gtn  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "impl='gtn' needs the `gtn` package (GTN's Python bindings), which is not "
            "installed; use impl=None (the default), which computes the same losses"
        ) from err
    return gtn


def _transitions_graph(gtn, C: int, data: torch.Tensor, calc_grad: bool):
    g = gtn.Graph(calc_grad)
    g.add_node(True)
    for i in range(C):
        g.add_node(False, True)
        g.add_arc(0, i + 1, i)
    for i in range(C):
        for j in range(C):
            g.add_arc(j + 1, i + 1, i)
    g.set_weights(data.data_ptr())  # row-major (C + 1, C): the arc order above
    return g


class _GTNFunction(torch.autograd.Function):
    """Per-example losses ``(B,)`` from one GTN loss graph per example."""

    @staticmethod
    def forward(ctx, emissions, transitions, kind, seqs, lengths, blank, zero_infinity):
        gtn = import_gtn()
        device, dtype = emissions.device, emissions.dtype
        B, T, C = emissions.shape
        host = emissions.detach().to("cpu", torch.float32).contiguous()
        calc_e = bool(ctx.needs_input_grad[0])
        calc_t = bool(transitions is not None and ctx.needs_input_grad[1])
        tr_host = None if transitions is None else transitions.detach().to("cpu", torch.float32).contiguous()
        losses: List[Any] = [None] * B
        emission_graphs: List[Any] = [None] * B
        transition_graphs: List[Any] = [None] * B
        keep: List[Any] = [None] * B  # the memory whose address set_weights read
        criterion = importlib.import_module(gtn.__name__ + ".criterion") if kind == "ctc" else None

        def process(b):
            Tb = int(lengths[b])
            data = host[b, :Tb].contiguous()
            keep[b] = data
            em = gtn.linear_graph(Tb, C, calc_grad=calc_e)
            em.set_weights(data.data_ptr())
            target = list(seqs[b])
            if kind == "ctc":
                assert criterion is not None  # imported above for "ctc"
                loss = criterion.ctc_loss(em, target, blank)
            elif kind == "sequence":
                target_score = gtn.forward_score(gtn.intersect(build_force_align(gtn, target), em))
                loss = gtn.subtract(gtn.forward_score(em), target_score)
            elif kind == "asg":
                assert tr_host is not None  # ASG has transitions (checked by the caller)
                trg = _transitions_graph(gtn, C, tr_host, calc_t)
                transition_graphs[b] = trg
                full = gtn.forward_score(gtn.intersect(em, trg))
                fal = gtn.intersect(build_force_align(gtn, target), trg)
                loss = gtn.subtract(full, gtn.forward_score(gtn.intersect(fal, em)))
            else:  # pragma: no cover - internal
                raise ValueError(kind)
            losses[b] = loss
            emission_graphs[b] = em

        gtn.parallel_for(process, range(B))
        values = torch.tensor([l.item() for l in losses], dtype=torch.float64)
        bad = torch.isinf(values)
        if zero_infinity:
            values = torch.where(bad, torch.zeros_like(values), values)
        ctx.saved = (losses, emission_graphs, transition_graphs, keep, bad, lengths, (B, T, C), device, dtype)
        return values.to(device=device, dtype=dtype)

    @staticmethod
    def backward(ctx, grad_losses):
        gtn = import_gtn()
        losses, emission_graphs, transition_graphs, keep, bad, lengths, shape, device, dtype = ctx.saved
        B, T, C = shape
        g = torch.where(bad.to(grad_losses.device), torch.zeros_like(grad_losses), grad_losses).detach().cpu().double()
        need_e = ctx.needs_input_grad[0]
        need_t = ctx.needs_input_grad[1]
        grad_e = torch.zeros((B, T, C), dtype=torch.float32) if need_e else None
        grad_t = torch.zeros((B, C + 1, C), dtype=torch.float32) if need_t else None

        def process(b):
            if float(g[b]) == 0.0:
                return
            gtn.backward(losses[b], False)
            scale = float(g[b])
            if grad_e is not None:
                Tb = int(lengths[b])
                ge = emission_graphs[b].grad().weights_to_numpy().reshape(Tb, C)
                grad_e[b, :Tb] = torch.from_numpy(ge) * scale
            if grad_t is not None and transition_graphs[b] is not None:
                gt = transition_graphs[b].grad().weights_to_numpy().reshape(C + 1, C)
                grad_t[b] = torch.from_numpy(gt) * scale

        gtn.parallel_for(process, range(B))
        out_e = None if grad_e is None else grad_e.to(device=device, dtype=dtype)
        out_t = None if grad_t is None else grad_t.sum(0).to(device=device, dtype=dtype)
        return out_e, out_t, None, None, None, None, None


def _run(kind, emissions, transitions, seqs, lengths, blank, zero_infinity) -> torch.Tensor:
    import_gtn()  # fail early with the clear message
    return _GTNFunction.apply(
        emissions, transitions, kind, [list(s) for s in seqs], np.asarray(lengths), blank, bool(zero_infinity)
    )


def gtn_ctc_losses(log_probs, seqs: List[List[int]], lengths, blank: int, zero_infinity: bool) -> torch.Tensor:
    """``(B,)`` CTC losses through ``gtn``."""
    return _run("ctc", log_probs, None, seqs, lengths, blank, zero_infinity)


def gtn_asg_losses(emissions, transitions, seqs, lengths, zero_infinity: bool) -> torch.Tensor:
    """``(B,)`` ASG losses through ``gtn`` (transitions laid out as :func:`~lightning_gtn.losses.asg.asg_loss` says)."""
    return _run("asg", emissions, transitions, seqs, lengths, None, zero_infinity)


def gtn_sequence_losses(emissions, seqs, lengths, zero_infinity: bool) -> torch.Tensor:
    """``(B,)`` sequence-criterion losses through ``gtn``."""
    return _run("sequence", emissions, None, seqs, lengths, None, zero_infinity)
