"""Drawing a forced alignment (:func:`plot_alignment`, matplotlib's Agg backend).

A module of its own because it writes files: :mod:`lightning_gtn.trust` refuses it in
configs read from checkpoints.
"""

from __future__ import annotations

import numpy as np
import torch

from ..core import checks
from .forced import Alignment, _token_text

__all__ = ["plot_alignment"]


#: rows of token labels above the image; a label goes to the first row where it does not touch
#: the previous label, and is left out (counted in the title) when no row has room
_LABEL_ROWS = 3


def _label_text(tokens, i: int) -> str:
    text = _token_text(tokens, i)
    return "\u2423" if text.isspace() else text  # an open box for a space token


def _token_labels(strip, spans, texts, n: int, width: float) -> int:
    """Writes each token's text centred over its span in the strip, in up to
    :data:`_LABEL_ROWS` rows without overlaps; returns how many were left out."""
    frames_per_inch = max(n, 1) / (0.91 * width)
    last = [-np.inf] * _LABEL_ROWS  # right edge (frames) of the last label in each row
    skipped = 0
    for (_, u, v), text in zip(spans, texts):
        centre = (u + v - 1) / 2
        half = 0.5 * (0.075 * len(text) + 0.04) * frames_per_inch  # about 0.075 inch a character at 7 pt
        row = next((r for r in range(_LABEL_ROWS) if last[r] < centre - half), None)
        if row is None:
            skipped += 1
            continue
        last[row] = centre + half
        strip.text(centre, _LABEL_ROWS - row - 0.5, text, ha="center", va="center", fontsize=7)
    return skipped


def plot_alignment(emissions: torch.Tensor, alignment: Alignment, b: int, tokens=None, path=None):
    """Draws example ``b``: its emissions as an image (classes x frames), the aligned label
    path over it, and the token spans as bands, their text in a strip above (labels
    staggered over up to three rows so that none overlap; a label with no room is left out and
    the title says how many).

    Args:
        emissions: the ``(B, T, C)`` emissions given to :func:`~lightning_gtn.align.forced.forced_align`.
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

    B, T, C = checks.check_emissions(emissions, "emissions")
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 <= int(b) < B:
        raise ValueError(f"b must be an integer in [0, B={B}), got {b!r}")
    if len(alignment) != B or alignment.labels.shape[1] != T:
        raise ValueError(
            f"alignment has shape {(len(alignment), alignment.labels.shape[1])}, " f"emissions have (B, T) = {(B, T)}"
        )
    b = int(b)
    n = int(alignment.input_lengths[b])
    x = emissions[b, : max(n, 1)].detach().float().cpu().numpy()
    lab = alignment.labels[b, :n].cpu().numpy()
    width = max(6.0, min(0.06 * n + 2, 30.0))
    fig = Figure(figsize=(width, 5.2))
    grid = fig.add_gridspec(2, 1, height_ratios=[1, 5], hspace=0.04)
    ax = fig.add_subplot(grid[1])
    strip = fig.add_subplot(grid[0], sharex=ax)
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
    spans = [(i, u, v) for i, (u, v) in enumerate(zip(s0, s1)) if u >= 0]
    for i, u, v in spans:
        ax.axvspan(u - 0.5, v - 0.5, color="white", alpha=0.12 if i % 2 else 0.22, lw=0)
        strip.axvspan(u - 0.5, v - 0.5, color="tab:blue", alpha=0.10 if i % 2 else 0.22, lw=0)
    skipped = _token_labels(strip, spans, [_label_text(tokens, labs[u]) for _, u, _ in spans], n, width)
    strip.set_ylim(0, _LABEL_ROWS)
    strip.set_yticks([])
    strip.tick_params(labelbottom=False)
    strip.set_ylabel("tokens", fontsize=7)
    score = float(alignment.score[b])
    strip.set_title(
        f"example {b}: {tl} tokens, {n} frames, score {score:.2f}"
        + (f" ({skipped} token labels left out: no room)" if skipped else "")
    )
    ax.set_xlabel("frame")
    ax.set_ylabel("class")
    ax.legend(loc="upper right", fontsize=7)
    fig.subplots_adjust(left=0.07, right=0.98, top=0.92, bottom=0.1)
    if path is not None:
        fig.savefig(str(path), dpi=90)
    return fig
