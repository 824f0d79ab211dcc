"""``gtn.criterion``: loss graphs written with the engine."""

from __future__ import annotations

from typing import Sequence

from .functions import forward_score, intersect, negate
from .graph import Graph


def ctc_graph(target: Sequence[int], blank_idx: int, calc_grad: bool = False) -> Graph:
    """The CTC acceptor of ``target``: ``2 L + 1`` nodes alternating blank and token.

    Node ``2 i + 1`` reads ``target[i]``; even nodes read the blank. Each node loops on
    its label; a token may follow the previous token directly unless both are equal.
    """
    target = [int(t) for t in target]
    L = len(target)
    S = 2 * L + 1
    g = Graph(calc_grad)
    for s in range(S):
        g.add_node(s == 0, s == S - 1 or s == S - 2)
        label = target[(s - 1) // 2] if s % 2 else blank_idx
        g.add_arc(s, s, label)
        if s > 0:
            g.add_arc(s - 1, s, label)
        if s % 2 and s > 1 and label != target[(s - 1) // 2 - 1]:
            g.add_arc(s - 2, s, label)
    return g


def ctc_loss(log_probs: Graph, target: Sequence[int], blank_idx: int) -> Graph:
    """The CTC loss of one example: ``-forward_score(intersect(ctc_graph(target), log_probs))``.

    Args:
        log_probs: emissions as a linear graph (``linear_graph(T, C)`` with weights set
            from a ``(T, C)`` array of log-probabilities).
        target: the token ids, none equal to ``blank_idx``.
        blank_idx: the blank's label.

    Returns:
        A scalar graph; ``backward`` on it gives ``log_probs`` its gradient.
    """
    return negate(forward_score(intersect(ctc_graph(target, blank_idx), log_probs)))
