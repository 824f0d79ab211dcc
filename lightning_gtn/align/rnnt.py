"""RNN-T forced alignment: each target token's emission frame, its log-probability and posterior.

:func:`rnnt_forced_align` takes joiner outputs ``(B, T, U + 1, V)`` (torchaudio's ``rnnt_loss``
layout) and returns the :class:`lightning_gtn.align.forced.Alignment` of the best lattice path
(:mod:`lightning_gtn.kernels.rnnt_viterbi`, numba on the CPU);
:func:`~lightning_gtn.align.forced.to_records`, :func:`~lightning_gtn.align.forced.to_json`,
:func:`~lightning_gtn.align.forced.to_ctm` and :func:`~lightning_gtn.align.forced.word_spans` read
it as they read a CTC alignment.
:func:`rnnt_align` runs a transducer network (the protocol of :mod:`lightning_gtn.nn.rnnt`) and
aligns its outputs. :func:`tdt_forced_align` and :func:`multiblank_forced_align` align over the
lattices of :func:`~lightning_gtn.losses.rnnt_variants.tdt_loss` and
:func:`~lightning_gtn.losses.rnnt_variants.multiblank_rnnt_loss`, where an arc may advance several
frames; their :class:`DurationAlignment` adds each arc's duration.

In a transducer a token occupies no frames of its own: it is emitted *at* a frame, between that
frame's arrival and its blank. So a token's span is ``[frame, frame + 1)``, and a frame's label
is the last token emitted at it (the blank when it emitted none).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch

from ..core import checks
from ..kernels.duration_lattice_numba import lattice_viterbi, viterbi_inputs
from ..kernels.rnnt_viterbi import rnnt_viterbi
from ..losses.rnnt_variants import MULTIBLANK, TDT, DurationLatticeCriterion
from .forced import Alignment

__all__ = [
    "rnnt_forced_align",
    "rnnt_align",
    "rnnt_lattice",
    "tdt_forced_align",
    "multiblank_forced_align",
    "DurationAlignment",
]


def _ints(x, name: str) -> torch.Tensor:
    """``x`` as an int64 tensor on the host (the Viterbi kernel checks shapes and values)."""
    return checks.int_tensor(x, name).detach().to("cpu")


def rnnt_forced_align(
    logits: torch.Tensor,
    targets,
    logit_lengths,
    target_lengths,
    *,
    blank: int = -1,
    fused_log_softmax: bool = True,
) -> Alignment:
    """The best RNN-T alignment of each target (Viterbi over the ``(T, U + 1)`` lattice).

    Args:
        logits: ``(B, T, U + 1, V)`` joiner outputs (any float dtype and device; scored in
            float64 on the CPU when float64, else float32). NaN or ``+inf`` is an error.
        targets: ``(B, U)`` integer token ids (padded), in ``[0, V)`` and never ``blank``
            within ``target_lengths``.
        logit_lengths: ``(B,)`` integer frames, ``0 <= logit_lengths[b] <= T``.
        target_lengths: ``(B,)`` integer tokens, ``0 <= target_lengths[b] <= U``.
        blank: keyword-only; the blank id in ``[-V, V)`` (negative counts from the end:
            torchaudio's default -1 is ``V - 1``).
        fused_log_softmax: True (default) normalises the logits over ``V`` at every lattice
            node; False takes ``logits`` as log-probabilities already (as torchaudio's flag).

    Returns:
        An :class:`Alignment` on the logits' device: ``token_start`` each token's emission
        frame, ``token_end = token_start + 1``, ``token_score`` its log-probability there,
        ``token_confidence`` the posterior probability (forward-backward over all paths) of
        emitting that token at that frame, ``score`` the best path's log-probability (``-inf``
        for ``logit_lengths[b] = 0``, which has no path), ``labels`` the last token emitted at
        each frame (the blank when none; -1 past the length).

    Example:
        >>> import torch
        >>> from lightning_gtn.functional import rnnt_forced_align
        >>> logits = torch.randn(2, 6, 4, 5)
        >>> al = rnnt_forced_align(logits, torch.tensor([[1, 2, 3], [4, 4, 0]]), torch.tensor([6, 4]),
        ...                        torch.tensor([3, 2]), blank=0)
        >>> bool((al.token_start[0].diff() >= 0).all()), al.token_start[1, 2].item()
        (True, -1)
    """
    B, T, U1, V = checks.check_joiner_logits(logits)
    blank = checks.check_class_id(blank, "blank", V)
    dev = logits.device
    dt = logits.dtype if logits.dtype in (torch.float32, torch.float64) else torch.float32
    x = logits.detach().to("cpu", dt)
    y = _ints(targets, "targets")
    tl = _ints(logit_lengths, "logit_lengths")
    ul = _ints(target_lengths, "target_lengths")
    frames, tok_lp, tok_post, score, _ = rnnt_viterbi(
        x.numpy(), y.numpy(), tl.numpy(), ul.numpy(), blank, normalize=bool(fused_log_softmax)
    )
    fr = torch.from_numpy(frames)
    has = fr >= 0
    labels = torch.full((B, T), -1, dtype=torch.int64)
    for b in range(B):
        n = int(tl[b])
        if n == 0 or not np.isfinite(score[b]):
            continue
        labels[b, :n] = blank
        k = int(ul[b])
        if k:
            labels[b, fr[b, :k]] = y[b, :k]  # the last write per frame wins: the last token emitted there
    out_dt = dt
    return Alignment(
        labels=labels.to(dev),
        token_start=fr.to(dev),
        token_end=torch.where(has, fr + 1, fr).to(dev),
        token_score=torch.from_numpy(tok_lp).to(device=dev, dtype=out_dt),
        token_confidence=torch.from_numpy(tok_post).to(device=dev, dtype=out_dt),
        score=torch.from_numpy(score).to(device=dev, dtype=out_dt),
        input_lengths=tl.to(dev),
        target_lengths=ul.to(dev),
    )


def rnnt_align(
    model: Any,
    inputs: torch.Tensor,
    input_lengths: torch.Tensor,
    targets: torch.Tensor,
    target_lengths: torch.Tensor,
    *,
    blank: int,
) -> Alignment:
    """Aligns ``targets`` to ``inputs`` with a transducer network (``encode``, ``predict``,
    ``join``: the protocol of :mod:`lightning_gtn.nn.rnnt`).

    Runs ``encode``, ``predict`` on the targets with the blank in front, ``join`` over the full
    ``(B, T', U + 1, V)`` lattice (under ``torch.no_grad``) and :func:`rnnt_forced_align`; frames
    are the encoder's output frames.

    Args:
        model: the transducer network.
        inputs: ``(B, T, F)`` features; ``input_lengths`` ``(B,)``.
        targets: ``(B, U)`` padded token ids; ``target_lengths`` ``(B,)``.
        blank: keyword-only; the blank id (also the prediction network's start symbol).
    """
    logits, enc_lengths = rnnt_lattice(model, inputs, input_lengths, targets, target_lengths, blank=int(blank))
    return rnnt_forced_align(logits, targets, enc_lengths, target_lengths, blank=int(blank))


def rnnt_lattice(
    model: Any,
    inputs: torch.Tensor,
    input_lengths: torch.Tensor,
    targets: torch.Tensor,
    target_lengths,
    *,
    blank: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits (B, T', U + 1, V), encoder lengths (B,))``: ``join(encode(inputs)[:, :, None],
    predict(blank + targets)[:, None])`` under ``torch.no_grad`` (what :func:`rnnt_align` aligns;
    padded target positions feed the blank to the prediction network)."""
    for m in ("encode", "predict", "join"):
        if not callable(getattr(model, m, None)):
            raise ValueError(f"model must offer the transducer protocol (encode, predict, join); it lacks {m}")
    if not isinstance(targets, torch.Tensor) or targets.dim() != 2:
        raise ValueError("targets must be a (B, U) integer tensor")
    if isinstance(blank, (bool, np.bool_)) or not isinstance(blank, (int, np.integer)) or blank < 0:
        raise ValueError(f"blank must be a non-negative token id, got {blank!r}")
    with torch.no_grad():
        enc, enc_lengths = model.encode(inputs, input_lengths)
        start = torch.full((targets.shape[0], 1), int(blank), dtype=torch.long, device=targets.device)
        tl = checks.check_index_tensor(target_lengths, "target_lengths", (targets.shape[0],), "(B,)").cpu()
        pad = torch.arange(targets.shape[1])[None, :] >= tl[:, None]
        # padding is never scored; the prediction network reads the blank there (a valid id)
        y = torch.where(pad.to(targets.device), torch.full_like(targets, int(blank)), targets).to(torch.long)
        tokens = torch.cat([start, y], dim=1)
        pred, _ = model.predict(tokens.to(enc.device), None)
        logits = model.join(enc[:, :, None, :], pred[:, None, :, :])
    return logits, enc_lengths


@dataclass
class DurationAlignment(Alignment):
    """An :class:`Alignment` of a lattice whose arcs advance by a duration (TDT, multi-blank).

    Attributes (besides :class:`Alignment`'s):
        token_duration: ``(B, U)`` int64 frames each token's arc advances (TDT: one of the
            ``durations``, possibly 0; multi-blank: 0); -1 where ``token_start`` is -1.
        blank_duration: ``(B, T)`` int64 frames advanced by the blank arc leaving frame ``t``
            (0 where no blank leaves it: a frame skipped by a longer arc, or one whose arcs are
            all tokens; -1 past the length or without a path).
    """

    token_duration: Optional[torch.Tensor] = None
    blank_duration: Optional[torch.Tensor] = None

    def to(self, device) -> "DurationAlignment":
        """A copy with every tensor on ``device``."""
        moved: Dict[str, Optional[torch.Tensor]] = {
            f.name: (None if getattr(self, f.name) is None else getattr(self, f.name).to(device)) for f in fields(self)
        }
        return DurationAlignment(**moved)  # type: ignore[arg-type]


def _duration_align(
    crit: DurationLatticeCriterion,
    logits: torch.Tensor,
    targets,
    logit_lengths,
    target_lengths,
    blank,
    fused_log_softmax,
    options: Dict[str, object],
) -> DurationAlignment:
    """The best path of the criterion's lattice as a :class:`DurationAlignment`."""
    B, T, U1, V = checks.check_joiner_logits(logits)
    fused = checks.check_bool(fused_log_softmax, "fused_log_softmax")
    blank, _ = crit.check_options(V, blank, None, logits.device)
    opts = crit.lattice_options(tuple(logits.shape), dict(options))
    K, D, arcs, sigma, _ = crit.arcs(V, blank, opts)
    blank = int(arcs[2][0])  # resolved: the first blank arc is the blank
    dev = logits.device
    dt = logits.dtype if logits.dtype in (torch.float32, torch.float64) else torch.float32
    x = logits.detach().to("cpu", dt)
    x_np, y_np, tl_np, ul_np, _ = viterbi_inputs(
        x.numpy(),
        _ints(targets, "targets").numpy(),
        _ints(logit_lengths, "logit_lengths").numpy(),
        _ints(target_lengths, "target_lengths").numpy(),
        blank,
    )
    used = y_np[np.arange(U1 - 1)[None, :] < ul_np[:, None]]
    if used.size and used.max() >= K:
        raise ValueError(f"targets must lie in [0, K={K}) (the label classes) within target_lengths")
    if used.size and np.isin(used, np.asarray(arcs[2])).any():
        raise ValueError(f"targets must not contain a blank class ({sorted(set(arcs[2]))}) within target_lengths")
    tok_dur, tok_didx, blank_ids, blank_dur, blank_didx = (np.asarray(a, dtype=np.int64) for a in arcs)
    arcs_np = (tok_dur, tok_didx, blank_ids, blank_dur, blank_didx)
    NT = tok_dur.shape[0]
    score, _, path, arc_score, arc_post = lattice_viterbi(
        torch.from_numpy(x_np),
        y_np,
        tl_np,
        ul_np,
        K,
        D,
        arcs_np,
        sigma,
        fused,
    )
    Umax = U1 - 1
    frames = np.full((B, Umax), -1, dtype=np.int64)
    tok_d = np.full((B, Umax), -1, dtype=np.int64)
    tok_lp = np.zeros((B, Umax))
    tok_post = np.zeros((B, Umax))
    labels = np.full((B, T), -1, dtype=np.int64)
    blank_d = np.full((B, T), -1, dtype=np.int64)
    for b in range(B):
        n = int(tl_np[b])
        if n == 0 or not np.isfinite(score[b]):
            continue
        labels[b, :n] = blank
        blank_d[b, :n] = 0
        emitted = np.zeros(n, dtype=bool)
        for m in range(path.shape[1]):
            t, u, k, d = (int(v) for v in path[b, m])
            if k < 0:
                break
            if k < NT:  # a token emitted at t; a duration d >= 2 skips the frames t + 1 .. t + d - 1
                frames[b, u], tok_d[b, u] = t, d
                tok_lp[b, u], tok_post[b, u] = arc_score[b, m], arc_post[b, m]
                labels[b, t : t + max(d, 1)] = y_np[b, u]
                emitted[t] = True
            else:  # a blank: the frame t (unless a token was emitted there) and those it skips
                blank_d[b, t] = d
                labels[b, t + 1 : t + d] = blank_ids[k - NT]
                if not emitted[t]:
                    labels[b, t] = blank_ids[k - NT]
    fr = torch.from_numpy(frames)

    def out(a: np.ndarray, float_: bool = False) -> torch.Tensor:
        return torch.from_numpy(a).to(device=dev, dtype=dt if float_ else torch.int64)

    return DurationAlignment(
        labels=out(labels),
        token_start=fr.to(dev),
        token_end=torch.where(fr >= 0, fr + 1, fr).to(dev),
        token_score=out(tok_lp, True),
        token_confidence=out(tok_post, True),
        score=out(score, True),
        input_lengths=out(tl_np),
        target_lengths=out(ul_np),
        token_duration=out(tok_d),
        blank_duration=out(blank_d),
    )


_RETURNS = """A :class:`DurationAlignment` on the logits' device: ``token_start`` each token's
        emission frame, ``token_end = token_start + 1``, ``token_duration`` the frames its arc
        advances, ``token_score`` that arc's score (its label's log-probability minus ``sigma``,
        plus its duration's log-probability for TDT), ``token_confidence`` the posterior
        probability of that arc (forward-backward over all paths), ``blank_duration`` the
        duration of the blank arc leaving each frame, ``score`` the best path's score (``-inf``
        for ``logit_lengths[b] = 0``), ``labels`` per frame the last token emitted there, else
        the label of the arc that skips it or of the blank arc leaving it (-1 past the length)."""


def tdt_forced_align(
    logits: torch.Tensor,
    targets,
    logit_lengths,
    target_lengths,
    *,
    blank: int = -1,
    durations: Sequence[int] = (0, 1, 2, 3, 4),
    sigma: float = 0.0,
    fused_log_softmax: bool = True,
) -> DurationAlignment:
    """The best TDT alignment of each target: Viterbi over :func:`~lightning_gtn.functional.tdt_loss`'s lattice.

    Each arc of the path is a token or a blank with one of ``durations``; its score is the
    label's log-probability minus ``sigma`` plus the duration's log-probability (each group of
    ``logits`` log-softmaxed on its own). On ties the blank wins (the later emission).

    Args:
        logits: ``(B, T, U + 1, K + len(durations))`` joiner outputs (label logits, then
            duration logits; any float dtype and device; scored on the CPU in float64 sums).
            NaN or ``+inf`` is an error.
        targets: ``(B, U)`` integer token ids in ``[0, K)``, never ``blank`` within
            ``target_lengths``.
        logit_lengths: ``(B,)`` integer frames, ``0 <= logit_lengths[b] <= T``.
        target_lengths: ``(B,)`` integer tokens, ``0 <= target_lengths[b] <= U``.
        blank: keyword-only; the blank's id among the label classes, ``[-K, K)``.
        durations: strictly increasing integers ``>= 0`` with one ``>= 1``, as
            :func:`~lightning_gtn.losses.rnnt_variants.tdt_loss`.
        sigma: subtracted from every label log-probability, as
            :func:`~lightning_gtn.losses.rnnt_variants.tdt_loss`.
        fused_log_softmax: True: raw scores; False: both groups already are log-probabilities.

    Returns:
        RETURNS

    Example:
        >>> import torch
        >>> from lightning_gtn.functional import tdt_forced_align
        >>> logits = torch.randn(1, 6, 3, 4 + 3)
        >>> al = tdt_forced_align(logits, torch.tensor([[1, 2]]), torch.tensor([6]), torch.tensor([2]),
        ...                       blank=0, durations=[0, 1, 2])
        >>> bool((al.token_start[0].diff() >= 0).all()), al.token_duration.shape
        (True, torch.Size([1, 2]))
    """
    opts = {"durations": durations, "sigma": sigma}
    return _duration_align(TDT, logits, targets, logit_lengths, target_lengths, blank, fused_log_softmax, opts)


def multiblank_forced_align(
    logits: torch.Tensor,
    targets,
    logit_lengths,
    target_lengths,
    *,
    blank: int = -1,
    big_blank_durations: Sequence[int] = (),
    sigma: float = 0.0,
    fused_log_softmax: bool = True,
    big_blank_ids: Optional[Sequence[int]] = None,
) -> DurationAlignment:
    """The best multi-blank RNN-T alignment of each target: Viterbi over
    :func:`~lightning_gtn.functional.multiblank_rnnt_loss`'s lattice.

    Tokens keep the frame, the blank advances one frame and the big blank of
    ``big_blank_durations[i]`` that many; each arc scores its class's log-probability minus
    ``sigma``. Without big blanks this is :func:`rnnt_forced_align`'s path. On ties a blank wins.

    Args:
        logits: ``(B, T, U + 1, V)`` joiner outputs (any float dtype and device). NaN or
            ``+inf`` is an error.
        targets: ``(B, U)`` integer token ids in ``[0, V)``, never a blank class within
            ``target_lengths``.
        logit_lengths: ``(B,)`` integer frames, ``0 <= logit_lengths[b] <= T``.
        target_lengths: ``(B,)`` integer tokens, ``0 <= target_lengths[b] <= U``.
        blank: keyword-only; the standard blank's id, ``[-V, V)``.
        big_blank_durations: strictly increasing integers ``>= 1`` (may be empty).
        sigma: subtracted from every log-probability, as
            :func:`~lightning_gtn.losses.rnnt_variants.multiblank_rnnt_loss`.
        fused_log_softmax: True: raw scores; False: log-probabilities already.
        big_blank_ids: the class of each big blank; None: ``blank - 1 - i``, as
            :func:`~lightning_gtn.losses.rnnt_variants.multiblank_rnnt_loss`.

    Returns:
        RETURNS
    """
    opts = {"big_blank_durations": big_blank_durations, "sigma": sigma, "big_blank_ids": big_blank_ids}
    return _duration_align(MULTIBLANK, logits, targets, logit_lengths, target_lengths, blank, fused_log_softmax, opts)


for _f in (tdt_forced_align, multiblank_forced_align):
    _f.__doc__ = (_f.__doc__ or "").replace("RETURNS", _RETURNS)
