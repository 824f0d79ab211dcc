"""Viterbi with backpointers over the star alignment graphs, without graphs (CPU, numba).

:func:`lightning_gtn.align.forced.align_graph` with a star label adds one *star* node per gap
``g = 0 .. L`` of the target to CTC's graph (with a blank) or to the force-align chain (without).
This kernel walks the same graph without building it, gap by gap: with a blank each gap holds
its blank node ``B[g]`` (graph node ``2 g``), token ``g``'s node ``K[g]`` (``2 g + 1``, none for
``g = L``) and its star node ``R[g]`` (``2 L + 1 + g``); without a blank, ``K[g]`` (node
``g + 1``) and ``R[g]`` (``L + 1 + g``), node 0 being the start. After frame ``t``::

    B[g] = best of (B[g], K[g-1], R[g])                 + E[t, blank]
    K[g] = best of (K[g], B[g], K[g-1] if skip, R[g])   + E[t, y[g]]     (with a blank)
    R[g] = best of (B[g], K[g-1], R[g])                 + star[t]
    K[g] = best of (node g, K[g], R[g])                 + E[t, y[g]]     (without)
    R[g] = best of (node g, R[g])                       + star[t]

with ``star[t]`` the star column of the augmented emissions (the frame's best non-blank score
plus the star's penalty). Each candidate is the predecessor's score plus the frame's score and
the first strictly larger one wins, in the order of the node's incoming arcs in
:func:`~lightning_gtn.align.forced.align_graph` (the order above), and the best accept node is
the one with the smallest graph node id on ties: the sums, comparisons and ties of
:func:`~lightning_gtn.kernels.viterbi_paths.numba_viterbi_arcs` on that graph, so the paths are
the same, bit for bit.

The design is the plain CTC kernel's (:func:`~lightning_gtn.kernels.viterbi_paths.ctc_states`):
only the feasible band of gaps is computed each frame (its lower and upper ends from the fewest
frames into and out of each gap, :func:`~lightning_gtn.kernels.viterbi_paths.feasible_band`), the
inner loops are branch-free over contiguous views, and the backpointers of one frame are packed
into one byte per gap (two bits for each node of the gap). They take ``T * (L + 2)`` bytes when
that fits :data:`~lightning_gtn.kernels.viterbi_paths.BP_BUDGET`, else those of a chunk of
frames at a time, recomputed from scores checkpointed at the chunk starts; the search of one
example is capped by :data:`~lightning_gtn.kernels.viterbi_paths.MAX_ALIGN_BYTES`.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from . import viterbi_paths as _vp

__all__ = ["star_states", "star_nodes"]


@njit(cache=True, inline="always")
def _first_best3(v0, v1, v2):
    """``(max, position of the first strictly largest)`` of three sums (ties: the earliest)."""
    m = max(v0, v1)
    c = np.uint8(1) if v1 > v0 else np.uint8(0)
    c = np.uint8(2) if v2 > m else c
    return max(m, v2), c


@njit(cache=True, nogil=True)
def _star_frames(E, b, lab, skip_add, star_col, blank, L, band_a, band_z, t0, t1, prev, cur, em, bp, store):
    """Frames ``t0 .. t1 - 1`` of one example from ``prev`` (the scores after ``t0`` frames);
    returns ``(scores after t1 frames, the other buffer)``. A buffer holds ``L + 2`` scores per
    node kind: ``B[g]`` at ``g`` (with a blank), ``K[g - 1]`` at ``o + g`` (``o + 0``: the start
    node without a blank, ``-inf`` with one), ``R[g]`` at ``o + L + 2 + g``. Gaps
    ``band_a[t] .. band_z[t]`` are computed; backpointers go to ``bp[t - t0]`` when ``store``
    (each candidate summed and compared, as the graph kernel does), else only the scores."""
    ninf = -np.inf
    W = L + 2
    oK = W if blank >= 0 else 0
    oR = oK + W
    for t in range(t0, t1):
        a = band_a[t]
        z = band_z[t]
        n = z + 1 - a
        # K[a - 1] leaves the band (gap a - 1 can no longer reach the end): -inf from now on;
        # without a blank this also ends the start node after the first frame
        cur[oK + a] = ninf
        Et = E[b, t]
        es = star_col[b, t]
        m = min(z, L - 1) + 1 - a  # gaps with a token in the band
        ev = em[:n]
        lb = lab[a : a + max(m, 0)]
        for j in range(max(m, 0)):
            ev[j] = Et[lb[j]]
        for j in range(max(m, 0), n):
            ev[j] = ninf  # gap L has no token
        pk1 = prev[oK + a : oK + a + n]  # K[g - 1] (or the start node)
        pk = prev[oK + a + 1 : oK + a + 1 + n]  # K[g]
        pr = prev[oR + a : oR + a + n]  # R[g]
        ck = cur[oK + a + 1 : oK + a + 1 + n]
        cr = cur[oR + a : oR + a + n]
        if not store:
            # scores only: the best predecessor plus the frame's score (the same value as the
            # best of the sums: adding one number is monotone)
            if blank >= 0:
                eb = Et[blank]
                sk = skip_add[a : a + n]
                pb = prev[a : a + n]
                cb = cur[a : a + n]
                for j in range(n):
                    xb = pb[j]
                    x1 = pk1[j]
                    xr = pr[j]
                    m = max(max(xb, x1), xr)
                    cb[j] = m + eb
                    cr[j] = m + es
                    ck[j] = max(max(pk[j], xb), max(x1 + sk[j], xr)) + ev[j]
            else:
                for j in range(n):
                    x1 = pk1[j]
                    xr = pr[j]
                    ck[j] = max(max(x1, pk[j]), xr) + ev[j]
                    cr[j] = max(x1, xr) + es
        elif blank >= 0:
            brow = bp[t - t0, a : a + n]
            eb = Et[blank]
            sk = skip_add[a : a + n]
            pb = prev[a : a + n]
            cb = cur[a : a + n]
            for j in range(n):
                xb = pb[j]
                x1 = pk1[j]
                xr = pr[j]
                e = ev[j]
                # blank: stay, from token g - 1, from the star
                cb[j], kb = _first_best3(xb + eb, x1 + eb, xr + eb)
                # token: stay, from the blank, the skip from token g - 1, from the star
                m, kk = _first_best3(pk[j] + e, xb + e, (x1 + sk[j]) + e)
                w3 = xr + e
                ck[j] = max(m, w3)
                kk = np.uint8(3) if w3 > m else kk
                # star: from the blank, from token g - 1, stay
                cr[j], kr = _first_best3(xb + es, x1 + es, xr + es)
                brow[j] = kb | (kk << np.uint8(2)) | (kr << np.uint8(4))
        else:
            brow = bp[t - t0, a : a + n]
            for j in range(n):
                x1 = pk1[j]
                xr = pr[j]
                e = ev[j]
                # token: from node g, stay, from the star
                ck[j], kk = _first_best3(x1 + e, pk[j] + e, xr + e)
                # star: from node g, stay
                u0 = x1 + es
                u1 = xr + es
                cr[j] = max(u0, u1)
                brow[j] = kk | ((np.uint8(1) if u1 > u0 else np.uint8(0)) << np.uint8(2))
        tmp = prev
        prev = cur
        cur = tmp
    return prev, cur


@njit(cache=True, nogil=True)
def _star_bounds(y, L, blank, T, band_a, band_z):
    """Skip scores (0 or ``-inf``) of each token and the feasible band of gaps per frame; False
    when the target cannot fit ``T`` frames. A gap is feasible after ``t + 1`` frames when one
    of its nodes can be reached in ``t + 1`` frames and can reach an accept node in the
    ``T - t - 1`` left; stars never shorten a path (a star frame stands where a blank would), so
    the fewest frames are CTC's (with a blank) or one per token (without)."""
    skip = np.zeros(L + 1, dtype=np.bool_)
    lo = np.empty(L + 1, dtype=np.int64)  # fewest frames into a node of gap g
    hi = np.zeros(L + 1, dtype=np.int64)  # fewest frames from a node of gap g to the end
    if blank >= 0:
        for g in range(1, L):
            skip[g] = y[g] != y[g - 1]
        # K[g]: lo_K[g] = min(lo_B[g], lo_K[g - 1] if skip) + 1, lo_B[g] = lo_K[g - 1] + 1
        lo[0] = 0
        lok = 1
        for g in range(1, L + 1):
            lo[g] = lok + 1
            if g < L:
                lok = lok + 1 if skip[g] else lok + 2
        # hi_K[L - 1] = 0, hi_K[g] = min(hi_K[g + 1] if skip, hi_K[g + 1] + 1) + 1
        if L > 0:
            hi[L - 1] = 0
            for g in range(L - 2, -1, -1):
                hi[g] = hi[g + 1] + (1 if skip[g + 1] else 2)
        need = hi[0] + 1 if L > 0 else 0  # from the start node B[0]
    else:
        for g in range(L + 1):
            lo[g] = g + 1
            hi[g] = max(L - 1 - g, 0)
        need = L
    if need > T:
        return skip, False
    _vp.feasible_band(lo, hi, T, band_a, band_z)
    return skip, True


@njit(cache=True, nogil=True)
def _star_kernel(order, i0, stride, E, star_col, targets, tlen, ilen, blank, cells, states, score, progress):
    """Examples ``order[i0::stride]``: ``states[b, t]`` the graph node (numbered as
    :func:`star_nodes`) after frame ``t`` on the best path, ``score[b]`` its score (``-inf``
    and states -1 when none); ``progress[i0]`` counts the frames done (both passes)."""
    ninf = -np.inf
    isz = E.itemsize
    for i in range(i0, order.shape[0], stride):
        b = order[i]
        L = tlen[b]
        T = ilen[b]
        W = L + 2
        nseg = 3 if blank >= 0 else 2
        oK = W if blank >= 0 else 0
        oR = oK + W
        y = targets[b, :L]
        band_a = np.empty(T, dtype=np.int64)
        band_z = np.empty(T, dtype=np.int64)
        skip, ok = _star_bounds(y, L, blank, T, band_a, band_z)
        score[b] = ninf
        if not ok:
            continue
        lab = np.zeros(L + 1, dtype=np.int64)
        skip_add = np.full(L + 1, ninf, dtype=E.dtype)
        for g in range(L):
            lab[g] = y[g]
            if skip[g]:
                skip_add[g] = 0.0
        K = _vp.kernel_chunk_frames(T, W, isz, cells)
        n = (T + K - 1) // K if T > 0 else 1
        prev = np.full(nseg * W, ninf, dtype=E.dtype)
        cur = np.full(nseg * W, ninf, dtype=E.dtype)
        em = np.empty(L + 1, dtype=E.dtype)
        prev[0] = 0.0  # the start node: B[0] with a blank, node 0 without
        bp = np.empty((K, W), dtype=np.uint8)
        ck = np.empty((n if n > 1 else 0, nseg * W), dtype=E.dtype)
        if n > 1:
            for c in range(n):
                ck[c, :] = prev
                t1 = min(T, (c + 1) * K)
                prev, cur = _star_frames(
                    E, b, lab, skip_add, star_col, blank, L, band_a, band_z, c * K, t1, prev, cur, em, bp, False
                )
                progress[i0] += t1 - c * K
        else:
            prev, cur = _star_frames(
                E, b, lab, skip_add, star_col, blank, L, band_a, band_z, 0, T, prev, cur, em, bp, True
            )
            progress[i0] += T
        # the accept nodes in graph-id order, the first strictly best wins: K[L - 1], B[L], R[L]
        kind = -1
        best = ninf
        if L > 0 or blank < 0:
            if prev[oK + L] > best:
                best = prev[oK + L]
                kind = 1
        if blank >= 0 and prev[L] > best:
            best = prev[L]
            kind = 0
        if prev[oR + L] > best:
            best = prev[oR + L]
            kind = 2
        if kind < 0:
            continue
        score[b] = best
        g = L - 1 if kind == 1 else L
        for c in range(n - 1, -1, -1):
            t0 = c * K
            t1 = min(T, t0 + K)
            if n > 1:
                prev[:] = ck[c]
                cur[:] = ninf
                _star_frames(E, b, lab, skip_add, star_col, blank, L, band_a, band_z, t0, t1, prev, cur, em, bp, True)
                progress[i0] += t1 - t0
            for t in range(t1 - 1, t0 - 1, -1):
                code = bp[t - t0, g]
                if blank >= 0:
                    if kind == 0:
                        states[b, t] = 2 * g
                        c0 = code & 3
                        if c0 == 1:
                            kind = 1
                            g -= 1
                        elif c0 == 2:
                            kind = 2
                    elif kind == 1:
                        states[b, t] = 2 * g + 1
                        c0 = (code >> 2) & 3
                        if c0 == 1:
                            kind = 0
                        elif c0 == 2:
                            g -= 1
                        elif c0 == 3:
                            kind = 2
                    else:
                        states[b, t] = 2 * L + 1 + g
                        c0 = (code >> 4) & 3
                        if c0 == 0:
                            kind = 0
                        elif c0 == 1:
                            kind = 1
                            g -= 1
                else:
                    if kind == 1:
                        states[b, t] = g + 1
                        c0 = code & 3
                        if c0 == 0:
                            g -= 1
                        elif c0 == 2:
                            kind = 2
                    else:
                        states[b, t] = L + 1 + g
                        if ((code >> 2) & 3) == 0:
                            kind = 1
                            g -= 1


def star_nodes(L: int, blank: bool) -> int:
    """Nodes of the star alignment graph of ``L`` tokens: ``3 L + 2`` with a blank, ``2 L + 2``
    without."""
    return 3 * L + 2 if blank else 2 * L + 2


def star_states(
    E: torch.Tensor,
    star_col: torch.Tensor,
    targets: np.ndarray,
    target_lengths: np.ndarray,
    input_lengths: np.ndarray,
    blank: int,
):
    """Best paths through the star alignment graphs on the CPU: ``(states (B, T) int64, score (B,))``.

    ``states[b, t]`` is the node of :func:`lightning_gtn.align.forced.align_graph` (with
    ``star_label``) after frame ``t``: with a blank (``blank >= 0``) ``2 l`` the blank of gap
    ``l``, ``2 l + 1`` token ``l``, ``2 L + 1 + l`` the star of gap ``l``; without
    (``blank = -1``) ``l + 1`` token ``l`` and ``L + 1 + l`` the star of gap ``l``. -1 past the
    length and for an example with no path (score ``-inf``). The same paths as
    :func:`~lightning_gtn.kernels.viterbi_paths.numba_viterbi_arcs` on that graph scored against
    the emissions with ``star_col`` appended as column ``C``.

    Args:
        E: ``(B, T, C)`` contiguous float32/float64 CPU tensor.
        star_col: ``(B, T)`` the star's score of each frame, in ``E``'s dtype.
        targets: int64 ``(B, S)`` labels in ``[0, C)`` (never ``blank``).
        target_lengths, input_lengths: ``(B,)`` within ``S`` and ``T``.
        blank: the blank id in ``[0, C)``, or -1 for none.
    """
    B, T, C = E.shape[0], E.shape[1], E.shape[2]
    En = E.detach().contiguous().numpy()
    if tuple(star_col.shape) != (B, T) or star_col.dtype != E.dtype:
        raise ValueError(f"star_col must be ({B}, {T}) of {E.dtype}, got {tuple(star_col.shape)} {star_col.dtype}")
    Sn = np.ascontiguousarray(star_col.detach().cpu().numpy())
    tg, tl, il = _vp.check_path_inputs(B, T, C, targets, target_lengths, input_lengths, blank, allow_no_blank=True)
    for b in range(B):
        _vp.check_search_bytes(
            int(il[b]), star_nodes(int(tl[b]), blank >= 0), En.itemsize, f"example {b}: ", bp_row=int(tl[b]) + 2
        )
    states = np.full((B, max(T, 1)), -1, dtype=np.int64)
    score = np.full(B, _vp.NEG_INF, dtype=En.dtype)
    cells = _vp.BP_BUDGET

    def kernel(order, j, k, progress):
        _star_kernel(order, j, k, En, Sn, tg, tl, il, blank, cells, states, score, progress)

    _vp.run_dealt(kernel, il, tl + 2, En.itemsize, cells)
    return torch.from_numpy(states[:, :T]), torch.from_numpy(score)
