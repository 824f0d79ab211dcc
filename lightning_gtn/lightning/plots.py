"""PNG figures of a run: training curves and Viterbi alignments over emissions (matplotlib, Agg)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["plot_training_curves", "plot_alignments"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_training_curves(history: Mapping[str, Sequence[tuple[float, float]]], path: str | os.PathLike) -> str:
    """Draws each ``name -> [(step, value), ...]`` series; losses left, error rates right.

    Returns:
        the path written.
    """
    plt = _pyplot()
    fig, (ax_loss, ax_err) = plt.subplots(1, 2, figsize=(11, 4))
    for name, series in sorted(history.items()):
        if not series:
            continue
        x, y = zip(*series)
        ax = ax_err if name.endswith(("cer", "wer")) else ax_loss
        ax.plot(x, y, marker="." if len(x) < 50 else None, label=name)
    ax_loss.set_xlabel("step"), ax_loss.set_ylabel("loss"), ax_loss.set_title("loss")
    ax_err.set_xlabel("step"), ax_err.set_ylabel("error rate"), ax_err.set_title("validation error")
    ax_err.set_ylim(bottom=0)
    for ax in (ax_loss, ax_err):
        if ax.lines:
            ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def plot_alignments(
    emissions: Sequence[np.ndarray],
    paths: Sequence[Sequence[int]],
    labels: Sequence[str],
    titles: Sequence[str],
    path: str | os.PathLike,
    inputs: Sequence[np.ndarray] | None = None,
) -> str:
    """One panel per example: emissions ``(T, C)`` as a heat map (classes down, frames across)
    with the Viterbi label path drawn over it, and the input features above when given.

    Args:
        emissions: per example, ``(T_b, C)`` scores (log-probabilities for most models).
        paths: per example, the frame-level label path (length ``T_b``).
        labels: the ``C`` class names for the y axis.
        titles: one title per example (e.g. reference and hypothesis).
        inputs: optional per example ``(T_in, F)`` features.
    """
    plt = _pyplot()
    n = len(emissions)
    rows = 2 if inputs is not None else 1
    fig, axes = plt.subplots(rows * n, 1, figsize=(10, 2.4 * rows * n), squeeze=False)
    axes = axes[:, 0]
    for i in range(n):
        if inputs is not None:
            ax = axes[rows * i]
            ax.imshow(np.asarray(inputs[i]).T, aspect="auto", cmap="gray_r", interpolation="nearest")
            ax.set_title(titles[i], fontsize=9)
            ax.set_yticks([])
        ax = axes[rows * i + rows - 1]
        e = np.asarray(emissions[i], dtype=np.float32)
        ax.imshow(e.T, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest")
        p = np.asarray(paths[i])
        ax.plot(np.arange(len(p)), p, color="red", lw=1.2, marker=".", ms=3)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=6)
        ax.set_xlabel("frame", fontsize=8)
        if inputs is None:
            ax.set_title(titles[i], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)
