"""Best-path decoding of dense emissions."""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..core import checks
from ..core.best_path import BestPathsArgs, best_paths_op, max_semiring_paths, refuse_nan
from ..core.scoring import Plan
from ..wfst import Graph

__all__ = ["viterbi", "best_paths", "collapse"]


def collapse(path: Iterable[int], blank: Optional[int] = None) -> List[int]:
    """Merges repeated labels, then drops ``blank`` (when not None): CTC's and ASG's rule.

    ``path`` holds integer labels; -1 entries (the padding of :func:`best_paths`) are dropped.
    """
    out: List[int] = []
    prev = None
    for lab in path:
        lab = int(lab)
        if lab < 0:
            break
        if lab != prev and lab != blank:
            out.append(lab)
        prev = lab
    return out


def _graph_paths(emissions: torch.Tensor, lengths: np.ndarray, graphs) -> Tuple[torch.Tensor, torch.Tensor]:
    from ..losses.graph import compile_criteria

    B, T, C = emissions.shape
    glist = checks.graph_list(graphs, B, "graphs")
    _, compiled, ids = compile_criteria(glist, C)
    x = emissions.detach().to("cpu", checks.compute_dtype(emissions)).contiguous()
    plan = Plan(compiled, ids, np.arange(B), lengths, np.ones(B), B)
    w = torch.from_numpy(plan.batch.weights()).to(x.dtype)
    paths, scores = max_semiring_paths(x, plan, w, T)
    return paths.to(emissions.device), scores.to(device=emissions.device, dtype=emissions.dtype)


def best_paths(
    emissions: torch.Tensor,
    input_lengths=None,
    *,
    transitions: Optional[torch.Tensor] = None,
    graphs: Union[None, Graph, Sequence[Graph]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The best frame-level label path of each example, as tensors.

    Without ``transitions`` or ``graphs`` the best path is the per-frame argmax. With
    ``transitions`` (ASG's ``(C + 1, C)`` scores, see :func:`~lightning_gtn.functional.asg_loss`)
    it is the max-scoring path of emissions plus transitions. With ``graphs`` it is the best path
    through each criterion graph (eager only: graphs are Python objects). The first two are a
    custom op, usable under ``torch.compile(fullgraph=True)``.

    Args:
        emissions: ``(B, T, C)`` scores (any float dtype, any device; the transition and graph
            searches run on the host).
        input_lengths: ``(B,)`` integer frames per example (default: all ``T``).
        transitions: optional ``(C + 1, C)`` ASG transition scores.
        graphs: optional acceptor per example (or one for all), labels in ``[0, C)`` or -1.

    Returns:
        ``paths`` ``(B, T)`` int64 labels, -1 past each example's length (and for all frames of
        an example whose graph has no path of its length), and ``scores`` ``(B,)``: the best
        path's score (``-inf`` where there is none), in the emissions' dtype.
    """
    B, T, C = checks.check_emissions(emissions, "emissions")
    if transitions is not None and graphs is not None:
        raise ValueError("pass transitions or graphs, not both")
    if input_lengths is None:
        il = torch.full((B,), T, dtype=torch.int64, device=emissions.device)
    else:
        il = checks.int_tensor(input_lengths, "input_lengths")
    if graphs is not None:
        refuse_nan(emissions, checks.as_lengths(il, B, "input_lengths", emissions.device, max_value=T))
    if graphs is not None:
        lengths = checks.as_lengths(il, B, "input_lengths", emissions.device, max_value=T)
        return _graph_paths(emissions, lengths, graphs)
    if transitions is not None:
        from ..losses.asg import check_transitions

        check_transitions(transitions, C, emissions.device)
        transitions = transitions.detach()
    return best_paths_op(*BestPathsArgs(emissions=emissions.detach(), transitions=transitions, input_lengths=il))


def viterbi(
    emissions: torch.Tensor,
    input_lengths=None,
    *,
    blank: Optional[int] = 0,
    transitions: Optional[torch.Tensor] = None,
    graphs: Union[None, Graph, Sequence[Graph]] = None,
    return_paths: bool = False,
) -> Union[List[List[int]], Tuple[List[List[int]], List[List[int]]]]:
    """The best label path of each example (see :func:`best_paths`), collapsed into tokens:
    repeats merged and ``blank`` dropped (``blank=None`` for criteria without a blank, such as
    ASG).

    Args:
        emissions: ``(B, T, C)`` scores.
        input_lengths: ``(B,)`` integer frames per example (default: all ``T``).
        blank: keyword-only; an integer label in ``[0, C)`` removed after collapsing repeats,
            or None.
        transitions: optional ``(C + 1, C)`` ASG transition scores.
        graphs: optional acceptor per example (or one for all).
        return_paths: also return the frame-level label paths.

    Returns:
        ``tokens`` (a list of B lists of ints), or ``(tokens, paths)``. An example whose graph
        has no path of its length gets empty lists.
    """
    B, T, C = checks.check_emissions(emissions, "emissions")
    blank = checks.check_label(blank, "blank", C, allow_none=True)
    paths_t, _ = best_paths(emissions, input_lengths, transitions=transitions, graphs=graphs)
    paths = [[v for v in row if v >= 0] for row in paths_t.cpu().tolist()]
    tokens = [collapse(p, blank) for p in paths]
    return (tokens, paths) if return_paths else tokens
