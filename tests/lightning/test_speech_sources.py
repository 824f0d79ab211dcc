"""Speech from outside: cuts from a folder of audio + transcripts, from a HF dataset on disk,
HFDataModule batches, and real recordings (Debian's pocketsphinx-testdata) through a model."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("lhotse")
sf = pytest.importorskip("soundfile")

from lightning_gtn.lightning import ConvRNNEncoder, LhotseDataModule, Vocabulary  # noqa: E402
from lightning_gtn.lightning.speech_sources import HFDataModule, cuts_from_folder, cuts_from_hf  # noqa: E402
from lightning_gtn.nn import CTCLoss  # noqa: E402

POCKETSPHINX = Path("/usr/share/pocketsphinx/test/data")


def _tone(seconds: float, rate: int, freq: float = 440.0, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    x = (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return x if channels == 1 else np.stack([x] + [0.5 * x] * (channels - 1), axis=1)


def _wav_bytes(x: np.ndarray, rate: int, fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, rate, format=fmt)
    return buf.getvalue()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """a.wav (16 kHz, 0.5 s), sub/b.flac (8 kHz stereo, 0.25 s)."""
    (tmp_path / "sub").mkdir()
    sf.write(tmp_path / "a.wav", _tone(0.5, 16000), 16000)
    sf.write(tmp_path / "sub" / "b.flac", _tone(0.25, 8000, 300.0, channels=2), 8000)
    return tmp_path


# ----------------------------------------------------------------------------- folder


def test_folder_transcripts_file(folder: Path):
    (folder / "transcripts.txt").write_text("a  hello   world\nb good day\nnot_here ignored\n")
    cuts = cuts_from_folder(folder).to_eager()
    assert [c.id for c in cuts] == ["a", "b"]
    assert [c.supervisions[0].text for c in cuts] == ["hello world", "good day"]
    a, b = cuts
    assert a.sampling_rate == b.sampling_rate == 16000
    assert a.duration == pytest.approx(0.5) and b.duration == pytest.approx(0.25)
    audio_a = a.load_audio()
    assert audio_a.shape == (1, 8000)
    np.testing.assert_allclose(audio_a[0], _tone(0.5, 16000), atol=1e-4)  # 16-bit PCM round trip
    audio_b = b.load_audio()  # the first channel, resampled from 8 kHz
    assert audio_b.shape == (1, 4000)
    spectrum = np.abs(np.fft.rfft(audio_b[0]))
    assert np.argmax(spectrum) * 16000 / 4000 == pytest.approx(300.0, abs=8.0)


def test_folder_text_beside_each_file(folder: Path):
    (folder / "a.txt").write_text("first\nline two\n")
    (folder / "sub" / "b.txt").write_text("second")
    cuts = cuts_from_folder(folder, transcripts=None, lowercase=True)
    assert {c.id: c.supervisions[0].text for c in cuts} == {"a": "first line two", "b": "second"}


def test_folder_sphinx_and_pattern(folder: Path):
    (folder / "sub" / "x.transcription").write_text("<s> GOOD day </s> (b)\n")
    (folder / "y.transcription").write_text("<s> hello <sil> there </s> (a)\n")
    cuts = cuts_from_folder(folder, transcripts="*.transcription", lowercase=True)
    assert {c.id: c.supervisions[0].text for c in cuts} == {"a": "hello there", "b": "good day"}


def test_folder_errors_name_the_file(folder: Path):
    with pytest.raises(FileNotFoundError, match="no transcript file named 'transcripts.txt'"):
        cuts_from_folder(folder)
    (folder / "transcripts.txt").write_text("a hello\n")
    with pytest.raises(ValueError, match=r"b\.flac: no transcript for the id 'b'"):
        cuts_from_folder(folder)
    assert [c.id for c in cuts_from_folder(folder, missing="skip")] == ["a"]
    (folder / "transcripts.txt").write_text("a hello\nb x\na again\n")
    with pytest.raises(ValueError, match=r"transcripts\.txt:3: duplicate transcript for 'a'"):
        cuts_from_folder(folder)
    (folder / "transcripts.txt").write_bytes(b"a hello\nb \xff\xfe\n")
    with pytest.raises(ValueError, match=r"transcripts\.txt: not UTF-8"):
        cuts_from_folder(folder)
    (folder / "transcripts.txt").write_text("a hello\nb x\nc y\n")
    (folder / "c.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot audio at all")
    with pytest.raises(ValueError, match=r"c\.wav: not a readable audio file"):
        cuts_from_folder(folder)
    (folder / "c.wav").unlink()
    with pytest.raises(ValueError, match=r"a\.wav: 0\.5 s of audio .* longer than max_audio_seconds=0\.1"):
        cuts_from_folder(folder, max_audio_seconds=0.1)
    (folder / "sub" / "a.flac").write_bytes(b"")
    with pytest.raises(ValueError, match="two audio files with the id 'a'"):
        cuts_from_folder(folder)
    with pytest.raises(FileNotFoundError, match="audio folder not found"):
        cuts_from_folder(folder / "nope")


# ----------------------------------------------------------------------------- HF datasets


def _save_hf(path: Path, splits: dict[str, list[tuple[bytes | None, str | None]]], **columns) -> Path:
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    audio_col, text_col = columns.get("audio", "audio"), columns.get("text", "text")
    out = {}
    for name, rows in splits.items():
        ds = datasets.Dataset.from_dict(
            {audio_col: [{"bytes": b, "path": None} for b, _ in rows], text_col: [t for _, t in rows]}
        )
        out[name] = ds.cast_column(audio_col, datasets.Audio())
    datasets.DatasetDict(out).save_to_disk(str(path))
    return path


def test_hf_round_trip(tmp_path: Path):
    rows = [(_wav_bytes(_tone(0.2 + 0.1 * i, 16000, 200.0 + 50 * i), 16000), f"utterance {i}") for i in range(6)]
    rows.append((_wav_bytes(_tone(0.3, 22050, 500.0), 22050, "FLAC"), "Resampled"))
    path = _save_hf(tmp_path / "ds", {"train": rows, "validation": rows[:2]})
    cuts = cuts_from_hf(path, split="train", lowercase=True)
    assert cuts.is_lazy and len(cuts) == 7
    eager = cuts.to_eager()
    assert [c.supervisions[0].text for c in eager] == [f"utterance {i}" for i in range(6)] + ["resampled"]
    assert all(c.sampling_rate == 16000 for c in eager)
    for i, c in enumerate(list(eager)[:6]):
        np.testing.assert_allclose(c.load_audio()[0], _tone(0.2 + 0.1 * i, 16000, 200.0 + 50 * i), atol=1e-4)
    last = eager[6].load_audio()[0]
    assert last.shape == (4800,)
    assert np.argmax(np.abs(np.fft.rfft(last))) * 16000 / 4800 == pytest.approx(500.0, abs=8.0)
    # slices in HF's notation, and the same cuts on a second pass (re-iterable)
    assert [c.supervisions[0].text for c in cuts_from_hf(path, split="train[-2:]")] == ["utterance 5", "Resampled"]
    assert [c.id for c in cuts] == [c.id for c in cuts]


def test_hf_reads_offline_and_restores(tmp_path: Path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    path = _save_hf(tmp_path / "ds", {"train": [(_wav_bytes(_tone(0.1, 16000), 16000), "a")]})
    seen = {}
    real = datasets.load_from_disk

    def spy(*args, **kwargs):
        seen["env"] = os.environ.get("HF_HUB_OFFLINE")
        seen["flag"] = datasets.config.HF_HUB_OFFLINE
        return real(*args, **kwargs)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets, "load_from_disk", spy)
    assert len(cuts_from_hf(path)) == 1  # the only split
    assert seen == {"env": "1", "flag": True}
    assert "HF_HUB_OFFLINE" not in os.environ and datasets.config.HF_HUB_OFFLINE is False


def test_hf_data_files_leave_nothing_in_the_datasets_cache(tmp_path: Path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    folder = tmp_path / "files"
    folder.mkdir()
    audio = [_wav_bytes(_tone(0.1, 16000), 16000)] * 3
    pq.write_table(pa.table({"audio": audio, "text": ["a", "b", "c"]}), str(folder / "train.parquet"))
    default = tmp_path / "hf_cache"  # where datasets would convert the files (~/.cache/huggingface)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", default)
    assert [c.supervisions[0].text for c in cuts_from_hf(folder, split="train")] == ["a", "b", "c"]
    assert not default.exists() or not any(default.rglob("*"))


def test_hf_errors_name_the_column_and_row(tmp_path: Path):
    good = _wav_bytes(_tone(0.1, 16000), 16000)
    path = _save_hf(
        tmp_path / "ds", {"train": [(good, "a"), (b"garbage bytes", "b")], "validation": [(good, "x"), (good, None)]}
    )
    with pytest.raises(ValueError, match=r"no audio column 'speech'; the columns are \['audio', 'text'\]"):
        cuts_from_hf(path, split="train", audio_column="speech")
    with pytest.raises(ValueError, match=r"text column 'audio' has the arrow type struct"):
        cuts_from_hf(path, split="train", text_column="audio")
    with pytest.raises(ValueError, match=r"row 1 of audio column 'audio': not a readable audio file"):
        cuts_from_hf(path, split="train")
    with pytest.raises(ValueError, match=r"row 1 of text column 'text': the transcript must be a string"):
        cuts_from_hf(path, split="validation")
    with pytest.raises(ValueError, match=r"no split 'test'; the dataset has \['train', 'validation'\]"):
        cuts_from_hf(path, split="test")
    with pytest.raises(ValueError, match=r"has the splits \['train', 'validation'\]; choose one"):
        cuts_from_hf(path)
    with pytest.raises(ValueError, match=r"split 'train\[-:\]': expected a split name with an optional slice"):
        cuts_from_hf(path, split="train[-:]")
    with pytest.raises(ValueError, match=r"row 0 of audio column 'audio': 3244 bytes of audio \(max_audio_bytes=20\)"):
        cuts_from_hf(path, split="train[:1]", max_audio_bytes=20)
    with pytest.raises(FileNotFoundError, match="never downloaded"):
        cuts_from_hf(tmp_path / "librispeech_asr")


def test_hf_other_audio_columns(tmp_path: Path):
    """Audio given as samples + rate (no Audio feature), or as file paths relative to the dataset."""
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    x = _tone(0.25, 8000, 400.0)
    arrays = datasets.Dataset.from_dict(
        {"speech": [{"array": x.tolist(), "sampling_rate": 8000}], "sentence": ["samples"]}
    )
    arrays.save_to_disk(str(tmp_path / "arrays"))
    (cut,) = cuts_from_hf(tmp_path / "arrays", audio_column="speech", text_column="sentence")
    y = cut.load_audio()[0]
    assert cut.sampling_rate == 16000 and y.shape == (4000,) and cut.supervisions[0].text == "samples"
    assert np.argmax(np.abs(np.fft.rfft(y))) * 16000 / 4000 == pytest.approx(400.0, abs=8.0)

    paths = datasets.Dataset.from_dict({"file": ["a.wav", "missing.wav"], "text": ["by path", "gone"]})
    paths.save_to_disk(str(tmp_path / "paths"))
    sf.write(tmp_path / "paths" / "a.wav", _tone(0.1, 16000), 16000)
    (cut,) = cuts_from_hf(tmp_path / "paths", audio_column="file", split="[:1]")
    np.testing.assert_allclose(cut.load_audio()[0], _tone(0.1, 16000), atol=1e-4)
    with pytest.raises(
        ValueError, match=r"row 1 of audio column 'file': no audio bytes and no such file 'missing.wav'"
    ):
        cuts_from_hf(tmp_path / "paths", audio_column="file")


def _all_batches(loader) -> list[dict]:
    return list(loader)


def test_hf_data_module_batches(tmp_path: Path):
    train = [(_wav_bytes(_tone(0.3 + 0.05 * i, 16000, 150.0 * (i + 1)), 16000), f"say {i}") for i in range(5)]
    train.append((_wav_bytes(_tone(0.4, 22050), 22050), "at another rate"))
    val = [(_wav_bytes(_tone(0.2, 16000), 16000), "held out")]
    path = _save_hf(tmp_path / "ds", {"train": train, "validation": val})
    with pytest.raises(FileNotFoundError, match="data.path: HF dataset folder not found"):
        HFDataModule(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="data.feature_cache: not available with data=hf"):
        HFDataModule(str(path), feature_cache=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="no text column 'words'"):  # the rows are read at the first use
        HFDataModule(str(path), text_column="words").setup("fit")
    dm = HFDataModule(str(path), max_duration=1.0, max_cut_duration=1.0, num_buckets=2, seed=3)
    assert dm.hparams["path"] == str(path) and dm.hparams["max_duration"] == 1.0
    dm.setup("fit")
    assert sorted(dm.train_set.texts) == sorted(t for _, t in train)
    assert dm.chars == "".join(sorted(set("".join(t for _, t in train))))
    batches = _all_batches(dm.train_dataloader())
    assert sorted(t for b in batches for t in b["texts"]) == sorted(t for _, t in train)
    assert all(sum(int(n) for n in b["input_lengths"]) <= 100 * 1.0 + 2 for b in batches)  # 10 ms frames
    frames = {t: int(n) for b in batches for t, n in zip(b["texts"], b["input_lengths"])}
    assert frames["say 0"] == pytest.approx(30, abs=2) and frames["at another rate"] == pytest.approx(40, abs=2)
    for b in batches:
        assert b["inputs"].dtype == torch.float32 and b["inputs"].shape[2] == dm.feature_dim == 80
        assert b["inputs"].shape[1] == int(b["input_lengths"].max()) and torch.isfinite(b["inputs"]).all()
    dm.setup("test")  # test_split=None: the validation split
    assert [t for b in dm.test_dataloader() for t in b["texts"]] == ["held out"]


def test_folder_to_batches(folder: Path):
    (folder / "transcripts.txt").write_text("a hello world\nb good day\n")
    cuts = cuts_from_folder(folder)
    dm = LhotseDataModule(cuts, cuts, max_duration=5.0, max_cut_duration=5.0, num_buckets=1, shuffle=False)
    dm.setup("fit")
    (batch,) = _all_batches(dm.val_dataloader())
    assert sorted(batch["texts"]) == ["good day", "hello world"]
    assert sorted(batch["input_lengths"].tolist()) == pytest.approx([25, 50], abs=2)


@pytest.mark.skipif(
    not POCKETSPHINX.is_dir(),
    reason=f"{POCKETSPHINX} is absent: install Debian's pocketsphinx-testdata (apt-get install pocketsphinx-testdata)",
)
def test_real_recordings_through_a_model():
    """Ten transcribed 16 kHz recordings (LibriVox and card-game commands, about 34 s) from Debian's
    pocketsphinx-testdata: cuts, filterbank batches, an untrained encoder and a finite CTC loss."""
    cuts = cuts_from_folder(POCKETSPHINX, transcripts="*transcription")
    assert len(cuts) == 10
    assert sum(c.duration for c in cuts) == pytest.approx(34.4, abs=0.5)
    texts = {c.id: c.supervisions[0].text for c in cuts}
    assert texts["001"] == "ten of clubs"
    assert texts["sense_and_sensibility_01_austen_64kb-0880"] == "he was not an ill disposed young man"
    dm = LhotseDataModule(cuts, cuts, max_duration=12.0, max_cut_duration=12.0, num_buckets=2, shuffle=False)
    dm.setup("fit")
    vocab = Vocabulary(dm.chars, blank=True)
    torch.manual_seed(0)
    net = ConvRNNEncoder(dm.feature_dim, vocab.num_classes, conv_channels=8, conv_layers=1, hidden_size=8, stride=4)
    loss_fn = CTCLoss(zero_infinity=False)
    seen = []
    for batch in dm.train_dataloader():
        x, n = batch["inputs"], batch["input_lengths"]
        assert x.shape[2] == 80 and torch.isfinite(x).all() and x.std() > 0.5  # real speech, not silence
        emissions, lengths = net(x, n)
        assert emissions.shape[:2] == (x.shape[0], (x.shape[1] + 3) // 4)
        targets, target_lengths = vocab.batch_encode(batch["texts"])
        loss = loss_fn(emissions, targets, lengths, target_lengths)
        assert torch.isfinite(loss) and loss.item() > 0
        if not seen:  # one backward (the slow part on a busy CPU)
            loss.backward()
            assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
        seen += batch["texts"]
    assert sorted(seen) == sorted(texts.values())


def test_hf_bounds_before_copying(tmp_path: Path):
    good = _wav_bytes(_tone(0.1, 16000), 16000)
    path = _save_hf(tmp_path / "long", {"train": [(good, "ok"), (good, "x" * 400_001)]})
    with pytest.raises(ValueError, match=r"row 1 of text column 'text': the transcript is longer than 100000"):
        cuts_from_hf(path)
    with pytest.raises(ValueError, match=r"row 0 of audio column 'audio': 0\.1 s of audio .* max_audio_seconds=0\.05"):
        cuts_from_hf(path, split="[:1]", max_audio_seconds=0.05)


def test_control_characters_in_transcripts_name_the_source(folder: Path, tmp_path: Path):
    (folder / "transcripts.txt").write_text("a hello\nb bell \x07 rings\n")
    with pytest.raises(ValueError, match=r"transcripts.txt:2: the transcript holds the control character U\+0007"):
        cuts_from_folder(folder)
    good = _wav_bytes(_tone(0.1, 16000), 16000)
    path = _save_hf(tmp_path / "ds", {"train": [(good, "fine"), (good, "nul\x00here")]})
    with pytest.raises(ValueError, match=r"row 1 of text column 'text': the transcript holds the control character"):
        cuts_from_hf(path, split="train")


def test_dataset_paths_resolve_inside_the_dataset(tmp_path: Path):
    """An HF dataset's audio paths (absolute, ``../``) and a folder's symlinks are read inside
    the dataset's folder unless ``allow_outside_paths`` says otherwise."""
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    outside = tmp_path / "outside"
    outside.mkdir()
    sf.write(outside / "a.wav", _tone(0.1, 16000), 16000)
    for name, p in (("absolute", str(outside / "a.wav")), ("dotdot", "../outside/a.wav")):
        folder = tmp_path / name
        datasets.Dataset.from_dict({"file": [p], "text": ["elsewhere"]}).save_to_disk(str(folder))
        with pytest.raises(ValueError, match=rf"row 0 of audio column 'file': audio path '{p}': .*outside {folder}"):
            cuts_from_hf(folder, audio_column="file")
        (cut,) = cuts_from_hf(folder, audio_column="file", allow_outside_paths=True)
        assert cut.recording.sources[0].source == str(outside / "a.wav")
    dm = HFDataModule(tmp_path / "dotdot", audio_column="file", train_split=None, val_split=None)
    with pytest.raises(ValueError, match="outside"):
        dm.setup("fit")
    # an audio folder: a symlink to a file elsewhere
    own = tmp_path / "own"
    own.mkdir()
    (own / "a.wav").symlink_to(outside / "a.wav")
    (own / "transcripts.txt").write_text("a linked\n")
    with pytest.raises(ValueError, match=rf"audio file: {own / 'a.wav'} resolves to .*outside {own}"):
        cuts_from_folder(own)
    assert len(cuts_from_folder(own, allow_outside_paths=True)) == 1
