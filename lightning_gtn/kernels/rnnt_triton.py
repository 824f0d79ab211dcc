"""The RNN-T loss as Triton kernels (CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``).

A joiner output ``logits (B, T, U + 1, V)`` is scored in three launches:

1. **rows** (one program per block of ``(b, t, u)`` rows): the log-normaliser of each row over the
   vocabulary (an online logsumexp over chunks of ``V``), and the two log-probabilities the
   lattice reads at that node: the blank's and the next target's. Rows outside an example's
   lengths are not read.
2. **lattice** (one program per example and direction): ``alpha`` (programs ``(b, 0)``) and
   ``beta`` (programs ``(b, 1)``) over the ``(T_b, U_b + 1)`` grid, one time row at a time: within
   row ``t``, ``alpha[t, u] = log(exp(alpha[t - 1, u] + lp_blank[t - 1, u]) + exp(alpha[t, u - 1] +
   lp_emit[t, u - 1]))`` is a linear recurrence of the log semiring along ``u``, solved by one
   ``tl.associative_scan`` over pairs ``(a, b)`` that stand for the steps ``x -> log(exp(a + x) +
   exp(b))`` (:func:`_row_scan`); the previous row stays in registers, so ``T_b`` steps need no
   barrier and no read-back. Where a row does not fit one block (``U + 1 > MAX_ROW_U``) the
   lattice is walked by anti-diagonals ``t + u = d`` instead: the nodes of a diagonal depend
   only on the previous one, so a diagonal is one vector step over ``u`` (in chunks of
   ``BLOCK_U``), read back from global memory after a block barrier. ``lattice=`` forces either.
3. **grad** (one program per block of rows, one pass over ``V``): the gradient of
   ``cost_b = -log P(y_b | x_b)`` with respect to the logits, written once per element:
   ``(p_blank + (1 + lambda) p_emit) * softmax - p_blank [v = blank] - (1 + lambda) p_emit [v = y_u]``,
   where ``p_blank``/``p_emit`` are the posteriors of the node's two arcs (``lambda`` is FastEmit's,
   0 by default), clipped to ``[-clamp, clamp]`` when ``clamp > 0``. Without the fused log-softmax
   the logits are log-probabilities and only the two arc terms remain.

Everything is computed in the logits' dtype (float32 or float64), in log space; the extra memory is
five ``(B, T, U + 1)`` buffers. The gradient may be written into the logits' own storage
(``inplace=True``: each element is read before it is overwritten, by the same program).

FastEmit follows NeMo / warprnnt-numba: the gradient of each emitting arc is scaled by
``1 + lambda`` (the softmax term included) and the reported cost is ``-(1 + lambda) log P(y | x)``.

An example with ``logit_lengths[b] == 0`` has no path: its cost is ``+inf`` and its gradient 0.
No atomics: results are bitwise reproducible.

The same three-launch shape serves the variants: :func:`tdt_triton` (token-and-duration transducer)
and :func:`multiblank_triton` run a lattice whose blank and emitting arcs may skip frames (a row
then reads the rows an arc of ``l >= 1`` frames comes from back from memory, after one barrier per
row, and its 0-frame emissions are its scan; the anti-diagonal fallback reads earlier diagonals);
:func:`duration_lattice_triton` takes such a lattice by its arcs (the form of the losses'
duration-lattice op; with ``fused_log_softmax=False`` the logits are log-probabilities); and
:func:`mutual_information_triton` is k2's recursion over ``px``/``py`` (the core of k2's simple and
pruned RNN-T losses), walked by frames the same way (the modified recursion's ``px`` links frame
``t - 1`` to ``t``: no scan, one barrier per frame), with the same anti-diagonal fallback.
:func:`self_check` runs torchaudio's published small case on a device, for a dispatcher that wants
to verify the kernels once.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch

try:  # Triton ships with CUDA builds of torch; CPU-only installs do not need it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = None
    tl = None

__all__ = [
    "available",
    "self_check",
    "rnnt_triton",
    "tdt_triton",
    "multiblank_triton",
    "mutual_information_triton",
    "duration_lattice_triton",
    "MAX_BLOCK_V",
    "MAX_BLOCK_U",
    "MAX_ROW_U",
]

MAX_BLOCK_V = 1024  # vocabulary entries one program holds per row and step
MAX_BLOCK_U = 1024  # lattice nodes of one anti-diagonal processed per step
MAX_ROW_U = 1024  # lattice nodes of one time row held by one program (the row-scan lattice)
_TILE = 4096  # rows x vocabulary entries per program in the row kernels

# Triton picks the interpreter when a kernel is decorated, from the environment at import time
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def available() -> bool:
    """True when Triton is importable (it needs a CUDA device to run, or TRITON_INTERPRET=1)."""
    return triton is not None


def self_check(device) -> Optional[str]:
    """Runs :func:`rnnt_triton` on torchaudio's published B=1, T=2, U=2, V=5 case (blank 4) on
    ``device``; returns None when cost and gradient match, else what went wrong (for a dispatcher
    that falls back to another implementation)."""
    row = [0.1, 0.6, 0.1, 0.1, 0.1, 0.1, 0.1, 0.6, 0.1, 0.1, 0.1, 0.1, 0.2, 0.8, 0.1]
    row2 = [0.1, 0.6, 0.1, 0.1, 0.1, 0.1, 0.1, 0.2, 0.1, 0.1, 0.7, 0.1, 0.2, 0.1, 0.1]
    x = torch.tensor(row + row2, dtype=torch.float32, device=device).reshape(1, 2, 3, 5)
    two, targets = torch.tensor([2], device=device), torch.tensor([[1, 2]], device=device)
    try:
        costs, grads = rnnt_triton(x, targets, two, two, blank=4)
    except Exception as e:  # noqa: BLE001 - any failure means "do not use these kernels"
        return f"rnnt_triton failed: {e!r}"
    if grads is None or abs(float(costs[0]) - 5.09566688538) > 1e-4:
        return f"rnnt_triton: cost {float(costs[0])} != 5.09566688538"
    # d cost / d logits at (t=1, u=2): the last blank and the softmax of the row
    want = [0.30741188, 0.16871123, 0.18645471, 0.16871123, -0.83128875]
    got = grads[0, 1, 2].tolist()
    if max(abs(a - b) for a, b in zip(got, want)) > 1e-4:
        return f"rnnt_triton: gradient {got} != {want}"
    return None


def _check_device(device: torch.device) -> None:
    if triton is None:
        raise RuntimeError("rnnt_triton needs triton, which is not installed")
    if device.type != "cuda" and not (_INTERPRETED and device.type == "cpu"):
        raise ValueError(
            f"rnnt_triton: logits must be a CUDA tensor (or a CPU tensor with TRITON_INTERPRET=1 set "
            f"before triton is imported), got device {device}"
        )


def _as_index(x: torch.Tensor, name: str, shape: Tuple[int, ...], device: torch.device) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"rnnt_triton: {name} must be a tensor of shape {shape}, got {type(x).__name__}")
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise ValueError(f"rnnt_triton: {name} must be an integer tensor, got {x.dtype}")
    if tuple(x.shape) != shape:
        raise ValueError(f"rnnt_triton: {name} must have shape {shape}, got {tuple(x.shape)}")
    return x.to(device=device, dtype=torch.int64).contiguous()


def _validate(logits, targets, logit_lengths, target_lengths, blank, clamp, fastemit_lambda, extra=0):
    """Checks every argument the kernels index with; returns the index tensors as contiguous int64
    on the logits' device. The last ``extra`` columns of the logits are not tokens (TDT's
    durations): blank and targets must lie below them."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 4:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"rnnt_triton: logits must have shape (B, T, U + 1, V), got {got}")
    if logits.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"rnnt_triton: logits must be float32 or float64, got {logits.dtype}")
    B, T, U1, V = logits.shape
    V -= extra
    if U1 < 1 or V < 1:
        raise ValueError(f"rnnt_triton: logits must have U + 1 >= 1 and V >= 1, got shape {tuple(logits.shape)}")
    _check_device(logits.device)
    dev = logits.device
    U = U1 - 1
    if targets.dim() == 2 and targets.shape[0] == B and targets.shape[1] > U:
        targets = targets[:, :U]  # longer padding than the lattice needs; the lengths are checked below
    tg = _as_index(targets, "targets", (B, U), dev)
    xl = _as_index(logit_lengths, "logit_lengths", (B,), dev)
    yl = _as_index(target_lengths, "target_lengths", (B,), dev)
    if isinstance(blank, bool) or not isinstance(blank, int) or not 0 <= blank < V:
        raise ValueError(f"rnnt_triton: blank must be an int in [0, {V}), got {blank!r}")
    for name, val in (("clamp", clamp), ("fastemit_lambda", fastemit_lambda)):
        if not isinstance(val, (int, float)) or val != val or val in (float("inf"), float("-inf")):
            raise ValueError(f"rnnt_triton: {name} must be a finite number, got {val!r}")
    if B:
        if bool(((xl < 0) | (xl > T)).any()):
            raise ValueError(f"rnnt_triton: logit_lengths must lie in [0, T={T}], got {xl.tolist()}")
        if bool(((yl < 0) | (yl > U)).any()):
            raise ValueError(f"rnnt_triton: target_lengths must lie in [0, U={U}], got {yl.tolist()}")
        if U:
            inside = torch.arange(U, device=dev)[None, :] < yl[:, None]
            if bool((inside & ((tg < 0) | (tg >= V))).any()):
                raise ValueError(f"rnnt_triton: targets (within target_lengths) must lie in [0, V={V})")
    if B * T * U1 >= 2**31:
        raise ValueError(f"rnnt_triton: B * T * (U + 1) = {B * T * U1} lattice nodes is too many (< 2**31)")
    return tg, xl, yl


def _walk_rows(lattice: str, n: int, block: Optional[int], who: str) -> bool:
    """Whether the lattice whose rows hold ``n`` nodes is walked by time rows (True) or by
    anti-diagonals (False). ``lattice``: ``"auto"`` (rows when a row fits one block: ``n <=
    MAX_ROW_U`` and, when given, ``n <= block``), ``"rows"`` (an error when it does not fit) or
    ``"diagonals"``."""
    if lattice not in ("auto", "rows", "diagonals"):
        raise ValueError(f"{who}: lattice must be 'auto', 'rows' or 'diagonals', got {lattice!r}")
    fits = n <= min(MAX_ROW_U, block or MAX_ROW_U)
    if lattice == "rows" and not fits:
        raise ValueError(
            f"{who}: lattice='rows' needs a row of at most {min(MAX_ROW_U, block or MAX_ROW_U)} nodes, got {n}"
        )
    return lattice != "diagonals" and fits


def _row_launch(n: int) -> Tuple[int, int]:
    """``(BLOCK, num_warps)`` of a row-scan lattice kernel whose rows hold ``n`` nodes."""
    bu = triton.next_power_of_2(max(1, n))
    return bu, max(1, min(8, bu // 64))


def _row_blocks(V: int, block_v: Optional[int]) -> Tuple[int, int, int]:
    """``(BLOCK_R, BLOCK_V, num_warps)`` for the row kernels."""
    bv = triton.next_power_of_2(max(1, min(V, block_v or MAX_BLOCK_V)))
    br = max(1, _TILE // bv)
    return br, bv, 4 if br * bv <= 2048 else 8


def rnnt_triton(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    fused_log_softmax: bool = True,
    clamp: float = -1.0,
    fastemit_lambda: float = 0.0,
    need_grad: bool = True,
    inplace: bool = False,
    block_v: Optional[int] = None,
    block_u: Optional[int] = None,
    lattice: str = "auto",
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """RNN-T costs and their gradients with respect to the logits.

    Args:
        logits: ``(B, T, U + 1, V)`` float32 or float64, on a CUDA device (or the CPU under
            ``TRITON_INTERPRET=1``); made contiguous (a copy) when it is not.
        targets: ``(B, U)`` integer; entries past ``target_lengths[b]`` are never read (a wider
            ``(B, U')`` is cut to ``U``).
        logit_lengths: ``(B,)`` integer in ``[0, T]``.
        target_lengths: ``(B,)`` integer in ``[0, U]``.
        blank: the blank id, in ``[0, V)`` (a negative id must be resolved by the caller).
        fused_log_softmax: ``True``: the logits are normalised over ``V`` here (torchaudio's
            default); ``False``: they are log-probabilities, used as they are.
        clamp: ``> 0`` clips each gradient entry to ``[-clamp, clamp]``; ``<= 0``: no clipping.
        fastemit_lambda: FastEmit's ``lambda`` (NeMo's definition; 0 turns it off).
        need_grad: compute the gradient (otherwise only alpha runs and ``None`` is returned).
        inplace: write the gradient into ``logits``' storage (needs a contiguous ``logits``);
            ``logits`` holds the gradient afterwards.
        block_v, block_u: tile sizes (powers of two are used), for tests of the chunked paths;
            a ``block_u`` below ``U + 1`` walks anti-diagonals in chunks of it.
        lattice: ``"auto"``: walk time rows (one scan per row) when ``U + 1 <= MAX_ROW_U``, else
            anti-diagonals; ``"rows"`` or ``"diagonals"`` force one (for benchmarks and tests).

    Returns:
        ``(costs (B,), grads (B, T, U + 1, V) or None)`` in the logits' dtype and device:
        ``costs[b] = -(1 + fastemit_lambda) * log P(y_b | x_b)`` and ``grads[b] = d costs[b] / d
        logits[b]`` per example (not scaled by any reduction; with FastEmit, NeMo's gradient),
        zero outside each example's lengths.

    Raises:
        ValueError: for a bad shape, dtype, device, length, target id or blank, before any kernel
            runs.
    """
    tg, xl, yl = _validate(logits, targets, logit_lengths, target_lengths, blank, clamp, fastemit_lambda)
    B, T, U1, V = logits.shape
    dev, dtype = logits.device, logits.dtype
    rows = _walk_rows(lattice, U1, block_u, "rnnt_triton")
    if inplace and not logits.is_contiguous():
        raise ValueError("rnnt_triton: inplace=True needs contiguous logits")
    x = logits.detach()
    x = x if x.is_contiguous() else x.contiguous()
    costs = torch.empty(B, dtype=dtype, device=dev)
    if B == 0 or T == 0:
        costs.fill_(float("inf"))
        grads = None
        if need_grad:
            grads = x.zero_() if inplace else torch.zeros_like(x)
        return costs, grads
    R = B * T * U1
    lse = torch.empty((B, T, U1), dtype=dtype, device=dev)
    lpb = torch.empty_like(lse)
    lpe = torch.empty_like(lse)
    alpha = torch.empty_like(lse)
    beta = torch.empty_like(lse) if need_grad else alpha
    ll = torch.empty(B, dtype=dtype, device=dev)
    scalars = torch.tensor([float(clamp), float(fastemit_lambda)], dtype=dtype, device=dev)
    br, bv, nw = _row_blocks(V, block_v)
    grid_rows = (triton.cdiv(R, br),)
    _rows_kernel[grid_rows](
        x, lse, lpb, lpe, tg, xl, yl, R, T, U1, V, blank,
        FUSED=bool(fused_log_softmax), ONE_PASS=bv >= V, BLOCK_R=br, BLOCK_V=bv, num_warps=nw,
    )  # fmt: skip
    if rows:
        bu, nwu = _row_launch(U1)
        _lattice_rows_kernel[(B, 2 if need_grad else 1)](
            lpb, lpe, alpha, beta, ll, xl, yl, T, U1, BLOCK_U=bu, num_warps=nwu
        )
    else:
        bu = triton.next_power_of_2(max(1, min(U1, block_u or MAX_BLOCK_U)))
        _lattice_kernel[(B, 2 if need_grad else 1)](
            lpb, lpe, alpha, beta, ll, xl, yl, T, U1, BLOCK_U=bu, num_warps=4 if bu <= 512 else 8
        )
    costs.copy_(ll).mul_(-(1.0 + float(fastemit_lambda)))
    if not need_grad:
        return costs, None
    grads = x if inplace else torch.empty_like(x)
    _grad_kernel[grid_rows](
        x, grads, lse, lpb, lpe, alpha, beta, ll, tg, xl, yl, scalars, R, T, U1, V, blank,
        FUSED=bool(fused_log_softmax), CLAMP=float(clamp) > 0, EMIT_SCALE=float(fastemit_lambda) != 0,
        BLOCK_R=br, BLOCK_V=bv, num_warps=nw,
    )  # fmt: skip
    return costs, grads


def _validate_mi(px, py, boundary):
    """Shapes, dtypes, device and boundary of :func:`mutual_information_triton`; returns the
    boundary as contiguous int64 ``(B, 4)`` on the device."""
    for name, x in (("px", px), ("py", py)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(f"mutual_information_triton: {name} must be a 3-d tensor")
    if px.dtype not in (torch.float32, torch.float64) or py.dtype != px.dtype:
        raise ValueError(
            f"mutual_information_triton: px and py must share float32 or float64, got {px.dtype}, {py.dtype}"
        )
    if py.device != px.device:
        raise ValueError("mutual_information_triton: px and py must be on one device")
    B, S1, T = py.shape
    S = S1 - 1
    if S < 0 or tuple(px.shape) not in ((B, S, T), (B, S, T + 1)):
        raise ValueError(
            f"mutual_information_triton: px must be (B, S, T + 1) or (B, S, T) (modified) for py (B, S + 1, T) = "
            f"{tuple(py.shape)}, got {tuple(px.shape)}"
        )
    _check_device(px.device)
    if boundary is None:
        return torch.tensor([0, 0, S, T], dtype=torch.int64, device=px.device).expand(B, 4).contiguous()
    bd = _as_index(boundary, "boundary", (B, 4), px.device)
    if B:
        sb, tb, se, te = bd.unbind(1)
        if bool(((sb < 0) | (sb > se) | (se > S) | (tb < 0) | (tb > te) | (te > T)).any()):
            raise ValueError(
                f"mutual_information_triton: boundary rows must be [s_begin, t_begin, s_end, t_end] with "
                f"0 <= s_begin <= s_end <= S={S} and 0 <= t_begin <= t_end <= T={T}"
            )
    return bd


def mutual_information_triton(
    px: torch.Tensor,
    py: torch.Tensor,
    boundary: Optional[torch.Tensor] = None,
    need_grad: bool = True,
    block: Optional[int] = None,
    lattice: str = "auto",
) -> Tuple[torch.Tensor, Optional[Tuple[torch.Tensor, torch.Tensor]]]:
    """k2's mutual-information recursion: per-example scores and their gradients.

    ``p[b, s_begin, t_begin] = 0`` and, inside the box ``s_begin <= s <= s_end``,
    ``t_begin <= t <= t_end`` (values outside it are -inf)::

        p[b, s, t] = logaddexp(p[b, s - 1, t] + px[b, s - 1, t], p[b, s, t - 1] + py[b, s, t - 1])
        # modified (px of shape (B, S, T)):
        p[b, s, t] = logaddexp(p[b, s - 1, t - 1] + px[b, s - 1, t - 1], p[b, s, t - 1] + py[b, s, t - 1])

    Args:
        px: ``(B, S, T + 1)``, or ``(B, S, T)`` for the "modified" recursion; float32/float64.
        py: ``(B, S + 1, T)``, same dtype and device.
        boundary: ``(B, 4)`` integer rows ``[s_begin, t_begin, s_end, t_end]``; default ``[0, 0, S, T]``.
        need_grad: also return the gradients.
        block: the number of lattice nodes of a diagonal processed per step (tests); below
            ``S + 1`` it walks anti-diagonals.
        lattice: ``"auto"``: walk frames (one scan over ``s`` per frame) when ``S + 1 <= MAX_ROW_U``,
            else anti-diagonals; ``"rows"`` or ``"diagonals"`` force one.

    Returns:
        ``(scores (B,), (px_grad, py_grad) or None)``: ``scores[b] = p[b, s_end, t_end]`` and the
        gradients of ``scores.sum()`` (the arcs' occupation probabilities; k2's ``return_grad``),
        zero outside each box and for an example whose score is -inf or NaN.
    """
    bd = _validate_mi(px, py, boundary)
    B, S1, T = py.shape
    S = S1 - 1
    modified = px.shape[2] == T
    dev, dtype = px.device, px.dtype
    pxc, pyc = px.detach().contiguous(), py.detach().contiguous()
    p = torch.full((B, S + 1, T + 1), float("-inf"), dtype=dtype, device=dev)
    beta = torch.full_like(p, float("-inf")) if need_grad else p
    scores = torch.empty(B, dtype=dtype, device=dev)
    rows = _walk_rows(lattice, S + 1, block, "mutual_information_triton")
    if B and rows:
        bs, nw = _row_launch(S + 1)
        _mi_rows_kernel[(B, 2 if need_grad else 1)](
            pxc, pyc, p, beta, scores, bd, S, T, px.shape[2], MODIFIED=modified, BLOCK=bs, num_warps=nw
        )
    elif B:
        bs = triton.next_power_of_2(max(1, min(S + 1, block or MAX_BLOCK_U)))
        _mi_kernel[(B, 2 if need_grad else 1)](
            pxc, pyc, p, beta, scores, bd, S, T, px.shape[2],
            MODIFIED=modified, BLOCK=bs, num_warps=4 if bs <= 512 else 8,
        )  # fmt: skip
    if not need_grad:
        return scores, None
    tot = scores[:, None, None]
    live = (tot != float("-inf")) & (tot == tot)
    s_ix = torch.arange(S + 1, device=dev)[None, :, None]
    t_ix = torch.arange(T + 1, device=dev)[None, None, :]
    sb, tb, se, te = (bd[:, k, None, None] for k in range(4))
    s_in = (s_ix >= sb) & (s_ix <= se)
    t_in = (t_ix >= tb) & (t_ix <= te)
    zero = torch.zeros((), dtype=dtype, device=dev)
    # py arc (s, t) -> (s, t + 1)
    py_ok = live & s_in & t_in[:, :, 1:]
    py_grad = torch.where(py_ok, torch.exp(p[:, :, :T] + pyc + beta[:, :, 1:] - tot), zero)
    # px arc (s, t) -> (s + 1, t) or, modified, (s + 1, t + 1)
    if modified:
        px_ok = live & s_in[:, 1:] & t_in[:, :, 1:]
        px_grad = torch.where(px_ok, torch.exp(p[:, :S, :T] + pxc + beta[:, 1:, 1:] - tot), zero)
    else:
        px_ok = live & s_in[:, 1:] & t_in
        px_grad = torch.where(px_ok, torch.exp(p[:, :S, :] + pxc + beta[:, 1:, :] - tot), zero)
    return scores, (px_grad, py_grad)


def _durations(name: str, values, allow_zero: bool) -> list:
    vals = list(values) if isinstance(values, (list, tuple)) else None
    low = 0 if allow_zero else 1
    if not vals or any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in vals):
        raise ValueError(f"{name} must be a non-empty list of ints >= {low}, got {values!r}")
    return vals


def tdt_triton(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    durations,
    sigma: float = 0.0,
    clamp: float = -1.0,
    fastemit_lambda: float = 0.0,
    need_grad: bool = True,
    block_v: Optional[int] = None,
    block_u: Optional[int] = None,
    lattice: str = "auto",
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The token-and-duration transducer (TDT) loss, NeMo's definition, and its gradient.

    ``logits (B, T, U + 1, V + D)`` holds the token logits in its first ``V`` columns and the
    duration logits in its last ``D = len(durations)``; both are log-softmaxed here. From node
    ``(t, u)``, with ``l = durations[i]`` and weight ``log p_tok - sigma + log p_dur[i]``:
    a blank goes to ``(t + l, u)`` (only ``l > 0``; it ends the path when ``t + l = T_b`` and
    ``u = U_b``), the target ``y_u`` goes to ``(t + l, u + 1)`` (only when ``t + l < T_b``).
    ``cost_b = -(1 + fastemit_lambda) log P(y_b | x_b)``; ``grads[b]`` is NeMo's: with respect to the
    token logits (FastEmit-scaled emissions, clipped to ``[-clamp, clamp]`` when ``clamp > 0``) and to
    the duration logits (not clipped). NeMo's ``omega`` (sample the plain RNN-T loss with that
    probability) is the caller's choice: call :func:`rnnt_triton` on the token logits instead.

    Other arguments (``lattice`` included), devices, dtypes and errors as :func:`rnnt_triton`;
    ``durations`` are ints >= 0 with at least one > 0.
    """
    durs = _durations("durations", durations, allow_zero=True)
    if not any(d > 0 for d in durs):
        raise ValueError(f"durations must hold at least one duration > 0 (a blank must advance), got {durs}")
    if isinstance(logits, torch.Tensor) and logits.dim() == 4 and logits.shape[-1] <= len(durs):
        raise ValueError(f"tdt_triton: logits must have V + {len(durs)} columns with V >= 1, got {logits.shape[-1]}")
    D = len(durs)
    blanks = [(blank, d, i) for i, d in enumerate(durs) if d > 0]
    emits = [(d, i) for i, d in enumerate(durs)]
    return _duration_transducer(
        logits, targets, logit_lengths, target_lengths, blank, D, blanks, emits, sigma, clamp, fastemit_lambda,
        need_grad, block_v, block_u, lattice=lattice,
    )  # fmt: skip


def multiblank_triton(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    big_blank_durations,
    sigma: float = 0.0,
    clamp: float = -1.0,
    fastemit_lambda: float = 0.0,
    need_grad: bool = True,
    block_v: Optional[int] = None,
    block_u: Optional[int] = None,
    lattice: str = "auto",
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Multi-blank RNN-T (NeMo's definition) and its gradient with respect to the logits.

    ``logits (B, T, U + 1, V)`` are log-softmaxed here, and every arc's weight is its log-prob minus
    ``sigma``. The blank ``blank`` advances one frame; big blank ``i`` (token ``blank - 1 - i``)
    advances ``big_blank_durations[i]`` frames (ending the path when it reaches ``T_b`` at
    ``u = U_b``); targets advance ``u`` without consuming a frame. Costs, FastEmit, clamp, ``lattice``
    and the rest as :func:`rnnt_triton`.
    """
    big = _durations("big_blank_durations", big_blank_durations, allow_zero=False)
    if isinstance(blank, int) and not isinstance(blank, bool) and blank - len(big) < 0:
        raise ValueError(
            f"multiblank_triton: big blanks take the ids blank - 1 - i, so blank >= {len(big)}; got {blank}"
        )
    blanks = [(blank, 1, -1)] + [(blank - 1 - i, d, -1) for i, d in enumerate(big)]
    return _duration_transducer(
        logits, targets, logit_lengths, target_lengths, blank, 0, blanks, [(0, -1)], sigma, clamp, fastemit_lambda,
        need_grad, block_v, block_u, lattice=lattice,
    )  # fmt: skip


def duration_lattice_triton(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blanks,
    emits,
    D: int = 0,
    sigma: float = 0.0,
    fused_log_softmax: bool = True,
    need_grad: bool = True,
    fastemit_lambda: float = 0.0,
    lattice: str = "auto",
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """A transducer lattice whose arcs may skip frames, given by its arcs (what
    :func:`tdt_triton` and :func:`multiblank_triton` build; the duration-lattice op of the losses
    describes its lattice the same way).

    Args:
        logits: ``(B, T, U + 1, V + D)``: label logits in the first ``V`` columns, duration logits
            in the last ``D``.
        targets, logit_lengths, target_lengths: as :func:`rnnt_triton`.
        blanks: ``[(label column, frames >= 1, duration column or -1), ...]``, at least one: the
            blank arcs ``(t, u) -> (t + frames, u)``.
        emits: ``[(frames >= 0, duration column or -1), ...]``, at least one: the arcs of the
            target ``y_u``, ``(t, u) -> (t + frames, u + 1)``.
        D: the number of duration columns; with ``D > 0`` every arc names one.
        sigma: subtracted from every label log-probability.
        fused_log_softmax: log-softmax each column group here (False: they are log-probabilities,
            and the gradient is that of the log-probabilities as independent inputs).
        need_grad: also return the gradient.
        fastemit_lambda: FastEmit's weight: the gradient of every emitting arc, its label and
            its duration column alike, scaled by ``1 + fastemit_lambda`` (unlike
            :func:`tdt_triton`, whose duration gradient is NeMo's, unscaled); the costs too.
        lattice: as :func:`rnnt_triton` (rows: arcs of ``l >= 1`` frames read the earlier rows back
            from memory after one barrier per row).

    Returns:
        ``(costs (B,), grads or None)`` as :func:`tdt_triton` (no clamp).
    """
    if not isinstance(D, int) or isinstance(D, bool) or D < 0:
        raise ValueError(f"duration_lattice_triton: D must be an int >= 0, got {D!r}")
    try:
        bl = [(int(c), int(f), int(i)) for c, f, i in blanks]
        em = [(int(f), int(i)) for f, i in emits]
    except (TypeError, ValueError) as e:
        raise ValueError(f"duration_lattice_triton: blanks must be (column, frames, duration) triples and emits "
                         f"(frames, duration) pairs: {e}") from None  # fmt: skip
    if not bl or not em:
        raise ValueError("duration_lattice_triton: needs at least one blank arc and one emitting arc")
    if any(f < 1 for _, f, _ in bl) or any(f < 0 for f, _ in em):
        raise ValueError("duration_lattice_triton: blank arcs advance >= 1 frame, emitting arcs >= 0")
    dcols = [i for _, _, i in bl] + [i for _, i in em]
    if any(not (0 <= i < D if D else i == -1) for i in dcols):
        raise ValueError(
            f"duration_lattice_triton: with D={D} every arc's duration column must lie in "
            f"{'[0, D)' if D else '{-1}'}, got {dcols}"
        )
    if isinstance(logits, torch.Tensor) and logits.dim() == 4 and logits.shape[-1] <= D:
        raise ValueError(
            f"duration_lattice_triton: logits must have V + {D} columns with V >= 1, got {logits.shape[-1]}"
        )
    if isinstance(logits, torch.Tensor) and logits.dim() == 4:
        V = logits.shape[-1] - D
        if any(not 0 <= c < V for c, _, _ in bl):
            raise ValueError(
                f"duration_lattice_triton: blank columns must lie in [0, V={V}), got {[c for c, _, _ in bl]}"
            )
    return _duration_transducer(
        logits, targets, logit_lengths, target_lengths, bl[0][0], D, bl, em, sigma, -1.0, fastemit_lambda, need_grad,
        None, None, normalise=fused_log_softmax, emit_durations=True, lattice=lattice,
    )  # fmt: skip


def _duration_transducer(
    logits, targets, logit_lengths, target_lengths, blank, D, blanks, emits, sigma, clamp, fastemit_lambda,
    need_grad, block_v, block_u, normalise=True, emit_durations=False, lattice="auto",
):  # fmt: skip
    """A transducer whose blank arcs ``(token, frames, duration column or -1)`` and emitting arcs
    ``(frames, duration column or -1)`` may skip frames: TDT and multi-blank. ``emit_durations``:
    FastEmit scales the emitting arcs' duration gradient too (else only their label gradient)."""
    tg, xl, yl = _validate(logits, targets, logit_lengths, target_lengths, blank, clamp, fastemit_lambda, extra=D)
    if not isinstance(sigma, (int, float)) or sigma != sigma or abs(sigma) == float("inf"):
        raise ValueError(f"sigma must be a finite number, got {sigma!r}")
    B, T, U1, C = logits.shape
    V = C - D
    dev, dtype = logits.device, logits.dtype
    rows = _walk_rows(lattice, U1, block_u, "duration lattice")
    x = logits.detach().contiguous()
    costs = torch.empty(B, dtype=dtype, device=dev)
    if B == 0 or T == 0:
        costs.fill_(float("inf"))
        return costs, (torch.zeros_like(x) if need_grad else None)
    KB, KE = len(blanks), len(emits)

    def table(vals):
        return torch.tensor(vals, dtype=torch.int32, device=dev)

    bcol, bdur, bdi = (table([b[k] for b in blanks]) for k in range(3))
    edur, edi = (table([e[k] for e in emits]) for k in range(2))
    R = B * T * U1
    lse = torch.empty((B, T, U1), dtype=dtype, device=dev)
    dlse = torch.empty_like(lse) if D else lse
    wb = torch.empty((B, T, U1, KB), dtype=dtype, device=dev)
    we = torch.empty((B, T, U1, KE), dtype=dtype, device=dev)
    alpha = torch.empty_like(lse)
    beta = torch.empty_like(lse) if need_grad else alpha
    ll = torch.empty(B, dtype=dtype, device=dev)
    scalars = torch.tensor([float(clamp), float(fastemit_lambda), float(sigma)], dtype=dtype, device=dev)
    br, bv, nw = _row_blocks(V, block_v)
    bd = triton.next_power_of_2(max(D, 1))
    grid_rows = (triton.cdiv(R, br),)
    _drows_kernel[grid_rows](
        x, lse, dlse, wb, we, tg, xl, yl, bcol, bdi, edi, scalars, R, T, U1, V, C, D,
        KB=KB, KE=KE, HAS_D=D > 0, ONE_PASS=bv >= V, BLOCK_R=br, BLOCK_V=bv, BLOCK_D=bd, NORMALISE=bool(normalise),
        num_warps=nw,
    )  # fmt: skip
    if rows:
        bu, nwu = _row_launch(U1)
        _dlattice_rows_kernel[(B, 2 if need_grad else 1)](
            wb, we, alpha, beta, ll, xl, yl, bdur, edur, T, U1, KB=KB, KE=KE, BLOCK_U=bu, num_warps=nwu
        )
    else:
        bu = triton.next_power_of_2(max(1, min(U1, block_u or MAX_BLOCK_U)))
        _dlattice_kernel[(B, 2 if need_grad else 1)](
            wb, we, alpha, beta, ll, xl, yl, bdur, edur, T, U1, KB=KB, KE=KE, BLOCK_U=bu,
            num_warps=4 if bu <= 512 else 8,
        )  # fmt: skip
    costs.copy_(ll).mul_(-(1.0 + float(fastemit_lambda)))
    if not need_grad:
        return costs, None
    grads = torch.empty_like(x)
    _dgrad_kernel[grid_rows](
        x, grads, lse, dlse, wb, we, alpha, beta, ll, tg, xl, yl, bcol, bdur, bdi, edur, edi, scalars,
        R, T, U1, V, C, D,
        KB=KB, KE=KE, HAS_D=D > 0, CLAMP=float(clamp) > 0, EMIT_SCALE=float(fastemit_lambda) != 0,
        BLOCK_R=br, BLOCK_V=bv, BLOCK_D=bd, NORMALISE=bool(normalise),
        EMIT_DUR=bool(emit_durations) and float(fastemit_lambda) != 0, num_warps=nw,
    )  # fmt: skip
    return costs, grads


if triton is not None:
    from .logmath import log_add_triton

    @triton.jit
    def _row_coords(rows, T, U1):
        """``(b, t, u)`` of flat row ids of a ``(B, T, U1)`` grid."""
        return rows // (T * U1), (rows // U1) % T, rows % U1

    @triton.jit
    def _rows_kernel(
        X,
        LSE,
        LPB,
        LPE,
        tgt,
        xlen,
        ylen,
        R,
        T,
        U1,
        V,
        blank,
        FUSED: tl.constexpr,
        ONE_PASS: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows < R
        b, t, u = _row_coords(rows, T, U1)
        tb = tl.load(xlen + b, mask=rmask, other=0)
        ub = tl.load(ylen + b, mask=rmask, other=0)
        ok = rmask & (t < tb) & (u <= ub)  # a node of the example's lattice
        emit = ok & (u < ub)
        base = rows.to(tl.int64) * V
        if FUSED:
            cols = tl.arange(0, BLOCK_V)
            if ONE_PASS:
                xm = ok[:, None] & (cols[None, :] < V)
                xv = tl.load(X + base[:, None] + cols[None, :], mask=xm, other=-float("inf"))
                m = tl.max(xv, 1)
                safe = tl.where(m == -float("inf"), 0.0, m)
                s = tl.sum(tl.exp(xv - safe[:, None]), 1)
            else:  # online logsumexp over chunks of the vocabulary
                m = tl.full((BLOCK_R,), -float("inf"), LSE.dtype.element_ty)
                s = tl.zeros((BLOCK_R,), LSE.dtype.element_ty)
                for v0 in range(0, V, BLOCK_V):
                    cc = v0 + cols
                    xm = ok[:, None] & (cc[None, :] < V)
                    xv = tl.load(X + base[:, None] + cc[None, :], mask=xm, other=-float("inf"))
                    nm = tl.maximum(m, tl.max(xv, 1))
                    safe = tl.where(nm == -float("inf"), 0.0, nm)
                    s = s * tl.exp(m - safe) + tl.sum(tl.exp(xv - safe[:, None]), 1)
                    m = nm
                safe = tl.where(m == -float("inf"), 0.0, m)
            lse = safe + tl.log(s)
        else:
            lse = tl.zeros((BLOCK_R,), LSE.dtype.element_ty)
        y = tl.load(tgt + b.to(tl.int64) * (U1 - 1) + u, mask=emit, other=0)
        xb = tl.load(X + base + blank, mask=ok, other=0.0)
        xe = tl.load(X + base + y, mask=emit, other=0.0)
        tl.store(LSE + rows, lse, mask=rmask)
        tl.store(LPB + rows, tl.where(ok, xb - lse, -float("inf")), mask=rmask)
        tl.store(LPE + rows, tl.where(emit, xe - lse, -float("inf")), mask=rmask)

    @triton.jit
    def _lattice_kernel(LPB, LPE, ALPHA, BETA, LL, xlen, ylen, T, U1, BLOCK_U: tl.constexpr):
        b = tl.program_id(0)
        backward = tl.program_id(1) == 1
        tb = tl.load(xlen + b)
        ub = tl.load(ylen + b)
        base = b.to(tl.int64) * T * U1
        us = tl.arange(0, BLOCK_U)
        ndiag = tl.where(tb > 0, tb + ub, 0)  # diagonals t + u = 0 .. tb - 1 + ub
        if backward:
            for i in range(0, ndiag):
                d = ndiag - 1 - i
                for u0 in range(0, ub + 1, BLOCK_U):
                    u = u0 + us
                    t = d - u
                    m = (u <= ub) & (t >= 0) & (t < tb)
                    idx = base + t * U1 + u
                    lb = tl.load(LPB + idx, mask=m, other=-float("inf"))
                    by_blank = tl.load(BETA + idx + U1, mask=m & (t + 1 < tb), other=-float("inf")) + lb
                    by_emit = tl.load(BETA + idx + 1, mask=m & (u < ub), other=-float("inf")) + tl.load(
                        LPE + idx, mask=m & (u < ub), other=-float("inf")
                    )
                    v = tl.where((t == tb - 1) & (u == ub), lb, log_add_triton(by_blank, by_emit))
                    tl.store(BETA + idx, v, mask=m)
                tl.debug_barrier()
        else:
            for d in range(0, ndiag):
                for u0 in range(0, ub + 1, BLOCK_U):
                    u = u0 + us
                    t = d - u
                    m = (u <= ub) & (t >= 0) & (t < tb)
                    idx = base + t * U1 + u
                    mt = m & (t > 0)
                    mu = m & (u > 0)
                    from_blank = tl.load(ALPHA + idx - U1, mask=mt, other=-float("inf")) + tl.load(
                        LPB + idx - U1, mask=mt, other=-float("inf")
                    )
                    from_emit = tl.load(ALPHA + idx - 1, mask=mu, other=-float("inf")) + tl.load(
                        LPE + idx - 1, mask=mu, other=-float("inf")
                    )
                    v = tl.where((t == 0) & (u == 0), 0.0, log_add_triton(from_blank, from_emit))
                    tl.store(ALPHA + idx, v, mask=m)
                tl.debug_barrier()
            last = base + (tb - 1) * U1 + ub
            fin = tl.load(ALPHA + last, mask=tb > 0, other=-float("inf")) + tl.load(
                LPB + last, mask=tb > 0, other=-float("inf")
            )
            tl.store(LL + b, fin)

    @triton.jit
    def _affine_combine(a1, b1, a2, b2):
        """Composes two steps ``x -> log(exp(a + x) + exp(b))`` of the log semiring, the earlier
        ``(a1, b1)`` first: ``(a1 + a2, log(exp(a2 + b1) + exp(b2)))``. A scan of these pairs solves
        the linear recurrence ``x[i] = log(exp(a[i] + x[i - 1]) + exp(b[i]))`` with no subtraction of
        large numbers, and an ``a`` of -inf (an impossible arc) cuts the chain cleanly."""
        return a1 + a2, log_add_triton(a2 + b1, b2)

    @triton.jit
    def _row_scan(a, b):
        """``x`` with ``x[i] = log(exp(a[i] + x[i - 1]) + exp(b[i]))`` and ``x[-1] = -inf`` (so
        ``x[0] = b[0]``), along the one axis of ``a`` and ``b``."""
        _, x = tl.associative_scan((a, b), 0, _affine_combine)
        return x

    @triton.jit
    def _row_program(xlen, ylen, T, U1, BLOCK_U: tl.constexpr):
        """What a row-scan lattice program works on: its example ``b``, its direction (``backward``:
        beta), the example's ``T_b`` and ``U_b``, the offset of its ``(T, U1)`` grid, the register
        positions ``js`` of a row and those inside the row (``js <= U_b``)."""
        b = tl.program_id(0)
        tb = tl.load(xlen + b)
        ub = tl.load(ylen + b)
        js = tl.arange(0, BLOCK_U)
        return b, tl.program_id(1) == 1, tb, ub, b.to(tl.int64) * T * U1, js, js <= ub

    @triton.jit
    def _lattice_rows_kernel(LPB, LPE, ALPHA, BETA, LL, xlen, ylen, T, U1, BLOCK_U: tl.constexpr):
        """The lattice of ``_lattice_kernel`` walked by time rows: one program holds a whole row
        ``u = 0 .. U_b`` (``U_b + 1 <= BLOCK_U``) and the row before it in registers. Within row ``t``
        ``alpha[t, u] = log(exp(c[u]) + exp(alpha[t, u - 1] + lpe[t, u - 1]))`` with
        ``c[u] = alpha[t - 1, u] + lpb[t - 1, u]``: one scan (:func:`_row_scan`). Beta likewise,
        its row read in reverse (``j = U_b - u``). ``T_b`` serial steps, no barrier, no re-read."""
        b, backward, tb, ub, base, js, m = _row_program(xlen, ylen, T, U1, BLOCK_U)
        # (scalar conditions stay out of the masks: a row index is clamped into the example
        # instead, and what is loaded past its last row is never used)
        if backward:
            u = ub - js  # position j of the registers holds node u = U_b - j
            n = tl.where(js == 0, 0.0, -float("inf")).to(BETA.dtype.element_ty)  # beta[T_b, :]: the end
            row = base + tl.maximum(tb - 1, 0) * U1
            lb = tl.load(LPB + row + u, mask=m, other=-float("inf"))
            le = tl.load(LPE + row + u, mask=m & (js > 0), other=-float("inf"))
            for q in range(0, tb):
                # the next row's arcs (row t - 1), loaded while this row is scanned
                nxt = row - tl.where(q + 1 < tb, U1, 0)
                lb_next = tl.load(LPB + nxt + u, mask=m, other=-float("inf"))
                le_next = tl.load(LPE + nxt + u, mask=m & (js > 0), other=-float("inf"))
                n = _row_scan(le, n + lb)
                tl.store(BETA + row + u, n, mask=m)
                row = nxt
                lb = lb_next
                le = le_next
        else:
            c = tl.where(js == 0, 0.0, -float("inf")).to(ALPHA.dtype.element_ty)  # the start node
            row = base
            le = tl.load(LPE + row + js - 1, mask=m & (js > 0), other=-float("inf"))
            lb = tl.load(LPB + row + js, mask=m, other=-float("inf"))
            for t in range(0, tb):
                nxt = row + tl.where(t + 1 < tb, U1, 0)
                le_next = tl.load(LPE + nxt + js - 1, mask=m & (js > 0), other=-float("inf"))
                lb_next = tl.load(LPB + nxt + js, mask=m, other=-float("inf"))
                a = _row_scan(le, c)
                tl.store(ALPHA + row + js, a, mask=m)
                c = a + lb
                row = nxt
                le = le_next
                lb = lb_next
            # c holds alpha[T_b - 1, :] + lpb[T_b - 1, :]: the final blank from (T_b - 1, U_b)
            fin = tl.sum(tl.where(js == ub, c, 0.0), 0)  # a sum, not a max: a NaN there stays NaN
            tl.store(LL + b, tl.where(tb > 0, fin, -float("inf")))

    @triton.jit
    def _grad_kernel(
        X,
        G,
        LSE,
        LPB,
        LPE,
        ALPHA,
        BETA,
        LL,
        tgt,
        xlen,
        ylen,
        scalars,
        R,
        T,
        U1,
        V,
        blank,
        FUSED: tl.constexpr,
        CLAMP: tl.constexpr,
        EMIT_SCALE: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows < R
        b, t, u = _row_coords(rows, T, U1)
        tb = tl.load(xlen + b, mask=rmask, other=0)
        ub = tl.load(ylen + b, mask=rmask, other=0)
        ll = tl.load(LL + b, mask=rmask, other=-float("inf"))
        ok = rmask & (t < tb) & (u <= ub) & (ll != -float("inf"))  # no path, no gradient
        emit = ok & (u < ub)
        a = tl.load(ALPHA + rows, mask=ok, other=-float("inf"))
        after_blank = tl.load(BETA + rows + U1, mask=ok & (t + 1 < tb), other=-float("inf"))
        after_blank = tl.where(ok & (t == tb - 1) & (u == ub), 0.0, after_blank)  # the final blank
        after_emit = tl.load(BETA + rows + 1, mask=emit, other=-float("inf"))
        p_blank = tl.exp(a + tl.load(LPB + rows, mask=ok, other=-float("inf")) + after_blank - ll)
        p_emit = tl.exp(a + tl.load(LPE + rows, mask=emit, other=-float("inf")) + after_emit - ll)
        p_blank = tl.where(ok, p_blank, 0.0)
        p_emit = tl.where(emit, p_emit, 0.0)
        if EMIT_SCALE:
            p_emit = p_emit * (1.0 + tl.load(scalars + 1))
        y = tl.load(tgt + b.to(tl.int64) * (U1 - 1) + u, mask=emit, other=-1)
        y = tl.where(emit, y, -1)
        if FUSED:
            lse = tl.load(LSE + rows, mask=ok, other=0.0)
            occ = p_blank + p_emit
        if CLAMP:
            c = tl.load(scalars)
        base = rows.to(tl.int64) * V
        cols = tl.arange(0, BLOCK_V)
        for v0 in range(0, V, BLOCK_V):
            cc = v0 + cols
            sm = rmask[:, None] & (cc[None, :] < V)
            ptr = base[:, None] + cc[None, :]
            g = tl.where(cc[None, :] == blank, -p_blank[:, None], 0.0) - tl.where(
                cc[None, :] == y[:, None], p_emit[:, None], 0.0
            )
            if FUSED:
                xv = tl.load(X + ptr, mask=sm & ok[:, None], other=-float("inf"))
                g += tl.exp(xv - lse[:, None]) * occ[:, None]
            g = tl.where(ok[:, None], g, 0.0)
            if CLAMP:
                g = tl.minimum(tl.maximum(g, -c), c)
            tl.store(G + ptr, g.to(G.dtype.element_ty), mask=sm)

    @triton.jit
    def _mi_kernel(PX, PY, P, BETA, SCORES, bnd, S, T, T1, MODIFIED: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0)
        backward = tl.program_id(1) == 1
        sb = tl.load(bnd + b * 4)
        tb = tl.load(bnd + b * 4 + 1)
        ns = tl.load(bnd + b * 4 + 2) - sb  # the box's extent along s and t
        nt = tl.load(bnd + b * 4 + 3) - tb
        ndiag = ns + nt + 1
        pbase = b.to(tl.int64) * (S + 1) * (T + 1)
        xbase = b.to(tl.int64) * S * T1
        ybase = b.to(tl.int64) * (S + 1) * T
        ks = tl.arange(0, BLOCK)
        if backward:
            for q in range(0, ndiag):
                d = ndiag - 1 - q
                for k0 in range(0, ns + 1, BLOCK):
                    i = k0 + ks
                    j = d - i
                    m = (i <= ns) & (j >= 0) & (j <= nt)
                    s = sb + i
                    t = tb + j
                    pidx = pbase + s * (T + 1) + t
                    if MODIFIED:
                        mx = m & (i < ns) & (j < nt)
                        nxt = pidx + T + 2
                    else:
                        mx = m & (i < ns)
                        nxt = pidx + T + 1
                    fx = tl.load(BETA + nxt, mask=mx, other=-float("inf")) + tl.load(
                        PX + xbase + s * T1 + t, mask=mx, other=-float("inf")
                    )
                    my = m & (j < nt)
                    fy = tl.load(BETA + pidx + 1, mask=my, other=-float("inf")) + tl.load(
                        PY + ybase + s * T + t, mask=my, other=-float("inf")
                    )
                    v = tl.where((i == ns) & (j == nt), 0.0, log_add_triton(fx, fy))
                    tl.store(BETA + pidx, v, mask=m)
                tl.debug_barrier()
        else:
            for d in range(0, ndiag):
                for k0 in range(0, ns + 1, BLOCK):
                    i = k0 + ks
                    j = d - i
                    m = (i <= ns) & (j >= 0) & (j <= nt)
                    s = sb + i
                    t = tb + j
                    pidx = pbase + s * (T + 1) + t
                    if MODIFIED:
                        mx = m & (i > 0) & (j > 0)
                        fx = tl.load(P + pidx - T - 2, mask=mx, other=-float("inf")) + tl.load(
                            PX + xbase + (s - 1) * T1 + t - 1, mask=mx, other=-float("inf")
                        )
                    else:
                        mx = m & (i > 0)
                        fx = tl.load(P + pidx - T - 1, mask=mx, other=-float("inf")) + tl.load(
                            PX + xbase + (s - 1) * T1 + t, mask=mx, other=-float("inf")
                        )
                    my = m & (j > 0)
                    fy = tl.load(P + pidx - 1, mask=my, other=-float("inf")) + tl.load(
                        PY + ybase + s * T + t - 1, mask=my, other=-float("inf")
                    )
                    v = tl.where((i == 0) & (j == 0), 0.0, log_add_triton(fx, fy))
                    tl.store(P + pidx, v, mask=m)
                tl.debug_barrier()
            tl.store(SCORES + b, tl.load(P + pbase + (sb + ns) * (T + 1) + tb + nt))

    @triton.jit
    def _mi_rows_kernel(PX, PY, P, BETA, SCORES, bnd, S, T, T1, MODIFIED: tl.constexpr, BLOCK: tl.constexpr):
        """``_mi_kernel``'s recursion walked by frames: one program holds the box's column
        ``s = s_begin .. s_end`` of frame ``t`` (``s_end - s_begin + 1 <= BLOCK``) in registers.
        Regular: within frame ``t`` ``p[s, t] = log(exp(p[s, t - 1] + py[s, t - 1]) + exp(p[s - 1, t]
        + px[s - 1, t]))``, one scan (:func:`_row_scan`); beta likewise, its column read in reverse.
        Modified: ``px`` links frame ``t - 1`` to ``t``, so a frame needs no scan, only the previous
        frame shifted by one symbol, which is read back from memory after a block barrier."""
        b = tl.program_id(0)
        backward = tl.program_id(1) == 1
        sb = tl.load(bnd + b * 4)
        tb = tl.load(bnd + b * 4 + 1)
        ns = tl.load(bnd + b * 4 + 2) - sb
        nt = tl.load(bnd + b * 4 + 3) - tb
        te = tb + nt
        pbase = b.to(tl.int64) * (S + 1) * (T + 1)
        xbase = b.to(tl.int64) * S * T1
        ybase = b.to(tl.int64) * (S + 1) * T
        js = tl.arange(0, BLOCK)
        m = js <= ns
        ninf = -float("inf")
        start = tl.where(js == 0, 0.0, ninf).to(P.dtype.element_ty)
        if MODIFIED:
            s = sb + js
            mx = m & (js > 0)
            if backward:
                mx = m & (js < ns)
            for q in range(0, nt + 1):
                if backward:
                    t = te - q
                    tn = tl.minimum(t + 1, T)  # the next frame (read only when t < t_end)
                    fx = tl.load(BETA + pbase + (s + 1) * (T + 1) + tn, mask=mx, other=ninf) + tl.load(
                        PX + xbase + s * T1 + tl.minimum(t, T1 - 1), mask=mx, other=ninf
                    )
                    fy = tl.load(BETA + pbase + s * (T + 1) + tn, mask=m, other=ninf) + tl.load(
                        PY + ybase + s * T + tl.minimum(t, T - 1), mask=m, other=ninf
                    )
                    v = tl.where(q == 0, tl.where(js == ns, 0.0, ninf), log_add_triton(fx, fy))
                    tl.store(BETA + pbase + s * (T + 1) + t, v, mask=m)
                else:
                    t = tb + q
                    tp = tl.maximum(t - 1, 0)  # the previous frame (read only when t > t_begin)
                    fx = tl.load(P + pbase + (s - 1) * (T + 1) + tp, mask=mx, other=ninf) + tl.load(
                        PX + xbase + (s - 1) * T1 + tp, mask=mx, other=ninf
                    )
                    fy = tl.load(P + pbase + s * (T + 1) + tp, mask=m, other=ninf) + tl.load(
                        PY + ybase + s * T + tp, mask=m, other=ninf
                    )
                    v = tl.where(q == 0, start, log_add_triton(fx, fy))
                    tl.store(P + pbase + s * (T + 1) + t, v, mask=m)
                tl.debug_barrier()
            if not backward:
                tl.store(SCORES + b, tl.load(P + pbase + (sb + ns) * (T + 1) + te))
        else:
            if backward:
                s = sb + ns - js  # register j holds symbol s_end - j
                mx = m & (js > 0)
                n = start  # "beta[:, t_end + 1]": 0 at the end node, through a py of weight 0
                ax = tl.load(PX + xbase + s * T1 + te, mask=mx, other=ninf)
                ay = tl.load(PY + ybase + s * T + tl.minimum(te, T - 1), mask=m, other=ninf)
                for q in range(0, nt + 1):
                    t = te - q
                    # the next frame's arcs (t - 1, clamped into the box), loaded during the scan
                    tn = tl.maximum(t - 1, tb)
                    ax_next = tl.load(PX + xbase + s * T1 + tn, mask=mx, other=ninf)
                    ay_next = tl.load(PY + ybase + s * T + tl.minimum(tn, T - 1), mask=m, other=ninf)
                    n = _row_scan(ax, n + tl.where(q == 0, 0.0, ay))
                    tl.store(BETA + pbase + s * (T + 1) + t, n, mask=m)
                    ax = ax_next
                    ay = ay_next
            else:
                s = sb + js
                mx = m & (js > 0)
                c = start
                v = start
                ax = tl.load(PX + xbase + (s - 1) * T1 + tb, mask=mx, other=ninf)
                ay = tl.load(PY + ybase + s * T + tl.minimum(tb, T - 1), mask=m, other=ninf)
                for q in range(0, nt + 1):
                    t = tb + q
                    tn = tl.minimum(t + 1, te)  # the next frame, clamped into the box
                    ax_next = tl.load(PX + xbase + (s - 1) * T1 + tn, mask=mx, other=ninf)
                    ay_next = tl.load(PY + ybase + s * T + tl.minimum(tn, T - 1), mask=m, other=ninf)
                    v = _row_scan(ax, c)
                    tl.store(P + pbase + s * (T + 1) + t, v, mask=m)
                    c = v + ay
                    ax = ax_next
                    ay = ay_next
                tl.store(SCORES + b, tl.sum(tl.where(js == ns, v, 0.0), 0))  # a sum keeps a NaN

    @triton.jit
    def _row_lse(X, base, ok, lo, n, ONE_PASS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK: tl.constexpr):
        """Logsumexp of columns ``[lo, lo + n)`` of the rows at ``base`` (``-inf`` where not ``ok``)."""
        cols = tl.arange(0, BLOCK)
        if ONE_PASS:
            xv = tl.load(
                X + base[:, None] + lo + cols[None, :], mask=ok[:, None] & (cols[None, :] < n), other=-float("inf")
            )
            m = tl.max(xv, 1)
            safe = tl.where(m == -float("inf"), 0.0, m)
            s = tl.sum(tl.exp(xv - safe[:, None]), 1)
        else:
            m = tl.full((BLOCK_R,), -float("inf"), X.dtype.element_ty)
            s = tl.zeros((BLOCK_R,), X.dtype.element_ty)
            for v0 in range(0, n, BLOCK):
                cc = v0 + cols
                xv = tl.load(
                    X + base[:, None] + lo + cc[None, :], mask=ok[:, None] & (cc[None, :] < n), other=-float("inf")
                )
                nm = tl.maximum(m, tl.max(xv, 1))
                safe = tl.where(nm == -float("inf"), 0.0, nm)
                s = s * tl.exp(m - safe) + tl.sum(tl.exp(xv - safe[:, None]), 1)
                m = nm
            safe = tl.where(m == -float("inf"), 0.0, m)
        return safe + tl.log(s)

    @triton.jit
    def _drows_kernel(
        X, LSE, DLSE, WB, WE, tgt, xlen, ylen, BCOL, BDI, EDI, scalars, R, T, U1, V, C, D,
        KB: tl.constexpr, KE: tl.constexpr, HAS_D: tl.constexpr, ONE_PASS: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, NORMALISE: tl.constexpr = True,
    ):  # fmt: skip
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows < R
        b, t, u = _row_coords(rows, T, U1)
        tb = tl.load(xlen + b, mask=rmask, other=0)
        ub = tl.load(ylen + b, mask=rmask, other=0)
        ok = rmask & (t < tb) & (u <= ub)
        emit = ok & (u < ub)
        base = rows.to(tl.int64) * C
        sigma = tl.load(scalars + 2)
        if NORMALISE:
            lse = _row_lse(X, base, ok, 0, V, ONE_PASS, BLOCK_R, BLOCK_V)
        else:  # the logits are log-probabilities already
            lse = tl.zeros((BLOCK_R,), X.dtype.element_ty)
        tl.store(LSE + rows, lse, mask=rmask)
        if HAS_D:
            if NORMALISE:
                dlse = _row_lse(X, base, ok, V, D, True, BLOCK_R, BLOCK_D)
            else:
                dlse = tl.zeros((BLOCK_R,), X.dtype.element_ty)
            tl.store(DLSE + rows, dlse, mask=rmask)
        for k in tl.static_range(KB):
            w = tl.load(X + base + tl.load(BCOL + k), mask=ok, other=0.0) - lse - sigma
            if HAS_D:
                di = tl.load(BDI + k)
                w += tl.load(X + base + V + di, mask=ok, other=0.0) - dlse  # every arc has a duration here
            tl.store(WB + rows.to(tl.int64) * KB + k, tl.where(ok, w, -float("inf")), mask=rmask)
        y = tl.load(tgt + b.to(tl.int64) * (U1 - 1) + u, mask=emit, other=0)
        xe = tl.load(X + base + y, mask=emit, other=0.0) - lse - sigma
        for k in tl.static_range(KE):
            w = xe
            if HAS_D:
                di = tl.load(EDI + k)
                w += tl.load(X + base + V + di, mask=emit, other=0.0) - dlse
            tl.store(WE + rows.to(tl.int64) * KE + k, tl.where(emit, w, -float("inf")), mask=rmask)

    @triton.jit
    def _dlattice_kernel(
        WB, WE, ALPHA, BETA, LL, xlen, ylen, BDUR, EDUR, T, U1,
        KB: tl.constexpr, KE: tl.constexpr, BLOCK_U: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0)
        backward = tl.program_id(1) == 1
        tb = tl.load(xlen + b)
        ub = tl.load(ylen + b)
        base = b.to(tl.int64) * T * U1
        us = tl.arange(0, BLOCK_U)
        ndiag = tl.where(tb > 0, tb + ub, 0)
        if backward:
            for q in range(0, ndiag):
                d = ndiag - 1 - q
                for u0 in range(0, ub + 1, BLOCK_U):
                    u = u0 + us
                    t = d - u
                    m = (u <= ub) & (t >= 0) & (t < tb)
                    node = base + t * U1 + u
                    acc = tl.full((BLOCK_U,), -float("inf"), BETA.dtype.element_ty)
                    for k in tl.static_range(KB):  # blank arcs (t, u) -> (t + l, u), or the end
                        tn = t + tl.load(BDUR + k)
                        nb = tl.load(BETA + node + (tn - t) * U1, mask=m & (tn < tb), other=-float("inf"))
                        nb = tl.where((tn == tb) & (u == ub), 0.0, nb)
                        acc = log_add_triton(acc, nb + tl.load(WB + node * KB + k, mask=m, other=-float("inf")))
                    for k in tl.static_range(KE):  # emitting arcs (t, u) -> (t + l, u + 1)
                        tn = t + tl.load(EDUR + k)
                        me = m & (u < ub) & (tn < tb)
                        ne = tl.load(BETA + node + (tn - t) * U1 + 1, mask=me, other=-float("inf"))
                        acc = log_add_triton(acc, ne + tl.load(WE + node * KE + k, mask=me, other=-float("inf")))
                    tl.store(BETA + node, acc, mask=m)
                tl.debug_barrier()
        else:
            for d in range(0, ndiag):
                for u0 in range(0, ub + 1, BLOCK_U):
                    u = u0 + us
                    t = d - u
                    m = (u <= ub) & (t >= 0) & (t < tb)
                    acc = tl.where((t == 0) & (u == 0), 0.0, -float("inf")).to(ALPHA.dtype.element_ty)
                    for k in tl.static_range(KB):
                        ts = t - tl.load(BDUR + k)
                        ms = m & (ts >= 0)
                        src = base + ts * U1 + u
                        cand = tl.load(ALPHA + src, mask=ms, other=-float("inf")) + tl.load(
                            WB + src * KB + k, mask=ms, other=-float("inf")
                        )
                        acc = log_add_triton(acc, cand)
                    for k in tl.static_range(KE):
                        ts = t - tl.load(EDUR + k)
                        ms = m & (ts >= 0) & (u > 0)
                        src = base + ts * U1 + u - 1
                        cand = tl.load(ALPHA + src, mask=ms, other=-float("inf")) + tl.load(
                            WE + src * KE + k, mask=ms, other=-float("inf")
                        )
                        acc = log_add_triton(acc, cand)
                    tl.store(ALPHA + base + t * U1 + u, acc, mask=m)
                tl.debug_barrier()
            fin = tl.full([], -float("inf"), ALPHA.dtype.element_ty)
            for k in tl.static_range(KB):  # the blanks that end at frame tb
                ts = tb - tl.load(BDUR + k)
                ok = (tb > 0) & (ts >= 0)
                src = base + ts * U1 + ub
                cand = tl.load(ALPHA + src, mask=ok, other=-float("inf")) + tl.load(
                    WB + src * KB + k, mask=ok, other=-float("inf")
                )
                fin = log_add_triton(fin, cand)
            tl.store(LL + b, fin)

    @triton.jit
    def _dlattice_rows_kernel(
        WB, WE, ALPHA, BETA, LL, xlen, ylen, BDUR, EDUR, T, U1,
        KB: tl.constexpr, KE: tl.constexpr, BLOCK_U: tl.constexpr,
    ):  # fmt: skip
        """``_dlattice_kernel``'s lattice walked by time rows (``U_b + 1 <= BLOCK_U``). An arc that
        advances ``l >= 1`` frames links row ``t - l`` to row ``t``: those rows are complete, read
        back from memory after one block barrier per row. Emitting arcs of 0 frames link ``(t, u -
        1)`` to ``(t, u)`` within the row: one scan (:func:`_row_scan`) per row. Beta likewise, its
        row read in reverse."""
        b, backward, tb, ub, base, js, m = _row_program(xlen, ylen, T, U1, BLOCK_U)
        ninf = -float("inf")
        # (scalar conditions are applied by tl.where, row indices clamped into the example)
        if backward:
            u = ub - js  # register j holds node u = U_b - j
            me = m & (js > 0)  # nodes with an emitting arc (u < U_b)
            for q in range(0, tb):
                t = tb - 1 - q
                node = base + t * U1 + u
                a = tl.full((BLOCK_U,), ninf, BETA.dtype.element_ty)  # 0-frame emissions, in the row
                c = tl.full((BLOCK_U,), ninf, BETA.dtype.element_ty)  # arcs into later rows, or the end
                for k in tl.static_range(KB):
                    tn = t + tl.load(BDUR + k)
                    nb = tl.load(BETA + base + tl.minimum(tn, tb - 1) * U1 + u, mask=m, other=ninf)
                    nb = tl.where(tn < tb, nb, tl.where((tn == tb) & (js == 0), 0.0, ninf))
                    c = log_add_triton(c, nb + tl.load(WB + node * KB + k, mask=m, other=ninf))
                for k in tl.static_range(KE):
                    dur = tl.load(EDUR + k)
                    tn = t + dur
                    w = tl.load(WE + node * KE + k, mask=me, other=ninf)
                    a = log_add_triton(a, tl.where(dur == 0, w, ninf))
                    ne = tl.load(BETA + base + tl.minimum(tn, tb - 1) * U1 + u + 1, mask=me, other=ninf)
                    c = log_add_triton(c, tl.where((dur > 0) & (tn < tb), ne + w, ninf))
                tl.store(BETA + node, _row_scan(a, c), mask=m)
                tl.debug_barrier()
        else:
            me = m & (js > 0)  # nodes reached by an emitting arc (u > 0)
            for t in range(0, tb):
                node = base + t * U1 + js
                a = tl.full((BLOCK_U,), ninf, ALPHA.dtype.element_ty)
                c = tl.where((js == 0) & (t == 0), 0.0, ninf).to(ALPHA.dtype.element_ty)  # the start
                for k in tl.static_range(KB):
                    ts = t - tl.load(BDUR + k)
                    src = base + tl.maximum(ts, 0) * U1 + js
                    cand = tl.load(ALPHA + src, mask=m, other=ninf) + tl.load(WB + src * KB + k, mask=m, other=ninf)
                    c = log_add_triton(c, tl.where(ts >= 0, cand, ninf))
                for k in tl.static_range(KE):
                    dur = tl.load(EDUR + k)
                    ts = t - dur
                    src = base + tl.maximum(ts, 0) * U1 + js - 1
                    w = tl.load(WE + src * KE + k, mask=me, other=ninf)
                    a = log_add_triton(a, tl.where(dur == 0, w, ninf))
                    cand = tl.load(ALPHA + src, mask=me, other=ninf) + w
                    c = log_add_triton(c, tl.where((dur > 0) & (ts >= 0), cand, ninf))
                tl.store(ALPHA + node, _row_scan(a, c), mask=m)
                tl.debug_barrier()
            fin = tl.full([], ninf, ALPHA.dtype.element_ty)
            for k in tl.static_range(KB):  # the blanks that end at frame tb
                ts = tb - tl.load(BDUR + k)
                ok = (tb > 0) & (ts >= 0)
                src = base + ts * U1 + ub
                cand = tl.load(ALPHA + src, mask=ok, other=ninf) + tl.load(WB + src * KB + k, mask=ok, other=ninf)
                fin = log_add_triton(fin, cand)
            tl.store(LL + b, fin)

    @triton.jit
    def _blank_occ(WB, BETA, BDUR, k, rows, a, ll, ok, t, u, tb, ub, U1, KB: tl.constexpr):
        """Posterior of each row's blank arc ``k``."""
        tn = t + tl.load(BDUR + k)
        nb = tl.load(BETA + rows + (tn - t) * U1, mask=ok & (tn < tb), other=-float("inf"))
        nb = tl.where((tn == tb) & (u == ub), 0.0, nb)
        occ = tl.exp(a + tl.load(WB + rows.to(tl.int64) * KB + k, mask=ok, other=-float("inf")) + nb - ll)
        return tl.where(ok, occ, 0.0)

    @triton.jit
    def _emit_occ(WE, BETA, EDUR, k, rows, a, ll, emit, t, tb, U1, KE: tl.constexpr):
        """Posterior of each row's emitting arc ``k``."""
        tn = t + tl.load(EDUR + k)
        me = emit & (tn < tb)
        ne = tl.load(BETA + rows + (tn - t) * U1 + 1, mask=me, other=-float("inf"))
        occ = tl.exp(a + tl.load(WE + rows.to(tl.int64) * KE + k, mask=me, other=-float("inf")) + ne - ll)
        return tl.where(me, occ, 0.0)

    @triton.jit
    def _dgrad_kernel(
        X, G, LSE, DLSE, WB, WE, ALPHA, BETA, LL, tgt, xlen, ylen, BCOL, BDUR, BDI, EDUR, EDI, scalars,
        R, T, U1, V, C, D,
        KB: tl.constexpr, KE: tl.constexpr, HAS_D: tl.constexpr, CLAMP: tl.constexpr, EMIT_SCALE: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, NORMALISE: tl.constexpr = True,
        EMIT_DUR: tl.constexpr = False,
    ):  # fmt: skip
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows < R
        b, t, u = _row_coords(rows, T, U1)
        tb = tl.load(xlen + b, mask=rmask, other=0)
        ub = tl.load(ylen + b, mask=rmask, other=0)
        ll = tl.load(LL + b, mask=rmask, other=-float("inf"))
        ok = rmask & (t < tb) & (u <= ub) & (ll != -float("inf"))
        emit = ok & (u < ub)
        a = tl.load(ALPHA + rows, mask=ok, other=-float("inf"))
        p_blank = tl.zeros((BLOCK_R,), ALPHA.dtype.element_ty)
        for k in tl.static_range(KB):
            p_blank += _blank_occ(WB, BETA, BDUR, k, rows, a, ll, ok, t, u, tb, ub, U1, KB)
        p_emit = tl.zeros((BLOCK_R,), ALPHA.dtype.element_ty)
        for k in tl.static_range(KE):
            p_emit += _emit_occ(WE, BETA, EDUR, k, rows, a, ll, emit, t, tb, U1, KE)
        occ = p_blank + p_emit  # the node's posterior
        scale = 1.0
        if EMIT_SCALE:
            scale = 1.0 + tl.load(scalars + 1)
        y = tl.load(tgt + b.to(tl.int64) * (U1 - 1) + u, mask=emit, other=-1)
        y = tl.where(emit, y, -1)
        lse = tl.load(LSE + rows, mask=ok, other=0.0)
        if CLAMP:
            c = tl.load(scalars)
        base = rows.to(tl.int64) * C
        cols = tl.arange(0, BLOCK_V)
        for v0 in range(0, V, BLOCK_V):
            cc = v0 + cols
            sm = rmask[:, None] & (cc[None, :] < V)
            ptr = base[:, None] + cc[None, :]
            if NORMALISE:  # the softmax's share of the node's posterior
                xv = tl.load(X + ptr, mask=sm & ok[:, None], other=-float("inf"))
                g = tl.exp(xv - lse[:, None]) * (occ + (scale - 1.0) * p_emit)[:, None]
            else:  # log-probabilities as independent inputs: only the arcs' own entries
                g = tl.zeros((BLOCK_R, BLOCK_V), ALPHA.dtype.element_ty)
            g -= tl.where(cc[None, :] == y[:, None], (scale * p_emit)[:, None], 0.0)
            for k in tl.static_range(KB):
                pk = _blank_occ(WB, BETA, BDUR, k, rows, a, ll, ok, t, u, tb, ub, U1, KB)
                g -= tl.where(cc[None, :] == tl.load(BCOL + k), pk[:, None], 0.0)
            g = tl.where(ok[:, None], g, 0.0)
            if CLAMP:
                g = tl.minimum(tl.maximum(g, -c), c)
            tl.store(G + ptr, g.to(G.dtype.element_ty), mask=sm)
        if HAS_D:  # duration logits: occupancy * softmax - the occupancy of the arcs of each duration
            dc = tl.arange(0, BLOCK_D)
            dm = rmask[:, None] & (dc[None, :] < D)
            ptr = base[:, None] + V + dc[None, :]
            dlse = tl.load(DLSE + rows, mask=ok, other=0.0)
            if NORMALISE:
                xv = tl.load(X + ptr, mask=dm & ok[:, None], other=-float("inf"))
                if EMIT_DUR:  # FastEmit on the emitting arcs' duration scores too
                    g = tl.exp(xv - dlse[:, None]) * (occ + (scale - 1.0) * p_emit)[:, None]
                else:
                    g = tl.exp(xv - dlse[:, None]) * occ[:, None]
            else:
                g = tl.zeros((BLOCK_R, BLOCK_D), ALPHA.dtype.element_ty)
            for k in tl.static_range(KB):
                pk = _blank_occ(WB, BETA, BDUR, k, rows, a, ll, ok, t, u, tb, ub, U1, KB)
                g -= tl.where(dc[None, :] == tl.load(BDI + k), pk[:, None], 0.0)
            for k in tl.static_range(KE):
                pk = _emit_occ(WE, BETA, EDUR, k, rows, a, ll, emit, t, tb, U1, KE)
                if EMIT_DUR:
                    pk = pk * scale
                g -= tl.where(dc[None, :] == tl.load(EDI + k), pk[:, None], 0.0)
            g = tl.where(ok[:, None], g, 0.0)
            tl.store(G + ptr, g.to(G.dtype.element_ty), mask=dm)
