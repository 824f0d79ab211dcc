"""Greedy (best-frame) decoding of dense emissions for the CTC, ASG and transducer topologies."""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import torch

__all__ = ["greedy_decode", "DECODER_TOPOLOGIES"]

#: topologies understood by the decoders
DECODER_TOPOLOGIES = ("ctc", "asg", "transducer")


def _as_emissions(emissions, name: str = "emissions") -> np.ndarray:
    """(B, T, C) float32 C-contiguous numpy copy of a tensor or array, NaN rejected."""
    if isinstance(emissions, torch.Tensor):
        if not emissions.is_floating_point():
            raise ValueError(f"{name} must be a floating point tensor of shape (B, T, C), got {emissions.dtype}")
        x = emissions.detach().to("cpu", torch.float32).numpy()
    elif isinstance(emissions, np.ndarray):
        if not np.issubdtype(emissions.dtype, np.floating):
            raise ValueError(f"{name} must be a floating point array of shape (B, T, C), got {emissions.dtype}")
        x = emissions.astype(np.float32, copy=False)
    else:
        raise ValueError(
            f"{name} must be a torch.Tensor or numpy array of shape (B, T, C), got {type(emissions).__name__}"
        )
    if x.ndim != 3:
        raise ValueError(f"{name} must have shape (B, T, C) (batch first), got {x.ndim} dims: {tuple(x.shape)}")
    if x.shape[2] == 0:
        raise ValueError(f"{name} must have C >= 1 classes, got shape {tuple(x.shape)}")
    x = np.ascontiguousarray(x)
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ValueError(f"{name} contains NaN or +inf (log-probabilities expected)")
    return x


def _as_lengths(lengths, B: int, T: int) -> np.ndarray:
    if lengths is None:
        return np.full(B, T, dtype=np.int64)
    if isinstance(lengths, torch.Tensor):
        if lengths.is_floating_point() or lengths.dtype == torch.bool or lengths.is_complex():
            raise ValueError(f"lengths must hold integers, got {lengths.dtype}")
        arr = lengths.detach().cpu().numpy()
    else:
        arr = np.asarray(lengths)
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.integer)) or arr.dtype == np.bool_:
            raise ValueError(f"lengths must be integers of shape (B,) = ({B},), got {lengths!r}")
    if arr.ndim != 1 or arr.shape[0] != B:
        raise ValueError(f"lengths must have shape (B,) = ({B},), got {tuple(arr.shape)}")
    arr = arr.astype(np.int64)
    if B and (arr.min() < 0 or arr.max() > T):
        raise ValueError(f"lengths must be in [0, T] with T={T}, got min {int(arr.min())}, max {int(arr.max())}")
    return arr


def _check_topology(topology: str, C: int, blank, repeat) -> tuple:
    """``(blank or -1, repeat or -1)`` for ``topology`` over C tokens, with range checks."""
    if topology not in DECODER_TOPOLOGIES:
        raise ValueError(f"topology must be one of {DECODER_TOPOLOGIES}, got {topology!r}")
    for name, v in (("blank", blank), ("repeat", repeat)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
            raise ValueError(f"{name} must be an integer token id or None, got {v!r}")
    if topology == "asg":
        if blank is not None:
            raise ValueError(f"topology='asg' has no blank; got blank={blank}")
        b = -1
    else:
        if blank is None:
            blank = 0 if topology == "ctc" else C - 1
        if not 0 <= blank < C:
            raise ValueError(f"blank={blank} out of range [0, C) with C={C}")
        b = int(blank)
        if repeat is not None:
            raise ValueError(f"repeat is an ASG token; topology={topology!r} takes repeat=None")
    r = -1
    if repeat is not None:
        if not 0 <= repeat < C:
            raise ValueError(f"repeat={repeat} out of range [0, C) with C={C}")
        r = int(repeat)
    return b, r


def greedy_decode(
    emissions, lengths=None, *, topology: str = "ctc", blank: Optional[int] = None, repeat: Optional[int] = None
) -> List[List[int]]:
    """Best token of each frame, then the topology's collapse: the baseline decoder.

    CTC and the word-piece transducer merge repeated frames and drop the blank; ASG merges
    repeated frames and replaces its optional ``repeat`` token by the token before it.

    Args:
        emissions: ``(B, T, C)`` log-probabilities (tensor or numpy array, any float dtype, any
            device: read on the host).
        lengths: ``(B,)`` integer valid frames per utterance, each in ``[0, T]``; None: all T.
        topology: ``"ctc"``, ``"asg"`` or ``"transducer"``.
        blank: the blank id (CTC default 0, transducer default C - 1; must be None for ASG).
        repeat: ASG's repeat token id, or None.

    Returns:
        ``B`` lists of token ids.

    Example:
        >>> import torch
        >>> x = torch.tensor([[[0.0, -9, -9], [-9, 0.0, -9], [-9, 0.0, -9], [0.0, -9, -9], [-9, 0.0, -9]]])
        >>> greedy_decode(x, topology="ctc", blank=0)
        [[1, 1]]
    """
    x = _as_emissions(emissions)
    b, r = _check_topology(topology, x.shape[2], blank, repeat)
    lens = _as_lengths(lengths, x.shape[0], x.shape[1])
    return [seq for seq, _ in _best_paths(x, lens, b, r)]


def _best_paths(x: np.ndarray, lens: np.ndarray, b: int, r: int) -> List[Tuple[List[int], List[int]]]:
    """Per utterance the collapsed best-frame path: ``(tokens, first frame of each token)``."""
    B, T, _ = x.shape
    best = x.argmax(-1) if T else np.zeros((B, 0), dtype=np.int64)
    out: List[Tuple[List[int], List[int]]] = []
    for i in range(B):
        seq: List[int] = []
        frames: List[int] = []
        prev = -1
        for t, lab in enumerate(best[i, : lens[i]].tolist()):
            if lab != prev and lab != b:
                if lab == r:
                    if seq:
                        seq.append(seq[-1])
                        frames.append(t)
                else:
                    seq.append(lab)
                    frames.append(t)
            prev = lab
        out.append((seq, frames))
    return out
