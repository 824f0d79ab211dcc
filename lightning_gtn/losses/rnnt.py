"""The regular RNN-T loss (Graves 2012) with torchaudio's ``rnnt_loss`` signature and meanings.

:func:`rnnt_loss` is :class:`RNNTCriterion` called through the one prologue of every loss,
:func:`lightning_gtn.core.criterion.apply_loss`, which checks its arguments (shapes, dtypes and
options there, values inside the op, where ``torch.compile`` does not look) and calls the
``torch.library`` custom op
``lightning_gtn::rnnt_loss``, which computes the costs and their gradient in one go (the numba
kernel :mod:`lightning_gtn.kernels.rnnt_numba` on the CPU, the Triton kernel
:mod:`lightning_gtn.kernels.rnnt_triton` on CUDA devices where it passes its self-check,
:mod:`lightning_gtn.kernels.rnnt_torch` elsewhere; :data:`RNNT_BACKENDS`
chooses), with the reduction applied inside; its registered backward only multiplies the saved
gradient by the incoming one. With ``inplace_grad=True`` (eager mode) the gradient is written into
the logits' own storage instead of a new buffer.
"""

from __future__ import annotations

import math
from typing import Dict, NamedTuple, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from ..core import checks, criterion
from ..core.criterion import Criterion
from ..core.impl import Backends
from ..core.reduction import reduction_coefficients
from ..kernels import rnnt_triton as rnnt_kernels
from ..kernels.rnnt_numba import rnnt_cost_grad
from ..kernels.rnnt_torch import rnnt_cost_grad_torch
from ..kernels.rnnt_triton import rnnt_triton
from ..opargs import grads, op_schema

__all__ = ["rnnt_loss", "RNNT_IMPLS", "RNNTCriterion", "JoinerCriterion", "resolve_blank"]

#: ``impl=`` values of :func:`rnnt_loss` besides None (the device's default)
RNNT_IMPLS = ("numba", "torch", "triton")
#: how ``impl`` resolves for the RNN-T lattices (this loss, the duration lattices, k2's recursion):
#: numba on the CPU, Triton on CUDA after torchaudio's published case passes, torch elsewhere
RNNT_BACKENDS = Backends(
    "rnnt_loss",
    RNNT_IMPLS,
    triton_available=rnnt_kernels.available,
    self_check=rnnt_kernels.self_check,
    kernels="Triton RNN-T",
)


def resolve_blank(blank, V: int) -> int:
    """``blank`` as a class id in ``[0, V)``: negative values count from the end (torchaudio's
    ``blank=-1`` is ``V - 1``); ValueError unless it is an integer in ``[-V, V)``."""
    return checks.check_class_id(blank, "blank", V, "V", "logits of shape (B, T, U + 1, V)")


def _host(x: Tensor) -> np.ndarray:
    return x.detach().cpu().numpy().astype(np.int64, copy=False)


def _check_values(targets: Tensor, logit_lengths: Tensor, target_lengths: Tensor, T: int, U: int, V: int, blank: int):
    """Host copies ``(targets, logit_lengths, target_lengths)`` as int64 numpy, range-checked."""
    il, tl, tg = _host(logit_lengths), _host(target_lengths), _host(targets)
    checks.check_in_range(il, "logit_lengths", "T", T, inclusive=True, of="logits of shape (B, T, U + 1, V)")
    checks.check_in_range(tl, "target_lengths", "U", U, inclusive=True, of="logits of shape (B, T, U + 1, V)")
    checks.check_padded_labels(tg, tl, V, blank)
    return tg, il, tl


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
    inside; ``into`` is the buffer the kernel writes the gradient to (default a new one).
    ``impl`` "" is the device's default (:data:`RNNT_BACKENDS`)."""
    B, T, U1, V = x.shape
    tg, il, tl = _check_values(targets, logit_lengths, target_lengths, T, U1 - 1, V, blank)
    r = reduction_coefficients(reduction, B).numpy()
    impl = RNNT_BACKENDS.pick(x.device, impl or None)
    scaled = False  # whether the kernel's costs already carry FastEmit's (1 + lambda)
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
    elif impl == "triton":
        dev = x.device
        U = U1 - 1
        tgt = torch.zeros((B, U), dtype=torch.int64)  # the kernel reads (B, U); ids past a length unread
        w = min(U, tg.shape[1])
        tgt[:, :w] = torch.from_numpy(tg[:, :w])
        inplace = into is not None and into.data_ptr() == x.data_ptr() and x.is_contiguous()
        c, g = rnnt_triton(
            x.detach(),
            tgt.to(dev),
            torch.from_numpy(il).to(dev),
            torch.from_numpy(tl).to(dev),
            blank,
            fused_log_softmax=fused,
            clamp=clamp,
            fastemit_lambda=lam,
            need_grad=need_grad,
            inplace=inplace,
        )
        if g is not None:  # per example (zero for infinite costs, clipped): the reduction's coefficients
            g.mul_(torch.from_numpy(r).to(device=dev, dtype=g.dtype).reshape(-1, 1, 1, 1))
            if into is not None and not inplace:
                into.copy_(g)
                g = into
        costs = c.to(torch.float64).cpu()
        scaled = True  # rnnt_triton reports -(1 + lambda) log P, as NeMo does
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
    if not scaled:
        costs = costs * (1.0 + lam)  # NeMo's FastEmit: the reported cost scaled too
    if zero_infinity:
        costs = torch.where(costs == math.inf, torch.zeros_like(costs), costs)  # infeasible only (torch's rule)
    if reduction == "none":
        out = costs
    else:
        out = (costs * torch.from_numpy(r)).sum()
    return out.to(device=x.device, dtype=x.dtype), g


class RNNTArgs(NamedTuple):
    """The arguments of ``lightning_gtn::rnnt_loss``."""

    logits: Tensor
    targets: Tensor
    logit_lengths: Tensor
    target_lengths: Tensor
    blank: int
    clamp: float
    reduction: str
    fused_log_softmax: bool
    zero_infinity: bool
    fastemit_lambda: float
    impl: str
    need_grad: bool


@torch.library.custom_op("lightning_gtn::rnnt_loss", mutates_args=())
@op_schema(RNNTArgs)
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
def _rnnt_fake(*inputs):
    a = RNNTArgs(*inputs)
    logits = a.logits
    out = logits.new_empty((logits.shape[0],) if a.reduction == "none" else ())
    return out, (torch.empty_like(logits) if a.need_grad else logits.new_empty(0))


def _setup(ctx, inputs, output):
    ctx.reduction = RNNTArgs(*inputs).reduction
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(output[1])


def _backward(ctx, g_out, _g_grad):
    if g_out is None:
        return grads(RNNTArgs)
    (g,) = ctx.saved_tensors
    if (
        ctx.reduction != "none"
        and type(g_out) is torch.Tensor  # not a fake/functional tensor of a tracer
        and g_out.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and float(g_out) == 1.0
    ):
        return grads(RNNTArgs, logits=g)  # loss.backward() of the loss itself: no second (B, T, U + 1, V) buffer
    if ctx.reduction == "none":
        return grads(RNNTArgs, logits=g * g_out.reshape(-1, 1, 1, 1).to(g.dtype))
    return grads(RNNTArgs, logits=g * g_out.to(g.dtype))


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


def joiner_index_tensors(targets, logit_lengths, target_lengths, B: int, device: torch.device):
    """``(targets (B, U), logit_lengths (B,), target_lengths (B,))`` as int64 tensors (a tensor or
    a sequence of integers each), on ``device`` or the CPU; ValueError naming the argument for a
    float/bool dtype, a wrong shape or another device. Their values are checked inside the op."""
    tg = checks.check_index_tensor(targets, "targets", (B, None), "(B, U)", device)
    il = checks.check_index_tensor(logit_lengths, "logit_lengths", (B,), "(B,)", device)
    tl = checks.check_index_tensor(target_lengths, "target_lengths", (B,), "(B,)", device)
    return tg, il, tl


class JoinerCriterion(Criterion):
    """The prologue's part shared by the losses on a joiner output ``(B, T, U + 1, V)`` (the RNN-T
    lattice, the duration lattices): the 4-D logits check, torchaudio's index tensors (``targets
    (B, U)``, ``logit_lengths (B,)``, ``target_lengths (B,)``), and every call scored by the
    family's own kernels (:attr:`picker`; ``impl`` ``""`` is the device's default, chosen inside
    the op)."""

    def check_emissions(self, emissions, name: str) -> Tuple[int, ...]:
        """``(B, T, U + 1, V)`` of the joiner logits ``emissions`` (named ``name``)."""
        return checks.check_joiner_logits(emissions, name)

    def own_kernel(self, device: torch.device, impl: Optional[str]) -> Optional[str]:
        """Always the family's kernels: ``impl``, or ``""`` for the device's default."""
        return impl or ""

    def index_tensors(self, targets, input_lengths, target_lengths, B: int, device: torch.device):
        """See :func:`joiner_index_tensors`."""
        return joiner_index_tensors(targets, input_lengths, target_lengths, B, device)


class RNNTCriterion(JoinerCriterion):
    """:func:`rnnt_loss` behind :func:`~lightning_gtn.core.criterion.apply_loss`: the blank
    resolved against ``V``, the options ``clamp``, ``fastemit_lambda``, ``fused_log_softmax`` and
    ``inplace_grad`` checked, the call scored by :func:`rnnt_loss_op` (or, with
    ``inplace_grad=True`` in eager mode, by the Function that writes the gradient into the
    logits' storage)."""

    kind = "rnnt"
    name = "rnnt_loss"
    backends = RNNT_IMPLS
    picker = RNNT_BACKENDS

    def check_options(self, C: int, blank, weights, device: torch.device):
        """``(blank in [0, V), None)``: see :func:`resolve_blank`."""
        return resolve_blank(blank, C), None

    def check_call_options(self, shape: Tuple[int, ...], options: Dict[str, object]) -> Dict[str, object]:
        """``clamp`` (a real number), ``fastemit_lambda`` (finite, ``>= 0``), ``fused_log_softmax``
        and ``inplace_grad`` (bools), checked in that order."""
        rest = dict(options)
        clamp = checks.check_real(rest.pop("clamp", -1.0), "clamp")
        lam = checks.check_real(rest.pop("fastemit_lambda", 0.0), "fastemit_lambda")
        if lam < 0:
            raise ValueError(f"fastemit_lambda must be >= 0, got {lam}")
        fused = checks.check_bool(rest.pop("fused_log_softmax", True), "fused_log_softmax")
        inplace = checks.check_bool(rest.pop("inplace_grad", False), "inplace_grad")
        super().check_call_options(shape, rest)
        return {"clamp": clamp, "fastemit_lambda": lam, "fused_log_softmax": bool(fused), "inplace_grad": bool(inplace)}

    def call_kernel(
        self,
        x,
        targets: Tensor,
        input_lengths: Tensor,
        target_lengths: Tensor,
        blank: int,
        reduction: str,
        zero_infinity: bool,
        impl: str,
        need_e: bool,
        options: Dict[str, object],
    ) -> Tensor:
        """:func:`rnnt_loss_op`; with ``inplace_grad`` and a gradient to compute in eager mode,
        :class:`_RNNTInplace` on ``x`` itself: the caller's logits, since the prologue's cast is
        the identity for float32/float64, the only dtypes :func:`rnnt_loss` lets through
        (:func:`_check_inplace`)."""
        clamp = float(options["clamp"])  # type: ignore[arg-type]
        lam = float(options["fastemit_lambda"])  # type: ignore[arg-type]
        fused = bool(options["fused_log_softmax"])
        if options["inplace_grad"] and need_e and not torch.compiler.is_compiling():
            opts = (blank, clamp, reduction, fused, zero_infinity, lam, impl)
            return _RNNTInplace.apply(x, targets, input_lengths, target_lengths, opts)
        args = RNNTArgs(
            logits=x,
            targets=targets,
            logit_lengths=input_lengths,
            target_lengths=target_lengths,
            blank=blank,
            clamp=clamp,
            reduction=reduction,
            fused_log_softmax=fused,
            zero_infinity=zero_infinity,
            fastemit_lambda=lam,
            impl=impl,
            need_grad=need_e,
        )
        return rnnt_loss_op(*args)[0]


#: the criterion of :func:`rnnt_loss`
RNNT = RNNTCriterion()


def _check_inplace(logits) -> None:
    """ValueError unless ``logits`` (when it is a tensor whose gradient this call computes in
    eager mode) is contiguous float32/float64: ``inplace_grad=True`` writes into its storage.
    Checked on the caller's logits, before the prologue casts other dtypes to float32."""
    if not isinstance(logits, Tensor) or not (torch.is_grad_enabled() and logits.requires_grad):
        return
    if torch.compiler.is_compiling():
        return
    if logits.dtype not in (torch.float32, torch.float64) or not logits.is_contiguous():
        raise ValueError(
            f"inplace_grad=True needs contiguous float32/float64 logits, got {logits.dtype}"
            f"{'' if logits.is_contiguous() else ' (not contiguous)'}"
        )


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
        impl: None (numba on the CPU; Triton on a CUDA device where triton is installed and its
            kernels pass a self-check, else torch), ``"numba"`` (CPU only), ``"torch"`` (plain
            torch ops and autograd; any device; the reference) or ``"triton"`` (CUDA tensors, or
            CPU tensors under ``TRITON_INTERPRET=1``; ValueError elsewhere).
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
    if isinstance(inplace_grad, (bool, np.bool_)) and inplace_grad:
        _check_inplace(logits)  # on the caller's logits, before the prologue casts float16/bfloat16
    return criterion.apply_loss(
        RNNT,
        logits,
        targets,
        logit_lengths,
        target_lengths,
        blank=blank,
        reduction=reduction,
        zero_infinity=zero_infinity,
        impl=impl,
        name="logits",
        clamp=clamp,
        fastemit_lambda=fastemit_lambda,
        fused_log_softmax=fused_log_softmax,
        inplace_grad=inplace_grad,
    )
