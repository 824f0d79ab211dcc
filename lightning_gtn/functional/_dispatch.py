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
``(t, l)``) and the arc weights (summed over ``t``). In the max semiring (``use_max``) the same
code gives Viterbi scores.

Three implementations share one interface:

* ``"numba"`` (CPU tensors): compiled kernels, one example at a time, see :mod:`._numba`.
* ``"triton"`` (CUDA tensors when Triton is installed, as it is with CUDA builds of torch; the
  default there): one kernel walks all frames of each example, see :mod:`._triton`.
* ``"torch"`` (any device; the default off the CPU without Triton, and for graphs with epsilon
  arcs): padded incoming-arc tables, see :mod:`._torch_impl`.

This module holds the problem description and the entry points the losses call; only the
forward stores state (the alphas); the backward is written by hand.
"""

from __future__ import annotations

import numpy as np
import torch

from . import _numba, _torch_impl, _triton
from ._graphs import GraphBatch
from ._numba import _np

# ---------------------------------------------------------------------------
# Problem set-up
# ---------------------------------------------------------------------------


class Problem:
    """A batch of (graph, emission row, length) examples and what the passes need.

    Args:
        batch: the concatenated criterion graphs.
        ex_graph: ``(N,)`` graph index of each example.
        ex_row: ``(N,)`` emission row (batch index ``b``) of each example, non-decreasing.
        ex_len: ``(N,)`` number of frames of each example.
    """

    def __init__(self, batch: GraphBatch, ex_graph, ex_row, ex_len) -> None:
        self.batch = batch
        self.ex_graph = np.ascontiguousarray(ex_graph, dtype=np.int64)
        self.ex_row = np.ascontiguousarray(ex_row, dtype=np.int64)
        self.ex_len = np.ascontiguousarray(ex_len, dtype=np.int64)
        self.num_examples = len(self.ex_graph)
        sizes = np.asarray(batch.num_nodes, dtype=np.int64)[self.ex_graph] if self.num_examples else np.zeros(0, np.int64)
        self.ex_nodes = sizes
        self._set_alpha_off()

    def _set_alpha_off(self) -> None:
        """``alpha_off`` ``(N + 1,)``: where each example's ``(T_e + 1) * S_e`` alphas start."""
        self.alpha_off = np.zeros(self.num_examples + 1, dtype=np.int64)
        np.cumsum((self.ex_len + 1) * self.ex_nodes, out=self.alpha_off[1:])

    def chunks(self, threads: int):
        """Example ranges of similar work, never splitting one emission row across chunks."""
        N = self.num_examples
        if N == 0:
            return []
        arcs = np.diff(self.batch.arc_off)[self.ex_graph] + 1
        cost = (self.ex_len + 1) * (arcs + self.ex_nodes)
        total = int(cost.sum())
        if threads <= 1 or total < 200_000 or N == 1:
            return [(0, N)]
        cum = np.cumsum(cost)
        row_end = np.nonzero(np.append(self.ex_row[1:] != self.ex_row[:-1], True))[0] + 1  # valid cut points
        cuts = [0]
        for i in range(1, threads):
            target = total * i / threads
            j = int(np.searchsorted(cum[row_end - 1], target))
            if j < len(row_end):
                c = int(row_end[j])
                if c > cuts[-1] and c < N:
                    cuts.append(c)
        cuts.append(N)
        return [(cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)]



class State:
    """What the forward keeps for the backward."""

    __slots__ = ("problem", "alpha", "logz", "E", "w", "impl", "extra")


def forward(problem: Problem, E: torch.Tensor, w: torch.Tensor, impl: str, use_max: bool = False) -> State:
    """Runs the alpha pass; returns a :class:`State` whose ``logz`` is ``(N,)`` on E's device.

    Args:
        problem: the examples.
        E: ``(B, T, C)`` float32/float64 emissions (contiguous).
        w: ``(num_arcs,)`` arc weights, E's dtype and device.
        impl: ``"numba"`` (CPU only), ``"torch"`` (any device) or ``"triton"`` (CUDA; graphs
            with epsilon arcs or over ``_triton.MAX_NODES`` nodes go to ``"torch"``).
        use_max: the max (Viterbi) semiring instead of the log semiring.
    """
    st = State()
    if impl == "triton" and not _triton.supports(problem.batch):
        impl = "torch"  # epsilon arcs (closures) or graphs too large for one Triton program
    st.problem, st.E, st.w, st.impl, st.extra = problem, E, w, impl, None
    if impl == "numba":
        _numba.numba_forward(st, use_max)
    elif impl == "torch":
        _torch_impl.torch_forward(st, use_max)
    elif impl == "triton":
        st.extra = _triton.build_tables(problem, E.device)
        st.alpha, st.logz = _triton.forward(problem, st.extra, E, w, use_max)
    else:
        raise ValueError(f"_impl must be 'numba', 'torch' or 'triton', got {impl!r}")
    return st


_device_impl: dict = {}


def device_impl(device: torch.device) -> str:
    """The default implementation for tensors on a non-CPU ``device``: ``"triton"`` or ``"torch"``.

    Triton is used on CUDA devices once it has passed a self-check on that device: the first
    call scores a small batch (CTC graphs and ASG's transition graph, read in chunks) with both
    implementations and compares scores and gradients. A failure to compile or launch, or a
    disagreement, gives a warning and the torch implementation for the rest of the process.
    """
    device = torch.device(device)
    key = str(device)
    impl = _device_impl.get(key)
    if impl is None:
        impl = "torch"
        if device.type == "cuda" and _triton.available():
            problem = _self_check()
            try:
                err = _self_check_error(problem, device)
            except Exception as e:  # noqa: BLE001 - any failure means: do not use the kernels here
                err = f"{type(e).__name__}: {e}"
            if err is None:
                impl = "triton"
            else:
                import warnings

                warnings.warn(f"lightning_gtn: the Triton kernels failed their self-check on {device} ({err}); "
                              "scoring with the torch implementation instead", RuntimeWarning, stacklevel=3)
        _device_impl[key] = impl
    return impl


def _self_check():
    from ._graphs import compiled_asg_full, compiled_ctc

    graphs = [compiled_ctc((1, 2, 2), 0), compiled_ctc((3,), 0), compiled_asg_full(5)]
    return Problem(GraphBatch(graphs), [0, 1, 2, 2], [0, 1, 2, 3], [9, 4, 7, 0])


def _self_check_error(problem: Problem, device: torch.device):
    """None if Triton and torch agree on ``problem`` on ``device``, else what differed."""
    g = torch.Generator().manual_seed(0)
    E = torch.randn(4, 9, 5, generator=g, dtype=torch.float64).to(device)
    w = torch.randn(problem.batch.num_arcs, generator=g, dtype=torch.float64).to(device)
    coef = torch.tensor([1.0, -0.5, 2.0, 1.0], dtype=torch.float64)
    tables = _triton.build_tables(problem, device)
    tile = 8  # 8 padded nodes x 1 arc per step: the chunked code path (CTC's 3, ASG's 6 arcs per node)
    alpha, logz = _triton.forward(problem, tables, E, w, tile=tile)
    ga = _triton.backward(problem, tables, E, w, alpha, logz, coef, True, True, tile=tile)
    b = forward(problem, E, w, "torch")
    gb = backward(b, coef, True, True)
    for name, x, y in (("scores", logz, b.logz), ("emission gradient", ga[0], gb[0]),
                       ("weight gradient", ga[1], gb[1])):
        if not torch.allclose(x, y, rtol=1e-6, atol=1e-8):
            return f"{name} differ by up to {(x - y).abs().nan_to_num(0.0).max().item():.3g}"
    return None


def backward(st: State, coef: torch.Tensor, need_e: bool, need_w: bool):
    """Gradient of ``sum_e coef[e] * logz[e]``: ``(grad_E (B, T, C) or None, grad_w (num_arcs,) or None)``."""
    if st.impl == "numba":
        return _numba.numba_backward(st, coef, need_e, need_w)
    if st.impl == "triton":
        return _triton.backward(st.problem, st.extra, st.E, st.w, st.alpha, st.logz, coef, need_e, need_w)
    return _torch_impl.torch_backward(st, coef, need_e, need_w)


class Subset(Problem):
    """A view of some examples of a :class:`Problem` (same graphs, same alpha layout rules)."""

    def __init__(self, problem: "Problem", idx: np.ndarray) -> None:
        self.batch = problem.batch
        self.ex_graph = problem.ex_graph[idx]
        self.ex_row = problem.ex_row[idx]
        self.ex_len = problem.ex_len[idx]
        self.num_examples = len(idx)
        self.ex_nodes = problem.ex_nodes[idx]
        self._set_alpha_off()


def fused(problem: Problem, E: torch.Tensor, w: torch.Tensor, sign: np.ndarray, need_e: bool,
          need_w: bool = False):
    """Scores and differentiates all examples at once (CPU).

    Returns ``(logz (N,), grad_E, arc_occ)``: ``grad_E`` ``(B, T, C)`` (or None) holds
    ``sum_e sign[e] * d logZ_e / dE``; ``arc_occ`` (or None) is ``(values, arc_ids, example)``,
    the per-example arc occupancies ``d logZ_e / d w`` flattened, with the global arc id and the
    example of each entry. Examples the scaled kernel cannot vouch for are redone with the
    log-domain kernels.
    """
    p, bt = problem, problem.batch
    dtype = E.dtype
    N = p.num_examples
    signn = np.ascontiguousarray(sign, dtype=np.float64)
    logz, flag, gE, gw_ex, gw_off, arcs = _numba.fused_scaled(p, E, w, signn, need_e, need_w)
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
                gw_ex[gw_off[e] : gw_off[e + 1]] = _np(gw)[bt.arc_off[g0] : bt.arc_off[g0 + 1]]
    occ = None
    if need_w:
        ex = np.repeat(np.arange(N), arcs)
        local = np.arange(int(gw_off[-1])) - np.repeat(gw_off[:-1], arcs)
        arc_ids = bt.arc_off[p.ex_graph][ex] + local
        occ = (torch.from_numpy(gw_ex[: int(gw_off[-1])]).to(dtype), torch.from_numpy(arc_ids),
               torch.from_numpy(ex))
    return out, (gE if need_e else None), occ


def viterbi_labels(st: State) -> list:
    """Frame labels of the best path of each example (numba state, max semiring), or None if none."""
    if st.impl != "numba":
        raise RuntimeError("viterbi_labels needs the numba state")
    return _numba.viterbi_labels(st)
