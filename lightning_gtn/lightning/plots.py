"""PNG figures of a run: training curves and Viterbi alignments over emissions (matplotlib, Agg)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["plot_training_curves", "plot_alignments", "class_ticks", "MAX_CLASS_TICKS"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


# equal CER and WER curves (a model that gets every word right or wrong) stay both visible:
# WER dashed with hollow markers over a thicker solid CER
_STYLES = {
    "cer": dict(lw=3.0, alpha=0.6, marker="o", ms=5),
    "wer": dict(lw=1.3, ls="--", marker="s", ms=4, mfc="none"),
}


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
        style = _STYLES.get(name.rsplit("/", 1)[-1], {})
        ax.plot(
            x,
            y,
            marker=style.get("marker", "." if len(x) < 50 else None),
            label=name,
            **{k: v for k, v in style.items() if k != "marker"},
        )
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


#: the most class names written on an alignment panel's y axis (more are unreadable)
MAX_CLASS_TICKS = 16


def class_ticks(num_classes: int, path: Sequence[int] | np.ndarray, max_ticks: int = MAX_CLASS_TICKS) -> list[int]:
    """The classes to name on the y axis: all of them when few, else the classes the path visits
    (they are what the picture is about), then evenly spaced others, at most ``max_ticks``."""
    if num_classes <= max_ticks:
        return list(range(num_classes))
    on_path = sorted({int(v) for v in path if 0 <= int(v) < num_classes})
    if len(on_path) >= max_ticks:
        keep = np.linspace(0, len(on_path) - 1, max_ticks).round().astype(int)
        return [on_path[i] for i in sorted(set(keep.tolist()))]
    rest = [
        c
        for c in np.linspace(0, num_classes - 1, max_ticks - len(on_path)).round().astype(int).tolist()
        if c not in on_path
    ]
    # spread fillers must not crowd the path's classes: keep them a few rows away
    gap = max(2, num_classes // (2 * max_ticks))
    fill = [c for c in rest if all(abs(c - q) >= gap for q in on_path)]
    return sorted(set(on_path) | set(fill))[:max_ticks]


def plot_alignments(
    emissions: Sequence[np.ndarray],
    paths: Sequence[Sequence[int]],
    labels: Sequence[str],
    titles: Sequence[str],
    path: str | os.PathLike,
    inputs: Sequence[np.ndarray] | None = None,
) -> str:
    """One panel per example: emissions ``(T, C)`` as a heat map (classes up, frames across)
    with the Viterbi label path drawn over it, and the input features above when given, stretched
    to the emissions' frame axis (an encoder with stride ``s`` maps ``s`` input columns to one
    frame), so a column of the input stands above the frames it produced. At most
    :data:`MAX_CLASS_TICKS` classes are named (see :func:`class_ticks`).

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
        e = np.asarray(emissions[i], dtype=np.float32)
        T, C = e.shape
        if len(labels) != C:
            raise ValueError(f"labels: expected one name per emission class ({C}), got {len(labels)}")
        if inputs is not None:
            ax = axes[rows * i]
            x = np.asarray(inputs[i])
            # the input's columns spread over the emissions' frames: both share the frame axis
            ax.imshow(
                x.T,
                aspect="auto",
                cmap="gray_r",
                interpolation="nearest",
                extent=(-0.5, T - 0.5, x.shape[1] - 0.5, -0.5),
            )
            ax.set_xlim(-0.5, T - 0.5)
            ax.set_title(titles[i], fontsize=9)
            ax.set_yticks([])
            ax.tick_params(axis="x", labelbottom=False)
        ax = axes[rows * i + rows - 1]
        ax.imshow(
            e.T,
            aspect="auto",
            origin="lower",
            cmap="viridis",
            interpolation="nearest",
            extent=(-0.5, T - 0.5, -0.5, C - 0.5),
        )
        ax.set_xlim(-0.5, T - 0.5)
        p = np.asarray(paths[i])
        ax.plot(np.arange(len(p)), p, color="red", lw=1.2, marker=".", ms=3)
        ticks = class_ticks(C, p)
        ax.set_yticks(ticks)
        ax.set_yticklabels([labels[c] for c in ticks], fontsize=6)
        ax.set_xlabel("frame", fontsize=8)
        if inputs is None:
            ax.set_title(titles[i], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)
