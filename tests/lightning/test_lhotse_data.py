"""LhotseDataModule: manifests -> checked cuts -> bucketed filterbank batches; determinism, DDP
sharding, mid-epoch resume, and clear errors for bad manifests and audio files.

The audio is synthetic (sine bursts and noise written with soundfile into a temporary folder);
manifests are built with Lhotse itself."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import soundfile as sf
import torch

lhotse = pytest.importorskip("lhotse")

from lhotse import CutSet, MonoCut, Recording, SupervisionSegment  # noqa: E402

from lightning_gtn.lightning import LhotseDataModule, check_cut, read_cuts  # noqa: E402
from lightning_gtn.lightning.lhotse_data import CutBatchLoader  # noqa: E402

SR = 16000
WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight"]


def _wav(path: Path, seconds: float, freq: float, seed: int, sr: int = SR) -> Path:
    n = int(round(seconds * sr))
    rng = np.random.default_rng(seed)
    t = np.arange(n) / sr
    burst = (np.sin(2 * np.pi * freq * t) * (np.sin(np.pi * t / max(seconds, 1e-3)) ** 2)).astype(np.float32)
    sf.write(str(path), 0.3 * burst + 0.02 * rng.standard_normal(n).astype(np.float32), sr)
    return path


def _cut(path: Path, cid: str, text: str) -> MonoCut:
    rec = Recording.from_file(str(path), recording_id=cid)
    sup = SupervisionSegment(id=cid, recording_id=cid, start=0.0, duration=rec.duration, text=text)
    return MonoCut(id=cid, start=0.0, duration=rec.duration, channel=0, recording=rec, supervisions=[sup])


def _write(cuts, path: Path) -> str:
    CutSet.from_cuts(cuts).to_file(str(path))
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """24 training cuts (0.2 .. 0.89 s) and 6 validation cuts, as .jsonl.gz manifests."""
    root = tmp_path_factory.mktemp("lhotse")
    train, val = [], []
    for i in range(24):
        text = f"{WORDS[i % 8]} {WORDS[(3 * i) % 8]}"
        train.append(_cut(_wav(root / f"tr{i}.wav", 0.2 + 0.03 * i, 150 + 40 * i, i), f"tr{i}", text))
    for i in range(6):
        val.append(_cut(_wav(root / f"va{i}.wav", 0.3 + 0.05 * i, 300 + 25 * i, 100 + i), f"va{i}", WORDS[i]))
    return {
        "root": root,
        "train": _write(train, root / "cuts_train.jsonl.gz"),
        "val": _write(val, root / "cuts_val.jsonl"),
        "train_cuts": train,
    }


def _dm(corpus, **kw):
    args = dict(num_mel_bins=20, max_duration=2.0, max_cut_duration=2.0, num_buckets=3)
    args.update(kw)
    return LhotseDataModule(corpus["train"], corpus["val"], **args)


def _ids(loader):
    return [tuple(b["ids"]) for b in loader]


# ---------------------------------------------------------------------------------------------
# Round trip


def test_manifest_round_trip_batches(corpus):
    dm = _dm(corpus, stack_frames=2)
    texts = {c.id: c.supervisions[0].text for c in corpus["train_cuts"]}
    assert dm.chars == "".join(sorted(set("".join(texts.values()))))
    assert dm.feature_dim == 40
    dm.setup("fit")
    assert sorted(dm.train_set.texts) == sorted(texts.values())
    seen = []
    from lhotse import Fbank, FbankConfig

    fbank = Fbank(FbankConfig(num_filters=20, sampling_rate=SR))
    for b in dm.train_dataloader():
        x, lengths = b["inputs"], b["input_lengths"]
        assert x.dtype == torch.float32 and lengths.dtype == torch.int64
        assert x.shape[0] == len(b["texts"]) == len(b["ids"]) == lengths.shape[0] and x.shape[2] == 40
        assert int(lengths.max()) == x.shape[1]
        assert sum(c.duration for c in corpus["train_cuts"] if c.id in b["ids"]) <= 2.0 + 1e-6
        for k, cid in enumerate(b["ids"]):
            assert b["texts"][k] == texts[cid]
            # the features of a cut, computed here from the file: same frames, stacked by two
            audio, _ = sf.read(str(corpus["root"] / f"{cid}.wav"), dtype="float32")
            ref = torch.as_tensor(fbank.extract(audio, SR))
            n = ref.shape[0]
            assert int(lengths[k]) == math.ceil(n / 2)
            got = x[k, : math.ceil(n / 2)].reshape(-1, 20)[:n]
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
            assert torch.all(x[k].reshape(-1, 20)[n:] == 0)  # padding
        seen += b["ids"]
    assert sorted(seen) == sorted(texts)  # every cut exactly once per epoch
    val = [i for b in dm.val_dataloader() for i in b["ids"]]
    assert sorted(val) == [f"va{i}" for i in range(6)]


def test_cutset_objects_and_spec_augment(corpus):
    cuts = CutSet.from_cuts(corpus["train_cuts"][:8])
    plain = LhotseDataModule(cuts, cuts, num_mel_bins=20, max_duration=4.0, max_cut_duration=2.0, shuffle=False)
    aug = LhotseDataModule(
        cuts,
        cuts,
        num_mel_bins=20,
        max_duration=4.0,
        max_cut_duration=2.0,
        shuffle=False,
        spec_augment={"time_warp_factor": None, "num_feature_masks": 2, "features_mask_size": 5, "p": 1.0},
    )
    assert "train_cuts" not in plain.hparams and "chars" not in plain.hparams  # plain data only
    a, b = next(iter(plain.train_dataloader())), next(iter(aug.train_dataloader()))
    assert a["ids"] == b["ids"] and torch.equal(a["input_lengths"], b["input_lengths"])
    assert not torch.equal(a["inputs"], b["inputs"])  # masked bands
    v = next(iter(aug.val_dataloader()))  # never on validation batches
    assert torch.equal(v["inputs"], a["inputs"]) and v["ids"] == a["ids"]
    with pytest.raises(ValueError, match="spec_augment: unknown keys"):
        LhotseDataModule(cuts, cuts, spec_augment={"warp": 3})


def test_feature_cache_and_precomputed_features(corpus, tmp_path):
    import shutil

    # a private copy of the validation cuts, whose audio is deleted once the cache holds it
    audio = tmp_path / "audio"
    audio.mkdir()
    cuts = []
    for i in range(6):
        shutil.copy(corpus["root"] / f"va{i}.wav", audio / f"va{i}.wav")
        cuts.append(_cut(audio / f"va{i}.wav", f"va{i}", WORDS[i]))
    manifest = _write(cuts, tmp_path / "cuts.jsonl.gz")
    args = dict(num_mel_bins=20, max_duration=4.0, max_cut_duration=2.0, shuffle=False)
    plain = list(LhotseDataModule(manifest, manifest, **args).val_dataloader())
    cached = LhotseDataModule(manifest, manifest, feature_cache=str(tmp_path / "cache"), **args)
    cached.prepare_data()
    entries = sorted((tmp_path / "cache").iterdir())
    assert [p.name.split("-")[0] for p in entries] == ["test", "train", "val"]
    assert all((p / "complete").is_file() for p in entries)
    shutil.rmtree(audio)  # from now on only the cache can give features
    again = LhotseDataModule(manifest, manifest, feature_cache=str(tmp_path / "cache"), **args)
    got = list(again.val_dataloader())
    assert [b["ids"] for b in got] == [b["ids"] for b in plain]
    for a, b in zip(plain, got):
        assert torch.equal(a["input_lengths"], b["input_lengths"])
        torch.testing.assert_close(a["inputs"], b["inputs"])
    # the cache's manifest is an ordinary one of cuts with features
    pre = str(next((tmp_path / "cache").glob("val-*")) / "cuts.jsonl.gz")
    dm = LhotseDataModule(pre, pre, features="precomputed", stack_frames=2, **args)
    assert dm.feature_dim == 40
    b = next(iter(dm.val_dataloader()))
    assert b["ids"] == plain[0]["ids"] and b["inputs"].shape[2] == 40
    with pytest.raises(ValueError, match="no precomputed features"):
        LhotseDataModule(manifest, manifest, features="precomputed").setup("fit")


# ---------------------------------------------------------------------------------------------
# Sampler: determinism, epochs, workers, DDP ranks


def _sampled(loader, epoch):
    loader.epoch = epoch
    return [tuple(c.id for c in cuts) for cuts in loader.cut_batches()]


def test_sampler_deterministic_by_seed_and_epoch(corpus):
    a, b, other = _dm(corpus, seed=5), _dm(corpus, seed=5), _dm(corpus, seed=6)
    la, lb, lo = a.train_dataloader(), b.train_dataloader(), other.train_dataloader()
    e0 = _sampled(la, 0)
    assert e0 == _sampled(lb, 0) and e0 == _sampled(la, 0)  # same seed, same epoch: same batches, every pass
    assert _sampled(lo, 0) != e0
    e1 = _sampled(la, 1)
    assert e1 != e0  # another epoch, another order ...
    assert sorted(i for t in e1 for i in t) == sorted(i for t in e0 for i in t)  # ... of the same cuts
    assert len({i for t in e0 for i in t}) == 24
    # the data module's own passes follow its epoch
    a.set_epoch(1)
    assert _ids(la) == e1


def test_workers_give_the_same_batches_in_order(corpus):
    ref = _dm(corpus, seed=2).train_dataloader()
    par = _dm(corpus, seed=2, num_workers=2).train_dataloader()
    b0, b2 = list(ref), list(par)
    assert [x["ids"] for x in b0] == [x["ids"] for x in b2]
    assert all(torch.equal(x["inputs"], y["inputs"]) for x, y in zip(b0, b2))


def test_ddp_ranks_get_disjoint_shards_covering_the_epoch(corpus):
    dm = _dm(corpus, seed=1, max_duration=1.5, max_cut_duration=1.0)
    split = dm.split("train")
    shards = []
    for rank in (0, 1):
        loader = CutBatchLoader(dm, split, train=True, world_size=2, rank=rank)
        loader.epoch = 3
        shards.append([tuple(c.id for c in cuts) for cuts in loader.cut_batches()])
    ids0 = {i for t in shards[0] for i in t}
    ids1 = {i for t in shards[1] for i in t}
    assert len(shards[0]) == len(shards[1]) > 1  # same number of steps on both ranks (no DDP hang)
    assert not ids0 & ids1
    assert ids0 | ids1 == {c.id for c in corpus["train_cuts"]}
    with pytest.raises(ValueError, match="rank"):
        CutBatchLoader(dm, split, train=True, world_size=2, rank=2)


# ---------------------------------------------------------------------------------------------
# Resuming mid-epoch through a Lightning checkpoint


class _Recorder(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, tuple(batch["ids"])))
        return ((self.w - batch["inputs"].mean()) ** 2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _trainer(**kw):
    args = dict(
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
    )
    args.update(kw)
    return L.Trainer(**args)


def test_resume_mid_epoch_sees_the_same_batches(corpus, tmp_path):
    # what an uninterrupted run of two epochs sees (the sampler alone: deterministic in seed and epoch)
    ref = _dm(corpus, seed=4).train_dataloader()
    epochs = [_sampled(ref, 0), _sampled(ref, 1)]
    full = [(e, b) for e in (0, 1) for b in epochs[e]]
    per_epoch = len(epochs[0])
    assert per_epoch >= 5

    stop = per_epoch + 2  # stopped in the second epoch; checkpoints after every step
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    part = _Recorder()
    _trainer(max_steps=stop, enable_checkpointing=True, callbacks=[ckpt]).fit(part, datamodule=_dm(corpus, seed=4))
    assert part.seen == full[:stop]

    for step in (2, per_epoch, stop):  # mid-epoch 0, end of epoch 0, mid-epoch 1
        path = next(tmp_path.glob(f"*step={step}.ckpt"))
        state = torch.load(path, weights_only=True)["LhotseDataModule"]
        # (a finished epoch is saved as the next one, none of it consumed)
        assert (state["epoch"], state["batches"]) == ((0, step) if step < per_epoch else (1, step - per_epoch))
        rest = _Recorder()
        _trainer().fit(rest, datamodule=_dm(corpus, seed=4), ckpt_path=str(path))
        assert full[:step] + rest.seen == full, f"resumed after step {step}"


def test_state_dict_is_checked_and_skips_batches_without_trainer(corpus):
    dm = _dm(corpus, seed=7)
    loader = dm.train_dataloader()
    all_batches = _ids(loader)
    it = iter(loader)
    next(it), next(it)
    state = dm.state_dict()
    assert state == {"epoch": 0, "batches": 2, "world_size": 1, "seed": 7}
    again = _dm(corpus, seed=7)
    again.load_state_dict(state)
    assert _ids(again.train_dataloader()) == all_batches[2:]
    with pytest.raises(ValueError, match="batches must be an integer"):
        again.load_state_dict({"epoch": 0, "batches": -1, "world_size": 1, "seed": 7})


# ---------------------------------------------------------------------------------------------
# Bad inputs: errors name the file


def _one(corpus, tmp_path, name="bad", **edit):
    """A one-cut manifest whose cut dict is edited (``key=value`` at the top, ``rec__k`` in the
    recording, ``src__k`` in its first source, ``sup__k`` in its supervision)."""
    d = corpus["train_cuts"][0].to_dict()
    for k, v in edit.items():
        if k.startswith("rec__"):
            d["recording"][k[5:]] = v
        elif k.startswith("src__"):
            d["recording"]["sources"][0][k[5:]] = v
        elif k.startswith("sup__"):
            d["supervisions"][0][k[5:]] = v
        else:
            d[k] = v
    path = tmp_path / f"{name}.jsonl"
    path.write_text(json.dumps(d) + "\n")
    return str(path)


def _batches(manifest, **kw):
    kw.setdefault("allow_outside_paths", True)  # the cut's audio is the corpus's, elsewhere
    dm = LhotseDataModule(manifest, manifest, num_mel_bins=20, max_duration=5.0, max_cut_duration=5.0, **kw)
    return list(dm.train_dataloader())


def test_bad_manifests_name_the_file(corpus, tmp_path):
    with pytest.raises(FileNotFoundError, match="data.train_cuts: manifest not found: .*nowhere.jsonl"):
        LhotseDataModule(str(tmp_path / "nowhere.jsonl"), corpus["val"]).setup("fit")
    with pytest.raises(ValueError, match="not a Lhotse JSONL manifest"):
        read_cuts(str(tmp_path / "cuts.json"), "data.train_cuts")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty.jsonl holds no cuts"):
        read_cuts(str(empty), "data.train_cuts")
    lines = Path(corpus["val"]).read_text().splitlines()
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text("\n".join(lines[:2] + ['{"id": "x", "type": "MonoCut"'] + lines[2:]) + "\n")
    with pytest.raises(ValueError, match=r"corrupt.jsonl:3: not JSON"):
        LhotseDataModule(corpus["train"], str(corrupt), allow_outside_paths=True).setup("fit")
    badgz = tmp_path / "bad.jsonl.gz"
    badgz.write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(7, 200)))
    with pytest.raises(ValueError, match="bad.jsonl.gz.*cannot read the manifest"):
        read_cuts(str(badgz), "data.val_cuts")
    recs = tmp_path / "recordings.jsonl"
    recs.write_text(json.dumps(corpus["train_cuts"][0].recording.to_dict()) + "\n")
    with pytest.raises(ValueError, match="recordings.jsonl:1: a recording .*CutSet.from_manifests"):
        read_cuts(str(recs), "data.train_cuts")
    long_line = tmp_path / "long.jsonl"
    long_line.write_text(" " * (1 << 20) + "x\n")
    with pytest.raises(ValueError, match="long.jsonl:1: line longer than"):
        read_cuts(str(long_line), "data.train_cuts")


def test_bad_audio_and_cuts_name_the_file(corpus, tmp_path):
    missing = _one(corpus, tmp_path, "missing", src__source=str(tmp_path / "gone.wav"))
    with pytest.raises(ValueError, match=r"missing.jsonl\).*'tr0'.*audio file not found: .*gone.wav"):
        _batches(missing)
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"RIFF0000WAVEnot audio at all" * 10)
    with pytest.raises(ValueError, match=r"cannot read audio .*junk.wav"):
        _batches(_one(corpus, tmp_path, "junk", src__source=str(junk)))
    sf.write(str(tmp_path / "empty.wav"), np.zeros(0, np.float32), SR)
    with pytest.raises(ValueError, match=r"empty.wav"):
        _batches(_one(corpus, tmp_path, "emptyaudio", src__source=str(tmp_path / "empty.wav")))
    rate8k = _wav(tmp_path / "r8k.wav", 0.2, 300, 0, sr=8000)
    with pytest.raises(ValueError, match=r"r8k.wav has sampling rate 8000 Hz but the manifest says 16000"):
        _batches(_one(corpus, tmp_path, "rate", src__source=str(rate8k)))
    with pytest.raises(ValueError, match=r"sampling rate 8000 Hz, expected 16000"):
        _batches(_write([_cut(rate8k, "r8k", "one")], tmp_path / "rate8k.jsonl"))
    with pytest.raises(ValueError, match=r"blank.jsonl.*'tr0': empty transcript"):
        LhotseDataModule(
            _one(corpus, tmp_path, "blank", sup__text="  "), corpus["val"], allow_outside_paths=True
        ).setup("fit")
    with pytest.raises(ValueError, match=r"'tr0': duration must be a finite positive"):
        LhotseDataModule(
            _one(corpus, tmp_path, "nan", duration=float("nan")), corpus["val"], allow_outside_paths=True
        ).setup("fit")
    with pytest.raises(ValueError, match="lasts .* but the cut ends"):  # a cut past the end of its file
        _batches(_one(corpus, tmp_path, "past", duration=3.0, rec__duration=3.0, rec__num_samples=48000))
    assert check_cut(corpus["train_cuts"][0], "ok", sampling_rate=SR) is None


def test_hostile_manifest_runs_nothing_and_allocates_nothing(corpus, tmp_path):
    marker = tmp_path / "ran"
    cmd = _one(corpus, tmp_path, "cmd", src__type="command", src__source=f"touch {marker}")
    with pytest.raises(ValueError, match="audio source type 'command' is not read"):
        LhotseDataModule(cmd, corpus["val"], allow_outside_paths=True).setup("fit")
    assert not marker.exists()
    # a cut claiming a day of audio is skipped (with a warning), never read
    day = _one(corpus, tmp_path, "day", duration=86400.0, rec__duration=86400.0, rec__num_samples=86400 * SR)
    with pytest.warns(UserWarning, match=r"day.jsonl.*1 cuts longer than data.max_cut_duration"):
        with pytest.raises(ValueError, match="no usable cuts"):
            LhotseDataModule(day, corpus["val"], allow_outside_paths=True).setup("fit")
    many = _one(corpus, tmp_path, "chan", rec__channel_ids=list(range(1000)))
    with pytest.raises(ValueError, match="1000 channels"):
        LhotseDataModule(many, corpus["val"], allow_outside_paths=True).setup("fit")
    with pytest.raises(ValueError, match="max_cut_duration .* must be at most data.max_duration"):
        LhotseDataModule(corpus["train"], corpus["val"], max_duration=10.0, max_cut_duration=20.0)


def test_audio_too_short_or_too_loud_and_deep_json_name_the_cut(tmp_path):
    short = _wav(tmp_path / "short.wav", 0.02, 300, 0)  # 320 samples: less than one 25 ms window
    manifest = _write([_cut(short, "short", "one")], tmp_path / "short.jsonl")
    with pytest.raises(ValueError, match="cut 'short': 320 samples, fewer than one filterbank window"):
        _batches(manifest)
    loud = tmp_path / "loud.wav"
    sf.write(str(loud), np.full(SR // 4, 1e38, np.float32), SR, subtype="FLOAT")
    manifest = _write([_cut(loud, "loud", "one")], tmp_path / "loud.jsonl")
    with pytest.raises(ValueError, match="cut 'loud': the audio's filterbanks are not finite"):
        _batches(manifest)
    import gzip

    with gzip.open(tmp_path / "blank.jsonl.gz", "wt") as f:  # 1 kB of gzip, a million newlines
        f.write("\n" * (1 << 20))
    with pytest.raises(ValueError, match=r"blank.jsonl.gz:65537: more than 65536 blank lines"):
        LhotseDataModule(str(tmp_path / "blank.jsonl.gz"), str(tmp_path / "blank.jsonl.gz")).setup("fit")
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ValueError, match=r"deep.jsonl:1: JSON nested too deeply"):
        LhotseDataModule(str(deep), str(deep)).setup("fit")


def test_resampled_recordings_are_read_at_their_rate(tmp_path):
    # Lhotse's Recording.resample (a transform in the manifest): read and resampled here, as the
    # audio is loaded; the cut then gives the filterbanks of the same audio recorded at 16 kHz
    t = np.arange(int(0.5 * 22050)) / 22050
    sf.write(str(tmp_path / "cd.wav"), (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 22050)
    t = np.arange(8000) / SR
    sf.write(str(tmp_path / "ref.wav"), (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), SR)
    cut = _cut(tmp_path / "cd.wav", "cd", "one").resample(SR)
    manifest = _write([cut], tmp_path / "cd.jsonl")
    got = _batches(manifest)[0]["inputs"][0]
    want = _batches(_write([_cut(tmp_path / "ref.wav", "ref", "one")], tmp_path / "ref.jsonl"))[0]["inputs"][0]
    assert got.shape == want.shape
    inner = slice(2, -2)  # the resampling filter's edges aside: the same tone in the same mel band
    assert torch.equal(got[inner].argmax(1), want[inner].argmax(1))
    torch.testing.assert_close(got[inner].amax(1), want[inner].amax(1), atol=0.05, rtol=0.01)
    # other transforms, a chain, or a resampling that disagrees with the recording are refused
    d = cut.to_dict()
    for name, transforms in [
        ("speed", [{"name": "Speed", "kwargs": {"factor": 1.1}}]),
        ("chain", d["recording"]["transforms"] * 2),
        ("odd", [{"name": "Resample", "kwargs": {"source_sampling_rate": 22051, "target_sampling_rate": SR}}]),
        ("lie", [{"name": "Resample", "kwargs": {"source_sampling_rate": 22050, "target_sampling_rate": 8000}}]),
    ]:
        bad = json.loads(json.dumps(d))
        bad["recording"]["transforms"] = transforms
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(bad) + "\n")
        match = {
            "speed": "transforms other than one resampling",
            "chain": "transforms other than one resampling",
            "odd": "22051 Hz to 16000 Hz needs a filter of 22051 x 16000 phases",
            "lie": "must go from a rate in .* to the recording's 16000 Hz",
        }[name]
        with pytest.raises(ValueError, match=match):
            _batches(str(tmp_path / f"{name}.jsonl"))


def _feature_cut(cid: str, storage_type: str, storage_path: str, storage_key, frames: int = 50, start: float = 0.0):
    """A cut of ``frames`` 10 ms frames of 40 features held by the given storage."""
    from lhotse.features import Features

    d = frames * 0.01
    feats = Features(
        type="fbank",
        num_frames=frames,
        num_features=40,
        frame_shift=0.01,
        sampling_rate=SR,
        start=0.0,
        duration=d,
        storage_type=storage_type,
        storage_path=storage_path,
        storage_key=storage_key,
        recording_id=cid,
        channels=0,
    )
    sup = SupervisionSegment(id=cid, recording_id=cid, start=0.0, duration=d - start, text="one")
    return MonoCut(id=cid, start=start, duration=d - start, channel=0, features=feats, supervisions=[sup])


def _features_of(tmp_path, cut, **kw):
    manifest = _write([cut], tmp_path / f"{cut.id}.jsonl")
    kw.setdefault("allow_outside_paths", True)  # reaches the readers' own checks (/dev/zero)
    dm = LhotseDataModule(manifest, manifest, features="precomputed", max_duration=2.0, max_cut_duration=1.0, **kw)
    return next(iter(dm.val_dataloader()))["inputs"][0]


def test_precomputed_features_are_read_header_first_and_never_run(tmp_path):
    from lhotse.features.io import NumpyFilesWriter

    x = np.random.default_rng(0).standard_normal((50, 40)).astype(np.float32)
    key = NumpyFilesWriter(tmp_path / "feats").write("good", x)
    good = _feature_cut("good", "numpy_files", str(tmp_path / "feats"), key)
    torch.testing.assert_close(_features_of(tmp_path, good), torch.from_numpy(x))
    # a cut inside its features is trimmed as Lhotse trims it
    inner = _feature_cut("inner", "numpy_files", str(tmp_path / "feats"), key, start=0.2)
    np.testing.assert_array_equal(_features_of(tmp_path, inner)[:30].numpy(), inner.load_features())
    # Lhotse runs a "pipe:" storage as a shell command: refused when the manifest is read
    marker = tmp_path / "ran"
    pipe = _feature_cut("pipe", "numpy_files", f"pipe:touch {marker}; #", "x.npy")
    with pytest.raises(ValueError, match="is not a local folder"):
        _features_of(tmp_path, pipe)
    assert not marker.exists()
    with pytest.raises(ValueError, match="'lilcom_chunky' is not read"):
        _features_of(tmp_path, _feature_cut("lil", "lilcom_chunky", str(tmp_path / "f.llc"), "0,10"))

    def npy(name, header_shape, dtype="<f4", data=b""):
        hdr = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (dtype, header_shape)
        hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
        (tmp_path / "feats" / name).write_bytes(
            b"\x93NUMPY\x01\x00" + len(hdr).to_bytes(2, "little") + hdr.encode() + data
        )
        return _feature_cut(name.split(".")[0], "numpy_files", str(tmp_path / "feats"), name)

    # the header is checked before any data is read: a declared 40 GB array allocates nothing
    with pytest.raises(ValueError, match=r"declares shape \(134217728, 80\)"):
        _features_of(tmp_path, npy("huge.npy", (1 << 27, 80)))
    with pytest.raises(ValueError, match=r"declares shape \(50, 40, 2\)"):
        _features_of(tmp_path, npy("three.npy", (50, 40, 2)))
    with pytest.raises(ValueError, match="the .npy array holds object"):
        _features_of(tmp_path, npy("obj.npy", (50, 40), dtype="|O"))
    with pytest.raises(ValueError, match="truncated"):
        _features_of(tmp_path, npy("short.npy", (50, 40), data=b"\0" * 100))
    (tmp_path / "feats" / "junk.npy").write_bytes(b"not an array at all")
    with pytest.raises(ValueError, match="not a readable .npy array"):
        _features_of(tmp_path, _feature_cut("junk", "numpy_files", str(tmp_path / "feats"), "junk.npy"))
    # a pipe (which would block a reader forever) or a device is not a regular file
    os.mkfifo(tmp_path / "feats" / "fifo.npy")
    with pytest.raises(ValueError, match="not a regular file"):
        _features_of(tmp_path, _feature_cut("fifo", "numpy_files", str(tmp_path / "feats"), "fifo.npy"))
    with pytest.raises(ValueError, match="not a regular file"):
        _features_of(tmp_path, _feature_cut("zero", "numpy_files", "/dev", "zero"))


# ---------------------------------------------------------------------------------------------
# The CLI under DDP (a subprocess: Lightning's ddp would relaunch pytest)


@pytest.mark.slow
def test_cli_ddp_cpu_on_lhotse_manifests(corpus, tmp_path):
    out = tmp_path / "run"
    args = [
        "data=lhotse",
        f"data.train_cuts={corpus['train']}",
        f"data.val_cuts={corpus['val']}",
        "data.num_mel_bins=20",
        "data.max_duration=3.0",
        "data.max_cut_duration=2.0",
        "data.stack_frames=2",
        "trainer=ddp_cpu",
        "trainer.max_epochs=1",
        "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={out}",
    ]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_gtn.train", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"train/loss", "val/cer", "val/wer"} <= set(m) and math.isfinite(m["train/loss"])
    # 24 cuts of 0.2..0.89 s (13.7 s) in batches of at most 3 s, shared by two ranks
    assert 3 <= m["global_step"] <= 8
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["LhotseDataModule"]["world_size"] == 2


def test_subclass_makes_its_manifests_before_the_first_read(corpus):
    class Made(LhotseDataModule):
        calls = 0

        def prepare_sources(self):
            Made.calls += 1
            self.sources = {"train": corpus["train"], "val": corpus["val"], "test": corpus["val"]}

    dm = Made(None, None, num_mel_bins=20, max_duration=2.0, max_cut_duration=2.0)
    assert Made.calls == 0  # nothing is read at construction
    assert set(dm.chars) == set("".join(c.supervisions[0].text for c in corpus["train_cuts"]))
    dm.setup("fit")
    assert Made.calls == 1 and len(dm.train_set.texts) == 24 and dm.val_set.num_cuts == 6


def test_cuts_inside_a_recording_read_their_own_samples(corpus, tmp_path):
    # the layout of Lhotse's recipes after trim_to_supervisions(): cuts start inside a recording
    path = _wav(tmp_path / "long.wav", 1.5, 440, 9)
    whole = _cut(path, "long", "x")
    parts = []
    for k, (start, dur, text) in enumerate([(0.1, 0.5, "one"), (0.7, 0.6, "two")]):
        sup = SupervisionSegment(id=f"s{k}", recording_id="long", start=start, duration=dur, text=text)
        parts.append(
            MonoCut(id=f"s{k}", start=start, duration=dur, channel=0, recording=whole.recording, supervisions=[sup])
        )
    manifest = _write(parts, tmp_path / "parts.jsonl")
    dm = LhotseDataModule(manifest, manifest, num_mel_bins=20, max_duration=2.0, max_cut_duration=2.0, shuffle=False)
    (batch,) = list(dm.val_dataloader())
    from lhotse import Fbank, FbankConfig

    audio, _ = sf.read(str(path), dtype="float32")
    fbank = Fbank(FbankConfig(num_filters=20, sampling_rate=SR))
    for k, cid in enumerate(batch["ids"]):
        start, dur = {"s0": (0.1, 0.5), "s1": (0.7, 0.6)}[cid]
        ref = torch.as_tensor(fbank.extract(audio[int(start * SR) : int(round((start + dur) * SR))], SR))
        n = int(batch["input_lengths"][k])
        assert n == ref.shape[0]
        torch.testing.assert_close(batch["inputs"][k, :n], ref, rtol=1e-4, atol=1e-4)
    assert sorted(batch["texts"]) == ["one", "two"]


def test_transcripts_are_bounded_and_printable_naming_the_cut(corpus, tmp_path):
    # tr0 lasts 0.2 s: 400,000 characters would ask a transducer's joiner for gigabytes
    huge = _one(corpus, tmp_path, "huge", sup__text="a" * 400_000)
    with pytest.raises(ValueError, match=r"huge.jsonl\).*'tr0': the transcript has 400000 characters \(at most"):
        LhotseDataModule(huge, corpus["val"], allow_outside_paths=True).setup("fit")
    dense = _one(corpus, tmp_path, "dense", sup__text="ab " * 100)  # 300 characters in 0.2 s
    with pytest.raises(ValueError, match=r"'tr0': 300 transcript characters for 0.2 s of audio \(at most 100 a"):
        LhotseDataModule(dense, corpus["val"], allow_outside_paths=True).setup("fit")
    LhotseDataModule(
        _one(corpus, tmp_path, "short", sup__text="a" * 100), corpus["val"], allow_outside_paths=True
    ).setup("fit")
    # valid JSON, but not text: a lone surrogate, a control character
    cases = (
        ("surrogate", "one \ud800", "a lone surrogate U\\+D800"),
        ("nul", "o\x00ne", "the control character U\\+0000"),
    )
    for name, text, what in cases:
        bad = _one(corpus, tmp_path, name, sup__text=text)
        with pytest.raises(ValueError, match=rf"{name}.jsonl\).*'tr0': the transcript holds {what}"):
            LhotseDataModule(corpus["train"], bad, allow_outside_paths=True).setup("fit")
    with pytest.raises(ValueError, match="vocabulary chars must be printable"):
        from lightning_gtn.lightning import Vocabulary

        Vocabulary("ab\x07")


def test_manifest_files_resolve_inside_its_folder_or_the_named_ones(corpus, tmp_path):
    """A manifest's audio (and precomputed feature) files lie in its folder, in data.audio_dirs,
    or anywhere with data.allow_outside_paths=true."""
    here = tmp_path / "manifests"
    here.mkdir()
    away = _one(corpus, here, "away")  # tr0's audio lies in the corpus folder
    with pytest.raises(
        ValueError, match=r"away.jsonl\).*'tr0': audio file .*tr0.wav resolves to .*, outside .*manifests"
    ):
        LhotseDataModule(away, away).setup("fit")
    up = _one(corpus, here, "up", src__source=os.path.relpath(corpus["root"] / "tr0.wav"))  # from the cwd
    with pytest.raises(ValueError, match=r"up.jsonl\).*'tr0': audio file \.\..*outside"):
        LhotseDataModule(up, up).setup("fit")
    for ok in (dict(audio_dirs=[str(corpus["root"])]), dict(allow_outside_paths=True)):
        dm = LhotseDataModule(away, away, num_mel_bins=20, max_duration=2.0, max_cut_duration=2.0, **ok)
        assert [b["ids"] for b in dm.val_dataloader()] == [["tr0"]]
    # a precomputed feature file elsewhere (here a device) is refused before it is opened
    zero = _feature_cut("zero", "numpy_files", "/dev", "zero")
    with pytest.raises(ValueError, match=r"'zero': feature file /dev/zero resolves to /dev/zero, outside"):
        _features_of(tmp_path, zero, allow_outside_paths=False)
