"""Drawing a forced alignment (:func:`plot_alignment`, matplotlib's Agg backend).

A module of its own because it writes files: :mod:`lightning_gtn._trust` refuses it in
configs read from checkpoints.
"""

from __future__ import annotations

import numpy as np
import torch

from . import _validate
from .align import Alignment, _token_text

__all__ = ["plot_alignment", "label_rows", "LABEL_ROWS"]


#: the most rows of token texts above an alignment plot
LABEL_ROWS = 3


def label_rows(items, max_rows: int = LABEL_ROWS) -> list:
    """A row for each ``(center, half_width)`` (in frames, in order) so that texts in one row do
    not overlap: the lowest row whose last text ends before this one starts, else the row that
    ends first (overlap only when ``max_rows`` rows are full there)."""
    return _rows(items, max_rows)[0]


def _rows(items, max_rows: int):
    """``(rows, overlaps)``: :func:`label_rows` and how many texts had no free row."""
    ends = [-float("inf")] * max_rows
    out, overlaps = [], 0
    for c, h in items:
        free = [r for r in range(max_rows) if ends[r] <= c - h]
        r = free[0] if free else min(range(max_rows), key=lambda k: ends[k])
        overlaps += not free
        ends[r] = c + h
        out.append(r)
    return out, overlaps


def _text_half_widths(spans, n: int, width_in: float):
    frames_per_px = max(n, 1) / max(width_in * 0.85 * 72.0, 1.0)
    return [((u + v - 1) / 2, (len(t) * 0.6 * 7 + 4) * frames_per_px / 2) for u, v, t in spans]


def plot_alignment(emissions: torch.Tensor, alignment: Alignment, b: int, tokens=None, path=None):
    """Draws example ``b``: its emissions as an image (classes x frames), the aligned label
    path over it, and the token spans as bands with their text below.

    Args:
        emissions: the ``(B, T, C)`` emissions given to :func:`forced_align`.
        alignment: its result.
        b: the example (``0 <= b < B``).
        tokens: text of each token id (list or mapping); default the ids.
        path: where to write a PNG (optional).

    Returns:
        The matplotlib ``Figure`` (drawn with the Agg backend; close it when done).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    B, T, C = _validate.check_emissions(emissions, "emissions")
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 <= int(b) < B:
        raise ValueError(f"b must be an integer in [0, B={B}), got {b!r}")
    if len(alignment) != B or alignment.labels.shape[1] != T:
        raise ValueError(f"alignment has shape {(len(alignment), alignment.labels.shape[1])}, "
                         f"emissions have (B, T) = {(B, T)}")
    b = int(b)
    n = int(alignment.input_lengths[b])
    x = emissions[b, :max(n, 1)].detach().float().cpu().numpy()
    lab = alignment.labels[b, :n].cpu().numpy()
    tl = int(alignment.target_lengths[b])
    # wide enough for the token texts in LABEL_ROWS rows (with room to spare), at most 30 inches
    starts = alignment.token_start[b, :tl].cpu().tolist()
    labs_all = alignment.labels[b].cpu().tolist()
    texts = [_token_text(tokens, labs_all[u]) for u in starts if u >= 0]
    spans = [(u, v, t) for (u, v), t in zip(
        [(u, v) for u, v in zip(starts, alignment.token_end[b, :tl].cpu().tolist()) if u >= 0], texts)]
    # the narrowest width (6 to 30 inches) at which the token texts fit in LABEL_ROWS rows
    width = max(6.0, min(0.06 * n + 2, 30.0))
    while width < 30.0 and _rows(_text_half_widths(spans, n, width), LABEL_ROWS)[1]:
        width = min(width * 1.15, 30.0)
    fig = Figure(figsize=(width, 4.5))
    ax = fig.add_subplot(1, 1, 1)
    ax.imshow(x.T, origin="lower", aspect="auto", interpolation="nearest", cmap="viridis")
    ok = lab >= 0
    ax.plot(np.nonzero(ok)[0], lab[ok], color="red", lw=1.0, marker=".", ms=3, label="path")
    if alignment.star_frames is not None:
        st = alignment.star_frames[b, :n].cpu().numpy()
        if st.any():
            ax.plot(np.nonzero(st)[0], lab[st], "wx", ms=4, label="star")
    tl = int(alignment.target_lengths[b])
    s0 = alignment.token_start[b, :tl].cpu().tolist()
    s1 = alignment.token_end[b, :tl].cpu().tolist()
    labs = alignment.labels[b].cpu().tolist()
    for i, (u, v, _) in enumerate(spans):
        ax.axvspan(u - 0.5, v - 0.5, color="white", alpha=0.12 if i % 2 else 0.22, lw=0)
    # token texts above the image, in as many rows as they need not to overlap (at most
    # LABEL_ROWS; the width of a text in frames follows from the axes' width in pixels)
    rows = label_rows(_text_half_widths(spans, n, fig.get_figwidth()))
    for (u, v, text), row in zip(spans, rows):
        ax.text((u + v - 1) / 2, 1.01 + 0.055 * row, text, ha="center", va="bottom", fontsize=7,
                transform=ax.get_xaxis_transform(), clip_on=False)
    score = float(alignment.score[b])
    ax.set_title(f"example {b}: {tl} tokens, {n} frames, score {score:.2f}",
                 pad=6 + 11 * (max(rows, default=0) + 1))
    ax.set_xlabel("frame")
    ax.set_ylabel("class")
    ax.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    if path is not None:
        fig.savefig(str(path), dpi=90)
    return fig
