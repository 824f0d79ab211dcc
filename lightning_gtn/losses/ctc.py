"""Connectionist temporal classification (CTC) on batch-first emissions."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..core import checks, criterion
from ..core.criterion_graphs import compiled_ctc
from ..core.impl import Backends, interpreted
from ..core.scoring import Plan, unique_graphs
from ..kernels import ctc_numba, ctc_triton

__all__ = ["ctc_loss"]


#: the Triton CTC kernel's self-check, run once per CUDA device before ``impl=None`` uses it
_TRITON_CTC = Backends(
    "ctc_loss",
    ("triton",),
    triton_available=ctc_triton.available,
    self_check=ctc_triton.self_check,
    kernels="Triton CTC",
    fallback="the graph kernels",
)


@torch.compiler.assume_constant_result
def _triton_ctc_passed(device: str) -> bool:
    """Whether triton is importable and the Triton CTC kernels passed their self-check on
    ``device`` (run on the first call). A constant to ``torch.compile``: a first call inside a
    compiled function runs the self-check eagerly instead of tracing it."""
    return ctc_triton.available() and _TRITON_CTC.passed(torch.device(device))


class _CTC(criterion.Criterion):
    """CTC: by default its own kernels, on the CPU :mod:`lightning_gtn.kernels.ctc_numba`
    (``impl="numba_ctc"``), on a CUDA device :mod:`lightning_gtn.kernels.ctc_triton`
    (``impl="triton_ctc"``, when triton is installed and its self-check passes there);
    otherwise one CTC graph per distinct target, the loss of a row ``-log Z`` of its graph."""

    kind = "ctc"
    name = "ctc_loss"
    kernels = ("numba_ctc", "triton_ctc")
    backends = criterion.NATIVE_BACKENDS + kernels + ("gtn",)

    def own_kernel(self, device, impl):
        if impl is None:
            if device.type == "cpu":
                return "numba_ctc"
            if device.type == "cuda" and _triton_ctc_passed(str(device)):
                return "triton_ctc"
            return None
        if impl == "numba_ctc" and device.type != "cpu":
            raise ValueError(f"impl='numba_ctc' needs CPU tensors, got emissions on {device}")
        if impl == "triton_ctc":
            if not ctc_triton.available():
                raise ValueError(f"{self.name}: impl='triton_ctc' needs the triton package, which is not installed")
            if device.type != "cuda" and not (device.type == "cpu" and interpreted()):
                raise ValueError(
                    f"{self.name}: impl='triton_ctc' runs on CUDA tensors (or on CPU tensors under Triton's "
                    f"interpreter, TRITON_INTERPRET=1), got emissions on {device}"
                )
        return impl if impl in self.kernels else None

    def kernel_loss(
        self, emissions, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, impl, need_e
    ):
        if impl == "triton_ctc":
            return self._triton_loss(
                emissions, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, need_e
            )
        if emissions.device.type != "cpu":
            raise ValueError(f"impl={impl!r} needs CPU tensors, got emissions on {emissions.device}")
        B, T, C = checks.check_emissions(emissions, "log_probs")
        blank = checks.check_label(blank, "blank", C)
        arrays = _host_arrays(targets, input_lengths, target_lengths, B)
        if arrays is None:  # another layout or dtype: converted (and checked) the long way
            arrays = self._checked_arrays(emissions, targets, input_lengths, target_lengths, blank)
        labels, offsets, tl, il, stride = arrays
        coef = None
        if reduction == "mean":
            coef = 1.0 / (np.maximum(tl, 1) * max(B, 1))
        elif reduction == "sum":
            coef = np.ones(B)
        E = emissions.detach()
        if E.dtype not in (torch.float32, torch.float64):
            E = E.float()
        E = E.contiguous()
        try:
            losses, gE = ctc_numba.ctc_cost_grad(E, labels, offsets, tl, il, blank, coef, need_e, stride)
        except ValueError:
            # the kernel's checks refused a value: the argument checks say which, by name
            self._checked_arrays(emissions, targets, input_lengths, target_lengths, blank)
            raise
        ln = losses.numpy()
        if zero_infinity:
            ln[np.isinf(ln)] = 0.0
        if coef is None:
            return losses.to(E.dtype), gE
        return torch.tensor(float((ln * coef).sum()), dtype=E.dtype), gE

    def _triton_loss(self, emissions, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, need_e):
        """:meth:`kernel_loss` for ``impl="triton_ctc"``: the indices checked on the host, the
        kernel and the reduction on the emissions' device."""
        B, T, C = checks.check_emissions(emissions, "log_probs")
        blank = checks.check_label(blank, "blank", C)
        labels, offsets, tl, il, _ = self._checked_arrays(emissions, targets, input_lengths, target_lengths, blank)
        dev = emissions.device
        E = emissions.detach()
        if E.dtype not in (torch.float32, torch.float64):
            E = E.float()
        coef = None
        if reduction == "mean":
            coef = 1.0 / (np.maximum(tl, 1) * max(B, 1))
        elif reduction == "sum":
            coef = np.ones(B)
        cf = None if coef is None else torch.from_numpy(coef).to(device=dev, dtype=E.dtype)
        on_dev = [torch.from_numpy(np.ascontiguousarray(a)).to(dev) for a in (labels, offsets, tl, il)]
        lab_d, off_d, tl_d, il_d = on_dev
        losses, gE = ctc_triton.ctc_triton(E, lab_d, off_d, tl_d, il_d, blank, cf, need_e)
        if zero_infinity:
            losses = torch.where(torch.isinf(losses), torch.zeros_like(losses), losses)
        if coef is None:
            return losses.to(E.dtype), gE
        total = (losses * torch.from_numpy(coef).to(dev)).sum()  # the float64 losses, as on the CPU
        return total.to(E.dtype), gE

    @staticmethod
    def _checked_arrays(emissions, targets, input_lengths, target_lengths, blank):
        B, T, C = emissions.shape
        dev = emissions.device
        il = checks.as_lengths(input_lengths, B, "input_lengths", dev, max_value=T)
        labels, offsets, tl = checks.flat_targets(targets, target_lengths, B, dev, C, blank)
        stride = int(targets.shape[1]) if targets.dim() == 2 else -1
        return labels, offsets, tl, il, stride

    def check_options(self, C, blank, weights, device):
        return checks.check_label(blank, "blank", C), weights

    def gtn_losses(self, emissions, weights, seqs, lengths, blank, zero_infinity):
        from ..core.gtn_backend import gtn_ctc_losses

        return gtn_ctc_losses(emissions, seqs, lengths, blank, zero_infinity)

    def forbidden_label(self, blank: int) -> Optional[int]:
        return blank

    def plan(self, seqs, lengths, C, blank):
        graphs, ids = unique_graphs([compiled_ctc(t, blank) for t in seqs])
        B = len(seqs)
        return Plan(graphs, ids, np.arange(B), lengths, -np.ones(B), B), None


def _host_arrays(targets, input_lengths, target_lengths, B: int):
    """``(labels, offsets, target_lengths, input_lengths, stride)`` as host int64 arrays without
    a copy, for int64 CPU tensors of torch's layouts (padded ``(B, S)`` or concatenated 1-D
    targets, ``(B,)`` lengths); None for anything else. Values are not checked here (the
    kernel's checks run before it reads them)."""
    ok = all(
        isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dtype == torch.int64
        for t in (targets, input_lengths, target_lengths)
    )
    if not ok or input_lengths.shape != (B,) or target_lengths.shape != (B,):
        return None
    if targets.dim() == 2 and targets.shape[0] == B:
        S = int(targets.shape[1])
        offsets = np.arange(B, dtype=np.int64) * S
    elif targets.dim() == 1:
        S = -1
        tl = target_lengths.numpy()
        if int(tl.sum()) != targets.shape[0]:
            return None
        offsets = np.zeros(B, dtype=np.int64)
        if B > 1:
            np.cumsum(tl[:-1], out=offsets[1:])
    else:
        return None
    labels = targets.detach().contiguous().reshape(-1).numpy()
    return labels, offsets, target_lengths.detach().numpy(), input_lengths.detach().numpy(), S


criterion.CRITERIA["ctc"] = _CTC()


def ctc_loss(
    log_probs: torch.Tensor,
    targets,
    input_lengths,
    target_lengths,
    blank: int = 0,
    reduction: str = "mean",
    zero_infinity: bool = False,
    *,
    impl: Optional[str] = None,
) -> torch.Tensor:
    """The CTC loss of a batch: torch's ``ctc_loss`` semantics, batch first.

    The loss of an example is ``-log`` of the total score of its CTC alignments. On the CPU a
    dedicated kernel walks the ``2S + 1`` CTC states of each example frame by frame
    (:mod:`lightning_gtn.kernels.ctc_numba`, examples shared over the engine's threads); on a CUDA
    device the same walk runs as Triton kernels, one program per example
    (:mod:`lightning_gtn.kernels.ctc_triton`). Without them, and with the graph
    implementations' ``impl`` names, each target's CTC graph
    (:func:`lightning_gtn.wfst.criterion.ctc_graph`, cached per target) is scored against its
    emissions in one batched forward-backward pass on ``log_probs.device``. A ``torch.library``
    custom op: works under ``torch.compile(fullgraph=True)``.

    Args:
        log_probs: ``(B, T, C)`` log-probabilities (normally ``log_softmax`` outputs; any
            scores work, the loss is then ``-logsumexp`` of the alignment scores). float32 or
            float64; float16/bfloat16 are scored in float32.
        targets: padded ``(B, S)`` integer labels, all targets concatenated
            ``(sum(target_lengths),)``, or a list of B label sequences. Labels lie in ``[0, C)``
            and are never ``blank``. On ``log_probs.device`` or the CPU.
        input_lengths: ``(B,)`` integer frames per example, ``0 <= input_lengths[b] <= T``.
        target_lengths: ``(B,)`` integer labels per example (``<= S`` for padded targets).
        blank: the blank label, an integer in ``[0, C)``.
        reduction: ``"none"`` gives the ``(B,)`` losses; ``"sum"`` their sum; ``"mean"`` divides
            each loss by its target length (clamped to at least 1) and averages over the batch.
        zero_infinity: infeasible examples (a target that needs more frames than it has) give
            an infinite loss; with ``zero_infinity=True`` they give 0 instead. Either way their
            gradient is zero.
        impl: None (``"numba_ctc"`` on the CPU; on CUDA ``"triton_ctc"`` when triton is
            installed and its once-per-device self-check passes, else the graph path, Triton or
            torch); ``"numba_ctc"`` (the dedicated CTC kernel, CPU); ``"triton_ctc"`` (the
            dedicated CTC kernel in Triton: CUDA, or CPU tensors under ``TRITON_INTERPRET=1``);
            the graph implementations ``"numba"`` (scaled,
            CPU), ``"numba_log"`` (log domain, CPU), ``"torch"``, ``"triton"``; or ``"gtn"`` (the
            real ``gtn`` package, one graph per example on the host; eager only; ImportError
            when not installed).

    Returns:
        A scalar (or ``(B,)`` for ``reduction="none"``) in ``log_probs``'s dtype and device.
        NaN emissions give NaN losses.

    Example:
        >>> import torch
        >>> from lightning_gtn.functional import ctc_loss
        >>> lp = torch.randn(2, 10, 5).log_softmax(-1)
        >>> loss = ctc_loss(lp, torch.tensor([[1, 2], [3, 0]]), [10, 8], [2, 1])
        >>> loss.shape
        torch.Size([])
    """
    return criterion.apply_loss(
        criterion.CRITERIA["ctc"],
        log_probs,
        targets,
        input_lengths,
        target_lengths,
        blank=blank,
        reduction=reduction,
        zero_infinity=zero_infinity,
        impl=impl,
        name="log_probs",
    )
