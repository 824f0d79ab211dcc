"""One transducer lattice in plain torch ops (any device): the recursion behind every torch
transducer loss (regular RNN-T, multi-blank, TDT, k2's ``px``/``py``).

The lattice of an example is the grid of nodes ``(t, u)``, ``0 <= t < NT``, ``0 <= u < NU``, with
``A`` arc kinds: an arc of kind ``k`` leaves ``(t, u)`` for ``(t + dt[k], u + du[k])`` with the
score ``scores[b, t, u, k]``. Every example has a rectangle ``[t_begin, t_end] x [u_begin, u_end]``
of the grid; its paths start at ``(t_begin, u_begin)`` and end at ``(t_end, u_end)``, and only arcs
whose two ends lie in the rectangle count. The total is::

    log semiring: logZ[b] = log sum over paths of exp(sum of the path's arc scores)
    max semiring: logZ[b] = max over paths of the sum of its arc scores

and the posterior of each arc (the probability of the paths through it; for ``max`` the indicator
of the best path's arcs) is the gradient of ``logZ`` with respect to ``scores``.

The recursion walks the anti-diagonals ``n = t + u``: an arc of kind ``k`` links diagonal ``n`` to
``n + dt[k] + du[k]`` (so ``dt[k] + du[k] >= 1``), and one vectorised step per diagonal reads the
last ``max(dt + du)`` diagonals. The arc scores are rearranged once into diagonal order (indexed
by their source for the backward pass, by their destination for the forward pass), so a step is
one gather, one add and one reduction over the arc kinds.

Impossible arcs and nodes carry :data:`NEG`, a large negative finite score, instead of ``-inf``,
so that a log-add-exp never meets ``-inf - -inf``; totals at or below :data:`INFEASIBLE` are
reported as ``-inf`` (no path), with zero posteriors. A NaN score read inside the rectangle makes
the total and every posterior of that example NaN. Sums run in the scores' dtype (at least
float32).

:func:`lattice_posteriors` returns the total and the posteriors without autograd (usable inside
a custom op); :func:`lattice_logz` is the same total as a differentiable function whose backward
pass is the hand-written beta recursion. :func:`transducer_arc_mask` gives the arcs that a
transducer loss (whose paths end with a blank arc landing on frame ``T``) may take.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = [
    "NEG",
    "INFEASIBLE",
    "SEMIRINGS",
    "lattice_logz",
    "lattice_posteriors",
    "transducer_arc_mask",
]

#: the score of an impossible arc or node (finite: see the module docstring)
NEG = -1.0e30
#: totals at or below this are infeasible examples (reported as ``-inf``)
INFEASIBLE = -1.0e29
#: the ``semiring=`` values
SEMIRINGS = ("log", "max")
#: the largest number of diagonal-layout entries (``B * diagonals * A * NU``) one call may allocate
_MAX_ENTRIES = 1 << 31


class _Layout(NamedTuple):
    """The diagonal layout of one call: sizes, index grids and the arc scores rearranged."""

    N: int  # diagonals
    Lmax: int  # the longest arc, in diagonals (the history kept)
    Dmax: int  # the largest label advance (padding in front of u)
    L: Tensor  # (A,) diagonals spanned by each kind
    du: Tensor  # (A,)
    Ls: Tuple[int, ...]  # L and du as ints
    dus: Tuple[int, ...]
    ws: Tensor  # (B, N, NU, A) the score of the arc of kind k leaving node (n - u, u)
    wd: Tensor  # (B, N, NU, A) the score of the arc of kind k arriving at node (n - u, u)
    start: Tensor  # (B,) start diagonal
    start_u: Tensor  # (B,)
    end: Tensor  # (B,) end diagonal
    end_u: Tensor  # (B,)
    general_start: bool  # some example starts elsewhere than (0, 0)


def _check(scores: Tensor, dt: Sequence[int], du: Sequence[int], begin: Tensor, end: Tensor, semiring: str) -> None:
    if scores.dim() != 4:
        raise ValueError(f"scores must have shape (B, NT, NU, A), got {tuple(scores.shape)}")
    B, NT, NU, A = scores.shape
    if not scores.is_floating_point():
        raise ValueError(f"scores must be a float tensor, got {scores.dtype}")
    if len(dt) != A or len(du) != A or A == 0:
        raise ValueError(f"dt and du must have one entry per arc kind (A={A}), got {len(dt)} and {len(du)}")
    if any(int(a) < 0 or int(b) < 0 or int(a) + int(b) < 1 for a, b in zip(dt, du)):
        raise ValueError(f"arc kinds must have dt >= 0, du >= 0 and dt + du >= 1, got dt={list(dt)}, du={list(du)}")
    for name, x in (("begin", begin), ("end", end)):
        if tuple(x.shape) != (B, 2):
            raise ValueError(f"{name} must have shape (B, 2) = ({B}, 2), got {tuple(x.shape)}")
    if semiring not in SEMIRINGS:
        raise ValueError(f"semiring must be one of {SEMIRINGS}, got {semiring!r}")
    Lmax = max(int(a) + int(b) for a, b in zip(dt, du))
    if B * (NT + NU + Lmax) * A * (NU + max(int(b) for b in du)) > _MAX_ENTRIES:
        raise ValueError(f"scores of shape {tuple(scores.shape)}: the lattice would exceed {_MAX_ENTRIES} entries")
    if B and NT and NU:
        t0, u0, t1, u1 = begin[:, 0], begin[:, 1], end[:, 0], end[:, 1]
        ok = (t0 >= 0) & (t0 <= t1) & (t1 < NT) & (u0 >= 0) & (u0 <= u1) & (u1 < NU)
        if not bool(ok.all()):
            b = int((~ok).nonzero()[0, 0])
            raise ValueError(
                f"begin and end must satisfy 0 <= begin <= end < (NT, NU) = ({NT}, {NU}) per example; "
                f"example {b} has begin {begin[b].tolist()} and end {end[b].tolist()}"
            )


def _layout(scores: Tensor, dt: Sequence[int], du: Sequence[int], begin: Tensor, end: Tensor) -> _Layout:
    B, NT, NU, A = scores.shape
    dev, dty = scores.device, scores.dtype
    N = NT + NU - 1
    dtt = torch.tensor([int(a) for a in dt], device=dev)
    dut = torch.tensor([int(a) for a in du], device=dev)
    L = dtt + dut
    Lmax, Dmax = int(max(int(a) + int(b) for a, b in zip(dt, du))), int(max(int(b) for b in du))
    begin = begin.to(device=dev, dtype=torch.long)
    end = end.to(device=dev, dtype=torch.long)
    # an arc counts when both its ends lie in the rectangle; -inf scores become NEG (NaN stays)
    t = torch.arange(NT, device=dev).reshape(1, NT, 1, 1)
    u = torch.arange(NU, device=dev).reshape(1, 1, NU, 1)
    dt4, du4 = dtt.reshape(1, 1, 1, A), dut.reshape(1, 1, 1, A)
    t0, u0, t1, u1 = (x.reshape(B, 1, 1, 1) for x in (begin[:, 0], begin[:, 1], end[:, 0], end[:, 1]))
    ok = (t >= t0) & (t + dt4 <= t1) & (u >= u0) & (u + du4 <= u1)
    neg = torch.full((), NEG, dtype=dty, device=dev)
    # source-indexed, (B, N, NU, A) in diagonal order: ws[b, n, u, k] is the arc leaving (n - u, u)
    ws = torch.full((B, N, NU, A), NEG, dtype=dty, device=dev)
    _node_view(ws, NT).copy_(torch.where(ok, scores.clamp(min=NEG), neg))
    # destination-indexed: wd[b, n, u, k] = ws[b, n - L[k], u - du[k], k]
    wd = torch.full((B, N, NU, A), NEG, dtype=dty, device=dev)
    for k, (a, d) in enumerate(zip(dt, du)):
        Lk, dk = int(a) + int(d), int(d)
        if Lk < N and dk < NU:
            wd[:, Lk:, dk:, k] = ws[:, : N - Lk, : NU - dk, k]
    return _Layout(
        N,
        Lmax,
        Dmax,
        L,
        dut,
        tuple(int(a) + int(b) for a, b in zip(dt, du)),
        tuple(int(b) for b in du),
        ws,
        wd,
        begin[:, 0] + begin[:, 1],
        begin[:, 1],
        end[:, 0] + end[:, 1],
        end[:, 1],
        bool((begin != 0).any()),
    )


def _combine(views: Sequence[Tensor], w: Tensor, semiring: str, out: Tensor) -> None:
    """``out = reduce over k of (views[k] + w[:, k])``: the sum (log semiring) or the max over the
    arc kinds; ``views`` are ``A`` tensors ``(B, NU)``, ``w`` is ``(B, NU, A)``."""
    A = len(views)
    if A == 1:
        torch.add(views[0], w[..., 0], out=out)
    elif A == 2:
        pair = torch.maximum if semiring == "max" else torch.logaddexp
        pair(views[0] + w[..., 0], views[1] + w[..., 1], out=out)
    else:
        x = torch.stack(list(views), 2).add_(w)
        if semiring == "max":
            torch.amax(x, 2, out=out)
        else:  # log-sum-exp by hand: the scores are finite or NaN (fewer kernels than torch's)
            m = x.amax(2, keepdim=True)
            torch.log(x.sub_(m).exp_().sum(2), out=out)
            out.add_(m[..., 0])


def _alpha(lay: _Layout, semiring: str) -> Tensor:
    """``(B, Lmax + N, Dmax + NU)``: ``alpha(n, u)`` at ``[:, Lmax + n, Dmax + u]``, NEG around."""
    B, N, NU, A = lay.ws.shape
    dev, dty = lay.ws.device, lay.ws.dtype
    Lmax, Dmax = lay.Lmax, lay.Dmax
    ap = torch.full((B, Lmax + N, Dmax + NU), NEG, dtype=dty, device=dev)
    bi = torch.arange(B, device=dev)
    ap[bi, Lmax + lay.start, Dmax + lay.start_u] = 0.0
    if B == 0:
        return ap
    kinds = list(zip(lay.Ls, lay.dus))
    first = int(lay.start.min()) + 1
    last = int(lay.end.max())
    if lay.general_start:
        u = torch.arange(NU, device=dev).reshape(1, NU)
        starts = set(lay.start.tolist())
    for n in range(first, last + 1):
        views = [ap[:, Lmax + n - L, Dmax - d : Dmax - d + NU] for L, d in kinds]
        out = ap[:, Lmax + n, Dmax:]
        _combine(views, lay.wd[:, n], semiring, out)
        if lay.general_start and n in starts:  # the first node of an example that starts here
            out.masked_fill_((lay.start.reshape(B, 1) == n) & (u == lay.start_u.reshape(B, 1)), 0.0)
    return ap


def _beta(lay: _Layout, semiring: str) -> Tensor:
    """``(B, N + Lmax, NU + Dmax)``: ``beta(n, u)`` at ``[:, n, u]``, NEG behind."""
    B, N, NU, A = lay.ws.shape
    dev, dty = lay.ws.device, lay.ws.dtype
    bp = torch.full((B, N + lay.Lmax, NU + lay.Dmax), NEG, dtype=dty, device=dev)
    bi = torch.arange(B, device=dev)
    bp[bi, lay.end, lay.end_u] = 0.0
    if B == 0:
        return bp
    kinds = list(zip(lay.Ls, lay.dus))
    u = torch.arange(NU, device=dev).reshape(1, NU)
    ends = set(lay.end.tolist())
    for n in range(int(lay.end.max()) - 1, int(lay.start.min()) - 1, -1):
        views = [bp[:, n + L, d : d + NU] for L, d in kinds]
        out = bp[:, n, :NU]
        _combine(views, lay.ws[:, n], semiring, out)
        if n in ends:  # the last node of an example that ends here (its arcs all leave the rectangle)
            out.masked_fill_((lay.end.reshape(B, 1) == n) & (u == lay.end_u.reshape(B, 1)), 0.0)
    return bp


def _total(ap: Tensor, lay: _Layout) -> Tensor:
    bi = torch.arange(ap.shape[0], device=ap.device)
    return ap[bi, lay.Lmax + lay.end, lay.Dmax + lay.end_u]


def _node_view(d: Tensor, NT: int) -> Tensor:
    """The ``(B, NT, NU, A)`` node-order view of a contiguous ``(B, N, NU, A)`` diagonal-order
    tensor: node ``(t, u)`` sits at diagonal ``t + u``, so its strides are ``(NU A, (NU + 1) A, 1)``."""
    B, N, NU, A = d.shape
    return d.as_strided((B, NT, NU, A), (N * NU * A, NU * A, (NU + 1) * A, 1), d.storage_offset())


def _to_nodes(p: Tensor, NT: int) -> Tensor:
    """``(B, N, NU, A)`` diagonal order to a contiguous ``(B, NT, NU, A)`` node order."""
    return _node_view(p.contiguous(), NT).contiguous()


def _posteriors(lay: _Layout, ap: Tensor, logz: Tensor, semiring: str, NT: int) -> Tensor:
    """``(B, NT, NU, A)`` arc posteriors (log: from the beta recursion; max: the best path)."""
    B, N, NU, A = lay.ws.shape
    dev = lay.ws.device
    feasible = ~(logz <= INFEASIBLE)  # NaN totals stay feasible: their posteriors are NaN
    if semiring == "max":
        return _best_path(lay, ap, feasible, NT)
    bp = _beta(lay, semiring)
    alpha = ap[:, lay.Lmax :, lay.Dmax :]
    lz = torch.where(feasible, logz, torch.zeros_like(logz)).reshape(B, 1, 1)
    # the beta of each kind's destination, (B, N, NU) views: beta(n + L, u + du)
    nxt = torch.stack([bp[:, L : L + N, d : d + NU] for L, d in zip(lay.Ls, lay.dus)], 3)
    p = (alpha.unsqueeze(3) + lay.ws).add_(nxt).sub_(lz.unsqueeze(3)).exp_()
    p = torch.where(feasible.reshape(B, 1, 1, 1), p, torch.zeros((), dtype=p.dtype, device=dev))
    return _to_nodes(p, NT)


def _best_path(lay: _Layout, ap: Tensor, feasible: Tensor, NT: int) -> Tensor:
    """The indicator of the arcs of each example's best path (the first best kind at each node,
    walking back from the end), ``(B, NT, NU, A)``; zero for infeasible examples."""
    B, N, NU, A = lay.ws.shape
    dev = lay.ws.device
    bi = torch.arange(B, device=dev)
    p = torch.zeros((B, N, NU, A), dtype=lay.ws.dtype, device=dev)
    n, u = lay.end.clone(), lay.end_u.clone()
    rows = lay.Lmax - lay.L.reshape(1, A)  # + n
    cols = lay.Dmax - lay.du.reshape(1, A)  # + u
    active = feasible & ((n != lay.start) | (u != lay.start_u))
    for _ in range(int((lay.end - lay.start).max()) if B else 0):
        if not bool(active.any()):
            break
        cand = ap[bi.reshape(B, 1), rows + n.reshape(B, 1), cols + u.reshape(B, 1)]
        cand = cand + lay.wd[bi, n.clamp(0, N - 1), u.clamp(0, NU - 1)]
        k = cand.argmax(1)
        n_src = n - lay.L[k]
        u_src = u - lay.du[k]
        sel = active.nonzero()[:, 0]
        p[sel, n_src[sel], u_src[sel], k[sel]] = 1.0
        n = torch.where(active, n_src, n)
        u = torch.where(active, u_src, u)
        active = active & ((n != lay.start) | (u != lay.start_u))
    return _to_nodes(p, NT)


def _finish(logz: Tensor) -> Tensor:
    return torch.where(logz <= INFEASIBLE, torch.full_like(logz, float("-inf")), logz)


def _compute_dtype(scores: Tensor) -> torch.dtype:
    return scores.dtype if scores.dtype in (torch.float32, torch.float64) else torch.float32


@torch.no_grad()
def lattice_posteriors(
    scores: Tensor,
    dt: Sequence[int],
    du: Sequence[int],
    begin: Tensor,
    end: Tensor,
    need_posteriors: bool = True,
    semiring: str = "log",
) -> Tuple[Tensor, Optional[Tensor]]:
    """``(logZ (B,), posteriors (B, NT, NU, A) or None)`` of the lattice (see the module docstring).

    Args:
        scores: ``(B, NT, NU, A)`` float arc scores on any device; ``scores[b, t, u, k]`` is the
            score of the arc of kind ``k`` leaving ``(t, u)`` (``-inf``: no arc).
        dt, du: the time and label advance of each kind (``>= 0``, ``dt[k] + du[k] >= 1``).
        begin, end: ``(B, 2)`` int64 ``(t, u)`` of each example's first and last node,
            ``0 <= begin <= end < (NT, NU)`` componentwise.
        need_posteriors: also return the posteriors.
        semiring: ``"log"`` (the sum over paths) or ``"max"`` (the best path).

    Returns:
        ``logZ`` (``-inf`` for an example without a path) and the posteriors, both in the scores'
        dtype (float32 for half-precision scores), on the scores' device.
    """
    _check(scores, dt, du, begin, end, semiring)
    B, NT, NU, A = scores.shape
    dty = scores.dtype
    if B == 0 or NT == 0 or NU == 0:
        post = scores.new_zeros(scores.shape) if need_posteriors else None
        return scores.new_full((B,), float("-inf")), post
    lay = _layout(scores.detach().to(_compute_dtype(scores)), dt, du, begin, end)
    ap = _alpha(lay, semiring)
    logz = _total(ap, lay)
    post = _posteriors(lay, ap, logz, semiring, NT).to(dty) if need_posteriors else None
    return _finish(logz).to(dty), post


class _LatticeFunction(torch.autograd.Function):
    """``logZ`` of :func:`lattice_posteriors`, whose gradient is the posteriors (beta recursion
    in the backward pass; the forward keeps the alpha diagonals)."""

    @staticmethod
    def forward(ctx, scores, dt, du, begin, end, semiring):
        _check(scores, dt, du, begin, end, semiring)
        B, NT, NU, A = scores.shape
        ctx.shape = scores.shape
        ctx.semiring = semiring
        if B == 0 or NT == 0 or NU == 0:
            ctx.lay = None
            return scores.new_full((B,), float("-inf"))
        lay = _layout(scores.detach().to(_compute_dtype(scores)), dt, du, begin, end)
        ap = _alpha(lay, semiring)
        logz = _total(ap, lay)
        ctx.lay, ctx.ap, ctx.logz = lay, ap, logz
        ctx.dtype = scores.dtype
        return _finish(logz).to(scores.dtype)

    @staticmethod
    def backward(ctx, g):
        if ctx.lay is None:
            return g.new_zeros(ctx.shape), None, None, None, None, None
        post = _posteriors(ctx.lay, ctx.ap, ctx.logz, ctx.semiring, ctx.shape[1])
        gs = (post * g.to(post.dtype).reshape(-1, 1, 1, 1)).to(ctx.dtype)
        return gs, None, None, None, None, None


def lattice_logz(
    scores: Tensor, dt: Sequence[int], du: Sequence[int], begin: Tensor, end: Tensor, semiring: str = "log"
) -> Tensor:
    """``(B,)`` ``logZ`` of :func:`lattice_posteriors`, differentiable with respect to ``scores``
    (the gradient is the posteriors; first order only)."""
    out: Tensor = _LatticeFunction.apply(scores, tuple(dt), tuple(du), begin, end, semiring)
    return out


def transducer_arc_mask(NT: int, dt: Sequence[int], du: Sequence[int], tlen: Tensor) -> Tensor:
    """``(B, NT, 1, A)`` bool: the arcs a transducer path may take, whose nodes are the frames
    ``t < tlen[b]`` plus the end row ``t = tlen[b]``: an arc must land before that row, or on it
    when it advances no label (a path's last arc is a blank that lands exactly on ``tlen[b]``;
    a token arc landing on or after it ends nothing)."""
    dev = tlen.device
    t = torch.arange(NT, device=dev).reshape(1, NT, 1, 1)
    dtt = torch.tensor([int(a) for a in dt], device=dev).reshape(1, 1, 1, -1)
    blank_kind = torch.tensor([int(a) == 0 for a in du], device=dev).reshape(1, 1, 1, -1)
    T = tlen.to(torch.long).reshape(-1, 1, 1, 1)
    land = t + dtt
    return (land < T) | (blank_kind & (land == T))
