"""The joiner ``Linear(tanh(enc + pred))`` of the RNN-T joiner loss as Triton kernels (CUDA tensors,
or CPU tensors under ``TRITON_INTERPRET=1``), never holding its ``(B, T, U + 1, V)`` output.

The nodes ``(b, t, u)`` of the padded grid are taken in blocks of ``BLOCK_N``; a node outside its
example's lengths (``t >= logit_lengths[b]`` or ``u > target_lengths[b]``) is neither read nor
written. Per block, the hidden ``h = tanh(encoder[b, t] + predictor[b, u])`` is formed tile by tile
of ``J`` where it is used, and the logits ``z = h @ weight.T + bias`` tile by tile of ``V``, each
tile a sum of ``tl.dot`` products over the tiles of ``J`` (float32 accumulation for float32
inputs: the loss casts float16/bfloat16 to float32 before; float64 for float64):

1. **rows** (:func:`joiner_rows`, one program per block of nodes): an online log-sum-exp over the
   tiles of ``V`` gives each node's log-normaliser, and the same pass picks its blank's and its
   target's logits (the blank's at ``u = target_lengths[b]``, where no label is emitted), stored as
   the ``[blank, emit]`` log-probabilities the RNN-T lattice reads.
2. **hidden gradient** (:func:`joiner_grads`, programs ``(block of nodes, tile of J)``): each tile
   of logits is recomputed and turned into its gradient
   ``dz = c_b clip((p_blank + p_emit) softmax(z) - p_blank [v = blank] - p_emit [v = y_u])``
   (``p`` the arcs' weighted posteriors from the lattice, ``c_b`` the example's coefficient, the
   clip to ``[-clamp, clamp]`` only for ``clamp > 0``), accumulated as ``dz @ weight`` into the
   program's tile of ``dh``; then ``dh (1 - h^2)`` is added (atomics) into the encoder's gradient
   at ``(b, t)`` and the predictor's at ``(b, u)``.
3. **weight gradient** (programs ``(tile of V, tile of J, split of the node blocks)``): the same
   ``dz`` tiles, accumulated as ``dz^T h`` (and ``dz`` summed over nodes for the bias) over the
   node blocks of the program's split, then added (atomics) into ``d weight`` and ``d bias``.

What the kernels hold is a few tiles per program; what they write is ``3`` values per node forward
and the four gradients backward. The logits of a node are computed ``1 + ceil(J / BLOCK_JO)``
times in the backward by each of the two gradient kernels (``BLOCK_JO`` the output tile of
``J``: the whole ``J`` up to 128). With several splits of the node blocks, or any node block
sharing a frame with another, the gradients' sums are atomics: equal to rounding, not bitwise
reproducible.

float32 products use IEEE float32 (``tl.dot(..., input_precision="ieee")``) unless torch allows
TF32 for matmuls (``torch.backends.cuda.matmul.allow_tf32``), as the materialised joiner's matmul
would.
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

__all__ = ["available", "self_check", "joiner_rows", "joiner_grads", "Blocks", "DEFAULT_BLOCKS"]

# Triton picks the interpreter when a kernel is decorated, from the environment at import time
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def available() -> bool:
    """True when Triton is importable (it needs a CUDA device to run, or TRITON_INTERPRET=1)."""
    return triton is not None


class Blocks:
    """Tile sizes (powers of two, at least 16 for ``tl.dot``): ``n`` nodes a program, ``v``
    vocabulary entries and ``j`` hidden entries a product, ``jo`` hidden entries of a gradient
    program's output tile (None: the whole ``J`` up to 128), ``splits`` of the node blocks in the
    weight-gradient kernel (None: enough programs to fill the device)."""

    def __init__(
        self, n: int = 32, v: int = 64, j: int = 64, jo: Optional[int] = None, splits: Optional[int] = None
    ) -> None:
        for name, x in (("n", n), ("v", v), ("j", j), ("jo", jo)):
            if x is not None and (x < 16 or x & (x - 1)):
                raise ValueError(f"Blocks: {name} must be a power of two >= 16, got {x}")
        if splits is not None and splits < 1:
            raise ValueError(f"Blocks: splits must be >= 1, got {splits}")
        self.n, self.v, self.j, self.jo, self.splits = n, v, j, jo, splits


#: the tile sizes of a call without ``blocks`` (read at each call)
DEFAULT_BLOCKS = Blocks()


def _check_device(device: torch.device) -> None:
    if triton is None:
        raise RuntimeError("rnnt_joiner_triton needs triton, which is not installed")
    if device.type != "cuda" and not (_INTERPRETED and device.type == "cpu"):
        raise ValueError(
            f"rnnt_joiner_triton: the joiner's tensors must be on a CUDA device (or the CPU with "
            f"TRITON_INTERPRET=1 set before triton is imported), got device {device}"
        )


def _fit(x: int, size: int) -> int:
    """``size`` (a power of two >= 16), or less where ``x`` is smaller (at least 16)."""
    return max(16, min(size, triton.next_power_of_2(max(1, x))))


def _tf32(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.device.type == "cuda" and bool(torch.backends.cuda.matmul.allow_tf32)


def _operands(encoder, predictor, weight, bias, targets, logit_lengths, target_lengths):
    """The float tensors contiguous, the index tensors contiguous int64 on their device."""
    dev = encoder.device
    _check_device(dev)
    if encoder.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"rnnt_joiner_triton: the joiner's tensors must be float32 or float64, got {encoder.dtype}")
    B, T, _ = encoder.shape
    U1 = predictor.shape[1]
    if B * T * U1 >= 2**31:
        raise ValueError(f"rnnt_joiner_triton: B * T * (U + 1) = {B * T * U1} nodes is too many (< 2**31)")
    f = tuple(x.detach().contiguous() for x in (encoder, predictor, weight, bias))
    tg = targets.to(device=dev, dtype=torch.int64)
    tg = tg.reshape(B, -1).contiguous() if tg.numel() else torch.zeros((B, 1), dtype=torch.int64, device=dev)
    il = logit_lengths.to(device=dev, dtype=torch.int64).contiguous()
    tl_ = target_lengths.to(device=dev, dtype=torch.int64).contiguous()
    return f, tg, il, tl_


def joiner_rows(
    encoder: torch.Tensor,
    predictor: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    lp2: torch.Tensor,
    lse: Optional[torch.Tensor] = None,
    blocks: Optional[Blocks] = None,
) -> None:
    """Each node's log-normaliser and ``[blank, emit]`` log-probabilities, written in place.

    Args:
        encoder: ``(B, T, J)``, predictor ``(B, U + 1, J)``, weight ``(V, J)``, bias ``(V,)``:
            float32 or float64, one device (CUDA, or the CPU under the interpreter).
        targets: ``(B, S)`` integer labels, ``S >= max(target_lengths)``, in ``[0, V)``
            (checked by the caller).
        logit_lengths, target_lengths: ``(B,)`` integers in ``[0, T]`` and ``[0, U]`` (checked by
            the caller).
        blank: the blank's class id in ``[0, V)``.
        lp2: ``(B, T, U + 1, 2)`` contiguous (any float dtype): ``log_softmax(z)[blank]`` and
            ``log_softmax(z)[y_u]`` (the blank's at ``u = target_lengths[b]``) at each node
            inside the lengths; other entries are left as they are.
        lse: ``(B, T, U + 1)`` contiguous or None: the log-normaliser ``logsumexp(z)`` of each
            node inside the lengths.
        blocks: tile sizes (:class:`Blocks`; default :data:`DEFAULT_BLOCKS`).
    """
    (enc, pred, w, b), tg, il, tl_ = _operands(encoder, predictor, weight, bias, targets, logit_lengths, target_lengths)
    B, T, J = enc.shape
    U1, V = pred.shape[1], w.shape[0]
    R = B * T * U1
    if R == 0:
        return
    if not lp2.is_contiguous() or tuple(lp2.shape) != (B, T, U1, 2) or lp2.device != enc.device:
        raise ValueError(f"rnnt_joiner_triton: lp2 must be a contiguous ({B}, {T}, {U1}, 2) tensor on {enc.device}")
    if lse is not None and (not lse.is_contiguous() or tuple(lse.shape) != (B, T, U1)):
        raise ValueError(f"rnnt_joiner_triton: lse must be a contiguous ({B}, {T}, {U1}) tensor")
    bk = blocks or DEFAULT_BLOCKS
    bn, bv, bj = _fit(R, bk.n), _fit(V, bk.v), _fit(J, bk.j)
    _rows_kernel[(triton.cdiv(R, bn),)](
        enc, pred, w, b, tg, il, tl_, lp2, lp2 if lse is None else lse,
        R, T, U1, V, J, tg.shape[1], blank,
        STORE_LSE=lse is not None, TF32=_tf32(enc), BLOCK_N=bn, BLOCK_V=bv, BLOCK_J=bj, num_warps=4,
    )  # fmt: skip


def joiner_grads(
    encoder: torch.Tensor,
    predictor: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    lse: torch.Tensor,
    arcs: torch.Tensor,
    coef: torch.Tensor,
    blank: int,
    clamp: float,
    need: Tuple[bool, bool, bool, bool] = (True, True, True, True),
    blocks: Optional[Blocks] = None,
) -> Tuple[Optional[torch.Tensor], ...]:
    """``sum_b coef[b] * d cost[b] / d (encoder, predictor, weight, bias)`` from the lattice's
    weighted arc posteriors.

    Args:
        encoder, predictor, weight, bias, targets, logit_lengths, target_lengths, blank: as
            :func:`joiner_rows`.
        lse: ``(B, T, U + 1)`` the nodes' log-normalisers (:func:`joiner_rows`'s).
        arcs: ``(B, T, U + 1, 2)`` each node's ``[p_blank, p_emit]``: the posteriors of its two
            arcs as the cost weighs them (FastEmit's ``1 + lambda`` in ``p_emit``).
        coef: ``(B,)`` each example's coefficient (the reduction's times the incoming gradient).
        clamp: ``> 0`` clips each entry of an example's logit gradient to ``[-clamp, clamp]``
            before ``coef``.
        need: which of the four gradients to compute.
        blocks: tile sizes (:class:`Blocks`; default :data:`DEFAULT_BLOCKS`).

    Returns:
        The four gradients in the tensors' dtype and device, None for those not asked for.
    """
    (enc, pred, w, b), tg, il, tl_ = _operands(encoder, predictor, weight, bias, targets, logit_lengths, target_lengths)
    B, T, J = enc.shape
    U1, V = pred.shape[1], w.shape[0]
    R = B * T * U1
    dev = enc.device
    ne, np_, nw, nb = (bool(x) for x in need)
    g_enc = torch.zeros_like(enc) if ne else None
    g_pred = torch.zeros_like(pred) if np_ else None
    g_w = torch.zeros_like(w) if nw else None
    g_b = torch.zeros_like(b) if nb else None
    if R == 0 or not any(need):
        return g_enc, g_pred, g_w, g_b
    ls = lse.detach().to(device=dev, dtype=enc.dtype).contiguous()
    pa = arcs.detach().to(device=dev, dtype=enc.dtype).contiguous()
    c = coef.detach().to(device=dev, dtype=enc.dtype).reshape(B).contiguous()
    if tuple(ls.shape) != (B, T, U1) or tuple(pa.shape) != (B, T, U1, 2):
        raise ValueError(f"rnnt_joiner_triton: lse must be ({B}, {T}, {U1}) and arcs ({B}, {T}, {U1}, 2)")
    bk = blocks or DEFAULT_BLOCKS
    bn, bv, bj = _fit(R, bk.n), _fit(V, bk.v), _fit(J, bk.j)
    bjo = _fit(J, bk.jo or 128)
    tf32 = _tf32(enc)
    clamp_on = float(clamp) > 0.0
    scal = torch.tensor([float(clamp) if clamp_on else 0.0], dtype=enc.dtype, device=dev)
    dummy = enc.new_empty(1)
    common = (enc, pred, w, b, tg, il, tl_, ls, pa, c, scal)
    sizes = (R, T, U1, V, J, tg.shape[1], blank)
    if ne or np_:
        _dhidden_kernel[(triton.cdiv(R, bn), triton.cdiv(J, bjo))](
            *common, dummy if g_enc is None else g_enc, dummy if g_pred is None else g_pred, *sizes,
            NEED_ENC=ne, NEED_PRED=np_, CLAMP=clamp_on, TF32=tf32,
            BLOCK_N=bn, BLOCK_V=bv, BLOCK_J=bj, BLOCK_JO=bjo, num_warps=4,
        )  # fmt: skip
    if nw or nb:
        vt, jt = triton.cdiv(V, bv), (triton.cdiv(J, bjo) if nw else 1)
        nblocks = triton.cdiv(R, bn)
        if bk.splits is not None:
            splits = bk.splits
        elif dev.type == "cuda":
            sms = torch.cuda.get_device_properties(dev).multi_processor_count
            splits = max(1, (4 * sms) // (vt * jt))
        else:
            splits = 1
        splits = min(splits, nblocks)
        _dweight_kernel[(vt, jt, splits)](
            *common, dummy if g_w is None else g_w, dummy if g_b is None else g_b, *sizes, splits,
            NEED_W=nw, NEED_B=nb, CLAMP=clamp_on, TF32=tf32,
            BLOCK_N=bn, BLOCK_V=bv, BLOCK_J=bj, BLOCK_JO=bjo, num_warps=4,
        )  # fmt: skip
    return g_enc, g_pred, g_w, g_b


def _reference(enc, pred, w, b, tg, il, tl_, blank, arcs, coef, clamp):
    """The materialised joiner's ``lp2``, ``lse`` and the four gradients of
    :func:`joiner_grads` (torch autograd), for :func:`self_check`."""
    x = [t.detach().clone().requires_grad_() for t in (enc, pred, w, b)]
    z = torch.tanh(x[0][:, :, None] + x[1][:, None]) @ x[2].T + x[3]
    B, T, U1, V = z.shape
    lse = torch.logsumexp(z, -1)
    u = torch.arange(U1, device=z.device)
    y = torch.full((B, U1), blank, dtype=torch.int64, device=z.device)
    y[:, : U1 - 1] = tg[:, : U1 - 1]
    y = torch.where(u[None] < tl_[:, None], y, torch.full_like(y, blank))
    zy = z.gather(3, y[:, None, :, None].expand(B, T, U1, 1))[..., 0]
    lp2 = torch.stack([z[..., blank] - lse, zy - lse], -1)
    inside = (torch.arange(T, device=z.device)[None, :, None] < il[:, None, None]) & (
        u[None, None] <= tl_[:, None, None]
    )
    pb, pe = arcs[..., 0], arcs[..., 1] * (u[None, None] < tl_[:, None, None])
    dz = (pb + pe)[..., None] * torch.softmax(z, -1)
    dz[..., blank] -= pb
    dz.scatter_add_(3, y[:, None, :, None].expand(B, T, U1, 1), -pe[..., None])
    if clamp > 0:
        dz = dz.clamp(-clamp, clamp)
    dz = dz * coef[:, None, None, None] * inside[..., None]
    grads = torch.autograd.grad((z * dz.detach()).sum(), x)
    return lp2.detach(), lse.detach(), inside, grads


def self_check(device) -> Optional[str]:
    """Runs both passes on a small ragged case (several tiles of ``V`` and ``J``, clamp on) on
    ``device`` against the materialised joiner in torch; None when they agree, else what differed
    (for a dispatcher that falls back to the torch joiner)."""
    dev = torch.device(device)
    g = torch.Generator().manual_seed(0)
    B, T, U, V, J = 2, 3, 2, 20, 18
    enc, pred = torch.randn(B, T, J, generator=g), torch.randn(B, U + 1, J, generator=g)
    w, b = torch.randn(V, J, generator=g) / 4, torch.randn(V, generator=g)
    tg = torch.tensor([[1, 2], [3, 0]])
    il, tl_ = torch.tensor([3, 2]), torch.tensor([2, 1])
    arcs, coef = torch.rand(B, T, U + 1, 2, generator=g), torch.tensor([0.5, -1.5])
    enc, pred, w, b, tg, il, tl_, arcs, coef = (x.to(dev) for x in (enc, pred, w, b, tg, il, tl_, arcs, coef))
    small = Blocks(n=16, v=16, j=16, jo=16, splits=2)
    lp2 = torch.zeros(B, T, U + 1, 2, dtype=torch.float64, device=dev)
    lse = torch.zeros(B, T, U + 1, device=dev)
    try:
        joiner_rows(enc, pred, w, b, tg, il, tl_, 4, lp2, lse, small)
        got = joiner_grads(enc, pred, w, b, tg, il, tl_, lse, arcs, coef, 4, 0.3, blocks=small)
    except Exception as e:  # noqa: BLE001 - any failure means "do not use these kernels"
        return f"rnnt_joiner_triton failed: {e!r}"
    ref_lp2, ref_lse, inside, ref = _reference(enc, pred, w, b, tg, il, tl_, 4, arcs, coef, 0.3)
    pairs = [("lse", lse[inside], ref_lse[inside]), ("lp2", lp2[inside].float(), ref_lp2[inside])]
    pairs += [(n, a, r) for n, a, r in zip(("encoder", "predictor", "weight", "bias"), got, ref) if a is not None]
    if len(pairs) != 6:
        return "rnnt_joiner_triton: a gradient is missing"
    for name, x, r in pairs:
        if not torch.allclose(x.float(), r.float(), rtol=1e-4, atol=1e-4):
            return f"rnnt_joiner_triton: {name} differs from the materialised joiner's"
    return None


if triton is not None:

    @triton.jit
    def _tanh(x):
        """``tanh(x)`` from one exponential of ``-2 |x|`` (no overflow)."""
        e = tl.exp(-2.0 * tl.abs(x))
        r = (1.0 - e) / (1.0 + e)
        return tl.where(x < 0, -r, r)

    @triton.jit
    def _nodes(pid, R, T, U1, S, XLEN, YLEN, TGT, blank, BLOCK_N: tl.constexpr):
        """The block's nodes: ``(ok, emit, y, eoff, poff, rows, b)``: inside the lengths, with an
        emit arc, the emit label (the blank where none), the encoder's and the predictor's row
        offsets (elements), the flat node ids and the examples."""
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < R
        b = rows // (T * U1)
        t = (rows // U1) % T
        u = rows % U1
        tb = tl.load(XLEN + b, mask=rmask, other=0)
        ub = tl.load(YLEN + b, mask=rmask, other=0)
        ok = rmask & (t < tb) & (u <= ub)
        emit = ok & (u < ub)
        y = tl.load(TGT + b.to(tl.int64) * S + u, mask=emit, other=blank)
        eoff = b.to(tl.int64) * T + t
        poff = b.to(tl.int64) * U1 + u
        return ok, emit, y, eoff, poff, rows, b

    @triton.jit
    def _hidden(ENC, PRED, eoff, poff, ok, jj, J):
        """``(BLOCK_N, BLOCK_J)``: ``tanh(enc[b, t, jj] + pred[b, u, jj])`` (0 off the block's nodes)."""
        m = ok[:, None] & (jj[None, :] < J)
        a = tl.load(ENC + eoff[:, None] * J + jj[None, :], mask=m, other=0.0)
        c = tl.load(PRED + poff[:, None] * J + jj[None, :], mask=m, other=0.0)
        return _tanh(a + c)

    @triton.jit
    def _logits(
        ENC, PRED, W, BIAS, eoff, poff, ok, vv, V, J,
        TF32: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_J: tl.constexpr,
    ):  # fmt: skip
        """``(BLOCK_N, BLOCK_V)``: the logits of the block's nodes at the classes ``vv``
        (``-inf`` past ``V``), a sum of products over the tiles of ``J``."""
        vm = vv < V
        acc = tl.zeros((BLOCK_N, BLOCK_V), ENC.dtype.element_ty)
        for j0 in range(0, J, BLOCK_J):
            jj = j0 + tl.arange(0, BLOCK_J)
            h = _hidden(ENC, PRED, eoff, poff, ok, jj, J)
            wt = tl.load(
                W + vv[:, None].to(tl.int64) * J + jj[None, :], mask=vm[:, None] & (jj[None, :] < J), other=0.0
            )
            if TF32:
                acc += tl.dot(h, tl.trans(wt), input_precision="tf32")
            else:
                acc += tl.dot(h, tl.trans(wt), input_precision="ieee")
        acc += tl.load(BIAS + vv, mask=vm, other=0.0)[None, :]
        return tl.where(vm[None, :], acc, -float("inf"))

    @triton.jit
    def _dlogits(z, ls, pb, pe, c, ok, vv, V, y, blank, clamp, CLAMP: tl.constexpr):
        """The logit gradient of a tile: ``c clip((pb + pe) softmax - pb [v = blank] - pe [v = y])``,
        0 off the block's nodes and past ``V``."""
        d = (pb + pe)[:, None] * tl.exp(z - ls[:, None])
        d -= tl.where(vv[None, :] == blank, pb[:, None], 0.0)
        d -= tl.where(vv[None, :] == y[:, None], pe[:, None], 0.0)
        if CLAMP:
            d = tl.minimum(tl.maximum(d, -clamp), clamp)
        d = d * c[:, None]
        return tl.where(ok[:, None] & (vv[None, :] < V), d, 0.0)

    @triton.jit
    def _rows_kernel(
        ENC, PRED, W, BIAS, TGT, XLEN, YLEN, LP2, LSE,
        R, T, U1, V, J, S, blank,
        STORE_LSE: tl.constexpr, TF32: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_J: tl.constexpr,
    ):  # fmt: skip
        ok, emit, y, eoff, poff, rows, b = _nodes(tl.program_id(0), R, T, U1, S, XLEN, YLEN, TGT, blank, BLOCK_N)
        if tl.max(ok.to(tl.int32), 0) > 0:
            m = tl.full((BLOCK_N,), -float("inf"), ENC.dtype.element_ty)
            s = tl.zeros((BLOCK_N,), ENC.dtype.element_ty)
            zb = tl.zeros((BLOCK_N,), ENC.dtype.element_ty)
            ze = tl.zeros((BLOCK_N,), ENC.dtype.element_ty)
            for v0 in range(0, V, BLOCK_V):
                vv = v0 + tl.arange(0, BLOCK_V)
                z = _logits(ENC, PRED, W, BIAS, eoff, poff, ok, vv, V, J, TF32, BLOCK_N, BLOCK_V, BLOCK_J)
                zb += tl.sum(tl.where(vv[None, :] == blank, z, 0.0), 1)
                ze += tl.sum(tl.where(vv[None, :] == y[:, None], z, 0.0), 1)
                nm = tl.maximum(m, tl.max(z, 1))  # finite: each tile holds a class below V
                s = s * tl.exp(m - nm) + tl.sum(tl.exp(z - nm[:, None]), 1)
                m = nm
            lse = m + tl.log(s)
            r64 = rows.to(tl.int64)
            tl.store(LP2 + r64 * 2, zb - lse, mask=ok)
            tl.store(LP2 + r64 * 2 + 1, ze - lse, mask=ok)
            if STORE_LSE:
                tl.store(LSE + r64, lse, mask=ok)

    @triton.jit
    def _arc_weights(LSE, ARCS, COEF, rows, b, ok, emit):
        """Per node: the log-normaliser, ``p_blank``, ``p_emit`` (0 without an emit arc), ``c_b``."""
        r64 = rows.to(tl.int64)
        ls = tl.load(LSE + r64, mask=ok, other=0.0)
        pb = tl.load(ARCS + r64 * 2, mask=ok, other=0.0)
        pe = tl.load(ARCS + r64 * 2 + 1, mask=emit, other=0.0)
        c = tl.load(COEF + b, mask=ok, other=0.0)
        return ls, pb, pe, c

    @triton.jit
    def _dhidden_kernel(
        ENC, PRED, W, BIAS, TGT, XLEN, YLEN, LSE, ARCS, COEF, SCAL, GENC, GPRED,
        R, T, U1, V, J, S, blank,
        NEED_ENC: tl.constexpr, NEED_PRED: tl.constexpr, CLAMP: tl.constexpr, TF32: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_JO: tl.constexpr,
    ):  # fmt: skip
        ok, emit, y, eoff, poff, rows, b = _nodes(tl.program_id(0), R, T, U1, S, XLEN, YLEN, TGT, blank, BLOCK_N)
        if tl.max(ok.to(tl.int32), 0) > 0:
            ls, pb, pe, c = _arc_weights(LSE, ARCS, COEF, rows, b, ok, emit)
            clamp = tl.load(SCAL)
            jo = tl.program_id(1) * BLOCK_JO + tl.arange(0, BLOCK_JO)
            jm = jo < J
            dh = tl.zeros((BLOCK_N, BLOCK_JO), ENC.dtype.element_ty)
            for v0 in range(0, V, BLOCK_V):
                vv = v0 + tl.arange(0, BLOCK_V)
                z = _logits(ENC, PRED, W, BIAS, eoff, poff, ok, vv, V, J, TF32, BLOCK_N, BLOCK_V, BLOCK_J)
                dz = _dlogits(z, ls, pb, pe, c, ok, vv, V, y, blank, clamp, CLAMP)
                wo = tl.load(
                    W + vv[:, None].to(tl.int64) * J + jo[None, :], mask=(vv[:, None] < V) & jm[None, :], other=0.0
                )
                if TF32:
                    dh += tl.dot(dz, wo, input_precision="tf32")
                else:
                    dh += tl.dot(dz, wo, input_precision="ieee")
            h = _hidden(ENC, PRED, eoff, poff, ok, jo, J)
            dpre = dh * (1.0 - h * h)
            m2 = ok[:, None] & jm[None, :]
            if NEED_ENC:
                tl.atomic_add(GENC + eoff[:, None] * J + jo[None, :], dpre, mask=m2)
            if NEED_PRED:
                tl.atomic_add(GPRED + poff[:, None] * J + jo[None, :], dpre, mask=m2)

    @triton.jit
    def _dweight_kernel(
        ENC, PRED, W, BIAS, TGT, XLEN, YLEN, LSE, ARCS, COEF, SCAL, GW, GB,
        R, T, U1, V, J, S, blank, SPLITS,
        NEED_W: tl.constexpr, NEED_B: tl.constexpr, CLAMP: tl.constexpr, TF32: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_JO: tl.constexpr,
    ):  # fmt: skip
        vv = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
        vm = vv < V
        jo = tl.program_id(1) * BLOCK_JO + tl.arange(0, BLOCK_JO)
        jm = jo < J
        clamp = tl.load(SCAL)
        gw = tl.zeros((BLOCK_V, BLOCK_JO), ENC.dtype.element_ty)
        gb = tl.zeros((BLOCK_V,), ENC.dtype.element_ty)
        for nb in range(tl.program_id(2), tl.cdiv(R, BLOCK_N), SPLITS):
            ok, emit, y, eoff, poff, rows, b = _nodes(nb, R, T, U1, S, XLEN, YLEN, TGT, blank, BLOCK_N)
            if tl.max(ok.to(tl.int32), 0) > 0:
                ls, pb, pe, c = _arc_weights(LSE, ARCS, COEF, rows, b, ok, emit)
                z = _logits(ENC, PRED, W, BIAS, eoff, poff, ok, vv, V, J, TF32, BLOCK_N, BLOCK_V, BLOCK_J)
                dz = _dlogits(z, ls, pb, pe, c, ok, vv, V, y, blank, clamp, CLAMP)
                if NEED_W:
                    h = _hidden(ENC, PRED, eoff, poff, ok, jo, J)
                    if TF32:
                        gw += tl.dot(tl.trans(dz), h, input_precision="tf32")
                    else:
                        gw += tl.dot(tl.trans(dz), h, input_precision="ieee")
                if NEED_B:
                    gb += tl.sum(dz, 0)
        if NEED_W:
            tl.atomic_add(GW + vv[:, None].to(tl.int64) * J + jo[None, :], gw, mask=vm[:, None] & jm[None, :])
        if NEED_B:
            tl.atomic_add(GB + vv, gb, mask=vm & (vv * 0 + tl.program_id(1) == 0))  # the first tile of J
