"""The batched forward-backward dynamic programme over criterion graphs and dense emissions.

For example ``e`` with graph ``g``, emission row ``b`` and length ``T``::

    alpha_0[n]     = 0 for the start nodes of g, -inf elsewhere, then the epsilon closure
    alpha_{t+1}[d] = logsumexp over emitting arcs a = (s -> d, label l, weight w) of
                     alpha_t[s] + w + emissions[b, t, l], then the epsilon closure
    log Z          = logsumexp over accept nodes n of alpha_T[n]

The epsilon closure of a frame visits the nodes with incoming epsilon arcs in a topological
order of the epsilon subgraph. The backward pass runs the same recursion from the accept nodes
(``beta``) and turns each arc's occupancy ``exp(alpha_t[s] + w + emissions[b, t, l] +
beta_{t+1}[d] - log Z)`` into the gradient of ``log Z`` with respect to the emissions (summed per
``(t, l)``) and the arc weights (summed over ``t``). In the max semiring (``semiring="max"``) the
same code gives Viterbi scores. Above the kernels the semiring is named ``"log"`` or ``"max"``
(:data:`SEMIRINGS`); only the kernels take a ``use_max`` flag.

Three implementations share one interface:

* ``"numba"`` (CPU tensors): compiled kernels, one example at a time, see :mod:`lightning_gtn.kernels.graph_numba`.
* ``"triton"`` (CUDA tensors when Triton is installed, as it is with CUDA builds of torch; the
  default there): one kernel walks all frames of each example, see :mod:`lightning_gtn.kernels.graph_triton`.
* ``"torch"`` (any device; the default off the CPU without Triton, and for graphs with epsilon
  arcs): padded incoming-arc tables, see :mod:`lightning_gtn.kernels.graph_torch`.

This module holds the problem description and the entry points the losses call; only the
forward stores state (the alphas); the backward is written by hand.
"""

from __future__ import annotations

import numpy as np
import torch

from ..kernels import graph_numba, graph_torch, graph_triton
from ..kernels.compiled_graphs import GraphBatch, Problem, State, Subset
from ..kernels.graph_numba import numpy_view

#: the semirings of the dynamic programme: ``"log"`` (forward scores, log-sum-exp over paths)
#: and ``"max"`` (Viterbi scores, the best path)
SEMIRINGS = ("log", "max")


def check_semiring(semiring) -> str:
    """``semiring`` when it is one of :data:`SEMIRINGS`, else ValueError."""
    if semiring not in SEMIRINGS:
        raise ValueError(f"semiring must be one of {SEMIRINGS}, got {semiring!r}")
    return semiring


def forward(problem: Problem, E: torch.Tensor, w: torch.Tensor, impl: str, semiring: str = "log") -> State:
    """Runs the alpha pass; returns a :class:`State` whose ``logz`` is ``(N,)`` on E's device.

    Args:
        problem: the examples.
        E: ``(B, T, C)`` float32/float64 emissions (contiguous).
        w: ``(num_arcs,)`` arc weights, E's dtype and device.
        impl: ``"numba"`` (CPU only), ``"torch"`` (any device) or ``"triton"`` (CUDA; graphs
            with epsilon arcs or over ``graph_triton.MAX_NODES`` nodes go to ``"torch"``).
        semiring: ``"log"`` (forward scores) or ``"max"`` (Viterbi scores).
    """
    use_max = check_semiring(semiring) == "max"
    problem.check(E, w)  # every impl: the kernels (numba, Triton) index without bounds checks
    st = State()
    if impl == "triton" and not graph_triton.supports(problem.batch):
        impl = "torch"  # epsilon arcs (closures) or graphs too large for one Triton program
    st.problem, st.E, st.w, st.impl, st.extra = problem, E, w, impl, None
    if impl == "numba":
        graph_numba.numba_forward(st, use_max)
    elif impl == "torch":
        graph_torch.torch_forward(st, use_max)
    elif impl == "triton":
        st.extra = graph_triton.build_tables(problem, E.device)
        st.alpha, st.logz = graph_triton.forward(problem, st.extra, E, w, use_max)
    else:
        raise ValueError(f"_impl must be 'numba', 'torch' or 'triton', got {impl!r}")
    return st


def triton_self_check(device: torch.device):
    """None if the Triton kernels agree with torch on ``device``, else what differed: a small batch
    (CTC graphs and ASG's transition graph, read in chunks) scored by both, scores and gradients
    compared (the graph losses' self-check, see :class:`~lightning_gtn.core.impl.Backends`)."""
    return _self_check_error(_self_check(), torch.device(device))


def _self_check():
    from .criterion_graphs import compiled_asg_full, compiled_ctc

    graphs = [compiled_ctc((1, 2, 2), 0), compiled_ctc((3,), 0), compiled_asg_full(5)]
    return Problem(GraphBatch(graphs), [0, 1, 2, 2], [0, 1, 2, 3], [9, 4, 7, 0])


def _self_check_error(problem: Problem, device: torch.device):
    """None if Triton and torch agree on ``problem`` on ``device``, else what differed."""
    g = torch.Generator().manual_seed(0)
    E = torch.randn(4, 9, 5, generator=g, dtype=torch.float64).to(device)
    w = torch.randn(problem.batch.num_arcs, generator=g, dtype=torch.float64).to(device)
    coef = torch.tensor([1.0, -0.5, 2.0, 1.0], dtype=torch.float64)
    tables = graph_triton.build_tables(problem, device)
    tile = 8  # 8 padded nodes x 1 arc per step: the chunked code path (CTC's 3, ASG's 6 arcs per node)
    alpha, logz = graph_triton.forward(problem, tables, E, w, tile=tile)
    ga = graph_triton.backward(problem, tables, E, w, alpha, logz, coef, True, True, tile=tile)
    b = forward(problem, E, w, "torch")
    gb = backward(b, coef, True, True)
    for name, x, y in (
        ("scores", logz, b.logz),
        ("emission gradient", ga[0], gb[0]),
        ("weight gradient", ga[1], gb[1]),
    ):
        if not torch.allclose(x, y, rtol=1e-6, atol=1e-8):
            return f"{name} differ by up to {(x - y).abs().nan_to_num(0.0).max().item():.3g}"
    return None


def backward(st: State, coef: torch.Tensor, need_e: bool, need_w: bool):
    """Gradient of ``sum_e coef[e] * logz[e]``: ``(grad_E (B, T, C) or None, grad_w (num_arcs,) or None)``."""
    # a state may be rebuilt from an op's saved tensors: checked again before any kernel reads it
    st.problem.check(st.E, st.w, st.alpha if st.impl == "numba" else None, st.logz)
    if int(coef.numel()) != st.problem.num_examples:
        raise ValueError(f"expected {st.problem.num_examples} output gradients, got {int(coef.numel())}")
    if st.impl == "numba":
        return graph_numba.numba_backward(st, coef, need_e, need_w)
    if st.impl == "triton":
        return graph_triton.backward(st.problem, st.extra, st.E, st.w, st.alpha, st.logz, coef, need_e, need_w)
    return graph_torch.torch_backward(st, coef, need_e, need_w)


def fused(problem: Problem, E: torch.Tensor, w: torch.Tensor, sign: np.ndarray, need_e: bool, need_w: bool = False):
    """Scores and differentiates all examples at once (CPU).

    Returns ``(logz (N,), grad_E, arc_occ)``: ``grad_E`` ``(B, T, C)`` (or None) holds
    ``sum_e sign[e] * d logZ_e / dE``; ``arc_occ`` (or None) is ``(values, arc_ids, example)``,
    the per-example arc occupancies ``d logZ_e / d w`` flattened, with the global arc id and the
    example of each entry. Examples the scaled kernel cannot vouch for are redone with the
    log-domain kernels.
    """
    p, bt = problem, problem.batch
    p.check(E, w)  # the last check before the fused kernel
    if len(sign) != p.num_examples:
        raise ValueError(f"expected {p.num_examples} signs, got {len(sign)}")
    dtype = E.dtype
    N = p.num_examples
    signn = np.ascontiguousarray(sign, dtype=np.float64)
    logz, flag, gE, gw_ex, gw_off, arcs = graph_numba.fused_scaled(p, E, w, signn, need_e, need_w)
    out = torch.from_numpy(logz).to(dtype)
    bad = np.nonzero(flag)[0]
    if len(bad):
        sub = Subset(p, bad)
        st = forward(sub, E, w, "numba")
        out[torch.from_numpy(bad)] = st.logz
        if need_e:
            g, _ = backward(st, torch.from_numpy(signn[bad]), True, False)
            gE += g
        if need_w:
            for i, e in enumerate(bad):  # one at a time: each needs its own arc occupancies
                coef = torch.zeros(len(bad), dtype=torch.float64)
                coef[i] = 1.0
                _, gw = backward(st, coef, False, True)
                g0 = p.ex_graph[e]
                gw_ex[gw_off[e] : gw_off[e + 1]] = numpy_view(gw)[bt.arc_off[g0] : bt.arc_off[g0 + 1]]
    occ = None
    if need_w:
        ex = np.repeat(np.arange(N), arcs)
        local = np.arange(int(gw_off[-1])) - np.repeat(gw_off[:-1], arcs)
        arc_ids = bt.arc_off[p.ex_graph][ex] + local
        occ = (torch.from_numpy(gw_ex[: int(gw_off[-1])]).to(dtype), torch.from_numpy(arc_ids), torch.from_numpy(ex))
    return out, (gE if need_e else None), occ


def viterbi_labels(st: State) -> list:
    """Frame labels of the best path of each example (numba state, max semiring), or None if none."""
    if st.impl != "numba":
        raise RuntimeError("viterbi_labels needs the numba state")
    return graph_numba.viterbi_labels(st)
