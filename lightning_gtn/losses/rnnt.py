"""The regular RNN-T loss (Graves 2012) with torchaudio's ``rnnt_loss`` signature and meanings.

:func:`rnnt_loss` checks its arguments (shapes and dtypes here, values inside the op, where
``torch.compile`` does not look) and calls the ``torch.library`` custom op
``lightning_gtn::rnnt_loss``, which computes the costs and their gradient in one go (the numba
kernel :mod:`lightning_gtn.kernels.rnnt_numba` on the CPU, :mod:`lightning_gtn.kernels.rnnt_torch`
elsewhere), with the reduction applied inside; its registered backward only multiplies the saved
gradient by the incoming one. With ``inplace_grad=True`` (eager mode) the gradient is written into
the logits' own storage instead of a new buffer.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from ..core import checks
from ..kernels.rnnt_numba import rnnt_cost_grad
from ..kernels.rnnt_torch import rnnt_cost_grad_torch

__all__ = ["rnnt_loss", "RNNT_IMPLS", "resolve_blank"]

#: ``impl=`` values of :func:`rnnt_loss` besides None (the device's default)
RNNT_IMPLS = ("numba", "torch")


def resolve_blank(blank, V: int) -> int:
    """``blank`` as a class id in ``[0, V)``: negative values count from the end (torchaudio's
    ``blank=-1`` is ``V - 1``); ValueError unless it is an integer in ``[-V, V)``."""
    if isinstance(blank, torch.Tensor) and blank.dim() == 0 and not blank.is_floating_point():
        blank = int(blank)
    if isinstance(blank, (bool, np.bool_)) or not isinstance(blank, (int, np.integer)):
        raise ValueError(f"blank must be an integer class id in [-V, V) with V={V}, got {blank!r}")
    b = int(blank)
    if not -V <= b < V:
        raise ValueError(f"blank must lie in [-V, V) with V={V} (logits of shape (B, T, U + 1, V)), got {b}")
    return b % V


def _check_logits(logits) -> Tuple[int, int, int, int]:
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"logits must be a torch.Tensor of shape (B, T, U + 1, V), got {type(logits).__name__}")
    if logits.dim() != 4:
        raise ValueError(f"logits must have shape (B, T, U + 1, V), got {logits.dim()} dims: {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating point tensor, got {logits.dtype}")
    B, T, U1, V = logits.shape
    if U1 < 1 or V < 1:
        raise ValueError(
            f"logits must have shape (B, T, U + 1, V) with U + 1 >= 1 and V >= 1, got {tuple(logits.shape)}"
        )
    return B, T, U1, V


def _check_index_tensor(x, name: str, B: int, ndim: int, device: torch.device) -> Tensor:
    shape = "(B, U)" if ndim == 2 else "(B,)"
    if not isinstance(x, torch.Tensor):
        x = checks.int_tensor(x, name)
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise ValueError(f"{name} must be an int32 or int64 tensor of shape {shape}, got {x.dtype}")
    if x.dim() != ndim or x.shape[0] != B:
        raise ValueError(f"{name} must have shape {shape} with B={B}, got {tuple(x.shape)}")
    if x.device.type != "cpu" and x.device != device:
        raise ValueError(f"{name} is on {x.device} but the logits are on {device}; put it on {device} or the CPU")
    return x.to(torch.int64)


def _check_values(targets: Tensor, logit_lengths: Tensor, target_lengths: Tensor, T: int, U: int, V: int, blank: int):
    """Host copies ``(targets, logit_lengths, target_lengths)`` as int64 numpy, range-checked."""
    il = logit_lengths.detach().cpu().numpy().astype(np.int64, copy=False)
    tl = target_lengths.detach().cpu().numpy().astype(np.int64, copy=False)
    tg = targets.detach().cpu().numpy().astype(np.int64, copy=False)
    if il.size and (il.min() < 0 or il.max() > T):
        bad = int(il.min()) if il.min() < 0 else int(il.max())
        raise ValueError(f"logit_lengths must lie in [0, T] with T={T} (logits of shape (B, T, U + 1, V)), got {bad}")
    if tl.size and (tl.min() < 0 or tl.max() > U):
        bad = int(tl.min()) if tl.min() < 0 else int(tl.max())
        raise ValueError(f"target_lengths must lie in [0, U] with U={U} (logits of shape (B, T, U + 1, V)), got {bad}")
    if tl.size and tl.max() > tg.shape[1]:
        raise ValueError(f"target_lengths must be <= S={tg.shape[1]} (targets of shape (B, S)), got {int(tl.max())}")
    used = tg[np.arange(tg.shape[1])[None, :] < tl[:, None]]
    if used.size:
        lo, hi = int(used.min()), int(used.max())
        if lo < 0 or hi >= V:
            raise ValueError(f"targets: label {lo if lo < 0 else hi} out of range [0, V) with V={V}")
        if (used == blank).any():
            raise ValueError(f"targets: label equal to blank={blank} found; targets must not contain the blank")
    return tg, il, tl


def _coefficients(reduction: str, B: int) -> np.ndarray:
    if reduction == "mean":
        return np.full(B, 1.0 / max(B, 1))
    return np.ones(B)


def _costs_and_grad(
    x: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    blank: int,
    clamp: float,
    reduction: str,
    fused: bool,
    zero_infinity: bool,
    lam: float,
    impl: str,
    need_grad: bool,
    into: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """``(out, d out / d x)`` (the gradient None without ``need_grad``), the reduction applied
    inside; ``into`` is the buffer the numba kernel writes the gradient to (default a new one)."""
    B, T, U1, V = x.shape
    tg, il, tl = _check_values(targets, logit_lengths, target_lengths, T, U1 - 1, V, blank)
    r = _coefficients(reduction, B)
    if impl == "numba":
        if x.device.type != "cpu":
            raise ValueError(f"impl='numba' needs CPU tensors, got logits on {x.device}")
        xc = x.detach()
        if not xc.is_contiguous():
            xc = xc.contiguous()
        g = None
        if need_grad:
            g = into if into is not None else torch.empty_like(xc)
        costs_np = rnnt_cost_grad(xc.numpy(), tg, il, tl, blank, fused, lam, clamp, r, None if g is None else g.numpy())
        costs = torch.from_numpy(costs_np)  # the kernel zeroed the gradient of infinite costs
    else:
        dev = x.device
        tgt = torch.from_numpy(tg).to(dev)
        ilt = torch.from_numpy(il).to(dev)
        tlt = torch.from_numpy(tl).to(dev)
        c, g = rnnt_cost_grad_torch(
            x, tgt, ilt, tlt, blank, fused, lam, clamp, torch.from_numpy(r) if need_grad else None
        )
        costs = c.to(torch.float64).cpu()
        if g is not None and into is not None:
            into.copy_(g)
            g = into
    costs = costs * (1.0 + lam)  # NeMo's FastEmit: the reported cost scaled too
    if zero_infinity:
        costs = torch.where(torch.isinf(costs), torch.zeros_like(costs), costs)
    if reduction == "none":
        out = costs
    else:
        out = (costs * torch.from_numpy(r)).sum()
    return out.to(device=x.device, dtype=x.dtype), g


@torch.library.custom_op("lightning_gtn::rnnt_loss", mutates_args=())
def rnnt_loss_op(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    blank: int,
    clamp: float,
    reduction: str,
    fused_log_softmax: bool,
    zero_infinity: bool,
    fastemit_lambda: float,
    impl: str,
    need_grad: bool,
) -> Tuple[Tensor, Tensor]:
    """``(out, d out / d logits)``: ``out`` is ``(B,)`` for ``reduction="none"``, else a scalar;
    the gradient is an empty tensor without ``need_grad``. Values are range-checked here."""
    out, g = _costs_and_grad(
        logits,
        targets,
        logit_lengths,
        target_lengths,
        blank,
        clamp,
        reduction,
        fused_log_softmax,
        zero_infinity,
        fastemit_lambda,
        impl,
        need_grad,
    )
    return out, (g if g is not None else logits.new_empty(0))


@rnnt_loss_op.register_fake
def _rnnt_fake(
    logits,
    targets,
    logit_lengths,
    target_lengths,
    blank,
    clamp,
    reduction,
    fused_log_softmax,
    zero_infinity,
    fastemit_lambda,
    impl,
    need_grad,
):
    B = logits.shape[0]
    out = logits.new_empty((B,) if reduction == "none" else ())
    return out, (torch.empty_like(logits) if need_grad else logits.new_empty(0))


def _setup(ctx, inputs, output):
    ctx.reduction = inputs[6]
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(output[1])


def _backward(ctx, g_out, _g_grad):
    none = (None,) * 11
    if g_out is None:
        return (None,) + none
    (g,) = ctx.saved_tensors
    if ctx.reduction == "none":
        return (g * g_out.reshape(-1, 1, 1, 1).to(g.dtype),) + none
    return (g * g_out.to(g.dtype),) + none


rnnt_loss_op.register_autograd(_backward, setup_context=_setup)


class _RNNTInplace(torch.autograd.Function):
    """Eager ``inplace_grad=True``: the gradient is written into the logits' storage (which the
    loss then owns) and scaled in place by the backward."""

    @staticmethod
    def forward(ctx, logits, targets, logit_lengths, target_lengths, options):
        blank, clamp, reduction, fused, zero_infinity, lam, impl = options
        buf = logits.detach()
        out, _ = _costs_and_grad(
            buf,
            targets,
            logit_lengths,
            target_lengths,
            blank,
            clamp,
            reduction,
            fused,
            zero_infinity,
            lam,
            impl,
            True,
            into=buf,
        )
        ctx.buf = buf
        ctx.reduction = reduction
        ctx.mark_non_differentiable()
        return out

    @staticmethod
    def backward(ctx, g_out):
        g = ctx.buf
        ctx.buf = None
        if g is None:
            raise RuntimeError("rnnt_loss(inplace_grad=True): backward can run only once")
        if ctx.reduction == "none":
            g.mul_(g_out.reshape(-1, 1, 1, 1).to(g.dtype))
        else:
            g.mul_(g_out.to(g.dtype))
        return g, None, None, None, None


def _check_float(value, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def rnnt_loss(
    logits: Tensor,
    targets,
    logit_lengths,
    target_lengths,
    blank: int = -1,
    clamp: float = -1.0,
    reduction: str = "mean",
    fused_log_softmax: bool = True,
    *,
    zero_infinity: bool = False,
    fastemit_lambda: float = 0.0,
    impl: Optional[str] = None,
    inplace_grad: bool = False,
) -> Tensor:
    """The RNN-T loss (Graves 2012) of joiner outputs, torchaudio's ``rnnt_loss`` signature.

    The cost of an example is ``-log P(y | x)``, summed over every monotone path through the
    ``(T_b, U_b + 1)`` grid of (frame, emitted labels) nodes: from node ``(t, u)`` a blank goes to
    ``(t + 1, u)``, the label ``y_u`` to ``(t, u + 1)``; a path ends with the blank out of
    ``(T_b - 1, U_b)``. The log-softmax over ``V`` is fused into the kernel, the gradient is
    computed in the forward and scaled by the backward. A ``torch.library`` custom op: works under
    ``torch.compile(fullgraph=True)``.

    Args:
        logits: ``(B, T, U + 1, V)`` joiner outputs (float32 or float64; float16/bfloat16 are
            computed in float32). With ``fused_log_softmax=False``, log-probabilities.
        targets: ``(B, S)`` int32 or int64 padded label ids, ``S >= max(target_lengths)``
            (torchaudio: ``S = U``); ids in ``[0, V)`` and never the blank; entries past a
            target's length are ignored. On the logits' device or the CPU.
        logit_lengths: ``(B,)`` int32/int64 frames of each example, ``0 <= logit_lengths <= T``.
        target_lengths: ``(B,)`` int32/int64 labels of each example, ``0 <= target_lengths <= U``
            (``U > T`` is legal: several labels may be emitted at one frame).
        blank: the blank's class id; negative values count from the end (``-1`` is ``V - 1``,
            torchaudio's default). Must lie in ``[-V, V)``.
        clamp: when ``> 0``, every element of each example's gradient w.r.t. the logits is
            clipped to ``[-clamp, clamp]`` (before the reduction's scaling, as torchaudio does);
            ``<= 0`` leaves it alone.
        reduction: ``"none"``: the ``(B,)`` costs; ``"sum"``: their sum; ``"mean"``: their mean
            over the batch, ``sum_b cost_b / B`` (torchaudio's meaning: NOT divided by the target
            lengths, unlike ``ctc_loss``).
        fused_log_softmax: True: ``log_softmax`` over ``V`` is applied inside (the logits are raw
            scores). False: the logits are log-probabilities already and are used as they are;
            the gradient then is torchaudio's: ``-`` the posterior of each lattice arc at its
            blank/label entry, 0 elsewhere (the gradient w.r.t. the log-probabilities as
            independent inputs).
        zero_infinity: infeasible examples (``logit_lengths == 0``, or no path of non-zero
            probability) have an infinite cost; with ``zero_infinity=True`` it is 0. Their
            gradient is 0 either way.
        fastemit_lambda: FastEmit regularisation (Yu et al. 2021) as NeMo's and warprnnt-numba's
            numba losses define it: the gradient of every emit (non-blank) arc is scaled by
            ``1 + fastemit_lambda`` and the reported cost is ``(1 + fastemit_lambda) * cost``.
            Must be finite and ``>= 0``.
        impl: None (numba on the CPU, torch elsewhere), ``"numba"`` (CPU only) or ``"torch"``
            (plain torch ops and autograd; any device; the reference).
        inplace_grad: write the gradient into the logits' own storage instead of a new
            ``(B, T, U + 1, V)`` buffer (as k2 and optimized_transducer allow). The logits'
            values are DESTROYED by the call: only use it when nothing else reads them (no
            other loss term, no backward of an op before that needs its output). Needs
            contiguous float32/float64 logits; the backward can run once. Eager only: under
            ``torch.compile`` a new buffer is used.

    Returns:
        A scalar (``(B,)`` for ``reduction="none"``) in the logits' dtype and device. A NaN
        that the lattice reads (any logit of a node in an example's grid, with the fused
        log-softmax) gives that example a NaN cost and a NaN gradient (no error is raised).

    Example:
        >>> import torch
        >>> from lightning_gtn.functional import rnnt_loss
        >>> logits = torch.randn(2, 6, 4, 5, requires_grad=True)  # (B, T, U + 1, V)
        >>> targets = torch.tensor([[1, 2, 3], [3, 1, 0]], dtype=torch.int32)
        >>> loss = rnnt_loss(logits, targets, torch.tensor([6, 5]), torch.tensor([3, 2]), blank=0)
        >>> loss.backward()
    """
    B, T, U1, V = _check_logits(logits)
    checks.check_reduction(reduction)
    if impl is not None and impl not in RNNT_IMPLS:
        raise ValueError(f"impl must be None or one of {RNNT_IMPLS} for rnnt_loss, got {impl!r}")
    if impl == "numba" and logits.device.type != "cpu":
        raise ValueError(f"impl='numba' needs CPU tensors, got logits on {logits.device}")
    blank_id = resolve_blank(blank, V)
    clamp_v = _check_float(clamp, "clamp")
    lam = _check_float(fastemit_lambda, "fastemit_lambda")
    if lam < 0:
        raise ValueError(f"fastemit_lambda must be >= 0, got {lam}")
    for name, flag in (("fused_log_softmax", fused_log_softmax), ("zero_infinity", zero_infinity)):
        if not isinstance(flag, (bool, np.bool_)):
            raise ValueError(f"{name} must be a bool, got {flag!r}")
    if not isinstance(inplace_grad, (bool, np.bool_)):
        raise ValueError(f"inplace_grad must be a bool, got {inplace_grad!r}")
    dev = logits.device
    tg = _check_index_tensor(targets, "targets", B, 2, dev)
    il = _check_index_tensor(logit_lengths, "logit_lengths", B, 1, dev)
    tl = _check_index_tensor(target_lengths, "target_lengths", B, 1, dev)
    run_impl = impl or ("numba" if dev.type == "cpu" else "torch")
    need_grad = bool(torch.is_grad_enabled() and logits.requires_grad)
    options = (blank_id, clamp_v, reduction, bool(fused_log_softmax), bool(zero_infinity), lam, run_impl)
    if inplace_grad and need_grad and not torch.compiler.is_compiling():
        if logits.dtype not in (torch.float32, torch.float64) or not logits.is_contiguous():
            raise ValueError(
                f"inplace_grad=True needs contiguous float32/float64 logits, got {logits.dtype}"
                f"{'' if logits.is_contiguous() else ' (not contiguous)'}"
            )
        return _RNNTInplace.apply(logits, tg, il, tl, options)
    x = logits.to(checks.compute_dtype(logits))
    out, _ = rnnt_loss_op(
        x,
        tg,
        il,
        tl,
        blank_id,
        clamp_v,
        reduction,
        bool(fused_log_softmax),
        bool(zero_infinity),
        lam,
        run_impl,
        need_grad,
    )
    return out.to(logits.dtype)
