"""ASG's fully connected normaliser by matrix products (any device).

The full ASG graph has ``C + 1`` nodes and ``C * (C + 1)`` arcs: scored arc by arc it costs
25 million arc visits per frame at ``C = 5000``. As a recursion over frames it is a matrix
product per frame::

    alpha_0[i] = E[0, i] + trans[0, i]
    alpha_t[i] = E[t, i] + logsumexp_j (alpha_{t-1}[j] + trans[i + 1, j])
    log Z      = logsumexp_i alpha_{T-1}[i]

computed scaled: ``a_t = exp(alpha_t - m_t)`` with a float64 log scale ``m_t`` per example and
frame, and ``K[i, j] = exp(trans[i + 1, j] - r_i)`` (``r_i`` the row maximum), so that
``a_t ~ (a_{t-1} @ K^T) * exp(E[t] + r)``, renormalised to max 1 per frame. The backward runs
the same recursion on beta with ``K`` (not transposed), and the transition gradient is one
product ``K * (R^T @ L)`` over all frames at once. The matrix products run in the emissions'
dtype (float32 for float32 inputs: every term is in [0, 1], so the sums lose no range), the
scales and the per-frame factors in float64.

Nothing here records an autograd graph: :func:`lightning_gtn.functional.asg_loss` combines it
with the target graphs inside its custom op.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

# Off the CPU, ASG losses score their normaliser here from this many classes on. Measured with
# the torch recursion (B=2, T=50, forward + backward of the whole loss): C=64 15 vs 5 ms for the
# arc-by-arc kernels, C=128 11-17 vs 10-22 ms, C=192 14-17 vs 27-28 ms; the kernels grow as
# B * T * C^2, the products' fixed cost per frame dominates below that.
DENSE_MIN_CLASSES = 128
# On the CPU, from this many classes on (all: the numba recursion below beats the arc-by-arc
# kernels at every size, e.g. B=32, T=150, C=28, forward + backward: 6 ms against ~90 ms).
CPU_DENSE_MIN_CLASSES = 1
# On the CPU, up to this many classes the recursion runs as one numba loop per example
# (:mod:`.dense_numba`), above it as matrix products per frame. Measured (B=32, T=150,
# 2 cores, forward + backward): C=28 6 vs 46-83 ms, C=128 39-67 vs 68-79 ms, C=256 102-297 vs
# 104-141 ms, C=512 1145 vs 265 ms.
NUMBA_MAX_CLASSES = 192


def use_dense(C: int, device: torch.device) -> bool:
    """Whether a fully connected normaliser over ``C`` classes on ``device`` is scored here
    (else arc by arc by the graph kernels)."""
    return C >= (CPU_DENSE_MIN_CLASSES if device.type == "cpu" else DENSE_MIN_CLASSES)


def _as_lengths(lengths, B: int, device) -> torch.Tensor:
    if isinstance(lengths, torch.Tensor):
        return lengths.to(device=device, dtype=torch.int64)
    return torch.as_tensor(np.asarray(lengths, dtype=np.int64), device=device)


@torch.no_grad()
def asg_full_scores(
    emissions: torch.Tensor, transitions: torch.Tensor, lengths, need_grad: bool
) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """log Z of ASG's fully connected graph per example, and its gradients.

    Args:
        emissions: ``(B, T, C)`` float32/float64 frame scores.
        transitions: ``(C + 1, C)`` on the emissions' device: row 0 the start scores,
            ``transitions[i + 1, j]`` the score of label ``i`` after label ``j``.
        lengths: ``(B,)`` int64 frames per example (numpy or tensor), ``<= T``.
        need_grad: also compute the gradients.

    Returns:
        ``(logz (B,), grad_emissions (B, T, C) or None, grad_transitions (C + 1, C) or None)``
        in the emissions' dtype and device; the gradients are those of ``sum_b logz[b]``.
        An example of length 0 has no path: ``logz = -inf`` (as the graph's forward score), and
        no gradient.
    """
    logz, gE, parts = full_pass(emissions, transitions, lengths, need_grad)
    if not need_grad:
        return logz, None, None
    return logz, gE, transition_grad(gE, parts, None)


def transition_grad(gE: torch.Tensor, parts, coef: Optional[torch.Tensor]) -> torch.Tensor:
    """``sum_b coef[b] * d logz_b / d transitions`` (coef 1 when None) from :func:`full_pass`."""
    R, L, K = parts
    B, T, C = gE.shape
    gT = torch.zeros((C + 1, C), dtype=gE.dtype, device=gE.device)
    if T == 0:
        return gT
    c = None if coef is None else coef.to(gE.dtype)
    g0 = gE[:, 0] if c is None else gE[:, 0] * c.unsqueeze(1)
    gT[0] = g0.sum(0)
    if T > 1:
        Rc = R if c is None else R * c.view(B, 1, 1)
        gT[1:] = (Rc.reshape(-1, C).t() @ L.reshape(-1, C)) * K
    return gT


@torch.no_grad()
def full_pass(emissions, transitions, lengths, need_grad):
    """``(logz, gE, (R, L, K))`` of :func:`asg_full_scores`, the transition gradient in pieces:
    by :mod:`.dense_numba` on the CPU up to ``NUMBA_MAX_CLASSES`` classes, else by
    matrix products per frame."""
    B, T, C = emissions.shape
    if tuple(transitions.shape) != (C + 1, C):
        raise ValueError(f"transitions must have shape (C + 1, C) = ({C + 1}, {C}), got {tuple(transitions.shape)}")
    dev, dtype = emissions.device, emissions.dtype
    lens = _as_lengths(lengths, B, dev)
    E = emissions.detach()
    tr = transitions.detach().to(dtype)
    if dev.type == "cpu" and C <= NUMBA_MAX_CLASSES:
        from . import dense_numba

        return dense_numba.full_pass(E, tr, lens, need_grad)
    return _torch_pass(E, tr, lens, need_grad)


def _torch_pass(E, tr, lens, need_grad):
    """:func:`full_pass` by torch ops (any device)."""
    B, T, C = E.shape
    dev, dtype = E.device, E.dtype
    f64 = torch.float64
    zero = torch.zeros((), dtype=f64, device=dev)

    def finite_or_0(v):  # maxima of all -inf rows (dead labels, dead frames) become 0: no -inf - -inf
        return torch.where(v == -float("inf"), torch.zeros_like(v), v)

    def safe(mx):  # a frame of zeros stays zeros (its log scale gets -inf) instead of 0 / 0
        return torch.where(mx > 0, mx, torch.ones_like(mx))

    r = finite_or_0(tr[1:].max(1).values)  # (C,) row maxima
    K = torch.exp(tr[1:] - r.unsqueeze(1))  # (C, C), K[i, j] in [0, 1]
    q = E + r  # (B, T, C): emission + row maximum, the per-destination factor's exponent
    qm = q.max(2).values  # (B, T)
    Q = torch.exp(q - finite_or_0(qm).unsqueeze(2))  # (B, T, C) in [0, 1]
    ninf = torch.tensor(-float("inf"), dtype=f64, device=dev)
    a = torch.empty((B, T, C), dtype=dtype, device=dev)  # alpha_t / exp(m_t)
    m = torch.zeros((B, T), dtype=f64, device=dev)
    if T:
        x0 = E[:, 0] + tr[0]
        m0 = x0.max(1).values
        a[:, 0] = torch.exp(x0 - finite_or_0(m0).unsqueeze(1))
        m[:, 0] = m0.to(f64)
    for t in range(1, T):
        s = (a[:, t - 1] @ K.t()) * Q[:, t]
        mx = s.max(1).values
        a[:, t] = s / safe(mx).unsqueeze(1)
        m[:, t] = m[:, t - 1] + finite_or_0(qm[:, t]).to(f64) + torch.log(mx.to(f64))
    last = (lens - 1).clamp(min=0)
    has = lens > 0
    if T:
        a_last = a.gather(1, last.view(B, 1, 1).expand(B, 1, C)).squeeze(1)
        m_last = m.gather(1, last.view(B, 1)).squeeze(1)
        logz = torch.where(has, m_last + torch.log(a_last.to(f64).sum(1)), ninf)
    else:
        logz = torch.full((B,), -float("inf"), dtype=f64, device=dev)
    if not need_grad:
        return logz.to(dtype), None, None
    # beta: b_t = beta_t / exp(mb_t); b = 1, mb = 0 at each example's last frame
    tt = torch.arange(T, device=dev)
    fin = torch.isfinite(logz)
    live = (tt.unsqueeze(0) < lens.unsqueeze(1)) & fin.unsqueeze(1)  # (B, T); no gradient without a path
    bvec = torch.empty((B, T, C), dtype=dtype, device=dev)
    mb = torch.zeros((B, T), dtype=f64, device=dev)
    ones = torch.ones((B, C), dtype=dtype, device=dev)
    cur = ones
    cur_m = torch.zeros(B, dtype=f64, device=dev)
    for t in range(T - 1, -1, -1):
        if t < T - 1:
            s = (cur * Q[:, t + 1]) @ K  # sum_i b_{t+1}[i] Q_{t+1}[i] K[i, j]
            mx = s.max(1).values
            new = s / safe(mx).unsqueeze(1)
            new_m = cur_m + finite_or_0(qm[:, t + 1]).to(f64) + torch.log(mx.to(f64))
            inner = (t < lens - 1).unsqueeze(1)
            cur = torch.where(inner, new, ones)
            cur_m = torch.where(inner.squeeze(1), new_m, zero)
        bvec[:, t] = cur
        mb[:, t] = cur_m
    lz = torch.where(fin, logz, zero)
    # occupancy of label i at frame t: a_t[i] b_t[i] exp(m_t + mb_t - logZ)
    scale = torch.where(live, torch.exp(m + mb - lz.unsqueeze(1)), zero)
    zero_d = torch.zeros((), dtype=dtype, device=dev)
    gE = torch.where(live.unsqueeze(2), a * bvec * scale.to(dtype).unsqueeze(2), zero_d)
    R = L = None
    if T > 1:
        # arc j -> i entered at frame t >= 1: a_{t-1}[j] K[i, j] Q_t[i] b_t[i] exp(m_{t-1} + qm_t + mb_t - logZ)
        f = torch.where(
            live[:, 1:], torch.exp(m[:, :-1] + finite_or_0(qm[:, 1:]).to(f64) + mb[:, 1:] - lz.unsqueeze(1)), zero
        )
        R = torch.where(
            live[:, 1:].unsqueeze(2), Q[:, 1:] * bvec[:, 1:] * f.to(dtype).unsqueeze(2), zero_d
        )  # (B, T - 1, C) over i
        L = torch.where(live[:, 1:].unsqueeze(2), a[:, :-1], zero_d)  # over j
    return logz.to(dtype), gE, (R, L, K)
