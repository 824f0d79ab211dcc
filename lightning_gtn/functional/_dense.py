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

* ``"numba"`` (CPU tensors): compiled kernels, one example at a time, each node grouping its
  incoming arcs so that it costs one max, one exp per arc and one log; batch chunks run on the
  engine's bounded thread pool (the kernels release the GIL).
* ``"triton"`` (CUDA tensors when Triton is installed, as it is with CUDA builds of torch; the
  default there): one kernel walks all frames of each example, see :mod:`._triton`.
* ``"torch"`` (any device; the default off the CPU without Triton, and for graphs with epsilon
  arcs): padded ``(E, S, K)`` incoming-arc tables, one gather + logsumexp per frame for all
  examples at once; occupancies in bulk at the end.

Only the forward stores state (the alphas); the backward is written by hand.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from ..wfst.parallel import get_num_threads, parallel_map
from . import _triton
from ._graphs import GraphBatch

NEG_INF = -math.inf
OCC_BLOCK_ELEMENTS = 1 << 24  # torch path: occupancies are formed this many entries at a time


# ---------------------------------------------------------------------------
# numba kernels
# ---------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _example(e, ex_graph, ex_row, ex_len, node_off):
    """``(graph g, emission row b, frames T, first node n0, nodes S)`` of example ``e``."""
    g = ex_graph[e]
    n0 = node_off[g]
    return g, ex_row[e], ex_len[e], n0, node_off[g + 1] - n0


@njit(cache=True, nogil=True, inline="always")
def _init_frame(vec, r, S, ids, k0, k1):
    """``vec[r : r + S]`` = -inf, except 0 at the nodes ``ids[k0:k1]`` (start or accept)."""
    for n in range(S):
        vec[r + n] = NEG_INF
    for k in range(k0, k1):
        vec[r + ids[k]] = 0.0


@njit(cache=True, nogil=True)
def _eps_forward(alpha, r, g, w, src, eps_node_off, eps_nodes, eps_off, eps_arc, buf, use_max):
    for i in range(eps_node_off[g], eps_node_off[g + 1]):
        n = eps_nodes[i]
        cur = alpha[r + n]
        m = cur
        k0 = eps_off[i]
        k1 = eps_off[i + 1]
        for k in range(k0, k1):
            a = eps_arc[k]
            v = alpha[r + src[a]] + w[a]
            buf[k - k0] = v
            if not v <= m:
                m = v
        if m == NEG_INF or use_max:
            alpha[r + n] = m
            continue
        s = math.exp(cur - m)
        for k in range(k1 - k0):
            s += math.exp(buf[k] - m)
        alpha[r + n] = m + math.log(s)


@njit(cache=True, nogil=True)
def _forward_kernel(
    e0, e1, ex_graph, ex_row, ex_len, alpha_off, E, w, src, label,
    node_off, in_off, in_arc, start_off, start, accept_off, accept,
    eps_node_off, eps_nodes, eps_off, eps_arc, alpha, logz, max_in, use_max,
):
    buf = np.empty(max(max_in, 1), dtype=alpha.dtype)
    for e in range(e0, e1):
        g, b, T, n0, S = _example(e, ex_graph, ex_row, ex_len, node_off)
        base = alpha_off[e]
        _init_frame(alpha, base, S, start, start_off[g], start_off[g + 1])
        _eps_forward(alpha, base, g, w, src, eps_node_off, eps_nodes, eps_off, eps_arc, buf, use_max)
        for t in range(T):
            prev = base + t * S
            cur = prev + S
            for n in range(S):
                k0 = in_off[n0 + n]
                k1 = in_off[n0 + n + 1]
                m = NEG_INF
                for k in range(k0, k1):
                    a = in_arc[k]
                    v = alpha[prev + src[a]] + w[a] + E[b, t, label[a]]
                    buf[k - k0] = v
                    if not v <= m:  # NaN-propagating max
                        m = v
                if m == NEG_INF or use_max:
                    alpha[cur + n] = m
                    continue
                s = 0.0
                for k in range(k1 - k0):
                    s += math.exp(buf[k] - m)
                alpha[cur + n] = m + math.log(s)
            _eps_forward(alpha, cur, g, w, src, eps_node_off, eps_nodes, eps_off, eps_arc, buf, use_max)
        last = base + T * S
        m = NEG_INF
        for k in range(accept_off[g], accept_off[g + 1]):
            v = alpha[last + accept[k]]
            if not v <= m:
                m = v
        if m == NEG_INF or use_max:
            logz[e] = m
        else:
            s = 0.0
            for k in range(accept_off[g], accept_off[g + 1]):
                s += math.exp(alpha[last + accept[k]] - m)
            logz[e] = m + math.log(s)


@njit(cache=True, nogil=True)
def _eps_backward(beta, alpha, ar, g, w, dst, eps_node_off, eps_nodes, eps_off, eps_arc,
                  buf, lz, coef, gw, need_w):
    for i in range(eps_node_off[g], eps_node_off[g + 1]):
        n = eps_nodes[i]
        cur = beta[n]
        m = cur
        k0 = eps_off[i]
        k1 = eps_off[i + 1]
        for k in range(k0, k1):
            a = eps_arc[k]
            v = w[a] + beta[dst[a]]
            buf[k - k0] = v
            if not v <= m:
                m = v
        if m == NEG_INF:
            continue
        s = math.exp(cur - m)
        for k in range(k1 - k0):
            ev = math.exp(buf[k] - m)
            buf[k] = ev
            s += ev
        beta[n] = m + math.log(s)
        if need_w:
            f = math.exp(alpha[ar + n] + m - lz) * coef
            if f != 0.0:
                for k in range(k0, k1):
                    gw[eps_arc[k]] += f * buf[k - k0]


@njit(cache=True, nogil=True)
def _backward_kernel(
    e0, e1, ex_graph, ex_row, ex_len, ex_coef, alpha_off, E, w, dst, label,
    node_off, out_off, out_arc, accept_off, accept,
    eps_node_off, eps_nodes, eps_off, eps_arc, alpha, logz, max_nodes, max_out,
    gE, gw, need_e, need_w,
):
    buf = np.empty(max(max_out, 1), dtype=alpha.dtype)
    beta_a = np.empty(max(max_nodes, 1), dtype=alpha.dtype)
    beta_b = np.empty(max(max_nodes, 1), dtype=alpha.dtype)
    for e in range(e0, e1):
        coef = ex_coef[e]
        lz = logz[e]
        if coef == 0.0 or lz == NEG_INF:
            continue
        g, b, T, n0, S = _example(e, ex_graph, ex_row, ex_len, node_off)
        base = alpha_off[e]
        nxt = beta_a
        cur = beta_b
        _init_frame(nxt, 0, S, accept, accept_off[g], accept_off[g + 1])
        _eps_backward(nxt, alpha, base + T * S, g, w, dst, eps_node_off, eps_nodes, eps_off,
                      eps_arc, buf, lz, coef, gw, need_w)
        for t in range(T - 1, -1, -1):
            ar = base + t * S
            for n in range(S):
                k0 = out_off[n0 + n]
                k1 = out_off[n0 + n + 1]
                m = NEG_INF
                for k in range(k0, k1):
                    a = out_arc[k]
                    v = w[a] + E[b, t, label[a]] + nxt[dst[a]]
                    buf[k - k0] = v
                    if not v <= m:
                        m = v
                if m == NEG_INF:
                    cur[n] = m
                    continue
                s = 0.0
                for k in range(k1 - k0):
                    ev = math.exp(buf[k] - m)
                    buf[k] = ev
                    s += ev
                cur[n] = m + math.log(s)
                f = math.exp(alpha[ar + n] + m - lz) * coef
                if f != 0.0:
                    for k in range(k0, k1):
                        a = out_arc[k]
                        o = f * buf[k - k0]
                        if need_e:
                            gE[b, t, label[a]] += o
                        if need_w:
                            gw[a] += o
            _eps_backward(cur, alpha, ar, g, w, dst, eps_node_off, eps_nodes, eps_off,
                          eps_arc, buf, lz, coef, gw, need_w)
            tmp = nxt
            nxt = cur
            cur = tmp


@njit(cache=True, nogil=True)
def _viterbi_backtrack(e, ex_graph, ex_row, ex_len, alpha_off, E, w, src, label,
                       node_off, in_off, in_arc, accept_off, accept,
                       eps_node_off, eps_nodes, eps_off, eps_arc, alpha, out_labels):
    """Frame labels of the best path of example ``e`` (after a max-semiring forward)."""
    g, b, T, n0, S = _example(e, ex_graph, ex_row, ex_len, node_off)
    base = alpha_off[e]
    last = base + T * S
    best = -1
    m = NEG_INF
    for k in range(accept_off[g], accept_off[g + 1]):
        v = alpha[last + accept[k]]
        if best < 0 or v > m:
            m = v
            best = accept[k]
    if best < 0 or m == NEG_INF:
        return False
    n = best
    t = T
    while True:
        r = base + t * S
        # follow epsilon arcs backwards while one of them explains the score
        moved = True
        while moved:
            moved = False
            for i in range(eps_node_off[g], eps_node_off[g + 1]):
                if eps_nodes[i] != n:
                    continue
                for k in range(eps_off[i], eps_off[i + 1]):
                    a = eps_arc[k]
                    if alpha[r + src[a]] + w[a] == alpha[r + n] and alpha[r + n] != NEG_INF:
                        n = src[a]
                        moved = True
                        break
                break
        if t == 0:
            return True
        prev = r - S
        bestv = NEG_INF
        besta = -1
        for k in range(in_off[n0 + n], in_off[n0 + n + 1]):
            a = in_arc[k]
            v = alpha[prev + src[a]] + w[a] + E[b, t - 1, label[a]]
            if besta < 0 or v > bestv:
                bestv = v
                besta = a
        if besta < 0:
            return False
        out_labels[t - 1] = label[besta]
        n = src[besta]
        t -= 1


@njit(cache=True, nogil=True, inline="always")
def _vmax(v, r, S):
    """``max(0, v[r], ..., v[r + S - 1])`` (NaN entries are skipped)."""
    m = 0.0
    for n in range(S):
        if v[r + n] > m:
            m = v[r + n]
    return m


@njit(cache=True, nogil=True, inline="always")
def _scaled_eps_in(A, r, g, ew_all, a0, src, ein_node_off, ein_nodes, ein_off, ein_arc):
    """Linear-domain epsilon closure of the frame vector ``A[r : r + S]`` (forward)."""
    for i in range(ein_node_off[g], ein_node_off[g + 1]):
        n = ein_nodes[i]
        for k in range(ein_off[i], ein_off[i + 1]):
            a = ein_arc[k]
            A[r + n] += A[r + src[a]] * ew_all[a - a0]


@njit(cache=True, nogil=True, inline="always")
def _scaled_eps_out(beta, A, r, F, g, ew_all, a0, dst, eout_node_off, eout_nodes, eout_off, eout_arc,
                    gw_ex, wo, need_w):
    """Linear-domain epsilon closure of ``beta`` (backward); with ``need_w`` each epsilon arc's
    occupancy ``A[r + n] * v * F`` goes to ``gw_ex[wo + local arc id]``."""
    for i in range(eout_node_off[g], eout_node_off[g + 1]):
        n = eout_nodes[i]
        for k in range(eout_off[i], eout_off[i + 1]):
            a = eout_arc[k]
            v = ew_all[a - a0] * beta[dst[a]]
            beta[n] += v
            if need_w:
                gw_ex[wo + a - a0] += A[r + n] * v * F


@njit(cache=True, nogil=True)
def _fused_kernel(
    e0, e1, ex_graph, ex_row, ex_len, ex_sign, E, w, src, dst,
    node_off, arc_off, in_off, in_arc, in_src, in_lp, out_off, out_arc, out_dst, out_lp,
    start_off, start, accept_off, accept,
    ein_node_off, ein_nodes, ein_off, ein_arc, eout_node_off, eout_nodes, eout_off, eout_arc,
    lab_off, labs, logz, flag, gE, need_e, tol, gw_ex, gw_off, need_w,
):
    """Scaled linear-domain forward-backward with the emission gradient, per example.

    With ``need_w``, the occupancy of every arc of example ``e`` (summed over frames, no sign)
    goes to ``gw_ex[gw_off[e] + local arc id]``.

    alpha and beta are float64 vectors normalised to max 1 per frame plus a log scale, so
    nothing is exponentiated per arc: only each used label once per frame. Underflow can
    silently drop paths, so the result is verified: at every frame the occupancies of the
    emitting arcs must sum to 1 (every path crosses a frame on exactly one emitting arc).
    Examples that fail (or meet -inf/NaN emissions, large weights, no path) keep
    ``flag = 1`` and get nothing written; the caller scores them with the log-domain kernels.
    Graphs whose arcs all weigh 0 (CTC, the sequence criterion) take loops without the arc
    weight products (20% faster on the CTC benchmark's small shape).
    """
    for e in range(e0, e1):
        g, b, T, n0, S = _example(e, ex_graph, ex_row, ex_len, node_off)
        sign = ex_sign[e]
        a0 = arc_off[g]
        k0 = in_off[n0]
        nk = in_off[n0 + S] - k0
        flag[e] = 1
        if T == 0:
            continue
        ok = True
        ew_all = np.empty(arc_off[g + 1] - a0)
        unit = True  # every arc weighs 0 (CTC, the sequence criterion): skip the products
        for a in range(a0, arc_off[g + 1]):
            if not abs(w[a]) <= 30.0:
                ok = False
            if w[a] != 0.0:
                unit = False
            ew_all[a - a0] = math.exp(w[a])
        if not ok:
            continue
        ew_in = np.empty(nk)
        ew_out = np.empty(nk)
        for k in range(nk):
            ew_in[k] = ew_all[in_arc[k0 + k] - a0]
            ew_out[k] = ew_all[out_arc[k0 + k] - a0]
        l0 = lab_off[g]
        nl = lab_off[g + 1] - l0
        P = np.empty((T, nl))  # exp(emission - frame max) of the used labels
        mxs = np.empty(T)
        A = np.zeros((T + 1) * S)
        ls = np.empty(T + 1)
        for k in range(start_off[g], start_off[g + 1]):
            A[start[k]] = 1.0
        _scaled_eps_in(A, 0, g, ew_all, a0, src, ein_node_off, ein_nodes, ein_off, ein_arc)
        m = _vmax(A, 0, S)
        if not m > 0.0:
            continue
        for n in range(S):
            A[n] /= m
        ls[0] = math.log(m)
        for t in range(T):
            mx = -math.inf
            for i in range(nl):
                v = E[b, t, labs[l0 + i]]
                if v > mx:
                    mx = v
            if not (mx > -math.inf and mx < math.inf):
                ok = False
                break
            for i in range(nl):
                P[t, i] = math.exp(E[b, t, labs[l0 + i]] - mx)
            mxs[t] = mx
            prev = t * S
            cur = prev + S
            if unit:
                for n in range(S):
                    acc = 0.0
                    for k in range(in_off[n0 + n], in_off[n0 + n + 1]):
                        acc += A[prev + in_src[k]] * P[t, in_lp[k]]
                    A[cur + n] = acc
            else:
                for n in range(S):
                    acc = 0.0
                    for k in range(in_off[n0 + n] - k0, in_off[n0 + n + 1] - k0):
                        acc += A[prev + in_src[k0 + k]] * ew_in[k] * P[t, in_lp[k0 + k]]
                    A[cur + n] = acc
            _scaled_eps_in(A, cur, g, ew_all, a0, src, ein_node_off, ein_nodes, ein_off, ein_arc)
            m = _vmax(A, cur, S)
            if not (m > 0.0 and m < math.inf):
                ok = False
                break
            inv = 1.0 / m
            for n in range(S):
                A[cur + n] *= inv
            ls[t + 1] = ls[t] + math.log(m) + mx
        if not ok:
            continue
        z = 0.0
        last = T * S
        for k in range(accept_off[g], accept_off[g + 1]):
            z += A[last + accept[k]]
        if not z > 0.0:
            continue
        lz = ls[T] + math.log(z)
        # backward, with the occupancies of the emitting arcs (G: per frame and used label)
        G = np.zeros((T, nl))
        nxt = np.zeros(S)
        cur_b = np.empty(S)
        for k in range(accept_off[g], accept_off[g + 1]):
            nxt[accept[k]] = 1.0
        FT = math.exp(ls[T] - lz)
        wo = gw_off[e]
        _scaled_eps_out(nxt, A, last, FT, g, ew_all, a0, dst, eout_node_off, eout_nodes, eout_off, eout_arc,
                        gw_ex, wo, need_w)
        m = _vmax(nxt, 0, S)
        for n in range(S):
            nxt[n] /= m
        lb = math.log(m)
        for t in range(T - 1, -1, -1):
            mx = mxs[t]
            F = math.exp(ls[t] + mx + lb - lz)
            total = 0.0
            prev = t * S
            if unit and not need_w:
                for n in range(S):
                    acc = 0.0
                    an = A[prev + n] * F
                    for k in range(out_off[n0 + n], out_off[n0 + n + 1]):
                        j = out_lp[k]
                        v = P[t, j] * nxt[out_dst[k]]
                        acc += v
                        G[t, j] += an * v
                    cur_b[n] = acc
                    total += an * acc
            else:
                for n in range(S):
                    acc = 0.0
                    an = A[prev + n] * F
                    for k in range(out_off[n0 + n] - k0, out_off[n0 + n + 1] - k0):
                        j = out_lp[k0 + k]
                        v = ew_out[k] * P[t, j] * nxt[out_dst[k0 + k]]
                        acc += v
                        G[t, j] += an * v
                        if need_w:
                            gw_ex[wo + out_arc[k0 + k] - a0] += an * v
                    cur_b[n] = acc
                    total += an * acc
            if not abs(total - 1.0) <= tol:
                ok = False
                break
            _scaled_eps_out(cur_b, A, prev, F, g, ew_all, a0, dst, eout_node_off, eout_nodes, eout_off, eout_arc,
                            gw_ex, wo, need_w)
            m = _vmax(cur_b, 0, S)
            if not (m > 0.0 and m < math.inf):
                ok = False
                break
            inv = 1.0 / m
            for n in range(S):
                nxt[n] = cur_b[n] * inv
            lb = lb + math.log(m) + mx
        if not ok:
            continue
        flag[e] = 0
        logz[e] = lz
        if need_e:
            for t in range(T):
                for i in range(nl):
                    gE[b, t, labs[l0 + i]] += sign * G[t, i]


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


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


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
        _numba_forward(st, use_max)
    elif impl == "torch":
        _torch_forward(st, use_max)
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
        return _numba_backward(st, coef, need_e, need_w)
    if st.impl == "triton":
        return _triton.backward(st.problem, st.extra, st.E, st.w, st.alpha, st.logz, coef, need_e, need_w)
    return _torch_backward(st, coef, need_e, need_w)


def _run_chunks(fn, chunks):
    if len(chunks) <= 1:
        for c in chunks:
            fn(*c)
        return
    parallel_map(fn, [c[0] for c in chunks], [c[1] for c in chunks])


def _numba_forward(st: State, use_max: bool) -> None:
    p, bt = st.problem, st.problem.batch
    E = st.E
    dtype = E.dtype
    alpha = torch.empty(int(p.alpha_off[-1]), dtype=dtype)
    logz = torch.empty(p.num_examples, dtype=dtype)
    En, wn, an, ln = _np(E), _np(st.w), _np(alpha), _np(logz)

    def run(e0, e1):
        _forward_kernel(
            e0, e1, p.ex_graph, p.ex_row, p.ex_len, p.alpha_off, En, wn, bt.src, bt.label,
            bt.node_off, bt.in_off, bt.in_arc, bt.start_off, bt.start, bt.accept_off, bt.accept,
            bt.eps_in_node_off, bt.eps_in_nodes, bt.eps_in_off, bt.eps_in_arc, an, ln,
            max(bt.max_in, bt.max_eps), use_max,
        )

    _run_chunks(run, p.chunks(get_num_threads()))
    st.alpha = alpha
    st.logz = logz


def _numba_backward(st: State, coef: torch.Tensor, need_e: bool, need_w: bool):
    p, bt = st.problem, st.problem.batch
    E = st.E
    gE = torch.zeros_like(E) if need_e else torch.zeros((1, 1, 1), dtype=E.dtype)
    chunks = p.chunks(get_num_threads())
    nw = bt.num_arcs if need_w else 1
    gw = torch.zeros((max(len(chunks), 1), nw), dtype=E.dtype)
    coefn = np.ascontiguousarray(coef.detach().cpu().numpy().astype(_np(E).dtype, copy=False))
    En, wn, an, ln, gEn, gwn = _np(E), _np(st.w), _np(st.alpha), _np(st.logz), _np(gE), _np(gw)

    def run(i, e0, e1):
        _backward_kernel(
            e0, e1, p.ex_graph, p.ex_row, p.ex_len, coefn, p.alpha_off, En, wn, bt.dst, bt.label,
            bt.node_off, bt.out_off, bt.out_arc, bt.accept_off, bt.accept,
            bt.eps_out_node_off, bt.eps_out_nodes, bt.eps_out_off, bt.eps_out_arc, an, ln,
            bt.max_nodes, max(bt.max_out, bt.max_eps), gEn, gwn[i], need_e, need_w,
        )

    if len(chunks) <= 1:
        for c in chunks:
            run(0, *c)
    else:
        parallel_map(run, list(range(len(chunks))), [c[0] for c in chunks], [c[1] for c in chunks])
    return (gE if need_e else None), (gw.sum(0) if need_w else None)


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


FUSED_TOL = 1e-6


def fused(problem: "Problem", E: torch.Tensor, w: torch.Tensor, sign: np.ndarray, need_e: bool,
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
    logz = np.zeros(N, dtype=np.float64)
    flag = np.ones(N, dtype=np.int64)
    gE = torch.zeros_like(E) if need_e else torch.zeros((1, 1, 1), dtype=dtype)
    En, wn, gEn = _np(E), _np(w).astype(np.float64), _np(gE)
    signn = np.ascontiguousarray(sign, dtype=np.float64)
    arcs = np.diff(bt.arc_off)[p.ex_graph] if N else np.zeros(0, np.int64)
    gw_off = np.zeros(N + 1, dtype=np.int64)
    if need_w:
        np.cumsum(arcs, out=gw_off[1:])
    gw_ex = np.zeros(max(int(gw_off[-1]), 1), dtype=np.float64)

    def run(e0, e1):
        _fused_kernel(
            e0, e1, p.ex_graph, p.ex_row, p.ex_len, signn, En, wn, bt.src, bt.dst,
            bt.node_off, bt.arc_off, bt.in_off, bt.in_arc, bt.in_src, bt.in_lp,
            bt.out_off, bt.out_arc, bt.out_dst, bt.out_lp, bt.start_off, bt.start, bt.accept_off, bt.accept,
            bt.eps_in_node_off, bt.eps_in_nodes, bt.eps_in_off, bt.eps_in_arc,
            bt.eps_out_node_off, bt.eps_out_nodes, bt.eps_out_off, bt.eps_out_arc,
            bt.lab_off, bt.labels, logz, flag, gEn, need_e, FUSED_TOL, gw_ex, gw_off, need_w,
        )

    _run_chunks(run, p.chunks(get_num_threads()))
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
    p, bt = st.problem, st.problem.batch
    if st.impl != "numba":
        raise RuntimeError("viterbi_labels needs the numba state")
    En, wn, an = _np(st.E), _np(st.w), _np(st.alpha)
    out = []
    for e in range(p.num_examples):
        labels = np.full(int(p.ex_len[e]), -1, dtype=np.int64)
        ok = _viterbi_backtrack(
            e, p.ex_graph, p.ex_row, p.ex_len, p.alpha_off, En, wn, bt.src, bt.label,
            bt.node_off, bt.in_off, bt.in_arc, bt.accept_off, bt.accept,
            bt.eps_in_node_off, bt.eps_in_nodes, bt.eps_in_off, bt.eps_in_arc, an, labels,
        )
        out.append(labels if ok else None)
    return out


# ---------------------------------------------------------------------------
# torch implementation (any device)
# ---------------------------------------------------------------------------


class _Tables:
    """Padded per-example tables on a device (built from a :class:`Problem`)."""

    pass


def _pad_table(node_of_entry: np.ndarray, entries: np.ndarray, cnt: np.ndarray, num_rows: int, K: int):
    """``(num_rows + 1, K)`` table whose row r lists the entries of row r (-1 padded)."""
    tab = np.full((num_rows + 1, max(K, 1)), -1, dtype=np.int64)
    if len(entries):
        starts = np.zeros(len(cnt), dtype=np.int64)
        np.cumsum(cnt[:-1], out=starts[1:])
        pos = np.arange(len(entries)) - np.repeat(starts, cnt)
        tab[node_of_entry, pos] = entries
    return tab


def _build_tables(st: State) -> _Tables:
    p, bt = st.problem, st.problem.batch
    dev = st.E.device
    N = int(bt.node_off[-1])
    tb = _Tables()
    Smax = max(int(p.ex_nodes.max(initial=0)), 1)
    tb.Smax = Smax
    # node index of each (example, local node) into the global node space; N = padding row
    loc = np.arange(Smax)
    gnode = bt.node_off[p.ex_graph][:, None] + loc[None, :]
    gnode = np.where(loc[None, :] < p.ex_nodes[:, None], gnode, N)
    node_graph = np.repeat(np.arange(len(bt.graphs)), np.diff(bt.node_off))

    def table(off, arcs, K):
        cnt = np.diff(off)
        owner = np.repeat(np.arange(N), cnt)
        return _pad_table(owner, arcs.astype(np.int64), cnt, N, K)[gnode]  # (Ne, Smax, K)

    def arcs_and_mask(tab):
        """Arc ids (padding -> arc 0) and the mask of real entries, on the device."""
        return torch.from_numpy(np.maximum(tab, 0)).to(dev), torch.from_numpy(tab >= 0).to(dev)

    def per_entry(tab, per_arc):
        """``per_arc`` of each table entry (0 for padding) as int64, on the device."""
        return torch.from_numpy(np.where(tab >= 0, per_arc[np.maximum(tab, 0)], 0).astype(np.int64)).to(dev)

    in_tab = table(bt.in_off, bt.in_arc, bt.max_in)
    out_tab = table(bt.out_off, bt.out_arc, bt.max_out)
    src_p, dst_p, lab_p = (np.append(v, 0) for v in (bt.src, bt.dst, bt.label))  # arc 0 valid if none
    tb.in_arc, tb.in_mask = arcs_and_mask(in_tab)
    tb.in_src = per_entry(in_tab, src_p)
    tb.in_lab = per_entry(in_tab, lab_p)
    tb.out_arc, tb.out_mask = arcs_and_mask(out_tab)
    tb.out_dst = per_entry(out_tab, dst_p)
    tb.out_lab = per_entry(out_tab, lab_p)
    start = np.zeros(N + 1, dtype=bool)
    accept = np.zeros(N + 1, dtype=bool)
    gs = np.repeat(np.arange(len(bt.graphs)), np.diff(bt.start_off))
    start[bt.node_off[gs] + bt.start] = True
    ga = np.repeat(np.arange(len(bt.graphs)), np.diff(bt.accept_off))
    accept[bt.node_off[ga] + bt.accept] = True
    tb.start = torch.from_numpy(start[gnode]).to(dev)
    tb.accept = torch.from_numpy(accept[gnode]).to(dev)
    tb.has_eps = bt.has_eps
    if bt.has_eps:
        ein_cnt = np.zeros(N, dtype=np.int64)
        eout_cnt = np.zeros(N, dtype=np.int64)
        # global node of each eps-in / eps-out group
        gin = node_graph_nodes(bt, "eps_in")
        gout = node_graph_nodes(bt, "eps_out")
        ein_cnt[gin] = np.diff(bt.eps_in_off)
        eout_cnt[gout] = np.diff(bt.eps_out_off)
        # reorder arc groups by global node id
        order_in = np.argsort(gin, kind="stable")
        order_out = np.argsort(gout, kind="stable")
        ein_arcs = np.concatenate([bt.eps_in_arc[bt.eps_in_off[i] : bt.eps_in_off[i + 1]] for i in order_in]).astype(np.int64)
        eout_arcs = np.concatenate([bt.eps_out_arc[bt.eps_out_off[i] : bt.eps_out_off[i + 1]] for i in order_out]).astype(np.int64)
        ein_off = np.zeros(N + 1, dtype=np.int64)
        np.cumsum(ein_cnt, out=ein_off[1:])
        eout_off = np.zeros(N + 1, dtype=np.int64)
        np.cumsum(eout_cnt, out=eout_off[1:])
        etab_in = table(ein_off, ein_arcs, bt.max_eps)
        etab_out = table(eout_off, eout_arcs, bt.max_eps)
        # levels: forward (longest eps path into the node), backward (longest eps path out)
        lin = np.zeros(N + 1, dtype=np.int64)
        for i in range(len(gin)):  # groups are in topological order within each graph
            n = gin[i]
            a = bt.eps_in_arc[bt.eps_in_off[i] : bt.eps_in_off[i + 1]]
            lin[n] = 1 + lin[bt.node_off[node_graph[n]] + bt.src[a]].max()
        lout = np.zeros(N + 1, dtype=np.int64)
        for i in range(len(gout)):
            n = gout[i]
            a = bt.eps_out_arc[bt.eps_out_off[i] : bt.eps_out_off[i + 1]]
            lout[n] = 1 + lout[bt.node_off[node_graph[n]] + bt.dst[a]].max()
        tb.eps_levels_in = int(lin.max())
        tb.eps_levels_out = int(lout.max())
        tb.lin = torch.from_numpy(lin[gnode]).to(dev)
        tb.lout = torch.from_numpy(lout[gnode]).to(dev)
        tb.ein_arc, tb.ein_mask = arcs_and_mask(etab_in)
        tb.ein_src = per_entry(etab_in, src_p)
        tb.eout_arc, tb.eout_mask = arcs_and_mask(etab_out)
        tb.eout_dst = per_entry(etab_out, dst_p)
    tb.rows = torch.from_numpy(p.ex_row).to(dev)
    tb.lens = torch.from_numpy(p.ex_len).to(dev)
    return tb


def node_graph_nodes(bt: GraphBatch, kind: str) -> np.ndarray:
    """Global node id of each epsilon group (``kind`` = ``"eps_in"`` or ``"eps_out"``)."""
    node_off = getattr(bt, kind + "_node_off")
    nodes = getattr(bt, kind + "_nodes").astype(np.int64)
    g = np.repeat(np.arange(len(bt.graphs)), np.diff(node_off))
    return bt.node_off[g] + nodes


def _lse_last(x: torch.Tensor, use_max: bool) -> torch.Tensor:
    if use_max:
        return x.max(-1).values
    return torch.logsumexp(x, -1)


def _gather_nodes(vec: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``vec`` (Ne, S), ``idx`` (Ne, S, K) -> (Ne, S, K)."""
    Ne, S, K = idx.shape
    return vec.gather(1, idx.reshape(Ne, S * K)).reshape(Ne, S, K)


def _eps_closure(vec, levels, level, other, arc, mask, w, use_max):
    """Epsilon closure of ``vec`` ``(Ne, S)`` one level at a time: nodes of level ``lev`` combine
    their value with ``vec[other] + w[arc]`` over their (masked) epsilon arcs ``(Ne, S, K)``."""
    ninf = torch.tensor(NEG_INF, dtype=vec.dtype, device=vec.device)
    for lev in range(1, levels + 1):
        cand = _gather_nodes(vec, other) + w[arc]
        cand = torch.where(mask, cand, ninf)
        new = _lse_last(torch.cat([vec.unsqueeze(-1), cand], -1), use_max)
        vec = torch.where(level == lev, new, vec)
    return vec


def _eps_step_forward(alpha, tb, w, use_max):
    return _eps_closure(alpha, tb.eps_levels_in, tb.lin, tb.ein_src, tb.ein_arc, tb.ein_mask, w, use_max)


def _torch_forward(st: State, use_max: bool) -> None:
    p = st.problem
    tb = _build_tables(st)
    st.extra = tb
    E = st.E
    w = torch.cat([st.w, st.w.new_zeros(1)])  # padded table entries point at arc 0: keep it valid
    dev, dtype = E.device, E.dtype
    Ne = p.num_examples
    T = int(p.ex_len.max(initial=0))
    ninf = torch.tensor(NEG_INF, dtype=dtype, device=dev)
    alpha = torch.where(tb.start, torch.zeros((), dtype=dtype, device=dev), ninf)
    if tb.has_eps:
        alpha = _eps_step_forward(alpha, tb, w, use_max)
    alphas = torch.empty((Ne, T + 1, tb.Smax), dtype=dtype, device=dev)
    alphas[:, 0] = alpha
    Er = E[tb.rows] if Ne else E[:0]
    Ne_, S, K = tb.in_src.shape
    w_in = torch.where(tb.in_mask, w[tb.in_arc], ninf)
    lab = tb.in_lab.reshape(Ne, S * K)
    for t in range(T):
        em = Er[:, t].gather(1, lab).reshape(Ne, S, K)
        cand = torch.where(tb.in_mask, _gather_nodes(alpha, tb.in_src) + w_in + em, ninf)
        new = _lse_last(cand, use_max)
        if tb.has_eps:
            new = _eps_step_forward(new, tb, w, use_max)
        alpha = torch.where((t < tb.lens).unsqueeze(1), new, alpha)
        alphas[:, t + 1] = alpha
    final = torch.where(tb.accept, alpha, ninf)
    st.logz = _lse_last(final, use_max) if Ne else torch.zeros(0, dtype=dtype, device=dev)
    st.alpha = alphas


def _torch_backward(st: State, coef: torch.Tensor, need_e: bool, need_w: bool):
    p, tb = st.problem, st.extra
    E, alphas, logz = st.E, st.alpha, st.logz
    w = torch.cat([st.w, st.w.new_zeros(1)])
    dev, dtype = E.device, E.dtype
    Ne = p.num_examples
    T = alphas.shape[1] - 1
    ninf = torch.tensor(NEG_INF, dtype=dtype, device=dev)
    coef = coef.to(device=dev, dtype=dtype)
    valid = (logz != NEG_INF) & (coef != 0)
    lz = torch.where(valid, logz, torch.zeros((), dtype=dtype, device=dev))
    scale = torch.where(valid, coef, torch.zeros((), dtype=dtype, device=dev))

    def eps_back(beta):
        return _eps_closure(beta, tb.eps_levels_out, tb.lout, tb.eout_dst, tb.eout_arc, tb.eout_mask, w, False)

    beta_init = torch.where(tb.accept, torch.zeros((), dtype=dtype, device=dev), ninf)
    if tb.has_eps:
        beta_init = eps_back(beta_init)
    betas = torch.empty_like(alphas)
    betas[:, T] = beta_init
    Er = E[tb.rows]
    _, S, Ko = tb.out_dst.shape
    w_out = torch.where(tb.out_mask, w[tb.out_arc], ninf)
    lab_out = tb.out_lab.reshape(Ne, S * Ko)
    beta = beta_init
    for t in range(T - 1, -1, -1):
        em = Er[:, t].gather(1, lab_out).reshape(Ne, S, Ko)
        cand = torch.where(tb.out_mask, _gather_nodes(beta, tb.out_dst) + w_out + em, ninf)
        new = torch.logsumexp(cand, -1)
        if tb.has_eps:
            new = eps_back(new)
        beta = torch.where((t < tb.lens).unsqueeze(1), new, beta_init)
        betas[:, t] = beta
    # occupancies of emitting arcs, grouped by destination: (Ne, tb, S, K) per block of frames
    _, S, K = tb.in_src.shape
    w_in = torch.where(tb.in_mask, w[tb.in_arc], ninf)
    zero = torch.zeros((), dtype=dtype, device=dev)
    gE = gw = None
    if need_e:
        gE = torch.zeros_like(E)
    occ_w = torch.zeros((Ne, S, K), dtype=dtype, device=dev) if need_w else None
    block = max(1, min(T, OCC_BLOCK_ELEMENTS // max(Ne * S * K, 1)))
    src_idx = tb.in_src.reshape(Ne, 1, S * K)
    lab_idx = tb.in_lab.reshape(Ne, 1, S * K)
    for t0 in range(0, T, block):
        t1 = min(T, t0 + block)
        n = t1 - t0
        a_src = alphas[:, t0:t1].gather(2, src_idx.expand(Ne, n, S * K)).reshape(Ne, n, S, K)
        em = Er[:, t0:t1].gather(2, lab_idx.expand(Ne, n, S * K)).reshape(Ne, n, S, K)
        tmask = (torch.arange(t0, t1, device=dev).unsqueeze(0) < tb.lens.unsqueeze(1)).reshape(Ne, n, 1, 1)
        occ = torch.exp(a_src + w_in.unsqueeze(1) + em + betas[:, t0 + 1 : t1 + 1].unsqueeze(-1)
                        - lz.reshape(Ne, 1, 1, 1))
        occ = torch.where(tmask & tb.in_mask.unsqueeze(1), occ, zero) * scale.reshape(Ne, 1, 1, 1)
        if need_e:
            gEe = torch.zeros((Ne, n, E.shape[2]), dtype=dtype, device=dev)
            gEe.scatter_add_(2, lab_idx.expand(Ne, n, S * K), occ.reshape(Ne, n, S * K))
            gE[:, t0:t1].index_add_(0, tb.rows, gEe)
        if need_w:
            occ_w += occ.sum(1)
    if need_w:
        gw = torch.zeros(st.w.shape[0] + 1, dtype=dtype, device=dev)
        gw.index_add_(0, tb.in_arc.reshape(-1), occ_w.reshape(-1))
        if tb.has_eps:
            _, _, Ke = tb.ein_src.shape
            a_e = alphas.gather(2, tb.ein_src.reshape(Ne, 1, S * Ke).expand(Ne, T + 1, S * Ke)).reshape(Ne, T + 1, S, Ke)
            we = torch.where(tb.ein_mask, w[tb.ein_arc], ninf)
            occe = torch.exp(a_e + we.unsqueeze(1) + betas.unsqueeze(-1) - lz.reshape(Ne, 1, 1, 1))
            tm = (torch.arange(T + 1, device=dev).unsqueeze(0) <= tb.lens.unsqueeze(1)).reshape(Ne, T + 1, 1, 1)
            occe = torch.where(tm & tb.ein_mask.unsqueeze(1), occe, torch.zeros((), dtype=dtype, device=dev))
            occe = occe * scale.reshape(Ne, 1, 1, 1)
            gw.index_add_(0, tb.ein_arc.reshape(-1), occe.sum(1).reshape(-1))
    return gE, (None if gw is None else gw[:-1])
