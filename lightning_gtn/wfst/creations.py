"""Graphs made from numbers: ``scalar_graph`` and ``linear_graph``."""

from __future__ import annotations

import numpy as np

from .device import CPU, _check_cpu
from .graph import _FLOAT, _INT, Graph, epsilon


def _device_and_grad(device, calc_grad: bool):
    # GTN releases before its device API took ``calc_grad`` as the third positional argument
    # (``linear_graph(T, C, inputs.requires_grad)`` in GTN's PyTorch example); a bool there
    # can only mean that, since no device is a bool.
    if isinstance(device, bool):
        return CPU, device
    return device, calc_grad


def scalar_graph(weight: float, device=CPU, calc_grad: bool = True) -> Graph:
    """A two-node graph with one epsilon arc of the given weight.

    ``scalar_graph(w, calc_grad)`` with a bool second (the signature of GTN releases before
    devices) is accepted too.
    """
    device, calc_grad = _device_and_grad(device, calc_grad)
    _check_cpu(device)
    g = Graph(calc_grad)
    g.add_node(True)
    g.add_node(False, True)
    g.add_arc(0, 1, epsilon, epsilon, float(weight))
    return g


def linear_graph(M: int, N: int, device=CPU, calc_grad: bool = True) -> Graph:
    """A chain of ``M + 1`` nodes with ``N`` arcs (labels ``0..N-1``) between consecutive nodes.

    Arc ``t * N + c`` goes from node ``t`` to ``t + 1`` with label ``c``, so setting the
    weights from a row-major ``(M, N)`` array of emissions (``tensor.data_ptr()``) puts
    frame ``t``'s score for label ``c`` on that arc. The graph is marked sorted on both labels.
    ``linear_graph(M, N, calc_grad)`` with a bool third (the signature of GTN releases before
    devices, used by GTN's PyTorch loss example) is accepted too.
    """
    device, calc_grad = _device_and_grad(device, calc_grad)
    _check_cpu(device)
    M, N = int(M), int(N)
    if M < 0 or N < 0:
        raise ValueError(f"M and N must be >= 0, got M={M}, N={N}")
    node = np.repeat(np.arange(M, dtype=_INT), N)
    labels = np.tile(np.arange(N, dtype=_INT), M)
    g = Graph._from_arrays(
        M + 1, [0], [M], node, node + 1, labels, labels.copy(), np.zeros(M * N, dtype=_FLOAT), calc_grad=calc_grad
    )
    g.mark_arc_sorted()
    g.mark_arc_sorted(True)
    return g
