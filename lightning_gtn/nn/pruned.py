"""``PrunedRNNTLoss``: k2's pruned RNN-T training loss with icefall's simple-loss scale and warm-up.

One call of :meth:`PrunedRNNTLoss.joint_loss` does what icefall's transducer model does in its
``forward``: the smoothed simple loss of the projections ``simple_lm(pred)`` and
``simple_am(enc)`` (its occupation probabilities choose ``s_range`` symbol positions per frame),
the joiner on those positions only (``(B, T, s_range, V)``, never ``(B, T, U + 1, V)``), the
pruned loss, and the two combined by the warm-up schedule at the module's :attr:`PrunedRNNTLoss.step`.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import torch
from torch import Tensor

from .. import k2 as k2f
from ..core import checks
from ..core.checks import check_label, check_reduction
from ..core.reduction import reduce_losses
from .rnnt import NETWORK_METHODS, RNNTStructuredLoss, check_joiner_size, prepend_blank

__all__ = ["PrunedRNNTLoss", "WARMUPS"]

#: the warm-up schedules of :class:`PrunedRNNTLoss`:
#:
#: * ``"linear"`` (icefall's zipformer recipes): over the first ``warm_step`` steps the simple
#:   loss's scale falls linearly from 1 to ``simple_loss_scale`` and the pruned loss's rises from
#:   0.1 to 1;
#: * ``"step"`` (icefall's pruned_transducer_stateless2 .. 7): the simple loss keeps
#:   ``simple_loss_scale``; the pruned loss's scale is 0 before ``warm_step``, 0.1 until
#:   ``2 * warm_step``, then 1 (the simple loss alone first, then the pruned loss phased in);
#: * ``"none"``: ``simple_loss_scale`` and 1 from the start.
WARMUPS = ("linear", "step", "none")


def _at_least_float32(x: Tensor) -> Tensor:
    """float16 / bfloat16 -> float32 (icefall scores both losses outside autocast); float32 and
    float64 unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _number(value, name: str, low: float = 0.0) -> float:
    return checks.check_real(value, name, low, finite=False)


class PrunedRNNTLoss(RNNTStructuredLoss):
    """The pruned RNN-T loss of k2/icefall as a structured loss module.

    Args:
        blank: the blank's class id (k2's ``termination_symbol``; the Lightning layer fills it
            from the vocabulary).
        s_range: symbol positions kept per frame (icefall's ``--prune-range``, default 5); widened
            where a sequence has more symbols than ``(s_range - 1) * frames`` (see
            :func:`lightning_gtn.k2.get_rnnt_prune_ranges`).
        simple_loss_scale: the simple loss's weight after the warm-up (icefall: 0.5).
        warm_step: steps of the warm-up (icefall: 2000).
        lm_only_scale: icefall's ``--lm-scale`` (0.25): the smoothed simple loss's LM-only weight.
        am_only_scale: icefall's ``--am-scale`` (0.0): its AM-only weight.
        delay_penalty: k2's delay penalty (both losses).
        rnnt_type: ``"regular"`` | ``"modified"`` | ``"constrained"``.
        reduction: ``"none"`` | ``"mean"`` (over the batch, as k2: not per target length) | ``"sum"``.
        zero_infinity: sequences with no path (``inf`` loss) count 0 (and get no gradient).
        use_hat_loss: the pruned loss with HAT's output distribution.
        warmup: one of :data:`WARMUPS` (default ``"linear"``, icefall's current recipes).

    Attributes:
        step: the training step the warm-up reads (icefall's ``batch_idx_train``); the training
            loop sets it before each step (:meth:`set_step`). Starts at 0.
        last_losses: ``{"simple": ..., "pruned": ...}`` of the last :meth:`joint_loss`, detached,
            reduced as ``reduction`` says (for logging).

    Shape:
        ``forward(logits (B, T, U + 1, V), targets (B, U), logit_lengths (B,), target_lengths (B,))``:
        the full (unpruned) k2 ``rnnt_loss`` of joiner outputs; ``joint_loss(network,
        encoder_out (B, T, J), encoder_lengths, targets, target_lengths)``: the pruned training loss.
    """

    vocabulary_arguments = ("blank",)
    # the simple loss reads the network's own projections of both sides
    network_methods = NETWORK_METHODS + ("simple_am", "simple_lm")

    def __init__(
        self,
        blank: int = 0,
        s_range: int = 5,
        simple_loss_scale: float = 0.5,
        warm_step: int = 2000,
        lm_only_scale: float = 0.25,
        am_only_scale: float = 0.0,
        delay_penalty: float = 0.0,
        rnnt_type: str = "regular",
        reduction: str = "mean",
        zero_infinity: bool = False,
        use_hat_loss: bool = False,
        warmup: str = "linear",
    ) -> None:
        super().__init__()
        self.blank = check_label(blank, "blank", 2**62)
        s_range = checks.check_int(s_range, "s_range", 1)
        warm_step = checks.check_int(warm_step, "warm_step", 0)
        if rnnt_type not in k2f.RNNT_TYPES:
            raise ValueError(f"rnnt_type must be one of {k2f.RNNT_TYPES}, got {rnnt_type!r}")
        if warmup not in WARMUPS:
            raise ValueError(f"warmup must be one of {WARMUPS}, got {warmup!r}")
        self.s_range = s_range
        self.simple_loss_scale = _number(simple_loss_scale, "simple_loss_scale")
        self.warm_step = warm_step
        self.lm_only_scale = _number(lm_only_scale, "lm_only_scale")
        self.am_only_scale = _number(am_only_scale, "am_only_scale")
        if self.lm_only_scale + self.am_only_scale > 1.0:
            raise ValueError(
                f"lm_only_scale + am_only_scale must be at most 1, got {self.lm_only_scale} + {self.am_only_scale}"
            )
        self.delay_penalty = _number(delay_penalty, "delay_penalty")
        self.rnnt_type = rnnt_type
        self.reduction = check_reduction(reduction)
        self.zero_infinity = bool(zero_infinity)
        self.use_hat_loss = bool(use_hat_loss)
        self.warmup = warmup
        self.step = 0
        self.last_losses: dict = {}

    # -- the warm-up -----------------------------------------------------------------------------

    @property
    def max_symbols_per_frame(self) -> Optional[int]:
        """1 for ``rnnt_type="modified"`` / ``"constrained"`` (a token also takes a frame), else None."""
        return None if self.rnnt_type == "regular" else 1

    def set_step(self, step: int) -> None:
        """Sets :attr:`step`, the training step the warm-up schedule reads."""
        self.step = checks.check_int(step, "step", 0)

    def scales(self, step: Optional[int] = None) -> Tuple[float, float]:
        """``(simple_scale, pruned_scale)`` at ``step`` (default :attr:`step`)."""
        n = self.step if step is None else step
        s, w = self.simple_loss_scale, self.warm_step
        if self.warmup == "none" or n >= (2 * w if self.warmup == "step" else w):
            return s, 1.0
        if self.warmup == "linear":
            f = n / w
            return 1.0 - f * (1.0 - s), 0.1 + 0.9 * f
        return s, (0.0 if n < w else 0.1)

    # -- the losses ------------------------------------------------------------------------------

    def _symbols(self, targets: Tensor, target_lengths: Tensor, B: int, device) -> Tuple[Tensor, Tensor]:
        """Padded ``(B, U)`` targets with the padding replaced by the blank, and int64 lengths."""
        if not isinstance(targets, Tensor):
            raise ValueError(f"targets must be a padded integer tensor of shape (B, U), got {type(targets).__name__}")
        targets = checks.check_index_tensor(targets, "targets", (B, None), "(B, U)")
        U = targets.shape[1]
        tl = self._lengths(target_lengths, B, U, "target_lengths", device, "U", "targets of shape (B, U)")
        pos = torch.arange(U, device=device).reshape(1, U)
        sym = torch.where(pos < tl.reshape(B, 1), targets.to(device=device), int(self.blank or 0))
        return sym, tl

    def _check_classes(self, sym: Tensor, V: int) -> None:
        """ValueError unless the blank and every (unpadded) target id is a class in ``[0, V)``."""
        check_label(int(self.blank or 0), "blank", V)
        if not torch.compiler.is_compiling():
            checks.check_in_range(sym, "targets", "V", V, inclusive=False)

    @staticmethod
    def _lengths(lengths, B: int, high: int, name: str, device, bound: str, of: str) -> Tensor:
        x = checks.check_index_tensor(lengths, name, (B,), "(B,)").to(device)
        checks.check_in_range(x, name, bound, high, inclusive=True, of=of)
        return x

    def _finish(self, losses: Tensor) -> Tensor:
        """``(B,)`` losses -> zero_infinity, then the reduction."""
        if self.zero_infinity:
            losses = torch.where(losses == math.inf, torch.zeros_like(losses), losses)  # infeasible only
        return reduce_losses(losses, self.reduction)

    def forward(self, logits: Tensor, targets: Tensor, logit_lengths: Tensor, target_lengths: Tensor) -> Tensor:
        """The full k2 ``rnnt_loss`` of joiner outputs ``(B, T, U + 1, V)`` (torchaudio's calling
        convention): a scalar, or ``(B,)`` with ``reduction="none"``."""
        B, T = checks.check_joiner_logits(logits)[:2]
        sym, tl = self._symbols(targets, target_lengths, B, logits.device)
        if logits.shape[2] != sym.shape[1] + 1:
            raise ValueError(f"logits (B, T, U + 1, V) must have U + 1 = {sym.shape[1] + 1}, got {tuple(logits.shape)}")
        self._check_classes(sym, logits.shape[3])
        ll = self._lengths(logit_lengths, B, T, "logit_lengths", logits.device, "T", "logits of shape (B, T, U + 1, V)")
        boundary = torch.stack([torch.zeros_like(tl), torch.zeros_like(tl), tl, ll], dim=1)
        losses = k2f.rnnt_loss(
            logits,
            sym,
            int(self.blank or 0),
            boundary=boundary,
            rnnt_type=self.rnnt_type,
            delay_penalty=self.delay_penalty,
            reduction="none",
        )
        return self._finish(losses)

    def joint_loss(
        self,
        network: Any,
        encoder_out: Tensor,
        encoder_lengths: Tensor,
        targets: Tensor,
        target_lengths: Tensor,
    ) -> Tensor:
        """The pruned training loss from a transducer network (the protocol of
        :mod:`lightning_gtn.nn.rnnt`) and its encoder output ``(B, T, J)``:
        ``simple_scale * simple + pruned_scale * pruned`` at :attr:`step` (see :meth:`scales`)."""
        if not isinstance(encoder_out, Tensor) or encoder_out.dim() != 3:
            got = tuple(encoder_out.shape) if isinstance(encoder_out, Tensor) else type(encoder_out).__name__
            raise ValueError(f"encoder_out must have shape (B, T, J), got {got}")
        B, T = encoder_out.shape[0], encoder_out.shape[1]
        blank = int(self.blank or 0)
        sym, tl = self._symbols(targets, target_lengths, B, encoder_out.device)
        el = self._lengths(
            encoder_lengths, B, T, "encoder_lengths", encoder_out.device, "T", "encoder_out of shape (B, T, J)"
        )
        self.check_symbols_per_frame(el, tl)
        boundary = torch.stack([torch.zeros_like(tl), torch.zeros_like(tl), tl, el], dim=1)
        # the smoothed loss holds a few (B, U + 1, T) lattices: bounded as a joiner of J + V = 8 values
        check_joiner_size(B, T, int(sym.shape[1]) + 1, 4, 4)
        am = network.simple_am(encoder_out)  # (B, T, V): V checks the targets before any lookup
        self._check_classes(sym, am.shape[-1])
        pred, _ = network.predict(prepend_blank(sym, blank), None)  # (B, U + 1, J)
        lm = network.simple_lm(pred)
        simple, (px_grad, py_grad) = k2f.rnnt_loss_smoothed(
            _at_least_float32(lm),
            _at_least_float32(am),
            sym,
            blank,
            lm_only_scale=self.lm_only_scale,
            am_only_scale=self.am_only_scale,
            boundary=boundary,
            rnnt_type=self.rnnt_type,
            delay_penalty=self.delay_penalty,
            reduction="none",
            return_grad=True,
        )
        simple = self._finish(simple)
        simple_scale, pruned_scale = self.scales()
        # the pruned loss is computed even at scale 0 (as icefall): every parameter of the joiner
        # then takes part in the step, which DDP expects
        ranges = k2f.get_rnnt_prune_ranges(px_grad, py_grad, boundary, self.s_range)
        check_joiner_size(B, T, int(ranges.shape[-1]), int(encoder_out.shape[-1]), int(am.shape[-1]), "s_range")
        am_p, lm_p = k2f.do_rnnt_pruning(encoder_out, pred, ranges)
        logits = network.join(am_p, lm_p)  # (B, T, s_range, V)
        pruned = k2f.rnnt_loss_pruned(
            _at_least_float32(logits),
            sym,
            ranges,
            blank,
            boundary=boundary,
            rnnt_type=self.rnnt_type,
            delay_penalty=self.delay_penalty,
            reduction="none",
            use_hat_loss=self.use_hat_loss,
        )
        pruned = self._finish(pruned)
        self.last_losses = {"simple": simple.detach(), "pruned": pruned.detach()}
        return simple_scale * simple + pruned_scale * pruned

    def extra_repr(self) -> str:
        """The options shown by ``repr``."""
        return (
            f"blank={self.blank}, s_range={self.s_range}, simple_loss_scale={self.simple_loss_scale}, "
            f"warm_step={self.warm_step}, warmup={self.warmup!r}, rnnt_type={self.rnnt_type!r}, "
            f"reduction={self.reduction!r}"
        )
