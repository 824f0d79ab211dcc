"""The mutual-information recursion of k2's RNN-T losses, forward and backward.

Over a grid ``p`` of shape ``(B, S + 1, T + 1)`` with, per example, a boundary
``[s_begin, t_begin, s_end, t_end]``::

    p[b, s_begin, t_begin] = 0
    regular  (px: (B, S, T + 1)): p[b, s, t] = logadd(p[b, s - 1, t] + px[b, s - 1, t],
                                                       p[b, s, t - 1] + py[b, s, t - 1])
    modified (px: (B, S, T)):     p[b, s, t] = logadd(p[b, s - 1, t - 1] + px[b, s - 1, t - 1],
                                                       p[b, s, t - 1] + py[b, s, t - 1])
    score[b] = p[b, s_end, t_end]

(cells outside the example's rectangle count as -inf; the shape of ``px`` says which recursion).
The backward gives the occupation probabilities of the ``px`` and ``py`` arcs, which are the
gradients of ``score[b]``: ``alpha + arc + beta - score`` exponentiated, with ``beta`` the same
recursion run from the end. An example whose score is ``-inf`` (no path: more symbols than
frames in the modified recursion) gets zero gradients; a NaN read inside the rectangle gives a
NaN score and NaN gradients for that example (values outside the rectangle are never read).

Three implementations with the same results: :func:`mi_numba` (CPU: the engine's shared
transducer lattice, :mod:`.transducer_lattice_numba`, float64 inside, examples shared over the
engine's threads), :func:`mi_torch` (any device: the torch transducer lattice,
:mod:`.transducer_lattice_torch`, one vectorised step per anti-diagonal ``s + t = d``) and the
Triton kernel :func:`~.rnnt_triton.mutual_information_triton` (CUDA: one program per example and
direction, walking frames, with the same wavefront where a frame does not fit one block);
:func:`mutual_information` runs the one it is given. The custom op over
them, ``lightning_gtn::mutual_information``, and the choice of a device's implementation are in
:mod:`lightning_gtn.losses.k2_rnnt`.
Boundaries are range-checked by :func:`check_boundary_values` before a kernel indexes with them.
"""

from __future__ import annotations

import math
from typing import Tuple

import numpy as np
import torch
from torch import Tensor

from .dense_numba import run_rows
from .logmath import NEG_INF
from .rnnt_triton import mutual_information_triton
from .transducer_lattice_numba import LOG_CHECKED, POST_ALL, POST_NONE, lattice_examples
from .transducer_lattice_torch import lattice_posteriors

__all__ = [
    "check_boundary_values",
    "mi_numba",
    "mi_torch",
    "mutual_information",
]


def check_boundary_values(bnd: np.ndarray, S: int, T: int, name: str = "boundary") -> None:
    """ValueError naming ``name`` unless every row of the ``(B, 4)`` array is
    ``0 <= s_begin <= s_end <= S`` and ``0 <= t_begin <= t_end <= T``."""
    if bnd.ndim != 2 or bnd.shape[1] != 4:
        raise ValueError(f"{name} must have shape (B, 4), got {tuple(bnd.shape)}")
    if bnd.shape[0] == 0:
        return
    s0, t0, s1, t1 = bnd[:, 0], bnd[:, 1], bnd[:, 2], bnd[:, 3]
    bad = (s0 < 0) | (s0 > s1) | (s1 > S) | (t0 < 0) | (t0 > t1) | (t1 > T)
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{name} rows must be [s_begin, t_begin, s_end, t_end] with 0 <= s_begin <= s_end <= S={S} "
            f"and 0 <= t_begin <= t_end <= T={T}; row {b} is {bnd[b].tolist()}"
        )


def check_shapes(px: Tensor, py: Tensor, boundary: Tensor) -> None:
    """ValueError unless ``px`` is ``(B, S, T + 1)`` (or ``(B, S, T)``, the modified recursion),
    ``py`` ``(B, S + 1, T)`` and ``boundary`` ``(B, 4)``: the kernels index with these shapes."""
    if px.dim() != 3 or py.dim() != 3:
        raise ValueError(f"px and py must be 3-D, got {tuple(px.shape)} and {tuple(py.shape)}")
    B, S, T1 = px.shape
    T = py.shape[2]
    if tuple(py.shape) != (B, S + 1, T) or T1 not in (T, T + 1):
        raise ValueError(
            f"px must be (B, S, T + 1) or (B, S, T) and py (B, S + 1, T); got {tuple(px.shape)} and {tuple(py.shape)}"
        )
    if tuple(boundary.shape) != (B, 4):
        raise ValueError(f"boundary must have shape (B, 4) = ({B}, 4), got {tuple(boundary.shape)}")


# -- numba ---------------------------------------------------------------------------------------


_MI_DI = np.array([1, 0], dtype=np.int64)  # px advances the symbol, py the frame
_MI_DJ = {False: np.array([0, 1], dtype=np.int64), True: np.array([1, 1], dtype=np.int64)}  # modified: px (1, 1)
_NO_PATH = np.zeros((1, 1, 3), dtype=np.int64)  # the max semiring's outputs, unused here
_NO_LEN = np.zeros(1, dtype=np.int64)


def _mi_rows(e0, e1, px, py, bnd, modified, need_grad, scores, pxg, pyg):
    """Examples ``e0 .. e1 - 1``: ``scores[b]`` and, with ``need_grad``, the occupation
    probabilities written into the zero-filled ``pxg``, ``pyg`` inside each rectangle: the shared
    lattice (:mod:`.transducer_lattice_numba`) over nodes ``(s, t)``, arc kinds ``px`` then ``py``."""
    lattice_examples(
        e0,
        e1,
        (px, py),
        _MI_DI,
        _MI_DJ[bool(modified)],
        bnd,
        LOG_CHECKED,
        POST_ALL if need_grad else POST_NONE,
        False,
        scores,
        (pxg, pyg),
        _NO_PATH,
        _NO_LEN,
    )


@torch.no_grad()
def mi_numba(px: Tensor, py: Tensor, boundary: Tensor, need_grad: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """The recursion on the CPU: ``(scores (B,), px_grad, py_grad)`` in ``px``'s dtype (the grads
    are empty ``(0,)`` tensors without ``need_grad``). ``boundary`` is ``(B, 4)`` int64; the shapes are
    checked by the op (:func:`check_shapes`), the boundary's values here."""
    B, S, T1 = px.shape
    T = py.shape[2]
    modified = T1 == T
    dtype = px.dtype
    if dtype not in (torch.float32, torch.float64):
        px, py = px.float(), py.float()
    # read and written in the inputs' own dtype (no float64 copies); sums run in float64
    pxn = px.detach().contiguous().numpy()
    pyn = py.detach().to(px.dtype).contiguous().numpy()
    bnd = np.ascontiguousarray(boundary.detach().cpu().numpy().astype(np.int64))
    check_boundary_values(bnd, S, T)
    scores = np.empty(B, dtype=np.float64)
    gshape = (B, S, T1) if need_grad else (1, 1, 1)
    pxg = np.zeros(gshape, dtype=pxn.dtype)
    pyg = np.zeros((B, S + 1, T) if need_grad else (1, 1, 1), dtype=pxn.dtype)

    def run(e0, e1):
        _mi_rows(e0, e1, pxn, pyn, bnd, modified, need_grad, scores, pxg, pyg)

    cost = ((bnd[:, 2] - bnd[:, 0] + 1) * (bnd[:, 3] - bnd[:, 1] + 1)).astype(np.float64) if B else np.zeros(0)
    if B:
        run_rows(run, cost, 50_000)
    out = torch.from_numpy(scores).to(dtype)
    if not need_grad:
        return out, px.new_empty(0), py.new_empty(0)
    return out, torch.from_numpy(pxg).to(dtype), torch.from_numpy(pyg).to(dtype)  # no copy unless half


# -- torch (any device) --------------------------------------------------------------------------


def _mi_arc_scores(px: Tensor, py: Tensor, modified: bool) -> Tensor:
    """``(B, T + 1, S + 1, 2)`` arc scores over the lattice nodes ``(t, s)``: kind 0 is ``py``
    (one frame), kind 1 ``px`` (one symbol; and one frame in the modified recursion); -inf where
    an arc has no score."""
    B, S, T1 = px.shape
    T = py.shape[2]
    sc = px.new_full((B, T + 1, S + 1, 2), NEG_INF)
    sc[:, :T, :, 0] = py.transpose(1, 2)
    sc[:, :T1, :S, 1] = px.transpose(1, 2)
    return sc


@torch.no_grad()
def mi_torch(px: Tensor, py: Tensor, boundary: Tensor, need_grad: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """As :func:`mi_numba` on any device, in ``px``'s dtype: the lattice of
    :mod:`.transducer_lattice_torch` (one vectorised step per anti-diagonal ``s + t``, forward,
    then backward from the end for the gradients) over the nodes ``(t, s)``, ``py`` the arcs
    ``(1, 0)`` and ``px`` ``(0, 1)`` (``(1, 1)`` in the modified recursion)."""
    B, S, T1 = px.shape
    T = py.shape[2]
    modified = T1 == T
    dev = px.device
    # clamped so that no index can leave the grid, even for a boundary that was not checked
    bnd = boundary.to(device=dev, dtype=torch.long)
    bnd = torch.stack([bnd[:, k].clamp(0, S if k % 2 == 0 else T) for k in range(4)], dim=1)
    begin, end = bnd[:, [1, 0]], bnd[:, [3, 2]]  # (t, s)
    dt = (1, 1) if modified else (1, 0)
    scores, post = lattice_posteriors(_mi_arc_scores(px, py.to(px.dtype), modified), dt, (0, 1), begin, end, need_grad)
    if post is None:
        return scores, px.new_empty(0), py.new_empty(0)
    pxg = post[:, :T1, :S, 1].transpose(1, 2).contiguous()
    pyg = post[:, :T, :, 0].transpose(1, 2).contiguous()
    return scores, pxg, pyg


# -- the custom op -------------------------------------------------------------------------------


def _mi_triton(px: Tensor, py: Tensor, boundary: Tensor, need_grad: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """The Triton kernel, with the NaN convention of the others: an example whose score is NaN
    has NaN gradients (the kernel leaves them 0)."""
    scores, grads = mutual_information_triton(px, py, boundary.to(px.device), need_grad)
    if grads is None:
        return scores, px.new_empty(0), py.new_empty(0)
    pxg, pyg = grads
    bad = torch.isnan(scores).reshape(-1, 1, 1)
    if bool(bad.any()):
        pxg = pxg.masked_fill(bad, math.nan)
        pyg = pyg.masked_fill(bad, math.nan)
    return scores, pxg, pyg


def mutual_information(
    px: Tensor, py: Tensor, boundary: Tensor, need_grad: bool, impl: str
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(scores (B,), px_grad, py_grad)`` of the recursion (see the module docstring) by the
    implementation ``impl`` (``"numba"``, ``"torch"`` or ``"triton"``); the grads are ``(0,)`` tensors
    without ``need_grad``. ``boundary`` is ``(B, 4)`` int64; the shapes are checked here."""
    check_shapes(px, py, boundary)
    if impl == "numba":
        return mi_numba(px.cpu(), py.cpu(), boundary.cpu(), need_grad)
    if impl == "triton":
        return _mi_triton(px, py, boundary, need_grad)
    return mi_torch(px, py, boundary, need_grad)
