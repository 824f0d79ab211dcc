"""The CTC loss on dense emissions as Triton kernels (CUDA tensors, or CPU tensors under
``TRITON_INTERPRET=1``), without a criterion graph.

Example ``b`` has ``T_b = input_lengths[b]`` frames and ``L_b = target_lengths[b]`` labels; its
``S_b = 2 L_b + 1`` states are blank, ``y_1``, blank, ..., ``y_L``, blank (the states and moves of
:mod:`lightning_gtn.kernels.ctc_numba`). Two launches:

1. **lattice** (one program per example): ``alpha`` walked frame by frame in the log semiring,
   the states of a frame in blocks of ``BLOCK_S`` (a frame's states depend only on the frame
   before, read back from global memory after a block barrier), stored as a ``(B, T, S_max)``
   table; then ``beta`` walked back in two rows of ``(B, 2, S_max)``, and at each frame the state
   occupancies ``exp(alpha + beta - log Z)`` written over that frame's alpha (which nothing reads
   again), the blank states' sum into a ``(B, T)`` buffer. An example with no finite ``log Z``
   (infeasible, or ``+inf`` emissions) skips the backward walk. Each row is stored minus the
   maximum of the row before, the running sum of those maxima kept per frame in float64: the
   stored values stay within a frame's emission range of 0 (in float32, a log-score of -3000
   would carry an error of 2e-4 into every occupancy of a long input), and ``log Z`` and the
   occupancies' exponents are assembled in float64.
2. **grad** (one program per example, block of frames and block of classes): ``grad[b, t, c] =
   -coef[b] * (sum of the occupancies of the states reading c)``, the label states matched to the
   block's classes by comparison (a target with repeats adds several states into one class), so
   every element is written once by one program: no atomics, bitwise reproducible. Frames past
   ``T_b`` and examples without a finite ``log Z`` get 0; examples with a NaN emission within
   their frames NaN.

The recursions run in the emissions' dtype (float32 or float64), the scales and losses in
float64. The extra memory is the alpha table, two beta rows and two ``(B, T)`` buffers (blank
sums, scales). :func:`self_check` runs a small case against
a float64 reference on a device, for the dispatcher that verifies the kernels once per device.
"""

from __future__ import annotations

import math
import os
from typing import Optional, Tuple

import numpy as np
import torch

try:  # Triton ships with CUDA builds of torch; CPU-only installs do not need it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = None
    tl = None

__all__ = ["available", "self_check", "ctc_triton", "MAX_BLOCK_S"]

#: states of one frame processed per step of the lattice kernel
MAX_BLOCK_S = 1024
# Triton picks the interpreter when a kernel is decorated, from the environment at import time
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# frames per program of the gradient kernel, and frames x classes x labels compared per step (the
# interpreter runs programs one after another, each step as numpy arrays: larger tiles there)
_FRAMES = 64 if _INTERPRETED else 4
_TILE = 1 << 16 if _INTERPRETED else 4096


def available() -> bool:
    """True when Triton is importable (it needs a CUDA device to run, or TRITON_INTERPRET=1)."""
    return triton is not None


def _check_device(device: torch.device) -> None:
    if triton is None:
        raise ValueError("ctc_triton needs triton, which is not installed")
    if device.type != "cuda" and not (_INTERPRETED and device.type == "cpu"):
        raise ValueError(
            f"ctc_triton: emissions must be a CUDA tensor (or a CPU tensor with TRITON_INTERPRET=1 set "
            f"before triton is imported), got device {device}"
        )


def ctc_triton(
    E: torch.Tensor,
    labels: torch.Tensor,
    offsets: torch.Tensor,
    target_lengths: torch.Tensor,
    input_lengths: torch.Tensor,
    blank: int,
    coef: Optional[torch.Tensor],
    need_e: bool,
    block_s: Optional[int] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """CTC losses of a batch and, with ``need_e``, their scaled gradients.

    The caller checks every index first (the kernels read without bounds checks): labels in
    ``[0, C)`` and never ``blank``, ``0 <= input_lengths <= T``, ``offsets[b] +
    target_lengths[b] <= len(labels)``.

    Args:
        E: ``(B, T, C)`` float32/float64 emissions (log-probabilities or any scores), on a CUDA
            device (or the CPU under ``TRITON_INTERPRET=1``); made contiguous when it is not.
        labels: 1-D int64 labels on ``E``'s device: example ``b``'s target is
            ``labels[offsets[b] : offsets[b] + target_lengths[b]]``.
        offsets, target_lengths, input_lengths: ``(B,)`` int64 on ``E``'s device.
        blank: the blank class, in ``[0, C)``.
        coef: ``(B,)`` factors of each row's gradient (the reduction's), in ``E``'s dtype on its
            device; None for ones.
        need_e: also compute the gradient.
        block_s: states per step of the lattice kernel (a power of two is used), for tests of the
            blocked path.

    Returns:
        ``(losses (B,) float64, grad (B, T, C) in E's dtype or None)`` on ``E``'s device:
        ``losses[b] = -log Z_b`` (``inf`` for an infeasible example, NaN for one with a NaN emission within its
        frames); ``grad[b] = coef[b] * d losses[b] / d E[b]``, zero past ``input_lengths[b]`` and
        for examples without a finite ``log Z``, NaN for the examples with a NaN emission.
    """
    _check_device(E.device)
    if E.dim() != 3 or E.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"ctc_triton: E must be a (B, T, C) float32/float64 tensor, got {E.dtype} {tuple(E.shape)}")
    B, T, C = E.shape
    dev, dtype = E.device, E.dtype
    x = E.detach()
    x = x if x.is_contiguous() else x.contiguous()
    if B == 0:
        return torch.empty(0, dtype=dtype, device=dev), (torch.empty_like(x) if need_e else None)
    losses = torch.empty(B, dtype=torch.float64, device=dev)
    idx = [t.to(device=dev, dtype=torch.int64).contiguous() for t in (labels, offsets, target_lengths, input_lengths)]
    lab, off, tlen, ilen = idx
    if lab.numel() == 0:
        lab = torch.zeros(1, dtype=torch.int64, device=dev)  # never read; a valid pointer
    Lmax = int(tlen.max()) if B else 0
    SP = 2 * Lmax + 1
    ts = torch.arange(T, device=dev)
    # a NaN emission within an example's frames (any class) makes its loss and gradient NaN
    nan_row = (torch.isnan(x).any(2) & (ts[None, :] < ilen[:, None])).any(1) if T else torch.zeros(B, device=dev)
    nan_row = nan_row.to(torch.int32).contiguous()
    alpha = torch.empty((B, max(T, 1), SP), dtype=dtype, device=dev)
    beta = torch.empty((B, 2, SP), dtype=dtype, device=dev) if need_e else alpha
    bsum = torch.empty((B, max(T, 1)), dtype=dtype, device=dev) if need_e else alpha
    scales = torch.empty((B, max(T, 1)), dtype=torch.float64, device=dev)
    bs = triton.next_power_of_2(max(1, min(SP, block_s or MAX_BLOCK_S)))
    _lattice_kernel[(B,)](
        x, lab, off, tlen, ilen, alpha, beta, scales, bsum, losses, T, C, SP, blank,
        NEED_E=bool(need_e), BLOCK_S=bs, ONE_BLOCK=bs >= SP, num_warps=4 if bs <= 256 else 8,
    )  # fmt: skip
    losses = torch.where(nan_row.bool(), torch.full_like(losses, math.nan), losses)
    if not need_e:
        return losses, None
    grad = torch.empty_like(x)
    if T == 0 or C == 0:
        return losses, grad
    cf = coef.to(device=dev, dtype=dtype).contiguous() if coef is not None else torch.ones(B, dtype=dtype, device=dev)
    bt = max(_FRAMES, triton.next_power_of_2(triton.cdiv(T, 65535)))  # the grid's 2nd dimension <= 65535
    bc = triton.next_power_of_2(max(1, min(C, 64)))
    bl = triton.next_power_of_2(max(1, min(max(Lmax, 1), _TILE // (bt * bc))))
    grid = (B, triton.cdiv(T, bt), triton.cdiv(C, bc))
    _grad_kernel[grid](
        grad, alpha, bsum, losses, nan_row, cf, lab, off, tlen, ilen, T, C, SP, blank,
        BLOCK_T=bt, BLOCK_C=bc, BLOCK_L=bl, num_warps=4,
    )  # fmt: skip
    return losses, grad


def self_check(device) -> Optional[str]:
    """Runs :func:`ctc_triton` on a small ragged float32 case (repeats, an empty target, an
    infeasible row; the states in several blocks and in one) on ``device`` against this library's
    numba CTC kernel (:func:`.ctc_numba.ctc_cost_grad`) in float64 on the CPU; None when losses
    and gradients (with respect to the log-probabilities) agree, else what differed."""
    from .ctc_numba import ctc_cost_grad

    g = torch.Generator().manual_seed(0)
    B, T, C = 4, 9, 5
    lp = torch.randn(B, T, C, generator=g, dtype=torch.float64).log_softmax(-1)
    targets = [[1, 1, 2], [3, 4, 3, 1], [], [2, 2, 2, 2, 2, 2]]  # the last needs 11 frames: infeasible
    il = [9, 7, 3, 9]
    tl = [len(t) for t in targets]
    flat = [v for t in targets for v in t]
    offs = [sum(tl[:b]) for b in range(B)]

    def host(v):
        return np.asarray(v, dtype=np.int64)

    want, want_g = ctc_cost_grad(lp.contiguous(), host(flat), host(offs), host(tl), host(il), 0, None, True)
    assert want_g is not None  # need_e=True

    def dev(v):
        return torch.tensor(v, dtype=torch.int64, device=device)

    for block_s in (4, None):  # the states in several blocks, and in one
        try:
            E = lp.float().to(device)
            got_l, got_g = ctc_triton(E, dev(flat), dev(offs), dev(tl), dev(il), 0, None, True, block_s=block_s)
        except Exception as e:  # noqa: BLE001 - any failure means "do not use these kernels"
            return f"ctc_triton failed: {type(e).__name__}: {e}"
        if got_g is None:
            return "ctc_triton: no gradient"
        gl, gg = got_l.double().cpu(), got_g.double().cpu()
        if not (torch.isinf(gl[3]) and torch.allclose(gl[:3], want[:3], rtol=1e-4, atol=1e-4)):
            return f"ctc_triton: losses {gl.tolist()} != {want.tolist()} (the last infinite)"
        err = float((gg - want_g).abs().max())  # the infeasible row: a zero gradient in both
        if not err <= 1e-4:
            return f"ctc_triton: gradient differs by {err} (states in blocks of {block_s or 'all'})"
    return None


if triton is not None:

    @triton.jit
    def _lse3(a, b, c):
        """``log(exp(a) + exp(b) + exp(c))``: -inf when all are -inf, +inf when one is +inf."""
        m = tl.maximum(tl.maximum(a, b), c)
        safe = tl.where((m == -float("inf")) | (m == float("inf")), 0.0, m)
        return safe + tl.log(tl.exp(a - safe) + tl.exp(b - safe) + tl.exp(c - safe))

    @triton.jit
    def _state_labels(lab, o, Lb, s, blank):
        """The class each state ``s`` reads, whether it is a state of the example, and whether it
        may be entered from ``s - 2`` (a label different from the previous label)."""
        inside = s < 2 * Lb + 1
        odd = (s % 2) == 1
        j = (s - 1) // 2
        y = tl.load(lab + o + j, mask=inside & odd, other=0)
        yp = tl.load(lab + o + j - 1, mask=inside & odd & (s >= 3), other=0)
        cls = tl.where(odd, y, blank)
        skip = inside & odd & (s >= 3) & (y != yp)
        return cls, inside, skip

    @triton.jit
    def _lattice_kernel(
        E,
        lab,
        off,
        tlen,
        ilen,
        ALPHA,
        BETA,
        CS,
        BSUM,
        LOSS,
        T,
        C,
        SP,
        blank,
        NEED_E: tl.constexpr,
        BLOCK_S: tl.constexpr,
        ONE_BLOCK: tl.constexpr,
    ):
        b = tl.program_id(0)
        Tb = tl.load(ilen + b)
        Lb = tl.load(tlen + b)
        o = tl.load(off + b)
        S = 2 * Lb + 1
        ebase = b.to(tl.int64) * T * C
        abase = b.to(tl.int64) * T * SP
        ss = tl.arange(0, BLOCK_S)
        NEG = -float("inf")
        dt = ALPHA.dtype.element_ty
        # alpha[t, s] = log sum of the paths' scores up to frame t (its emission included), stored
        # as alpha[t, s] - c[t]: c[t] (float64, in CS) is the sum of the earlier rows' maxima, so
        # the stored values stay near 0, where float32 resolves them finely
        c = tl.full((), 0.0, tl.float64)
        m = tl.full((), 0.0, dt)  # the maximum of the row before, subtracted from this one
        if ONE_BLOCK:  # every state in one block: what each state reads, once for all frames
            cls_1, inside_1, skip_1 = _state_labels(lab, o, Lb, ss, blank)
        for t in range(0, Tb):
            mx = tl.full((), NEG, dt)
            for s0 in range(0, S, BLOCK_S):
                if ONE_BLOCK:
                    s = ss
                    cls, inside, skip = cls_1, inside_1, skip_1
                else:
                    s = s0 + ss
                    cls, inside, skip = _state_labels(lab, o, Lb, s, blank)
                e = tl.load(E + ebase + t * C + cls, mask=inside, other=0.0)
                row = ALPHA + abase + t * SP
                if t == 0:
                    v = tl.where(s < 2, e, NEG)
                else:
                    prev = row - SP
                    a0 = tl.load(prev + s, mask=inside, other=NEG)
                    a1 = tl.load(prev + s - 1, mask=inside & (s >= 1), other=NEG)
                    a2 = tl.load(prev + s - 2, mask=skip, other=NEG)
                    # log(exp(a0) + exp(a1) + exp(a2)) (written out: a jit call per frame costs the
                    # interpreter more than the arithmetic)
                    top = tl.maximum(tl.maximum(a0, a1), a2)
                    top = tl.where((top == NEG) | (top == float("inf")), 0.0, top)
                    v = top + tl.log(tl.exp(a0 - top) + tl.exp(a1 - top) + tl.exp(a2 - top)) - m + e
                tl.store(row + s, v, mask=inside)
                mx = tl.maximum(mx, tl.max(tl.where(inside, v, NEG), 0))
            c = c + m.to(tl.float64)
            tl.store(CS + b.to(tl.int64) * T + t, c)
            m = tl.where((mx > NEG) & (mx < float("inf")), mx, 0.0).to(dt)
            tl.debug_barrier()
        last = ALPHA + abase + (Tb - 1) * SP
        has = Tb > 0
        z1 = tl.load(last + S - 1, mask=has, other=NEG)
        z2 = tl.load(last + S - 2, mask=has & (Lb > 0), other=NEG)
        clast = tl.load(CS + b.to(tl.int64) * T + Tb - 1, mask=has, other=0.0)
        lz = clast + _lse3(z1, z2, NEG).to(tl.float64)
        lz = tl.where(has, lz, tl.where(Lb == 0, 0.0, NEG))  # no frame: only the empty target has a path
        tl.store(LOSS + b, tl.where(lz == 0.0, 0.0, -lz))  # +0.0 for the empty path
        if NEED_E:
            finite = (lz > NEG) & (lz < float("inf"))
            n = tl.where(finite, Tb, 0)
            bbase = b.to(tl.int64) * 2 * SP
            # beta[t, s] = log sum of the scores of frames t + 1 .. T_b - 1 from state s at frame t,
            # stored as beta[t, s] - d[t] (d as c); occupancy[t, s] = exp(alpha[t, s] + beta[t, s] -
            # log Z), the three scales summed in float64, written over alpha[t]
            d = tl.full((), 0.0, tl.float64)
            m = tl.full((), 0.0, dt)
            if ONE_BLOCK:
                c0_1, in0_1, _k0 = _state_labels(lab, o, Lb, ss, blank)
                c1_1, in1_1, _k1 = _state_labels(lab, o, Lb, ss + 1, blank)
                c2_1, _in2, k2_1 = _state_labels(lab, o, Lb, ss + 2, blank)
            for i in range(0, n):
                t = n - 1 - i
                cur = BETA + bbase + (t % 2) * SP
                nxt = BETA + bbase + ((t + 1) % 2) * SP
                d = d + m.to(tl.float64)
                shift = (tl.load(CS + b.to(tl.int64) * T + t) + d - lz).to(dt)
                total = tl.zeros((BLOCK_S,), dt)
                mx = tl.full((), NEG, dt)
                for s0 in range(0, S, BLOCK_S):
                    s = s0 + ss
                    inside = s < S
                    if t == Tb - 1:
                        bv = tl.where(inside & (s >= S - 2), 0.0, NEG).to(dt)
                    else:
                        if ONE_BLOCK:
                            c0, in0, c1, in1, c2, k2 = c0_1, in0_1, c1_1, in1_1, c2_1, k2_1
                        else:
                            c0, in0, _k0 = _state_labels(lab, o, Lb, s, blank)
                            c1, in1, _k1 = _state_labels(lab, o, Lb, s + 1, blank)
                            c2, _in2, k2 = _state_labels(lab, o, Lb, s + 2, blank)
                        erow = E + ebase + (t + 1) * C
                        b0 = tl.load(nxt + s, mask=in0, other=NEG) + tl.load(erow + c0, mask=in0, other=0.0)
                        b1 = tl.load(nxt + s + 1, mask=in1, other=NEG) + tl.load(erow + c1, mask=in1, other=0.0)
                        b2 = tl.load(nxt + s + 2, mask=k2, other=NEG) + tl.load(erow + c2, mask=k2, other=0.0)
                        top = tl.maximum(tl.maximum(b0, b1), b2)
                        top = tl.where((top == NEG) | (top == float("inf")), 0.0, top)
                        bv = top + tl.log(tl.exp(b0 - top) + tl.exp(b1 - top) + tl.exp(b2 - top)) - m
                    tl.store(cur + s, bv, mask=inside)
                    mx = tl.maximum(mx, tl.max(tl.where(inside, bv, NEG), 0))
                    arow = ALPHA + abase + t * SP
                    a = tl.load(arow + s, mask=inside, other=NEG)
                    occ = tl.where(inside, tl.exp(a + bv + shift), 0.0)
                    tl.store(arow + s, occ, mask=inside)
                    total += tl.where((s % 2) == 0, occ, 0.0)
                tl.store(BSUM + b.to(tl.int64) * T + t, tl.sum(total, 0))
                m = tl.where((mx > NEG) & (mx < float("inf")), mx, 0.0).to(dt)
                tl.debug_barrier()

    @triton.jit
    def _grad_kernel(
        G,
        OCC,
        BSUM,
        LOSS,
        nan_row,
        coef,
        lab,
        off,
        tlen,
        ilen,
        T,
        C,
        SP,
        blank,
        BLOCK_T: tl.constexpr,
        BLOCK_C: tl.constexpr,
        BLOCK_L: tl.constexpr,
    ):
        b = tl.program_id(0)
        ts = tl.program_id(1).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        Tb = tl.load(ilen + b)
        Lb = tl.load(tlen + b)
        o = tl.load(off + b)
        loss = tl.load(LOSS + b)
        isnan = tl.load(nan_row + b) != 0
        live = (loss > -float("inf")) & (loss < float("inf")) & (tl.load(nan_row + b) == 0)
        valid = ts < tl.where(live, Tb, 0)  # frames with occupancies
        acc = tl.zeros((BLOCK_T, BLOCK_C), G.dtype.element_ty)
        if live:
            occ_rows = OCC + b.to(tl.int64) * T * SP + ts * SP
            js = tl.arange(0, BLOCK_L)
            for j0 in range(0, Lb, BLOCK_L):
                j = j0 + js
                jm = j < Lb
                y = tl.load(lab + o + j, mask=jm, other=-1)
                oc = tl.load(occ_rows[:, None] + 2 * j[None, :] + 1, mask=valid[:, None] & jm[None, :], other=0.0)
                hit = y[None, None, :] == cols[None, :, None]  # (1, BLOCK_C, BLOCK_L)
                acc += tl.sum(tl.where(hit, oc[:, None, :], 0.0), 2)
            bsum = tl.load(BSUM + b.to(tl.int64) * T + ts, mask=valid, other=0.0)
            acc = (acc + tl.where(cols[None, :] == blank, bsum[:, None], 0.0)) * -tl.load(coef + b)
            acc = tl.where(valid[:, None], acc, 0.0)
        if isnan:
            acc = tl.full((BLOCK_T, BLOCK_C), float("nan"), G.dtype.element_ty)
        out = G + b.to(tl.int64) * T * C + ts[:, None] * C + cols[None, :]
        tl.store(out, acc, mask=(ts[:, None] < T) & (cols[None, :] < C))
