"""The losses and the best-path search as ``torch.library`` custom ops, and the one prologue
every loss goes through (:func:`apply_loss`).

Dynamo does not look inside a custom op: it sees one call with a fake implementation that
only gives output shapes, so a model step with a loss of this library compiles with
``torch.compile(..., fullgraph=True)``. Everything data-dependent (reading the targets,
building and caching criterion graphs, the range checks, the dynamic programme) happens in
the real implementation, which runs eagerly.

The loss op computes the gradients in its forward (the fused CPU kernel gets them in the
same pass): ``d out / d emissions`` and, for learned arc weights (ASG's transitions),
``d out / d weights``, with the reduction applied inside the op. Its registered backward only
scales them by the incoming gradient. With ``reduction="none"`` and learned weights the
weight gradient depends on the incoming per-example gradient, so the backward calls a second
op that recomputes it.

A criterion with its own kernel (:attr:`Criterion.kernels`, CTC's ``"numba_ctc"``) skips the
plan: :func:`apply_loss` asks it (:meth:`Criterion.own_kernel`) whether its kernel scores the
call, and if so calls the leaner custom op ``lightning_gtn::kernel_loss``
(:func:`kernel_loss_op`), whose implementation hands the arguments to
:meth:`Criterion.kernel_loss`: no criterion graphs, no graph cache, the loss's own checks.

A criterion is named by ``kind`` (``"ctc"``, ``"asg"``, ``"seq"``) or, for criteria held by
an object (a user's graph builder), by ``kind="handle"`` and the integer ``handle`` of
:func:`register_criterion`.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from ..opargs import grads, op_schema
from . import checks
from .cache import HandleRegistry
from .checks import as_lengths, split_targets
from .impl import Backends
from .reduction import reduce_losses, reduction_coefficients
from .scoring import Plan, graph_weights, pick_impl, score

__all__ = [
    "Criterion",
    "register_criterion",
    "loss_op",
    "kernel_loss_op",
    "CRITERIA",
    "NATIVE_BACKENDS",
    "apply_loss",
    "structured_loss",
]

#: the implementations of this library (``impl=`` names); ``"gtn"`` (the real ``gtn`` package)
#: is offered by the criteria that list it in :attr:`Criterion.backends`
NATIVE_BACKENDS = checks.NATIVE_BACKENDS


class Criterion:
    """How a loss turns targets into a :class:`~.scoring.Plan` and scores it.

    Subclasses implement :meth:`plan`; criteria with learned arc weights (``transitions``) also
    return the index of each arc's weight in the flattened weight tensor.

    Attributes:
        kind: the name the custom op finds a built-in criterion by (its key in
            :data:`CRITERIA`); ``"handle"`` for criteria named by :func:`register_criterion`.
        handle: the integer of :func:`register_criterion` (``kind="handle"`` only).
        backends: the ``impl=`` values offered besides None (the device's default); ``"gtn"``
            among them means :meth:`gtn_losses` is implemented.
        name: how messages name the loss (``"ctc_loss"``).
    """

    kind: str = "handle"
    handle: int = 0
    backends: Tuple[str, ...] = NATIVE_BACKENDS
    name: str = "this loss"
    #: the ``impl=`` names of the criterion's own kernels (each also in :attr:`backends` and in
    #: :data:`lightning_gtn.core.checks.KERNEL_BACKENDS`); empty: every call is planned
    kernels: Tuple[str, ...] = ()
    #: the ``reduction=`` values the loss takes
    reductions: Tuple[str, ...] = checks.REDUCTIONS
    #: the picker of the criterion's own kernels (:class:`~.impl.Backends`), when they form a
    #: family of their own (the RNN-T lattices, k2's recursion, the MMI denominator); None: the
    #: graph kernels' (:data:`~.scoring.GRAPH_BACKENDS`) or the ``kernels`` named above
    picker: Optional[Backends] = None

    def check_emissions(self, emissions, name: str) -> Tuple[int, ...]:
        """The shape of the scored input, checked: ``(B, T, C)`` float emissions by default
        (named ``name`` in messages). A criterion whose input is another tensor (the RNN-T
        joiner's ``(B, T, U + 1, V)``) or a tuple of tensors (k2's ``(px, py)``) checks that;
        the first entry is ``B`` and the last the class count passed to :meth:`check_options`."""
        return checks.check_emissions(emissions, name)

    def check_call_options(self, shape: Tuple[int, ...], options: Dict[str, object]) -> Dict[str, object]:
        """The loss's keyword options beyond the common ones (``clamp``, ``fastemit_lambda``,
        ``durations``, ...), checked against the input's ``shape``; returned as the criterion's
        :meth:`call_kernel` takes them. By default a criterion takes none (TypeError)."""
        if options:
            raise TypeError(f"{self.name}: unexpected options {sorted(options)}")
        return options

    def index_tensors(self, targets, input_lengths, target_lengths, B: int, device: torch.device):
        """``(targets, input_lengths, target_lengths)`` as the op takes them: the targets as one
        padded int64 tensor (a list of sequences and torch's concatenated form are accepted),
        the lengths as int64 tensors; values are checked inside the op."""
        tg, tl = checks.targets_tensors(targets, target_lengths, B, device)
        return tg, checks.int_tensor(input_lengths, "input_lengths"), tl

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
        """The loss of a call that :meth:`own_kernel` gave to ``impl``: ``x`` is the input in its
        compute dtype. By default the custom op ``lightning_gtn::kernel_loss``
        (:func:`kernel_loss_op`, which calls :meth:`kernel_loss`); a criterion whose kernels
        take more arguments calls its own custom op here."""
        args = KernelLossArgs(
            emissions=x,
            targets=targets,
            input_lengths=input_lengths,
            target_lengths=target_lengths,
            kind=self.kind,
            handle=int(self.handle),
            blank=int(blank),
            reduction=reduction,
            zero_infinity=bool(zero_infinity),
            impl=impl,
            need_e=need_e,
        )
        return kernel_loss_op(*args)[0]

    def own_kernel(self, device: torch.device, impl: Optional[str]) -> Optional[str]:
        """The own kernel (one of :attr:`kernels`) that scores a call with ``impl`` (already
        checked against :attr:`backends`; None: the device's default) on ``device``, or None:
        the call is planned and scored by the graph kernels. A criterion may raise ValueError
        for a kernel that cannot run on ``device``. Called by :func:`apply_loss`."""
        return None

    def kernel_loss(
        self,
        emissions: Tensor,
        targets: Tensor,
        input_lengths: Tensor,
        target_lengths: Tensor,
        blank: int,
        reduction: str,
        zero_infinity: bool,
        impl: str,
        need_e: bool,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """``(out, d out / d emissions or None)`` computed by the own kernel ``impl``, with the
        reduction applied: ``out`` is ``(B,)`` for ``reduction="none"`` (the gradient then per
        row), else a scalar, in the emissions' (compute) dtype. Runs inside
        :func:`kernel_loss_op`, which passes the arguments as it got them: the targets and
        lengths are int64 tensors whose values are not checked yet (the criterion checks them,
        and everything its kernel indexes, before the kernel runs)."""
        raise ValueError(f"{self.name}: no kernel of its own ({impl!r})")

    def forbidden_label(self, blank: int) -> Optional[int]:
        """The label the targets must not contain (CTC's blank), or None."""
        return None

    def target_classes(self, C: int) -> int:
        """Targets must lie in ``[0, target_classes(C))``: the emission classes by default
        (the transducer's targets are graphemes, not emission classes)."""
        return C

    def check_backend(self, impl, device: Optional[torch.device] = None) -> Optional[str]:
        """``impl`` when it is None or one of :attr:`backends`, else ValueError. With a
        :attr:`picker`, an explicit ``impl`` is checked by it for tensors on ``device`` (a name not
        offered, numba off the CPU, Triton where it cannot run)."""
        if self.picker is not None:
            if impl is not None:
                self.picker.pick(device if device is not None else torch.device("cpu"), impl, self.name)
            return impl
        if impl not in checks.IMPLS:
            raise ValueError(f"impl must be one of {checks.IMPLS}, got {impl!r}")
        if impl is not None and impl not in self.backends:
            offered = ", ".join(["None"] + [repr(b) for b in self.backends])
            raise ValueError(f"{self.name}: impl={impl!r} is not available (not offered here); use {offered}")
        return impl

    def check_options(self, C: int, blank, weights, device: torch.device):
        """Checks the loss's own options against the emissions' ``C`` and device; returns
        ``(blank, weights)`` as the op takes them (``blank`` an int). Called by
        :func:`apply_loss` after the common checks."""
        return int(blank), weights

    def prepare(self, x: Tensor, weights, blank: int, impl: Optional[str]):
        """``(criterion the op runs, emissions, weights)`` for emissions ``x`` already in their
        compute dtype: by default this criterion, ``x`` and the weights in ``x``'s dtype. A
        criterion may hand the op augmented emissions or another criterion (STC)."""
        return self, x, (None if weights is None else weights.to(x.dtype))

    def gtn_losses(
        self, emissions: Tensor, weights, seqs: List[List[int]], lengths: np.ndarray, blank: int, zero_infinity: bool
    ) -> Tensor:
        """``(B,)`` losses computed by the real ``gtn`` package (``impl="gtn"``, for the
        criteria that list ``"gtn"`` in :attr:`backends`)."""
        raise ValueError(f"{self.name}: impl='gtn' is not available")

    def plan(self, seqs: List[List[int]], lengths: np.ndarray, C: int, blank: int) -> Tuple[Plan, Optional[np.ndarray]]:
        """The plan for a batch of targets: one criterion graph per example.

        Args:
            seqs: the ``B`` target sequences (label ids).
            lengths: ``(B,)`` int64 input lengths (frames).
            C: the number of emission classes.
            blank: the blank label, or -1 when there is none.

        Returns:
            ``(plan, widx)``: ``widx`` is ``(num_arcs,)`` int64, the index of each arc's weight in
            the flattened weight tensor, or None when the arcs carry their own (fixed) weights.
        """
        raise NotImplementedError

    def score(
        self,
        E: Tensor,
        weights: Optional[Tensor],
        seqs,
        lengths,
        blank: int,
        impl: str,
        zero_infinity: bool,
        need_e: bool,
        w_coef: Optional[Tensor],
    ):
        """``(losses (B,), grad_E (B, T, C) or None, grad_weights or None)``, see
        :func:`~.scoring.score` for the meaning of ``need_e`` and ``w_coef``."""
        C = E.shape[2]
        plan, widx = self.plan(seqs, lengths, C, blank)
        if widx is None:
            w = graph_weights(plan, E)
        else:
            if weights is None:
                raise ValueError("this criterion needs its weights (transitions)")
            w = weights.reshape(-1)[torch.from_numpy(widx).to(E.device)]
        losses, gE, gw = score(plan, E, w, impl, zero_infinity, need_e, w_coef)
        gW = None
        if gw is not None and widx is not None and weights is not None:  # widx implies weights (checked above)
            gW = torch.zeros(weights.numel(), dtype=E.dtype, device=E.device)
            gW = gW.index_add_(0, torch.from_numpy(widx).to(E.device), gw).reshape(weights.shape)
        return losses, gE, gW


# the built-in criteria fill this in (ctc.py, asg.py, seq.py)
CRITERIA: Dict[str, Criterion] = {}

_HANDLES: HandleRegistry[Criterion] = HandleRegistry("criterion")


def register_criterion(obj: Criterion) -> int:
    """An integer handle for a criterion object (held weakly), to pass to :func:`loss_op`;
    also stored as ``obj.handle`` with ``obj.kind = "handle"`` (what :func:`apply_loss`
    reads)."""
    h = _HANDLES.register(obj)
    try:
        obj.kind, obj.handle = "handle", h
    except AttributeError:  # pragma: no cover - objects without a __dict__ still get a handle
        pass
    return h


def _criterion(kind: str, handle: int) -> Criterion:
    if kind == "handle":
        return _HANDLES.get(handle)
    crit = CRITERIA.get(kind)
    if crit is None:
        raise ValueError(f"unknown criterion kind {kind!r}")
    return crit


def _empty(like: Tensor) -> Tensor:
    return like.new_empty(0)


class LossArgs(NamedTuple):
    """The arguments of ``lightning_gtn::structured_loss`` (:func:`loss_op`)."""

    emissions: Tensor
    weights: Optional[Tensor]
    targets: Tensor
    input_lengths: Tensor
    target_lengths: Tensor
    kind: str
    blank: int
    handle: int
    reduction: str
    zero_infinity: bool
    impl: str
    need_e: bool
    need_w: bool


class WeightGradArgs(NamedTuple):
    """The arguments of ``lightning_gtn::structured_loss_weight_grad`` (:func:`weight_grad_op`)."""

    emissions: Tensor
    weights: Tensor
    targets: Tensor
    input_lengths: Tensor
    target_lengths: Tensor
    kind: str
    blank: int
    handle: int
    zero_infinity: bool
    impl: str
    coef: Tensor


@torch.library.custom_op("lightning_gtn::structured_loss", mutates_args=())
@op_schema(LossArgs)
def loss_op(
    emissions: Tensor,
    weights: Optional[Tensor],
    targets: Tensor,
    input_lengths: Tensor,
    target_lengths: Tensor,
    kind: str,
    blank: int,
    handle: int,
    reduction: str,
    zero_infinity: bool,
    impl: str,
    need_e: bool,
    need_w: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out, d out / d emissions, d out / d weights)``; ``out`` is ``(B,)`` for
    ``reduction="none"`` (then the emission gradient is per row and no weight gradient is
    returned), else a scalar. Unrequested gradients are empty tensors."""
    B, T, C = emissions.shape
    crit = _criterion(kind, handle)
    lengths = as_lengths(input_lengths, B, "input_lengths", emissions.device, max_value=T)
    seqs = split_targets(
        targets, target_lengths, B, emissions.device, crit.target_classes(C), blank=crit.forbidden_label(blank)
    )
    tlen = np.asarray([len(s) for s in seqs], dtype=np.int64)
    out, gE, gW = run_loss(
        crit,
        emissions,
        weights,
        seqs,
        lengths,
        tlen,
        blank,
        reduction,
        zero_infinity,
        pick_impl(emissions, impl or None),
        need_e,
        need_w,
    )
    return (out, gE if gE is not None else _empty(emissions), gW if gW is not None else _empty(emissions))


def nan_rows(E: Tensor, weights: Optional[Tensor], lengths: np.ndarray) -> Optional[Tensor]:
    """``(B,)`` bool: the rows whose loss reads a NaN (an emission within the row's length, or
    any weight: learned weights such as ASG's transitions are read by every row's normaliser);
    None when nothing is NaN (checked by one sum first, so the common case costs one pass).

    The kernels take the largest of their candidates, and ``max`` drops NaN; a NaN in must
    give a NaN out, never a finite or infinite loss (which ``zero_infinity`` would then hide)."""
    B, T = E.shape[0], E.shape[1]
    w_nan = weights is not None and weights.numel() > 0 and bool(torch.isnan(weights).any())
    if not w_nan and not bool(torch.isnan(E.sum())):
        return None
    if w_nan:
        return torch.ones(B, dtype=torch.bool, device=E.device)
    valid = torch.arange(T, device=E.device).reshape(1, T) < torch.as_tensor(
        np.asarray(lengths, dtype=np.int64), device=E.device
    ).reshape(B, 1)
    rows = (torch.isnan(E).any(2) & valid).any(1)
    return rows if bool(rows.any()) else None


def _poison(rows: Optional[Tensor], losses: Tensor, gE: Optional[Tensor], gW: Optional[Tensor]):
    """NaN losses and gradients for ``rows`` (see :func:`nan_rows`)."""
    if rows is None:
        return losses, gE, gW
    losses = losses.masked_fill(rows, float("nan"))
    if gE is not None:
        gE[rows] = float("nan")
    if gW is not None:
        gW.fill_(float("nan"))
    return losses, gE, gW


def run_loss(
    crit: Criterion,
    E: Tensor,
    weights: Optional[Tensor],
    seqs,
    lengths: np.ndarray,
    divisors: Optional[np.ndarray],
    blank: int,
    reduction: str,
    zero_infinity: bool,
    impl: str,
    need_e: bool,
    need_w: bool,
):
    """``(out, d out / d E, d out / d weights)`` with the reduction applied inside.

    ``divisors`` are the per-example target lengths that ``"mean"`` divides by (None: plain
    batch mean). For ``"none"`` the emission gradient is per row and no weight gradient is
    formed (it depends on the incoming per-row gradient: see :func:`weight_grad_op`).
    """
    B = E.shape[0]
    r = None
    if reduction != "none":
        d = None if divisors is None else np.asarray(divisors, dtype=np.int64)
        r = reduction_coefficients(reduction, B, d, dtype=E.dtype, device=E.device)
    w_coef = r if (need_w and r is not None) else None
    losses, gE, gW = crit.score(E, weights, seqs, lengths, blank, impl, zero_infinity, need_e, w_coef)
    losses, gE, gW = _poison(nan_rows(E, weights, lengths), losses, gE, gW)
    if r is None:
        return losses, gE, None
    if gE is not None and reduction != "sum":  # "sum": all coefficients are 1
        gE.mul_(r.reshape(-1, 1, 1))  # a fresh buffer of the scoring: scaled in place (peak memory)
    return (losses * r).sum(), gE, gW


@loss_op.register_fake
def _loss_fake(*inputs):
    a = LossArgs(*inputs)
    emissions, weights = a.emissions, a.weights
    B = emissions.shape[0]
    out = emissions.new_empty((B,) if a.reduction == "none" else ())
    gE = torch.empty_like(emissions) if a.need_e else emissions.new_empty(0)
    gW = (
        weights.new_empty(weights.shape)
        if (a.need_w and weights is not None and a.reduction != "none")
        else emissions.new_empty(0)
    )
    return out, gE, gW


class KernelLossArgs(NamedTuple):
    """The arguments of ``lightning_gtn::kernel_loss`` (:func:`kernel_loss_op`)."""

    emissions: Tensor
    targets: Tensor
    input_lengths: Tensor
    target_lengths: Tensor
    kind: str
    handle: int
    blank: int
    reduction: str
    zero_infinity: bool
    impl: str
    need_e: bool


# The op of the criteria with their own kernel is declared with the low-level ``torch.library``
# API: a schema, one implementation for every backend, a fake, and an autograd kernel written as
# an autograd.Function. ``torch.library.custom_op`` would give the same op, but its Python
# layers (argument defaults filled per call, a dynamo-disabled wrapper, a generic autograd
# Function) cost about as much as a small batch's whole loss.
_LIB = torch.library.Library("lightning_gtn", "FRAGMENT")
_LIB.define(
    "kernel_loss(Tensor emissions, Tensor targets, Tensor input_lengths, Tensor target_lengths, str kind, "
    "int handle, int blank, str reduction, bool zero_infinity, str impl, bool need_e) -> (Tensor, Tensor)"
)


@op_schema(KernelLossArgs)
def _kernel_loss_impl(
    emissions: Tensor,
    targets: Tensor,
    input_lengths: Tensor,
    target_lengths: Tensor,
    kind: str,
    handle: int,
    blank: int,
    reduction: str,
    zero_infinity: bool,
    impl: str,
    need_e: bool,
) -> Tuple[Tensor, Tensor]:
    """``(out, d out / d emissions)`` of a criterion with its own kernel ``impl``
    (:meth:`Criterion.kernel_loss`): ``out`` is ``(B,)`` for ``reduction="none"`` (then the
    gradient is per row), else a scalar; the gradient is an empty tensor unless ``need_e``."""
    crit = _criterion(kind, handle)
    if impl not in crit.kernels:
        raise ValueError(f"{crit.name}: impl={impl!r} is not one of its own kernels {crit.kernels}")
    checks.check_reduction(reduction)
    out, gE = crit.kernel_loss(
        emissions, targets, input_lengths, target_lengths, int(blank), reduction, bool(zero_infinity), impl, need_e
    )
    return out, (gE if (need_e and gE is not None) else _empty(emissions))


_LIB.impl("kernel_loss", _kernel_loss_impl, "CompositeExplicitAutograd")


@torch.library.register_fake("lightning_gtn::kernel_loss")
def _kernel_loss_fake(*inputs):
    a = KernelLossArgs(*inputs)
    out = a.emissions.new_empty((a.emissions.shape[0],) if a.reduction == "none" else ())
    return out, (torch.empty_like(a.emissions) if a.need_e else a.emissions.new_empty(0))


#: ``lightning_gtn::kernel_loss``: the custom op behind :meth:`Criterion.kernel_loss` (see
#: :func:`_kernel_loss_impl` for its arguments and outputs)
kernel_loss_op = torch.ops.lightning_gtn.kernel_loss.default


class _KernelLossFunction(torch.autograd.Function):
    """The op's autograd kernel: the forward gives the gradient too; the backward scales it."""

    @staticmethod
    def forward(ctx, *inputs):
        with torch._C._AutoDispatchBelowAutograd():
            out, gE = kernel_loss_op(*inputs)
        ctx.reduction = KernelLossArgs(*inputs).reduction
        ctx.mark_non_differentiable(gE)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(gE)
        return out, gE

    @staticmethod
    def backward(ctx, g_out, _g_ge):
        gE = None
        if g_out is not None and KernelLossArgs(*ctx.needs_input_grad).emissions:
            (gE_s,) = ctx.saved_tensors
            if gE_s.dim() == 1:
                raise RuntimeError("lightning_gtn::kernel_loss: a backward through a call with need_e=False")
            if _is_one(g_out):  # loss.backward(): the saved gradient as it is (no pass, no copy)
                return grads(KernelLossArgs, emissions=gE_s)
            g = g_out.to(gE_s.dtype)
            gE = gE_s * (g.reshape((-1,) + (1,) * (gE_s.dim() - 1)) if ctx.reduction == "none" else g)
        return grads(KernelLossArgs, emissions=gE)


def _is_one(g: Tensor) -> bool:
    """Whether ``g`` is a plain CPU scalar tensor equal to 1, read on the host. Never while
    anything traces the backward (compiling, fake or functional tensors, a dispatch mode), where
    the value is not known: the gradient is then scaled as usual."""
    return (
        type(g) is torch.Tensor
        and g.dim() == 0
        and g.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and torch._C._len_torch_dispatch_stack() == 0
        and bool(g == 1)
    )


def _kernel_loss_autograd(*args):
    return _KernelLossFunction.apply(*args)


_LIB.impl("kernel_loss", _kernel_loss_autograd, "Autograd")


@torch.library.custom_op("lightning_gtn::structured_loss_weight_grad", mutates_args=())
@op_schema(WeightGradArgs)
def weight_grad_op(
    emissions: Tensor,
    weights: Tensor,
    targets: Tensor,
    input_lengths: Tensor,
    target_lengths: Tensor,
    kind: str,
    blank: int,
    handle: int,
    zero_infinity: bool,
    impl: str,
    coef: Tensor,
) -> Tensor:
    """``sum_b coef[b] * d loss[b] / d weights`` (recomputed; the backward of
    ``reduction="none"`` losses with learned weights)."""
    B, T, C = emissions.shape
    crit = _criterion(kind, handle)
    lengths = as_lengths(input_lengths, B, "input_lengths", emissions.device, max_value=T)
    seqs = split_targets(
        targets, target_lengths, B, emissions.device, crit.target_classes(C), blank=crit.forbidden_label(blank)
    )
    impl = pick_impl(emissions, impl or None)
    _, _, gW = crit.score(
        emissions,
        weights,
        seqs,
        lengths,
        blank,
        impl,
        zero_infinity,
        False,
        coef.to(device=emissions.device, dtype=emissions.dtype),
    )
    rows = nan_rows(emissions, weights, lengths)
    if rows is not None and gW is not None:
        gW = gW.clone().fill_(float("nan"))
    return gW


@weight_grad_op.register_fake
def _weight_grad_fake(*inputs):
    w = WeightGradArgs(*inputs).weights
    return w.new_empty(w.shape)


def _loss_setup(ctx, inputs, output):
    a = LossArgs(*inputs)
    ctx.reduction = a.reduction
    ctx.need_e, ctx.need_w = a.need_e, a.need_w
    # the options by name; the tensors the weight gradient needs are saved
    ctx.kind, ctx.blank, ctx.handle, ctx.zero_infinity, ctx.impl = a.kind, a.blank, a.handle, a.zero_infinity, a.impl
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.set_materialize_grads(False)  # no zero (B, T, C) gradient for the unused gradient outputs
    if a.reduction == "none" and a.need_w:
        ctx.save_for_backward(
            output[1], output[2], a.emissions, a.weights, a.targets, a.input_lengths, a.target_lengths
        )
    else:
        ctx.save_for_backward(output[1], output[2])


def _loss_backward(ctx, g_out, _g_ge, _g_gw):
    saved = ctx.saved_tensors
    if g_out is None:
        return grads(LossArgs)
    gE_s, gW_s = saved[0], saved[1]
    gE = gW = None
    if ctx.reduction == "none":
        if ctx.need_e:
            gE = gE_s * g_out.reshape(-1, 1, 1).to(gE_s.dtype)
        if ctx.need_w:
            emissions, weights, targets, input_lengths, target_lengths = saved[2:]
            args = WeightGradArgs(
                emissions=emissions,
                weights=weights,
                targets=targets,
                input_lengths=input_lengths,
                target_lengths=target_lengths,
                kind=ctx.kind,
                blank=ctx.blank,
                handle=ctx.handle,
                zero_infinity=ctx.zero_infinity,
                impl=ctx.impl,
                coef=g_out,
            )
            gW = weight_grad_op(*args)
    else:
        if ctx.need_e:
            gE = gE_s * g_out.to(gE_s.dtype)
        if ctx.need_w:
            gW = gW_s * g_out.to(gW_s.dtype)
    return grads(LossArgs, emissions=gE, weights=gW)


loss_op.register_autograd(_loss_backward, setup_context=_loss_setup)


def apply_loss(
    crit: Criterion,
    emissions,
    targets,
    input_lengths,
    target_lengths,
    *,
    weights=None,
    blank=0,
    reduction: str = "mean",
    zero_infinity: bool = False,
    impl: Optional[str] = None,
    name: str = "emissions",
    **options,
) -> Tensor:
    """The prologue of every loss: checks and converts the arguments once, then scores.

    In order: the input (:meth:`Criterion.check_emissions`: ``(B, T, C)`` float emissions by
    default, named ``name`` in messages), ``reduction`` (one of :attr:`Criterion.reductions`),
    ``zero_infinity``, ``impl`` (:meth:`Criterion.check_backend`: against the criterion's
    backends or its :attr:`Criterion.picker`), the loss's options
    (:meth:`Criterion.check_options` for the blank and learned weights, then
    :meth:`Criterion.check_call_options` for the keyword ``options``). A criterion whose own
    kernel scores the call (:meth:`Criterion.own_kernel`) goes to :meth:`Criterion.call_kernel`
    (targets and lengths as int64 tensors, :meth:`Criterion.index_tensors`; the input in its
    compute dtype). Otherwise ``impl="gtn"`` goes to :meth:`Criterion.gtn_losses` (targets and
    lengths read on the host, reduced here); every other ``impl`` calls :func:`loss_op` with
    the targets as one padded int64 tensor and the lengths as int64 tensors (their values are
    checked inside the op, where ``torch.compile`` does not look), the emissions cast once to
    their compute dtype (:meth:`Criterion.prepare` may augment them), the result cast back once.

    Returns:
        The loss in the input's dtype: ``(B,)`` for ``reduction="none"``, else a scalar.
    """
    shape = crit.check_emissions(emissions, name)
    B, C = shape[0], shape[-1]
    checks.check_reduction(reduction, crit.reductions)
    checks.check_bool(zero_infinity, "zero_infinity")
    first = emissions[0] if isinstance(emissions, tuple) else emissions
    dev = first.device
    impl = crit.check_backend(impl, dev)
    blank, weights = crit.check_options(C, blank, weights, dev)
    options = crit.check_call_options(shape, options)
    own = crit.own_kernel(dev, impl)
    if own is not None:  # the criterion's own kernel: no plan, no graphs
        tg, il, tl = crit.index_tensors(targets, input_lengths, target_lengths, B, dev)
        if isinstance(emissions, tuple):
            x = tuple(e.to(checks.compute_dtype(e)) for e in emissions)
            need_e = torch.is_grad_enabled() and any(e.requires_grad for e in x)
        else:
            x = emissions.to(checks.compute_dtype(emissions))
            need_e = torch.is_grad_enabled() and x.requires_grad
        out = crit.call_kernel(x, tg, il, tl, int(blank), reduction, bool(zero_infinity), own, bool(need_e), options)
        return out.to(first.dtype)
    T = shape[1]
    if impl == "gtn":
        lengths = as_lengths(input_lengths, B, "input_lengths", dev, max_value=T)
        seqs = split_targets(targets, target_lengths, B, dev, crit.target_classes(C), blank=crit.forbidden_label(blank))
        losses = crit.gtn_losses(emissions, weights, seqs, lengths, blank, zero_infinity)
        return reduce_losses(losses, reduction, np.asarray([len(s) for s in seqs]))
    tg, il, tl = crit.index_tensors(targets, input_lengths, target_lengths, B, dev)
    run, x, w = crit.prepare(emissions.to(checks.compute_dtype(emissions)), weights, blank, impl)
    out = _call_loss_op(run, x, w, tg, il, tl, blank, reduction, zero_infinity, impl)
    return out.to(emissions.dtype)


def _call_loss_op(crit: "Criterion | _OpName", x, w, tg, il, tl, blank, reduction, zero_infinity, impl) -> Tensor:
    """:func:`loss_op` on emissions ``x`` and weights ``w`` already in the compute dtype."""
    grad = torch.is_grad_enabled()
    need_e = bool(grad and x.requires_grad)
    need_w = bool(grad and w is not None and w.requires_grad)
    args = LossArgs(
        emissions=x,
        weights=w,
        targets=tg,
        input_lengths=il,
        target_lengths=tl,
        kind=crit.kind,
        blank=int(blank),
        handle=int(crit.handle),
        reduction=reduction,
        zero_infinity=bool(zero_infinity),
        impl=impl or "",
        need_e=need_e,
        need_w=need_w,
    )
    out, _, _ = loss_op(*args)
    return out


def structured_loss(
    emissions: Tensor,
    weights: Optional[Tensor],
    targets: Tensor,
    input_lengths: Tensor,
    target_lengths: Tensor,
    *,
    kind: str,
    blank: int = 0,
    handle: int = 0,
    reduction: str = "mean",
    zero_infinity: bool = False,
    impl: Optional[str] = None,
) -> Tensor:
    """Calls :func:`loss_op` with the emissions in their compute dtype; returns the loss in
    the emissions' dtype. Arguments are checked by the caller (the losses use
    :func:`apply_loss`, which checks them; this is the bare call for criteria named by
    ``kind``/``handle``)."""
    dtype = checks.compute_dtype(emissions)
    x = emissions.to(dtype)
    w = None if weights is None else weights.to(dtype)
    _criterion(kind, handle)  # an unknown kind or a dead handle is an error here, before the op
    crit = _OpName(kind, handle)
    return _call_loss_op(crit, x, w, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, impl).to(
        emissions.dtype
    )


class _OpName:
    """What :func:`_call_loss_op` reads of a criterion: the ``kind`` and ``handle`` that name it."""

    def __init__(self, kind: str, handle: int) -> None:
        self.kind = str(kind)
        self.handle = int(handle)
