"""Drawing an RNN-T alignment on its ``(T, U + 1)`` lattice (:func:`plot_rnnt_alignment`, Agg).

A module of its own because it writes files (as :mod:`lightning_gtn.align.plot`).
"""

from __future__ import annotations

import numpy as np
import torch

from .forced import Alignment, _token_text

__all__ = ["plot_rnnt_alignment"]


def plot_rnnt_alignment(logits: torch.Tensor, alignment: Alignment, targets, b: int, tokens=None, path=None):
    """Draws example ``b``'s lattice: the probability of emitting token ``u`` at frame ``t`` as an
    image (tokens x frames), and the best path (right: a blank, up: a token) over it.

    Args:
        logits: the ``(B, T, U + 1, V)`` joiner outputs given to
            :func:`lightning_gtn.align.rnnt.rnnt_forced_align` (normalised over ``V`` here).
        alignment: its result.
        targets: the ``(B, U)`` targets given to it.
        b: the example, ``0 <= b < B``.
        tokens: text of each token id (list or mapping) for the rows; default the ids.
        path: where to write a PNG (optional).

    Returns:
        The matplotlib ``Figure`` (Agg backend; close it when done).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    if not isinstance(logits, torch.Tensor) or logits.dim() != 4:
        raise ValueError("logits must be the (B, T, U + 1, V) tensor that was aligned")
    B, T, U1, _ = logits.shape
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 <= int(b) < B:
        raise ValueError(f"b must be an integer in [0, B={B}), got {b!r}")
    if len(alignment) != B or alignment.token_start.shape[1] != U1 - 1:
        raise ValueError(f"alignment does not match logits of shape {tuple(logits.shape)}")
    b = int(b)
    n, k = int(alignment.input_lengths[b]), int(alignment.target_lengths[b])
    y = torch.as_tensor(targets)[b, :k].long().cpu()
    lp = logits[b, :n, :k].detach().float().cpu().log_softmax(-1)  # (n, k, V)
    grid = lp.gather(-1, y.view(1, k, 1).expand(n, k, 1)).squeeze(-1).exp().numpy() if k else np.zeros((n, 0))
    fig = Figure(figsize=(max(5.0, min(0.08 * n + 2, 30.0)), max(3.0, min(0.25 * k + 1.5, 20.0))))
    ax = fig.add_subplot(1, 1, 1)
    if n and k:
        im = ax.imshow(grid.T, origin="lower", aspect="auto", interpolation="nearest", cmap="viridis", vmin=0, vmax=1)
        fig.colorbar(im, ax=ax, label="P(emit token u at frame t)")
    frames = alignment.token_start[b, :k].cpu().tolist()
    if n and all(f >= 0 for f in frames):
        # horizontal at height u - 0.5: u tokens emitted; a token u emitted at frame t goes up
        # through the centre of cell (t, u), the cell that shows its probability
        xs, ys, u = [-0.5], [-0.5], 0
        for t in range(n):
            xs.append(t)
            ys.append(u - 0.5)
            while u < k and frames[u] == t:
                u += 1
                xs.append(t)
                ys.append(u - 0.5)
            xs.append(t + 0.5)
            ys.append(u - 0.5)
        ax.plot(xs, ys, color="red", lw=1.2, label="best path")
        ax.legend(loc="upper left", fontsize=7)
    ax.set_yticks(range(k))
    ax.set_yticklabels([_token_text(tokens, int(v)).replace(" ", "\u2423") for v in y.tolist()], fontsize=7)
    ax.set_xlabel("frame t")
    ax.set_ylabel("token u")
    ax.set_title(f"example {b}: {k} tokens, {n} frames, score {float(alignment.score[b]):.2f}")
    fig.tight_layout()
    if path is not None:
        fig.savefig(str(path), dpi=90)
    return fig
