"""Does data loading keep up? LhotseDataModule's batches per second alone vs the data config's model's step.

Data: a spoken-task-sized set written once into a temporary folder: ``--utterances`` audio files
(the data config's ``audio_format``: wav, or flac as the spoken task writes) of 1.5 to 5 s at
16 kHz (the length eSpeak NG gives the text task's sentences of at most 40 characters), voiced
harmonics plus noise, transcripts from the text task's grammar, read back through
:func:`lightning_gtn.lightning.speech_sources.cuts_from_folder` (files on disk, as the embedded
spoken task's cache and a user's corpus are).

Loader: :class:`LhotseDataModule` with the settings of ``conf/data/speech.yaml`` where it exists
(else ``conf/data/lhotse.yaml``): filterbanks computed on the fly, duration buckets of
``max_duration`` seconds. Measured: training batches per second over whole epochs with
``num_workers`` 0, 1 and 2 (the time to the first batch, worker start-up included, is given
apart), and the sampler alone (``DynamicBucketingSampler`` over the cuts, no audio read: the
bucketing cost).

Model: the model the data config selects (``data=speech``: ``conf/model/conv_speech.yaml``'s
:class:`ConvEncoder`; a data config that selects none: ``conf/model/conv_gru.yaml``'s
:class:`ConvRNNEncoder`; F from the data) with :class:`lightning_gtn.nn.CTCLoss` and Adam: one
training step (forward, loss, backward,
optimizer step) on the same batches, ``torch.set_num_threads(1)`` as ``train.yaml``'s
``num_threads``. The ratio is loader batches per second over model steps per second; the issue's
target is at least 5 at the default settings.

Run:  python benchmarks/bench_loader.py [--quick] [--utterances 400 --epochs 2 --workers 0 1 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
RATE = 16000


def _model_config(name: str) -> dict:
    """``conf/model/<name>.yaml`` with the configs its ``defaults`` list names merged under it."""
    from omegaconf import OmegaConf

    own = OmegaConf.to_container(OmegaConf.load(ROOT / f"conf/model/{name}.yaml"), resolve=True)
    assert isinstance(own, dict)
    out: dict = {}
    for parent in own.pop("defaults", []):
        out.update(_model_config(parent) if parent != "_self_" else {})
    out.update(own)
    return out


def _settings(data_config: str | None) -> tuple[str, dict, dict, str]:
    """(config name, LhotseDataModule options, model config, audio format) from the configs."""
    from omegaconf import OmegaConf

    candidates = (
        [Path(data_config)] if data_config else [ROOT / "conf/data/speech.yaml", ROOT / "conf/data/lhotse.yaml"]
    )
    data_file = next(p for p in candidates if p.exists())
    data = OmegaConf.to_container(OmegaConf.load(data_file), resolve=True)
    keep = ("num_mel_bins", "max_duration", "num_buckets", "shuffle", "num_workers", "seed", "stack_frames")
    data_opts = {k: data[k] for k in keep if k in data}
    name = "conv_gru"
    for entry in data.get("defaults", []):  # "override /model@_global_.model: <name>"
        for key, value in entry.items() if isinstance(entry, dict) else []:
            if key.startswith("override /model"):
                name = value
    model = _model_config(name)
    model["name"] = name
    return data_file.name, data_opts, model, str(data.get("audio_format", "wav"))


def _write_folder(folder: Path, n: int, seed: int, audio_format: str = "wav") -> None:
    """``n`` audio files (wav or flac) of a voiced buzz with harmonics and noise, and transcripts.txt."""
    import soundfile as sf

    from lightning_gtn.lightning import make_sentences

    rng = np.random.default_rng(seed)
    texts = make_sentences(n, seed=seed, max_chars=40)
    lines = []
    for i in range(n):
        seconds = rng.uniform(1.5, 5.0)
        t = np.arange(int(seconds * RATE)) / RATE
        f0 = rng.uniform(90, 220) * (1 + 0.1 * np.sin(2 * np.pi * rng.uniform(0.5, 3) * t))
        phase = 2 * np.pi * np.cumsum(f0) / RATE
        x = sum(np.sin(k * phase) / k for k in range(1, 12)) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2)
        x = 0.1 * x / np.abs(x).max() + 0.01 * rng.standard_normal(t.shape)
        sf.write(folder / f"utt{i:05d}.{audio_format}", x.astype(np.float32), RATE, subtype="PCM_16")
        lines.append(f"utt{i:05d} {texts[i]}")
    (folder / "transcripts.txt").write_text("\n".join(lines) + "\n")


def _loader_rate(dm, epochs: int) -> tuple[float, float, int, list[dict]]:
    """(batches per second after the first batch, seconds to the first batch, batches, first batches)."""
    loader = dm.train_dataloader()
    first = None
    count = 0
    kept: list[dict] = []
    t0 = time.perf_counter()
    for epoch in range(epochs):
        dm.set_epoch(epoch)
        for batch in loader:
            count += 1
            if first is None:
                first = time.perf_counter() - t0
                t1 = time.perf_counter()
            if len(kept) < 8:
                kept.append(batch)
    elapsed = time.perf_counter() - t1
    return (count - 1) / elapsed, float(first or 0.0), count, kept


def _sampler_rate(dm, epochs: int) -> float:
    loader = dm.train_dataloader()
    n = 0
    t0 = time.perf_counter()
    for epoch in range(epochs):
        loader.epoch = epoch
        for _ in loader.cut_batches():
            n += 1
    return n / (time.perf_counter() - t0)


def _model_steps(batches: list[dict], feature_dim: int, chars: str, model_opts: dict) -> list[float]:
    """Seconds of each training step of the model + CTC + Adam on ``batches`` (a warm-up
    step first, not counted)."""
    import lightning_gtn.lightning as lgl
    from lightning_gtn.lightning import Vocabulary
    from lightning_gtn.nn import CTCLoss

    torch.manual_seed(0)
    vocab = Vocabulary(chars, blank=True)
    opts = {k: v for k, v in model_opts.items() if k not in ("_target_", "name")}
    cls = getattr(lgl, model_opts["_target_"].rsplit(".", 1)[1])  # one of the package's encoders
    net = cls(feature_dim, vocab.num_classes, **opts)
    loss_fn = CTCLoss(zero_infinity=True)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    times = []
    for i, batch in enumerate(batches[:1] + batches):
        t = time.perf_counter()
        targets, target_lengths = vocab.batch_encode(batch["texts"])
        emissions, lengths = net(batch["inputs"], batch["input_lengths"])
        loss = loss_fn(emissions, targets, lengths, target_lengths)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i > 0:  # the first step warms up (numba, allocator)
            times.append(time.perf_counter() - t)
    return times


def _precomputed_row(cuts, tmp: Path, data_opts: dict, epochs: int) -> tuple[str, float, float, int]:
    """The loader over filterbanks computed once and stored as numpy files (``features="precomputed"``;
    Lilcom, Lhotse's compressed storage, is not installed)."""
    from lhotse import Fbank, FbankConfig, NumpyFilesWriter

    from lightning_gtn.lightning.lhotse_data import LhotseDataModule

    t = time.perf_counter()
    extractor = Fbank(FbankConfig(num_filters=int(data_opts.get("num_mel_bins", 80)), sampling_rate=RATE))
    stored = cuts.compute_and_store_features(
        extractor, storage_path=str(tmp / "feats"), storage_type=NumpyFilesWriter, num_jobs=1, progress_bar=False
    ).to_eager()
    once = time.perf_counter() - t
    opts = {k: v for k, v in data_opts.items() if k != "num_mel_bins"}
    dm = LhotseDataModule(stored, stored, features="precomputed", **{**opts, "num_workers": 0})
    dm.setup("fit")
    rate, first, count, _ = _loader_rate(dm, epochs)
    return (
        f"loader, precomputed filterbanks (numpy files; computing them took {once:.0f} s), num_workers=0",
        rate,
        first,
        count,
    )


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--utterances", type=int, default=None)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--workers", type=int, nargs="*", default=[0, 1, 2])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-precomputed", dest="precomputed", action="store_false", help="skip the precomputed row")
    p.add_argument(
        "--data-config", default=None, help="a data config (default: conf/data/speech.yaml, else lhotse.yaml)"
    )
    a = p.parse_args(argv)
    n = a.utterances or (160 if a.quick else 400)
    epochs = a.epochs or (1 if a.quick else 2)
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore", category=UserWarning)

    from lightning_gtn.lightning.lhotse_data import LhotseDataModule
    from lightning_gtn.lightning.speech_sources import cuts_from_folder

    conf_name, data_opts, model_opts, audio_format = _settings(a.data_config)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_loader_") as tmp:
        _write_folder(Path(tmp), n, seed=0, audio_format=audio_format)
        cuts = cuts_from_folder(tmp)
        hours = sum(c.duration for c in cuts) / 3600

        def module(workers: int):
            dm = LhotseDataModule(cuts, cuts, **{**data_opts, "num_workers": workers})
            dm.setup("fit")
            return dm

        dm = module(0)
        sampler = _sampler_rate(dm, epochs)
        feature_dim, chars = dm.feature_dim, dm.chars
        batches = _loader_rate(dm, 1)[3]
        steps = _model_steps(batches, feature_dim, chars, model_opts)  # before and after the loaders
        for w in a.workers:
            rate, first, count, _ = _loader_rate(module(w), epochs)
            rows.append((f"loader, num_workers={w}", rate, first, count))
        if a.precomputed:
            rows.append(_precomputed_row(cuts, Path(tmp), data_opts, epochs))
        steps += _model_steps(batches, feature_dim, chars, model_opts)
    model = 1.0 / statistics.median(steps)
    sizes = [b["inputs"].shape for b in batches]
    mean_b = statistics.mean(s[0] for s in sizes)
    mean_t = statistics.mean(s[1] for s in sizes)
    opts = ", ".join(f"{k}={v}" for k, v in data_opts.items() if k != "num_workers")
    lines = [
        f"CPU, torch threads {a.threads}; {n} synthetic utterances of 1.5-5 s ({60 * hours:.1f} min of 16 kHz audio, "
        f"{audio_format} files) through cuts_from_folder; LhotseDataModule at {conf_name} ({opts}): "
        f"batches of {mean_b:.0f} cuts x {mean_t:.0f} frames x {feature_dim} features on average. Model: "
        f"{model_opts['name']}.yaml's {model_opts['_target_'].rsplit('.', 1)[1]} + CTCLoss + Adam, median "
        f"training step over {len(batches)} of those "
        f"batches, timed before and after the loaders. Loader rates over {epochs} epoch(s) after the first batch.",
        "",
        "| what | batches/s | ms/batch | first batch (s) | x model step rate |",
        "|---|---:|---:|---:|---:|",
        f"| sampler alone (bucketing, no audio) | {sampler:.1f} | {1000 / sampler:.2f} | | {sampler / model:.0f} |",
    ]
    for name, rate, first, _count in rows:
        lines.append(f"| {name} | {rate:.2f} | {1000 / rate:.0f} | {first:.2f} | {rate / model:.1f} |")
    lines.append(f"| model training step (the consumer) | {model:.2f} | {1000 / model:.0f} | | 1.0 |")
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
