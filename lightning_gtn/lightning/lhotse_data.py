"""Speech data through Lhotse: manifests, duration bucketing, on-the-fly filterbanks.

:class:`LhotseDataModule` reads Lhotse ``CutSet`` manifests (``.jsonl`` / ``.jsonl.gz``, read
lazily: one cut at a time) and yields the batch dict of every data module of this package::

    {"inputs": (B, T, F) float32, padded with zeros,
     "input_lengths": (B,) int64,
     "texts": list of B transcripts (str),
     "ids": list of B cut ids (str)}

How a batch is made:

* batches are drawn by Lhotse's ``DynamicBucketingSampler``: cuts of similar duration are grouped
  into buckets and a batch holds at most ``max_duration`` seconds of audio. The sampler is
  deterministic in ``(seed, epoch)`` (bucket choice included: ``sync_buckets=False``), and shards
  the epoch between DDP ranks (world size and rank are read from ``torch.distributed`` when the
  dataloader is made). Dataloader workers share one rank's batches round-robin, so the order of
  batches does not depend on ``num_workers``.
* features: log-mel filterbanks computed in the dataloader workers by Lhotse's torch ``Fbank``
  (``features="fbank"``, no torchaudio), or the cuts' own precomputed features
  (``features="precomputed"``).
* optional SpecAugment (Lhotse's ``SpecAugment`` transform, training only) and frame stacking
  (``stack_frames=k``: k consecutive frames become one of ``k * F`` features).

Resuming: :meth:`LhotseDataModule.state_dict` (saved by Lightning in every checkpoint) holds the
epoch and the number of training batches consumed in it; a run resumed from a mid-epoch checkpoint
skips exactly those batches of the same deterministic epoch (the skipped batches are only sampled,
never loaded), so it sees the batches an uninterrupted run would have seen.

Safety: a manifest is data from outside. Every line is bounded in length and parsed into a cut
(errors name the file and line); a cut is checked before any audio is read: a single-channel
``MonoCut``, finite positive duration within ``max_cut_duration`` (longer cuts are skipped with a
warning, counted per split), the expected sampling rate, audio sources that are local files or
bytes in the manifest (never URLs or shell commands), a file header (read with soundfile) that
agrees with the manifest, and a non-empty, printable transcript within
:data:`~lightning_gtn.lightning.vocabulary.MAX_TRANSCRIPT_CHARS` and :data:`MAX_CHARS_PER_SECOND`.
Precomputed features are read here, not by Lhotse's readers: only numpy arrays (``numpy_files``
in a local folder, ``memory_npy``), from a regular file, the ``.npy`` header checked (float,
``(T, F)``, ``T`` within ``max_cut_duration``) before any data is read.
Errors name the manifest, the cut and the audio or feature file.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import math
import os
import types
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..files import npy_data, npy_header, open_regular
from .vocabulary import MAX_TRANSCRIPT_CHARS, check_transcript

__all__ = [
    "LhotseDataModule",
    "LhotseSplit",
    "CutBatchLoader",
    "read_cuts",
    "check_cut",
    "MAX_MANIFEST_LINE",
    "MAX_BLANK_LINES",
    "MAX_RESAMPLE_PHASES",
    "check_resample",
    "MAX_CHANNELS",
    "MAX_CHARS_PER_SECOND",
    "check_feature_settings",
    "MAX_SETTINGS_FEATURES",
]

#: the longest manifest line (characters) read; a longer one is an error (a cut is ~1 kB)
MAX_MANIFEST_LINE = 1 << 20
#: the largest reduced rate (``rate / gcd``, either side) of a resampling: the filter grows with
#: the product of the two, so rates with few common factors (8009 Hz to 16 kHz) would allocate
#: gigabytes; 8, 11.025, 22.05, 44.1, 48 and 96 kHz to 16 kHz reduce to at most 441 and 640
MAX_RESAMPLE_PHASES = 1000
#: the sampling rates read (Hz)
MIN_RATE, MAX_RATE = 1000, 384000
#: the most blank lines a manifest may hold
MAX_BLANK_LINES = 1 << 16
#: the most channels a recording may declare
MAX_CHANNELS = 64
#: the most transcript characters a cut may hold per second of audio (the filterbanks' frame rate:
#: no alignment puts more than one character on a 10 ms frame; speech is about 15); with the
#: length bound of every transcript (:data:`~lightning_gtn.lightning.vocabulary.MAX_TRANSCRIPT_CHARS`)
#: it bounds the targets, so a transducer's joiner, of ``frames x characters``, stays in proportion
#: (a cut under a second may hold as many characters as one of a second)
MAX_CHARS_PER_SECOND = 100
#: audio source types read: local files and bytes held in the manifest (never "url" or "command")
_SOURCE_TYPES = ("file", "memory")
#: precomputed feature storages read: ``.npy`` files in a local folder (what ``feature_cache`` writes)
#: and ``.npy`` bytes held by the cut; read here, header first, never by Lhotse's readers (which
#: run ``pipe:`` paths as shell commands and load a whole array before its shape is known) nor by
#: the native decoders of compressed or HDF5 storages
_FEATURE_STORAGES = ("numpy_files", "memory_npy")
#: the longest ``.npy`` header read (numpy's own default bound)
_NPY_HEADER_MAX = 10_000
#: tolerance (seconds) between a manifest's durations and the audio file's
_SLACK = 0.05


def _lhotse():
    try:
        import lhotse
    except ImportError as e:  # pragma: no cover - the [speech] extra is missing
        raise ImportError(
            "data=lhotse needs Lhotse: pip install 'lightning_gtn[speech]' (or `make`, which installs it)"
        ) from e
    return lhotse


# ----------------------------------------------------------------------------------------------
# Reading manifests


class _ManifestLines:
    """A lazy, re-iterable source of cuts from a ``.jsonl`` / ``.jsonl.gz`` manifest: each pass
    reads the file again, one bounded line at a time; errors name the file and the line."""

    def __init__(self, path: str):
        self.path = path

    def __repr__(self) -> str:
        return f"_ManifestLines({self.path!r})"

    def __iter__(self) -> Iterator[Any]:
        from lhotse.cut.set import deserialize_cut

        path = self.path
        opener: Callable[..., Any] = gzip.open if path.endswith(".gz") else open
        n = blank = 0
        try:
            with opener(path, "rt", encoding="utf-8") as f:
                while True:
                    line = f.readline(MAX_MANIFEST_LINE + 1)
                    if not line:
                        return
                    n += 1
                    if len(line) > MAX_MANIFEST_LINE:
                        raise ValueError(f"{path}:{n}: line longer than {MAX_MANIFEST_LINE} characters")
                    if not line.strip():
                        blank += 1
                        if blank > MAX_BLANK_LINES:  # a small .gz inflates to billions of them
                            raise ValueError(f"{path}:{n}: more than {MAX_BLANK_LINES} blank lines")
                        continue
                    try:
                        d = json.loads(line)
                    except ValueError as e:
                        raise ValueError(f"{path}:{n}: not JSON ({e})") from None
                    except RecursionError:
                        raise ValueError(f"{path}:{n}: JSON nested too deeply") from None
                    if not isinstance(d, dict):
                        raise ValueError(f"{path}:{n}: expected a JSON object (a Lhotse cut), got {type(d).__name__}")
                    if "type" not in d:
                        kind = (
                            "a recording (RecordingSet manifest)"
                            if "sources" in d
                            else "a supervision (SupervisionSet manifest)"
                            if "recording_id" in d
                            else "not a cut"
                        )
                        raise ValueError(
                            f"{path}:{n}: {kind}; data.*_cuts must be CutSet manifests: build one with "
                            "lhotse.CutSet.from_manifests(recordings=..., supervisions=...)"
                            ".trim_to_supervisions().to_file('cuts.jsonl.gz')"
                        )
                    try:
                        cut = deserialize_cut(d)
                    except Exception as e:
                        raise ValueError(f"{path}:{n}: not a valid Lhotse cut ({type(e).__name__}: {e})") from None
                    yield cut
        except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
            where = f"{path}:{n + 1}" if n else path
            raise ValueError(f"{where}: cannot read the manifest ({type(e).__name__}: {e})") from None


def read_cuts(path_or_cutset, what: str):
    """A lazy ``CutSet`` from a manifest path (``.jsonl`` or ``.jsonl.gz``), or ``path_or_cutset``
    itself when it already is a ``CutSet``.

    The file is opened and its first cut parsed here, so a missing, unreadable or wrong file fails
    at once; later lines are parsed (and checked) as they are read.

    Args:
        path_or_cutset: a path (str or ``os.PathLike``) or a ``lhotse.CutSet``.
        what: the config key, for messages (``"data.train_cuts"``).

    Raises:
        FileNotFoundError: no such file (naming ``what`` and the path).
        ValueError: not a ``.jsonl``/``.jsonl.gz`` manifest, empty, corrupt or not a CutSet
            (naming the file and the line).
    """
    lhotse = _lhotse()
    if isinstance(path_or_cutset, lhotse.CutSet):
        return path_or_cutset
    if not isinstance(path_or_cutset, (str, os.PathLike)):
        raise TypeError(f"{what}: expected a manifest path or a lhotse.CutSet, got {type(path_or_cutset).__name__}")
    path = str(path_or_cutset)
    if not (path.endswith(".jsonl") or path.endswith(".jsonl.gz")):
        raise ValueError(f"{what}: {path} is not a Lhotse JSONL manifest (expected a .jsonl or .jsonl.gz file)")
    if not Path(path).is_file():
        raise FileNotFoundError(f"{what}: manifest not found: {path}")
    lines = _ManifestLines(path)
    try:
        next(iter(lines))
    except StopIteration:
        raise ValueError(f"{what}: {path} holds no cuts (empty manifest)") from None
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    return lhotse.CutSet(lines)


def _describe(cut, what: str) -> str:
    return f"{what}: cut {getattr(cut, 'id', '?')!r}"


def _audio_source(cut, what: str):
    """The recording source holding the cut's channel (checked: local file or bytes)."""
    rec = cut.recording
    for src in rec.sources:
        if src.type not in _SOURCE_TYPES:
            raise ValueError(
                f"{_describe(cut, what)}: audio source type {src.type!r} is not read (only {list(_SOURCE_TYPES)}: "
                "local files or bytes in the manifest, never URLs or commands)"
            )
    for src in rec.sources:
        if cut.channel in src.channels:
            return src
    raise ValueError(f"{_describe(cut, what)}: channel {cut.channel} is in none of the recording's sources")


def _inside(path, roots: tuple[Path, ...] | None, cut, what: str, kind: str) -> None:
    """Refuses a file of the cut that resolves (symlinks followed) outside every folder of
    ``roots`` (None: any place)."""
    if roots is None:
        return
    real = Path(path).resolve()
    if not any(real.is_relative_to(r) for r in roots):
        where = ", ".join(str(r) for r in roots)
        raise ValueError(
            f"{_describe(cut, what)}: {kind} {path} resolves to {real}, outside {where}; a manifest's files are "
            "read inside its folder: name the folders that hold them (data.audio_dirs=[...]) or set "
            "data.allow_outside_paths=true"
        )


def _check_metadata(
    cut,
    what: str,
    *,
    sampling_rate: int | None,
    needs_audio: bool,
    needs_features: bool,
    roots: tuple[Path, ...] | None = None,
) -> None:
    """Checks a cut from its manifest fields alone (no file is read; ``roots``: the folders its
    files must resolve into, None: anywhere)."""
    from lhotse import MonoCut

    if not isinstance(cut, MonoCut):
        raise ValueError(f"{_describe(cut, what)}: only single-channel MonoCut cuts are read, got {type(cut).__name__}")
    d, start = cut.duration, cut.start
    if not (isinstance(d, (int, float)) and math.isfinite(d) and d > 0):
        raise ValueError(f"{_describe(cut, what)}: duration must be a finite positive number of seconds, got {d!r}")
    if not (isinstance(start, (int, float)) and math.isfinite(start) and start >= 0):
        raise ValueError(f"{_describe(cut, what)}: start must be a finite number >= 0, got {start!r}")
    if not isinstance(cut.channel, int):
        raise ValueError(f"{_describe(cut, what)}: channel must be an int, got {cut.channel!r}")
    texts = [s.text for s in cut.supervisions]
    if not texts or not all(isinstance(t, str) for t in texts) or not " ".join(texts).strip():
        raise ValueError(f"{_describe(cut, what)}: empty transcript (every cut needs a supervision with text)")
    size = sum(len(t) for t in texts)
    if size > MAX_TRANSCRIPT_CHARS:
        raise ValueError(
            f"{_describe(cut, what)}: the transcript has {size} characters (at most {MAX_TRANSCRIPT_CHARS})"
        )
    for t in texts:
        check_transcript(t.strip(), _describe(cut, what))
    if size > MAX_CHARS_PER_SECOND * max(d, 1.0):
        raise ValueError(
            f"{_describe(cut, what)}: {size} transcript characters for {d:g} s of audio (at most "
            f"{MAX_CHARS_PER_SECOND} a second, {MAX_CHARS_PER_SECOND} in a cut under 1 s): the transcript "
            "does not belong to this cut"
        )
    if needs_audio:
        rec = cut.recording
        if rec is None:
            raise ValueError(f"{_describe(cut, what)}: no recording (audio) in the manifest")
        if len(rec.channel_ids) > MAX_CHANNELS:
            raise ValueError(f"{_describe(cut, what)}: {len(rec.channel_ids)} channels (at most {MAX_CHANNELS})")
        if sampling_rate is not None and rec.sampling_rate != sampling_rate:
            raise ValueError(
                f"{_describe(cut, what)}: sampling rate {rec.sampling_rate} Hz, expected {sampling_rate} Hz "
                "(resample the audio, or set data.sampling_rate)"
            )
        if not (isinstance(rec.duration, (int, float)) and math.isfinite(rec.duration)):
            raise ValueError(f"{_describe(cut, what)}: recording duration {rec.duration!r} is not finite")
        if start + d > rec.duration + _SLACK:
            raise ValueError(
                f"{_describe(cut, what)}: the cut ends at {start + d:.3f} s, after its recording ({rec.duration:.3f} s)"
            )
        _source_rate(cut, what)
        src = _audio_source(cut, what)
        if src.type == "file":
            _inside(src.source, roots, cut, what, "audio file")
    if needs_features:
        _check_feature_storage(cut, what)
        feats = cut.features
        if feats.storage_type == "numpy_files":
            _inside(Path(feats.storage_path) / feats.storage_key.lstrip("/"), roots, cut, what, "feature file")


def check_resample(src: int, dst: int, what: str) -> None:
    """Refuses a resampling whose filter would be huge (see :data:`MAX_RESAMPLE_PHASES`)."""
    g = math.gcd(src, dst)
    if max(src // g, dst // g) > MAX_RESAMPLE_PHASES:
        raise ValueError(
            f"{what}: resampling {src} Hz to {dst} Hz needs a filter of {src // g} x {dst // g} phases "
            f"(at most {MAX_RESAMPLE_PHASES} each way: common rates such as 8, 22.05, 44.1 or 48 kHz are fine); "
            "resample the audio beforehand"
        )


@functools.lru_cache(maxsize=16)
def _resampler(src: int, dst: int):
    from lhotse.augmentation.resample import Resample  # torch code, no torchaudio

    return Resample(src, dst)


def _source_rate(cut, what: str) -> int:
    """The sampling rate of the cut's audio file: the recording's, or the source rate of the one
    transform read, a resampling to the recording's rate (Lhotse's ``Recording.resample``: the
    audio is resampled as it is read, here, by :func:`_load_samples`)."""
    rec = cut.recording
    ts = list(rec.transforms or [])
    if not ts:
        return int(rec.sampling_rate)
    t = ts[0].to_dict() if hasattr(ts[0], "to_dict") else ts[0]
    kw = t.get("kwargs") if isinstance(t, dict) else None
    if len(ts) != 1 or not isinstance(kw, dict) or t.get("name") != "Resample":
        raise ValueError(
            f"{_describe(cut, what)}: recordings with transforms other than one resampling (speed, volume, ...) "
            "are not read: apply them when preparing the manifest"
        )
    src, dst = kw.get("source_sampling_rate"), kw.get("target_sampling_rate")
    ok = all(isinstance(v, int) and not isinstance(v, bool) and MIN_RATE <= v <= MAX_RATE for v in (src, dst))
    if not ok or dst != rec.sampling_rate:
        raise ValueError(
            f"{_describe(cut, what)}: its resampling ({src!r} Hz to {dst!r} Hz) must go from a rate in "
            f"[{MIN_RATE}, {MAX_RATE}] to the recording's {rec.sampling_rate} Hz"
        )
    assert isinstance(src, int) and isinstance(dst, int)  # checked above
    check_resample(src, dst, _describe(cut, what))
    return src


def _check_feature_storage(cut, what: str) -> None:
    """Checks that the cut's features are stored where :func:`_load_features` reads them."""
    feats = cut.features
    if feats is None:
        raise ValueError(f"{_describe(cut, what)}: no precomputed features (data.features=precomputed)")
    if feats.storage_type not in _FEATURE_STORAGES:
        raise ValueError(
            f"{_describe(cut, what)}: feature storage {feats.storage_type!r} is not read (only "
            f"{list(_FEATURE_STORAGES)}: numpy arrays; store other features with Lhotse's NumpyFilesWriter)"
        )
    if feats.storage_type == "numpy_files":
        path = str(feats.storage_path)
        if "://" in path or path.startswith("pipe:") or not isinstance(feats.storage_key, str):
            raise ValueError(f"{_describe(cut, what)}: feature storage {path!r} is not a local folder")


def _npy_array(f, what: str, max_frames: int, num_features: int) -> np.ndarray:
    """The ``(T, F)`` array of the ``.npy`` stream ``f``, its header checked before any data is
    read: a float array of ``0 < T <= max_frames`` rows of ``num_features`` values."""
    shape, fortran, dtype = npy_header(f, what, _NPY_HEADER_MAX)
    if dtype.kind != "f" or dtype.itemsize not in (2, 4, 8):
        raise ValueError(f"{what}: features must be float16/32/64, the .npy file holds {dtype}")
    if len(shape) != 2 or shape[1] != num_features or not 0 < shape[0] <= max_frames:
        raise ValueError(
            f"{what}: the .npy file declares shape {shape}; expected (T, {num_features}) with 0 < T <= {max_frames}"
        )
    return np.ascontiguousarray(npy_data(f, shape, fortran, dtype, what), dtype=np.float32)


def _load_features(cut, what: str, max_frames: int, num_features: int) -> np.ndarray:
    """The cut's precomputed ``(T, F)`` float32 features, trimmed to the cut as Lhotse's
    ``cut.load_features()`` does, read without Lhotse's readers: the storage must be an ``.npy``
    file that is a regular file (not a pipe or a device) or ``.npy`` bytes; its header must declare
    at most ``max_frames`` rows of ``num_features`` floats (checked before the data is read).

    Raises:
        ValueError: naming ``what``, the cut and the storage.
    """
    from lhotse.utils import compute_num_frames

    feats = cut.features
    _check_feature_storage(cut, what)
    name = f"{_describe(cut, what)}: features {feats.storage_path}/{feats.storage_key}"
    if feats.storage_type == "memory_npy":
        if not isinstance(feats.storage_key, (bytes, bytearray)):
            raise ValueError(f"{_describe(cut, what)}: memory_npy features must hold bytes")
        x = _npy_array(io.BytesIO(feats.storage_key), name, max_frames, num_features)
    else:
        path = Path(feats.storage_path) / feats.storage_key.lstrip("/")
        try:
            f = open_regular(path, name)
        except OSError as e:
            raise ValueError(f"{name}: cannot open: {e.strerror}") from None
        with f:
            x = _npy_array(f, name, max_frames, num_features)
    start = cut.start
    if start < feats.start - 1e-3:
        raise ValueError(f"{_describe(cut, what)}: the cut starts at {start} s, before its features ({feats.start} s)")
    left = 0
    if not math.isclose(start, feats.start):
        left = compute_num_frames(start - feats.start, frame_shift=feats.frame_shift, sampling_rate=feats.sampling_rate)
    right = left + compute_num_frames(cut.duration, frame_shift=feats.frame_shift, sampling_rate=feats.sampling_rate)
    x = x[left:right]
    # Lhotse forgives one frame more or less than the cut's num_frames; so does this
    extra = x.shape[0] - cut.num_frames
    if extra == 1:
        x = x[: cut.num_frames]
    elif extra == -1 and x.shape[0] > 0:
        x = np.concatenate((x, x[-1:]), axis=0)
    if x.shape[0] == 0:
        raise ValueError(f"{name}: no frames in the cut's span")
    return x


def _source_name(src) -> str:
    return str(src.source) if src.type == "file" else "<audio bytes in the manifest>"


def check_cut(cut, what: str, *, sampling_rate: int | None = None, roots: tuple[Path, ...] | None = None) -> None:
    """Checks that ``cut``'s audio can be read as the manifest says, before reading it.

    Checks the manifest fields (see the module docstring), then opens the audio file's header with
    soundfile: it must exist, be readable audio, have the manifest's sampling rate and channel
    count, and hold the cut's samples. Reads no samples.

    Args:
        cut: a Lhotse cut.
        what: the manifest (``"data.train_cuts (cuts.jsonl.gz)"``), for messages.
        sampling_rate: the rate the features expect (None: any).
        roots: resolved folders the audio file must lie in (None: anywhere).

    Raises:
        ValueError: naming ``what``, the cut id and the audio file.
    """
    import soundfile as sf

    _check_metadata(cut, what, sampling_rate=sampling_rate, needs_audio=True, needs_features=False, roots=roots)
    src = _audio_source(cut, what)
    name = _source_name(src)
    if src.type == "file":
        if not Path(src.source).is_file():
            raise ValueError(f"{_describe(cut, what)}: audio file not found: {src.source}")
    try:
        info = sf.info(src.source if src.type == "file" else io.BytesIO(src.source))
    except Exception as e:
        raise ValueError(
            f"{_describe(cut, what)}: cannot read audio {name}: {' '.join(str(e).split())[:300]}"
        ) from None
    rate = _source_rate(cut, what)
    if info.samplerate != rate:
        raise ValueError(
            f"{_describe(cut, what)}: audio {name} has sampling rate {info.samplerate} Hz but the manifest says "
            f"{rate} Hz"
        )
    if info.channels != len(src.channels):
        raise ValueError(
            f"{_describe(cut, what)}: audio {name} has {info.channels} channels but the manifest says "
            f"{len(src.channels)}"
        )
    if info.frames <= 0:
        raise ValueError(f"{_describe(cut, what)}: audio {name} is empty (no samples)")
    end = cut.start + cut.duration
    if end > info.frames / info.samplerate + _SLACK:
        raise ValueError(
            f"{_describe(cut, what)}: audio {name} lasts {info.frames / info.samplerate:.3f} s but the cut ends at "
            f"{end:.3f} s"
        )


def _load_samples(cut, what: str) -> np.ndarray:
    """The cut's samples (float32, 1-D), read with soundfile after :func:`check_cut`."""
    import soundfile as sf

    src = _audio_source(cut, what)
    sr = _source_rate(cut, what)
    first = int(round(cut.start * sr))
    count = max(1, int(round(cut.duration * sr)))
    try:
        with sf.SoundFile(src.source if src.type == "file" else io.BytesIO(src.source)) as f:
            first = min(first, max(0, f.frames - 1))
            f.seek(first)
            x = f.read(frames=min(count, f.frames - first), dtype="float32", always_2d=True)
    except Exception as e:
        raise ValueError(
            f"{_describe(cut, what)}: cannot read audio {_source_name(src)}: {' '.join(str(e).split())[:300]}"
        ) from None
    x = x[:, src.channels.index(cut.channel)]
    if x.size == 0:
        raise ValueError(f"{_describe(cut, what)}: audio {_source_name(src)} gave no samples")
    if not np.isfinite(x).all():
        raise ValueError(f"{_describe(cut, what)}: audio {_source_name(src)} holds NaN or infinite samples")
    x = np.ascontiguousarray(x)
    if sr != cut.recording.sampling_rate:
        with torch.no_grad():
            x = _resampler(sr, cut.recording.sampling_rate)(torch.from_numpy(x)[None])[0].numpy()
    return x


def _text(cut) -> str:
    return " ".join(s.text.strip() for s in cut.supervisions if s.text and s.text.strip())


# ----------------------------------------------------------------------------------------------
# Feature settings (what a checkpoint carries, so evaluation reads the inputs its model was trained on)

#: the most features per frame a checkpoint's feature settings may declare
MAX_SETTINGS_FEATURES = 1 << 16
_SETTINGS_INTS = {"num_mel_bins": (1, 512), "sampling_rate": (1, MAX_RATE), "stack_frames": (1, 64)}


def check_feature_settings(settings, what: str = "checkpoint feature_settings") -> dict:
    """The feature settings of :meth:`LhotseDataModule.feature_settings` (e.g. from a checkpoint),
    checked as plain data: ``features`` (``"fbank"`` or ``"precomputed"``), ``feature_dim``,
    ``stack_frames``, ``frame_shift`` (seconds per frame of a batch), ``num_mel_bins`` and
    ``sampling_rate`` (``fbank``), and ``normalization``: ``None`` or ``{"mean", "std"}``, lists
    of ``feature_dim`` finite floats (``std`` positive).

    Raises:
        ValueError: naming ``what`` and the key.
    """
    if not isinstance(settings, dict):
        raise ValueError(f"{what}: expected a dict, got {type(settings).__name__}")
    known = {"features", "feature_dim", "stack_frames", "frame_shift", "num_mel_bins", "sampling_rate", "normalization"}
    unknown = sorted(str(k) for k in settings if k not in known)
    if unknown:
        raise ValueError(f"{what}.{unknown[0]}: unknown key (known: {sorted(known)})")
    out: dict[str, Any] = {}
    kind = settings.get("features")
    if kind not in ("fbank", "precomputed"):
        raise ValueError(f"{what}.features: expected 'fbank' or 'precomputed', got {kind!r}")
    out["features"] = kind
    bounds = dict(_SETTINGS_INTS, feature_dim=(1, MAX_SETTINGS_FEATURES))
    need = ["feature_dim", "stack_frames"] + (["num_mel_bins", "sampling_rate"] if kind == "fbank" else [])
    for key in need:
        v = settings.get(key)
        lo, hi = bounds[key]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"{what}.{key}: expected an integer in [{lo}, {hi}], got {v!r}")
        out[key] = v
    fs = settings.get("frame_shift")
    if isinstance(fs, bool) or not isinstance(fs, (int, float)) or not (0 < fs <= 10 and math.isfinite(fs)):
        raise ValueError(f"{what}.frame_shift: expected seconds in (0, 10], got {fs!r}")
    out["frame_shift"] = float(fs)
    norm = settings.get("normalization")
    if norm is not None:
        if not isinstance(norm, dict) or set(norm) != {"mean", "std"}:
            raise ValueError(f"{what}.normalization: expected null or {{'mean': [...], 'std': [...]}}")
        stats = []
        for key in ("mean", "std"):
            v = norm[key]
            if not isinstance(v, (list, tuple)) or len(v) != out["feature_dim"]:
                n = len(v) if isinstance(v, (list, tuple)) else type(v).__name__
                raise ValueError(f"{what}.normalization.{key}: expected {out['feature_dim']} numbers, got {n}")
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
                raise ValueError(f"{what}.normalization.{key}: expected numbers")
            a = np.asarray(v, dtype=np.float64)
            if not np.isfinite(a).all() or (key == "std" and not (a > 0).all()):
                raise ValueError(f"{what}.normalization.{key}: expected finite numbers{' > 0' if key == 'std' else ''}")
            stats.append([float(x) for x in a])
        out["normalization"] = {"mean": stats[0], "std": stats[1]}
    else:
        out["normalization"] = None
    return out


def _describe_settings(s: dict) -> str:
    if s["features"] == "fbank":
        return f"{s['num_mel_bins']} mel bins x {s['stack_frames']} stacked frames at {s['sampling_rate']} Hz"
    return f"precomputed features ({s['feature_dim'] // s['stack_frames']} x {s['stack_frames']} stacked frames)"


class _Normalised:
    """A loader's batches with ``inputs`` scaled by fixed statistics (padding kept at 0); other
    attributes are the loader's."""

    def __init__(self, loader, mean, std):
        self.loader, self.mean, self.std = loader, mean, std

    def __getattr__(self, name: str):
        return getattr(self.loader, name)

    def __iter__(self):
        for batch in self.loader:
            x, lengths = batch["inputs"], batch["input_lengths"]
            mask = (torch.arange(x.shape[1])[None, :] < lengths[:, None]).unsqueeze(-1)
            yield {**batch, "inputs": ((x - self.mean) / self.std * mask).to(x.dtype)}


# ----------------------------------------------------------------------------------------------
# Batches


class _Admit:
    """The sampler's cut filter: checks the manifest fields and skips cuts over ``max_duration``
    (a picklable callable)."""

    def __init__(self, what: str, max_duration: float, check: dict):
        self.what, self.max_duration, self.check = what, max_duration, check

    def __call__(self, cut) -> bool:
        _check_metadata(cut, self.what, **self.check)
        return cut.duration <= self.max_duration


class _CutBatches(Dataset):
    """Makes the batch dict of a ``CutSet`` (``dataset[cuts]``): runs in the dataloader workers."""

    def __init__(self, dm: LhotseDataModule, split: LhotseSplit, *, train: bool):
        super().__init__()
        self.what = split.what
        self.max_cut_duration = dm.max_cut_duration
        self.features = "precomputed" if split.precomputed else "fbank"
        self.num_mel_bins = dm.num_mel_bins
        self.sampling_rate = dm.sampling_rate
        self.feature_dim = dm.feature_dim // dm.stack_frames
        self.stack_frames = dm.stack_frames
        self.spec_augment = dm.spec_augment if train else None
        self._fbank: Any = None
        self._augment: Any = None

    def __getitem__(self, cuts) -> dict:
        return self.collate(cuts)

    def features_of(self, cut) -> torch.Tensor:
        """``(T, F)`` float32 features of one cut (checked first)."""
        if self.features == "precomputed":
            feats = cut.features
            limit = int(self.max_cut_duration / max(feats.frame_shift, 1e-3)) + 16
            if not (0 < feats.num_frames <= limit) or feats.num_features != self.feature_dim:
                raise ValueError(
                    f"{_describe(cut, self.what)}: precomputed features of {feats.num_frames} frames x "
                    f"{feats.num_features} (expected at most {limit} frames of {self.feature_dim})"
                )
            x = _load_features(cut, self.what, limit, self.feature_dim)
            if x.ndim != 2 or x.shape[1] != self.feature_dim or x.shape[0] > limit or not np.isfinite(x).all():
                raise ValueError(
                    f"{_describe(cut, self.what)}: features from {feats.storage_path} have shape {x.shape} "
                    f"(expected (T <= {limit}, {self.feature_dim}), finite)"
                )
            return torch.from_numpy(x)
        check_cut(cut, self.what, sampling_rate=self.sampling_rate)
        samples = _load_samples(cut, self.what)
        if self._fbank is None:
            from lhotse import Fbank, FbankConfig

            self._fbank = Fbank(FbankConfig(num_filters=self.num_mel_bins, sampling_rate=self.sampling_rate))
        window = int(round(self._fbank.config.frame_length * self.sampling_rate))
        if samples.shape[0] < window:
            raise ValueError(
                f"{_describe(cut, self.what)}: {samples.shape[0]} samples, fewer than one filterbank window "
                f"({window} samples, {self._fbank.config.frame_length * 1000:g} ms)"
            )
        x = self._fbank.extract(torch.from_numpy(samples), self.sampling_rate).float()
        if not torch.isfinite(x).all():
            raise ValueError(
                f"{_describe(cut, self.what)}: the audio's filterbanks are not finite (samples too large?)"
            )
        return x

    def collate(self, cuts) -> dict:
        """The batch dict of a CutSet (see the module docstring)."""
        cuts = list(cuts)
        feats = [self.features_of(c) for c in cuts]
        lengths = torch.tensor([f.shape[0] for f in feats], dtype=torch.long)
        x = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
        if self.spec_augment is not None:
            if self._augment is None:
                from lhotse.dataset import SpecAugment

                self._augment = SpecAugment(**self.spec_augment)
            segments = torch.stack([torch.arange(len(cuts)), torch.zeros(len(cuts), dtype=torch.long), lengths], 1)
            x = self._augment(x, supervision_segments=segments.int())
        k = self.stack_frames
        if k > 1:
            b, t, f = x.shape
            t2 = -(-t // k)
            x = torch.nn.functional.pad(x, (0, 0, 0, t2 * k - t)).reshape(b, t2, k * f)
            lengths = (lengths + k - 1) // k
        return {
            "inputs": x.contiguous(),
            "input_lengths": lengths,
            "texts": [_text(c) for c in cuts],
            "ids": [c.id for c in cuts],
        }


def _as_is(batch):
    return batch


class CutBatchLoader:
    """The batches of one split for one rank: an iterable that Lightning uses as a dataloader.

    Each ``iter()`` is one pass (an epoch): a Lhotse ``DynamicBucketingSampler`` for
    ``(seed, epoch)`` runs in this process and yields CutSets; a torch ``DataLoader`` turns them
    into batch dicts in ``num_workers`` worker processes (in order). Before each pass the data
    module sets ``epoch`` and ``skip`` (batches of the pass to leave out, for resuming); the
    skipped batches are sampled but never loaded.

    Attributes:
        world_size, rank: the sampler's DDP sharding.
        epoch, skip: of the next pass.
        yielded: batches given by the current pass.
    """

    def __init__(
        self,
        dm: LhotseDataModule,
        split: LhotseSplit,
        *,
        train: bool,
        world_size: int = 1,
        rank: int = 0,
        num_workers: int = 0,
    ):
        if not (isinstance(world_size, int) and isinstance(rank, int) and 0 <= rank < world_size):
            raise ValueError(f"data: rank {rank!r} must be in [0, world_size={world_size!r})")
        self.cuts = split.cuts
        self.what = split.what
        self.duration_bins = split.duration_bins
        self.max_duration = dm.max_duration
        self.max_cut_duration = dm.max_cut_duration
        self.shuffle = dm.shuffle and train
        self.seed = dm.seed
        self.world_size, self.rank = world_size, rank
        self.num_workers = num_workers
        self.dataset = _CutBatches(dm, split, train=train)
        fbank = not split.precomputed
        self._check = dict(
            sampling_rate=dm.sampling_rate if fbank else None,
            needs_audio=fbank,
            needs_features=not fbank,
            roots=split.roots,
        )
        self.epoch = 0
        self.skip = 0
        self.yielded = 0
        self.before_iter: Callable[[CutBatchLoader], None] | None = None

    def make_sampler(self):
        """A fresh Lhotse sampler over this split for ``self.epoch`` (yields CutSets)."""
        from lhotse.dataset import DynamicBucketingSampler

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*eagerly read CutSet.*")
            s = DynamicBucketingSampler(
                self.cuts,
                max_duration=self.max_duration,
                duration_bins=self.duration_bins,
                shuffle=self.shuffle,
                drop_last=False,
                seed=self.seed,
                world_size=self.world_size,
                rank=self.rank,
            )
        s.filter(_Admit(self.what, self.max_cut_duration, self._check))
        s.set_epoch(self.epoch)
        return s

    def cut_batches(self) -> Iterator[Any]:
        """This rank's CutSets for this epoch, after the first ``skip``."""
        for i, cuts in enumerate(self.make_sampler()):
            if i >= self.skip:
                yield cuts

    def __iter__(self) -> Iterator[dict]:
        if self.before_iter is not None:
            self.before_iter(self)
        self.yielded = 0
        if self.num_workers == 0:
            batches: Any = (self.dataset.collate(c) for c in self.cut_batches())
        else:
            batches = DataLoader(
                self.dataset,  # indexed by CutSets
                sampler=self.cut_batches(),
                batch_size=None,
                num_workers=self.num_workers,
                collate_fn=_as_is,
            )
        for b in batches:
            self.yielded += 1
            yield b


# ----------------------------------------------------------------------------------------------
# The data module


class LhotseSplit:
    """One split: its lazy ``cuts``, the manifest name ``what``, and what a scan of it found.

    Attributes:
        cuts: the lazy ``lhotse.CutSet``.
        what: ``"data.train_cuts (path)"``, for messages.
        texts: the transcripts of the admitted cuts (in manifest order).
        num_cuts, num_skipped: admitted cuts, and cuts skipped for being longer than
            ``max_cut_duration``.
        hours: total admitted audio.
        duration_bins: the bucket boundaries (seconds) estimated from the admitted cuts.
        num_features: the precomputed features' dimension (first cut), or None.
        precomputed: the cuts carry features (``features="precomputed"`` or the feature cache).
        roots: the resolved folders the cuts' audio and feature files must lie in (None: any).
    """

    def __init__(self, cuts, what: str, precomputed: bool = False, roots: tuple[Path, ...] | None = None):
        self.cuts = cuts
        self.what = what
        self.precomputed = precomputed
        self.roots = roots
        self.texts: list[str] = []
        self.num_cuts = 0
        self.num_skipped = 0
        self.hours = 0.0
        self.duration_bins: list[float] = []
        self.num_features: int | None = None
        self.frame_shift: float | None = None  # the precomputed features' (first cut)

    def __len__(self) -> int:
        return self.num_cuts

    def __repr__(self) -> str:
        return f"LhotseSplit({self.what}, {self.num_cuts} cuts, {self.hours:.2f} h)"


def _world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


class LhotseDataModule(L.LightningDataModule):
    """Speech from Lhotse manifests: duration-bucketed batches of filterbanks and transcripts.

    Args:
        train_cuts, val_cuts, test_cuts: a Lhotse ``CutSet`` manifest path (``.jsonl`` or
            ``.jsonl.gz``, read lazily) or a ``CutSet``; ``test_cuts`` defaults to ``val_cuts``.
        features: ``"fbank"`` (log-mel filterbanks computed on the fly by Lhotse's torch
            ``Fbank``) or ``"precomputed"`` (the cuts carry features, e.g. from
            ``CutSet.compute_and_store_features``).
        num_mel_bins: filterbank channels (``"fbank"``).
        sampling_rate: the audio's sampling rate (Hz); a cut with another rate is an error.
        max_duration: seconds of audio per batch (the sampler's budget).
        num_buckets: duration buckets of the sampler.
        shuffle: shuffle the training cuts (within the sampler's buffer of 20000 cuts), per epoch.
        spec_augment: ``False``, ``True`` (Lhotse's ``SpecAugment`` with its defaults) or a dict of
            ``SpecAugment`` arguments (``time_warp_factor``, ``num_feature_masks``,
            ``features_mask_size``, ``num_frame_masks``, ``frames_mask_size``,
            ``max_frames_mask_fraction``, ``p``); training batches only, before frame stacking.
        num_workers: dataloader worker processes (features are computed there).
        seed: the sampler's seed (with the epoch, it fixes every batch).
        chars: the characters of the vocabulary (a string), or ``None``: the sorted characters of
            the training transcripts.
        max_cut_duration: cuts longer than this (seconds) are skipped, with one warning per split
            giving their number (they would not fit the batch budget, and it bounds what one cut
            may allocate). Must be at most ``max_duration``.
        feature_cache: a folder: with ``features="fbank"``, the filterbanks of every split are
            computed once (in ``prepare_data``, or when a split is first read) and stored there
            with Lhotse's ``NumpyFilesWriter`` beside a manifest of the cuts that carry them;
            later runs (and epochs) read them instead of the audio. A cache entry is keyed by
            the manifest file (path, size, modification time) and the feature settings; a
            manifest given as a ``CutSet`` cannot be cached (an error).
        stack_frames: concatenate this many consecutive frames into one (``F = k * num_mel_bins``,
            ``T / k`` frames): cheap subsampling for CPU training.
        audio_dirs: the folders the manifests' audio (and precomputed feature) files must lie
            in, symlinks followed; ``None``: each manifest's own folder. A cut whose file
            resolves elsewhere is an error naming it.
        allow_outside_paths: read files wherever the manifests put them.
    """

    def __init__(
        self,
        train_cuts,
        val_cuts,
        test_cuts=None,
        *,
        features: str = "fbank",
        num_mel_bins: int = 80,
        sampling_rate: int = 16000,
        max_duration: float = 200.0,
        num_buckets: int = 10,
        shuffle: bool = True,
        spec_augment: bool | dict = False,
        num_workers: int = 0,
        seed: int = 0,
        chars: str | None = None,
        max_cut_duration: float = 30.0,
        feature_cache: str | None = None,
        stack_frames: int = 1,
        audio_dirs: list[str] | str | None = None,
        allow_outside_paths: bool = False,
    ):
        super().__init__()
        if features not in ("fbank", "precomputed"):
            raise ValueError(f"data.features: must be 'fbank' or 'precomputed', got {features!r}")
        # upper bounds: a model is built from feature_dim = stack_frames * num_mel_bins, and buffers
        # scale with the others; a config must not ask for unbounded memory
        for name, v, lo, hi in (
            ("num_mel_bins", num_mel_bins, 1, 512),
            ("num_buckets", num_buckets, 1, 1024),
            ("num_workers", num_workers, 0, 256),
            ("stack_frames", stack_frames, 1, 64),
            ("sampling_rate", sampling_rate, 1, 384000),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"data.{name}: must be an integer in [{lo}, {hi}], got {v!r}")
        for name, x in (("max_duration", max_duration), ("max_cut_duration", max_cut_duration)):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not (0 < x < math.inf):
                raise ValueError(f"data.{name}: must be a positive number of seconds, got {x!r}")
        if max_cut_duration > max_duration:
            raise ValueError(
                f"data.max_cut_duration ({max_cut_duration}) must be at most data.max_duration ({max_duration}): "
                "a batch must hold the longest cut"
            )
        augment: dict | None
        if isinstance(spec_augment, bool):
            augment = {} if spec_augment else None
        elif isinstance(spec_augment, dict) or hasattr(spec_augment, "items"):
            augment = dict(spec_augment.items())
            from inspect import signature

            from lhotse.dataset import SpecAugment

            allowed = set(signature(SpecAugment.__init__).parameters) - {"self"}
            bad = sorted(set(augment) - allowed)
            if bad:
                raise ValueError(f"data.spec_augment: unknown keys {bad}; SpecAugment takes {sorted(allowed)}")
        else:
            raise ValueError(f"data.spec_augment: must be true, false or a mapping, got {spec_augment!r}")
        if feature_cache is not None:
            if not isinstance(feature_cache, (str, os.PathLike)):
                raise ValueError(f"data.feature_cache: must be a folder path or null, got {feature_cache!r}")
            if features != "fbank":
                raise ValueError("data.feature_cache: caches filterbanks: use it with data.features=fbank")
        if chars is not None and (not isinstance(chars, str) or not chars):
            raise ValueError(f"data.chars: must be a non-empty string or null, got {chars!r}")
        if audio_dirs is not None:
            dirs: list[Any] = [audio_dirs] if isinstance(audio_dirs, (str, os.PathLike)) else list(audio_dirs)
            if not dirs or not all(isinstance(d, (str, os.PathLike)) for d in dirs):
                raise ValueError(f"data.audio_dirs: must be a list of folders or null, got {audio_dirs!r}")
            audio_dirs = [str(d) for d in dirs]
        self.audio_dirs = audio_dirs
        self.allow_outside_paths = bool(allow_outside_paths)
        self.features = features
        self.num_mel_bins = num_mel_bins
        self.sampling_rate = sampling_rate
        self.max_duration = float(max_duration)
        self.num_buckets = num_buckets
        self.shuffle = bool(shuffle)
        self.spec_augment = augment
        self.num_workers = num_workers
        self.seed = int(seed)
        self.max_cut_duration = float(max_cut_duration)
        self.stack_frames = stack_frames
        self.feature_cache = feature_cache
        self._chars = chars
        self.sources = {"train": train_cuts, "val": val_cuts, "test": test_cuts if test_cuts is not None else val_cuts}
        # plain-data hyper-parameters only (a CutSet is no checkpoint data; chars=None would clash
        # with the model's chars when loggers merge hyper-parameters)
        lhotse = _lhotse()
        given = {"train_cuts": train_cuts, "val_cuts": val_cuts, "test_cuts": test_cuts}
        ignore = [k for k, v in given.items() if isinstance(v, lhotse.CutSet)]
        if chars is None:
            ignore.append("chars")
        self.save_hyperparameters(ignore=ignore)
        self.train_set: LhotseSplit = None  # type: ignore[assignment]  # until setup()
        self.val_set: LhotseSplit = None  # type: ignore[assignment]
        self.test_set: LhotseSplit = None  # type: ignore[assignment]
        self._splits: dict[str, LhotseSplit] = {}
        self._cached_splits: dict[str, LhotseSplit] = {}
        self._sources_ready = False
        self._epoch = 0
        self._resume: dict | None = None
        self._data_epoch: int | None = None  # the epoch of the current training pass
        self._skipped = 0  # batches its start skipped (resuming)
        self._train_loader: CutBatchLoader | None = None
        #: (mean, std) applied to every batch's features (a checkpoint's, see
        #: apply_feature_settings), or None; _norm_given: set from outside, never estimated
        self._norm: tuple[torch.Tensor, torch.Tensor] | None = None
        self._norm_given = False

    # ---------------------------------------------------------------- splits
    def _key(self, name: str) -> str:
        key = "val" if name == "test" and self.sources["test"] is self.sources["val"] else name
        return f"data.{key}_cuts"

    def _what(self, name: str) -> str:
        src = self.sources[name]
        return f"{self._key(name)} ({src})" if isinstance(src, (str, os.PathLike)) else f"{self._key(name)} (CutSet)"

    def split(self, name: str) -> LhotseSplit:
        """The split ``"train"``, ``"val"`` or ``"test"``, read and scanned once (lazily)."""
        if name not in self._splits:
            if not self._sources_ready:
                self.prepare_sources()
                self._sources_ready = True
            what = self._what(name)
            cuts = read_cuts(self.sources[name], self._key(name))
            split = LhotseSplit(cuts, what, precomputed=self.features == "precomputed", roots=self._roots(name))
            self._splits[name] = self._scan(split)
        return self._splits[name]

    def _roots(self, name: str) -> tuple[Path, ...] | None:
        """The folders a split's files must lie in: ``audio_dirs``, else the manifest's folder;
        None (anywhere) with ``allow_outside_paths`` or for a ``CutSet`` given in Python."""
        src = self.sources[name]
        if self.allow_outside_paths or not isinstance(src, (str, os.PathLike)):
            return None
        if self.audio_dirs is not None:
            return tuple(Path(d).resolve() for d in self.audio_dirs)
        return (Path(src).resolve().parent,)

    def prepare_sources(self) -> None:
        """Called once, before a manifest is first read (by ``chars``, ``setup`` or a loader).

        Does nothing here. A subclass whose manifests are made rather than given (the spoken
        task writes them into its cache) writes them here, then puts their paths (or CutSets) in
        ``self.sources`` (keys ``"train"``, ``"val"``, ``"test"``).
        """

    def prepare_data(self) -> None:
        """Fills the feature cache (``feature_cache``) of the train, val and test splits (Lightning
        calls this on one process per node before ``setup``)."""
        if self.feature_cache is not None:
            for name in ("train", "val", "test"):
                self._cached(name)

    def _cached(self, name: str) -> LhotseSplit:
        """The split read from the feature cache, computing the cache entry first if needed."""
        if name in self._cached_splits:
            return self._cached_splits[name]
        import hashlib

        lhotse = _lhotse()
        src = self.sources[name]
        if isinstance(src, lhotse.CutSet):
            raise ValueError(f"data.feature_cache: {self._key(name)} is a CutSet, not a manifest file: cannot cache it")
        path = Path(src).resolve()
        split = self.split(name)  # reads and checks the manifest
        st = path.stat()
        ident = json.dumps(
            [str(path), st.st_size, st.st_mtime_ns, self.num_mel_bins, self.sampling_rate, self.max_cut_duration, 1]
        )
        folder = Path(self.feature_cache) / f"{name}-{hashlib.sha1(ident.encode()).hexdigest()[:16]}"  # type: ignore[arg-type]
        manifest = folder / "cuts.jsonl.gz"
        if not (folder / "complete").is_file():
            self._fill_cache(split, folder, ident)
        cache = LhotseSplit(
            read_cuts(str(manifest), "data.feature_cache"), split.what, precomputed=True, roots=(folder.resolve(),)
        )
        cached = self._scan(cache)
        if cached.num_cuts != split.num_cuts:
            raise ValueError(
                f"data.feature_cache: {manifest} holds {cached.num_cuts} cuts but {split.what} has {split.num_cuts}: "
                f"delete {folder} to rebuild it"
            )
        self._cached_splits[name] = cached
        return cached

    def _fill_cache(self, split: LhotseSplit, folder: Path, ident: str) -> None:
        import shutil
        import tempfile

        from lhotse import CutSet
        from lhotse.features import Features
        from lhotse.features.io import NumpyFilesWriter
        from lhotse.utils import fastcopy

        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=folder.parent))
        try:
            maker = _CutBatches(self, split, train=False)
            admit = _Admit(
                split.what,
                self.max_cut_duration,
                dict(sampling_rate=self.sampling_rate, needs_audio=True, needs_features=False, roots=split.roots),
            )
            writer = NumpyFilesWriter(tmp / "feats")
            from tqdm import tqdm

            total = split.num_cuts + split.num_skipped
            bar = tqdm(split.cuts, total=total, desc=f"feature cache: {split.what}", unit="cut", mininterval=2.0)
            with CutSet.open_writer(str(tmp / "cuts.jsonl.gz")) as out:
                for cut in bar:
                    if not admit(cut):
                        continue
                    x = maker.features_of(cut).numpy()
                    key = writer.write(cut.id.replace("/", "_"), x)
                    feats = Features(
                        type="kaldi-fbank",
                        num_frames=int(x.shape[0]),
                        num_features=int(x.shape[1]),
                        frame_shift=0.01,
                        sampling_rate=self.sampling_rate,
                        start=cut.start,
                        duration=cut.duration,
                        storage_type=writer.name,
                        storage_path=str(folder / "feats"),
                        storage_key=key,
                        recording_id=cut.recording_id,
                        channels=cut.channel,
                    )
                    out.write(fastcopy(cut, features=feats))
            (tmp / "complete").write_text(ident + "\n")
            try:
                os.rename(tmp, folder)
            except OSError:  # another process filled it meanwhile
                if not (folder / "complete").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _scan(self, split: LhotseSplit) -> LhotseSplit:
        """One pass over a split's manifest fields (no audio read): checks every cut, collects
        transcripts, durations for the bucket boundaries, and counts cuts that are too long."""
        from lhotse.dataset.sampling.dynamic_bucketing import estimate_duration_buckets

        fbank = not split.precomputed
        check: dict[str, Any] = dict(
            sampling_rate=self.sampling_rate if fbank else None,
            needs_audio=fbank,
            needs_features=not fbank,
            roots=split.roots,
        )
        durations: list[float] = []
        first_long = None
        seconds = 0.0
        for cut in split.cuts:
            _check_metadata(cut, split.what, **check)
            if cut.duration > self.max_cut_duration:
                split.num_skipped += 1
                first_long = first_long or cut.id
                continue
            if not fbank:
                nf = cut.features.num_features
                if split.num_features is None:
                    split.num_features = nf
                    split.frame_shift = float(cut.features.frame_shift)
                elif nf != split.num_features:
                    raise ValueError(
                        f"{_describe(cut, split.what)}: {nf} features per frame but the first cut has "
                        f"{split.num_features}"
                    )
            split.texts.append(_text(cut))
            split.num_cuts += 1
            seconds += cut.duration
            if len(durations) < 10000:
                durations.append(cut.duration)
        split.hours = seconds / 3600
        if split.num_skipped:
            warnings.warn(
                f"{split.what}: {split.num_skipped} cuts longer than data.max_cut_duration={self.max_cut_duration} s "
                f"are skipped (the first: {first_long!r})",
                stacklevel=2,
            )
        if not split.num_cuts:
            raise ValueError(f"{split.what}: no usable cuts (all {split.num_skipped} are longer than max_cut_duration)")
        nb = min(self.num_buckets, len(durations))
        if nb > 1:
            split.duration_bins = [
                float(b) for b in estimate_duration_buckets([types.SimpleNamespace(duration=d) for d in durations], nb)
            ]
            split.duration_bins = sorted(set(split.duration_bins))
        if not split.duration_bins:
            split.duration_bins = [max(durations) + 1.0]
        return split

    @property
    def chars(self) -> str:
        """The vocabulary's characters: given, or the sorted characters of the training transcripts."""
        if self._chars is None:
            self._chars = "".join(sorted(set("".join(self.split("train").texts))))
        return self._chars

    @property
    def feature_dim(self) -> int:
        """Features per frame of a batch (``stack_frames`` times the filterbank channels)."""
        if self.features == "fbank":
            return self.num_mel_bins * self.stack_frames
        nf = self.split("train").num_features
        assert nf is not None
        return nf * self.stack_frames

    @property
    def frame_shift(self) -> float:
        """Seconds per frame of a batch: the features' frame shift times ``stack_frames``."""
        if self.features == "fbank":
            return 0.01 * self.stack_frames  # Lhotse's Fbank: 10 ms frames
        fs = self.split("train").frame_shift
        assert fs is not None
        return fs * self.stack_frames

    def normalization(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(mean, std)`` (each ``(feature_dim,)`` float32) that every batch's features are scaled
        by, or None (the default: none; :meth:`apply_feature_settings` sets a checkpoint's)."""
        return self._norm

    def feature_settings(self) -> dict:
        """What a model trained on these batches reads, as plain data (a checkpoint carries it):
        ``features``, ``feature_dim``, ``stack_frames``, ``frame_shift``, ``num_mel_bins`` and
        ``sampling_rate`` (``fbank``), and ``normalization`` (``{"mean", "std"}`` lists or None)."""
        s: dict[str, Any] = {
            "features": self.features,
            "feature_dim": int(self.feature_dim),
            "stack_frames": self.stack_frames,
            "frame_shift": float(self.frame_shift),
        }
        if self.features == "fbank":
            s.update(num_mel_bins=self.num_mel_bins, sampling_rate=self.sampling_rate)
        stats = self.normalization()
        s["normalization"] = None if stats is None else {"mean": stats[0].tolist(), "std": stats[1].tolist()}
        return s

    def apply_feature_settings(self, settings: dict, what: str = "the checkpoint") -> None:
        """Makes the batches what a model trained with ``settings`` (its checkpoint's
        :meth:`feature_settings`) reads: the same features, or a ``ValueError`` naming the data
        key that differs; then that model's normalisation (none if it had none) replaces this
        module's own.

        Raises:
            ValueError: malformed settings, or features that differ (naming ``data.<key>``).
        """
        s = check_feature_settings(settings, f"{what}: feature_settings")
        mine: dict[str, Any] = {"features": self.features}
        if self.features == "fbank":
            mine.update(num_mel_bins=self.num_mel_bins, sampling_rate=self.sampling_rate)
        mine["stack_frames"] = self.stack_frames
        bad = [k for k, v in mine.items() if s.get(k) != v]
        if bad:
            raise ValueError(
                " and ".join(f"data.{k}: {mine[k]!r}" for k in bad)
                + f", but the model of {what} was trained on {_describe_settings(s)} (set "
                + " ".join(f"data.{k}={s.get(k)!r}" for k in bad)
                + ")"
            )
        if s["feature_dim"] != self.feature_dim:
            raise ValueError(
                f"data: {self.feature_dim} features per frame, but the model of {what} was trained on "
                f"{_describe_settings(s)}, {s['feature_dim']} per frame"
            )
        norm = s["normalization"]
        self._norm = None if norm is None else (torch.tensor(norm["mean"]), torch.tensor(norm["std"]))
        self._norm_given = True

    def _normalised(self, loader):
        stats = self.normalization()
        return loader if stats is None else _Normalised(loader, *stats)

    def setup(self, stage: str | None = None) -> None:
        """Reads and checks the manifests of the stage (``fit``: train and val; ``validate``: val;
        ``test``/``predict``: test), once."""
        names = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("test",)}.get(
            stage or "", ("train", "val", "test")
        )
        for n in names:
            setattr(self, f"{n}_set", self.split(n))
        if self.features == "precomputed":
            for n in names:
                s = self.split(n)
                if s.num_features != self.feature_dim // self.stack_frames:
                    raise ValueError(
                        f"{s.what}: precomputed features have {s.num_features} per frame but the training "
                        f"split's have {self.feature_dim // self.stack_frames}"
                    )

    # ---------------------------------------------------------------- loaders
    def _loader(self, name: str, train: bool) -> CutBatchLoader:
        ws, rank = _world()
        if ws == 1 and self.trainer is not None and self.trainer.world_size > 1:  # process group not up yet
            ws, rank = self.trainer.world_size, self.trainer.global_rank
        split = self._cached(name) if self.feature_cache is not None else self.split(name)
        loader = CutBatchLoader(self, split, train=train, world_size=ws, rank=rank, num_workers=self.num_workers)
        if train:
            loader.before_iter = self._start_epoch
        return loader

    def train_dataloader(self):
        """The training batches (shuffled per epoch, sharded by rank, resumable; normalised by
        :meth:`normalization`)."""
        self._train_loader = self._loader("train", True)
        return self._normalised(self._train_loader)

    def val_dataloader(self):
        """The validation batches (in manifest order within buckets, sharded by rank)."""
        return self._normalised(self._loader("val", False))

    def test_dataloader(self):
        """The test batches (``test_cuts``, or the validation cuts)."""
        return self._normalised(self._loader("test", False))

    def predict_dataloader(self) -> CutBatchLoader:
        """The test batches."""
        return self.test_dataloader()

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next training pass when no trainer is attached (a trainer's
        ``current_epoch`` is used otherwise)."""
        self._epoch = int(epoch)

    def _current_epoch(self) -> int:
        trainer = self.trainer
        return int(trainer.current_epoch) if trainer is not None else self._epoch

    def _start_epoch(self, dataset: CutBatchLoader) -> None:
        # the data epoch: the trainer's, or the one a checkpoint continues (which may be one ahead
        # of the trainer's counter: Lightning creates the first iterator before it moves on from
        # an epoch that ended with the checkpoint)
        resume, self._resume = self._resume, None
        epoch = resume["epoch"] if resume is not None else self._current_epoch()
        dataset.epoch, dataset.skip = epoch, 0
        if resume is not None:
            skip = resume["batches"]
            if resume["world_size"] != dataset.world_size:
                skip = (skip * resume["world_size"]) // dataset.world_size
                warnings.warn(
                    f"data: resuming on {dataset.world_size} processes a run that had {resume['world_size']}: "
                    f"the epoch continues after about {skip} batches per process, not exactly where it stopped",
                    stacklevel=2,
                )
            dataset.skip = skip
        self._data_epoch = epoch
        self._skipped = dataset.skip

    # ---------------------------------------------------------------- resuming
    def state_dict(self) -> dict:
        """Where the training pass stands: ``{"epoch", "batches" (consumed in it), "world_size",
        "seed"}`` (plain data; Lightning stores it in checkpoints). An epoch whose last batch was
        consumed is saved as the next epoch with no batch consumed."""
        trainer = self.trainer
        epoch = self._data_epoch if self._data_epoch is not None else self._current_epoch()
        if trainer is not None:
            progress = trainer.fit_loop.epoch_loop.batch_progress
            batches = int(progress.current.processed)  # type: ignore[attr-defined]
            if progress.is_last_batch and batches > 0:
                epoch, batches = epoch + 1, 0
        else:
            loader = self._train_loader
            batches = (loader.yielded + self._skipped) if loader is not None else 0
        ws = self._train_loader.world_size if self._train_loader is not None else _world()[0]
        return {"epoch": int(epoch), "batches": batches, "world_size": int(ws), "seed": self.seed}

    def load_state_dict(self, state_dict: dict) -> None:
        """Makes the next training pass of the saved epoch skip the batches already consumed
        (checked: a checkpoint is outside data)."""
        if not isinstance(state_dict, dict):
            raise ValueError(f"data state: expected a dict, got {type(state_dict).__name__}")
        clean = {}
        for k in ("epoch", "batches", "world_size", "seed"):
            v = state_dict.get(k)
            if (
                isinstance(v, bool)
                or not isinstance(v, int)
                or v < (1 if k == "world_size" else 0 if k != "seed" else -(2**63))
            ):
                raise ValueError(f"data state: {k} must be an integer, got {v!r}")
            clean[k] = v
        if clean["seed"] != self.seed:
            warnings.warn(
                f"data: the checkpoint's data.seed is {clean['seed']}, this run's is {self.seed}: the resumed epoch "
                "draws other batches",
                stacklevel=2,
            )
        self._resume = clean
