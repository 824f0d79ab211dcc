"""Greedy decoding of transducer networks (RNN-T, TDT, multi-blank).

The network is anything with the transducer-network protocol of :mod:`lightning_gtn.nn.rnnt`
(``predict``, ``select_state``, ``join``); this module calls those by name and imports no network
class. States are what ``predict`` returns: a tensor or a (nested) tuple/list of tensors, each
batched along one dimension (the one ``select_state`` selects from).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch

__all__ = ["greedy_search", "MAX_SYMBOLS_PER_FRAME"]

#: the most labels a search may emit on one frame: a bound on the work (and the memory) that an
#: untrained network, which may never emit a blank, can cause
MAX_SYMBOLS_PER_FRAME = 64


def _merge_states(old: Any, new: Any, probe: Any, index: torch.Tensor, n: int) -> Any:
    """``old`` (``n`` hypotheses) with the hypotheses ``index`` replaced by ``new``.

    ``probe`` is ``select_state(old, index)``: in each tensor the batch dimension is the one whose
    size changed from ``n`` to ``len(index)`` (``len(index) < n`` here)."""
    if isinstance(old, torch.Tensor):
        dims = [d for d in range(old.ndim) if old.shape[d] == n and probe.shape[d] == index.numel()]
        if not dims:
            return old  # not batched: shared by all hypotheses
        return old.index_copy(dims[0], index.to(old.device), new.to(old.dtype))
    if isinstance(old, (tuple, list)):
        out = [_merge_states(o, w, p, index, n) for o, w, p in zip(old, new, probe)]
        if hasattr(old, "_fields"):  # a named tuple
            return type(old)(*out)
        return type(old)(out)
    if old is None:
        return new
    raise TypeError(f"greedy_search: cannot merge a state of type {type(old).__name__} (tensors or tuples expected)")


def _check(encoder_out: torch.Tensor, encoder_lengths: torch.Tensor, blank: int, max_symbols_per_frame: int) -> None:
    if not isinstance(encoder_out, torch.Tensor) or encoder_out.ndim != 3:
        shape = tuple(encoder_out.shape) if isinstance(encoder_out, torch.Tensor) else type(encoder_out).__name__
        raise ValueError(f"encoder_out must be a tensor of shape (B, T, J), got {shape}")
    B, T = encoder_out.shape[:2]
    if not isinstance(encoder_lengths, torch.Tensor) or encoder_lengths.shape != (B,):
        got = tuple(encoder_lengths.shape) if isinstance(encoder_lengths, torch.Tensor) else encoder_lengths
        raise ValueError(f"encoder_lengths must have shape (B,) = ({B},), got {got}")
    if encoder_lengths.is_floating_point() or encoder_lengths.dtype == torch.bool:
        raise ValueError(f"encoder_lengths must be integers, got {encoder_lengths.dtype}")
    if B and (int(encoder_lengths.min()) < 0 or int(encoder_lengths.max()) > T):
        raise ValueError(f"encoder_lengths must be in [0, T={T}], got {encoder_lengths.tolist()}")
    if isinstance(blank, bool) or not isinstance(blank, int) or blank < 0:
        raise ValueError(f"blank must be a class id >= 0, got {blank!r}")
    if (
        isinstance(max_symbols_per_frame, bool)
        or not isinstance(max_symbols_per_frame, int)
        or max_symbols_per_frame < 1
    ):
        raise ValueError(f"max_symbols_per_frame must be an integer >= 1, got {max_symbols_per_frame!r}")
    if max_symbols_per_frame > MAX_SYMBOLS_PER_FRAME:
        raise ValueError(
            f"max_symbols_per_frame must be at most {MAX_SYMBOLS_PER_FRAME} (a bound on the work of one frame), "
            f"got {max_symbols_per_frame}"
        )


@torch.no_grad()
def greedy_search(
    model: Any,
    encoder_out: torch.Tensor,
    encoder_lengths: torch.Tensor,
    *,
    blank: int,
    max_symbols_per_frame: int = 3,
    num_classes: Optional[int] = None,
    durations: Optional[Sequence[int]] = None,
    big_blank_durations: Optional[Sequence[int]] = None,
) -> List[List[int]]:
    """The best label at each step, batched over the examples.

    At each frame ``t`` the joiner scores ``join(enc[t], pred)`` of the label history so far: the
    best class is emitted (and the prediction network advances) unless it is the blank, which
    moves to the next frame; after ``max_symbols_per_frame`` labels on one frame the search moves
    on as well. The blank is never emitted.

    Args:
        model: a transducer network (``predict``, ``select_state``, ``join``).
        encoder_out: ``(B, T, J)`` the network's ``encode`` output.
        encoder_lengths: ``(B,)`` valid frames of each example, in ``[0, T]``.
        blank: the blank's class id.
        max_symbols_per_frame: labels emitted on one frame at most (>= 1).
        num_classes: ``V``, the token scores among the joiner's outputs (the rest are the extra
            outputs of TDT / multi-blank); default all of them, or ``V - len(durations)`` /
            ``V - len(big_blank_durations)`` when those are given.
        durations: TDT: the duration of each extra output (``durations[k]`` for output
            ``num_classes + k``): after the best label the search skips the best duration's
            frames (at least one after a blank; a label with duration 0 stays on the frame).
        big_blank_durations: multi-blank: the frames each big blank covers (output
            ``num_classes + k`` is the big blank of ``big_blank_durations[k]`` frames); the
            best class is taken over all outputs, and a big blank skips its frames.

    Returns:
        the label ids of each example (no blanks).
    """
    args = (max_symbols_per_frame, num_classes, durations, big_blank_durations)
    return [toks for toks, _, _, _ in _greedy(model, encoder_out, encoder_lengths, blank, *args)]


def _greedy(
    model, encoder_out, encoder_lengths, blank, max_symbols_per_frame, num_classes, durations, big_blank_durations
):
    """The greedy search: per example ``(tokens, frames, log-probabilities, durations)``."""
    _check(encoder_out, encoder_lengths, blank, max_symbols_per_frame)
    if durations is not None and big_blank_durations is not None:
        raise ValueError("give durations (TDT) or big_blank_durations (multi-blank), not both")
    B, T = encoder_out.shape[:2]
    device = encoder_out.device
    dur = [int(d) for d in durations] if durations is not None else None
    big = [int(d) for d in big_blank_durations] if big_blank_durations is not None else None
    for name, ds, low in (("durations", dur, 0), ("big_blank_durations", big, 1)):
        if ds is not None and (not ds or min(ds) < low):
            raise ValueError(f"{name} must be a non-empty list of integers >= {low}, got {ds}")
    lengths = encoder_lengths.to(device, torch.long)
    hyps: List[List[int]] = [[] for _ in range(B)]
    frames: List[List[int]] = [[] for _ in range(B)]
    logps: List[List[float]] = [[] for _ in range(B)]
    steps: List[List[int]] = [[] for _ in range(B)]
    if B == 0:
        return []
    start = torch.full((B, 1), blank, dtype=torch.long, device=device)
    pred, state = model.predict(start, None)
    pred = pred[:, 0]  # (B, J)
    t = torch.zeros(B, dtype=torch.long, device=device)
    emitted = torch.zeros(B, dtype=torch.long, device=device)  # labels on the current frame
    dur_t = torch.tensor(dur, dtype=torch.long, device=device) if dur is not None else None
    big_t = torch.tensor(big, dtype=torch.long, device=device) if big is not None else None
    while True:
        active = (t < lengths).nonzero().flatten()
        if active.numel() == 0:
            break
        enc = encoder_out[active, t[active]]  # (A, J)
        logits = model.join(enc, pred[active])  # (A, V + extra)
        W = logits.shape[-1]
        extra = len(dur) if dur is not None else len(big) if big is not None else 0
        V = num_classes if num_classes is not None else W - extra
        if not 0 < V <= W or blank >= V or (extra and V + extra != W):
            raise ValueError(
                f"the joiner gives {W} outputs, which does not match num_classes={V} with {extra} extra "
                f"outputs and blank={blank}"
            )
        if big_t is not None:
            best = logits.argmax(-1)
            norm = logits.double().log_softmax(-1)
            is_blank = (best == blank) | (best >= V)
            step = torch.where(best >= V, big_t[(best - V).clamp(min=0, max=len(big) - 1)], 1)  # type: ignore[arg-type]
        else:
            best = logits[:, :V].argmax(-1)
            norm = logits[:, :V].double().log_softmax(-1)
            is_blank = best == blank
            if dur_t is not None:
                step = dur_t[logits[:, V:].argmax(-1)]
                step = torch.where(is_blank, step.clamp(min=1), step)
            else:
                step = torch.where(is_blank, 1, 0)
        emit = ~is_blank
        # a label on a frame that already has max_symbols_per_frame of them moves on
        over = emit & (emitted[active] + 1 >= max_symbols_per_frame) & (step == 0)
        step = torch.where(over, 1, step)
        idx = active[emit]
        if idx.numel():
            emit_lp = norm[emit].gather(1, best[emit][:, None])[:, 0].tolist()
            emit_t, emit_step = t[idx].tolist(), step[emit].tolist()
            for i, (b, k) in enumerate(zip(idx.tolist(), best[emit].tolist())):
                hyps[b].append(int(k))
                frames[b].append(int(emit_t[i]))
                logps[b].append(float(emit_lp[i]))
                steps[b].append(int(emit_step[i]))
            new_pred, new_state = model.predict(best[emit][:, None], model.select_state(state, idx))
            pred = pred.index_copy(0, idx, new_pred[:, 0].to(pred.dtype))
            if idx.numel() == B:
                state = new_state
            else:
                state = _merge_states(state, new_state, model.select_state(state, idx), idx, B)
        moved = step > 0
        emitted[active] = torch.where(moved, 0, emitted[active] + emit.long())
        t[active] = t[active] + step
    return list(zip(hyps, frames, logps, steps))
