"""Drawing a forced alignment (:func:`plot_alignment`, matplotlib's Agg backend).

A module of its own because it writes files: :mod:`lightning_gtn._trust` refuses it in
configs read from checkpoints.
"""

from __future__ import annotations

import numpy as np
import torch

from . import _validate
from .align import Alignment, _token_text

__all__ = ["plot_alignment"]


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
    fig = Figure(figsize=(max(6.0, min(0.06 * n + 2, 30.0)), 4.5))
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
    for i, (u, v) in enumerate(zip(s0, s1)):
        if u < 0:
            continue
        ax.axvspan(u - 0.5, v - 0.5, color="white", alpha=0.12 if i % 2 else 0.22, lw=0)
        ax.text((u + v - 1) / 2, -0.9, _token_text(tokens, labs[u]), ha="center", va="top", fontsize=7,
                clip_on=False)
    score = float(alignment.score[b])
    ax.set_title(f"example {b}: {tl} tokens, {n} frames, score {score:.2f}")
    ax.set_xlabel("frame")
    ax.set_ylabel("class")
    ax.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    if path is not None:
        fig.savefig(str(path), dpi=90)
    return fig
