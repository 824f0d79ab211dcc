"""Best-path decoding of dense emissions."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..wfst import Graph
from . import _common, _dispatch
from ._graphs import compile_graph, compiled_asg_full

__all__ = ["viterbi", "collapse"]


def collapse(path: Sequence[int], blank: Optional[int] = None) -> List[int]:
    """Merges repeated labels, then drops ``blank`` (when not None): CTC's and ASG's rule."""
    out: List[int] = []
    prev = None
    for lab in path:
        lab = int(lab)
        if lab != prev and lab != blank:
            out.append(lab)
        prev = lab
    return out


def viterbi(
    emissions: torch.Tensor,
    input_lengths=None,
    blank: Optional[int] = 0,
    transitions: Optional[torch.Tensor] = None,
    graphs: Union[None, Graph, Sequence[Graph]] = None,
    return_paths: bool = False,
) -> Union[List[List[int]], Tuple[List[List[int]], List[List[int]]]]:
    """The best label path of each example, collapsed into tokens.

    Without ``transitions`` or ``graphs`` the best path is the per-frame argmax (CTC's best
    path decoding). With ``transitions`` (ASG's ``(C + 1, C)`` scores, see
    :func:`~lightning_gtn.functional.asg_loss`) it is the max-scoring path of emissions plus
    transitions. With ``graphs`` it is the best path through each criterion graph. The
    frame labels are then collapsed: repeats merged and ``blank`` dropped (pass
    ``blank=None`` for criteria without a blank, such as ASG).

    Args:
        emissions: ``(B, T, C)`` scores (any float dtype, any device; graph-based decoding
            runs on the host).
        input_lengths: ``(B,)`` frames per example (default: all ``T``).
        blank: label removed after collapsing repeats, or None.
        transitions: optional ``(C + 1, C)`` ASG transition scores.
        graphs: optional acceptor per example (or one for all).
        return_paths: also return the frame-level label paths.

    Returns:
        ``tokens`` (a list of B lists of ints), or ``(tokens, paths)``. An example whose graph
        has no path of its length gets empty lists.
    """
    B, T, C = _common.check_emissions(emissions, "emissions")
    if input_lengths is None:
        lengths = np.full(B, T, dtype=np.int64)
    else:
        lengths = _common.as_lengths(input_lengths, B, "input_lengths", emissions.device, max_value=T)
    if blank is not None and not 0 <= int(blank) < C:
        raise ValueError(f"blank must be in [0, C) with C={C} or None, got {blank!r}")
    if transitions is not None and graphs is not None:
        raise ValueError("pass transitions or graphs, not both")
    with torch.no_grad():
        if transitions is None and graphs is None:
            best = emissions.argmax(-1).cpu().tolist()
            paths = [best[b][: lengths[b]] for b in range(B)]
        else:
            x = emissions.detach().to("cpu", _common.compute_dtype(emissions)).contiguous()
            if transitions is not None:
                if tuple(transitions.shape) != (C + 1, C):
                    raise ValueError(f"transitions must have shape (C + 1, C) = ({C + 1}, {C}), "
                                     f"got {tuple(transitions.shape)}")
                cg = compiled_asg_full(C)
                compiled, ex_graph = [cg], np.zeros(B, dtype=np.int64)
                w = transitions.detach().to("cpu", x.dtype).reshape(-1)[torch.from_numpy(cg.weight_index)]
            else:
                glist = [graphs] * B if isinstance(graphs, Graph) else list(graphs)
                if len(glist) != B:
                    raise ValueError(f"graphs must be one Graph or B={B} graphs, got {len(glist)}")
                compiled = [compile_graph(g) for g in glist]
                ex_graph = np.arange(B)
                w = torch.from_numpy(np.concatenate([c.weights for c in compiled])).to(x.dtype)
            plan = _common.Plan(compiled, ex_graph, np.arange(B), lengths, np.ones(B), B)
            st = _dispatch.forward(plan.problem, x, w.contiguous(), "numba", use_max=True)
            labels = _dispatch.viterbi_labels(st)
            paths = [[] if lab is None else lab.tolist() for lab in labels]
    tokens = [collapse(p, blank) for p in paths]
    return (tokens, paths) if return_paths else tokens
