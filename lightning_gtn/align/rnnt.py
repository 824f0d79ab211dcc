"""RNN-T forced alignment: each target token's emission frame, its log-probability and posterior.

:func:`rnnt_forced_align` takes joiner outputs ``(B, T, U + 1, V)`` (torchaudio's ``rnnt_loss``
layout) and returns the :class:`lightning_gtn.align.forced.Alignment` of the best lattice path
(:mod:`lightning_gtn.kernels.rnnt_viterbi`, numba on the CPU);
:func:`~lightning_gtn.align.forced.to_records`, :func:`~lightning_gtn.align.forced.to_json`,
:func:`~lightning_gtn.align.forced.to_ctm` and :func:`~lightning_gtn.align.forced.word_spans` read
it as they read a CTC alignment.
:func:`rnnt_align` runs a transducer network (the protocol of :mod:`lightning_gtn.nn.rnnt`) and
aligns its outputs.

In a transducer a token occupies no frames of its own: it is emitted *at* a frame, between that
frame's arrival and its blank. So a token's span is ``[frame, frame + 1)``, and a frame's label
is the last token emitted at it (the blank when it emitted none).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..core import checks
from ..kernels.rnnt_viterbi import rnnt_viterbi
from .forced import Alignment

__all__ = ["rnnt_forced_align", "rnnt_align", "rnnt_lattice"]


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
