"""Multi-blank RNN-T and TDT (token-and-duration transducer) losses, with NeMo's meanings.

Both score one lattice whose arcs advance time by a duration (:mod:`..kernels.duration_lattice_numba`):

* **multi-blank RNN-T** (Xu et al., "Multi-blank transducers for speech recognition", 2022):
  the regular RNN-T lattice plus "big blanks", blank classes that skip ``big_blank_durations[i]``
  frames at once. As in NeMo the big blank of ``big_blank_durations[i]`` is class
  ``blank - 1 - i`` (NeMo's blank is the last class, the big blanks just before it), and one
  log-softmax runs over all ``V`` classes.
* **TDT** (Xu et al., "Efficient sequence transduction by jointly predicting tokens and
  durations", 2023): the last ``len(durations)`` outputs of the joiner are duration logits, the
  others label logits (the blank among them); the two groups are log-softmaxed separately. Every
  token and every blank also predicts how many frames to advance, ``durations[i]``; a token may
  advance 0 frames, a blank at least 1.

``sigma`` (logit under-normalisation) is subtracted from every label log-probability.
``omega`` (TDT only) mixes in the regular RNN-T loss of the label logits: NeMo draws it with
probability ``omega`` per batch; here the loss is the expectation of that draw,
``(1 - omega) * tdt + omega * rnnt``, deterministic.

Both are :class:`DurationLatticeCriterion` subclasses called through the one prologue of every
loss, :func:`lightning_gtn.core.criterion.apply_loss`, which checks the arguments and calls one
``torch.library`` custom op (:func:`duration_lattice_op`), so they compile under
``torch.compile(fullgraph=True)``; the gradient is computed in the forward pass (the numba
kernel on the CPU, the Triton kernels of :mod:`..kernels.rnnt_triton` on CUDA devices where they
pass their self-check, autograd through the torch reference elsewhere).
"""

from __future__ import annotations

import concurrent.futures
import math
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ..core import checks, criterion
from ..core.impl import Backends
from ..core.reduction import reduction_coefficients
from ..kernels import rnnt_triton as rnnt_kernels
from ..kernels.duration_lattice_numba import lattice_loss
from ..kernels.duration_lattice_torch import lattice_loss_torch
from ..kernels.rnnt_triton import duration_lattice_triton, rnnt_triton
from ..opargs import grads, op_schema
from .rnnt import JoinerCriterion

__all__ = [
    "multiblank_rnnt_loss",
    "tdt_loss",
    "duration_lattice_op",
    "DurationLatticeCriterion",
    "MultiblankCriterion",
    "TDTCriterion",
    "REDUCTIONS",
    "IMPLS",
]

#: ``reduction=`` values: ``"mean"`` is the batch mean (torchaudio's meaning, NeMo's
#: ``"mean_batch"``); ``"mean_volume"`` is NeMo's: the summed losses over the summed target lengths
REDUCTIONS = ("none", "mean", "sum", "mean_volume")
#: ``impl=`` values besides None (numba on the CPU, Triton on CUDA where it passes its self-check,
#: torch elsewhere, after the RNN-T kernels' self-check: :data:`BACKENDS`)
IMPLS = ("numba", "torch", "triton")
BACKENDS = Backends(
    "duration lattice",
    IMPLS,
    triton_available=rnnt_kernels.available,
    self_check=rnnt_kernels.self_check,
    kernels="Triton RNN-T",
)


# -- the op ---------------------------------------------------------------------------------------


def _lengths(x: Tensor, B: int, name: str, hi: int, bound: str, device: torch.device) -> np.ndarray:
    a = checks.check_index_tensor(x, name, (B,), "(B,)", device).detach().cpu().numpy().astype(np.int64)
    checks.check_in_range(a, name, bound, hi, inclusive=True, of="logits of shape (B, T, U + 1, V)")
    return a


def _targets(tg: Tensor, B: int, ulen: np.ndarray, K: int, forbidden: Sequence[int], device) -> np.ndarray:
    a = checks.check_index_tensor(tg, "targets", (B, None), "(B, U)", device).detach().cpu().numpy().astype(np.int64)
    valid = checks.check_padded_labels(a, ulen, K, forbidden, classes="K")
    out = np.zeros((B, max(a.shape[1], 1)), dtype=np.int64)
    out[:, : a.shape[1]] = np.where(valid, a, 0)
    return out


def _op_arcs(K, D, V, T, tok_dur, tok_didx, blank_ids, blank_dur, blank_didx):
    """Checks the op's arc description (the public losses build it right; a direct caller of the
    op may not) and clips durations past ``T`` to ``T + 1`` (they never land; no overflow)."""
    if not (1 <= K and 0 <= D and K + D <= V):
        raise ValueError(f"duration lattice: need 1 <= K and K + D <= V, got K={K}, D={D}, V={V}")
    if len(tok_dur) != len(tok_didx) or not (len(blank_ids) == len(blank_dur) == len(blank_didx) >= 1):
        raise ValueError("duration lattice: arc lists of unequal lengths (or no blank arc)")
    if any(not -1 <= i < D for i in list(tok_didx) + list(blank_didx)):
        raise ValueError(f"duration lattice: duration indices must lie in [-1, {D})")
    if any(not 0 <= c < K for c in blank_ids):
        raise ValueError(f"duration lattice: blank ids must lie in [0, {K})")
    if any(d < 0 for d in tok_dur) or any(d < 1 for d in blank_dur):
        raise ValueError("duration lattice: token durations must be >= 0 and blank durations >= 1")
    return [min(int(d), T + 1) for d in tok_dur], [min(int(d), T + 1) for d in blank_dur]


def _torch_pass(logits, tg, tlen, ulen, K, passes, normalise, coef, need_grad, lam=0.0):
    """``(losses, grad or None)`` of the torch reference (autograd must be on in this thread);
    ``lam``: FastEmit's weight on the token arcs' gradient."""
    dev = logits.device
    x = logits.detach().requires_grad_(need_grad)
    with torch.enable_grad():
        tgt = torch.from_numpy(tg).to(dev)
        tl, ul = torch.from_numpy(tlen), torch.from_numpy(ulen)
        total = None
        for arcs, d, sg, w in passes:
            a0, a1, a2, a3, a4 = arcs
            part = lattice_loss_torch(x, tgt, tl, ul, K, d, a0, a1, a2, a3, a4, sg, normalise, lam)
            total = w * part if total is None else total + w * part
        assert total is not None
        grad = None
        if need_grad:
            c = torch.from_numpy(coef).to(dev, x.dtype)
            obj = torch.where(torch.isfinite(total), total, torch.zeros_like(total))
            (grad,) = torch.autograd.grad((obj * c).sum(), x)
    return total.detach(), grad


def _triton_passes(logits, tg, tlen, ulen, K, passes, normalise, coef, need_grad, lam=0.0):
    """``(losses, grad or None)`` by the Triton kernels, each pass weighted and the gradient scaled
    by ``coef`` (FastEmit's ``lam`` applied by the kernels, which also scale the losses by
    ``1 + lam``): the regular RNN-T pass (omega's) by :func:`rnnt_triton` on the label logits, any
    other by :func:`duration_lattice_triton` on the label and duration logits (the first
    ``K + D`` columns, the layout of the numba kernel)."""
    B, T, U1, V = logits.shape
    dev = logits.device
    U = U1 - 1
    tgt = torch.zeros((B, U), dtype=torch.int64)  # the kernels read (B, U); ids past a length unread
    w_ = min(U, tg.shape[1])
    tgt[:, :w_] = torch.from_numpy(tg[:, :w_])
    tgt, xl, yl = tgt.to(dev), torch.from_numpy(tlen).to(dev), torch.from_numpy(ulen).to(dev)
    c = torch.from_numpy(coef).to(device=dev, dtype=logits.dtype).reshape(-1, 1, 1, 1)
    losses: Optional[Tensor] = None
    grad: Optional[Tensor] = None
    for (tok_dur, tok_didx, blank_ids, blank_dur, blank_didx), d, sg, w in passes:
        x = logits[..., : K + d]
        regular = d == 0 and sg == 0.0 and list(tok_dur) == [0] and len(blank_ids) == 1 and list(blank_dur) == [1]
        if regular:
            part, g = rnnt_triton(
                x, tgt, xl, yl, int(blank_ids[0]), fused_log_softmax=normalise, fastemit_lambda=lam, need_grad=need_grad
            )
        else:
            if d and any(i < 0 for i in list(tok_didx) + list(blank_didx)):
                raise ValueError("duration lattice: impl='triton' needs a duration column for every arc when D > 0")
            blanks = list(zip(blank_ids, blank_dur, blank_didx))
            emits = list(zip(tok_dur, tok_didx))
            part, g = duration_lattice_triton(x, tgt, xl, yl, blanks, emits, d, sg, normalise, need_grad, lam)
        part = part * w if w != 1.0 else part
        losses = part if losses is None else losses + part
        if g is not None:
            g.mul_(c * w if w != 1.0 else c)
            if grad is None and g.shape[-1] == V:
                grad = g
            else:
                if grad is None:
                    grad = torch.zeros_like(logits)
                grad[..., : g.shape[-1]] += g
    assert losses is not None
    return losses, grad


class DurationLatticeArgs(NamedTuple):
    """The arguments of ``lightning_gtn::duration_lattice_loss``."""

    logits: Tensor
    targets: Tensor
    logit_lengths: Tensor
    target_lengths: Tensor
    K: int
    D: int
    tok_dur: List[int]
    tok_didx: List[int]
    blank_ids: List[int]
    blank_dur: List[int]
    blank_didx: List[int]
    sigma: float
    omega: float
    normalise: bool
    reduction: str
    zero_infinity: bool
    impl: str
    need_grad: bool
    fastemit_lambda: float = 0.0
    clamp: float = -1.0


@torch.library.custom_op("lightning_gtn::duration_lattice_loss", mutates_args=())
@op_schema(DurationLatticeArgs)
def duration_lattice_op(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    K: int,
    D: int,
    tok_dur: List[int],
    tok_didx: List[int],
    blank_ids: List[int],
    blank_dur: List[int],
    blank_didx: List[int],
    sigma: float,
    omega: float,
    normalise: bool,
    reduction: str,
    zero_infinity: bool,
    impl: str,
    need_grad: bool,
    fastemit_lambda: float = 0.0,
    clamp: float = -1.0,
) -> Tuple[Tensor, Tensor]:
    """``(out, d out / d logits)`` of the duration lattice (see :mod:`..kernels.duration_lattice_numba`).

    ``out`` is ``(B,)`` for ``reduction="none"`` (the gradient is then per example, unscaled),
    else a scalar. ``omega > 0`` mixes in the regular RNN-T lattice over the label logits (the
    first blank id, duration 1; tokens duration 0; no ``sigma``). Lengths and target values are
    checked here, where ``torch.compile`` does not look. The gradient is empty without
    ``need_grad``. ``fastemit_lambda`` scales the gradient of every token arc (of every pass) by
    ``1 + fastemit_lambda`` and the losses by the same factor; ``clamp > 0`` clips each example's
    gradient to ``[-clamp, clamp]`` before the reduction's coefficients scale it.
    """
    B, T, U1, V = logits.shape
    dev = logits.device
    tok_dur, blank_dur = _op_arcs(K, D, V, T, tok_dur, tok_didx, blank_ids, blank_dur, blank_didx)
    tlen = _lengths(logit_lengths, B, "logit_lengths", T, "T", dev)
    ulen = _lengths(target_lengths, B, "target_lengths", U1 - 1, "U", dev)
    tg = _targets(targets, B, ulen, K, blank_ids, dev)
    lam = float(fastemit_lambda)
    impl = BACKENDS.pick(dev, impl or None)
    if reduction == "mean_volume":  # NeMo's: the sum over the total target length
        coef = reduction_coefficients("mean", B, count=int(ulen.sum())).numpy()
    else:
        coef = reduction_coefficients(reduction, B).numpy()
    red_coef = coef
    if clamp > 0:  # the kernels' gradient per example (unscaled), clipped, then scaled below
        coef = np.ones_like(coef)
    passes = []
    if omega < 1.0:
        passes.append(((tok_dur, tok_didx, blank_ids, blank_dur, blank_didx), D, sigma, 1.0 - omega))
    if omega > 0.0:
        passes.append((([0], [-1], [blank_ids[0]], [1], [-1]), 0, 0.0, omega))
    if impl == "numba":
        losses_np: Optional[np.ndarray] = None
        grad: Optional[Tensor] = None
        for arcs, d, sg, w in passes:
            a0, a1, a2, a3, a4 = (np.asarray(a, dtype=np.int64) for a in arcs)
            arcs_np = (a0, a1, a2, a3, a4)
            losses_np, g = lattice_loss(
                logits, tg, tlen, ulen, K, d, arcs_np, sg, normalise, coef, need_grad, grad, losses_np, w, lam
            )
            grad = g if need_grad else None
        assert losses_np is not None
        losses = torch.from_numpy(losses_np).to(logits.dtype)
    elif impl == "triton":
        losses, grad = _triton_passes(logits, tg, tlen, ulen, K, passes, normalise, coef, need_grad, lam)
    else:
        # autograd is off inside a custom op's implementation (a thread-local dispatch state):
        # the reference runs in a worker thread of its own, where it is on
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            losses, grad = pool.submit(
                _torch_pass, logits, tg, tlen, ulen, K, passes, normalise, coef, need_grad, lam
            ).result()
    losses = losses.to(dev)
    if lam != 0.0 and impl != "triton":  # NeMo's FastEmit: the reported cost scaled (Triton's already is)
        losses = losses * (1.0 + lam)
    if clamp > 0 and grad is not None:
        r = torch.from_numpy(red_coef).to(grad.device, grad.dtype).reshape(-1, 1, 1, 1)
        grad = grad.clamp_(-clamp, clamp).mul_(r)
    coef = red_coef
    # NaN in, NaN out: the kernels' max-based log-sum-exp would drop a NaN
    if bool(torch.isnan(logits.sum())):
        rows = torch.zeros(B, dtype=torch.bool)
        for b in range(B):
            if tlen[b] > 0 and bool(torch.isnan(logits[b, : tlen[b], : ulen[b] + 1]).any()):
                rows[b] = True
        if bool(rows.any()):
            rows = rows.to(dev)
            losses = losses.masked_fill(rows, float("nan"))
            if grad is not None:
                grad[rows] = float("nan")
    if zero_infinity:  # infeasible only (torch's rule): -inf from a +inf log-probability stays
        losses = torch.where(losses == math.inf, torch.zeros_like(losses), losses)
    if reduction == "none":
        out = losses
    else:
        out = (losses * torch.from_numpy(coef).to(dev, losses.dtype)).sum()
    return out, (grad if grad is not None else logits.new_empty(0))


@duration_lattice_op.register_fake
def _fake(*inputs):
    a = DurationLatticeArgs(*inputs)
    logits = a.logits
    out = logits.new_empty((logits.shape[0],) if a.reduction == "none" else ())
    return out, (torch.empty_like(logits) if a.need_grad else logits.new_empty(0))


def _setup(ctx, inputs, output):
    a = DurationLatticeArgs(*inputs)
    ctx.reduction = a.reduction
    ctx.need_grad = a.need_grad
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(output[1])


def _backward(ctx, g_out, _g_grad):
    (g,) = ctx.saved_tensors
    gx = None
    if g_out is not None and ctx.need_grad:
        if ctx.reduction == "none":
            gx = g * g_out.reshape(-1, 1, 1, 1).to(g.dtype)
        else:
            gx = g * g_out.to(g.dtype)
    return grads(DurationLatticeArgs, logits=gx)


duration_lattice_op.register_autograd(_backward, setup_context=_setup)


# -- the criteria ---------------------------------------------------------------------------------


class DurationLatticeCriterion(JoinerCriterion):
    """The duration lattice behind :func:`~lightning_gtn.core.criterion.apply_loss`: the joiner
    logits, torchaudio's index tensors, :data:`REDUCTIONS` and :data:`BACKENDS` as the RNN-T
    lattice's; ``fused_log_softmax`` and the lattice's own options (:meth:`lattice_options`)
    checked as call options; every call scored by :func:`duration_lattice_op` on the arcs
    :meth:`arcs` builds from the blank and those options."""

    reductions = REDUCTIONS
    backends = IMPLS
    picker = BACKENDS

    def check_call_options(self, shape: Tuple[int, ...], options: Dict[str, object]) -> Dict[str, object]:
        """``fused_log_softmax`` (a bool), ``fastemit_lambda`` (finite, ``>= 0``), ``clamp`` (a
        real number), then the lattice's options (:meth:`lattice_options`); TypeError for any other."""
        rest = dict(options)
        fused = checks.check_bool(rest.pop("fused_log_softmax", True), "fused_log_softmax")
        lam = checks.check_real(rest.pop("fastemit_lambda", 0.0), "fastemit_lambda")
        if lam < 0:
            raise ValueError(f"fastemit_lambda must be >= 0, got {lam}")
        clamp = checks.check_real(rest.pop("clamp", -1.0), "clamp")
        out = self.lattice_options(shape, rest)
        super().check_call_options(shape, rest)
        out["fused_log_softmax"] = fused
        out["fastemit_lambda"] = float(lam)
        out["clamp"] = float(clamp)
        return out

    def lattice_options(self, shape: Tuple[int, ...], options: Dict[str, object]) -> Dict[str, object]:
        """The lattice's options popped from ``options`` and checked against the logits' ``shape``."""
        raise NotImplementedError

    def arcs(self, V: int, blank: int, options: Dict[str, object]) -> Tuple[int, int, tuple, float, float]:
        """``(K, D, arcs, sigma, omega)`` of the op (see :func:`duration_lattice_op`) for ``V``
        classes, the blank of :meth:`check_options` and the checked options; ValueError for what
        relates the blank to the options."""
        raise NotImplementedError

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
        """:func:`duration_lattice_op` on the arcs of :meth:`arcs`."""
        K, D, arcs, sigma, omega = self.arcs(x.shape[-1], blank, options)
        tok_dur, tok_didx, blank_ids, blank_dur, blank_didx = (list(a) for a in arcs)
        args = DurationLatticeArgs(
            logits=x,
            targets=targets,
            logit_lengths=input_lengths,
            target_lengths=target_lengths,
            K=int(K),
            D=int(D),
            tok_dur=tok_dur,
            tok_didx=tok_didx,
            blank_ids=blank_ids,
            blank_dur=blank_dur,
            blank_didx=blank_didx,
            sigma=float(sigma),
            omega=float(omega),
            normalise=bool(options["fused_log_softmax"]),
            reduction=reduction,
            zero_infinity=zero_infinity,
            impl=impl,
            need_grad=need_e,
            fastemit_lambda=float(options.get("fastemit_lambda", 0.0)),  # type: ignore[arg-type]
            clamp=float(options.get("clamp", -1.0)),  # type: ignore[arg-type]
        )
        return duration_lattice_op(*args)[0]


class MultiblankCriterion(DurationLatticeCriterion):
    """:func:`multiblank_rnnt_loss`: the blank resolved against ``V``; ``big_blank_durations``,
    ``sigma`` and ``big_blank_ids`` as call options; tokens keep the frame, each blank advances
    its duration (no duration logits: ``K = V``, ``D = 0``)."""

    kind = "multiblank_rnnt"
    name = "multiblank_rnnt_loss"

    def check_options(self, C: int, blank, weights, device: torch.device):
        """``(blank in [0, V), None)`` (negative ids count from the end)."""
        return checks.check_class_id(blank, "blank", C), None

    def lattice_options(self, shape: Tuple[int, ...], options: Dict[str, object]) -> Dict[str, object]:
        """``big_blank_durations`` (strictly increasing, ``>= 1``, may be empty), ``sigma`` (real)
        and ``big_blank_ids`` (None, or one class id in ``[-V, V)`` per big blank)."""
        V = shape[-1]
        durs = checks.check_durations(
            options.pop("big_blank_durations", ()), "big_blank_durations", allow_empty=True, allow_zero=False
        )
        sigma = checks.check_real(options.pop("sigma", 0.0), "sigma")
        big_blank_ids = options.pop("big_blank_ids", None)
        ids = None
        if big_blank_ids is not None:
            if isinstance(big_blank_ids, (str, bytes)) or not isinstance(big_blank_ids, Sequence):
                raise ValueError(f"big_blank_ids must be a list of class ids, got {big_blank_ids!r}")
            ids = [checks.check_class_id(c, "big_blank_ids", V) for c in big_blank_ids]
            if len(ids) != len(durs):
                raise ValueError(f"big_blank_ids must have len(big_blank_durations)={len(durs)} ids, got {len(ids)}")
        return {"big_blank_durations": durs, "sigma": sigma, "big_blank_ids": ids}

    def arcs(self, V: int, blank: int, options: Dict[str, object]) -> Tuple[int, int, tuple, float, float]:
        """The blank and each big blank (NeMo's ``blank - 1 - i`` unless ``big_blank_ids``): ValueError
        when NeMo's placement leaves no room or the ids are not distinct classes besides the blank."""
        durs: List[int] = list(options["big_blank_durations"])  # type: ignore[call-overload]
        ids: Optional[List[int]] = options["big_blank_ids"]  # type: ignore[assignment]
        if ids is None:
            if blank < len(durs):
                raise ValueError(
                    f"blank={blank} leaves no room for {len(durs)} big blanks at blank - 1 - i (NeMo's placement); "
                    "put the blank last or pass big_blank_ids"
                )
            ids = [blank - 1 - i for i in range(len(durs))]
        elif len(set(ids + [blank])) != len(ids) + 1:
            raise ValueError(f"big_blank_ids must be distinct classes other than blank={blank}, got {ids}")
        arcs = ([0], [-1], [blank] + ids, [1] + durs, [-1] * (1 + len(durs)))
        return V, 0, arcs, float(options["sigma"]), 0.0  # type: ignore[arg-type]


class TDTCriterion(DurationLatticeCriterion):
    """:func:`tdt_loss`: ``durations``, ``sigma`` and ``omega`` as call options; the last
    ``D = len(durations)`` classes are duration logits, the blank is resolved against the
    ``K = V - D`` label classes once the durations are known."""

    kind = "tdt"
    name = "tdt_loss"

    def check_options(self, C: int, blank, weights, device: torch.device):
        """``(blank, None)`` once ``blank`` is an integer (an int, numpy integer or 0-dim integer
        tensor); its range, the label classes ``[-K, K)``, is checked in :meth:`arcs`, once the
        durations give ``K``."""
        if isinstance(blank, Tensor) and blank.dim() == 0 and not (blank.is_floating_point() or blank.is_complex()):
            blank = blank.item()
        if isinstance(blank, (bool, np.bool_)) or not isinstance(blank, (int, np.integer)):
            raise ValueError(f"blank must be an integer class id in [-K, K) (K: the label classes), got {blank!r}")
        return int(blank), None

    def lattice_options(self, shape: Tuple[int, ...], options: Dict[str, object]) -> Dict[str, object]:
        """``durations`` (strictly increasing, ``>= 0``, one ``>= 1``, fewer than ``V``), ``sigma``
        (real) and ``omega`` (in ``[0, 1]``)."""
        V = shape[-1]
        durs = checks.check_durations(
            options.pop("durations", (0, 1, 2, 3, 4)), "durations", allow_empty=False, allow_zero=True
        )
        if durs[-1] < 1:
            raise ValueError(f"durations must hold a duration >= 1 (a blank advances at least one frame), got {durs}")
        D = len(durs)
        if V - D < 1:
            raise ValueError(f"logits must have V > len(durations)={D} classes (labels, then durations), got V={V}")
        sigma = checks.check_real(options.pop("sigma", 0.0), "sigma")
        omega = checks.check_real(options.pop("omega", 0.0), "omega", 0.0, 1.0)
        return {"durations": durs, "sigma": sigma, "omega": omega}

    def arcs(self, V: int, blank: int, options: Dict[str, object]) -> Tuple[int, int, tuple, float, float]:
        """Every token and every blank with each duration (a blank only with those ``>= 1``)."""
        durs: List[int] = list(options["durations"])  # type: ignore[call-overload]
        D = len(durs)
        K = V - D
        blank = checks.check_class_id(blank, "blank", K, "K")
        pos = [i for i, d in enumerate(durs) if d > 0]
        arcs = (durs, list(range(D)), [blank] * len(pos), [durs[i] for i in pos], pos)
        return K, D, arcs, float(options["sigma"]), float(options["omega"])  # type: ignore[arg-type]


#: the criteria of :func:`multiblank_rnnt_loss` and :func:`tdt_loss`
MULTIBLANK = MultiblankCriterion()
TDT = TDTCriterion()


# -- the public losses ----------------------------------------------------------------------------


def multiblank_rnnt_loss(
    logits: Tensor,
    targets,
    logit_lengths,
    target_lengths,
    blank: int = -1,
    big_blank_durations: Sequence[int] = (),
    sigma: float = 0.0,
    reduction: str = "mean",
    fused_log_softmax: bool = True,
    *,
    big_blank_ids: Optional[Sequence[int]] = None,
    zero_infinity: bool = False,
    impl: Optional[str] = None,
    fastemit_lambda: float = 0.0,
    clamp: float = -1.0,
) -> Tensor:
    """Multi-blank RNN-T loss (NeMo's ``MultiblankRNNTLossPytorch`` / ``MultiblankRNNTLossNumba``).

    The regular RNN-T lattice (a token keeps the frame, the blank ``blank`` advances one frame)
    plus one "big blank" per ``big_blank_durations[i]`` that advances that many frames at once.
    A path ends with any blank from the last target position landing exactly on the last frame.
    With no big blanks this is the regular RNN-T loss.

    Args:
        logits: ``(B, T, U + 1, V)`` joiner outputs, ``V`` = tokens + 1 + ``len(big_blank_durations)``.
            float32/float64 (float16/bfloat16 are computed in float32). Any device.
        targets: ``(B, U)`` integer token ids (padded), never a blank class.
        logit_lengths: ``(B,)`` frames of each example, ``0 <= logit_lengths[b] <= T``.
        target_lengths: ``(B,)`` tokens of each example, ``0 <= target_lengths[b] <= U``.
        blank: the standard blank's class id, ``[-V, V)`` (negative counts from the end; NeMo's
            blank is the last class, ``-1``).
        big_blank_durations: strictly increasing integers ``>= 1`` (NeMo: e.g. ``[2, 4, 8]``);
            empty gives the regular RNN-T loss.
        sigma: logit under-normalisation: subtracted from every log-probability (NeMo recommends 0.05).
        reduction: ``"none"`` ``(B,)`` losses; ``"sum"``; ``"mean"`` the batch mean (torchaudio's
            meaning, NeMo's ``"mean_batch"``); ``"mean_volume"`` the summed losses over the summed
            target lengths (NeMo's). NeMo's own ``"mean"`` (each loss over its target length, then
            the batch mean) is ``(loss(reduction="none") / target_lengths).mean()``.
        fused_log_softmax: True: ``logits`` are raw scores, log-softmaxed over ``V`` here; False:
            they already are log-probabilities.
        big_blank_ids: the class of each big blank; None (default) is NeMo's placement, the big
            blank of ``big_blank_durations[i]`` is ``blank - 1 - i`` (then ``blank >= len(durations)``).
        zero_infinity: an example without a complete path (no frames) gives 0 instead of inf.
        impl: None (numba on the CPU; Triton on a CUDA device where it passes its self-check, else
            the torch reference), ``"numba"`` (CPU), ``"torch"`` (any device) or ``"triton"`` (CUDA
            tensors, or CPU tensors under ``TRITON_INTERPRET=1``).
        fastemit_lambda: FastEmit regularisation (Yu et al. 2021) as :func:`~.rnnt.rnnt_loss`'s:
            the gradient of every token (non-blank) arc is scaled by ``1 + fastemit_lambda`` and
            the reported cost is ``(1 + fastemit_lambda) * cost``; blanks and big blanks are not
            emits. Finite and ``>= 0``.
        clamp: when ``> 0``, every element of each example's gradient w.r.t. the logits is
            clipped to ``[-clamp, clamp]`` before the reduction's scaling (as
            :func:`~.rnnt.rnnt_loss`); ``<= 0`` leaves it alone.

    Returns:
        ``(B,)`` for ``reduction="none"``, else a scalar, in ``logits``'s dtype. NaN logits in an
        example's lattice give a NaN loss.
    """
    return criterion.apply_loss(
        MULTIBLANK,
        logits,
        targets,
        logit_lengths,
        target_lengths,
        blank=blank,
        reduction=reduction,
        zero_infinity=zero_infinity,
        impl=impl,
        name="logits",
        fused_log_softmax=fused_log_softmax,
        big_blank_durations=big_blank_durations,
        sigma=sigma,
        big_blank_ids=big_blank_ids,
        fastemit_lambda=fastemit_lambda,
        clamp=clamp,
    )


def tdt_loss(
    logits: Tensor,
    targets,
    logit_lengths,
    target_lengths,
    blank: int = -1,
    durations: Sequence[int] = (0, 1, 2, 3, 4),
    sigma: float = 0.0,
    omega: float = 0.0,
    reduction: str = "mean",
    fused_log_softmax: bool = True,
    *,
    zero_infinity: bool = False,
    impl: Optional[str] = None,
    fastemit_lambda: float = 0.0,
    clamp: float = -1.0,
) -> Tensor:
    """TDT loss, the token-and-duration transducer (NeMo's ``TDTLossPytorch`` / ``TDTLossNumba``).

    The last ``len(durations)`` classes of ``logits`` are duration logits, the first
    ``K = V - len(durations)`` label logits (tokens and the blank); each group is log-softmaxed on
    its own. At node ``(t, u)`` a token ``y[u]`` with duration ``durations[i]`` goes to
    ``(t + durations[i], u + 1)``, a blank with a positive duration ``durations[i]`` to
    ``(t + durations[i], u)``; each arc scores ``log p(label) - sigma + log p(duration i)``. A path
    ends with a blank from the last target position landing exactly on the last frame.

    Args:
        logits: ``(B, T, U + 1, K + len(durations))`` joiner outputs; float32/float64; any device.
        targets: ``(B, U)`` integer token ids in ``[0, K)``, never ``blank``.
        logit_lengths: ``(B,)`` frames, ``0 <= logit_lengths[b] <= T``.
        target_lengths: ``(B,)`` tokens, ``0 <= target_lengths[b] <= U``.
        blank: the blank's id among the label classes, ``[-K, K)`` (NeMo's is the last label
            class, ``-1`` here).
        durations: strictly increasing integers ``>= 0`` with at least one ``>= 1`` (NeMo: e.g.
            ``[0, 1, 2, 3, 4]``; its CUDA kernel needs 0 and 1 among them, this lattice does not).
        sigma: logit under-normalisation: subtracted from every label log-probability (not from
            the durations'), NeMo recommends 0.05.
        omega: in ``[0, 1]``, the weight of the regular RNN-T loss of the label logits (tokens
            keep the frame, the blank advances one; no ``sigma``): the loss is
            ``(1 - omega) * tdt + omega * rnnt``, the expectation of NeMo's per-batch draw.
        reduction: as :func:`multiblank_rnnt_loss` (``"mean"`` is the batch mean).
        fused_log_softmax: True: raw scores; False: both groups already are log-probabilities.
        zero_infinity: an example without a complete path gives 0 instead of inf.
        impl: as :func:`multiblank_rnnt_loss`.
        fastemit_lambda: as :func:`multiblank_rnnt_loss`: every token arc, whatever its duration,
            is an emit (its label and duration scores' gradient scaled by ``1 + fastemit_lambda``);
            blanks are not. With ``omega > 0`` it applies to the mixed-in RNN-T loss's tokens too.
        clamp: as :func:`multiblank_rnnt_loss` (the gradient of the whole, mixed loss).

    Returns:
        ``(B,)`` for ``reduction="none"``, else a scalar, in ``logits``'s dtype.
    """
    return criterion.apply_loss(
        TDT,
        logits,
        targets,
        logit_lengths,
        target_lengths,
        blank=blank,
        reduction=reduction,
        zero_infinity=zero_infinity,
        impl=impl,
        name="logits",
        fused_log_softmax=fused_log_softmax,
        durations=durations,
        sigma=sigma,
        omega=omega,
        fastemit_lambda=fastemit_lambda,
        clamp=clamp,
    )
