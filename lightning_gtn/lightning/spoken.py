"""The embedded spoken task: the text task's sentences spoken by eSpeak NG (no download).

eSpeak NG (GPL-3.0-or-later) is not part of this package: the optional ``espeakng-loader`` wheel
(``pip install lightning_gtn[speech]``) ships its shared library and voice data, which this module
loads at run time through :mod:`ctypes` (``espeak_Initialize`` in synchronous mode, a callback
collecting the samples). Nothing of eSpeak NG is copied here.

- :func:`synthesise`: one sentence, one voice (``"en-us"``, ``"en-gb-scotland+f3"``, ...), a rate,
  pitch and volume, as float32 audio at 16 kHz.
- :func:`list_voices` / :func:`list_variants`: the installed voices (language codes) and the
  ``!v/`` variants (``f3``, ``m2``, ``klatt``, ...) that can follow a voice after ``+``.
- :func:`make_spoken_task`: the sentences of :func:`~lightning_gtn.lightning.text.make_sentences`
  spoken by many voices with random rate, pitch, volume, a simple room impulse and noise, written
  as FLAC files and Lhotse manifests into a cache folder; splits disjoint by sentence and by voice.
- :class:`SpokenTaskDataModule`: ``data=speech``; generates the task once into the cache and reads
  it back through :class:`~lightning_gtn.lightning.lhotse_data.LhotseDataModule`.

eSpeak NG keeps state between utterances (its pitch flutter and noise generators), so the same
call twice in one process gives different samples. :func:`synthesise` therefore loads the library
afresh for each utterance (about 5 ms): the same arguments always give bit-identical audio.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..files import read_regular
from ..integers import check_int
from .lhotse_data import CutBatchLoader, LhotseDataModule
from .text import TEXT_CHARS

__all__ = [
    "SAMPLE_RATE",
    "DEFAULT_VOICES",
    "DEFAULT_VARIANTS",
    "synthesise",
    "list_voices",
    "list_variants",
    "room_impulse",
    "degrade",
    "split_voices",
    "default_cache_dir",
    "task_key",
    "make_spoken_task",
    "SpokenTaskDataModule",
]

#: the most utterances one split of the spoken task may ask for (generation time and disk are
#: linear in it: about 10 ms and 55 kB an utterance)
MAX_UTTERANCES = 200_000

#: the sample rate of everything this module returns and writes
SAMPLE_RATE = 16000
#: English voices of eSpeak NG used by default (language codes, see :func:`list_voices`)
DEFAULT_VOICES = (
    "en-us",
    "en-gb",
    "en-029",
    "en-gb-scotland",
    "en-gb-x-gbclan",
    "en-gb-x-gbcwmd",
    "en-gb-x-rp",
    "en-us-nyc",
)
#: voice variants (files of eSpeak NG's ``voices/!v``) used by default; ``""`` is the plain voice
DEFAULT_VARIANTS = (
    "",
    "m1",
    "m2",
    "m3",
    "m4",
    "m5",
    "m6",
    "m7",
    "f1",
    "f2",
    "f3",
    "f4",
    "f5",
    "klatt",
    "klatt2",
    "klatt3",
)

_MAX_TEXT_CHARS = 2000
_RANGES = {"rate": (80, 450), "pitch": (0, 99), "volume": (0, 200)}

# espeak_AUDIO_OUTPUT, espeak_PARAMETER, flags (speak_lib.h of eSpeak NG)
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000
_CHARS_UTF8 = 1
_POS_CHARACTER = 1
_PARAM = {"rate": 1, "volume": 2, "pitch": 3}
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class _Voice(ctypes.Structure):
    # espeak_VOICE
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_void_p),
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    ]


def _loader():
    try:
        import espeakng_loader  # type: ignore[import-untyped]
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the spoken task needs eSpeak NG through the optional 'espeakng-loader' package: "
            "pip install 'lightning_gtn[speech]' (or pip install espeakng-loader)"
        ) from e
    return espeakng_loader


def _dlclose():
    """libc's (or libdl's) ``dlclose``, to unload the library between utterances."""
    for name in (None, ctypes.util.find_library("dl")):
        try:
            fn = ctypes.CDLL(name).dlclose
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_void_p]
        fn.restype = ctypes.c_int
        return fn
    return None


def _set_seed(lib, seed: int) -> None:
    fn = getattr(lib, "espeak_ng_SetRandSeed", None)
    if fn is None:  # pragma: no cover - eSpeak NG < 1.52 has no seed: its noise follows the clock
        return
    fn.argtypes = [ctypes.c_long]
    fn.restype = None
    fn(int(seed))


class _Engine:
    """eSpeak NG loaded by ctypes; every call under :data:`_LOCK` (the library is one global state)."""

    def __init__(self) -> None:
        loader = _loader()
        self.path = str(loader.get_library_path())
        self.data = str(loader.get_data_path())
        self.chunks: list[np.ndarray] = []
        self.callback = _CALLBACK(self._collect)  # a reference kept while the library may call it
        self.dlclose = _dlclose()
        self.set_seed = _set_seed
        lib, self.rate = self._open()
        self.voices = self._read_voices(lib)
        self._close(lib)
        vdir = Path(self.data) / "voices" / "!v"
        self.variants = sorted(p.name for p in vdir.iterdir() if p.is_file()) if vdir.is_dir() else []

    def _collect(self, wav, n, events) -> int:
        if wav and n > 0:
            self.chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        return 0

    def _open(self):
        lib = ctypes.CDLL(self.path)
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = [_CALLBACK]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.espeak_Synth.restype = ctypes.c_int
        lib.espeak_ListVoices.argtypes = [ctypes.c_void_p]
        lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_Voice))
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, self.data.encode(), _INITIALIZE_DONT_EXIT)
        if rate <= 0:
            raise RuntimeError(f"eSpeak NG failed to initialise (library {self.path}, data {self.data})")
        lib.espeak_SetSynthCallback(self.callback)
        return lib, int(rate)

    def _close(self, lib) -> None:
        lib.espeak_Terminate()
        handle = lib._handle
        del lib
        if self.dlclose is not None:
            self.dlclose(handle)

    @staticmethod
    def _read_voices(lib) -> dict[str, str]:
        """language code -> voice file identifier, for every installed voice."""
        out: dict[str, str] = {}
        voices = lib.espeak_ListVoices(None)
        i = 0
        while voices[i]:
            v = voices[i].contents
            ident = v.identifier.decode()
            # languages: (priority byte, NUL-terminated code) pairs, ended by a zero byte
            # (the first is the voice's own code; later ones are fallbacks such as plain "en")
            p = v.languages
            if p and ctypes.c_ubyte.from_address(p).value != 0:
                out.setdefault(ctypes.string_at(p + 1).decode().lower(), ident)
            i += 1
        return out

    def synth(self, text: str, name: str, params: dict[str, int]) -> np.ndarray:
        """int16 samples at :attr:`rate` of ``text`` spoken by voice ``name`` (identifier[+variant])."""
        lib, _ = self._open()
        try:
            # espeak_Initialize seeds the breath-noise generator from the clock: reseed it
            if self.set_seed is not None:
                self.set_seed(lib, 0)
            if lib.espeak_SetVoiceByName(name.encode()) != 0:
                raise ValueError(f"eSpeak NG could not select voice {name!r}")
            for key, value in params.items():
                if lib.espeak_SetParameter(_PARAM[key], int(value), 0) != 0:
                    raise RuntimeError(f"eSpeak NG refused {key}={value}")
            data = text.encode("utf-8") + b"\0"
            self.chunks = []
            err = lib.espeak_Synth(data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
            if err != 0:
                raise RuntimeError(f"eSpeak NG failed to synthesise {text!r} (error {err})")
            chunks, self.chunks = self.chunks, []
        finally:
            self._close(lib)
        return np.concatenate(chunks) if chunks else np.zeros(0, np.int16)


_LOCK = threading.Lock()
_ENGINE: _Engine | None = None


def _engine() -> _Engine:
    global _ENGINE
    if _ENGINE is None:
        _ENGINE = _Engine()
    return _ENGINE


def list_voices(language: str | None = "en") -> list[str]:
    """The language codes of eSpeak NG's installed voices (what :func:`synthesise` takes).

    Args:
        language: keep the codes equal to it or starting with ``language + "-"`` (``"en"``: every
            English voice: ``en-029``, ``en-gb``, ``en-gb-scotland``, ``en-us``, ...); None: all.
    """
    with _LOCK:
        codes = sorted(_engine().voices)
    if language is None:
        return codes
    language = language.lower()
    return [c for c in codes if c == language or c.startswith(language + "-")]


def list_variants() -> list[str]:
    """The names of eSpeak NG's voice variants (``voices/!v``: ``f1``..``f5``, ``m1``..``m7``,
    ``klatt``, ``croak``, ``whisper``, ...), which follow a voice after ``+`` (``"en-us+f3"``)."""
    with _LOCK:
        return list(_engine().variants)


def _resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    if src == dst:
        return x
    from math import gcd

    from scipy.signal import resample_poly

    g = gcd(src, dst)
    return resample_poly(x, dst // g, src // g).astype(np.float32)


def synthesise(
    text: str,
    voice: str = "en-us",
    *,
    rate: int = 175,
    pitch: int = 50,
    volume: int = 100,
    variant: str | None = None,
) -> np.ndarray:
    """Speaks ``text`` with eSpeak NG: float32 mono audio at 16 kHz (:data:`SAMPLE_RATE`).

    Deterministic: the same arguments give bit-identical samples (the library is loaded afresh
    for each call). Thread-safe (calls are serialised by a lock); each process loads its own copy.

    Args:
        text: the words (UTF-8, at most 2000 characters, no NUL).
        voice: a language code of :func:`list_voices` (``"en-us"``, ``"en-gb"``, ...), optionally
            followed by ``+variant`` (``"en-us+f3"``).
        rate: speaking rate in words per minute, 80..450 (eSpeak's default 175).
        pitch: base pitch, 0..99 (default 50).
        volume: amplitude, 0..200 (default 100; above 100 may clip).
        variant: a name of :func:`list_variants` (``"f3"``, ``"klatt"``); or give it in ``voice``.

    Returns:
        ``(N,)`` float32 in [-1, 1], 16 kHz.

    Raises:
        ImportError: ``espeakng-loader`` (the ``[speech]`` extra) is not installed.
        ValueError: an unknown voice or variant (the message lists the installed ones), an empty
            or too long text, a NUL in it, or rate/pitch/volume out of range.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text.strip():
        raise ValueError("text is empty")
    if len(text) > _MAX_TEXT_CHARS:
        raise ValueError(f"text has {len(text)} characters, at most {_MAX_TEXT_CHARS} are allowed")
    if "\0" in text:
        raise ValueError("text contains a NUL character")
    if not isinstance(voice, str):
        raise TypeError(f"voice must be a str, got {type(voice).__name__}")
    base, _, var = voice.partition("+")
    if variant is not None:
        if var and var != variant:
            raise ValueError(f"voice {voice!r} names variant {var!r} but variant={variant!r}")
        var = variant
    params = {k: check_int(v, k, *_RANGES[k]) for k, v in (("rate", rate), ("pitch", pitch), ("volume", volume))}
    with _LOCK:
        engine = _engine()
        ident = engine.voices.get(base.lower())
        if ident is None:
            english = sorted(c for c in engine.voices if c.startswith("en"))
            raise ValueError(
                f"unknown eSpeak NG voice {base!r}; English ones: {', '.join(english)} "
                f"(all {len(engine.voices)}: lightning_gtn.lightning.spoken.list_voices(None))"
            )
        if var and var not in engine.variants:
            raise ValueError(f"unknown eSpeak NG voice variant {var!r}; installed: {', '.join(engine.variants)}")
        samples = engine.synth(text, f"{ident}+{var}" if var else ident, params)
        src_rate = engine.rate
    audio = samples.astype(np.float32) / 32768.0
    return np.clip(_resample(audio, src_rate, SAMPLE_RATE), -1.0, 1.0).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Degradations: a simple room and noise.


def room_impulse(rng: np.random.Generator, rt60: float, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """A simple room impulse response: a direct path then exponentially decaying Gaussian noise.

    The tail decays by 60 dB over ``rt60`` seconds (its length), starts 2.5 ms after the direct
    path and carries about half of the direct path's energy per 0.1 s of ``rt60``, capped.

    Returns:
        ``(L,)`` float32 with ``L = max(1, round(rt60 * sample_rate))``, peak 1 at index 0.
    """
    if not 0.0 <= float(rt60) <= 2.0:
        raise ValueError(f"rt60 must be in [0, 2] seconds, got {rt60}")
    n = max(1, int(round(rt60 * sample_rate)))
    h = np.zeros(n, np.float64)
    h[0] = 1.0
    start = min(n, int(0.0025 * sample_rate))
    if n > start:
        t = np.arange(n - start) / sample_rate
        tail = rng.standard_normal(n - start) * np.exp(-6.91 * t / rt60)
        energy = min(1.5, 5.0 * rt60)  # tail energy relative to the direct path
        tail *= np.sqrt(energy / max(float(np.sum(tail**2)), 1e-12))
        h[start:] = tail
    return (h / np.max(np.abs(h))).astype(np.float32)


def degrade(
    audio: np.ndarray, rng: np.random.Generator, *, rt60: float = 0.0, snr_db: float | None = None
) -> np.ndarray:
    """Reverberates ``audio`` with :func:`room_impulse` (``rt60 > 0``) at its own peak level, then
    adds white Gaussian noise at ``snr_db`` dB below the signal's mean power (None: none).

    Returns:
        float32 of the same length, clipped to [-1, 1].
    """
    x = np.asarray(audio, np.float64)
    if x.size == 0:
        return x.astype(np.float32)
    peak = float(np.max(np.abs(x)))
    if rt60 > 0:
        from scipy.signal import fftconvolve

        y = fftconvolve(x, room_impulse(rng, rt60).astype(np.float64))[: x.size]
        ypeak = float(np.max(np.abs(y)))
        if ypeak > 0:
            y *= peak / ypeak
        x = y
    if snr_db is not None:
        power = float(np.mean(x**2))
        x = x + rng.standard_normal(x.size) * np.sqrt(power / 10 ** (snr_db / 10))
    return np.clip(x, -1.0, 1.0).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# The task.

_SPLITS = ("train", "val", "test")
_FORMAT_VERSION = 1
_COMPLETE = "COMPLETE.json"


def default_cache_dir() -> Path:
    """``$LIGHTNING_GTN_CACHE/speech``, else ``$XDG_CACHE_HOME/lightning_gtn/speech``, else
    ``~/.cache/lightning_gtn/speech``."""
    root = os.environ.get("LIGHTNING_GTN_CACHE")
    if root:
        return Path(root).expanduser() / "speech"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (
        Path(xdg).expanduser() / "lightning_gtn" / "speech"
        if xdg
        else Path.home() / ".cache" / "lightning_gtn" / "speech"
    )


def split_voices(
    voices: Sequence[str], variants: Sequence[str], seed: int, fractions: Sequence[float] = (0.8, 0.1, 0.1)
) -> dict[str, list[str]]:
    """Every ``voice+variant`` (``""`` in ``variants``: the plain voice) assigned to one split.

    Deterministic in ``seed``; each split gets at least one voice, so no voice speaks in two splits.

    Raises:
        ValueError: fewer than 3 voices in all, duplicates, or bad ``fractions``.
    """
    names = [f"{v}+{var}" if var else v for v in voices for var in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"voices x variants has duplicates: {names}")
    if len(names) < 3:
        raise ValueError(f"need at least 3 voices x variants (one per split), got {names}")
    if len(fractions) != 3 or any(f < 0 for f in fractions) or sum(fractions) <= 0:
        raise ValueError(f"voice_split must be 3 non-negative fractions, got {list(fractions)}")
    order = np.random.default_rng([seed, 7]).permutation(len(names))
    total = float(sum(fractions))
    n_val = max(1, int(round(fractions[1] / total * len(names))))
    n_test = max(1, int(round(fractions[2] / total * len(names))))
    n_train = len(names) - n_val - n_test
    if n_train < 1:
        raise ValueError(f"voice_split {list(fractions)} leaves no training voice of {len(names)}")
    picked = [names[i] for i in order]
    return {
        "train": sorted(picked[:n_train]),
        "val": sorted(picked[n_train : n_train + n_val]),
        "test": sorted(picked[n_train + n_val :]),
    }


def _pair(name: str, value, cast=float) -> list:
    if isinstance(value, (int, float)):
        value = (value, value)
    value = list(value)
    if len(value) != 2 or value[0] > value[1]:
        raise ValueError(f"{name} must be a [min, max] pair, got {value}")
    return [cast(value[0]), cast(value[1])]


def _settings(**kw) -> dict[str, Any]:
    """The settings that determine the task's audio, as plain JSON data."""
    kw["voices"] = [str(v) for v in kw["voices"]]
    kw["variants"] = [str(v) for v in kw["variants"]]
    kw["voice_split"] = [float(v) for v in kw["voice_split"]]
    for name in ("rate", "pitch", "volume"):
        kw[name] = _pair(name, kw[name], int)
        lo, hi = _RANGES[name]
        if kw[name][0] < lo or kw[name][1] > hi:
            raise ValueError(f"{name} must lie in [{lo}, {hi}], got {kw[name]}")
    kw["snr_db"] = _pair("snr_db", kw["snr_db"])
    kw["rt60"] = _pair("rt60", kw["rt60"])
    if not 0.0 <= float(kw["reverb_prob"]) <= 1.0:
        raise ValueError(f"reverb_prob must be in [0, 1], got {kw['reverb_prob']}")
    kw["reverb_prob"] = float(kw["reverb_prob"])
    if kw["audio_format"] not in ("flac", "wav"):
        raise ValueError(f"audio_format must be 'flac' or 'wav', got {kw['audio_format']!r}")
    for name in ("num_train", "num_val", "num_test"):
        if not 1 <= int(kw[name]) <= MAX_UTTERANCES:
            raise ValueError(f"{name} must lie in [1, {MAX_UTTERANCES}], got {kw[name]}")
        kw[name] = int(kw[name])
    kw["seed"] = int(kw["seed"])
    kw["max_chars"] = int(kw["max_chars"])
    try:
        from importlib.metadata import version

        kw["espeakng_loader"] = version("espeakng-loader")
    except Exception:  # pragma: no cover - not installed as a distribution
        kw["espeakng_loader"] = "unknown"
    kw["format_version"] = _FORMAT_VERSION
    return kw


def task_key(settings: dict[str, Any]) -> str:
    """The cache folder name of a task: 16 hex digits of the SHA-256 of its settings."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def _plan(settings: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict per utterance: split, id, text, voice, rate, pitch, volume, rt60, snr_db, seed."""
    from .text import make_sentences

    s = settings
    sizes = [s["num_train"], s["num_val"], s["num_test"]]
    sentences = make_sentences(sum(sizes), s["seed"], s["max_chars"])
    voices = split_voices(s["voices"], s["variants"], s["seed"], s["voice_split"])
    items = []
    start = 0
    for k, (split, n) in enumerate(zip(_SPLITS, sizes)):
        rng = np.random.default_rng([s["seed"], 11, k])
        names = voices[split]
        for i, text in enumerate(sentences[start : start + n]):
            reverb = bool(rng.random() < s["reverb_prob"])
            items.append(
                {
                    "split": split,
                    "id": f"{split}-{i:06d}",
                    "text": text,
                    "voice": names[int(rng.integers(len(names)))],
                    "rate": int(rng.integers(s["rate"][0], s["rate"][1] + 1)),
                    "pitch": int(rng.integers(s["pitch"][0], s["pitch"][1] + 1)),
                    "volume": int(rng.integers(s["volume"][0], s["volume"][1] + 1)),
                    "rt60": round(float(rng.uniform(*s["rt60"])), 4) if reverb else 0.0,
                    "snr_db": round(float(rng.uniform(*s["snr_db"])), 2),
                    "seed": [s["seed"], 13, k, i],
                }
            )
        start += n
    return items


def _render(item: dict[str, Any], folder: str, audio_format: str) -> tuple[str, int]:
    """Synthesises, degrades and writes one utterance; returns (id, number of samples)."""
    import soundfile as sf

    audio = synthesise(item["text"], item["voice"], rate=item["rate"], pitch=item["pitch"], volume=item["volume"])
    audio = degrade(audio, np.random.default_rng(item["seed"]), rt60=item["rt60"], snr_db=item["snr_db"])
    path = os.path.join(folder, "audio", item["split"], f"{item['id']}.{audio_format}")
    sf.write(path, audio, SAMPLE_RATE, subtype="PCM_16", format=audio_format.upper())
    return item["id"], int(audio.size)


def _render_many(items: list[dict[str, Any]], folder: str, audio_format: str) -> list[tuple[str, int]]:
    return [_render(it, folder, audio_format) for it in items]


def _is_complete(folder: Path, settings: dict[str, Any]) -> bool:
    try:
        done = json.loads(read_regular(folder / _COMPLETE, "spoken task marker", 1 << 20).decode("utf-8"))
    except (OSError, ValueError):  # missing, not a regular file (a link to /dev/zero), too large, not JSON
        return False
    if not isinstance(done, dict):
        return False
    if done.get("settings") != settings:
        return False
    for split in _SPLITS:
        if not (folder / f"cuts_{split}.jsonl.gz").is_file():
            return False
        audio = folder / "audio" / split
        n = sum(1 for _ in audio.iterdir()) if audio.is_dir() else 0
        if n != settings[f"num_{split}"]:
            return False
    return True


def _manifest_paths(folder: Path) -> dict[str, Path]:
    return {split: folder / f"cuts_{split}.jsonl.gz" for split in _SPLITS}


def make_spoken_task(
    out_dir: str | os.PathLike | None = None,
    *,
    num_train: int = 4000,
    num_val: int = 300,
    num_test: int = 300,
    seed: int = 0,
    voices: Sequence[str] = DEFAULT_VOICES,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    voice_split: Sequence[float] = (0.8, 0.1, 0.1),
    max_chars: int = 40,
    rate: Sequence[int] = (100, 160),
    pitch: Sequence[int] = (25, 75),
    volume: Sequence[int] = (60, 140),
    snr_db: Sequence[float] = (15.0, 40.0),
    reverb_prob: float = 0.3,
    rt60: Sequence[float] = (0.1, 0.4),
    audio_format: str = "flac",
    num_workers: int = 0,
    progress: bool = True,
) -> dict[str, Path]:
    """Generates the spoken task (once) and returns the paths of its Lhotse cut manifests.

    Sentences come from :func:`~lightning_gtn.lightning.text.make_sentences` (``seed``,
    ``max_chars``), distinct across splits. Every ``voice+variant`` speaks in one split only
    (:func:`split_voices`). Per utterance, drawn from ``seed``: a voice of its split, a rate
    (words per minute), pitch and volume in the given ranges, with probability ``reverb_prob`` a
    room (:func:`room_impulse`, ``rt60`` seconds), and white noise at ``snr_db``. Audio is 16 kHz
    mono 16-bit ``audio_format`` files.

    The task goes to ``out_dir/<task_key(settings)>`` (``out_dir`` defaults to
    :func:`default_cache_dir`): ``audio/<split>/<id>.flac``, ``recordings_<split>.jsonl.gz``,
    ``supervisions_<split>.jsonl.gz``, ``cuts_<split>.jsonl.gz`` (absolute audio paths) and
    ``COMPLETE.json``. A complete folder of the same settings is reused as it is; anything else is
    rebuilt in a temporary folder beside it and renamed into place, so an interrupted run never
    leaves a folder that looks complete. Deterministic: the same settings give bit-identical
    audio, whatever ``num_workers``.

    Args:
        num_workers: processes synthesising in parallel (0: this process).
        progress: show a tqdm progress bar.

    Returns:
        ``{"train": path, "val": path, "test": path}`` of the cut manifests (``.jsonl.gz``).
    """
    settings = _settings(
        num_train=num_train,
        num_val=num_val,
        num_test=num_test,
        seed=seed,
        voices=voices,
        variants=variants,
        voice_split=voice_split,
        max_chars=max_chars,
        rate=rate,
        pitch=pitch,
        volume=volume,
        snr_db=snr_db,
        reverb_prob=reverb_prob,
        rt60=rt60,
        audio_format=audio_format,
    )
    root = Path(out_dir).expanduser() if out_dir is not None else default_cache_dir()
    final = root / task_key(settings)
    if _is_complete(final, settings):
        return _manifest_paths(final)
    # check the voices before anything is written (a clear error naming the bad one)
    installed, installed_variants = set(list_voices(None)), set(list_variants())
    for v in settings["voices"]:
        if v.lower() not in installed:
            raise ValueError(f"unknown eSpeak NG voice {v!r}; English ones: {', '.join(list_voices('en'))}")
    for v in settings["variants"]:
        if v and v not in installed_variants:
            raise ValueError(
                f"unknown eSpeak NG voice variant {v!r}; installed: {', '.join(sorted(installed_variants))}"
            )
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{final.name}.tmp-{os.getpid()}-{threading.get_ident()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        _generate(settings, tmp, final, num_workers, progress)
        if final.exists():
            if _is_complete(final, settings):  # another process finished first
                shutil.rmtree(tmp)
                return _manifest_paths(final)
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _manifest_paths(final)


def _generate(settings: dict[str, Any], tmp: Path, final: Path, num_workers: int, progress: bool) -> None:
    from lhotse import AudioSource, CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet
    from tqdm.auto import tqdm

    items = _plan(settings)
    fmt = settings["audio_format"]
    for split in _SPLITS:
        (tmp / "audio" / split).mkdir(parents=True)
    lengths: dict[str, int] = {}
    bar = tqdm(total=len(items), desc="synthesising the spoken task (eSpeak NG)", unit="utt", disable=not progress)
    try:
        if num_workers > 0:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor, as_completed

            # spawn, never fork: the parent may hold numba/OpenMP threads and eSpeak's state
            chunk = max(1, min(200, len(items) // (4 * num_workers) or 1))
            with ProcessPoolExecutor(num_workers, mp_context=mp.get_context("spawn")) as pool:
                futures = [
                    pool.submit(_render_many, items[i : i + chunk], str(tmp), fmt) for i in range(0, len(items), chunk)
                ]
                for f in as_completed(futures):
                    done = f.result()
                    lengths.update(done)
                    bar.update(len(done))
        else:
            for it in items:
                key, n = _render(it, str(tmp), fmt)
                lengths[key] = n
                bar.update(1)
    finally:
        bar.close()
    for split in _SPLITS:
        recordings, supervisions = [], []
        for it in items:
            if it["split"] != split:
                continue
            n = lengths[it["id"]]
            path = final / "audio" / split / f"{it['id']}.{fmt}"
            recordings.append(
                Recording(
                    id=it["id"],
                    sources=[AudioSource(type="file", channels=[0], source=str(path))],
                    sampling_rate=SAMPLE_RATE,
                    num_samples=n,
                    duration=n / SAMPLE_RATE,
                )
            )
            supervisions.append(
                SupervisionSegment(
                    id=it["id"],
                    recording_id=it["id"],
                    start=0.0,
                    duration=n / SAMPLE_RATE,
                    channel=0,
                    text=it["text"],
                    speaker=it["voice"],
                    language="English",
                    custom={k: it[k] for k in ("rate", "pitch", "volume", "rt60", "snr_db")},
                )
            )
        recs = RecordingSet.from_recordings(recordings)
        sups = SupervisionSet.from_segments(supervisions)
        recs.to_file(tmp / f"recordings_{split}.jsonl.gz")
        sups.to_file(tmp / f"supervisions_{split}.jsonl.gz")
        CutSet.from_manifests(recordings=recs, supervisions=sups).to_file(tmp / f"cuts_{split}.jsonl.gz")
    hours = sum(lengths.values()) / SAMPLE_RATE / 3600
    (tmp / _COMPLETE).write_text(json.dumps({"settings": settings, "hours": round(hours, 4)}, indent=1, sort_keys=True))


class SpokenTaskDataModule(LhotseDataModule):
    """``data=speech``: the embedded spoken task, generated once into a cache and read back
    through :class:`~lightning_gtn.lightning.lhotse_data.LhotseDataModule` (the real speech path:
    Lhotse manifests, duration buckets, on-the-fly filterbanks).

    The task (see :func:`make_spoken_task`) is generated into ``cache_dir/<task_key>`` before its
    manifests are first read (``prepare_data``, or ``setup`` / ``chars`` without a trainer), once:
    a complete folder of the same settings is reused. The vocabulary is the text task's
    characters (``chars``).

    Args:
        cache_dir: the cache root (None: :func:`default_cache_dir`).
        num_train, num_val, num_test, seed, voices, variants, voice_split, max_chars, rate, pitch,
            volume, snr_db, reverb_prob, rt60, audio_format: the task; see :func:`make_spoken_task`.
        generation_workers: processes synthesising the task (0: the calling process).
        progress: show a progress bar while generating.
        features, num_mel_bins, max_duration, num_buckets, shuffle, spec_augment, num_workers,
            chars, max_cut_duration, stack_frames: see
            :class:`~lightning_gtn.lightning.lhotse_data.LhotseDataModule`; ``seed`` is also the
            sampler's.
        cache_features: keep the filterbanks in ``task_dir/features`` (LhotseDataModule's
            ``feature_cache``): computed once from the audio by the same code as on the fly, then
            read by every epoch and run.
        normalize: scale every feature of the batches to zero mean and unit variance with
            statistics of the training split (its first 32 batches in manifest order; padding
            stays 0). Log-mel filterbanks sit around -2 with per-channel offsets; the small
            default encoder learns several times faster from normalised inputs.
    """

    def __init__(
        self,
        cache_dir: str | None = None,
        num_train: int = 4000,
        num_val: int = 300,
        num_test: int = 300,
        seed: int = 0,
        voices: Sequence[str] = DEFAULT_VOICES,
        variants: Sequence[str] = DEFAULT_VARIANTS,
        voice_split: Sequence[float] = (0.8, 0.1, 0.1),
        max_chars: int = 40,
        rate: Sequence[int] = (100, 160),
        pitch: Sequence[int] = (25, 75),
        volume: Sequence[int] = (60, 140),
        snr_db: Sequence[float] = (15.0, 40.0),
        reverb_prob: float = 0.3,
        rt60: Sequence[float] = (0.1, 0.4),
        audio_format: str = "flac",
        generation_workers: int = 0,
        progress: bool = True,
        *,
        features: str = "fbank",
        num_mel_bins: int = 40,
        max_duration: float = 32.0,
        num_buckets: int = 10,
        shuffle: bool = True,
        spec_augment: bool | dict = False,
        num_workers: int = 0,
        chars: str | None = TEXT_CHARS,
        max_cut_duration: float = 30.0,
        stack_frames: int = 2,
        cache_features: bool = True,
        normalize: bool = True,
    ):
        # plain data in the saved hyper-parameters (Hydra passes ListConfigs), so a checkpoint
        # loads with torch.load(weights_only=True)
        voices, variants = [str(v) for v in voices], [str(v) for v in variants]
        voice_split = [float(v) for v in voice_split]
        rate, pitch, volume = (_pair(n, v, int) for n, v in (("rate", rate), ("pitch", pitch), ("volume", volume)))
        snr_db, rt60 = _pair("snr_db", snr_db), _pair("rt60", rt60)
        if isinstance(generation_workers, bool) or not isinstance(generation_workers, int) or generation_workers < 0:
            raise ValueError(f"data.generation_workers: must be an integer >= 0, got {generation_workers!r}")
        self.task_settings = _settings(
            num_train=num_train,
            num_val=num_val,
            num_test=num_test,
            seed=seed,
            voices=voices,
            variants=variants,
            voice_split=voice_split,
            max_chars=max_chars,
            rate=rate,
            pitch=pitch,
            volume=volume,
            snr_db=snr_db,
            reverb_prob=reverb_prob,
            rt60=rt60,
            audio_format=audio_format,
        )
        self.cache_root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        #: the folder of this task's audio and manifests
        self.task_dir = self.cache_root / task_key(self.task_settings)
        paths = _manifest_paths(self.task_dir)
        super().__init__(
            str(paths["train"]),
            str(paths["val"]),
            str(paths["test"]),
            features=features,
            num_mel_bins=num_mel_bins,
            sampling_rate=SAMPLE_RATE,
            max_duration=max_duration,
            num_buckets=num_buckets,
            shuffle=shuffle,
            spec_augment=spec_augment,
            num_workers=num_workers,
            seed=seed,
            chars=chars,
            max_cut_duration=max_cut_duration,
            stack_frames=stack_frames,
            feature_cache=str(self.task_dir / "features") if cache_features and features == "fbank" else None,
        )
        self.generation_workers = generation_workers
        self.progress = bool(progress)
        self.normalize = bool(normalize)
        self._stats: tuple[Any, Any] | None = None

    def generate(self) -> dict[str, Path]:
        """Generates the task into :attr:`task_dir` unless it is complete there; returns the
        manifest paths (see :func:`make_spoken_task`)."""
        s = {k: v for k, v in self.task_settings.items() if k not in ("espeakng_loader", "format_version")}
        return make_spoken_task(self.cache_root, num_workers=self.generation_workers, progress=self.progress, **s)

    def prepare_sources(self) -> None:
        """Generates the task (once: a complete cache is reused) before its manifests are read."""
        paths = self.generate()
        self.sources = {k: str(v) for k, v in paths.items()}

    def prepare_data(self) -> None:
        """Generates the task and fills the feature cache (Lightning calls it on one process per
        node before ``setup``)."""
        self.generate()
        super().prepare_data()

    def feature_stats(self):
        """``(mean, std)``, each ``(feature_dim,)`` float32: the statistics :attr:`normalize` uses,
        from the first 32 batches of the training split in manifest order (computed once)."""
        import torch

        if self._stats is None:
            split = self._cached("train") if self.feature_cache is not None else self.split("train")
            total = torch.zeros(self.feature_dim, dtype=torch.float64)
            square = torch.zeros(self.feature_dim, dtype=torch.float64)
            count = 0
            for i, batch in enumerate(CutBatchLoader(self, split, train=False)):
                if i >= 32:
                    break
                x, lengths = batch["inputs"], batch["input_lengths"]
                mask = torch.arange(x.shape[1])[None, :] < lengths[:, None]
                v = x[mask].double()
                total += v.sum(0)
                square += (v * v).sum(0)
                count += v.shape[0]
            mean = total / max(count, 1)
            std = (square / max(count, 1) - mean * mean).clamp(min=1e-6).sqrt()
            self._stats = (mean.float(), std.float())
        return self._stats

    def normalization(self):
        """``(mean, std)`` of :meth:`feature_stats` when ``normalize`` is set (every loader's
        batches are scaled by them), or a checkpoint's (see ``apply_feature_settings``)."""
        if self._norm is None and self.normalize and not self._norm_given:
            self._norm = self.feature_stats()
        return self._norm
