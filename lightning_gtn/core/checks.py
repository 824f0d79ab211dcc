"""Argument checks shared by the losses and decoders: shapes, integers, lengths, targets.

Every message names the argument and the expected shape. Integers must be integers: float
lengths, labels or blanks (``8.5``, ``True``, a float tensor) are errors, never truncated.
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers
import warnings
from typing import List, Literal, Optional, Sequence, Tuple, Union, overload

import numpy as np
import torch

from ..integers import NotAnIntegerError, check_int
from ..wfst import Graph

__all__ = [
    "renamed_arguments",
    "REDUCTIONS",
    "NATIVE_BACKENDS",
    "KERNEL_BACKENDS",
    "IMPLS",
    "check_emissions",
    "check_reduction",
    "check_impl",
    "BLANK_MODES",
    "check_blank",
    "check_ngram",
    "token_ids",
    "check_label",
    "int_tensor",
    "as_lengths",
    "split_targets",
    "targets_tensors",
    "flat_targets",
    "compute_dtype",
    "graph_list",
    "check_int",
    "NotAnIntegerError",
    "check_bool",
    "check_real",
    "check_labels",
    "check_float_tensor",
    "check_joiner_logits",
    "check_index_tensor",
    "check_class_id",
    "check_in_range",
    "check_padded_labels",
    "check_emission_values",
    "check_durations",
    "MAX_DURATIONS",
    "MAX_DURATION",
]

REDUCTIONS = ("none", "mean", "sum")
#: the implementations of this library (``impl=`` names besides None)
NATIVE_BACKENDS = ("numba", "numba_log", "torch", "triton")
#: the names of the criteria's own kernels (``impl=`` names offered by the criteria that list
#: them in their backends; see :attr:`lightning_gtn.core.criterion.Criterion.kernels`)
KERNEL_BACKENDS = ("numba_ctc", "triton_ctc")
#: ``impl=`` choices: None (the default for the device), the native implementations, or the
#: real ``gtn`` package (eager only, one graph per example on the host). Which of them a loss
#: offers is declared by its criterion (:attr:`lightning_gtn.core.criterion.Criterion.backends`).
IMPLS = (None,) + NATIVE_BACKENDS + KERNEL_BACKENDS + ("gtn",)
#: entries of a transducer's ``durations`` / ``big_blank_durations``: each is one joiner output
#: and one arc per lattice node (NeMo's use a handful)
MAX_DURATIONS = 1024
#: the largest duration in frames: one past ``T`` never lands (the lattice clips it), and the bound
#: keeps every sum of a frame and a duration within int64
MAX_DURATION = 1 << 62


def check_emissions(x, name: str = "log_probs") -> Tuple[int, int, int]:
    """``(B, T, C)`` of a float tensor of 3 dims, else ValueError naming ``name``."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape (B, T, C), got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"{name} must have shape (B, T, C) (batch first), got {x.dim()} dims: {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating point tensor, got {x.dtype}")
    B, T, C = x.shape
    return B, T, C


def check_reduction(reduction, allowed: Tuple[str, ...] = REDUCTIONS) -> str:
    """``reduction`` when it is one of ``allowed`` (default :data:`REDUCTIONS`), else ValueError."""
    if reduction not in allowed:
        raise ValueError(f"reduction must be one of {allowed}, got {reduction!r}")
    return reduction


def check_impl(impl) -> Optional[str]:
    """``impl`` when it is one of :data:`IMPLS`, else ValueError (the loss modules' constructors;
    the losses check ``impl`` against their criterion's backends)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    return impl


# -- the word-piece transducer's configuration (gtn_applications' ``Transducer`` arguments) ------

#: the research code's ``blank`` options
BLANK_MODES = ("none", "optional", "forced")


def check_ngram(ngram, allow_zero: bool = True) -> int:
    """``ngram`` as an int; ValueError unless it is an integer ``>= 0`` (``>= 1`` without
    ``allow_zero``)."""
    return check_int(ngram, "ngram", 0 if allow_zero else 1)


def check_blank(blank, allow_repeats) -> str:
    """``blank`` if it is one of :data:`BLANK_MODES` and allows ``allow_repeats`` (False needs
    ``"optional"``, as in the research code); ValueError otherwise."""
    if not isinstance(blank, str) or blank not in BLANK_MODES:
        raise ValueError(f"blank must be one of {BLANK_MODES}, got {blank!r}")
    if not allow_repeats and blank != "optional":
        raise ValueError(
            "allow_repeats=False needs blank='optional' (as in the research code), " f"got blank={blank!r}"
        )
    return blank


def token_ids(tokens, graphemes_to_idx) -> Tuple[Tuple[Tuple[int, ...], ...], int]:
    """``tokens`` as tuples of grapheme ids, and the number of graphemes (max id + 1)."""
    if not isinstance(graphemes_to_idx, dict) or not graphemes_to_idx:
        raise ValueError("graphemes_to_idx must be a non-empty dict grapheme -> integer id")
    for gph, i in graphemes_to_idx.items():
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i < 0:
            raise ValueError(f"graphemes_to_idx[{gph!r}] must be an integer id >= 0, got {i!r}")
    if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__iter__"):
        raise ValueError(f"tokens must be a list of grapheme sequences, got {type(tokens).__name__}")
    out = []
    for k, tok in enumerate(tokens):
        try:
            spelled = list(tok)
        except TypeError:
            raise ValueError(f"tokens[{k}] must be a sequence of graphemes, got {tok!r}") from None
        if not spelled:
            raise ValueError(f"tokens[{k}] is empty; every token spells at least one grapheme")
        ids = []
        for gph in spelled:
            try:
                ids.append(int(graphemes_to_idx[gph]))
            except (KeyError, TypeError):
                raise ValueError(f"tokens[{k}] = {tok!r}: grapheme {gph!r} is not in graphemes_to_idx") from None
        out.append(tuple(ids))
    if not out:
        raise ValueError("tokens must hold at least one token")
    return tuple(out), int(max(graphemes_to_idx.values())) + 1


@overload
def check_label(value, name: str, num_classes: int, allow_none: Literal[False] = False) -> int: ...


@overload
def check_label(value, name: str, num_classes: int, allow_none: bool) -> Optional[int]: ...


def check_label(value, name: str, num_classes: int, allow_none: bool = False) -> Optional[int]:
    """An integer label in ``[0, num_classes)`` (bool and float values are errors)."""
    if value is None and allow_none:
        return None
    value = _scalar_int(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        also = " or None" if allow_none else ""
        raise ValueError(f"{name} must be an integer label in [0, C) with C={num_classes}{also}, got {value!r}")
    if not 0 <= int(value) < num_classes:
        raise ValueError(f"{name} must be an integer label in [0, C) with C={num_classes}, got {int(value)}")
    return int(value)


def _scalar_int(value):
    """A 0-dim integer tensor as a Python int (bool and float tensors stay as they are, to be refused)."""
    if (
        isinstance(value, torch.Tensor)
        and value.dim() == 0
        and not value.is_floating_point()
        and value.dtype != torch.bool
    ):
        return int(value)
    return value


def int_tensor(x, name: str, device: Optional[torch.device] = None) -> torch.Tensor:
    """``x`` (a tensor, numpy array or nested sequence of integers) as an int64 tensor.

    Float and bool data are errors (``[10, 8.5]`` is not silently truncated). Tensors already
    on a device stay there; other inputs go to ``device`` (default CPU).
    """
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise ValueError(f"{name} must hold integers, got a {x.dtype} tensor")
        return x if x.dtype == torch.int64 else x.long()
    if _holds_bool(x):
        raise ValueError(f"{name} must hold integers, got a bool among its values")
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a tensor or a sequence of integers, got {type(x).__name__}") from None
    if arr.dtype == object:
        raise ValueError(f"{name} must be a rectangular tensor or sequence of integers (ragged or mixed types)")
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(
            f"{name} must hold integers, got values of dtype {arr.dtype} " f"(e.g. {arr.reshape(-1)[0]!r})"
        )
    return torch.as_tensor(arr.astype(np.int64, copy=False), device=device)


def _holds_bool(x) -> bool:
    """Whether a (nested) list or tuple holds a bool (numpy reads ``[True, 8]`` as integers)."""
    stack = [x]
    while stack:
        v = stack.pop()
        if isinstance(v, (bool, np.bool_)):
            return True
        if isinstance(v, (list, tuple)):
            stack.extend(v)
    return False


def _host_device_ok(t: torch.Tensor, device: torch.device) -> bool:
    return t.device.type == "cpu" or t.device == device


def as_lengths(x, B: int, name: str, device: torch.device, max_value: Optional[int] = None) -> np.ndarray:
    """Lengths ``(B,)`` as int64 numpy (a tensor on the emissions' device or the CPU, or a
    sequence of integers), each in ``[0, max_value]``."""
    if isinstance(x, torch.Tensor) and not _host_device_ok(x, device):
        raise ValueError(
            f"{name} is on {x.device} but the emissions are on {device}; " f"put {name} on {device} or the CPU"
        )
    t = int_tensor(x, name)
    if t.dim() != 1 or t.shape[0] != B:
        raise ValueError(f"{name} must have shape (B,) = ({B},), got {tuple(t.shape)}")
    arr = t.detach().cpu().numpy().astype(np.int64, copy=False)
    if len(arr) and arr.min() < 0:
        raise ValueError(f"{name} must be >= 0, got {int(arr.min())}")
    if max_value is not None and len(arr) and arr.max() > max_value:
        raise ValueError(f"{name} must be <= T={max_value} (the emissions' time dimension), got {int(arr.max())}")
    return arr


def _check_seq_labels(seqs: Sequence[Sequence[int]], num_classes: int, blank: Optional[int], name: str) -> None:
    try:
        flat = np.fromiter((v for s in seqs for v in s), dtype=np.int64)
    except OverflowError:
        raise ValueError(f"{name}: a label out of range [0, C) with C={num_classes} (beyond int64)") from None
    check_labels(flat, num_classes, blank, name)


def check_labels(
    flat: np.ndarray,
    num_classes: int,
    blanks: Union[None, int, Sequence[int]] = None,
    name: str = "targets",
    classes: str = "C",
) -> None:
    """ValueError naming ``name`` unless every label of ``flat`` lies in ``[0, num_classes)``
    (``classes`` is the class count's symbol in the message: ``C``, ``V``, ``K``) and none is one
    of ``blanks`` (None, one blank id, or several: a multi-blank transducer's)."""
    if not len(flat):
        return
    lo, hi = int(flat.min()), int(flat.max())
    if lo < 0 or hi >= num_classes:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name}: label {bad} out of range [0, {classes}) with {classes}={num_classes}")
    if blanks is None:
        return
    if isinstance(blanks, (int, np.integer)):
        if (flat == blanks).any():
            raise ValueError(f"{name}: label equal to blank={int(blanks)} found; targets must not contain the blank")
        return
    ids = np.asarray([int(b) for b in blanks], dtype=np.int64)
    hit = flat[np.isin(flat, ids)]
    if hit.size:
        raise ValueError(
            f"{name}: label {int(hit[0])} is a blank class {sorted(ids.tolist())}; targets must not contain the blanks"
        )


_NP_INTS = frozenset({np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64})


def _as_sequences(targets, name: str) -> Optional[List[List[int]]]:
    """A list of B label sequences (lists/tuples/1-D tensors of integers), or None for the
    tensor layouts."""
    if isinstance(targets, (torch.Tensor, np.ndarray)):
        return None
    targets = list(targets)
    if not targets or np.isscalar(targets[0]) or (isinstance(targets[0], torch.Tensor) and targets[0].dim() == 0):
        return None
    out = []
    for t in targets:
        if isinstance(t, (list, tuple)) and all(type(v) is int for v in t):  # plain ints (not bools): as they are
            out.append(list(t))
        elif isinstance(t, (list, tuple)) and all(type(v) in _NP_INTS for v in t):
            out.append([int(v) for v in t])
        else:
            out.append(int_tensor(t, name).reshape(-1).tolist())
    return out


def split_targets(
    targets,
    target_lengths,
    B: int,
    device: torch.device,
    num_classes: int,
    blank: Optional[int] = None,
    name: str = "targets",
) -> List[List[int]]:
    """Targets as B lists of ints, checked: padded ``(B, S)`` or concatenated 1-D with
    ``target_lengths`` (torch's two layouts), or a list of B sequences (then ``target_lengths``
    may be None; when given it must agree)."""
    seqs = _as_sequences(targets, name)
    if seqs is not None:
        if len(seqs) != B:
            raise ValueError(f"{name}: expected B={B} sequences, got {len(seqs)}")
        if target_lengths is not None:
            lengths = as_lengths(target_lengths, B, "target_lengths", device)
            if any(len(s) != n for s, n in zip(seqs, lengths)):
                raise ValueError(f"{name}: a list of B={B} sequences whose lengths equal target_lengths is expected")
        _check_seq_labels(seqs, num_classes, blank, name)
        return seqs
    if target_lengths is None:
        if isinstance(targets, torch.Tensor) and targets.dim() == 2:
            raise ValueError("target_lengths is required with padded targets of shape (B, S)")
        raise ValueError("target_lengths is required with concatenated 1-D targets")
    lengths = as_lengths(target_lengths, B, "target_lengths", device)
    if isinstance(targets, torch.Tensor) and not _host_device_ok(targets, device):
        raise ValueError(f"{name} is on {targets.device} but the emissions are on {device}")
    arr = int_tensor(targets, name).detach().cpu().numpy()
    if arr.ndim == 2:
        if arr.shape[0] != B:
            raise ValueError(f"{name} must have shape (B, S) with B={B}, got {arr.shape}")
        check_padded_labels(arr, lengths, num_classes, blank, name, "C")
        rows = arr.tolist()
        seqs = [rows[b][: lengths[b]] for b in range(B)]
    elif arr.ndim == 1:
        total = int(lengths.sum())
        if arr.shape[0] != total:
            raise ValueError(
                f"concatenated 1-D {name} must have sum(target_lengths)={total} labels, " f"got shape {arr.shape}"
            )
        check_labels(arr, num_classes, blank, name)
        lst = arr.tolist()
        off = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        seqs = [lst[off[b] : off[b + 1]] for b in range(B)]
    else:
        raise ValueError(f"{name} must have shape (B, S) or (sum(target_lengths),), got {arr.shape}")
    return seqs


def flat_targets(
    targets: torch.Tensor,
    target_lengths: torch.Tensor,
    B: int,
    device: torch.device,
    num_classes: int,
    blank: Optional[int] = None,
    name: str = "targets",
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tensor targets as ``(labels, offsets, lengths)`` int64 host arrays, checked as
    :func:`split_targets` checks them (same messages), without a Python list per example:
    example ``b``'s labels are ``labels[offsets[b] : offsets[b] + lengths[b]]``.

    Padded ``(B, S)`` targets are flattened (``offsets = arange(B) * S``, the padding past each
    length is not checked); concatenated 1-D targets keep their order (cumulative offsets)."""
    if not isinstance(targets, torch.Tensor):
        raise ValueError(f"{name} must be a tensor here, got {type(targets).__name__}")
    lengths = as_lengths(target_lengths, B, "target_lengths", device)
    if not _host_device_ok(targets, device):
        raise ValueError(f"{name} is on {targets.device} but the emissions are on {device}")
    arr = int_tensor(targets, name).detach().cpu().numpy()
    if arr.ndim == 2:
        if arr.shape[0] != B:
            raise ValueError(f"{name} must have shape (B, S) with B={B}, got {arr.shape}")
        S = arr.shape[1]
        if S and B and lengths.max() == S and lengths.min() == S:  # every row full: one check of all
            check_labels(arr.reshape(-1), num_classes, blank, name)
        else:
            check_padded_labels(arr, lengths, num_classes, blank, name, "C")
        return np.ascontiguousarray(arr.reshape(-1)), np.arange(B, dtype=np.int64) * S, lengths
    if arr.ndim == 1:
        total = int(lengths.sum())
        if arr.shape[0] != total:
            raise ValueError(
                f"concatenated 1-D {name} must have sum(target_lengths)={total} labels, " f"got shape {arr.shape}"
            )
        check_labels(arr, num_classes, blank, name)
        offsets = np.zeros(B, dtype=np.int64)
        if B > 1:
            np.cumsum(lengths[:-1], out=offsets[1:])
        return np.ascontiguousarray(arr), offsets, lengths
    raise ValueError(f"{name} must have shape (B, S) or (sum(target_lengths),), got {arr.shape}")


def targets_tensors(targets, target_lengths, B: int, device: torch.device, name: str = "targets"):
    """``(targets, target_lengths)`` as int64 tensors for the custom ops.

    Lists of B sequences become a padded ``(B, S)`` tensor with their lengths; tensors and
    arrays are checked for integer dtype only (values are checked inside the op).
    """
    seqs = _as_sequences(targets, name)
    if seqs is not None:
        if len(seqs) != B:
            raise ValueError(f"{name}: expected B={B} sequences, got {len(seqs)}")
        lens = [len(s) for s in seqs]
        if target_lengths is not None:
            given = as_lengths(target_lengths, B, "target_lengths", device)
            if list(given) != lens:
                raise ValueError(f"{name}: a list of B={B} sequences whose lengths equal target_lengths is expected")
        S = max(lens, default=0)
        ln = np.asarray(lens, dtype=np.int64)
        padded = np.zeros((B, S), dtype=np.int64)
        try:
            padded[np.arange(S)[None, :] < ln[:, None]] = np.fromiter(
                itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(ln.sum())
            )
        except OverflowError:
            raise ValueError(f"{name}: labels must fit in int64") from None
        return torch.from_numpy(padded), torch.from_numpy(ln)
    if target_lengths is None:
        if isinstance(targets, torch.Tensor) and targets.dim() == 2:
            raise ValueError("target_lengths is required with padded targets of shape (B, S)")
        raise ValueError("target_lengths is required with tensor targets (padded (B, S) or concatenated 1-D)")
    return int_tensor(targets, name), int_tensor(target_lengths, "target_lengths")


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 stays float64; every other float dtype is scored in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def graph_list(graphs, B: int, name: str) -> List[Graph]:
    """``graphs`` as a list of ``B`` :class:`~lightning_gtn.wfst.Graph` objects: one Graph is
    repeated for every example, a sequence must hold ``B`` Graphs; else ValueError naming ``name``."""
    if isinstance(graphs, Graph):
        return [graphs] * B
    if graphs is None:
        raise ValueError(f"{name}: expected one Graph or a list of B={B} graphs, got None")
    graphs = list(graphs)
    if len(graphs) != B:
        raise ValueError(f"{name} must be one Graph or a list of B={B} graphs, got {len(graphs)}")
    for g in graphs:
        if not isinstance(g, Graph):
            raise ValueError(f"{name} must hold lightning_gtn.wfst.Graph objects, got {type(g).__name__}")
    return graphs


# -- the RNN-T family: joiner outputs (B, T, U + 1, V), index tensors, lengths, labels ---------
# rnnt_loss, the multi-blank and TDT losses, k2's functions, the RNN-T lattices, the forced
# aligner and the pruned module check their arguments with these, so one argument is refused with
# one message wherever it is passed.


def _dims(shape: str) -> List[str]:
    """The symbols of a shape text: ``"(B, T, U + 1, V)"`` -> ``["B", "T", "U + 1", "V"]``."""
    return [d.strip() for d in shape.strip("()").split(",") if d.strip()]


def check_bool(value, name: str) -> bool:
    """``value`` as a bool; ValueError naming ``name`` unless it is a bool (Python's or numpy's)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def check_real(
    value, name: str, lo: float = -math.inf, hi: float = math.inf, *, finite: bool = True, hi_open: bool = False
) -> float:
    """``value`` as a float in ``[lo, hi]`` (``[lo, hi)`` with ``hi_open``); ValueError naming
    ``name`` unless it is a real number (not a bool), never NaN, and finite unless
    ``finite=False`` (which lets ``lo``/``hi`` be met by +-inf)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if math.isnan(v) or (finite and not math.isfinite(v)):
        raise ValueError(f"{name} must be {'finite' if finite else 'a number (not NaN)'}, got {v}")
    if not (lo <= v < hi if hi_open else lo <= v <= hi):
        raise ValueError(f"{name} must lie in [{lo}, {hi}{')' if hi_open else ']'}, got {v}")
    return v


def check_float_tensor(x, name: str, ndim: int, shape: str) -> torch.Tensor:
    """``x`` if it is a floating point tensor of ``ndim`` dims, else ValueError naming ``name``
    and the expected ``shape`` (a text such as ``"(B, S + 1, T)"``)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {shape}, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have shape {shape}, got {x.dim()} dims: {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating point tensor, got {x.dtype}")
    return x


def check_joiner_logits(logits, name: str = "logits", shape: str = "(B, T, U + 1, V)") -> Tuple[int, int, int, int]:
    """``(B, T, U + 1, V)`` of a transducer's joiner outputs: a floating point tensor of 4 dims
    whose last two are not empty; else ValueError naming ``name`` and ``shape`` (k2 names them
    ``"(B, T, S + 1, C)"``)."""
    check_float_tensor(logits, name, 4, shape)
    B, T, U1, V = logits.shape
    if U1 < 1 or V < 1:
        d = _dims(shape)
        raise ValueError(f"{name} must have shape {shape} with {d[2]} >= 1 and {d[3]} >= 1, got {tuple(logits.shape)}")
    return B, T, U1, V


def check_index_tensor(
    x, name: str, shape: Sequence[Optional[int]], text: str, device: Optional[torch.device] = None
) -> torch.Tensor:
    """``x`` (a tensor, or a sequence of integers) as an int64 tensor of ``shape`` (None: any size
    in that dimension), on its own device.

    ValueError naming ``name`` and ``text`` (the shape's symbols, ``"(B, U)"``) for a float, bool or
    complex dtype and for a wrong shape; with ``device``, also for a tensor on another device than
    ``device`` or the CPU (the logits' device: nothing is moved between accelerators silently).
    """
    if not isinstance(x, torch.Tensor):
        x = int_tensor(x, name)
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise ValueError(f"{name} must be an int32 or int64 tensor of shape {text}, got {x.dtype}")
    if x.dim() != len(shape) or any(n is not None and x.shape[i] != n for i, n in enumerate(shape)):
        known = ", ".join(f"{d}={n}" for d, n in zip(_dims(text), shape) if n is not None and not d.isdigit())
        raise ValueError(f"{name} must have shape {text}{' with ' + known if known else ''}, got {tuple(x.shape)}")
    if device is not None and x.device.type != "cpu" and x.device != device:
        raise ValueError(f"{name} is on {x.device} but the logits are on {device}; put it on {device} or the CPU")
    return x.to(torch.int64)


def check_class_id(value, name: str, n: int, classes: str = "V", of: str = "") -> int:
    """A class id in ``[-n, n)`` (an int, numpy integer or 0-dim integer tensor) as an int in
    ``[0, n)``: negative ids count from the end (torchaudio's ``blank=-1`` is ``n - 1``).
    ValueError naming ``name`` otherwise; ``classes`` is ``n``'s symbol, ``of`` says where ``n``
    comes from (``"logits of shape (B, T, U + 1, V)"``)."""
    value = _scalar_int(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(
            f"{name} must be an integer class id in [-{classes}, {classes}) with {classes}={n}, got {value!r}"
        )
    v = int(value)
    if not -n <= v < n:
        where = f" ({of})" if of else ""
        raise ValueError(f"{name} must lie in [-{classes}, {classes}) with {classes}={n}{where}, got {v}")
    return v % n


def check_in_range(values, name: str, bound: str, high: int, *, inclusive: bool, of: str = "") -> None:
    """ValueError naming ``name`` unless every entry of ``values`` (a tensor on any device, or a
    numpy array) lies in ``[0, high]`` (``inclusive``: lengths) or ``[0, high)`` (class ids).
    ``bound`` is ``high``'s symbol (``T``, ``U``, ``C``), ``of`` where it comes from (``"logits of
    shape (B, T, U + 1, V)"``). Reads two values on the host (a device sync for device tensors)."""
    count = values.numel() if isinstance(values, torch.Tensor) else np.size(values)
    if not count:
        return
    lo, hi = int(values.min()), int(values.max())
    if lo < 0 or hi > (high if inclusive else high - 1):
        where = f" ({of})" if of else ""
        raise ValueError(
            f"{name} must lie in [0, {bound}{']' if inclusive else ')'} with {bound}={high}{where}, got "
            f"{lo if lo < 0 else hi}"
        )


def check_padded_labels(
    targets: np.ndarray,
    target_lengths: np.ndarray,
    num_classes: int,
    blanks: Union[None, int, Sequence[int]] = None,
    name: str = "targets",
    classes: str = "V",
) -> np.ndarray:
    """Padded targets ``(B, S)`` with their lengths ``(B,)`` (host int64 arrays, the lengths
    ``>= 0``): ValueError unless ``target_lengths <= S`` and the first ``target_lengths[b]`` labels
    of each row pass :func:`check_labels`. Returns the ``(B, S)`` mask of those labels (the padding
    past them is never read, so never checked)."""
    S = targets.shape[1]
    if len(target_lengths) and target_lengths.max() > S:
        raise ValueError(f"target_lengths must be <= S={S} (targets of shape (B, S)), got {int(target_lengths.max())}")
    valid = np.arange(S)[None, :] < target_lengths[:, None]
    check_labels(targets[valid], num_classes, blanks, name, classes)
    return valid


def check_durations(values, name: str, *, allow_empty: bool, allow_zero: bool) -> List[int]:
    """A strictly increasing list of at most :data:`MAX_DURATIONS` integers in ``[0, MAX_DURATION]``
    (``[1, MAX_DURATION]`` without ``allow_zero``), else ValueError naming ``name``; the length is
    checked before the entries are read."""
    if isinstance(values, torch.Tensor):
        if values.is_floating_point() or values.dtype == torch.bool or values.dim() != 1:
            raise ValueError(f"{name} must be a 1-D sequence of integers, got a {values.dtype} tensor")
        if values.numel() > MAX_DURATIONS:
            raise ValueError(f"{name} must hold at most MAX_DURATIONS={MAX_DURATIONS} durations, got {values.numel()}")
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(f"{name} must be a list of integers, got {values!r}")
    if len(values) > MAX_DURATIONS:
        raise ValueError(f"{name} must hold at most MAX_DURATIONS={MAX_DURATIONS} durations, got {len(values)}")
    out = []
    lo = 0 if allow_zero else 1
    for v in values:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{name} must hold integers, got {v!r} in {list(values)!r}")
        if not lo <= int(v) <= MAX_DURATION:
            raise ValueError(f"{name} must hold integers in [{lo}, MAX_DURATION={MAX_DURATION}] (frames), got {int(v)}")
        out.append(int(v))
    if not out and not allow_empty:
        raise ValueError(f"{name} must not be empty")
    if any(b <= a for a, b in zip(out, out[1:])):
        raise ValueError(f"{name} must be strictly increasing (NeMo's order), got {out}")
    return out


def check_emission_values(
    x: torch.Tensor, name: str = "emissions", lengths=None, compute: Optional[torch.dtype] = None
) -> None:
    """ValueError naming ``name``, the example and the frame, for the first frame within
    ``lengths`` (``(B,)`` integers; None: every frame) of ``x (B, T, C)`` that holds a NaN, a
    +inf, a finite value beyond the range of ``compute`` (the dtype it is scored in; a float64
    value that would round to an infinity in float32), or no finite value at all (every class
    -inf: no label can be emitted there). Frames past an example's length are never read, so never
    checked. Each condition gets its own message; the reductions run on ``x``'s device."""
    B, T, C = x.shape
    if not x.numel():
        return
    valid = None
    if lengths is not None:
        n = torch.as_tensor(lengths, dtype=torch.int64).to(x.device).reshape(-1, 1)
        valid = torch.arange(T, device=x.device)[None, :] < n  # (B, T)
    conditions = [
        (lambda v: torch.isnan(v).any(-1), "NaN"),
        (lambda v: (v == math.inf).any(-1), "+inf (log-probabilities or scores expected)"),
    ]
    if compute is not None and torch.finfo(compute).max < torch.finfo(x.dtype).max:
        top = torch.finfo(compute).max
        conditions.append(
            (
                lambda v: (torch.isfinite(v) & (v.abs() > top)).any(-1),
                f"a value beyond {compute}'s range (|x| > {top:.4g}), which it is scored in",
            )
        )
    conditions.append((lambda v: (v == -math.inf).all(-1), "no finite emission (every class is -inf)"))
    for test, what in conditions:
        bad = test(x)
        if valid is not None:
            bad = bad & valid
        hit = torch.nonzero(bad)
        if hit.numel():
            b, t = (int(v) for v in hit[0])
            raise ValueError(f"{name}: example {b}, frame {t}: {what}")


def renamed_arguments(**renames: str):
    """A decorator for a public function whose keyword arguments were renamed: ``old=new`` pairs.
    A call with ``old=`` warns (DeprecationWarning naming the new keyword) and passes it as
    ``new=``; giving both is a TypeError."""

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{fn.__name__}: give {new}= only ({old}= is its deprecated name)")
                    warnings.warn(
                        f"{fn.__name__}: the keyword {old}= is deprecated; use {new}=",
                        DeprecationWarning,
                        stacklevel=2,
                    )
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper

    return deco
