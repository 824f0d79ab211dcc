"""Speech from outside the library: a folder of audio files with transcripts, a HF dataset on disk.

Both give a Lhotse ``CutSet`` (one mono cut per utterance, one supervision holding its
transcript, resampled to 16 kHz where the audio has another rate), which
:class:`~lightning_gtn.lightning.lhotse_data.LhotseDataModule` reads like any manifest:

- :func:`cuts_from_folder`: ``.wav`` / ``.flac`` files under a folder and their transcripts, either
  transcript files of ``<id> <text>`` lines (``transcripts.txt``, LibriSpeech's ``*.trans.txt``),
  CMU Sphinx ``<s> text </s> (id)`` lines (``*.transcription``, the layout of Debian's
  ``pocketsphinx-testdata``), or a ``<name>.txt`` beside each audio file (``transcripts=None``).
- :func:`cuts_from_hf`: a ``datasets.Dataset`` / ``DatasetDict`` written by ``save_to_disk`` (or a
  local folder that ``datasets.load_dataset`` reads), with an audio column and a text column. The
  audio is decoded by soundfile from the stored bytes or path, never by ``datasets``' own decoder
  (it needs torchcodec), and nothing ever touches the network (``HF_HUB_OFFLINE`` is set while
  ``datasets`` runs).
- :class:`HFDataModule`: ``data=hf``, a :class:`LhotseDataModule` over the splits of such a dataset.

Everything read from a file is bounded before it is allocated (audio duration, channels, bytes,
transcript length) and a bad file, row or column gives a ``ValueError`` naming it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import math
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..files import open_regular, text_lines
from .lhotse_data import MAX_RATE, MIN_RATE, LhotseDataModule, check_resample
from .vocabulary import MAX_TRANSCRIPT_CHARS, check_transcript

__all__ = [
    "SAMPLING_RATE",
    "AUDIO_SUFFIXES",
    "cuts_from_folder",
    "cuts_from_hf",
    "HFDataModule",
]

#: The sampling rate every cut is resampled to (the filterbanks of LhotseDataModule expect it).
SAMPLING_RATE = 16000
#: Audio file suffixes :func:`cuts_from_folder` collects (case-insensitive).
AUDIO_SUFFIXES = (".wav", ".flac")

# Bounds on what a file may make us allocate.
_MAX_CHANNELS = 32
_MAX_SAMPLES = 1 << 28  # frames x channels of one recording (1 GiB as float32)
_MAX_TEXT_CHARS = MAX_TRANSCRIPT_CHARS  # one transcript
_MAX_LINE_CHARS = 1 << 20  # one line of a transcript file
_MAX_ROWS = 50_000_000  # rows of one HF split
# CMU Sphinx transcript lines: "<s> some words </s> (utterance_id)"
_SPHINX_LINE = re.compile(r"^(?P<text>.*)\((?P<id>[^()\s]+)\)\s*$")
_SPHINX_MARKS = frozenset({"<s>", "</s>", "<sil>"})


# ----------------------------------------------------------------------------- audio and cuts


def _audio_info(source: str | bytes, what: str, max_audio_seconds: float) -> tuple[int, int, int]:
    """``(sampling_rate, channels, frames)`` of an audio file or encoded bytes, bounds checked."""
    import soundfile as sf

    if isinstance(source, str) and not os.path.isfile(source):  # a pipe would block soundfile forever
        raise ValueError(f"{what}: not a regular file")
    try:
        info = sf.info(io.BytesIO(source) if isinstance(source, bytes) else source)
    except Exception as e:  # soundfile raises its own LibsndfileError / RuntimeError / TypeError
        raise ValueError(f"{what}: not a readable audio file (wav/flac/ogg through soundfile): {e}") from None
    sr, ch, frames = int(info.samplerate), int(info.channels), int(info.frames)
    if not MIN_RATE <= sr <= MAX_RATE:
        raise ValueError(f"{what}: sampling rate {sr} Hz outside [{MIN_RATE}, {MAX_RATE}]")
    if not 1 <= ch <= _MAX_CHANNELS:
        raise ValueError(f"{what}: {ch} channels, expected 1 to {_MAX_CHANNELS}")
    if frames <= 0:
        raise ValueError(f"{what}: the audio is empty (0 samples)")
    if frames > max_audio_seconds * sr or frames * ch > _MAX_SAMPLES:
        raise ValueError(
            f"{what}: {frames / sr:.1f} s of audio ({ch} channels) is longer than max_audio_seconds="
            f"{max_audio_seconds:g} (or {_MAX_SAMPLES} samples); cut it into utterances or raise the bound"
        )
    return sr, ch, frames


def _clean_text(text: Any, what: str) -> str:
    """The transcript with its whitespace collapsed, checked (bounded, printable)."""
    if not isinstance(text, str):
        raise ValueError(f"{what}: the transcript must be a string, got {type(text).__name__}")
    if len(text) > _MAX_TEXT_CHARS:
        raise ValueError(f"{what}: the transcript has {len(text)} characters (at most {_MAX_TEXT_CHARS})")
    return check_transcript(" ".join(text.split()), what, max_chars=_MAX_TEXT_CHARS)


def _make_cut(
    cut_id: str, source_type: str, source: str | bytes, info: tuple[int, int, int], text: str, rate: int, what: str
):
    """A mono cut (channel 0) over the whole recording with one supervision, at ``rate`` Hz: audio
    at another rate is resampled as it is read (Lhotse's ``Recording.resample``, a transform in the
    manifest: nothing is decoded or held here)."""
    from lhotse import MonoCut, Recording, SupervisionSegment
    from lhotse.audio import AudioSource

    sr, ch, frames = info
    recording = Recording(
        id=cut_id,
        sources=[AudioSource(type=source_type, channels=list(range(ch)), source=source)],
        sampling_rate=sr,
        num_samples=frames,
        duration=frames / sr,
    )
    if sr != rate:
        check_resample(sr, rate, what)
        recording = recording.resample(rate)
    sup = SupervisionSegment(
        id=cut_id, recording_id=cut_id, start=0.0, duration=recording.duration, channel=0, text=text
    )
    return MonoCut(
        id=cut_id, start=0.0, duration=recording.duration, channel=0, recording=recording, supervisions=[sup]
    )


def _check_rate(sampling_rate: int) -> int:
    if isinstance(sampling_rate, bool) or not isinstance(sampling_rate, int):
        raise ValueError(f"sampling_rate must be an int, got {sampling_rate!r}")
    if not MIN_RATE <= sampling_rate <= MAX_RATE:
        raise ValueError(f"sampling_rate={sampling_rate} outside [{MIN_RATE}, {MAX_RATE}]")
    return sampling_rate


def _check_seconds(max_audio_seconds: float) -> float:
    if not (isinstance(max_audio_seconds, (int, float)) and 0 < max_audio_seconds < math.inf):
        raise ValueError(f"max_audio_seconds must be a positive finite number, got {max_audio_seconds!r}")
    return float(max_audio_seconds)


def _inside(path: Path, root: Path, what: str, allow_outside: bool) -> Path:
    """``path`` resolved (symlinks followed), refused unless it lies in ``root`` or
    ``allow_outside`` (the option named in the message) is set."""
    real = path.resolve()
    if not allow_outside and not real.is_relative_to(root.resolve()):
        raise ValueError(
            f"{what}: {path} resolves to {real}, outside {root}; a dataset's paths are read inside its folder "
            "(pass allow_outside_paths=True, data.allow_outside_paths=true, to read files elsewhere)"
        )
    return real


# ----------------------------------------------------------------------------- a folder


def _walk(folder: Path, pattern: str | None, max_files: int) -> tuple[list[Path], list[Path]]:
    """Audio files and transcript files (names matching ``pattern``) under ``folder``, sorted."""
    audio: list[Path] = []
    texts: list[Path] = []
    for root, dirs, files in os.walk(folder):  # does not follow symlinked folders: no loops
        dirs.sort()
        for name in sorted(files):
            p = Path(root) / name
            if p.suffix.lower() in AUDIO_SUFFIXES:
                audio.append(p)
                if len(audio) > max_files:
                    raise ValueError(f"{folder}: more than max_files={max_files} audio files")
            elif pattern is not None and fnmatch.fnmatch(name, pattern):
                texts.append(p)
    return audio, texts


def _read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Non-empty lines of a UTF-8 text file with their numbers; a line is at most ``_MAX_LINE_CHARS``."""
    try:
        f = open_regular(path, "transcript file", "r", encoding="utf-8")
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read the transcript file: {e}") from None
    with f:
        yield from text_lines(f, path, _MAX_LINE_CHARS)


def _read_whole(path: Path) -> str:
    """The lines of a ``<name>.txt`` transcript joined by spaces, reading at most ``_MAX_TEXT_CHARS``."""
    parts: list[str] = []
    size = 0
    for n, line in _read_lines(path):
        size += len(line) + 1
        if size > _MAX_TEXT_CHARS + 1:
            raise ValueError(f"{path}:{n}: the transcript is longer than {_MAX_TEXT_CHARS} characters")
        parts.append(line)
    return " ".join(parts)


def _parse_transcripts(paths: Sequence[Path], ids: dict[str, Path]) -> dict[str, str]:
    """``{id: text}`` from transcript files, for the ids in ``ids`` (other ids are ignored).

    A line is ``<id> <text>``, or a CMU Sphinx line ``<s> text </s> (<id>)`` when its
    parenthesised last word is an audio id and its first word is not (Sphinx's ``<s>``,
    ``</s>`` and ``<sil>`` marks are dropped).
    """
    out: dict[str, str] = {}
    where: dict[str, str] = {}
    for path in paths:
        for n, line in _read_lines(path):
            parts = line.split(maxsplit=1)
            m = _SPHINX_LINE.match(line)
            if parts[0] not in ids and m is not None and m.group("id") in ids:
                uid = m.group("id")
                text = " ".join(w for w in m.group("text").split() if w.lower() not in _SPHINX_MARKS)
            elif parts[0] in ids:
                uid = parts[0]
                text = parts[1] if len(parts) > 1 else ""
            else:
                continue  # an utterance whose audio is not in the folder
            if uid in out:
                raise ValueError(f"{path}:{n}: duplicate transcript for {uid!r} (first at {where[uid]})")
            out[uid] = _clean_text(text, f"{path}:{n}")
            where[uid] = f"{path}:{n}"
    return out


def cuts_from_folder(
    folder: str | os.PathLike,
    *,
    transcripts: str | None = "transcripts.txt",
    sampling_rate: int = SAMPLING_RATE,
    missing: str = "error",
    lowercase: bool = False,
    max_audio_seconds: float = 600.0,
    max_files: int = 1_000_000,
    allow_outside_paths: bool = False,
):
    """A Lhotse ``CutSet`` from the audio files under ``folder`` and their transcripts.

    Every ``.wav`` / ``.flac`` file under ``folder`` (recursively, symlinked folders not followed)
    is one utterance whose id is the file name without its suffix (ids must be unique). The cut
    is mono (the first channel of a multi-channel file), covers the whole file, and is resampled
    to ``sampling_rate`` when the file has another rate; its one supervision holds the transcript
    (whitespace collapsed).

    Args:
        folder: the folder.
        transcripts: where the transcripts are.

            - a file name or a glob pattern (``"transcripts.txt"``, ``"*.trans.txt"`` for
              LibriSpeech, ``"*transcription"`` for CMU Sphinx test data): every file under
              ``folder`` whose name matches, each line ``<id> <text>`` or ``<s> text </s> (<id>)``;
              or the path of one such file (absolute, or relative to ``folder``);
            - ``None``: a ``<name>.txt`` beside each ``<name>.wav`` holding its whole transcript.
        sampling_rate: the rate of the cuts (16 kHz: what the filterbanks expect).
        missing: ``"error"`` (default) when an audio file has no transcript, or ``"skip"`` it.
        lowercase: lower-case the transcripts (LibriSpeech's are upper case).
        max_audio_seconds: longest audio file accepted (longer ones are an error: cut them first).
        max_files: most audio files accepted.
        allow_outside_paths: read audio and transcript files under ``folder`` that are symlinks to
            files elsewhere (by default such a file is an error naming it).

    Returns:
        An eager ``CutSet`` in file-path order.

    Raises:
        FileNotFoundError: no such folder, or no transcript file matches ``transcripts``.
        ValueError: a bad audio file, transcript file or line (naming it), duplicate ids, an audio
            file without a transcript (``missing="error"``), or no utterance at all.

    Example:
        >>> folder = "/usr/share/pocketsphinx/test/data"  # Debian's pocketsphinx-testdata
        >>> cuts = cuts_from_folder(folder, transcripts="*transcription")  # doctest: +SKIP
    """
    from lhotse import CutSet

    sampling_rate = _check_rate(sampling_rate)
    max_audio_seconds = _check_seconds(max_audio_seconds)
    if missing not in ("error", "skip"):
        raise ValueError(f"missing must be 'error' or 'skip', got {missing!r}")
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"audio folder not found: {folder}")
    if transcripts is not None and not isinstance(transcripts, str):
        raise ValueError(f"transcripts must be a file name, a glob pattern or None, got {transcripts!r}")
    single: Path | None = None
    if transcripts is not None and not any(c in transcripts for c in "*?["):
        candidate = Path(transcripts) if Path(transcripts).is_absolute() else root / transcripts
        if candidate.is_file():
            single = candidate
    pattern = None if transcripts is None or single is not None else Path(transcripts).name
    audio, text_files = _walk(root, pattern, max_files)
    for p in text_files:
        _inside(p, root, "transcript file", allow_outside_paths)
    if not audio:
        raise ValueError(f"{folder}: no audio files ({', '.join(AUDIO_SUFFIXES)}) in this folder or below")
    ids: dict[str, Path] = {}
    for p in audio:
        if p.stem in ids:
            raise ValueError(f"two audio files with the id {p.stem!r}: {ids[p.stem]} and {p}; ids must be unique")
        ids[p.stem] = p

    if transcripts is None:
        texts: dict[str, str] = {}
        for uid, p in ids.items():
            t = p.with_suffix(".txt")
            if t.is_file():
                texts[uid] = _clean_text(_read_whole(t), str(t))
    else:
        if single is not None:
            text_files = [single]
        if not text_files:
            raise FileNotFoundError(
                f"{folder}: no transcript file named {transcripts!r} in this folder or below; give "
                "transcripts='*.trans.txt' (LibriSpeech), '*.transcription' (CMU Sphinx), a file path, or "
                "None for a <name>.txt beside each audio file"
            )
        texts = _parse_transcripts(text_files, ids)

    cuts = []
    for uid, p in ids.items():
        if uid not in texts:
            if missing == "skip":
                continue
            where = f"{p.with_suffix('.txt')}" if transcripts is None else f"{[str(t) for t in text_files][:3]}"
            raise ValueError(f"{p}: no transcript for the id {uid!r} (looked in {where}); or pass missing='skip'")
        text = texts[uid].lower() if lowercase else texts[uid]
        real = _inside(p, root, "audio file", allow_outside_paths)
        info = _audio_info(str(p), str(p), max_audio_seconds)
        cuts.append(_make_cut(uid, "file", str(real), info, text, sampling_rate, str(p)))
    if not cuts:
        raise ValueError(f"{folder}: no audio file has a transcript")
    return CutSet.from_cuts(cuts)


# ----------------------------------------------------------------------------- HF datasets


@contextlib.contextmanager
def _hf_offline() -> Iterator[Any]:
    """``datasets`` with the hub switched off (environment and module flags), restored afterwards."""
    import datasets
    import datasets.config

    hub_constants: Any
    try:
        import huggingface_hub.constants as hub_constants
    except ImportError:  # pragma: no cover - datasets depends on it
        hub_constants = None
    keys = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    env = {k: os.environ.get(k) for k in keys}
    flags = [(datasets.config, k, getattr(datasets.config, k)) for k in keys if hasattr(datasets.config, k)]
    if hub_constants is not None and hasattr(hub_constants, "HF_HUB_OFFLINE"):
        flags.append((hub_constants, "HF_HUB_OFFLINE", hub_constants.HF_HUB_OFFLINE))
    os.environ.update({k: "1" for k in keys})
    for mod, k, _ in flags:
        setattr(mod, k, True)
    try:
        yield datasets
    finally:
        for mod, k, v in flags:
            setattr(mod, k, v)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_SPLIT_SPEC = re.compile(r"^(?P<name>[^\[\]]*)(?:\[(?P<a>(?:-?\d{1,18}%?)?):(?P<b>(?:-?\d{1,18}%?)?)\])?$")


def _parse_split(split: str | None) -> tuple[str | None, str | None, str | None]:
    """``"train[:90%]"`` -> ``("train", "", "90%")``; ``None`` -> ``(None, None, None)``."""
    if split is None:
        return None, None, None
    m = _SPLIT_SPEC.match(split.strip()) if isinstance(split, str) else None
    if m is None:
        raise ValueError(
            f"split {split!r}: expected a split name with an optional slice, e.g. 'train', 'train[:90%]', "
            "'validation[100:]', or '[:10%]' for a dataset without splits"
        )
    return m.group("name") or None, m.group("a"), m.group("b")


def _slice_bound(s: str | None, n: int, default: int) -> int:
    if not s:
        return default
    v = int(s.rstrip("%"))
    if s.endswith("%"):
        v = int(round(v * n / 100))
    if v < 0:
        v += n
    return min(max(v, 0), n)


_HF_CACHE: list = []  # the process's private datasets cache (a TemporaryDirectory), made on first use


def _hf_cache_dir() -> str:
    """A folder for the Arrow files ``datasets.load_dataset`` converts a folder of data files into:
    private to this process and removed when it exits, instead of ``~/.cache/huggingface``
    (reading a dataset writes nothing that outlives the run)."""
    import tempfile

    if not _HF_CACHE:
        _HF_CACHE.append(tempfile.TemporaryDirectory(prefix="lightning_gtn_hf_"))
    return _HF_CACHE[0].name


def _load_hf_split(path: str | os.PathLike, split: str | None):
    """The ``datasets.Dataset`` of one split (sliced), loaded from a local folder offline."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(
            f"HF dataset folder not found: {path} (give the folder written by Dataset.save_to_disk; "
            "datasets are never downloaded here)"
        )
    name, a, b = _parse_split(split)
    with _hf_offline() as datasets:
        saved = any((root / f).is_file() for f in ("dataset_dict.json", "state.json"))
        try:
            if saved:
                data = datasets.load_from_disk(str(root))
            else:
                data = datasets.load_dataset(str(root), cache_dir=_hf_cache_dir())
        except Exception as e:
            raise ValueError(f"{path}: not a readable HF dataset folder: {type(e).__name__}: {e}") from None
    if isinstance(data, datasets.DatasetDict):
        names = sorted(data.keys())
        if name is None:
            if len(names) != 1:
                raise ValueError(f"{path}: the dataset has the splits {names}; choose one with split=")
            name = names[0]
        if name not in data:
            raise ValueError(f"{path}: no split {name!r}; the dataset has {names}")
        ds = data[name]
    else:
        if name is not None and str(data.split or "") != name:
            raise ValueError(
                f"{path}: a single Dataset (split {data.split!r}) has no split {name!r}; use split=None or "
                "a slice such as '[:90%]'"
            )
        ds = data
    n = ds.num_rows
    if n > _MAX_ROWS:
        raise ValueError(f"{path}: split {name!r} has {n} rows (at most {_MAX_ROWS})")
    if a is not None or b is not None:
        lo, hi = _slice_bound(a, n, 0), _slice_bound(b, n, n)
        ds = ds.select(range(lo, max(lo, hi)))
    return ds, name


def _audio_kind(ds, column: str, path) -> str:
    """How the audio column is stored: ``"struct"`` (HF Audio: bytes + path), ``"array"``
    (samples + sampling_rate), ``"bytes"`` (encoded file) or ``"path"`` (a file name)."""
    import pyarrow as pa

    if column not in ds.column_names:
        raise ValueError(f"{path}: no audio column {column!r}; the columns are {ds.column_names} (audio_column=)")
    t = ds.data.schema.field(column).type
    if pa.types.is_struct(t):
        names = {t.field(i).name for i in range(t.num_fields)}
        if {"bytes", "path"} <= names:
            return "struct"
        if {"array", "sampling_rate"} <= names:
            return "array"
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytes"
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        return "path"
    raise ValueError(
        f"{path}: audio column {column!r} has the arrow type {t}; expected an Audio feature (bytes + path), "
        "encoded bytes, a file path, or {array, sampling_rate}"
    )


def _check_text_column(ds, column: str, path) -> None:
    import pyarrow as pa

    if column not in ds.column_names:
        raise ValueError(f"{path}: no text column {column!r}; the columns are {ds.column_names} (text_column=)")
    t = ds.data.schema.field(column).type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise ValueError(f"{path}: text column {column!r} has the arrow type {t}, expected strings")


class _HFCuts:
    """A re-iterable, picklable source of cuts over the rows of one HF split (a lazy ``CutSet``).

    The audio of a row is kept as its encoded bytes (a Lhotse in-memory source) or as a file path,
    and decoded by Lhotse (soundfile) only when a batch loads it. Header facts are read once, in
    the constructor, so that iterating is cheap and the durations are known to the sampler.
    """

    _BATCH = 64

    def __init__(
        self,
        ds,
        audio_column,
        text_column,
        kind,
        root,
        prefix,
        rate,
        lowercase,
        max_audio_seconds,
        max_audio_bytes,
        allow_outside_paths=False,
    ):
        self.ds = ds
        self.allow_outside_paths = bool(allow_outside_paths)
        self.lowercase = bool(lowercase)
        self.audio_column, self.text_column, self.kind = audio_column, text_column, kind
        self.root, self.prefix, self.rate = str(root), prefix, rate
        self.max_audio_bytes = max_audio_bytes
        n = ds.num_rows
        self.info = np.zeros((n, 3), dtype=np.int32)  # rate, channels, frames: each < 2**31 (bounded)
        self.files: dict[int, str] = {}
        for row, audio, text in self._rows():
            what = f"{root}: row {row} of audio column {audio_column!r}"
            _clean_text(text, f"{root}: row {row} of text column {text_column!r}")
            if isinstance(audio, tuple):  # (samples, sampling_rate)
                samples, sr = audio
                if not MIN_RATE <= sr <= MAX_RATE or samples == 0 or samples > max_audio_seconds * sr:
                    raise ValueError(f"{what}: {samples} samples at {sr} Hz (bounds: max_audio_seconds etc.)")
                self.info[row] = (sr, 1, samples)
            elif isinstance(audio, bytes):
                self.info[row] = _audio_info(audio, what, max_audio_seconds)
            else:
                self.files[row] = audio
                self.info[row] = _audio_info(audio, f"{what} ({audio})", max_audio_seconds)

    def _resolve(self, p: str, what: str) -> str:
        q = Path(p) if Path(p).is_absolute() else Path(self.root) / p
        real = _inside(q, Path(self.root), f"{what}: audio path {p!r}", self.allow_outside_paths)
        if not real.is_file():
            raise ValueError(f"{what}: no audio bytes and no such file {p!r}")
        if real.stat().st_size > self.max_audio_bytes:
            raise ValueError(f"{what}: {q} is larger than max_audio_bytes={self.max_audio_bytes}")
        return str(real)

    def _rows(self) -> Iterator[tuple[int, Any, Any]]:
        """``(row, audio, text)``: audio as bytes, a resolved file path, or ``(samples, rate)``;
        bytes and sample counts are checked on the arrow arrays before any Python copy."""
        import pyarrow as pa
        import pyarrow.compute as pc

        table_ds = self.ds.select_columns([self.audio_column, self.text_column]).with_format("arrow")
        row = 0
        for batch in table_ds.iter(batch_size=self._BATCH):
            col = batch.column(self.audio_column).combine_chunks()
            text_col = batch.column(self.text_column)
            too_long = pc.greater(pc.binary_length(text_col), 4 * _MAX_TEXT_CHARS)  # UTF-8: <= 4 bytes a char
            if pc.any(too_long).as_py():
                bad = row + int(pc.index(too_long, True).as_py())
                raise ValueError(
                    f"{self.root}: row {bad} of text column {self.text_column!r}: the transcript is longer than "
                    f"{_MAX_TEXT_CHARS} characters"
                )
            texts = text_col.to_pylist()
            if self.kind == "struct":
                data, paths = col.field("bytes"), col.field("path")
            elif self.kind == "bytes":
                data, paths = col, pa.nulls(len(col), pa.string())
            elif self.kind == "path":
                data, paths = pa.nulls(len(col), pa.binary()), col
            else:
                data, paths = col.field("array"), col.field("sampling_rate")
            if self.kind == "array":
                lengths = pc.list_value_length(data).to_pylist()
                rates = paths.to_pylist()
            else:
                lengths = pc.binary_length(data).to_pylist()
            for i in range(len(col)):
                what = f"{self.root}: row {row} of audio column {self.audio_column!r}"
                if self.kind == "array":
                    if lengths[i] is None or not isinstance(rates[i], int):
                        raise ValueError(f"{what}: missing samples or sampling_rate")
                    if lengths[i] > _MAX_SAMPLES:
                        raise ValueError(f"{what}: {lengths[i]} samples (at most {_MAX_SAMPLES})")
                    yield row, (int(lengths[i]), int(rates[i])), texts[i]
                elif lengths[i] is not None:
                    if lengths[i] > self.max_audio_bytes:
                        raise ValueError(
                            f"{what}: {lengths[i]} bytes of audio (max_audio_bytes={self.max_audio_bytes})"
                        )
                    yield row, data[i].as_py(), texts[i]
                else:
                    p = paths[i].as_py()
                    if not p:
                        raise ValueError(f"{what}: neither audio bytes nor a file path")
                    yield row, self.files.get(row) or self._resolve(p, what), texts[i]
                row += 1

    def _encode(self, row: int) -> bytes:
        """The samples of an ``{array, sampling_rate}`` row as float WAV bytes (read on demand)."""
        import soundfile as sf

        rec = self.ds.select_columns([self.audio_column]).with_format("arrow")[row : row + 1]
        cell = rec.column(self.audio_column)[0]
        samples = np.asarray(cell["array"].values.to_numpy(zero_copy_only=False), dtype=np.float32)
        if not np.isfinite(samples).all():
            raise ValueError(f"{self.root}: row {row} of audio column {self.audio_column!r}: NaN or inf samples")
        buf = io.BytesIO()
        sf.write(buf, samples, int(self.info[row, 0]), format="WAV", subtype="FLOAT")
        return buf.getvalue()

    def __len__(self) -> int:
        return int(self.info.shape[0])

    def __iter__(self):
        for row, audio, text in self._rows():
            sr, ch, frames = (int(v) for v in self.info[row])
            info = (sr, ch, frames)
            cut_id = f"{self.prefix}{row:08d}"
            what = f"{self.root}: row {row} of audio column {self.audio_column!r}"
            text = _clean_text(text, what)
            text = text.lower() if self.lowercase else text
            if isinstance(audio, tuple):
                audio = self._encode(row)
            source_type = "memory" if isinstance(audio, bytes) else "file"
            yield _make_cut(cut_id, source_type, audio, info, text, self.rate, what)


def cuts_from_hf(
    path: str | os.PathLike,
    *,
    audio_column: str = "audio",
    text_column: str = "text",
    split: str | None = None,
    sampling_rate: int = SAMPLING_RATE,
    lowercase: bool = False,
    max_audio_seconds: float = 600.0,
    max_audio_bytes: int = 256 << 20,
    allow_outside_paths: bool = False,
):
    """A lazy Lhotse ``CutSet`` over one split of a HF dataset saved on disk.

    ``path`` is a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, or a
    local folder of data files that ``datasets.load_dataset(path)`` reads (parquet, csv, an audio
    folder); never a hub name (nothing is downloaded: the hub is switched off while ``datasets``
    runs). The audio column may be an ``Audio`` feature (its stored bytes, or its path when the
    bytes are absent; a relative path is taken from ``path``), encoded bytes, a file path, or a
    struct of ``array`` + ``sampling_rate``. It is decoded by soundfile (through Lhotse), never by
    ``datasets``' decoder, mono (first channel) and resampled to ``sampling_rate``.

    Args:
        path: the dataset folder.
        audio_column, text_column: the column names.
        split: a split name of a ``DatasetDict`` (``None``: its only split, or the whole
            ``Dataset``), with an optional slice in HF's notation: ``"train[:90%]"``,
            ``"train[-100:]"``, ``"[:10%]"``.
        sampling_rate: the rate of the cuts.
        lowercase: lower-case the transcripts.
        max_audio_seconds: longest audio of one row; max_audio_bytes: largest encoded audio of one row.
        allow_outside_paths: read audio paths that resolve outside ``path`` (absolute paths,
            ``../``, symlinks); by default such a row is an error naming it and the path.

    Returns:
        A lazy ``CutSet`` (re-iterable, picklable); cut ids ``<split>-<row>``. Every row's header
        and transcript are checked here, once, so a bad row fails now, not in the middle of an epoch.

    Raises:
        FileNotFoundError: no such folder.
        ValueError: not a dataset, unknown split or column (naming the columns there), a column of
            the wrong type, or a bad row (naming the row and the column).
    """
    from lhotse import CutSet

    sampling_rate = _check_rate(sampling_rate)
    max_audio_seconds = _check_seconds(max_audio_seconds)
    if isinstance(max_audio_bytes, bool) or not isinstance(max_audio_bytes, int) or max_audio_bytes <= 0:
        raise ValueError(f"max_audio_bytes must be a positive int, got {max_audio_bytes!r}")
    ds, name = _load_hf_split(path, split)
    kind = _audio_kind(ds, audio_column, path)
    _check_text_column(ds, text_column, path)
    if ds.num_rows == 0:
        raise ValueError(f"{path}: split {split!r} has no rows")
    source = _HFCuts(
        ds,
        audio_column,
        text_column,
        kind,
        Path(path),
        f"{name or 'hf'}-",
        sampling_rate,
        lowercase,
        max_audio_seconds,
        max_audio_bytes,
        allow_outside_paths,
    )
    return CutSet(source)


# ----------------------------------------------------------------------------- the data module


class HFDataModule(LhotseDataModule):
    """``data=hf``: a :class:`LhotseDataModule` over the splits of a HF dataset saved on disk.

    The splits are opened and every row checked (:func:`cuts_from_hf`) when the data are first
    read (``setup``, ``chars``, a loader), not when the module is built.

    Args:
        path: the folder written by ``save_to_disk`` (or a local folder ``load_dataset`` reads).
        audio_column, text_column: the column names.
        train_split, val_split, test_split: split names (with optional slices, e.g.
            ``"train[:95%]"`` and ``"train[95%:]"`` to hold out part of a single split);
            ``test_split=None``: the validation split is also the test set.
        sampling_rate, lowercase, max_audio_seconds, max_audio_bytes, allow_outside_paths: as
            :func:`cuts_from_hf`.
        **kwargs: the options of :class:`LhotseDataModule` (features, max_duration, ...), except
            ``feature_cache`` (it caches manifest files; these cuts come from Arrow files).

    Raises:
        FileNotFoundError: no such folder (at once); the errors of :func:`cuts_from_hf` when the
            data are first read.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        audio_column: str = "audio",
        text_column: str = "text",
        train_split: str | None = "train",
        val_split: str | None = "validation",
        test_split: str | None = None,
        sampling_rate: int = SAMPLING_RATE,
        lowercase: bool = False,
        max_audio_seconds: float = 600.0,
        max_audio_bytes: int = 256 << 20,
        allow_outside_paths: bool = False,
        **kwargs: Any,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)) or not Path(path).is_dir():
            raise FileNotFoundError(
                f"data.path: HF dataset folder not found: {path} (the folder written by save_to_disk)"
            )
        if kwargs.get("feature_cache") is not None:
            raise ValueError("data.feature_cache: not available with data=hf (it caches manifest files); leave it null")
        for split in (train_split, val_split, test_split):
            _parse_split(split)  # a malformed split fails now
        self.hf_path = str(path)
        self.hf_splits = {"train": train_split, "val": val_split, "test": test_split}
        self.hf_options: dict[str, Any] = dict(
            audio_column=audio_column,
            text_column=text_column,
            sampling_rate=sampling_rate,
            lowercase=lowercase,
            max_audio_seconds=max_audio_seconds,
            max_audio_bytes=max_audio_bytes,
            allow_outside_paths=bool(allow_outside_paths),
        )
        super().__init__(None, None, None, sampling_rate=sampling_rate, **kwargs)

    def prepare_sources(self) -> None:
        """Opens the splits (offline) and checks every row: the cuts of ``train``, ``val``, ``test``."""
        cuts = {
            name: cuts_from_hf(self.hf_path, split=split, **self.hf_options)
            for name, split in self.hf_splits.items()
            if split is not None or name != "test"
        }
        cuts.setdefault("test", cuts["val"])
        self.sources = cuts
