"""Data: the embedded handwritten-digit-line task and a data module for your own features.

Batches are dicts::

    {"inputs": (B, T, F) float32, padded with zeros,
     "input_lengths": (B,) int64,
     "texts": list of B transcripts (str)}

Targets are encoded from ``texts`` by the model's :class:`~lightning_gtn.lightning.Vocabulary`
inside the step, so a data module does not depend on the loss (blank or repeat conventions).
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..files import npy_data, npy_header, open_regular, text_lines
from .vocabulary import MAX_TRANSCRIPT_CHARS, check_transcript

__all__ = [
    "SequenceDataset",
    "collate_sequences",
    "make_digit_lines",
    "DigitLinesDataModule",
    "FeatureDataModule",
    "read_transcripts",
    "drop_labels",
]

DIGIT_CHARS = "0123456789 "


class SequenceDataset(Dataset):
    """A list of feature arrays ``(T_i, F)`` and their transcripts."""

    def __init__(self, features: Sequence[np.ndarray], texts: Sequence[str]):
        if len(features) != len(texts):
            raise ValueError(f"{len(features)} feature arrays but {len(texts)} transcripts")
        self.features = [np.asarray(f, dtype=np.float32) for f in features]
        self.texts = list(texts)
        for i, f in enumerate(self.features):
            if f.ndim != 2:
                raise ValueError(f"features[{i}] must be (T, F), got shape {f.shape}")

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, i: int):
        return self.features[i], self.texts[i]


def collate_sequences(items) -> dict:
    """Pads a list of ``(features (T_i, F), text)`` into a batch dict (see module docstring)."""
    feats = [torch.from_numpy(np.ascontiguousarray(f)) for f, _ in items]
    lengths = torch.tensor([f.shape[0] for f in feats], dtype=torch.long)
    inputs = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
    return {"inputs": inputs, "input_lengths": lengths, "texts": [t for _, t in items]}


# ----------------------------------------------------------------------------------------------
# The embedded task: lines of handwritten digits from scikit-learn's 8x8 digit images.


def _digit_images() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images / 16.0).astype(np.float32), d.target.astype(np.int64)


def split_digit_images(seed: int = 0, fractions=(0.6, 0.2, 0.2)):
    """Splits the 1797 source images into disjoint index sets (train, val, test)."""
    _, labels = _digit_images()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    n_train = int(round(fractions[0] * len(order)))
    n_val = int(round(fractions[1] * len(order)))
    return order[:n_train], order[n_train : n_train + n_val], order[n_train + n_val :]


def make_digit_lines(
    images: np.ndarray,
    labels: np.ndarray,
    num_lines: int,
    seed: int,
    min_len: int = 3,
    max_len: int = 8,
    max_gap: int = 2,
    space_prob: float = 0.15,
    space_width: tuple[int, int] = (6, 9),
    noise: float = 0.05,
    augment: bool = False,
    return_sources: bool = False,
):
    """Composes lines of digits, each a feature array ``(T, 8)`` (one frame per pixel column).

    Each line is a random digit string of ``min_len..max_len`` digits drawn from ``images``
    (``(N, 8, 8)`` in [0, 1]) with ``labels`` ``(N,)``; digits are separated by 0..``max_gap``
    blank columns or, with probability ``space_prob``, by a word space of ``space_width`` columns
    (transcribed as ``" "``). Intensity is scaled by a random factor in [0.7, 1.2] per digit and
    Gaussian noise of std ``noise`` is added. With ``augment``, each digit is also stretched to
    a random width of 6 to 10 columns and shifted up or down by up to one pixel. Deterministic in
    ``seed``.

    Returns:
        features: list of float32 arrays ``(T_i, 8)``; texts: list of transcripts; with
        ``return_sources``, also per line the indices into ``images`` it was drawn from.
    """
    rng = np.random.default_rng(seed)
    by_label = [np.flatnonzero(labels == d) for d in range(10)]
    feats, texts, sources = [], [], []
    for _ in range(num_lines):
        n = int(rng.integers(min_len, max_len + 1))
        digits = rng.integers(0, 10, size=n)
        cols, text, src = [np.zeros((int(rng.integers(1, 4)), 8), np.float32)], [], []
        for k, d in enumerate(digits):
            if k > 0:
                if rng.random() < space_prob:
                    gap = int(rng.integers(space_width[0], space_width[1] + 1))
                    text.append(" ")
                else:
                    gap = int(rng.integers(0, max_gap + 1))
                if gap:
                    cols.append(np.zeros((gap, 8), np.float32))
            k_img = int(by_label[d][rng.integers(len(by_label[d]))])
            src.append(k_img)
            img = images[k_img].T  # (8 columns, 8 rows)
            if augment:
                img = _augment(img, rng)
            cols.append(img * rng.uniform(0.7, 1.2))
            text.append(str(int(d)))
        cols.append(np.zeros((int(rng.integers(1, 4)), 8), np.float32))
        x = np.concatenate(cols, axis=0)
        x = x + noise * rng.standard_normal(x.shape).astype(np.float32)
        feats.append(np.clip(x, -0.5, 1.5).astype(np.float32))
        texts.append("".join(text))
        sources.append(src)
    if return_sources:
        return feats, texts, sources
    return feats, texts


def _augment(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random width (6..10 columns, linear interpolation) and vertical shift (-1..1) of a digit
    given as ``(columns, rows)``."""
    width = int(rng.integers(6, 11))
    pos = np.linspace(0, img.shape[0] - 1, width)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, img.shape[0] - 1)
    frac = (pos - lo)[:, None]
    out = (1 - frac) * img[lo] + frac * img[hi]
    shift = int(rng.integers(-1, 2))
    if shift:
        out = np.roll(out, shift, axis=1)
        out[:, 0 if shift > 0 else -1] = 0.0
    return out.astype(np.float32)


def drop_labels(texts: Sequence[str], fraction: float, seed: int) -> list[str]:
    """Removes each character of each text with probability ``fraction`` (deterministic in
    ``seed``): partially labelled transcripts, the setting of Star Temporal Classification."""
    if not 0.0 <= float(fraction) < 1.0:
        raise ValueError(f"data.label_drop: must be in [0, 1), got {fraction!r}")
    if fraction == 0:
        return list(texts)
    rng = np.random.default_rng(seed)
    out = []
    for t in texts:
        keep = rng.random(len(t)) >= fraction
        out.append("".join(c for c, k in zip(t, keep) if k))
    return out


class _BaseDataModule(L.LightningDataModule):
    # the splits, built by ``setup`` (None before it)
    train_set: SequenceDataset
    val_set: SequenceDataset
    test_set: SequenceDataset

    def __init__(
        self, batch_size: int = 32, num_workers: int = 0, eval_batch_size: int | None = None, label_drop: float = 0.0
    ):
        super().__init__()
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        drop_labels([], label_drop, 0)  # checks the value at construction
        self.label_drop = float(label_drop)
        self.train_set = self.val_set = self.test_set = None  # type: ignore[assignment]  # until setup()

    def _drop_train_labels(self, seed: int) -> None:
        """Applies ``label_drop`` to the training transcripts (validation and test keep theirs)."""
        if self.label_drop > 0:
            self.train_set.texts = drop_labels(self.train_set.texts, self.label_drop, seed)

    def _loader(self, dataset, shuffle: bool, batch_size: int) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            collate_fn=collate_sequences,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self):
        return self._loader(self.train_set, True, self.batch_size)

    def val_dataloader(self):
        return self._loader(self.val_set, False, self.eval_batch_size)

    def test_dataloader(self):
        return self._loader(self.test_set, False, self.eval_batch_size)

    def predict_dataloader(self):
        return self.test_dataloader()


class DigitLinesDataModule(_BaseDataModule):
    """The embedded default task: lines of handwritten digits (no download).

    Source digit images (scikit-learn's ``load_digits``) are split 60/20/20 into disjoint sets for
    train, val and test, so validation lines never reuse a training image. Everything is generated
    from ``seed``. Frames are pixel columns: ``F = 8`` features, ``T`` about 9 per digit.

    Args:
        num_train, num_val, num_test: number of lines per split.
        batch_size, eval_batch_size, num_workers: DataLoader settings.
        seed: the seed of the image split and of the line generator.
        min_len, max_len, max_gap, space_prob, noise: see :func:`make_digit_lines`.
        augment_train: stretch and shift the training digits (never validation or test).
        label_drop: drop this fraction of the training transcripts' characters (partial labels,
            the STC setting: ``loss=stc data.label_drop=0.3``); validation and test keep theirs.
    """

    chars = DIGIT_CHARS
    feature_dim = 8

    def __init__(
        self,
        num_train: int = 8000,
        num_val: int = 500,
        num_test: int = 500,
        batch_size: int = 32,
        eval_batch_size: int | None = 100,
        num_workers: int = 0,
        seed: int = 0,
        min_len: int = 3,
        max_len: int = 8,
        max_gap: int = 2,
        space_prob: float = 0.15,
        noise: float = 0.05,
        augment_train: bool = False,
        label_drop: float = 0.0,
    ):
        super().__init__(batch_size, num_workers, eval_batch_size, label_drop)
        self.save_hyperparameters()
        self.line_args: dict[str, Any] = dict(
            min_len=min_len, max_len=max_len, max_gap=max_gap, space_prob=space_prob, noise=noise
        )
        self.augment_train = augment_train
        self.sizes = (num_train, num_val, num_test)
        self.seed = seed

    def setup(self, stage: str | None = None) -> None:
        """Builds the train, validation and test sets (once; later calls keep them)."""
        if self.train_set is not None:
            return
        images, labels = _digit_images()
        splits = split_digit_images(self.seed)
        sets = []
        #: per split, the indices (into load_digits()) of the source images its lines use
        self.source_images = {}
        for k, (name, idx, n) in enumerate(zip(("train", "val", "test"), splits, self.sizes)):
            feats, texts, src = make_digit_lines(
                images[idx],
                labels[idx],
                n,
                seed=self.seed * 1000 + k + 1,
                return_sources=True,
                augment=self.augment_train and name == "train",
                **self.line_args,
            )
            self.source_images[name] = np.unique(idx[np.concatenate(src)]) if n else idx[:0]
            sets.append(SequenceDataset(feats, texts))
        self.train_set, self.val_set, self.test_set = sets
        self._drop_train_labels(self.seed)


def read_transcripts(path: str | os.PathLike) -> dict[str, str]:
    """Reads a transcript file: one ``<id> <text>`` per line (split at the first whitespace).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file has no transcript, an id appears twice (naming the id, the file
            and both line numbers), or a line is not UTF-8, too long, or holds a transcript that
            :func:`~lightning_gtn.lightning.vocabulary.check_transcript` refuses (naming the line).
    """
    out: dict[str, str] = {}
    first_line: dict[str, int] = {}
    if not Path(path).is_file():
        raise FileNotFoundError(f"data transcripts file not found: {path}")
    limit = MAX_TRANSCRIPT_CHARS + 1024  # the id, the separator and the line end
    with open_regular(path, "data transcripts file", "r", encoding="utf-8") as f:
        for n, line in text_lines(f, path, limit):
            parts = line.split(maxsplit=1)
            if len(parts) > 1:
                check_transcript(parts[1], f"{path}:{n}: utterance {parts[0]!r}")
            if parts[0] in out:
                raise ValueError(
                    f"{path}:{n}: duplicate utterance id {parts[0]!r} (first on line "
                    f"{first_line[parts[0]]}); ids must be unique"
                )
            first_line[parts[0]] = n
            out[parts[0]] = parts[1] if len(parts) > 1 else ""
    if not out:
        raise ValueError(f"{path}: no transcripts (the file is empty); expected '<id> <text>' lines")
    return out


#: the most values (frames x features, all utterances of a split) a feature file may declare
MAX_FEATURE_VALUES = 1 << 28
#: the most features per frame
MAX_FEATURES = 1 << 16
#: the most transcript characters per frame of an utterance's array (and 16 for any utterance):
#: the targets stay in proportion to the frames (a transducer's joiner holds frames x characters)
MAX_CHARS_PER_FRAME = 4


def _load_split(features: str | os.PathLike, transcripts: str | os.PathLike) -> SequenceDataset:
    """The utterances of an ``.npz`` file, each member's header checked (a real ``(T, F)`` array,
    F the same for all, the split within :data:`MAX_FEATURE_VALUES`) before its data is read, and
    only its declared bytes decompressed."""
    feats_path = Path(features)
    if not feats_path.exists():
        raise FileNotFoundError(f"data features file not found: {feats_path}")
    texts = read_transcripts(transcripts)
    f = open_regular(feats_path, "data features file")
    try:
        archive = zipfile.ZipFile(f)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        f.close()
        raise ValueError(f"{feats_path}: not an .npz archive (np.savez's format): {e}") from None
    with f, archive:
        members = {n[: -len(".npy")] for n in archive.namelist() if n.endswith(".npy")}
        missing = [k for k in texts if k not in members]
        if missing:
            raise ValueError(f"{len(missing)} transcript ids have no array in {feats_path}, e.g. {missing[:3]}")
        ids = list(texts)
        feats: list[np.ndarray] = []
        total = 0
        for k in ids:
            what = f"{feats_path}: utterance {k!r}"
            try:
                member = archive.open(k + ".npy")
            except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError) as e:
                raise ValueError(f"{what}: cannot read its array: {e}") from None
            with member:
                shape, fortran, dtype = npy_header(member, what)
                if len(shape) != 2 or dtype.kind not in "fiu":
                    raise ValueError(
                        f"{what} must be a real array of shape (T, F), got shape {shape} and dtype {dtype}"
                    )
                if feats and shape[1] != feats[0].shape[1]:
                    raise ValueError(
                        f"{feats_path}: utterance {k!r} has {shape[1]} features per frame but "
                        f"{ids[0]!r} has {feats[0].shape[1]}; every utterance needs the same F "
                        f"(shape (T, F))"
                    )
                if len(texts[k]) > MAX_CHARS_PER_FRAME * max(shape[0], 4):
                    raise ValueError(
                        f"{what}: a transcript of {len(texts[k])} characters for {shape[0]} frames (at most "
                        f"{MAX_CHARS_PER_FRAME} a frame): the transcript does not belong to these features"
                    )
                total += shape[0] * shape[1]
                if shape[1] > MAX_FEATURES or total > MAX_FEATURE_VALUES:
                    raise ValueError(
                        f"{what}: shape {shape}: at most {MAX_FEATURES} features per frame and "
                        f"{MAX_FEATURE_VALUES} values in a split"
                    )
                try:
                    a = npy_data(member, shape, fortran, dtype, what)
                except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as e:
                    raise ValueError(f"{what}: cannot read its array: {e}") from None
            if a.dtype.kind == "f" and not np.isfinite(a).all():
                raise ValueError(f"{what}: NaN or infinite features")
            feats.append(a)
    return SequenceDataset(feats, [texts[k] for k in ids])


def _check_dim(ds: SequenceDataset, dim: int, split: str, path) -> None:
    if ds.features and int(ds.features[0].shape[1]) != dim:
        raise ValueError(
            f"data.{split}_features: {path} has {ds.features[0].shape[1]} features per frame but "
            f"the training split has {dim}"
        )


class FeatureDataModule(_BaseDataModule):
    """Your own data: feature arrays in ``.npz`` files plus transcript files.

    Each split is a pair: an ``.npz`` file holding one float array ``(T_i, F)`` per utterance,
    keyed by utterance id (``np.savez(path, **{id: array})``), and a text file with one
    ``<id> <transcript>`` line per utterance. The character set is given as ``chars`` or collected
    from the training transcripts (sorted).

    Args:
        train_features, train_transcripts, val_features, val_transcripts: paths.
        test_features, test_transcripts: optional; default to the validation split.
        chars: the characters of the vocabulary (a string), or ``None`` to collect them.
    """

    def __init__(
        self,
        train_features: str,
        train_transcripts: str,
        val_features: str,
        val_transcripts: str,
        test_features: str | None = None,
        test_transcripts: str | None = None,
        chars: str | None = None,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
    ):
        super().__init__(batch_size, num_workers, eval_batch_size)
        self.paths = dict(
            train=(train_features, train_transcripts),
            val=(val_features, val_transcripts),
            test=(test_features or val_features, test_transcripts or val_transcripts),
        )
        self.train_set = _load_split(*self.paths["train"])
        self.feature_dim = int(self.train_set.features[0].shape[1])
        if chars is None:
            chars = "".join(sorted(set("".join(self.train_set.texts))))
        self._chars = chars
        # saved after collecting the characters: loggers merge these hyper-parameters with the
        # model's, which hold the same chars (a null here made every logged run fail)
        self.save_hyperparameters()

    @property
    def chars(self) -> str:
        """The characters of the training transcripts, sorted (computed on first use)."""
        if self._chars is None:
            self._chars = "".join(sorted(set("".join(self.train_set.texts))))
        return self._chars

    def setup(self, stage: str | None = None) -> None:
        """Loads the validation and test splits (once) and checks their feature dimension."""
        if self.val_set is None:
            self.val_set = _load_split(*self.paths["val"])
            _check_dim(self.val_set, self.feature_dim, "val", self.paths["val"][0])
            self.test_set = _load_split(*self.paths["test"])
            _check_dim(self.test_set, self.feature_dim, "test", self.paths["test"][0])
