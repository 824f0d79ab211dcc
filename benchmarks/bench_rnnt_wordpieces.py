"""The word-piece RNN-T run (``experiment=rnnt_wordpieces``): its batch shapes and its loss memory.

The preset's data (``data=text``, its line length and batch size) and word pieces (learned from its
training transcripts as a run learns them) give real batches; ``--overrides`` measures another
transducer run instead (``--overrides loss=rnnt data=text``). For the first ``--batches`` of
them the table lists ``B``, ``T`` (the transducer model's encoder frames), ``U + 1`` (the longest
target in pieces, plus one) and ``V`` (pieces and the blank), and the bytes the materialised path
would hold for the joiner output and its gradient, ``B * T * (U + 1) * V * 4 * 2`` (float32; the
hidden ``(B, T, U + 1, J)`` and the loss's own gradient copy come on top). That path is not run at
that size.

Memory: the loss step of the preset's loss (``joint_loss`` of the preset's model, forward and
backward, the encoder frames given as a leaf so the encoder's own activations are not counted) in
a FRESH process, after a warm-up step on two examples, with glibc told to mmap every buffer of 4
KiB or more and to give freed memory back at once, and the high-water mark reset through
``/proc/self/clear_refs`` before it: the figure is ``VmHWM - VmRSS`` across the step. It runs the
chunked joiner path (``joiner="chunked"``, the preset's) on the first whole batch, and both paths
(``joiner="chunked"`` and ``"materialised"``) on its first ``--small`` examples, where the
materialised one fits; wall times of the same steps come with them (a shared machine: they move
with the load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from _procmem import peak_growth  # noqa: E402

PRESET = "rnnt_wordpieces"


def _compose(overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lightning_gtn.train import CONF_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        return compose("train", overrides=list(overrides))


def _scored(loss, targets, lengths):
    """The targets the lattice scores: a word-piece loss's pieces, else the targets themselves."""
    return loss.piece_targets(targets, lengths) if hasattr(loss, "piece_targets") else (targets, lengths)


def _batch(vocab, batch):
    """``(inputs, input_lengths, grapheme targets (B, S), target_lengths)`` of a data-module batch."""
    rows = [vocab.encode(t) for t in batch["texts"]]
    S = max(len(r) for r in rows)
    targets = torch.tensor([r + [0] * (S - len(r)) for r in rows], dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    return batch["inputs"], batch["input_lengths"], targets, lengths


def _model(model_cfg: dict, feature_dim: int, num_classes: int):
    from lightning_gtn.lightning import TransducerModel

    torch.manual_seed(0)
    kw = {k: v for k, v in model_cfg.items() if k != "_target_"}
    return TransducerModel(feature_dim=feature_dim, num_classes=num_classes, **kw)


def _worker(path: str, joiner: str, n: int) -> None:
    import gc

    from lightning_gtn.lightning import build_loss

    torch.set_num_threads(1)
    saved = torch.load(path, weights_only=True)
    loss, vocab = build_loss({**saved["loss"], "joiner": joiner}, saved["chars"])
    m = _model(saved["model"], int(saved["inputs"].shape[-1]), int(loss.num_classes or vocab.num_classes))
    x, xl, tg, tl = (saved[k][:n] for k in ("inputs", "input_lengths", "targets", "target_lengths"))

    def step(k: int):
        with torch.no_grad():
            enc, el = m.encode(x[:k], xl[:k])
        enc = enc.detach().requires_grad_()
        m.zero_grad()
        value = loss.joint_loss(m, enc, el, tg[:k], tl[:k])
        value.backward()
        return float(value.detach())

    step(2)  # warm-up: numba's and torch's first calls
    gc.collect()
    t0 = time.perf_counter()
    extra, value = peak_growth(lambda: step(n))
    print(json.dumps({"extra_mb": (extra or 0) / 2**20, "loss": value, "wall": time.perf_counter() - t0}))


def _run(path: str, joiner: str, n: int) -> dict:
    env = dict(os.environ)
    env.update(MALLOC_MMAP_THRESHOLD_="4096", MALLOC_TRIM_THRESHOLD_="0", MALLOC_TOP_PAD_="0")
    cmd = [sys.executable, __file__, "--worker", path, joiner, str(n)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batches", type=int, default=10, help="training batches whose shapes are listed (default 10)")
    p.add_argument("--small", type=int, default=8, help="examples of the batch both paths run on (default 8)")
    p.add_argument("--quick", action="store_true", help="3 batches, and a training set of 3 batches")
    p.add_argument(
        "--overrides", nargs="*", default=[f"experiment={PRESET}"], help=f"the run (default: experiment={PRESET})"
    )
    p.add_argument("--worker", nargs=3, metavar=("FILE", "JOINER", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker(args.worker[0], args.worker[1], int(args.worker[2]))
        return ""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from lightning_gtn.lightning import build_loss

    torch.set_num_threads(1)
    cfg = _compose(args.overrides)
    data_cfg = OmegaConf.to_container(cfg.data, resolve=True)
    loss_cfg = OmegaConf.to_container(cfg.loss, resolve=True)
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    assert isinstance(data_cfg, dict) and isinstance(loss_cfg, dict) and isinstance(model_cfg, dict)
    batches = 3 if args.quick else max(1, args.batches)
    if args.quick:
        data_cfg["num_train"] = 3 * int(data_cfg["batch_size"])
    load0 = os.getloadavg()
    dm = instantiate(data_cfg)
    dm.setup("fit")
    texts = dm.train_set.texts
    loss, vocab = build_loss(loss_cfg, dm.chars, texts=lambda key: texts)
    V = int(loss.num_classes or vocab.num_classes) + int(loss.extra_outputs)
    resolved = {k: v for k, v in loss_cfg.items() if k != "joiner"}
    if getattr(loss, "tokens", None) is not None:
        resolved["tokens"] = list(loss.tokens)  # the learned pieces, as the run has them
    m = _model(model_cfg, dm.feature_dim, V - int(loss.extra_outputs))
    rows, first = [], None
    for i, batch in enumerate(dm.train_dataloader()):
        if i >= batches:
            break
        x, xl, tg, tl = _batch(vocab, batch)
        with torch.no_grad():
            enc, _ = m.encode(x, xl)
        scored, _ = _scored(loss, tg, tl)
        B, T, U1 = int(enc.shape[0]), int(enc.shape[1]), int(scored.shape[1]) + 1
        rows.append((B, T, U1, B * T * U1 * V * 4 * 2))
        if first is None:
            first = (x, xl, tg, tl)
    assert first is not None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "batch.pt")
        x, xl, tg, tl = first
        saved = {"inputs": x, "input_lengths": xl, "targets": tg, "target_lengths": tl}
        torch.save({**saved, "loss": resolved, "chars": "".join(dm.chars), "model": model_cfg}, path)
        B0, n = int(x.shape[0]), min(args.small, int(x.shape[0]))
        full = _run(path, "chunked", B0)
        small = {j: _run(path, j, n) for j in ("chunked", "materialised")}
    load1 = os.getloadavg()
    gib = [r[3] / 2**30 for r in rows]
    r0, s0 = rows[0], (n, rows[0][1], rows[0][2])
    small_mib = n * r0[1] * r0[2] * V * 8 / 2**20
    diff = abs(small["chunked"]["loss"] - small["materialised"]["loss"]) / abs(small["materialised"]["loss"])
    what = (
        f"{len(loss.tokens)} word pieces learned from {len(texts)} training transcripts, "
        if hasattr(loss, "piece_targets")
        else ""
    )
    lines = [
        f"`{' '.join(args.overrides)}`: {type(loss).__name__}, {what}V = {V} joiner outputs, "
        f"batch_size={data_cfg['batch_size']}, model.joiner_dim={model_cfg.get('joiner_dim')}; torch threads 1, "
        f"load average {load0[0]:.1f} -> {load1[0]:.1f} (a shared machine).",
        "",
        "| batch | B | T | U + 1 | V | materialised logits + grad (GiB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {i} | {B} | {T} | {U1} | {V} | {b / 2**30:.2f} |" for i, (B, T, U1, b) in enumerate(rows)]
    lines += [
        "",
        f"Materialised joiner output + gradient over these batches: median {statistics.median(gib):.2f} GiB, "
        f"min {min(gib):.2f}, max {max(gib):.2f} (the materialised path runs only on the first {n} examples below).",
        "",
        "Loss step (joint_loss forward + backward), peak resident growth in a fresh process:",
        "",
        "| examples (B, T, U + 1) | joiner | logits + grad if materialised (MiB) | peak extra (MiB) | wall (s) |",
        "|---|---|---:|---:|---:|",
        f"| batch 0 ({r0[0]}, {r0[1]}, {r0[2]}) | chunked | {r0[3] / 2**20:.0f} | {full['extra_mb']:.0f} | "
        f"{full['wall']:.1f} |",
    ]
    for j in ("chunked", "materialised"):
        lines.append(
            f"| first {n} ({s0[0]}, {s0[1]}, {s0[2]}) | {j} | {small_mib:.0f} | {small[j]['extra_mb']:.0f} | "
            f"{small[j]['wall']:.1f} |"
        )
    ratio = small["chunked"]["extra_mb"] / max(small["materialised"]["extra_mb"], 1e-9)
    lines += [
        "",
        f"chunked / materialised peak on the first {n}: {ratio:.3f}; relative difference of their losses {diff:.1e}.",
        "",
    ]
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
