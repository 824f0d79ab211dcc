"""Multi-blank RNN-T and TDT losses as modules (NeMo's ``MultiblankRNNTLoss`` / ``TDTLoss`` options).

Both score a joiner output with more classes than the vocabulary:
:attr:`MultiBlankRNNTLoss.extra_outputs` and :attr:`TDTLoss.extra_outputs` say how many (the big
blanks; the duration logits), and a transducer network trained with one of these losses must
build its joiner with ``V + extra_outputs`` outputs. See ``docs/rnnt_variants.md``.
"""

from __future__ import annotations

import itertools
from typing import List, Optional, Sequence

import torch

from .. import functional as lgf
from ..core import checks
from .losses import Decoding
from .rnnt import RNNTStructuredLoss, check_joiner_path, offers_joiner, score_joiner

_NO_BEAM = (
    "the modified beam search decodes the regular RNN-T (one blank, no durations); {name} has durations or "
    "big blanks: use decoder=greedy"
)

__all__ = ["MultiBlankRNNTLoss", "TDTLoss"]


class MultiBlankRNNTLoss(RNNTStructuredLoss):
    """:func:`lightning_gtn.functional.multiblank_rnnt_loss` as a module.

    Args:
        blank: the standard blank's class id; negative values count from the end of ``V``
            (default ``-1``, the last class: NeMo's layout and the default of
            :func:`~lightning_gtn.functional.multiblank_rnnt_loss`), resolved on each call.
            :meth:`joint_loss` and :meth:`decoding` need an id ``>= 0`` (the prediction
            network's start symbol; the greedy search's blank): the Lightning layer's configs
            give the vocabulary's, ``blank: 0``.
        big_blank_durations: strictly increasing integers ``>= 1``, e.g. ``[2, 4, 8]``.
        sigma: logit under-normalisation (NeMo recommends 0.05).
        reduction: ``"none"`` | ``"mean"`` (batch mean) | ``"sum"`` | ``"mean_volume"`` (NeMo's).
        big_blank_ids: the class of each big blank. None: NeMo's ``blank - 1 - i`` when
            ``blank >= len(big_blank_durations)`` (NeMo's layout, the blank last: the default
            ``blank=-1``); with the blank first (``blank=0``, the vocabulary's layout) the big
            blanks are the extra outputs appended after the vocabulary, class ``V - 1 - i`` for
            ``big_blank_durations[i]``.
        zero_infinity: examples without a complete path give 0.
        impl: None (the device's default), ``"numba"``, ``"torch"`` or ``"triton"``.
        fastemit_lambda: FastEmit's weight, finite and ``>= 0``: the token arcs' gradient and the
            cost scaled by ``1 + fastemit_lambda``.
        clamp: ``> 0`` clips each example's gradient w.r.t. the logits to ``[-clamp, clamp]``.
        joiner: how :meth:`joint_loss` (training) scores a network: ``"chunked"`` (the default)
            with :func:`~lightning_gtn.functional.multiblank_rnnt_joiner_loss`, never holding the
            ``(B, T, U + 1, V + E)`` joiner output, when the network offers
            ``joiner_parameters`` (its ``join`` being ``tanh(enc + pred) @ weight.T + bias``) and
            neither ``fastemit_lambda`` nor ``clamp`` is set; otherwise, and with
            ``"materialised"``, :meth:`forward` of ``network.join`` over the whole lattice. The
            same loss and gradients either way (to rounding); :meth:`forward` is unchanged.

    Shape:
        ``forward(logits (B, T, U + 1, V), targets (B, U), logit_lengths (B,), target_lengths (B,))``.
    """

    vocabulary_arguments = ("blank",)

    def __init__(
        self,
        blank: int = -1,
        big_blank_durations: Sequence[int] = (2, 4),
        sigma: float = 0.0,
        reduction: str = "mean",
        big_blank_ids: Optional[Sequence[int]] = None,
        zero_infinity: bool = False,
        impl: Optional[str] = None,
        fastemit_lambda: float = 0.0,
        clamp: float = -1.0,
        joiner: str = "chunked",
    ) -> None:
        super().__init__()
        self.joiner = check_joiner_path(joiner)
        # checked once here with a tiny call (the same checks as every forward)
        self.blank = _as_int(blank, "blank")
        self.big_blank_durations: List[int] = [int(d) for d in _checked(big_blank_durations, "big_blank_durations")]
        self.extra_outputs = len(self.big_blank_durations)  # the joiner outputs beyond the vocabulary
        self.sigma = float(sigma)
        self.reduction = reduction
        self.big_blank_ids = None if big_blank_ids is None else [int(c) for c in big_blank_ids]
        self.zero_infinity = bool(zero_infinity)
        self.impl = impl
        self.fastemit_lambda = fastemit_lambda
        self.clamp = clamp
        ids = self.big_blank_ids or []
        V = 2 + len(self.big_blank_durations) + abs(self._blank) + sum(abs(c) for c in ids)
        self._loss(torch.zeros(1, 1, 1, V))

    @property
    def _blank(self) -> int:
        return _blank_of(self)

    def _ids(self, V: int) -> Optional[List[int]]:
        if self.big_blank_ids is not None:
            return self.big_blank_ids
        blank = self._blank
        b = blank % V if -V <= blank < V else blank
        if b >= len(self.big_blank_durations):
            return None
        return [V - 1 - i for i in range(len(self.big_blank_durations))]

    def _loss(self, logits, targets=None, logit_lengths=None, target_lengths=None):
        B, V = logits.shape[0], logits.shape[-1]
        if targets is None:
            targets = torch.zeros(B, 0, dtype=torch.long)
            logit_lengths = torch.full((B,), logits.shape[1], dtype=torch.long)
            target_lengths = torch.zeros(B, dtype=torch.long)
        return lgf.multiblank_rnnt_loss(
            logits,
            targets,
            logit_lengths,
            target_lengths,
            self._blank,
            self.big_blank_durations,
            self.sigma,
            self.reduction,
            big_blank_ids=self._ids(V),
            zero_infinity=self.zero_infinity,
            impl=self.impl,
            fastemit_lambda=self.fastemit_lambda,
            clamp=self.clamp,
        )

    def forward(self, logits, targets, logit_lengths, target_lengths):
        """The loss of joiner outputs ``(B, T, U + 1, V)``: a scalar, or ``(B,)`` with ``"none"``."""
        return self._loss(logits, targets, logit_lengths, target_lengths)

    def decoding(self, num_classes: int) -> Decoding:
        """Greedy search with the big blanks as the extra joiner outputs ``num_classes ..
        num_classes + E - 1`` (``big_blank_durations[i]`` is class ``V + E - 1 - i`` with the blank at 0,
        or the class ``big_blank_ids`` names); no modified beam search when there are big blanks.

        Raises:
            ValueError: the blank is negative, or the big blanks are not those extra outputs.
        """
        _check_start_symbol(self, "decoding")
        durations = [int(d) for d in self.big_blank_durations]
        E = len(durations)
        ids = self.big_blank_ids
        if ids is None:
            ids = [num_classes + E - 1 - i for i in range(E)]
        ids = [int(c) for c in ids]
        if sorted(ids) != list(range(num_classes, num_classes + E)):
            raise ValueError(
                f"decoder: the big blanks of {type(self).__qualname__} are classes {ids}; greedy decoding "
                f"reads them as the extra joiner outputs {num_classes}..{num_classes + E - 1}"
            )
        frames = [0] * E
        for i, c in enumerate(ids):
            frames[c - num_classes] = durations[i]
        beam = _NO_BEAM.format(name=type(self).__qualname__) if durations else None
        return Decoding(beam=beam, options={"big_blank_durations": frames})

    def joint_loss(self, network, encoder_out, encoder_lengths, targets, target_lengths):
        """As :meth:`RNNTStructuredLoss.joint_loss`; ValueError for a negative blank (the
        prediction network starts from it before the joiner gives ``V``)."""
        _check_start_symbol(self, "joint_loss")
        if not _chunked(self, network):
            return super().joint_loss(network, encoder_out, encoder_lengths, targets, target_lengths)

        def score(enc, pred, weight, bias):
            return lgf.multiblank_rnnt_joiner_loss(
                enc,
                pred,
                weight,
                bias,
                targets,
                encoder_lengths,
                target_lengths,
                blank=self._blank,
                big_blank_durations=self.big_blank_durations,
                sigma=self.sigma,
                big_blank_ids=self._ids(int(weight.shape[0])),
                reduction=self.reduction,
                zero_infinity=self.zero_infinity,
                impl=self.impl,
            )

        return score_joiner(network, encoder_out, targets, self._blank, score)

    def chunked(self, network) -> bool:
        """Whether :meth:`joint_loss` scores ``network`` by chunks
        (:func:`~lightning_gtn.functional.multiblank_rnnt_joiner_loss`): see ``joiner``."""
        return _chunked(self, network)

    def extra_repr(self) -> str:
        """The options shown by ``repr``."""
        return (
            f"blank={self.blank}, big_blank_durations={self.big_blank_durations}, sigma={self.sigma}, "
            f"reduction={self.reduction!r}, joiner={self.joiner!r}"
        )


class TDTLoss(RNNTStructuredLoss):
    """:func:`lightning_gtn.functional.tdt_loss` as a module.

    Args:
        blank: the blank's id among the label classes; negative values count from the end of
            them (default ``-1``, the last label class: NeMo's layout and the default of
            :func:`~lightning_gtn.functional.tdt_loss`), resolved on each call.
            :meth:`joint_loss` and :meth:`decoding` need an id ``>= 0`` (the prediction
            network's start symbol; the greedy search's blank): the Lightning layer's configs
            give the vocabulary's, ``blank: 0``.
        durations: strictly increasing integers ``>= 0``, at least one ``>= 1`` (NeMo: ``[0, 1, 2, 3, 4]``).
        sigma: logit under-normalisation of the label log-probabilities (NeMo recommends 0.05).
        omega: weight of the regular RNN-T loss mixed in, ``[0, 1]``.
        reduction: ``"none"`` | ``"mean"`` (batch mean) | ``"sum"`` | ``"mean_volume"`` (NeMo's).
        zero_infinity: examples without a complete path give 0.
        impl: None (the device's default), ``"numba"``, ``"torch"`` or ``"triton"``.
        fastemit_lambda: FastEmit's weight, finite and ``>= 0``: the token arcs' gradient and the
            cost scaled by ``1 + fastemit_lambda``.
        clamp: ``> 0`` clips each example's gradient w.r.t. the logits to ``[-clamp, clamp]``.
        joiner: how :meth:`joint_loss` (training) scores a network: ``"chunked"`` (the default)
            with :func:`~lightning_gtn.functional.tdt_joiner_loss`, never holding the
            ``(B, T, U + 1, V + D)`` joiner output, when the network offers
            ``joiner_parameters`` (its ``join`` being ``tanh(enc + pred) @ weight.T + bias``) and
            neither ``fastemit_lambda`` nor ``clamp`` is set; otherwise, and with
            ``"materialised"``, :meth:`forward` of ``network.join`` over the whole lattice. The
            same loss and gradients either way (to rounding); :meth:`forward` is unchanged.

    Shape:
        ``forward(logits (B, T, U + 1, V + len(durations)), targets (B, U), logit_lengths (B,),
        target_lengths (B,))``: the last ``len(durations)`` classes are the duration logits.
    """

    vocabulary_arguments = ("blank",)

    def __init__(
        self,
        blank: int = -1,
        durations: Sequence[int] = (0, 1, 2, 3, 4),
        sigma: float = 0.0,
        omega: float = 0.0,
        reduction: str = "mean",
        zero_infinity: bool = False,
        impl: Optional[str] = None,
        fastemit_lambda: float = 0.0,
        clamp: float = -1.0,
        joiner: str = "chunked",
    ) -> None:
        super().__init__()
        self.joiner = check_joiner_path(joiner)
        self.blank = _as_int(blank, "blank")
        self.durations: List[int] = [int(d) for d in _checked(durations, "durations")]
        self.extra_outputs = len(self.durations)  # one duration logit per duration, after the tokens
        self.sigma = float(sigma)
        self.omega = float(omega)
        self.reduction = reduction
        self.zero_infinity = bool(zero_infinity)
        self.impl = impl
        self.fastemit_lambda = fastemit_lambda
        self.clamp = clamp
        K = self._blank + 1 if self._blank >= 0 else -self._blank  # the fewest label classes the blank fits
        self.forward(
            torch.zeros(1, 1, 1, K + len(self.durations)),
            torch.zeros(1, 0, dtype=torch.long),
            torch.ones(1, dtype=torch.long),
            torch.zeros(1, dtype=torch.long),
        )

    @property
    def _blank(self) -> int:
        return _blank_of(self)

    @property
    def max_symbols_per_frame(self) -> Optional[int]:
        """1 when no duration is 0 (every token then advances a frame), else None."""
        return None if 0 in self.durations else 1

    def decoding(self, num_classes: int) -> Decoding:
        """Greedy search over the network with the durations (extra output ``k`` advances
        ``durations[k]`` frames); no modified beam search. ValueError for a negative blank."""
        _check_start_symbol(self, "decoding")
        durations = [int(d) for d in self.durations]
        beam = _NO_BEAM.format(name=type(self).__qualname__) if durations else None
        return Decoding(beam=beam, options={"durations": durations})

    def forward(self, logits, targets, logit_lengths, target_lengths):
        """The loss of joiner outputs ``(B, T, U + 1, V + len(durations))``."""
        return lgf.tdt_loss(
            logits,
            targets,
            logit_lengths,
            target_lengths,
            self._blank,
            self.durations,
            self.sigma,
            self.omega,
            self.reduction,
            zero_infinity=self.zero_infinity,
            impl=self.impl,
            fastemit_lambda=self.fastemit_lambda,
            clamp=self.clamp,
        )

    def joint_loss(self, network, encoder_out, encoder_lengths, targets, target_lengths):
        """As :meth:`RNNTStructuredLoss.joint_loss`; ValueError for a negative blank (the
        prediction network starts from it before the joiner gives ``V``)."""
        _check_start_symbol(self, "joint_loss")
        if not _chunked(self, network):
            return super().joint_loss(network, encoder_out, encoder_lengths, targets, target_lengths)
        self.check_symbols_per_frame(encoder_lengths, target_lengths)

        def score(enc, pred, weight, bias):
            return lgf.tdt_joiner_loss(
                enc,
                pred,
                weight,
                bias,
                targets,
                encoder_lengths,
                target_lengths,
                blank=self._blank,
                durations=self.durations,
                sigma=self.sigma,
                omega=self.omega,
                reduction=self.reduction,
                zero_infinity=self.zero_infinity,
                impl=self.impl,
            )

        return score_joiner(network, encoder_out, targets, self._blank, score)

    def chunked(self, network) -> bool:
        """Whether :meth:`joint_loss` scores ``network`` by chunks
        (:func:`~lightning_gtn.functional.tdt_joiner_loss`): see ``joiner``."""
        return _chunked(self, network)

    def extra_repr(self) -> str:
        """The options shown by ``repr``."""
        return (
            f"blank={self.blank}, durations={self.durations}, sigma={self.sigma}, omega={self.omega}, "
            f"reduction={self.reduction!r}, joiner={self.joiner!r}"
        )


def _chunked(loss, network) -> bool:
    """``joiner="chunked"``, a network offering ``joiner_parameters``, and no FastEmit or clamp
    (the duration joiner losses have neither)."""
    return (
        loss.joiner == "chunked"
        and float(loss.fastemit_lambda) == 0.0
        and not float(loss.clamp) > 0
        and offers_joiner(network)
    )


def _as_int(value, name: str) -> int:
    """An integer class id (negative: counted from the end on each call)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer class id (negative: from the end), got {value!r}")
    return int(value)


def _check_start_symbol(loss: RNNTStructuredLoss, what: str) -> None:
    """ValueError naming the loss when its blank is negative: ``what`` (``joint_loss``,
    ``decoding``) needs the class id itself, before the joiner's ``V`` is known."""
    if _blank_of(loss) < 0:
        name = type(loss).__qualname__
        raise ValueError(
            f"{name}(blank={loss.blank}).{what} needs the blank's class id (>= 0): the prediction network "
            f"starts from it and the greedy search reads it before V is known; construct {name}(blank=<id>), "
            "e.g. blank=0 for the vocabulary's layout"
        )


def _blank_of(loss: RNNTStructuredLoss) -> int:
    return 0 if loss.blank is None else int(loss.blank)


def _checked(values, name: str) -> Sequence[int]:
    """``values`` as a list (from a config's ListConfig or a tuple): at most
    :data:`~lightning_gtn.core.checks.MAX_DURATIONS` integers (counted before more are read), each
    in ``[0, MAX_DURATION]``, strictly increasing (the loss checks the rest)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"{name} must be a list of integers, got {values!r}")
    out = list(itertools.islice(values, checks.MAX_DURATIONS + 1))
    if len(out) > checks.MAX_DURATIONS:
        raise ValueError(f"{name} must hold at most MAX_DURATIONS={checks.MAX_DURATIONS} durations, got more")
    return checks.check_durations(out, name, allow_empty=True, allow_zero=True)
