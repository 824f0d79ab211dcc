"""The embedded spoken task: eSpeak NG synthesis, the generated cache, its Lhotse manifests."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import torch

pytest.importorskip("espeakng_loader", reason="the [speech] extra (espeakng-loader) is not installed")
pytest.importorskip("lhotse", reason="the [speech] extra (lhotse) is not installed")

from lightning_gtn.lightning import spoken  # noqa: E402
from lightning_gtn.lightning.text import TEXT_CHARS  # noqa: E402

# a task small enough for tests: 2 voices x 2 variants (one pair per split at least)
TINY = dict(
    num_train=6,
    num_val=3,
    num_test=3,
    voices=("en-us", "en-gb"),
    variants=("", "f3"),
    max_chars=24,
    progress=False,
)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("speech")
    return root, spoken.make_spoken_task(root, seed=3, **TINY)


def test_synthesise_gives_16khz_float_audio_of_plausible_length():
    text = "the old dog sees a cat"
    audio = spoken.synthesise(text, "en-us", rate=175)
    assert audio.dtype == np.float32 and audio.ndim == 1
    seconds = audio.size / spoken.SAMPLE_RATE
    # 6 words at 175 words a minute are about 2 s; eSpeak adds a little silence around them
    assert 0.8 < seconds < 4.0, seconds
    assert np.all(np.abs(audio) <= 1.0) and np.abs(audio).max() > 0.05
    # speaking faster gives less audio
    fast = spoken.synthesise(text, "en-us", rate=350)
    assert fast.size < 0.75 * audio.size


def test_synthesise_is_deterministic_whatever_came_before():
    args = dict(rate=160, pitch=60, volume=90)
    first = spoken.synthesise("the tall girl sings", "en-gb+f3", **args)  # f3 breathes: noise
    spoken.synthesise("a quiet horse walks home", "en-us+klatt", rate=220)
    again = spoken.synthesise("the tall girl sings", "en-gb", variant="f3", **args)
    assert np.array_equal(first, again)
    other = spoken.synthesise("the tall girl sings", "en-gb+m3", **args)
    assert not (other.size == first.size and np.array_equal(other, first))


def test_voices_and_variants_are_listed():
    voices = spoken.list_voices()
    assert {"en-us", "en-gb"} <= set(voices) and all(v.startswith("en") for v in voices)
    assert len(spoken.list_voices(None)) > len(voices)
    assert {"f3", "m1", "klatt"} <= set(spoken.list_variants())


@pytest.mark.parametrize(
    "voice, kw, match",
    [
        ("xx-nowhere", {}, "unknown eSpeak NG voice 'xx-nowhere'.*en-us"),
        ("en-us+nobody", {}, "unknown eSpeak NG voice variant 'nobody'"),
        ("en-us", {"rate": 5000}, r"rate must be an integer in \[80, 450\]"),
    ],
)
def test_bad_voice_or_setting_gives_a_clear_error(voice, kw, match):
    with pytest.raises(ValueError, match=match):
        spoken.synthesise("hello", voice, **kw)


def test_bad_text_is_refused():
    for text, match in [("", "empty"), ("a\0b", "NUL"), ("x" * 5000, "at most")]:
        with pytest.raises(ValueError, match=match):
            spoken.synthesise(text)


def test_room_impulse_and_noise():
    rng = np.random.default_rng(0)
    h = spoken.room_impulse(rng, 0.3)
    assert h.shape == (4800,) and h[0] == 1.0 and np.abs(h).max() == 1.0
    # the tail decays: its last tenth holds much less energy than its first tenth
    assert np.sum(h[1:480] ** 2) > 100 * np.sum(h[-480:] ** 2)
    x = np.sin(np.arange(16000) * 0.05).astype(np.float32) * 0.5
    y = spoken.degrade(x, np.random.default_rng(1), snr_db=20.0)
    snr = 10 * np.log10(np.mean(x**2) / np.mean((y - x) ** 2))
    assert abs(snr - 20.0) < 0.5


def test_voices_are_split_disjointly():
    split = spoken.split_voices(spoken.DEFAULT_VOICES, spoken.DEFAULT_VARIANTS, seed=0)
    sets = [set(split[k]) for k in ("train", "val", "test")]
    assert sum(map(len, sets)) == len(spoken.DEFAULT_VOICES) * len(spoken.DEFAULT_VARIANTS)
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    assert min(map(len, sets)) >= 1
    with pytest.raises(ValueError, match="at least 3"):
        spoken.split_voices(["en-us"], [""], seed=0)


def _supervisions(path):
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def test_task_manifests_read_by_lhotse_and_splits_disjoint(task):
    from lhotse import CutSet

    root, paths = task
    sentences, voices = {}, {}
    for split, path in paths.items():
        cuts = CutSet.from_file(path)
        assert len(cuts) == TINY[f"num_{split}"]
        sentences[split] = {c.supervisions[0].text for c in cuts}
        voices[split] = {c.supervisions[0].speaker for c in cuts}
        cut = next(iter(cuts))
        audio = cut.load_audio()
        assert audio.shape == (1, cut.recording.num_samples) and cut.sampling_rate == 16000
        assert set(cut.supervisions[0].text) <= set(TEXT_CHARS)
    for a, b in [("train", "val"), ("train", "test"), ("val", "test")]:
        assert not sentences[a] & sentences[b], (a, b)
        assert not voices[a] & voices[b], (a, b)


def test_task_is_deterministic_and_cached(task, tmp_path):
    root, paths = task
    folder = paths["train"].parent
    stamp = (folder / "COMPLETE.json").stat().st_mtime_ns
    # a complete cache is reused untouched
    assert spoken.make_spoken_task(root, seed=3, **TINY) == paths
    assert (folder / "COMPLETE.json").stat().st_mtime_ns == stamp
    # the same settings elsewhere give bit-identical files
    again = spoken.make_spoken_task(tmp_path, seed=3, **TINY)
    assert again["train"].parent.name == folder.name
    for f in sorted((folder / "audio").rglob("*.flac")):
        twin = again["train"].parent / f.relative_to(folder)
        assert twin.read_bytes() == f.read_bytes(), f.name
    # another seed gives another task folder
    assert spoken.make_spoken_task(tmp_path, seed=4, **TINY)["train"].parent.name != folder.name


def test_partial_cache_is_rebuilt(tmp_path):
    paths = spoken.make_spoken_task(tmp_path, seed=5, **TINY)
    folder = paths["train"].parent
    victim = sorted((folder / "audio" / "val").iterdir())[0]
    victim.unlink()
    paths = spoken.make_spoken_task(tmp_path, seed=5, **TINY)
    assert victim.is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_data_module_reads_the_task_through_lhotse(task):
    root, paths = task
    dm = spoken.SpokenTaskDataModule(
        cache_dir=str(root), seed=3, num_mel_bins=20, stack_frames=2, max_duration=30.0, **TINY
    )
    assert dm.task_dir == paths["train"].parent
    assert dm.chars == TEXT_CHARS and dm.feature_dim == 40
    dm.setup("fit")
    assert len(dm.train_set.texts) == TINY["num_train"]
    batch = next(iter(dm.train_dataloader()))
    x, lengths = batch["inputs"], batch["input_lengths"]
    assert x.dtype.is_floating_point and x.shape[0] == len(batch["texts"]) and x.shape[2] == 40
    assert int(lengths.max()) == x.shape[1]
    assert set(batch["texts"]) <= set(dm.train_set.texts)
    # normalised with the training split's statistics: about zero mean, unit variance, padding 0
    mask = torch.arange(x.shape[1])[None, :] < lengths[:, None]
    assert abs(float(x[mask].mean())) < 0.5 and 0.5 < float(x[mask].std()) < 1.5
    assert not x[~mask].any()
    mean, std = dm.feature_stats()
    assert mean.shape == std.shape == (40,) and bool((std > 0).all())
