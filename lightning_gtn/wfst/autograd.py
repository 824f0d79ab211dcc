"""Reverse-mode differentiation over graphs of graph operations (GTN's ``backward``)."""

from __future__ import annotations

from typing import List, Optional

import numpy as np

from .graph import Graph
from .parallel import parallel_map


def _backward_impl(g: Graph, retain_graph: bool) -> None:
    # Topological order of everything g was computed from (iterative DFS: chains of
    # operations can be far deeper than Python's recursion limit).
    seen = set()
    tape: List[Graph] = []
    stack = [(g, False)]
    while stack:
        node, expanded = stack.pop()
        key = id(node._g)
        if expanded:
            if key not in seen:
                seen.add(key)
                tape.append(node)
            continue
        if key in seen:
            continue
        stack.append((node, True))
        for inp in reversed(node._g.inputs):
            if id(inp._g) not in seen:
                stack.append((inp, False))
    for node in reversed(tape):
        state = node._g
        if state.grad_func is None:
            continue
        if not state.inputs:
            raise ValueError("[autograd::backward] Cannot Backward twice without retaining the graph.")
        state.grad_func(state.inputs, node.grad())
        if not retain_graph:
            state.inputs.clear()


class GradSizeError(RuntimeError, ValueError):
    """A seed gradient whose arcs do not match the graph's (GTN raises ``RuntimeError``)."""


def _is_retain_list(x) -> bool:
    return (
        isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(r, (bool, int, np.bool_, np.integer)) for r in x)
    )


def _seed_and_run(g: Graph, grad: Optional[Graph], retain_graph: bool) -> None:
    if not isinstance(g, Graph):
        raise TypeError(f"g must be a gtn.Graph, got {type(g).__name__}")
    if grad is None:
        g._add_grad(np.ones(g.num_arcs(), dtype=np.float32))
    else:
        if not isinstance(grad, Graph):
            raise TypeError(f"grad must be a gtn.Graph, got {type(grad).__name__}")
        if g.calc_grad and grad.num_arcs() != g.num_arcs():
            raise GradSizeError(
                f"[Graph::addGrad] Invalid grad size: grad must have {g.num_arcs()} arcs (as g), "
                f"got {grad.num_arcs()}"
            )
        g._add_grad(grad)
    _backward_impl(g, bool(retain_graph))


def backward(g=None, grad=None, retain_graph=False, *args, **kwargs) -> None:
    """Computes gradients of ``g`` with respect to every graph it was computed from.

    Forms (as GTN's):
        ``backward(g, retain_graph=False)``, ``backward(g, grad, retain_graph=False)``,
        ``backward([g, ...], retain_graphs=[0])``, ``backward([g, ...], [grad, ...], retain_graphs=[0])``.

    ``grad`` (a graph with ``g``'s arcs) seeds the gradient; by default every arc of ``g``
    gets 1. Without ``retain_graph`` the record of operations is freed, and a second
    ``backward`` through it raises ``ValueError``. ``retain_graph`` may also be passed
    second (``backward(g, True)``, ``backward([g, ...], [1])``). In the list forms, lists
    of one item are used for every graph; the graphs are processed on the thread pool.

    Gradients accumulate in every graph with ``calc_grad`` that ``g`` was computed from
    (read them with ``.grad()``; clear them with ``.zero_grad()``).

    Raises:
        ValueError: on a second backward through a freed record.
        RuntimeError: (also a ``ValueError``) ``grad`` has a different number of arcs.
        RuntimeError: an operation has no gradient (``remove``).
    """
    g = kwargs.pop("graphs", g)
    grad = kwargs.pop("grads", grad)
    retain = kwargs.pop("retain_graphs", kwargs.pop("retain_graph", retain_graph))
    if kwargs or args:
        raise TypeError(f"backward() got unexpected arguments {list(kwargs) or args}")
    if g is None:
        raise TypeError("backward() needs the graph (g=...) or a list of graphs (graphs=[...])")
    if isinstance(grad, (bool, np.bool_, int, np.integer)):
        retain, grad = grad, None  # backward(g, True)
    if isinstance(g, (list, tuple)) and _is_retain_list(grad):
        retain, grad = grad, None  # backward([g, ...], [1, 0, ...])
    if isinstance(g, (list, tuple)):
        graphs = list(g)
        retains = list(retain) if isinstance(retain, (list, tuple)) else [retain]
        if grad is None:
            parallel_map(lambda x, r: _seed_and_run(x, None, bool(r)), graphs, retains)
        else:
            parallel_map(lambda x, d, r: _seed_and_run(x, d, bool(r)), graphs, list(grad), retains)
        return
    _seed_and_run(g, grad, bool(retain))
