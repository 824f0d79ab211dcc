"""The seam between RNN-T losses and transducer networks.

A transducer network (the encoder, a prediction network and a joiner; the Lightning layer's
``TransducerModel`` is one) offers these methods, which the losses and decoders call by name
(a duck-typed protocol: nothing here imports the network's class):

* ``encode(inputs (B, T, F), input_lengths (B,)) -> (enc (B, T', J), enc_lengths (B,))``: the
  acoustic frames, already projected to the joiner's dimension ``J``;
* ``predict(tokens (N, S) int64, state=None) -> (pred (N, S, J), state)``: the prediction
  network over label histories. For training, ``tokens`` is the targets with the blank put in
  front (``(B, U + 1)``, the start symbol is the blank, as icefall and torchaudio do); for
  decoding, ``S = 1`` and ``state`` carries the history (``None`` is the empty history);
* ``select_state(state, index (M,) int64) -> state``: the states of the chosen hypotheses;
* ``join(enc (..., J), pred (..., J)) -> logits (..., V)``: the joiner, broadcasting over the
  leading dimensions (``enc[:, :, None]`` and ``pred[:, None]`` give ``(B, T, U + 1, V)``);
* ``simple_am(enc (B, T, J)) -> (B, T, V)`` and ``simple_lm(pred (B, U + 1, J)) -> (B, U + 1, V)``:
  the linear projections of k2's "simple" loss (only the pruned loss calls them);
* ``joiner_parameters() -> (weight (V, J), bias (V,))``: the output layer of a joiner
  ``Linear(tanh(enc + pred))`` (only :class:`RNNTJoinerLoss` calls it).

Each loss declares in ``network_methods`` the methods training and decoding call: ``encode``
(the frames), ``predict``, ``select_state`` and ``join`` (:meth:`RNNTStructuredLoss.joint_loss`
and the transducer decoders), the pruned loss ``simple_am`` and ``simple_lm``, the joiner loss
``joiner_parameters``, so a network needs only what its loss uses.

Every RNN-T loss module derives from :class:`RNNTStructuredLoss`: it is called like torchaudio's
``RNNTLoss`` on joiner outputs, and :meth:`RNNTStructuredLoss.joint_loss` computes the loss from a
network and encoder frames (the pruned loss overrides it to avoid the full ``(B, T, U + 1, V)``
lattice; :class:`RNNTLoss` scores a network offering ``joiner_parameters`` by chunks, with
:func:`lightning_gtn.functional.rnnt_joiner_loss`, unless built with ``joiner="materialised"``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional, Tuple

import torch

from .. import functional as lgf  # not torch.nn.functional: the library's own losses
from ..core import checks
from .losses import Decoding, StructuredLoss

__all__ = [
    "RNNTStructuredLoss",
    "RNNTLoss",
    "RNNTJoinerLoss",
    "JOINER_NETWORK_METHODS",
    "JOINER_PATHS",
    "prepend_blank",
    "MAX_JOINER_VALUES",
    "NETWORK_METHODS",
    "check_joiner_size",
    "check_joiner_path",
    "score_joiner",
]

#: how :meth:`RNNTLoss.joint_loss` scores a network's joiner: ``"chunked"`` (the default) with
#: :func:`lightning_gtn.functional.rnnt_joiner_loss` when the network offers ``joiner_parameters``
#: (else as ``"materialised"``), ``"materialised"`` with ``rnnt_loss`` of the whole
#: ``(B, T, U + 1, V)`` joiner output
JOINER_PATHS: Tuple[str, ...] = ("chunked", "materialised")

#: The methods of a transducer network that training and decoding call whatever the loss:
#: ``encode`` (the frames), ``predict``, ``select_state`` and ``join`` (the joint loss and the
#: transducer decoders).
NETWORK_METHODS: Tuple[str, ...] = ("encode", "predict", "select_state", "join")

#: values a joiner may compute for one batch in :meth:`RNNTStructuredLoss.joint_loss`:
#: ``B * T * (U + 1) * (J + V)`` for the full lattice (its hidden ``(B, T, U + 1, J)`` and its
#: logits ``(B, T, U + 1, V)``), ``B * T * s_range * (J + V)`` for the pruned one (2^31 values are
#: 8 GiB of float32, a few times that with their gradients: B=32, T=250, U=80, J=512, V=500 is a
#: third of it)
MAX_JOINER_VALUES = 1 << 31


def check_joiner_size(B: int, T: int, U1: int, J: int, V: Optional[int], u1_name: str = "U + 1") -> None:
    """ValueError naming the sizes when a joiner over ``(B, T, U1)`` nodes of ``J`` hidden and ``V``
    output values (None: not known yet, the hidden alone) would exceed :data:`MAX_JOINER_VALUES`
    (checked before it is called)."""
    n = B * T * U1 * (J + (V or 0))
    if n > MAX_JOINER_VALUES:
        sizes = f"B * T * ({u1_name}) * J = {B} * {T} * {U1} * {J}"
        if V is not None:
            sizes = f"B * T * ({u1_name}) * (J + V) = {B} * {T} * {U1} * ({J} + {V})"
        raise ValueError(
            f"joint_loss: the joiner of this batch would compute {sizes} = {n:,} values, over the limit of "
            f"{MAX_JOINER_VALUES:,} (lightning_gtn.nn.rnnt.MAX_JOINER_VALUES): T is the encoder's frames, U the "
            "longest target; use shorter utterances or transcripts, a smaller batch, or the pruned loss"
        )


def check_joiner_path(joiner: str) -> str:
    """``joiner`` if it is one of :data:`JOINER_PATHS`, else ValueError naming it."""
    if joiner not in JOINER_PATHS:
        raise ValueError(f"joiner must be one of {JOINER_PATHS}, got {joiner!r}")
    return joiner


def joiner_classes(network: Any, encoder_out: torch.Tensor, pred: torch.Tensor) -> int:
    """``V``, the joiner's outputs, from one node (before the whole lattice is joined)."""
    with torch.no_grad():
        return int(network.join(encoder_out[:1, :1, None, :], pred[:1, None, :1, :]).shape[-1])


def prepend_blank(targets: torch.Tensor, blank: int) -> torch.Tensor:
    """``(B, U)`` targets -> ``(B, U + 1)`` prediction-network inputs: the blank first (the start
    symbol), then the targets (padding is read but never scored)."""
    if targets.ndim != 2:
        raise ValueError(f"targets must have shape (B, U), got {tuple(targets.shape)}")
    start = torch.full((targets.shape[0], 1), int(blank), dtype=torch.long, device=targets.device)
    return torch.cat([start, targets.to(torch.long)], dim=1)


class RNNTStructuredLoss(StructuredLoss):
    """Base of the RNN-T loss modules (``topology == "rnnt"``).

    ``forward(logits (B, T, U + 1, V), targets (B, U), logit_lengths (B,), target_lengths (B,))``
    is torchaudio's calling convention; :meth:`joint_loss` is what the Lightning layer calls.
    ``blank`` is the blank's class id (non-negative once built; the Lightning layer fills it from
    the vocabulary).

    ``extra_outputs`` is the number of joiner outputs after the ``V`` token scores that the loss
    reads (0 here; TDT: one per duration, multi-blank: one per big blank); the Lightning layer
    builds the network's joiner with that many. A TDT loss names its durations in ``durations``
    and a multi-blank loss its big blanks' frame counts in ``big_blank_durations`` (output
    ``V + k`` has ``durations[k]`` / ``big_blank_durations[k]``), which greedy decoding reads.
    ``network_methods`` names the network methods training and decoding call.
    """

    blank: Optional[int] = 0
    extra_outputs: int = 0
    #: the transducer network's methods that training and decoding call (see the module docstring)
    network_methods: Tuple[str, ...] = NETWORK_METHODS

    def decoding(self, num_classes: int) -> Decoding:
        """Decoded by the searches over the network (greedy, or the modified beam search of the
        regular RNN-T); a loss with durations or big blanks gives greedy its options."""
        return Decoding()

    def network_arguments(self) -> dict:
        """``{"extra_outputs": n}``: the joiner outputs the loss reads after the ``V`` token scores."""
        return {"extra_outputs": int(self.extra_outputs)}

    def network_loss(self, network, frames, frame_lengths, targets, target_lengths):
        """:meth:`joint_loss` (the protocol of :class:`~lightning_gtn.nn.StructuredLoss`)."""
        return self.joint_loss(network, frames, frame_lengths, targets, target_lengths)

    @property
    def max_symbols_per_frame(self) -> Optional[int]:
        """The most tokens the loss's lattice places on one frame (None: any number, the regular
        RNN-T). A loss that needs ``U <= k * T`` returns ``k``; :meth:`joint_loss` then refuses,
        before the joiner runs, an example whose target cannot fit in its frames (unless the
        loss has ``zero_infinity``, which gives it 0)."""
        return None

    def check_symbols_per_frame(self, encoder_lengths: torch.Tensor, target_lengths: torch.Tensor) -> None:
        """ValueError naming the example, ``U``, ``T`` and :attr:`max_symbols_per_frame` when a target
        is longer than its frames allow (nothing when the loss allows any number or zeroes
        infeasible examples)."""
        k = self.max_symbols_per_frame
        if k is None or getattr(self, "zero_infinity", False):
            return
        tl = torch.as_tensor(target_lengths).reshape(-1).to("cpu", torch.int64)
        el = torch.as_tensor(encoder_lengths).reshape(-1).to("cpu", torch.int64)
        if tl.shape != el.shape:
            return  # the loss names the shapes
        bad = torch.nonzero(tl > k * el).reshape(-1)
        if bad.numel():
            b = int(bad[0])
            raise ValueError(
                f"joint_loss: example {b} has U={int(tl[b])} tokens for T={int(el[b])} encoder frames, but "
                f"{type(self).__name__} ({self.extra_repr()}) places at most {k} token(s) on a frame; use "
                "shorter transcripts or longer audio, or zero_infinity: true to give such examples 0"
            )

    @property
    def topology(self) -> str:
        """Always ``"rnnt"``: decoded by the transducer searches, not from frame paths."""
        return "rnnt"

    def joint_loss(
        self,
        network: Any,
        encoder_out: torch.Tensor,
        encoder_lengths: torch.Tensor,
        targets: torch.Tensor,
        target_lengths: torch.Tensor,
    ) -> torch.Tensor:
        """The loss of a batch from a transducer network (see the module docstring) and its
        encoder output ``(B, T, J)``: the full lattice ``join(enc[:, :, None], pred[:, None])``
        scored by :meth:`forward`. ValueError, before the joiner runs, when that lattice would
        exceed :data:`MAX_JOINER_VALUES`."""
        if not isinstance(encoder_out, torch.Tensor) or encoder_out.dim() != 3:
            got = tuple(encoder_out.shape) if isinstance(encoder_out, torch.Tensor) else type(encoder_out).__name__
            raise ValueError(f"encoder_out must have shape (B, T, J), got {got}")
        B, T, J = encoder_out.shape
        U1 = (targets.shape[1] if isinstance(targets, torch.Tensor) and targets.dim() == 2 else 0) + 1
        self.check_symbols_per_frame(encoder_lengths, target_lengths)
        check_joiner_size(B, T, U1, J, None)  # the joiner's hidden alone, before the prediction network
        pred, _ = network.predict(prepend_blank(targets, int(self.blank or 0)), None)
        if B * T:
            check_joiner_size(B, T, U1, J, joiner_classes(network, encoder_out, pred))
        logits = network.join(encoder_out[:, :, None, :], pred[:, None, :, :])
        return self(logits, targets, encoder_lengths, target_lengths)

    def best_paths(self, emissions, input_lengths=None):
        """Not defined for transducers: decode with :mod:`lightning_gtn.decode.transducer`."""
        raise NotImplementedError("RNN-T losses decode through lightning_gtn.decode.transducer, not frame paths")


class RNNTLoss(RNNTStructuredLoss):
    """:func:`lightning_gtn.functional.rnnt_loss` as a module: torchaudio's ``RNNTLoss``
    constructor first, then this library's options.

    Args:
        blank: the blank's class id; negative values count from the end of ``V`` (``-1``,
            torchaudio's default, is ``V - 1``) and are resolved on each call. The Lightning layer
            needs a non-negative id (its configs give the vocabulary's, ``blank: 0``), and so does
            :meth:`joint_loss` (the blank is the prediction network's start symbol).
        clamp: ``> 0`` clips each example's gradient w.r.t. the logits to ``[-clamp, clamp]``.
        reduction: ``"none"`` | ``"mean"`` (batch mean of the per-example costs, NOT divided by
            the target lengths: torchaudio's meaning) | ``"sum"``.
        fused_log_softmax: False when the inputs are log-probabilities already.
        zero_infinity: infeasible examples give 0 instead of ``inf``.
        fastemit_lambda: FastEmit regularisation weight (NeMo's meaning), ``>= 0``.
        impl: None (numba on the CPU; Triton on CUDA where it passes its self-check, else torch),
            ``"numba"``, ``"torch"`` or ``"triton"``.
        joiner: how :meth:`joint_loss` (training) scores a network: ``"chunked"`` (the default)
            with :func:`~lightning_gtn.functional.rnnt_joiner_loss`, never holding the
            ``(B, T, U + 1, V)`` joiner output, when the network offers ``joiner_parameters`` (its
            ``join`` being ``tanh(enc + pred) @ weight.T + bias``), ``fused_log_softmax`` is True and
            ``impl`` is None; otherwise, and with ``"materialised"``, ``rnnt_loss`` of
            ``network.join`` over the whole lattice. :meth:`forward` is the same either way.

    Shape:
        ``forward(logits (B, T, U + 1, V), targets (B, U), logit_lengths (B,), target_lengths (B,))``
        -> scalar, or ``(B,)`` with ``reduction="none"``.
    """

    vocabulary_arguments: Tuple[str, ...] = ("blank",)

    def __init__(
        self,
        blank: int = -1,
        clamp: float = -1.0,
        reduction: str = "mean",
        fused_log_softmax: bool = True,
        zero_infinity: bool = False,
        fastemit_lambda: float = 0.0,
        impl: Optional[str] = None,
        joiner: str = "chunked",
    ) -> None:
        super().__init__()
        checks.check_reduction(reduction)
        check_joiner_path(joiner)
        if impl not in (None,) + lgf.RNNT_IMPLS:
            raise ValueError(f"impl must be None or one of {lgf.RNNT_IMPLS}, got {impl!r}")
        if isinstance(blank, bool) or not isinstance(blank, int):
            raise ValueError(f"blank must be an integer class id (negative: from the end), got {blank!r}")
        for name, value in (("clamp", clamp), ("fastemit_lambda", fastemit_lambda)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                raise ValueError(f"{name} must be a real number, got {value!r}")
        if fastemit_lambda < 0:
            raise ValueError(f"fastemit_lambda must be >= 0, got {fastemit_lambda}")
        self.blank = int(blank)
        self.clamp = float(clamp)
        self.reduction = reduction
        self.fused_log_softmax = bool(fused_log_softmax)
        self.zero_infinity = bool(zero_infinity)
        self.fastemit_lambda = float(fastemit_lambda)
        self.impl = impl
        self.joiner = joiner

    def forward(self, logits, targets, logit_lengths, target_lengths):
        """The RNN-T loss of joiner outputs ``(B, T, U + 1, V)``: a scalar, or ``(B,)`` with
        ``reduction="none"``."""
        return lgf.rnnt_loss(
            logits,
            targets,
            logit_lengths,
            target_lengths,
            -1 if self.blank is None else self.blank,
            self.clamp,
            self.reduction,
            self.fused_log_softmax,
            zero_infinity=self.zero_infinity,
            fastemit_lambda=self.fastemit_lambda,
            impl=self.impl,
        )

    def chunked(self, network: Any) -> bool:
        """Whether :meth:`joint_loss` scores ``network`` by chunks (:func:`~lightning_gtn.functional.rnnt_joiner_loss`):
        ``joiner="chunked"``, a network offering ``joiner_parameters``, the fused log-softmax and
        ``impl=None`` (an explicit ``impl`` names a kernel of the materialised logits)."""
        return self.joiner == "chunked" and self.fused_log_softmax and self.impl is None and offers_joiner(network)

    def joint_loss(self, network, encoder_out, encoder_lengths, targets, target_lengths):
        """As :meth:`RNNTStructuredLoss.joint_loss`, by chunks where :meth:`chunked` says so: the
        same loss and gradients (to rounding) without the ``(B, T, U + 1, V)`` joiner output, bounded
        by the joiner loss's ``MAX_JOINER_NODES`` instead of :data:`MAX_JOINER_VALUES`. The blank must
        be a non-negative id here (it is the prediction network's start symbol, needed before the
        joiner gives ``V``)."""
        if self.blank is None or self.blank < 0:
            raise ValueError(
                f"RNNTLoss(blank={self.blank}).joint_loss needs the blank's class id (>= 0): the prediction "
                "network starts from it before V is known; construct RNNTLoss(blank=<id>)"
            )
        if self.chunked(network):
            return joiner_joint_loss(self, network, encoder_out, encoder_lengths, targets, target_lengths, None)
        return super().joint_loss(network, encoder_out, encoder_lengths, targets, target_lengths)

    def extra_repr(self) -> str:
        """The options shown by ``repr``."""
        return (
            f"blank={self.blank}, clamp={self.clamp}, reduction={self.reduction!r}, "
            f"fused_log_softmax={self.fused_log_softmax}, zero_infinity={self.zero_infinity}, "
            f"fastemit_lambda={self.fastemit_lambda}, joiner={self.joiner!r}"
        )


def score_joiner(
    network: Any,
    encoder_out: torch.Tensor,
    targets: torch.Tensor,
    blank: int,
    score: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``score(encoder (B, T, J), predictor (B, U + 1, J), weight (V, J), bias (V,))``: a joiner
    loss (:func:`~lightning_gtn.functional.rnnt_joiner_loss` and the duration ones) of a batch from
    ``network``'s prediction network over the targets started by ``blank`` (a non-negative id) and
    its ``joiner_parameters()``. Under autocast the four tensors are cast to autocast's dtype, as
    its matmuls would, and scored with autocast off (the loss computes half precision in float32)."""
    if not isinstance(encoder_out, torch.Tensor) or encoder_out.dim() != 3:
        got = tuple(encoder_out.shape) if isinstance(encoder_out, torch.Tensor) else type(encoder_out).__name__
        raise ValueError(f"encoder_out must have shape (B, T, J), got {got}")
    pred, _ = network.predict(prepend_blank(targets, int(blank)), None)
    weight, bias = network.joiner_parameters()
    device_type = encoder_out.device.type
    autocast = torch.is_autocast_enabled(device_type)
    if autocast:
        dtype = torch.get_autocast_dtype(device_type)
        encoder_out, pred, weight, bias = (x.to(dtype) for x in (encoder_out, pred, weight, bias))
    with torch.autocast(device_type, enabled=False) if autocast else contextlib.nullcontext():
        return score(encoder_out, pred, weight, bias)


def offers_joiner(network: Any) -> bool:
    """Whether ``network`` offers ``joiner_parameters`` (its joiner is ``Linear(tanh(enc + pred))``)."""
    return callable(getattr(network, "joiner_parameters", None))


def joiner_joint_loss(
    loss: Any,
    network: Any,
    encoder_out: torch.Tensor,
    encoder_lengths: torch.Tensor,
    targets: torch.Tensor,
    target_lengths: torch.Tensor,
    impl: Optional[str],
) -> torch.Tensor:
    """:func:`lightning_gtn.functional.rnnt_joiner_loss` of a batch from ``network``
    (:func:`score_joiner`), with ``loss``'s ``blank`` (a non-negative id), ``clamp``,
    ``reduction``, ``zero_infinity`` and ``fastemit_lambda``."""

    def score(enc, pred, weight, bias):
        return lgf.rnnt_joiner_loss(
            enc,
            pred,
            weight,
            bias,
            targets,
            encoder_lengths,
            target_lengths,
            blank=int(loss.blank),
            clamp=loss.clamp,
            reduction=loss.reduction,
            fastemit_lambda=loss.fastemit_lambda,
            zero_infinity=loss.zero_infinity,
            impl=impl,
        )

    return score_joiner(network, encoder_out, targets, int(loss.blank), score)


#: the transducer network's methods :class:`RNNTJoinerLoss` calls: those of every RNN-T loss and
#: ``joiner_parameters() -> (weight (V, J), bias (V,))``, the output layer of a joiner
#: ``Linear(tanh(enc + pred))``
JOINER_NETWORK_METHODS: Tuple[str, ...] = NETWORK_METHODS + ("joiner_parameters",)


class RNNTJoinerLoss(RNNTStructuredLoss):
    """:func:`lightning_gtn.functional.rnnt_joiner_loss` as a module: the RNN-T loss of the joiner
    ``Linear(tanh(enc + pred))`` computed without its ``(B, T, U + 1, V)`` output.

    Args:
        blank: the blank's class id; negative values count from the end of ``V`` (resolved on
            each call). :meth:`joint_loss` and the Lightning layer need a non-negative id (the
            prediction network's start symbol; the configs give the vocabulary's, ``blank: 0``).
        clamp: ``> 0`` clips each example's gradient w.r.t. its logits to ``[-clamp, clamp]``.
        reduction: ``"none"`` | ``"mean"`` (batch mean, not divided by target lengths) | ``"sum"``.
        zero_infinity: infeasible examples give 0 instead of ``inf``.
        fastemit_lambda: FastEmit regularisation weight (NeMo's meaning), ``>= 0``.
        impl: None (the device's default: ``"torch"`` on the CPU, ``"triton"`` on CUDA), or one of
            ``"torch"`` or ``"triton"``.

    A network it trains offers ``joiner_parameters() -> (weight (V, J), bias (V,))`` besides the
    protocol of every RNN-T loss (:data:`JOINER_NETWORK_METHODS`): its ``join(enc, pred)`` must be
    ``tanh(enc + pred) @ weight.T + bias`` (:class:`lightning_gtn.lightning.TransducerModel`'s is).

    Shape:
        ``forward(encoder (B, T, J), predictor (B, U + 1, J), weight (V, J), bias (V,), targets
        (B, U), logit_lengths (B,), target_lengths (B,))`` -> scalar, or ``(B,)`` with
        ``reduction="none"``.
    """

    vocabulary_arguments: Tuple[str, ...] = ("blank",)
    network_methods = JOINER_NETWORK_METHODS

    def __init__(
        self,
        blank: int = -1,
        clamp: float = -1.0,
        reduction: str = "mean",
        zero_infinity: bool = False,
        fastemit_lambda: float = 0.0,
        impl: Optional[str] = None,
    ) -> None:
        super().__init__()
        checks.check_reduction(reduction)
        if impl not in (None, "torch", "triton"):
            raise ValueError(f"impl must be None, 'torch' or 'triton', got {impl!r}")
        if isinstance(blank, bool) or not isinstance(blank, int):
            raise ValueError(f"blank must be an integer class id (negative: from the end), got {blank!r}")
        self.blank = int(blank)
        self.clamp = checks.check_real(clamp, "clamp")
        self.reduction = reduction
        self.zero_infinity = checks.check_bool(zero_infinity, "zero_infinity")
        self.fastemit_lambda = checks.check_real(fastemit_lambda, "fastemit_lambda", 0.0)
        self.impl = impl

    def forward(  # type: ignore[override]  # the joiner's inputs, not emissions
        self, encoder, predictor, weight, bias, targets, logit_lengths, target_lengths
    ):
        """The RNN-T loss of the joiner ``tanh(encoder[:, :, None] + predictor[:, None]) @ weight.T
        + bias``: a scalar, or ``(B,)`` with ``reduction="none"``."""
        return lgf.rnnt_joiner_loss(
            encoder,
            predictor,
            weight,
            bias,
            targets,
            logit_lengths,
            target_lengths,
            blank=-1 if self.blank is None else self.blank,
            clamp=self.clamp,
            reduction=self.reduction,
            fastemit_lambda=self.fastemit_lambda,
            zero_infinity=self.zero_infinity,
            impl=self.impl,
        )

    def joint_loss(self, network, encoder_out, encoder_lengths, targets, target_lengths):
        """The loss of a batch from a transducer network: its prediction network over the
        blank-started targets and its ``joiner_parameters()``, scored without joining the
        lattice. The blank must be a non-negative id (the prediction network's start symbol)."""
        if self.blank is None or self.blank < 0:
            raise ValueError(
                f"RNNTJoinerLoss(blank={self.blank}).joint_loss needs the blank's class id (>= 0): the prediction "
                "network starts from it; construct RNNTJoinerLoss(blank=<id>)"
            )
        return joiner_joint_loss(self, network, encoder_out, encoder_lengths, targets, target_lengths, self.impl)

    def extra_repr(self) -> str:
        """The options shown by ``repr``."""
        return (
            f"blank={self.blank}, clamp={self.clamp}, reduction={self.reduction!r}, "
            f"zero_infinity={self.zero_infinity}, fastemit_lambda={self.fastemit_lambda}"
        )
