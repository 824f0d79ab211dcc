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

The duration lattices (TDT, multi-blank) read other columns of each node: :func:`duration_rows`
and :func:`duration_grads` run the same kernels on the columns ``[target, fixed..., durations...]``
(``fixed`` the blank and big blanks), the label columns normalised over the classes ``[0, K)``,
the duration columns over ``[K, V)``, with the gradient
``dz = c_b ((sum p_label) softmax(z[:K]) | (sum p_duration) softmax(z[K:])) - sum_col p_col [v = class_col]``.
RNN-T's ``[blank, emit]`` are those columns with one group: the kernels take the columns' class
ids (the node's own label at one of them), so one set of kernels serves the three losses.

What the kernels hold is a few tiles per program; what they write is a few values per node forward
and the four gradients backward. The backward computes each node's logits ``ceil(J / BLOCK_JO)``
times in each of the two gradient kernels (``BLOCK_JO`` the output tile of ``J``: the whole ``J``
up to 128), the forward once. The gradients' sums are atomics: equal to rounding, not bitwise
reproducible.

float32 products use IEEE float32 (``tl.dot(..., input_precision="ieee")``) unless torch allows
TF32 for matmuls (``torch.backends.cuda.matmul.allow_tf32``), as the materialised joiner's matmul
would.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence, Tuple

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
    "joiner_rows",
    "joiner_grads",
    "duration_rows",
    "duration_grads",
    "Blocks",
    "DEFAULT_BLOCKS",
]

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


def _operands(encoder, predictor, weight, bias, targets, logit_lengths, target_lengths, cols, y_col: int, K: int):
    """What the kernels read, checked (they index without bounds checks): the float tensors
    contiguous, the index tensors contiguous int64 on their device, the columns' classes as an
    int32 tensor (``-1`` at ``y_col``, the column of each node's own label); ValueError naming
    the argument for a shape, dtype, device, length, label or class out of range."""
    dev = encoder.device
    _check_device(dev)
    if encoder.dim() != 3 or encoder.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"rnnt_joiner_triton: encoder must be a float32/float64 (B, T, J) tensor, got {encoder.dtype}")
    B, T, J = encoder.shape
    U1, V = predictor.shape[1], weight.shape[0]
    for name, x, shape in (("predictor", predictor, (B, U1, J)), ("weight", weight, (V, J)), ("bias", bias, (V,))):
        if tuple(x.shape) != shape or x.dtype != encoder.dtype or x.device != dev:
            raise ValueError(f"rnnt_joiner_triton: {name} must have shape {shape}, the encoder's dtype and device")
    if B * T * U1 >= 2**31:
        raise ValueError(f"rnnt_joiner_triton: B * T * (U + 1) = {B * T * U1} nodes is too many (< 2**31)")
    if not 1 <= K <= V or any(not 0 <= int(c) < V for i, c in enumerate(cols) if i != y_col):
        raise ValueError(f"rnnt_joiner_triton: the classes read {list(cols)} and K={K} must lie in [0, V={V})")
    f = tuple(x.detach().contiguous() for x in (encoder, predictor, weight, bias))
    tg = targets.to(device=dev, dtype=torch.int64)
    tg = tg.reshape(B, -1).contiguous() if tg.numel() else torch.zeros((B, 1), dtype=torch.int64, device=dev)
    il = logit_lengths.to(device=dev, dtype=torch.int64).reshape(-1).contiguous()
    tl_ = target_lengths.to(device=dev, dtype=torch.int64).reshape(-1).contiguous()
    if il.numel() != B or tl_.numel() != B:
        raise ValueError(f"rnnt_joiner_triton: logit_lengths and target_lengths must have shape ({B},)")
    if B and (bool(((il < 0) | (il > T)).any()) or bool(((tl_ < 0) | (tl_ > U1 - 1)).any())):
        raise ValueError(
            f"rnnt_joiner_triton: logit_lengths must lie in [0, T={T}] and target_lengths in [0, U={U1 - 1}]"
        )
    S = tg.shape[1]
    if B and int(tl_.max()) > S:
        raise ValueError(
            f"rnnt_joiner_triton: targets of shape {tuple(tg.shape)} hold fewer labels than target_lengths"
        )
    inside = torch.arange(S, device=dev)[None, :] < tl_[:, None]
    if bool((inside & ((tg < 0) | (tg >= K))).any()):
        raise ValueError(f"rnnt_joiner_triton: targets (within target_lengths) must lie in [0, {K})")
    c = [-1 if i == y_col else int(k) for i, k in enumerate(cols)]
    return f, tg, il, tl_, torch.tensor(c, dtype=torch.int32, device=dev)


def _rows(tensors, cols, y_col: int, nl: int, K: int, pad: int, out, lse, blocks) -> None:
    """:func:`joiner_rows` and :func:`duration_rows`: per node the columns ``cols`` (class ids;
    the node's label at ``y_col``, ``pad`` where it emits none) as log-probabilities, the first
    ``nl`` normalised over the classes ``[0, K)``, the others over ``[K, V)``, into ``out (B, T,
    U + 1, len(cols))``; the normalisers into ``lse (B, T, U + 1[, 2])`` (2 when ``K < V``)."""
    (enc, pred, w, b), tg, il, tl_, col_ids = tensors
    B, T, J = enc.shape
    U1, V = pred.shape[1], w.shape[0]
    R, NC, has_d = B * T * U1, len(cols), K < V
    if R == 0:
        return
    if not out.is_contiguous() or tuple(out.shape) != (B, T, U1, NC) or out.device != enc.device:
        raise ValueError(f"rnnt_joiner_triton: the output must be a contiguous ({B}, {T}, {U1}, {NC}) tensor")
    if lse is not None and (not lse.is_contiguous() or lse.numel() != R * (2 if has_d else 1)):
        raise ValueError(
            f"rnnt_joiner_triton: lse must be a contiguous ({B}, {T}, {U1}{', 2' if has_d else ''}) tensor"
        )
    bk = blocks or DEFAULT_BLOCKS
    bn, bv, bj = _fit(R, bk.n), _fit(V, bk.v), _fit(J, bk.j)
    _rows_kernel[(triton.cdiv(R, bn),)](
        enc, pred, w, b, tg, il, tl_, col_ids, out, out if lse is None else lse,
        R, T, U1, V, J, tg.shape[1], K, NC, nl, y_col, pad,
        STORE_LSE=lse is not None, HAS_D=has_d, TF32=_tf32(enc),
        BLOCK_N=bn, BLOCK_V=bv, BLOCK_J=bj, BLOCK_C=triton.next_power_of_2(NC),
        num_warps=4,
    )  # fmt: skip


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
    t = _operands(
        encoder, predictor, weight, bias, targets, logit_lengths, target_lengths, [blank, -1], 1, weight.shape[0]
    )
    _rows(t, [blank, -1], 1, 2, weight.shape[0], blank, lp2, lse, blocks)


def duration_rows(
    encoder: torch.Tensor,
    predictor: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    K: int,
    fixed: Sequence[int],
    small: torch.Tensor,
    lse: Optional[torch.Tensor] = None,
    blocks: Optional[Blocks] = None,
) -> None:
    """The duration lattices' node tensor, written in place: per node inside the lengths the
    columns ``[target, fixed..., durations...]`` of ``small (B, T, U + 1, 1 + F + D)``: the
    label log-probabilities (normalised over ``[0, K)``) of the node's target (of ``fixed[0]``
    at ``u = target_lengths[b]``) and of the ``F`` classes ``fixed``, then the ``D = V - K``
    duration log-probabilities (normalised over ``[K, V)``); ``lse (B, T, U + 1, G)`` (or
    None) the label and, with ``D > 0``, the duration normalisers. Other arguments as
    :func:`joiner_rows`."""
    V = weight.shape[0]
    cols = [-1, *fixed, *range(K, V)]
    t = _operands(encoder, predictor, weight, bias, targets, logit_lengths, target_lengths, cols, 0, K)
    _rows(t, cols, 0, 1 + len(fixed), K, int(fixed[0]), small, lse, blocks)


def _grads(tensors, cols, y_col, nl, K, pad, lse, arcs, coef, clamp, need, blocks):
    """:func:`joiner_grads` and :func:`duration_grads` (columns as :func:`_rows`)."""
    (enc, pred, w, b), tg, il, tl_, col_ids = tensors
    B, T, J = enc.shape
    U1, V = pred.shape[1], w.shape[0]
    R, NC, has_d = B * T * U1, len(cols), K < V
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
    if ls.numel() != R * (2 if has_d else 1) or tuple(pa.shape) != (B, T, U1, NC):
        raise ValueError(
            f"rnnt_joiner_triton: lse must hold {2 if has_d else 1} value(s) a node and arcs ({B}, {T}, {U1}, {NC})"
        )
    bk = blocks or DEFAULT_BLOCKS
    bn, bv, bj = _fit(R, bk.n), _fit(V, bk.v), _fit(J, bk.j)
    bjo = _fit(J, bk.jo or 128)
    bc = triton.next_power_of_2(NC)
    tf32 = _tf32(enc)
    clamp_on = float(clamp) > 0.0
    scal = torch.tensor([float(clamp) if clamp_on else 0.0], dtype=enc.dtype, device=dev)
    dummy = enc.new_empty(1)
    common = (enc, pred, w, b, tg, il, tl_, col_ids, ls, pa, c, scal)
    sizes = (R, T, U1, V, J, tg.shape[1], K, NC, nl, y_col, pad)
    consts = dict(CLAMP=clamp_on, HAS_D=has_d, TF32=tf32, BLOCK_N=bn, BLOCK_V=bv, BLOCK_J=bj, BLOCK_JO=bjo, BLOCK_C=bc)
    if ne or np_:
        _dhidden_kernel[(triton.cdiv(R, bn), triton.cdiv(J, bjo))](
            *common, dummy if g_enc is None else g_enc, dummy if g_pred is None else g_pred, *sizes,
            NEED_ENC=ne, NEED_PRED=np_, **consts, num_warps=4,
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
            NEED_W=nw, NEED_B=nb, **consts, num_warps=4,
        )  # fmt: skip
    return g_enc, g_pred, g_w, g_b


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
    t = _operands(
        encoder, predictor, weight, bias, targets, logit_lengths, target_lengths, [blank, -1], 1, weight.shape[0]
    )
    return _grads(t, [blank, -1], 1, 2, weight.shape[0], blank, lse, arcs, coef, clamp, need, blocks)


def duration_grads(
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
    K: int,
    fixed: Sequence[int],
    need: Tuple[bool, bool, bool, bool] = (True, True, True, True),
    blocks: Optional[Blocks] = None,
) -> Tuple[Optional[torch.Tensor], ...]:
    """The gradients of :func:`joiner_grads` for the duration lattices: ``lse`` the normalisers
    of :func:`duration_rows`, ``arcs (B, T, U + 1, 1 + F + D)`` the negated gradients of the
    cost w.r.t. its columns: ``dz[:K] = (sum p_label) softmax(z[:K]) - p_target [v = y_u] -
    sum_f p_f [v = fixed_f]``, ``dz[K:] = (sum p_duration) softmax(z[K:]) - p_duration``, times
    ``coef[b]``."""
    V = weight.shape[0]
    cols = [-1, *fixed, *range(K, V)]
    t = _operands(encoder, predictor, weight, bias, targets, logit_lengths, target_lengths, cols, 0, K)
    return _grads(t, cols, 0, 1 + len(fixed), K, int(fixed[0]), lse, arcs, coef, -1.0, need, blocks)


def _reference(enc, pred, w, b, tg, il, tl_, cols, y_col, nl, K, pad, arcs, coef, clamp):
    """What :func:`_rows` and :func:`_grads` compute, from the materialised joiner (torch
    autograd), for :func:`self_check`: ``(columns, normalisers, inside, four gradients)``."""
    x = [t.detach().clone().requires_grad_() for t in (enc, pred, w, b)]
    z = torch.tanh(x[0][:, :, None] + x[1][:, None]) @ x[2].T + x[3]
    B, T, U1, V = z.shape
    dev = z.device
    groups = [(0, K)] + ([(K, V)] if K < V else [])
    lse = torch.stack([torch.logsumexp(z[..., a:e], -1) for a, e in groups], -1)
    u = torch.arange(U1, device=dev)
    emit = u[None, None] < tl_[:, None, None]  # (B, 1, U1)
    inside = (torch.arange(T, device=dev)[None, :, None] < il[:, None, None]) & (u[None, None] <= tl_[:, None, None])
    y = torch.full((B, U1), pad, dtype=torch.int64, device=dev)
    y[:, : U1 - 1] = tg[:, : U1 - 1]
    y = torch.where(emit[:, 0], y, torch.full_like(y, pad))[:, None, :].expand(B, T, U1)
    cls = [y if i == y_col else torch.full_like(y, int(c)) for i, c in enumerate(cols)]
    group = [0 if i < nl else 1 for i in range(len(cols))]
    out = torch.stack([z.gather(3, c[..., None])[..., 0] - lse[..., g] for c, g in zip(cls, group)], -1)
    p = arcs * torch.stack([emit.expand(B, T, U1) if i == y_col else inside for i in range(len(cols))], -1)
    dz = torch.zeros_like(z)
    for gi, (a, e) in enumerate(groups):
        pg = sum(p[..., i] for i in range(len(cols)) if group[i] == gi)
        dz[..., a:e] = pg[..., None] * torch.softmax(z[..., a:e], -1)
    for i, c in enumerate(cls):
        dz.scatter_add_(3, c[..., None], -p[..., i : i + 1])
    if clamp > 0:
        dz = dz.clamp(-clamp, clamp)
    dz = dz * coef[:, None, None, None] * inside[..., None]
    grads = torch.autograd.grad((z * dz.detach()).sum(), x)
    return out.detach(), lse.detach(), inside, grads


def self_check(device) -> Optional[str]:
    """Runs both passes on small ragged cases (several tiles of ``V`` and ``J``): RNN-T's columns
    with clamp on, and the duration lattices' (two fixed classes, four durations), on ``device``
    against the materialised joiner in torch; None when they agree, else what differed (for a
    dispatcher that falls back to the torch joiner)."""
    dev = torch.device(device)
    g = torch.Generator().manual_seed(0)
    B, T, U, V, J = 2, 3, 2, 20, 18
    enc, pred = torch.randn(B, T, J, generator=g), torch.randn(B, U + 1, J, generator=g)
    w, b = torch.randn(V, J, generator=g) / 4, torch.randn(V, generator=g)
    tg = torch.tensor([[1, 2], [3, 0]])
    il, tl_ = torch.tensor([3, 2]), torch.tensor([2, 1])
    coef = torch.tensor([0.5, -1.5])
    arcs2, arcs7 = torch.rand(B, T, U + 1, 2, generator=g), torch.rand(B, T, U + 1, 7, generator=g)
    enc, pred, w, b, tg, il, tl_, coef, arcs2, arcs7 = (
        x.to(dev) for x in (enc, pred, w, b, tg, il, tl_, coef, arcs2, arcs7)
    )
    small = Blocks(n=16, v=16, j=16, jo=16, splits=2)
    t = (enc, pred, w, b, tg, il, tl_)
    # (columns, label column, label columns, K, pad, arcs, clamp, the public pair's call)
    rnnt = ([4, -1], 1, 2, V, 4, arcs2, 0.3)
    duration = ([-1, 15, 14, 16, 17, 18, 19], 0, 3, 16, 15, arcs7, -1.0)
    for cols, y_col, nl, K, pad, arcs, clamp in (rnnt, duration):
        out = torch.zeros(B, T, U + 1, len(cols), dtype=torch.float64, device=dev)
        lse = torch.zeros(B, T, U + 1, 1 if K == V else 2, device=dev)
        try:
            if y_col == 1:
                joiner_rows(*t, pad, out, lse[..., 0], small)
                got = joiner_grads(*t, lse[..., 0], arcs, coef, pad, clamp, blocks=small)
            else:
                duration_rows(*t, K, cols[1:3], out, lse, small)
                got = duration_grads(*t, lse, arcs, coef, K, cols[1:3], blocks=small)
        except Exception as e:  # noqa: BLE001 - any failure means "do not use these kernels"
            return f"rnnt_joiner_triton failed: {e!r}"
        r_out, r_lse, inside, ref = _reference(*t, cols, y_col, nl, K, pad, arcs, coef, clamp)
        pairs = [("lse", lse[inside], r_lse[inside]), ("log-probabilities", out[inside].float(), r_out[inside])]
        pairs += [(n, a, r) for n, a, r in zip(("encoder", "predictor", "weight", "bias"), got, ref) if a is not None]
        if len(pairs) != 6:
            return "rnnt_joiner_triton: a gradient is missing"
        for name, x, r in pairs:
            if not torch.allclose(x.float(), r.float(), rtol=1e-4, atol=1e-4):
                what = "RNN-T" if y_col == 1 else "duration"
                return f"rnnt_joiner_triton: the {what} columns' {name} differs from the materialised joiner's"
    return None


#: the kernels' integer arguments that change from call to call (lengths, label columns): never
#: specialised on (divisibility by 16), so a new batch shape does not compile the kernels again
_PER_CALL = ["R", "T", "U1", "S", "K", "NC", "NL", "Y_COL", "pad"]
_PER_CALL_SPLITS = _PER_CALL + ["SPLITS"]

if triton is not None:

    @triton.jit
    def _tanh(x):
        """``tanh(x)`` from one exponential of ``-2 |x|`` (no overflow)."""
        e = tl.exp(-2.0 * tl.abs(x))
        r = (1.0 - e) / (1.0 + e)
        return tl.where(x < 0, -r, r)

    @triton.jit
    def _nodes(pid, R, T, U1, S, XLEN, YLEN, TGT, pad, BLOCK_N: tl.constexpr):
        """The block's nodes: ``(ok, emit, y, eoff, poff, rows, b)``: inside the lengths, with an
        emit arc, the emit label (``pad`` where none), the encoder's and the predictor's row
        indices, the flat node ids and the examples."""
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < R
        b = rows // (T * U1)
        t = (rows // U1) % T
        u = rows % U1
        tb = tl.load(XLEN + b, mask=rmask, other=0)
        ub = tl.load(YLEN + b, mask=rmask, other=0)
        ok = rmask & (t < tb) & (u <= ub)
        emit = ok & (u < ub)
        y = tl.load(TGT + b.to(tl.int64) * S + u, mask=emit, other=pad)
        eoff = b.to(tl.int64) * T + t
        poff = b.to(tl.int64) * U1 + u
        return ok, emit, y, eoff, poff, rows, b

    @triton.jit
    def _classes(COLS, y, cc, NC, Y_COL):
        """``(BLOCK_N, BLOCK_C)``: the class each node's columns read (its label at ``Y_COL``, -1
        past ``NC``)."""
        cls = tl.load(COLS + cc, mask=cc < NC, other=-1)
        return tl.where(cc[None, :] == Y_COL, y[:, None], cls[None, :])

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
            wm = vm[:, None] & (jj[None, :] < J)
            wt = tl.load(W + vv[:, None].to(tl.int64) * J + jj[None, :], mask=wm, other=0.0)
            if TF32:
                acc += tl.dot(h, tl.trans(wt), input_precision="tf32")
            else:
                acc += tl.dot(h, tl.trans(wt), input_precision="ieee")
        acc += tl.load(BIAS + vv, mask=vm, other=0.0)[None, :]
        return tl.where(vm[None, :], acc, -float("inf"))

    @triton.jit
    def _lse_step(m, s, z):
        """One tile ``z`` into an online log-sum-exp ``(max, scaled sum)`` (rows of -inf stay -inf)."""
        nm = tl.maximum(m, tl.max(z, 1))
        safe = tl.where(nm == -float("inf"), 0.0, nm)
        return nm, s * tl.exp(m - safe) + tl.sum(tl.exp(z - safe[:, None]), 1)

    @triton.jit(do_not_specialize=_PER_CALL)
    def _rows_kernel(
        ENC, PRED, W, BIAS, TGT, XLEN, YLEN, COLS, OUT, LSE,
        R, T, U1, V, J, S, K, NC, NL, Y_COL, pad,
        STORE_LSE: tl.constexpr, HAS_D: tl.constexpr, TF32: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_C: tl.constexpr,
    ):  # fmt: skip
        ok, emit, y, eoff, poff, rows, b = _nodes(tl.program_id(0), R, T, U1, S, XLEN, YLEN, TGT, pad, BLOCK_N)
        if tl.max(ok.to(tl.int32), 0) > 0:
            cc = tl.arange(0, BLOCK_C)
            cls = _classes(COLS, y, cc, NC, Y_COL)
            m1 = tl.full((BLOCK_N,), -float("inf"), ENC.dtype.element_ty)
            s1 = tl.zeros((BLOCK_N,), ENC.dtype.element_ty)
            m2 = tl.full((BLOCK_N,), -float("inf"), ENC.dtype.element_ty)
            s2 = tl.zeros((BLOCK_N,), ENC.dtype.element_ty)
            pick = tl.zeros((BLOCK_N, BLOCK_C), ENC.dtype.element_ty)
            for v0 in range(0, V, BLOCK_V):
                vv = v0 + tl.arange(0, BLOCK_V)
                z = _logits(ENC, PRED, W, BIAS, eoff, poff, ok, vv, V, J, TF32, BLOCK_N, BLOCK_V, BLOCK_J)
                pick += tl.sum(tl.where(vv[None, :, None] == cls[:, None, :], z[:, :, None], 0.0), 1)
                m1, s1 = _lse_step(m1, s1, tl.where(vv[None, :] < K, z, -float("inf")))
                if HAS_D:
                    m2, s2 = _lse_step(m2, s2, tl.where(vv[None, :] >= K, z, -float("inf")))
            dl = m1 + tl.log(s1)
            r64 = rows.to(tl.int64)
            cm = ok[:, None] & (cc[None, :] < NC)
            if HAS_D:
                dd = m2 + tl.log(s2)
                out = tl.where(cc[None, :] < NL, pick - dl[:, None], pick - dd[:, None])
                tl.store(OUT + r64[:, None] * NC + cc[None, :], out, mask=cm)
                if STORE_LSE:
                    tl.store(LSE + r64 * 2, dl, mask=ok)
                    tl.store(LSE + r64 * 2 + 1, dd, mask=ok)
            else:
                tl.store(OUT + r64[:, None] * NC + cc[None, :], pick - dl[:, None], mask=cm)
                if STORE_LSE:
                    tl.store(LSE + r64, dl, mask=ok)

    @triton.jit
    def _arc_weights(LSE, ARCS, COEF, rows, b, ok, emit, cc, NC, NL, Y_COL, HAS_D: tl.constexpr):
        """Per node: its columns' weights ``p (BLOCK_N, BLOCK_C)`` (0 at the label column without
        an emit arc), the label and duration normalisers and weight sums, and ``c_b``."""
        r64 = rows.to(tl.int64)
        pm = ok[:, None] & (cc[None, :] < NC) & ((cc[None, :] != Y_COL) | emit[:, None])
        p = tl.load(ARCS + r64[:, None] * NC + cc[None, :], mask=pm, other=0.0)
        pl = tl.sum(tl.where(cc[None, :] < NL, p, 0.0), 1)
        pd = tl.sum(tl.where(cc[None, :] >= NL, p, 0.0), 1)
        if HAS_D:
            dl = tl.load(LSE + r64 * 2, mask=ok, other=0.0)
            dd = tl.load(LSE + r64 * 2 + 1, mask=ok, other=0.0)
        else:
            dl = tl.load(LSE + r64, mask=ok, other=0.0)
            dd = dl
        c = tl.load(COEF + b, mask=ok, other=0.0)
        return p, pl, pd, dl, dd, c

    @triton.jit
    def _dlogits(z, p, pl, pd, dl, dd, c, cls, ok, vv, V, K, clamp, CLAMP: tl.constexpr, HAS_D: tl.constexpr):
        """The logit gradient of a tile: ``c clip(P softmax - sum_col p_col [v = class_col])``
        (``P`` the label or duration group's weight sum, its own softmax), 0 off the block's
        nodes and past ``V``."""
        if HAS_D:
            d = tl.where(vv[None, :] < K, pl[:, None] * tl.exp(z - dl[:, None]), pd[:, None] * tl.exp(z - dd[:, None]))
        else:
            d = pl[:, None] * tl.exp(z - dl[:, None])
        d -= tl.sum(tl.where(vv[None, :, None] == cls[:, None, :], p[:, None, :], 0.0), 2)
        if CLAMP:
            d = tl.minimum(tl.maximum(d, -clamp), clamp)
        d = d * c[:, None]
        return tl.where(ok[:, None] & (vv[None, :] < V), d, 0.0)

    @triton.jit(do_not_specialize=_PER_CALL)
    def _dhidden_kernel(
        ENC, PRED, W, BIAS, TGT, XLEN, YLEN, COLS, LSE, ARCS, COEF, SCAL, GENC, GPRED,
        R, T, U1, V, J, S, K, NC, NL, Y_COL, pad,
        NEED_ENC: tl.constexpr, NEED_PRED: tl.constexpr, CLAMP: tl.constexpr, HAS_D: tl.constexpr,
        TF32: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_J: tl.constexpr,
        BLOCK_JO: tl.constexpr, BLOCK_C: tl.constexpr,
    ):  # fmt: skip
        ok, emit, y, eoff, poff, rows, b = _nodes(tl.program_id(0), R, T, U1, S, XLEN, YLEN, TGT, pad, BLOCK_N)
        if tl.max(ok.to(tl.int32), 0) > 0:
            cc = tl.arange(0, BLOCK_C)
            cls = _classes(COLS, y, cc, NC, Y_COL)
            p, pl, pd, dl, dd, c = _arc_weights(LSE, ARCS, COEF, rows, b, ok, emit, cc, NC, NL, Y_COL, HAS_D)
            clamp = tl.load(SCAL)
            jo = tl.program_id(1) * BLOCK_JO + tl.arange(0, BLOCK_JO)
            jm = jo < J
            dh = tl.zeros((BLOCK_N, BLOCK_JO), ENC.dtype.element_ty)
            for v0 in range(0, V, BLOCK_V):
                vv = v0 + tl.arange(0, BLOCK_V)
                z = _logits(ENC, PRED, W, BIAS, eoff, poff, ok, vv, V, J, TF32, BLOCK_N, BLOCK_V, BLOCK_J)
                dz = _dlogits(z, p, pl, pd, dl, dd, c, cls, ok, vv, V, K, clamp, CLAMP, HAS_D)
                wm = (vv[:, None] < V) & jm[None, :]
                wo = tl.load(W + vv[:, None].to(tl.int64) * J + jo[None, :], mask=wm, other=0.0)
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

    @triton.jit(do_not_specialize=_PER_CALL_SPLITS)
    def _dweight_kernel(
        ENC, PRED, W, BIAS, TGT, XLEN, YLEN, COLS, LSE, ARCS, COEF, SCAL, GW, GB,
        R, T, U1, V, J, S, K, NC, NL, Y_COL, pad, SPLITS,
        NEED_W: tl.constexpr, NEED_B: tl.constexpr, CLAMP: tl.constexpr, HAS_D: tl.constexpr,
        TF32: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_J: tl.constexpr,
        BLOCK_JO: tl.constexpr, BLOCK_C: tl.constexpr,
    ):  # fmt: skip
        vv = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
        vm = vv < V
        jo = tl.program_id(1) * BLOCK_JO + tl.arange(0, BLOCK_JO)
        jm = jo < J
        cc = tl.arange(0, BLOCK_C)
        clamp = tl.load(SCAL)
        gw = tl.zeros((BLOCK_V, BLOCK_JO), ENC.dtype.element_ty)
        gb = tl.zeros((BLOCK_V,), ENC.dtype.element_ty)
        for nb in range(tl.program_id(2), tl.cdiv(R, BLOCK_N), SPLITS):
            ok, emit, y, eoff, poff, rows, b = _nodes(nb, R, T, U1, S, XLEN, YLEN, TGT, pad, BLOCK_N)
            if tl.max(ok.to(tl.int32), 0) > 0:
                cls = _classes(COLS, y, cc, NC, Y_COL)
                p, pl, pd, dl, dd, c = _arc_weights(LSE, ARCS, COEF, rows, b, ok, emit, cc, NC, NL, Y_COL, HAS_D)
                z = _logits(ENC, PRED, W, BIAS, eoff, poff, ok, vv, V, J, TF32, BLOCK_N, BLOCK_V, BLOCK_J)
                dz = _dlogits(z, p, pl, pd, dl, dd, c, cls, ok, vv, V, K, clamp, CLAMP, HAS_D)
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
