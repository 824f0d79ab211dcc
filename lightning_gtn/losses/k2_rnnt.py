"""k2's RNN-T functions, with k2's names, arguments and meanings (``import lightning_gtn.k2 as k2``).

Every loss here reduces an RNN-T lattice to two tensors of log-probabilities, ``px`` (emit the
next symbol) and ``py`` (emit the termination symbol, the blank), and scores them with k2's
recursion (``lightning_gtn/kernels/mutual_information.py``), a
:class:`~lightning_gtn.core.criterion.Criterion` whose input is the pair ``(px, py)``, called
through :func:`~lightning_gtn.core.criterion.apply_loss` by :func:`mutual_information_recursion`
and by every loss here::

    px: (B, S, T + 1) for rnnt_type="regular" (column T is -inf: no symbol after the last
        frame), (B, S, T) for "modified" / "constrained"
    py: (B, S + 1, T)

``S`` is the (padded) number of symbols, ``T`` the number of frames, ``C`` the classes;
``boundary`` ``(B, 4)`` holds ``[s_begin, t_begin, s_end, t_end]`` per sequence (default
``[0, 0, S, T]``). The losses are negative log-likelihoods; ``reduction`` is ``"none"`` (``(B,)``),
``"mean"`` (``torch.mean`` over the batch: NOT divided by target lengths) or ``"sum"``.

Beyond k2: arguments are checked with ValueErrors that name them (shapes, dtypes, symbols and
``termination_symbol`` in ``[0, C)``, boundaries in range, ``ranges`` in range); where k2 asserts
that a modified/constrained sequence has ``T >= S``, such a sequence here has no path and its
loss is ``inf`` with zero gradients; :func:`get_rnnt_prune_ranges` widens a too small ``s_range``
(with a warning) to the smallest one with which every sequence keeps a path, so ``U > T`` and
``s_range`` 1 give finite losses. NaN in the inputs gives NaN losses for the sequences that read it.
"""

from __future__ import annotations

import math
import warnings
from typing import Dict, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..core import checks, criterion
from ..core.checks import check_float_tensor
from ..core.criterion import Criterion
from ..core.impl import Backends
from ..core.reduction import reduce_losses
from ..kernels import rnnt_triton as rnnt_kernels
from ..kernels.mutual_information import check_boundary_values, mutual_information
from ..opargs import grads, op_schema

__all__ = [
    "RNNT_TYPES",
    "mutual_information_recursion",
    "joint_mutual_information_recursion",
    "fix_for_boundary",
    "get_rnnt_logprobs",
    "rnnt_loss_simple",
    "get_rnnt_logprobs_joint",
    "rnnt_loss",
    "get_rnnt_prune_ranges",
    "get_rnnt_prune_ranges_deprecated",
    "do_rnnt_pruning",
    "get_rnnt_logprobs_pruned",
    "get_hat_logprobs_pruned",
    "rnnt_loss_pruned",
    "get_rnnt_logprobs_smoothed",
    "rnnt_loss_smoothed",
]

#: k2's lattice variants: ``"regular"`` (a symbol keeps the frame), ``"modified"`` (every symbol
#: also takes a frame: at most one symbol per frame), ``"constrained"`` (as modified, scored with
#: the blank of the next context on the same frame added to each symbol)
RNNT_TYPES = ("regular", "modified", "constrained")

NEG_INF = -math.inf


# -- checks --------------------------------------------------------------------------------------


def _compute(x: Tensor) -> Tensor:
    """float16 / bfloat16 are computed in float32 (k2 takes float32 or float64)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _eager() -> bool:
    """False while ``torch.compile`` traces: the checks of tensor values (which read them on the
    host) are skipped there; the numba kernel still range-checks boundaries itself."""
    return not torch.compiler.is_compiling()


def _check_symbols(symbols, B: int, S: int, C: int, device) -> Tensor:
    sym = checks.check_index_tensor(symbols, "symbols", (B, S), "(B, S)").to(device)
    if _eager():
        checks.check_in_range(sym, "symbols", "C", C, inclusive=False)
    return sym


def _check_termination(termination_symbol, C: int) -> int:
    if isinstance(termination_symbol, Tensor) and termination_symbol.numel() == 1:
        termination_symbol = termination_symbol.item()
    return checks.check_label(termination_symbol, "termination_symbol", C)


def _check_type(rnnt_type) -> str:
    if rnnt_type not in RNNT_TYPES:
        raise ValueError(f"rnnt_type must be one of {RNNT_TYPES}, got {rnnt_type!r}")
    return rnnt_type


def _check_boundary(boundary, B: int, S: int, T: int, device=None) -> Optional[Tensor]:
    """None, or ``boundary`` as a checked ``(B, 4)`` int64 tensor on ``device`` (None: where it is)."""
    if boundary is None:
        return None
    bnd = checks.check_index_tensor(boundary, "boundary", (B, 4), "(B, 4)")
    if device is not None:
        bnd = bnd.to(device)
    if _eager():
        check_boundary_values(bnd.detach().cpu().numpy(), S, T)
    return bnd


#: the implementations of k2's recursion (``impl=`` besides None) and how None resolves: numba on
#: the CPU, Triton on CUDA where the RNN-T kernels pass their self-check, torch elsewhere
MI_IMPLS = ("numba", "torch", "triton")
MI_BACKENDS = Backends(
    "mutual_information",
    MI_IMPLS,
    triton_available=rnnt_kernels.available,
    self_check=rnnt_kernels.self_check,
    kernels="Triton RNN-T",
)


class MutualInformationArgs(NamedTuple):
    """The arguments of ``lightning_gtn::mutual_information``."""

    px: Tensor
    py: Tensor
    boundary: Tensor
    need_grad: bool
    impl: str


@torch.library.custom_op("lightning_gtn::mutual_information", mutates_args=())
@op_schema(MutualInformationArgs)
def mutual_information_op(
    px: Tensor, py: Tensor, boundary: Tensor, need_grad: bool, impl: str
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(scores (B,), px_grad, py_grad)`` of the recursion (see :mod:`lightning_gtn.kernels.mutual_information`) by the
    implementation ``impl`` (``"numba"``, ``"torch"`` or ``"triton"``); the grads are ``(0,)`` tensors
    without ``need_grad``; ``""`` is the device's default (chosen here, eagerly, so that a CUDA
    self-check never runs while ``torch.compile`` traces). ``boundary`` is ``(B, 4)`` int64,
    already range-checked."""
    # the shapes are checked by the kernels' entry: the op may be called directly
    return mutual_information(px, py, boundary, need_grad, impl or MI_BACKENDS.default(px.device))


@mutual_information_op.register_fake
def _mi_fake(*inputs):
    a = MutualInformationArgs(*inputs)
    px, py = a.px, a.py
    B = px.shape[0]
    if a.need_grad:
        return px.new_empty((B,)), torch.empty_like(px), torch.empty_like(py)
    return px.new_empty((B,)), px.new_empty(0), py.new_empty(0)


def _mi_setup(ctx, inputs, output):
    ctx.need_grad = MutualInformationArgs(*inputs).need_grad
    ctx.save_for_backward(output[1], output[2])


def _mi_backward(ctx, g_scores, _g_px, _g_py):
    if not ctx.need_grad:
        raise RuntimeError("mutual_information: called with need_grad=False, so it has no backward")
    pxg, pyg = ctx.saved_tensors
    g = g_scores.reshape(-1, 1, 1)
    return grads(MutualInformationArgs, px=pxg * g, py=pyg * g)


mutual_information_op.register_autograd(_mi_backward, setup_context=_mi_setup)


def _full_boundary(boundary: Optional[Tensor], B: int, S: int, T: int, device) -> Tensor:
    if boundary is not None:
        return boundary
    return torch.tensor([0, 0, S, T], dtype=torch.long, device=device).expand(B, 4).contiguous()


def _check_delay(delay_penalty) -> float:
    return checks.check_real(delay_penalty, "delay_penalty", finite=False)


class _Recursion(Criterion):
    """k2's recursion as a criterion of :func:`~lightning_gtn.core.criterion.apply_loss`.

    The input is the pair ``(px, py)`` (checked by :meth:`check_emissions`, which gives its shape
    as ``(B, S + 1, T + 1, 2)``: the grid's nodes and the two arcs out of each); there are no
    targets or lengths (the symbols are read into ``px`` before). Call options: ``boundary``
    (None or ``(B, 4)``) and ``return_grad`` (None, or an empty list that receives the detached
    ``(px_grad, py_grad)``). The result is the scores ``(B,)`` (``reduction="none"`` only).
    """

    name = "mutual_information"
    picker = MI_BACKENDS
    reductions: Tuple[str, ...] = ("none",)

    def check_emissions(self, emissions, name: str) -> Tuple[int, ...]:
        if not isinstance(emissions, tuple) or len(emissions) != 2:
            raise ValueError(f"{self.name}: the input must be the pair (px, py), got {type(emissions).__name__}")
        px, py = emissions
        check_float_tensor(px, "px", 3, "(B, S, T + 1) or (B, S, T)")
        check_float_tensor(py, "py", 3, "(B, S + 1, T)")
        B, S, T1 = px.shape
        if py.shape[0] != B or py.shape[1] != S + 1 or T1 not in (py.shape[2], py.shape[2] + 1):
            raise ValueError(
                f"py must have shape (B, S + 1, T) with px (B, S, T + 1) or (B, S, T); got px {tuple(px.shape)}, "
                f"py {tuple(py.shape)}"
            )
        if px.dtype != py.dtype:
            raise ValueError(f"px and py must have the same dtype, got {px.dtype} and {py.dtype}")
        if px.device != py.device:
            raise ValueError(f"px and py must be on the same device, got {px.device} and {py.device}")
        return (B, S + 1, py.shape[2] + 1, 2)

    def check_call_options(self, shape: Tuple[int, ...], options: Dict[str, object]) -> Dict[str, object]:
        rest = dict(options)
        boundary, sink = rest.pop("boundary", None), rest.pop("return_grad", None)
        super().check_call_options(shape, rest)  # any other option: TypeError
        B, S1, T1, _ = shape
        return {"boundary": _check_boundary(boundary, B, S1 - 1, T1 - 1), "return_grad": sink}

    def own_kernel(self, device: torch.device, impl: Optional[str]) -> Optional[str]:
        return impl or ""  # "": the op picks the device's default

    def index_tensors(self, targets, input_lengths, target_lengths, B: int, device: torch.device):
        return None, None, None

    def call_kernel(
        self, x, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, impl, need_e, options
    ) -> Tensor:
        px, py = x
        B, S, _ = px.shape
        T = py.shape[2]
        bnd = options["boundary"]
        bnd = _full_boundary(None if bnd is None else bnd.to(px.device), B, S, T, px.device)
        sink = options["return_grad"]
        args = MutualInformationArgs(
            px=px.contiguous(), py=py.contiguous(), boundary=bnd, need_grad=bool(need_e or sink is not None), impl=impl
        )
        scores, pxg, pyg = mutual_information_op(*args)
        if sink is not None:
            sink.extend((pxg.detach(), pyg.detach()))
        return self.finish(scores, reduction)

    def finish(self, scores: Tensor, reduction: str) -> Tensor:
        """The result from the recursion's ``(B,)`` log-likelihoods: the scores themselves."""
        return scores


class _RecursionLoss(_Recursion):
    """k2's losses: the recursion's negated log-likelihoods, reduced (k2's ``"none"``,
    ``"mean"``, the batch mean, and ``"sum"``)."""

    reductions = ("none", "mean", "sum")

    def finish(self, scores: Tensor, reduction: str) -> Tensor:
        return reduce_losses(-scores, reduction)


#: the recursion (:func:`mutual_information_recursion`) and k2's losses (every other scoring function)
_MI = _Recursion()
_MI_LOSS = _RecursionLoss()


# -- log-probabilities of joiner outputs ---------------------------------------------------------


class _ArcLogProbs(torch.autograd.Function):
    """``(px, py)`` ``(B, T, R)``: the log-softmax over ``C`` of ``logits`` ``(B, T, R, C)`` read
    at ``kept`` ``(B, T, R)`` and at the blank, without materialising the log-softmax. The
    backward writes ``softmax * -(g_px + g_py)`` plus the two read classes into one buffer
    (autograd through logsumexp and gather would keep a second ``(B, T, R, C)`` tensor)."""

    @staticmethod
    def forward(ctx, logits: Tensor, kept: Tensor, term: int):
        lse = torch.logsumexp(logits, dim=3)
        px = logits.gather(3, kept.unsqueeze(3)).squeeze(3) - lse
        py = logits[..., term] - lse
        ctx.save_for_backward(logits, lse, kept)
        ctx.term = term
        return px, py

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_px: Tensor, g_py: Tensor):
        logits, lse, kept = ctx.saved_tensors
        g_px = torch.zeros_like(lse) if g_px is None else g_px
        g_py = torch.zeros_like(lse) if g_py is None else g_py
        grad = torch.exp(logits - lse.unsqueeze(3))
        grad.mul_(-(g_px + g_py).unsqueeze(3))
        grad.scatter_add_(3, kept.unsqueeze(3), g_px.unsqueeze(3))
        grad[..., ctx.term] += g_py
        return grad, None, None


# -- the recursion -------------------------------------------------------------------------------


def mutual_information_recursion(
    px: Tensor,
    py: Tensor,
    boundary: Optional[Tensor] = None,
    return_grad: bool = False,
    *,
    impl: Optional[str] = None,
) -> Union[Tensor, Tuple[Tensor, Tuple[Tensor, Tensor]]]:
    """The log-sum over all monotone paths of the ``(S + 1, T + 1)`` grid (k2's recursion)::

        p[b, s_begin, t_begin] = 0
        p[b, s, t] = logadd(p[b, s - 1, t] + px[b, s - 1, t], p[b, s, t - 1] + py[b, s, t - 1])

    (``px`` of shape ``(B, S, T)`` instead of ``(B, S, T + 1)`` selects the modified recursion,
    where the ``px`` arc also advances ``t``: ``p[b, s - 1, t - 1] + px[b, s - 1, t - 1]``).

    Args:
        px: ``(B, S, T + 1)`` or ``(B, S, T)`` float.
        py: ``(B, S + 1, T)``, same dtype.
        boundary: None (``[0, 0, S, T]`` for every row) or ``(B, 4)`` integers
            ``[s_begin, t_begin, s_end, t_end]``, ``0 <= s_begin <= s_end <= S``,
            ``0 <= t_begin <= t_end <= T``.
        return_grad: also return ``(px_grad, py_grad)``, the gradients of ``scores.sum()``
            (occupation probabilities of the arcs), which :func:`get_rnnt_prune_ranges` reads.
        impl: beyond k2: None (numba on the CPU; Triton on a CUDA device where it passes its
            self-check, else torch), ``"numba"``, ``"torch"`` or ``"triton"`` (CUDA tensors, or CPU
            tensors under ``TRITON_INTERPRET=1``).

    Returns:
        ``scores`` ``(B,)``: ``p[b, s_end, t_end]`` (a log-likelihood), or
        ``(scores, (px_grad, py_grad))`` with ``return_grad``.
    """
    sink: Optional[list] = [] if return_grad else None
    scores = criterion.apply_loss(
        _MI, (px, py), None, None, None, reduction="none", impl=impl, boundary=boundary, return_grad=sink
    )
    if sink is not None:
        return scores, (sink[0].to(px.dtype), sink[1].to(px.dtype))
    return scores


def _check_parts(parts, name: str, n: Optional[int] = None) -> Tuple[Tensor, ...]:
    """The tensors of the non-empty sequence ``parts`` (``n`` of them), all of ``parts[0]``'s
    shape, dtype and device."""
    if isinstance(parts, Tensor) or not isinstance(parts, (list, tuple)) or not parts:
        raise ValueError(f"{name} must be a non-empty list or tuple of tensors, got {type(parts).__name__}")
    if n is not None and len(parts) != n:
        raise ValueError(f"{name} must hold as many tensors as px ({n}), got {len(parts)}")
    first = parts[0]
    check_float_tensor(first, f"{name}[0]", 3, "(B, S, T + 1) or (B, S, T)" if name == "px" else "(B, S + 1, T)")
    for i, x in enumerate(parts):
        if not isinstance(x, Tensor) or x.shape != first.shape or x.dtype != first.dtype or x.device != first.device:
            got = (tuple(x.shape), x.dtype, x.device) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(
                f"{name}[{i}] must have {name}[0]'s shape, dtype and device "
                f"({tuple(first.shape)}, {first.dtype}, {first.device}), got {got}"
            )
    return tuple(parts)


def joint_mutual_information_recursion(
    px: Sequence[Tensor],
    py: Sequence[Tensor],
    boundary: Optional[Tensor] = None,
    *,
    impl: Optional[str] = None,
) -> Tensor:
    """The recursion of the summed terms ``sum(px)``, ``sum(py)``, with its log-likelihood split
    into one part per term.

    With ``g_x``, ``g_y`` the occupation probabilities of the arcs in the recursion of
    ``(sum(px), sum(py))`` (:func:`mutual_information_recursion`'s ``return_grad``), part ``n``
    is ``<g_x, px[n]> + <g_y, py[n]>`` (``-inf`` entries read as the most negative finite value,
    so that unused arcs add 0); part 0 also carries the constant
    ``scores - sum_n <g_x, px[n]> + <g_y, py[n]>`` (log of a sum against sum of logs), so the
    parts sum to the recursion's ``scores``. The gradient of part ``n`` with respect to
    ``px[n]`` is ``g_x`` (``g`` taken as a constant), so that of the sum is the recursion's.

    Args:
        px: a non-empty list or tuple of ``(B, S, T + 1)`` (or ``(B, S, T)``: modified)
            tensors of one shape and dtype; put the main term first.
        py: as many ``(B, S + 1, T)`` tensors.
        boundary: as :func:`mutual_information_recursion`.
        impl: beyond k2, keyword-only: the recursion's implementation.

    Returns:
        ``(len(px), B)`` in ``px``'s dtype; summed over dim 0 it is the recursion's ``(B,)``
        log-likelihood.
    """
    pxs = _check_parts(px, "px")
    pys = _check_parts(py, "py", len(pxs))
    px_cat = _compute(torch.stack(pxs))  # (N, B, S, T + 1)
    py_cat = _compute(torch.stack(pys)).to(px_cat.dtype)  # (N, B, S + 1, T)
    sink: list = []
    scores = criterion.apply_loss(
        _MI,
        (px_cat.sum(0).detach(), py_cat.sum(0).detach()),
        None,
        None,
        None,
        reduction="none",
        impl=impl,
        boundary=boundary,
        return_grad=sink,
    )
    pxg, pyg = sink[0].to(px_cat.dtype), sink[1].to(px_cat.dtype)
    lowest = torch.finfo(px_cat.dtype).min
    N, B = px_cat.shape[0], px_cat.shape[1]
    parts = (pxg * px_cat.clamp(min=lowest)).reshape(N, B, -1).sum(2)
    parts = parts + (pyg * py_cat.clamp(min=lowest)).reshape(N, B, -1).sum(2)
    offset = (scores.to(parts.dtype) - parts.sum(0)).detach()
    parts = torch.cat([parts[:1] + offset, parts[1:]])
    return parts.to(pxs[0].dtype)


# -- the simple loss (joiner = addition) ---------------------------------------------------------


def _check_lm_am(lm, am) -> Tuple[int, int, int, int]:
    check_float_tensor(lm, "lm", 3, "(B, S + 1, C)")
    check_float_tensor(am, "am", 3, "(B, T, C)")
    if lm.shape[0] != am.shape[0] or lm.shape[2] != am.shape[2] or lm.shape[1] < 1:
        raise ValueError(
            f"lm must have shape (B, S + 1, C) and am (B, T, C) with the same B and C, got lm {tuple(lm.shape)}, "
            f"am {tuple(am.shape)}"
        )
    if lm.device != am.device:
        raise ValueError(f"lm and am must be on the same device, got {lm.device} and {am.device}")
    B, T, C = am.shape
    return B, lm.shape[1] - 1, T, C


def _end_column(px: Tensor) -> Tensor:
    """``(B, S, T)`` -> ``(B, S, T + 1)`` with a last column of -inf (no symbol after the last frame)."""
    B, S, _ = px.shape
    return torch.cat([px, px.new_full((B, S, 1), NEG_INF)], dim=2)


def _block_past_end(px: Tensor, boundary: Optional[Tensor]) -> Tensor:
    """Regular ``px`` ``(B, S, T + 1)``: -inf at column ``t_end`` of each row (k2's
    ``fix_for_boundary``): no symbol is emitted after a sequence's last frame."""
    if boundary is None:
        return px
    B, S, T1 = px.shape
    col = boundary[:, 3].reshape(B, 1, 1).expand(B, S, 1)
    return px.scatter(2, col, NEG_INF)


def fix_for_boundary(px: Tensor, boundary: Optional[Tensor] = None) -> Tensor:
    """Blocks the symbol arcs after each sequence's last frame of a regular ``px``, in place:
    ``px[b, :, boundary[b, 3]] = -inf`` (with ``boundary=None`` the last column, which a regular
    ``px`` already holds as ``-inf``, is the end: ``px`` is returned unchanged).

    Args:
        px: ``(B, S, T + 1)`` float, the regular lattice's symbol log-probabilities; modified
            and returned.
        boundary: None or ``(B, 4)`` ``[s_begin, t_begin, s_end, t_end]``; only ``t_end`` is read.

    Returns:
        ``px`` itself.
    """
    check_float_tensor(px, "px", 3, "(B, S, T + 1)")
    if boundary is None:
        return px
    B, S, T1 = px.shape
    bnd = _check_boundary(boundary, B, S, T1 - 1, px.device)
    assert bnd is not None
    col = bnd[:, 3].reshape(B, 1, 1).expand(B, S, 1)
    return px.scatter_(2, col, NEG_INF)


def _finish(px: Tensor, py: Tensor, rnnt_type: str, boundary: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """``(px, py)`` of the lattice type from ``px`` ``(B, S, T)`` and ``py`` ``(B, S + 1, T)``:
    regular gets its end column and its past-the-end arcs blocked; constrained adds ``py``'s
    next row to ``px``. Both come back contiguous."""
    if rnnt_type == "regular":
        px = _end_column(px)
    px, py = px.contiguous(), py.contiguous()
    if rnnt_type == "regular":
        return _block_past_end(px, boundary), py
    if rnnt_type == "constrained":
        return px + py[:, 1:, :], py
    return px, py


def _pair_normalizers(lm: Tensor, am: Tensor) -> Tensor:
    """``(B, S + 1, T)``: ``log sum_c exp(lm[b, s, c] + am[b, t, c])`` as one matrix product of
    the exponentials shifted by their maxima."""
    lm_max = lm.amax(dim=2, keepdim=True)
    am_max = am.amax(dim=2, keepdim=True)
    prod = torch.matmul((lm - lm_max).exp(), (am - am_max).exp().transpose(1, 2))
    return (prod + torch.finfo(prod.dtype).tiny).log() + lm_max + am_max.transpose(1, 2)


def get_rnnt_logprobs(
    lm: Tensor,
    am: Tensor,
    symbols: Tensor,
    termination_symbol: int,
    rnnt_type: str = "regular",
    boundary: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """``(px, py)`` of the simple RNN-T whose joiner is ``lm[b, s] + am[b, t]`` (then a softmax).

    Args:
        lm: ``(B, S + 1, C)``: the prediction network's part of the logits (position ``s`` has
            seen the symbols before ``s``).
        am: ``(B, T, C)``: the encoder's part of the logits.
        symbols: ``(B, S)`` int symbols, in ``[0, C)``.
        termination_symbol: the blank, in ``[0, C)``.
        rnnt_type: ``"regular"`` | ``"modified"`` | ``"constrained"`` (see :data:`RNNT_TYPES`).
        boundary: None or ``(B, 4)`` ``[s_begin, t_begin, s_end, t_end]``.

    Returns:
        ``px`` ``(B, S, T + 1)`` (regular) or ``(B, S, T)``, and ``py`` ``(B, S + 1, T)``, for
        :func:`mutual_information_recursion`.
    """
    B, S, T, C = _check_lm_am(lm, am)
    rnnt_type = _check_type(rnnt_type)
    sym = _check_symbols(symbols, B, S, C, am.device)
    term = _check_termination(termination_symbol, C)
    bnd = _check_boundary(boundary, B, S, T, am.device)
    lm, am = _compute(lm), _compute(am)
    norm = _pair_normalizers(lm, am)  # (B, S + 1, T)
    px = am.transpose(1, 2).gather(1, sym.unsqueeze(2).expand(B, S, T))  # am[b, t, sym[b, s]]
    px = px + lm[:, :S].gather(2, sym.unsqueeze(2)) - norm[:, :S]
    py = am[:, :, term].unsqueeze(1) + lm[:, :, term].unsqueeze(2) - norm
    return _finish(px, py, rnnt_type, bnd)


def _delay(px: Tensor, delay_penalty: float, rnnt_type: str, boundary: Optional[Tensor]) -> Tensor:
    """k2's delay penalty: ``px[b, :, t] += delay_penalty * ((T_b - 1) / 2 - t)`` (symbols
    emitted early gain, late ones lose; ``T_b`` the sequence's ``t_end``, or ``T``)."""
    if delay_penalty <= 0.0:
        return px
    B, _, T0 = px.shape
    T = T0 - 1 if rnnt_type == "regular" else T0
    if boundary is None:
        centre = px.new_full((B, 1, 1), (T - 1) / 2)
    else:
        centre = ((boundary[:, 3] - 1) / 2).reshape(B, 1, 1).to(px.dtype)
    frames = torch.arange(T0, device=px.device, dtype=px.dtype).reshape(1, 1, T0)
    return px + (centre - frames) * delay_penalty


def _score(px, py, boundary, rnnt_type, delay_penalty, reduction, return_grad, impl=None):
    """The loss of ``(px, py)`` (in their compute dtype) through :func:`~lightning_gtn.core.criterion.apply_loss`
    with the delay penalty added; ``(loss, (px_grad, py_grad))`` with ``return_grad``."""
    px = _delay(px, delay_penalty, rnnt_type, boundary)
    sink: Optional[list] = [] if return_grad else None
    loss = criterion.apply_loss(
        _MI_LOSS, (px, py), None, None, None, reduction=reduction, impl=impl, boundary=boundary, return_grad=sink
    )
    if sink is not None:
        return loss, (sink[0], sink[1])
    return loss


def rnnt_loss_simple(
    lm: Tensor,
    am: Tensor,
    symbols: Tensor,
    termination_symbol: int,
    boundary: Optional[Tensor] = None,
    rnnt_type: str = "regular",
    delay_penalty: float = 0.0,
    reduction: Optional[str] = "mean",
    return_grad: bool = False,
    *,
    impl: Optional[str] = None,
) -> Union[Tensor, Tuple[Tensor, Tuple[Tensor, Tensor]]]:
    """The RNN-T loss of the joiner ``lm[b, s] + am[b, t]``: :func:`get_rnnt_logprobs` scored by
    :func:`mutual_information_recursion`, negated.

    Args:
        lm, am, symbols, termination_symbol, boundary, rnnt_type: as :func:`get_rnnt_logprobs`.
        delay_penalty: ``> 0`` rewards emitting symbols early (k2's delay penalty).
        reduction: ``"none"`` (``(B,)``), ``"mean"`` (over the batch) or ``"sum"``.
        return_grad: also return ``(px_grad, py_grad)`` (see :func:`mutual_information_recursion`).
        impl: beyond k2, keyword-only: the recursion's implementation (see
            :func:`mutual_information_recursion`).

    Returns:
        the loss, or ``(loss, (px_grad, py_grad))`` with ``return_grad``.
    """
    delay_penalty = _check_delay(delay_penalty)
    px, py = get_rnnt_logprobs(lm, am, symbols, termination_symbol, rnnt_type=rnnt_type, boundary=boundary)
    bnd = _check_boundary(boundary, am.shape[0], lm.shape[1] - 1, am.shape[1], am.device)
    return _score(px, py, bnd, rnnt_type, delay_penalty, reduction, return_grad, impl)


# -- the full loss on joiner outputs -------------------------------------------------------------


def get_rnnt_logprobs_joint(
    logits: Tensor,
    symbols: Tensor,
    termination_symbol: int,
    rnnt_type: str = "regular",
    boundary: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """``(px, py)`` of the full RNN-T lattice from joiner outputs.

    Args:
        logits: ``(B, T, S + 1, C)`` joiner outputs (unnormalised: a log-softmax over ``C`` is
            taken here).
        symbols, termination_symbol, rnnt_type, boundary: as :func:`get_rnnt_logprobs`.

    Returns:
        ``px`` ``(B, S, T + 1)`` (regular) or ``(B, S, T)``, ``py`` ``(B, S + 1, T)``.
    """
    B, T, S1, C = checks.check_joiner_logits(logits, shape="(B, T, S + 1, C)")
    S = S1 - 1
    rnnt_type = _check_type(rnnt_type)
    sym = _check_symbols(symbols, B, S, C, logits.device)
    term = _check_termination(termination_symbol, C)
    bnd = _check_boundary(boundary, B, S, T, logits.device)
    logits = _compute(logits)
    kept = torch.cat([sym, sym.new_full((B, 1), term)], dim=1).reshape(B, 1, S + 1).expand(B, T, S + 1)
    px, py = _ArcLogProbs.apply(logits, kept.contiguous(), term)  # (B, T, S + 1) each
    px = px[:, :, :S].transpose(1, 2)  # (B, S, T)
    py = py.transpose(1, 2)  # (B, S + 1, T)
    return _finish(px, py, rnnt_type, bnd)


def rnnt_loss(
    logits: Tensor,
    symbols: Tensor,
    termination_symbol: int,
    boundary: Optional[Tensor] = None,
    rnnt_type: str = "regular",
    delay_penalty: float = 0.0,
    reduction: Optional[str] = "mean",
    *,
    impl: Optional[str] = None,
) -> Tensor:
    """The RNN-T loss of joiner outputs ``(B, T, S + 1, C)`` (k2's ``rnnt_loss``).

    Args:
        logits: ``(B, T, S + 1, C)`` unnormalised joiner outputs.
        symbols: ``(B, S)`` int, in ``[0, C)``.
        termination_symbol: the blank, in ``[0, C)``.
        boundary: None or ``(B, 4)`` ``[0, 0, target_length, frames]`` per row.
        rnnt_type, delay_penalty, reduction, impl: as :func:`rnnt_loss_simple`.

    Returns:
        ``(B,)`` negative log-likelihoods with ``reduction="none"``, else a scalar.
    """
    delay_penalty = _check_delay(delay_penalty)
    px, py = get_rnnt_logprobs_joint(logits, symbols, termination_symbol, rnnt_type=rnnt_type, boundary=boundary)
    bnd = _check_boundary(boundary, logits.shape[0], logits.shape[2] - 1, logits.shape[1], logits.device)
    return _score(px, py, bnd, rnnt_type, delay_penalty, reduction, False, impl)


# -- pruning -------------------------------------------------------------------------------------


def _suffix_min(x: Tensor) -> Tensor:
    """``y[..., t] = min(x[..., t:])`` (a non-decreasing lower envelope of ``x``)."""
    return torch.flip(torch.cummin(torch.flip(x, dims=(-1,)), dim=-1).values, dims=(-1,))


def _monotone_starts(start: Tensor, step: int) -> Tensor:
    """Window starts ``(B, T)`` made non-decreasing, ``0`` at frame 0, and rising by at most
    ``step`` per frame (so consecutive windows overlap and no symbol is skipped).

    First each start is lowered to the smallest start after it. Then, with
    ``q[t] = t * step - start[t]``, "rises by at most ``step``" is "``q`` non-decreasing", which the
    same suffix minimum gives (raising starts that later ones could not be reached from);
    ``q >= 0`` is "``start[t] <= t * step``", reachable from 0 at frame 0.
    """
    start = _suffix_min(start)
    ramp = step * torch.arange(start.shape[-1], device=start.device, dtype=start.dtype)
    q = _suffix_min(ramp - start).clamp(min=0)
    return ramp - q


def get_rnnt_prune_ranges(
    px_grad: Tensor,
    py_grad: Tensor,
    boundary: Optional[Tensor],
    s_range: int,
) -> Tensor:
    """The symbol positions kept at each frame, from the simple loss's occupation probabilities
    (k2's pruning bounds, section 3.2 of the pruned RNN-T paper).

    At frame ``t`` the window ``[r, r + s_range)`` maximises the occupancy of the blank arcs of
    its rows minus that of the symbol arc entering it from below (``py_grad[b, r:r + s_range,
    t].sum() - px_grad[b, r - 1, t]``); from the last frame of a sequence on, the window is the
    last ``s_range`` positions; the starts are then made non-decreasing, start at 0 and rise by
    at most ``s_range - 1`` per frame (1 for modified/constrained).

    Args:
        px_grad: ``(B, S, T + 1)`` (regular) or ``(B, S, T)``, from ``return_grad=True``.
        py_grad: ``(B, S + 1, T)``.
        boundary: ``(B, 4)`` ``[s_begin, t_begin, s_end, t_end]`` (None: ``[0, 0, S, T]``).
        s_range: symbols kept per frame (icefall's ``prune_range``). Beyond k2: a regular
            lattice needs ``s_range >= ceil(S_b / T_b) + 1`` for every sequence to keep a path
            (and at least 2 when ``S >= 1``); a smaller one is widened to that with a warning
            (k2 prints one); ``s_range > S`` becomes ``S + 1`` (nothing pruned).

    Returns:
        ``ranges`` ``(B, T, s_range')`` int64: ``ranges[b, t] = r + arange(s_range')``, with
        ``s_range'`` the range actually used.
    """
    B, S, T1, T = _check_grads(px_grad, py_grad)
    s_range = checks.check_int(s_range, "s_range", 1)
    regular = T1 == T + 1
    dev = px_grad.device
    bnd = _full_boundary(_check_boundary(boundary, B, S, T, dev), B, S, T, dev)
    if regular and S >= 1 and B:
        lengths_s = bnd[:, 2] - bnd[:, 0]
        frames = bnd[:, 3] - bnd[:, 1]
        lengths_s = torch.where(frames > 0, lengths_s, 0)  # no frame: no path whatever the range
        lengths_t = frames.clamp(min=1)
        need = int((((lengths_s + lengths_t - 1) // lengths_t) + 1).max())  # ceil(S_b / T_b) + 1
        need = max(need, 2)
        if s_range < need:
            warnings.warn(
                f"get_rnnt_prune_ranges: s_range={s_range} cannot keep a path for sequences of up to "
                f"{int(lengths_s.max())} symbols; using s_range={min(need, S + 1)}",
                stacklevel=2,
            )
            s_range = need
    s_range = min(s_range, S + 1)
    if T == 0:
        return torch.zeros((B, 0, s_range), dtype=torch.long, device=dev)
    n_starts = S + 2 - s_range  # window starts 0 .. S + 1 - s_range
    pyg = _compute(py_grad.detach())
    win = pyg.unfold(1, s_range, 1).sum(3)  # (B, n_starts, T): py_grad summed over each window
    below = torch.cat([pyg.new_zeros(B, 1, T), _compute(px_grad.detach())[:, :, :T].to(pyg.dtype)], dim=1)
    below = below[:, :n_starts]
    return _windows(win - below, bnd, s_range, regular)


def _check_grads(px_grad, py_grad) -> Tuple[int, int, int, int]:
    """``(B, S, T1, T)`` of checked occupation probabilities ``px_grad``, ``py_grad``."""
    check_float_tensor(px_grad, "px_grad", 3, "(B, S, T + 1) or (B, S, T)")
    check_float_tensor(py_grad, "py_grad", 3, "(B, S + 1, T)")
    B, S, T1 = px_grad.shape
    T = py_grad.shape[2]
    if tuple(py_grad.shape[:2]) != (B, S + 1) or T1 not in (T, T + 1):
        raise ValueError(
            f"py_grad must have shape (B, S + 1, T) with px_grad (B, S, T + 1) or (B, S, T); got px_grad "
            f"{tuple(px_grad.shape)}, py_grad {tuple(py_grad.shape)}"
        )
    return B, S, T1, T


def _windows(score: Tensor, bnd: Tensor, s_range: int, regular: bool) -> Tensor:
    """``ranges`` ``(B, T, s_range)`` from ``score`` ``(B, S + 2 - s_range, T)`` of each window
    start at each frame: the best start per frame, the last window from each sequence's last
    frame on, then the starts made monotone (:func:`_monotone_starts`)."""
    B, n_starts, T = score.shape
    S = n_starts + s_range - 2
    dev = score.device
    start = torch.argmax(score, dim=1)  # (B, T)
    last = (bnd[:, 2] - s_range + 1).clamp(min=0).reshape(B, 1)
    frame = torch.arange(T, device=dev).reshape(1, T)
    start = torch.where(frame < bnd[:, 3].reshape(B, 1) - 1, start, last)
    start = _monotone_starts(start, s_range - 1 if regular else 1)
    start = start.clamp(0, S + 1 - s_range)
    return start.unsqueeze(2) + torch.arange(s_range, device=dev)


def get_rnnt_prune_ranges_deprecated(
    px_grad: Tensor,
    py_grad: Tensor,
    boundary: Optional[Tensor],
    s_range: int,
) -> Tensor:
    """k2's first, less exact pruning bounds (kept by k2 for comparison with
    :func:`get_rnnt_prune_ranges`).

    At frame ``t`` the window ``[r, r + s_range)`` maximises the occupancy of all the arcs out of
    its rows, symbol and blank: ``px_grad[b, r:r + s_range, t].sum() + py_grad[b, r:r + s_range,
    t].sum()`` (``px_grad``'s missing row ``S`` counts 0). The windows then follow the same rules
    as :func:`get_rnnt_prune_ranges`: the last ``s_range`` positions from a sequence's last frame
    on, starts non-decreasing, 0 at frame 0, rising by at most ``s_range - 1`` per frame (1 for
    modified/constrained).

    Args:
        px_grad: ``(B, S, T + 1)`` (regular) or ``(B, S, T)``, from ``return_grad=True``.
        py_grad: ``(B, S + 1, T)``.
        boundary: ``(B, 4)`` ``[s_begin, t_begin, s_end, t_end]`` (None: ``[0, 0, S, T]``).
        s_range: symbols kept per frame; ``s_range > S`` becomes ``S + 1``. Unlike
            :func:`get_rnnt_prune_ranges` it is not widened: a regular lattice with ``S >= 1``
            needs ``s_range >= 2`` (a ValueError otherwise), and a too narrow range can leave a
            sequence without a path (an ``inf`` pruned loss), as in k2.

    Returns:
        ``ranges`` ``(B, T, min(s_range, S + 1))`` int64.
    """
    B, S, T1, T = _check_grads(px_grad, py_grad)
    s_range = checks.check_int(s_range, "s_range", 1)
    regular = T1 == T + 1
    dev = px_grad.device
    bnd = _full_boundary(_check_boundary(boundary, B, S, T, dev), B, S, T, dev)
    s_range = min(s_range, S + 1)
    if regular and S >= 1 and s_range < 2:
        raise ValueError(
            f"s_range must be at least 2 for a regular lattice with symbols (else no path survives), got {s_range}"
        )
    if T == 0:
        return torch.zeros((B, 0, s_range), dtype=torch.long, device=dev)
    pxg = _compute(px_grad.detach())[:, :, :T]
    pyg = _compute(py_grad.detach()).to(pxg.dtype)
    occupancy = torch.cat([pxg, pxg.new_zeros(B, 1, T)], dim=1) + pyg  # (B, S + 1, T): arcs out of each row
    win = occupancy.unfold(1, s_range, 1).sum(3)  # (B, S + 2 - s_range, T)
    return _windows(win, bnd, s_range, regular)


def _check_ranges(ranges, B: int, T: int, S: int, device, R: Optional[int] = None) -> Tensor:
    if not isinstance(ranges, Tensor) or ranges.dim() != 3:
        got = tuple(ranges.shape) if isinstance(ranges, Tensor) else type(ranges).__name__
        raise ValueError(f"ranges must be an integer tensor of shape (B, T, s_range), got {got}")
    R = ranges.shape[2] if R is None else R
    r = checks.check_index_tensor(ranges, "ranges", (B, T, R), "(B, T, s_range)").to(device)
    if R < 1 or R > S + 1:
        raise ValueError(f"ranges must have 1 <= s_range <= S + 1 = {S + 1}, got s_range={R}")
    if _eager() and r.numel():
        first = r[:, :, :1]
        if int(first.min()) < 0 or int(first.max()) > S + 1 - R:
            raise ValueError(
                f"ranges[..., 0] must lie in [0, S + 1 - s_range = {S + 1 - R}], got values in "
                f"[{int(first.min())}, {int(first.max())}]"
            )
        if not bool((r == first + torch.arange(R, device=device)).all()):
            raise ValueError("ranges must hold consecutive positions: ranges[b, t, k] == ranges[b, t, 0] + k")
    return r


def do_rnnt_pruning(am: Tensor, lm: Tensor, ranges: Tensor) -> Tuple[Tensor, Tensor]:
    """The joiner inputs at the kept positions.

    Args:
        am: ``(B, T, D1)`` encoder output (projected for the joiner).
        lm: ``(B, S + 1, D2)`` prediction-network output.
        ranges: ``(B, T, s_range)`` from :func:`get_rnnt_prune_ranges`.

    Returns:
        ``am_pruned`` ``(B, T, s_range, D1)`` (an expanded view) and ``lm_pruned``
        ``(B, T, s_range, D2)`` (``lm[b, ranges[b, t, k]]``).
    """
    check_float_tensor(am, "am", 3, "(B, T, encoder_dim)")
    check_float_tensor(lm, "lm", 3, "(B, S + 1, decoder_dim)")
    if lm.shape[0] != am.shape[0] or lm.shape[1] < 1:
        raise ValueError(f"am (B, T, D1) and lm (B, S + 1, D2) must share B, got {tuple(am.shape)}, {tuple(lm.shape)}")
    B, T, D1 = am.shape
    S1, D2 = lm.shape[1], lm.shape[2]
    r = _check_ranges(ranges, B, T, S1 - 1, lm.device)
    R = r.shape[2]
    am_pruned = am.unsqueeze(2).expand(B, T, R, D1)
    lm_pruned = lm.gather(1, r.reshape(B, T * R, 1).expand(B, T * R, D2)).reshape(B, T, R, D2)
    return am_pruned, lm_pruned


def _spread(vals: Tensor, r: Tensor, S1: int) -> Tensor:
    """``(B, T, R)`` values at positions ``r`` -> ``(B, S1, T)`` with -inf elsewhere."""
    B, T, _ = vals.shape
    full = vals.new_full((B, T, S1), NEG_INF).scatter(2, r, vals)
    return full.transpose(1, 2)


def get_rnnt_logprobs_pruned(
    logits: Tensor,
    symbols: Tensor,
    ranges: Tensor,
    termination_symbol: int,
    boundary: Optional[Tensor],
    rnnt_type: str = "regular",
) -> Tuple[Tensor, Tensor]:
    """``(px, py)`` of the pruned lattice: positions outside each frame's window are -inf.

    Args:
        logits: ``(B, T, s_range, C)`` joiner outputs at the kept positions.
        symbols: ``(B, S)`` int, in ``[0, C)``.
        ranges: ``(B, T, s_range)`` kept positions (consecutive, in ``[0, S]``).
        termination_symbol, boundary, rnnt_type: as :func:`get_rnnt_logprobs`.

    Returns:
        ``px`` ``(B, S, T + 1)`` (regular) or ``(B, S, T)``, ``py`` ``(B, S + 1, T)``.
    """
    return _pruned_logprobs(logits, symbols, ranges, termination_symbol, boundary, rnnt_type, hat=False)


def get_hat_logprobs_pruned(
    logits: Tensor,
    symbols: Tensor,
    ranges: Tensor,
    termination_symbol: int,
    boundary: Tensor,
    rnnt_type: str = "regular",
) -> Tuple[Tensor, Tensor]:
    """``(px, py)`` of the pruned lattice under the Hybrid Autoregressive Transducer's output
    distribution (what ``rnnt_loss_pruned(..., use_hat_loss=True)`` scores): the blank is a
    Bernoulli, ``log sigmoid(logits[..., termination_symbol])``; a symbol ``k`` has
    ``log softmax_{c != blank}(logits[..., c])[k] + log(1 - sigmoid(logits[..., blank]))``.

    Args:
        logits, symbols, ranges, boundary, rnnt_type: as :func:`get_rnnt_logprobs_pruned`.
        termination_symbol: the blank, in ``[0, C)`` (k2 requires 0; any class works here).

    Returns:
        ``px`` ``(B, S, T + 1)`` (regular) or ``(B, S, T)``, ``py`` ``(B, S + 1, T)``, ``-inf``
        outside each frame's window.
    """
    return _pruned_logprobs(logits, symbols, ranges, termination_symbol, boundary, rnnt_type, hat=True)


def _pruned_logprobs(logits, symbols, ranges, termination_symbol, boundary, rnnt_type, hat: bool):
    check_float_tensor(logits, "logits", 4, "(B, T, s_range, C)")
    B, T, R, C = logits.shape
    rnnt_type = _check_type(rnnt_type)
    if not isinstance(symbols, Tensor) or symbols.dim() != 2 or symbols.shape[0] != B:
        got = tuple(symbols.shape) if isinstance(symbols, Tensor) else type(symbols).__name__
        raise ValueError(f"symbols must be an integer tensor of shape (B, S) with B={B}, got {got}")
    S = symbols.shape[1]
    sym = _check_symbols(symbols, B, S, C, logits.device)
    term = _check_termination(termination_symbol, C)
    r = _check_ranges(ranges, B, T, S, logits.device, R)
    bnd = _check_boundary(boundary, B, S, T, logits.device)
    logits = _compute(logits)
    with_end = torch.cat([sym, sym.new_full((B, 1), term)], dim=1)  # (B, S + 1)
    kept = with_end.gather(1, r.reshape(B, T * R)).reshape(B, T, R, 1)
    if hat:
        # HAT: the blank is a Bernoulli (log-sigmoid of its logit), the other classes a softmax
        # among themselves scaled by the probability of not-blank
        blank_logit = logits[..., term]
        py_k = torch.nn.functional.logsigmoid(blank_logit)
        others = logits.index_fill(3, torch.tensor([term], device=logits.device), NEG_INF)
        px_k = logits.gather(3, kept).squeeze(3) - torch.logsumexp(others, dim=3) + (py_k - blank_logit)
    else:
        px_k, py_k = _ArcLogProbs.apply(logits, kept.squeeze(3).contiguous(), term)  # (B, T, R) each
    px = _spread(px_k, r, S + 1)[:, :S]  # (B, S, T)
    py = _spread(py_k, r, S + 1)  # (B, S + 1, T)
    return _finish(px, py, rnnt_type, bnd)


def rnnt_loss_pruned(
    logits: Tensor,
    symbols: Tensor,
    ranges: Tensor,
    termination_symbol: int,
    boundary: Optional[Tensor] = None,
    rnnt_type: str = "regular",
    delay_penalty: float = 0.0,
    reduction: Optional[str] = "mean",
    use_hat_loss: bool = False,
    *,
    impl: Optional[str] = None,
) -> Tensor:
    """The RNN-T loss over the pruned lattice (k2's ``rnnt_loss_pruned``).

    Args:
        logits: ``(B, T, s_range, C)`` joiner outputs at ``ranges``
            (``join(*do_rnnt_pruning(enc, pred, ranges))``).
        symbols: ``(B, S)`` int, in ``[0, C)``.
        ranges: ``(B, T, s_range)`` from :func:`get_rnnt_prune_ranges`.
        termination_symbol: the blank, in ``[0, C)``.
        boundary, rnnt_type, delay_penalty, reduction, impl: as :func:`rnnt_loss`.
        use_hat_loss: score with the Hybrid Autoregressive Transducer's output distribution
            (blank: log-sigmoid of its logit; symbols: softmax over the other classes times the
            not-blank probability). k2 requires ``termination_symbol == 0`` for it; any blank works here.

    Returns:
        ``(B,)`` with ``reduction="none"``, else a scalar. With ``s_range = S + 1`` (nothing
        pruned) it equals :func:`rnnt_loss` of the full lattice.
    """
    delay_penalty = _check_delay(delay_penalty)
    px, py = _pruned_logprobs(logits, symbols, ranges, termination_symbol, boundary, rnnt_type, bool(use_hat_loss))
    S = px.shape[1]
    bnd = _check_boundary(boundary, logits.shape[0], S, logits.shape[1], logits.device)
    return _score(px, py, bnd, rnnt_type, delay_penalty, reduction, False, impl)


# -- the smoothed simple loss --------------------------------------------------------------------


def get_rnnt_logprobs_smoothed(
    lm: Tensor,
    am: Tensor,
    symbols: Tensor,
    termination_symbol: int,
    lm_only_scale: float = 0.1,
    am_only_scale: float = 0.1,
    boundary: Optional[Tensor] = None,
    rnnt_type: str = "regular",
) -> Tuple[Tensor, Tensor]:
    """``(px, py)`` of the simple lattice with smoothed log-probabilities::

        (1 - lm_only_scale - am_only_scale) * log p(k | lm[s] + am[t])
        + lm_only_scale * log softmax(lm[s])[k]
        + am_only_scale * log (exp(am[t, k]) * unigram[k] / sum_c exp(am[t, c]) * unigram[c])

    where ``unigram`` is the mean of ``softmax(lm[b, s])`` over every ``b`` and ``s`` of the batch
    (padding included, as k2 does).

    Args:
        lm, am, symbols, termination_symbol, boundary, rnnt_type: as :func:`get_rnnt_logprobs`.
        lm_only_scale: weight of the prediction network alone.
        am_only_scale: weight of the encoder alone (with the unigram "LM").

    Returns:
        ``px`` ``(B, S, T + 1)`` (regular) or ``(B, S, T)``, ``py`` ``(B, S + 1, T)``.
    """
    B, S, T, C = _check_lm_am(lm, am)
    rnnt_type = _check_type(rnnt_type)
    lm_only_scale = checks.check_real(lm_only_scale, "lm_only_scale")
    am_only_scale = checks.check_real(am_only_scale, "am_only_scale")
    sym = _check_symbols(symbols, B, S, C, am.device)
    term = _check_termination(termination_symbol, C)
    bnd = _check_boundary(boundary, B, S, T, am.device)
    lm, am = _compute(lm), _compute(am)
    tiny = torch.finfo(lm.dtype).tiny
    norm = _pair_normalizers(lm, am)  # (B, S + 1, T)
    lm_logp = lm.log_softmax(dim=2)  # (B, S + 1, C)
    unigram = lm_logp.exp().mean(dim=(0, 1)) + tiny  # (C,)
    am_max = am.amax(dim=2, keepdim=True)
    am_only_norm = (torch.matmul((am - am_max).exp(), unigram).unsqueeze(2).log() + am_max).transpose(1, 2)
    log_uni = unigram.log()

    px_am = am.transpose(1, 2).gather(1, sym.unsqueeze(2).expand(B, S, T))  # (B, S, T)
    px_lm = lm[:, :S].gather(2, sym.unsqueeze(2))  # (B, S, 1)
    px_comb = px_am + px_lm - norm[:, :S]
    px_lm_only = lm_logp[:, :S].gather(2, sym.unsqueeze(2))  # (B, S, 1)
    px_am_only = px_am + log_uni[sym].unsqueeze(2) - am_only_norm  # (B, S, T)
    py_am = am[:, :, term].unsqueeze(1)  # (B, 1, T)
    py_comb = py_am + lm[:, :, term].unsqueeze(2) - norm
    py_lm_only = lm_logp[:, :, term].unsqueeze(2)  # (B, S + 1, 1)
    py_am_only = py_am + log_uni[term] - am_only_norm  # (B, 1, T)

    combined = 1.0 - lm_only_scale - am_only_scale
    # as k2: zero scales become 1e-20, so a -inf term is never multiplied by 0
    lm_w = lm_only_scale if lm_only_scale != 0.0 else 1.0e-20
    am_w = am_only_scale if am_only_scale != 0.0 else 1.0e-20
    px = combined * px_comb + lm_w * px_lm_only + am_w * px_am_only
    py = combined * py_comb + lm_w * py_lm_only + am_w * py_am_only
    return _finish(px, py, rnnt_type, bnd)


def rnnt_loss_smoothed(
    lm: Tensor,
    am: Tensor,
    symbols: Tensor,
    termination_symbol: int,
    lm_only_scale: float = 0.1,
    am_only_scale: float = 0.1,
    boundary: Optional[Tensor] = None,
    rnnt_type: str = "regular",
    delay_penalty: float = 0.0,
    reduction: Optional[str] = "mean",
    return_grad: bool = False,
    *,
    impl: Optional[str] = None,
) -> Union[Tensor, Tuple[Tensor, Tuple[Tensor, Tensor]]]:
    """The simple RNN-T loss with smoothed log-probabilities (:func:`get_rnnt_logprobs_smoothed`);
    icefall's "simple loss" (``lm_only_scale=lm_scale``, ``am_only_scale=am_scale``).

    Args:
        lm, am, symbols, termination_symbol, lm_only_scale, am_only_scale, boundary, rnnt_type:
            as :func:`get_rnnt_logprobs_smoothed`.
        delay_penalty, reduction, return_grad, impl: as :func:`rnnt_loss_simple`.

    Returns:
        the loss, or ``(loss, (px_grad, py_grad))`` with ``return_grad``.
    """
    delay_penalty = _check_delay(delay_penalty)
    px, py = get_rnnt_logprobs_smoothed(
        lm,
        am,
        symbols,
        termination_symbol,
        lm_only_scale=lm_only_scale,
        am_only_scale=am_only_scale,
        boundary=boundary,
        rnnt_type=rnnt_type,
    )
    bnd = _check_boundary(boundary, am.shape[0], lm.shape[1] - 1, am.shape[1], am.device)
    return _score(px, py, bnd, rnnt_type, delay_penalty, reduction, return_grad, impl)
