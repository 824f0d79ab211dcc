"""Callbacks: training curves and Viterbi alignment figures written into the run directory, and
the orderly end of spawned DDP processes."""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from .plots import plot_alignments, plot_training_curves

__all__ = [
    "TrainingPlots",
    "SpawnedProcessGroupCleanup",
    "FinalLastCheckpoint",
    "ResumeInRunFolder",
    "checkpoint_state_in_folder",
    "CheckpointStateError",
    "class_labels",
]


class CheckpointStateError(ValueError):
    """A callback state in a checkpoint that is not what the callback writes; the message names the
    checkpoint field."""


def _show(text: str) -> str:
    return "<sp>" if text == " " else text.replace(" ", "_")


def class_labels(vocabulary, loss=None) -> list[str]:
    """Printable name of each emission class: the vocabulary's characters, or, for a loss (a
    :class:`lightning_gtn.nn.StructuredLoss`) that declares its own ``tokens`` (the word-piece
    transducer's tokens of graphemes), each token spelled out, in class order, with the blank at
    the loss's ``blank`` id."""
    if loss is not None and loss.tokens is not None:
        names = [_show(t if isinstance(t, str) else "".join(map(str, t))) for t in loss.tokens]
        if loss.blank is not None:
            names.insert(loss.blank, "<b>")
        return names
    names = []
    for i in range(vocabulary.num_classes):
        if vocabulary.blank and i == 0:
            names.append("<b>")
        elif vocabulary.repeat_label and i == vocabulary.repeat_id:
            names.append("<rep>")
        else:
            c = vocabulary.chars[i - (1 if vocabulary.blank else 0)]
            names.append(_show(c))
    return names


class TrainingPlots(Callback):
    """Records ``train/loss`` and the validation metrics, and at the end of fitting writes
    ``curves.png`` and ``alignments.png`` (Viterbi paths over emissions of a few validation
    examples) into ``output_dir``. Its history is saved in checkpoints, so a resumed run's curves
    continue.

    Args:
        output_dir: where the PNGs go (the Hydra run directory in ``conf/callbacks``).
        num_alignments: validation examples in ``alignments.png``.
        every_n_steps: record ``train/loss`` every this many steps.
    """

    def __init__(self, output_dir: str | os.PathLike = ".", num_alignments: int = 4, every_n_steps: int = 10):
        self.output_dir = Path(output_dir)
        self.num_alignments = num_alignments
        self.every_n_steps = max(1, every_n_steps)
        self.history: dict[str, list[tuple[int, float]]] = {}

    def _add(self, name: str, step: int, value) -> None:
        self.history.setdefault(name, []).append((int(step), float(value)))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """Records the step's training loss every ``every_n_steps`` steps."""
        if trainer.global_step % self.every_n_steps == 0:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            if isinstance(loss, torch.Tensor):
                self._add("train/loss", trainer.global_step, loss.detach().float().item())

    def on_validation_end(self, trainer, pl_module) -> None:
        """Records ``val/loss``, ``val/cer`` and ``val/wer`` (not during the sanity check)."""
        if trainer.sanity_checking:
            return
        for key in ("val/loss", "val/cer", "val/wer"):
            v = trainer.callback_metrics.get(key)
            if v is not None:
                self._add(key, trainer.global_step, v)

    def state_dict(self) -> dict:
        """The recorded history, for the checkpoint."""
        return {"history": {k: list(v) for k, v in self.history.items()}}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores the history of a checkpoint, so the curves of a resumed run continue.

        Raises:
            CheckpointStateError: the history is not ``{name: [(step, value), ...]}`` (names strings, steps
                integers, values numbers), naming the checkpoint field.
        """
        history = state_dict.get("history", {}) if isinstance(state_dict, dict) else None
        where = "checkpoint field callbacks[TrainingPlots].history"
        if not isinstance(history, dict):
            raise CheckpointStateError(f"{where}: expected a mapping of metric names to (step, value) pairs")
        out: dict[str, list[tuple[int, float]]] = {}
        for name, points in history.items():
            if not isinstance(name, str) or not isinstance(points, (list, tuple)):
                raise CheckpointStateError(f"{where}: expected a list of (step, value) pairs under {name!r}")
            out[name] = []
            for x in points:
                if (
                    not isinstance(x, (list, tuple))
                    or len(x) != 2
                    or isinstance(x[0], bool)
                    or not isinstance(x[0], int)
                    or isinstance(x[1], bool)
                    or not isinstance(x[1], (int, float))
                ):
                    raise CheckpointStateError(f"{where}[{name!r}]: expected (step, value) pairs of numbers, got {x!r}")
                out[name].append((int(x[0]), float(x[1])))
        self.history = out

    def on_fit_end(self, trainer: L.Trainer, pl_module) -> None:
        """Writes ``curves.png`` and ``alignments.png`` into ``output_dir`` (global rank 0 only)."""
        if not trainer.is_global_zero:
            return
        # the figures are a by-product: one that cannot be drawn is a warning, never a failed run
        # (which would lose the run's metrics.json)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._draw(self.output_dir / "curves.png", plot_training_curves, self.history, self.output_dir / "curves.png")
        datamodule = getattr(trainer, "datamodule", None)  # set by Lightning, not declared on Trainer
        # a transducer has no frame paths to draw (its alignments: lightning_gtn.align)
        if self.num_alignments > 0 and datamodule is not None and not getattr(pl_module, "reads_network", False):
            path = self.output_dir / "alignments.png"
            n = self.num_alignments
            self._draw(path, lambda: write_alignments(pl_module, datamodule.val_dataloader(), path, n))

    @staticmethod
    def _draw(path: Path, plot, *args) -> None:
        import warnings

        try:
            plot(*args)
        except Exception as e:
            msg = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            warnings.warn(f"{path} not written: {msg}", stacklevel=3)


@torch.no_grad()
def write_alignments(pl_module, dataloader, path, num: int = 4) -> str:
    """Runs ``pl_module`` on the first ``num`` examples of ``dataloader`` and plots their
    emissions with the Viterbi paths."""
    was_training = pl_module.training
    pl_module.eval()
    try:
        batch = next(iter(dataloader))
        inputs = batch["inputs"][:num].to(pl_module.device)
        lengths = batch["input_lengths"][:num].to(pl_module.device)
        emissions, out_lengths = pl_module.emissions(inputs, lengths)
        paths = pl_module.viterbi_paths(emissions, out_lengths)
        vocab = pl_module.vocabulary
        preds = [vocab.decode_path(p) for p in paths]
        ems = [emissions[b, : int(out_lengths[b])].float().cpu().numpy() for b in range(len(paths))]
        feats = [inputs[b, : int(lengths[b])].float().cpu().numpy() for b in range(len(paths))]
        titles = [f"ref {t!r}   hyp {p!r}" for t, p in zip(batch["texts"][:num], preds)]
        labels = class_labels(vocab, pl_module.structured_loss)
        return plot_alignments(ems, paths, labels, titles, path, inputs=feats)
    finally:
        pl_module.train(was_training)


class FinalLastCheckpoint(Callback):
    """Writes every ``last.ckpt`` of the run's checkpoint callbacks once more when training ends,
    so that it holds the final weights and step.

    Lightning's ``ModelCheckpoint`` refreshes ``last.ckpt`` after a validation only when that
    validation also saved a top-k checkpoint (its metric improved), and at the end of training only
    when it never wrote one. A run whose last validations did not improve therefore ended with the
    ``last.ckpt`` of the latest step checkpoint: weights up to ``every_n_train_steps - 1`` steps
    old, which ``lightning-gtn-evaluate`` would score and a resumed run would train again. Put it
    after the checkpoint callbacks; every rank calls it (the save is collective).
    """

    def on_train_end(self, trainer: "L.Trainer", pl_module: "L.LightningModule") -> None:
        """Saves ``<dirpath>/last.ckpt`` for each checkpoint callback with ``save_last``."""
        from lightning.pytorch.callbacks import ModelCheckpoint

        if getattr(trainer, "fast_dev_run", False):
            return
        paths = {
            os.path.join(cb.dirpath, cb.CHECKPOINT_NAME_LAST + cb.FILE_EXTENSION)
            for cb in trainer.checkpoint_callbacks
            if isinstance(cb, ModelCheckpoint) and cb.save_last and cb.dirpath
        }
        for path in sorted(paths):
            trainer.save_checkpoint(path, weights_only=False)  # the whole state: a resume continues from it


def _file_in_folder(path, folder: str, extension: str) -> str:
    """``<folder>/<file name of path>`` when that names an existing ``extension`` file that resolves
    inside ``folder``; otherwise ``""``. Only the file name of ``path`` is read."""
    if not isinstance(path, str) or not path:
        return ""
    name = os.path.basename(path)
    if name in ("", ".", "..") or not name.endswith(extension):
        return ""
    candidate = os.path.join(folder, name)
    try:
        real = Path(candidate).resolve(strict=True)
        root = Path(folder).resolve(strict=True)
    except (OSError, RuntimeError):
        return ""
    return candidate if root in real.parents and real.is_file() else ""


def _score(v):
    """A checkpoint's score as a tensor, or None when it is not a number."""
    if isinstance(v, torch.Tensor) and v.numel() == 1 and v.is_floating_point():
        return v.detach().float().reshape(())
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return torch.tensor(float(v))
    return None


def checkpoint_state_in_folder(callback, state) -> dict:
    """A checkpoint's ``ModelCheckpoint`` state, rebuilt for ``callback`` from its own folder.

    The checkpoint is data, so no path in it is used: of its top-k scores, best and last
    checkpoints only the file names are read, rebuilt as ``<callback.dirpath>/<name>`` and kept
    when that is an existing checkpoint file that resolves inside ``callback.dirpath``; the rest
    is dropped (a resumed run then starts its top-k afresh). Lightning deletes the "previous"
    top-k and last checkpoints as a run goes on, so a path taken from the file as it stands could
    name any file (``<dirpath>/../../x``).

    Args:
        callback: the run's ``ModelCheckpoint`` (its ``dirpath``, ``mode`` and initial values).
        state: the checkpoint's state of that callback (any object: it is data).

    Returns:
        the state to hand to ``callback.load_state_dict``.
    """
    folder = str(callback.dirpath or "")
    ext = callback.FILE_EXTENSION
    state = state if isinstance(state, dict) else {}
    kept: dict[str, torch.Tensor] = {}
    top_k = state.get("best_k_models")
    for path, score in top_k.items() if isinstance(top_k, dict) else ():
        rebuilt, s = _file_in_folder(path, folder, ext), _score(score)
        if rebuilt and s is not None:
            kept[rebuilt] = s
    out: dict = {
        "monitor": callback.monitor,
        "dirpath": callback.dirpath,  # Lightning restores the state only for its own dirpath
        "best_k_models": kept,
        "current_score": _score(state.get("current_score")),
        "last_model_path": _file_in_folder(state.get("last_model_path"), folder, ext),
    }
    if kept:
        pick_best, pick_kth = (min, max) if callback.mode == "min" else (max, min)
        best = pick_best(kept, key=lambda p: float(kept[p]))
        kth = pick_kth(kept, key=lambda p: float(kept[p]))
        out.update(best_model_path=best, best_model_score=kept[best], kth_best_model_path=kth, kth_value=kept[kth])
    else:
        best = _file_in_folder(state.get("best_model_path"), folder, ext)
        out.update(
            best_model_path=best,
            best_model_score=_score(state.get("best_model_score")) if best else None,
            kth_best_model_path="",
            kth_value=callback.kth_value,
        )
    return out


class ResumeInRunFolder(Callback):
    """Makes what a resumed checkpoint restores into the run's checkpoint callbacks name only files
    of their own folders (see :func:`checkpoint_state_in_folder`).

    ``lightning-gtn-train`` adds it to every run; add it to your own ``Trainer``'s callbacks when
    you resume checkpoints you did not write. It rewrites the loaded checkpoint's states of the
    ``ModelCheckpoint`` callbacks in ``on_load_checkpoint``, which Lightning calls for every
    callback before it hands any callback its state.
    """

    def on_load_checkpoint(self, trainer: "L.Trainer", pl_module: "L.LightningModule", checkpoint: dict) -> None:
        """Replaces each ``ModelCheckpoint`` state of ``checkpoint`` by its rebuilt form."""
        from lightning.pytorch.callbacks import ModelCheckpoint

        states = checkpoint.get("callbacks")
        if not isinstance(states, dict):
            checkpoint["callbacks"] = {}
            return
        for cb in trainer.callbacks:  # type: ignore[attr-defined]  # a list, set by Lightning
            if not isinstance(cb, ModelCheckpoint):
                continue
            for key in (cb.state_key, cb._legacy_state_key):
                if key in states:
                    states[key] = checkpoint_state_in_folder(cb, states[key])


class SpawnedProcessGroupCleanup(Callback):
    """Destroys the process group at the end of each spawned DDP process (``ddp_spawn``).

    A spawned rank that returns with its gloo process group still alive leaves the group's
    native threads (``gloo_tcp_loop``, ``pt_gloo_runloop``, rank 0's ``pt_tcpstore_uv``, all
    still running at exit) to the interpreter's shutdown, where they can be torn down in the
    wrong order: the process then aborts ("terminate called without an active exception")
    although training finished. Destroying the group in ``teardown`` shuts them down first. Only the
    spawn launcher is touched: with ``strategy=ddp`` rank 0 is the launching process itself,
    which may go on (``trainer.test``) with the same group.
    """

    def teardown(self, trainer: "L.Trainer", pl_module: "L.LightningModule", stage: str) -> None:
        """Destroys the default process group when this process is a ``ddp_spawn`` rank."""
        from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

        launcher = getattr(trainer.strategy, "launcher", None)
        if not isinstance(launcher, _MultiProcessingLauncher):
            return
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
