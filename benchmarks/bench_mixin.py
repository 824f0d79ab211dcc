"""Overhead of StructuredLossMixin over a hand-written LightningModule step with the same loss.

Both modules train the same network (the default conv + BiGRU) with the same
:class:`lightning_gtn.nn.CTCLoss` on the same digit-line batches; the hand-written one encodes
targets, calls the network and the loss and logs ``train/loss`` itself, the mixin adds its
batch unpacking, checks and adapter. Time per training step (forward, loss, backward,
optimizer) is taken by a callback from batch start to batch end; runs alternate between the two
modules so load changes on a shared machine hit both; the table reports medians.

Run:  python benchmarks/bench_mixin.py [--quick] [--steps 40 --rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import lightning as L
import torch

from lightning_gtn.lightning import ConvRNNEncoder, DigitLinesDataModule, SequenceModule, Vocabulary
from lightning_gtn.nn import CTCLoss

NETWORK = {
    "_target_": "lightning_gtn.lightning.ConvRNNEncoder",
    "conv_channels": 64,
    "kernel_size": 5,
    "stride": 2,
    "hidden_size": 64,
}


class HandWritten(L.LightningModule):
    """The baseline: what a user writes without the mixin."""

    def __init__(self, chars: str):
        super().__init__()
        self.vocab = Vocabulary(chars, blank=True)
        kw = {k: v for k, v in NETWORK.items() if k != "_target_"}
        self.net = ConvRNNEncoder(8, self.vocab.num_classes, **kw)
        self.loss = CTCLoss(zero_infinity=True)

    def training_step(self, batch, batch_idx):
        targets, target_lengths = self.vocab.batch_encode(batch["texts"])
        emissions, lengths = self.net(batch["inputs"], batch["input_lengths"])
        loss = self.loss(emissions, targets, lengths, target_lengths)
        self.log("train/loss", loss, on_step=True, on_epoch=True, batch_size=batch["inputs"].shape[0])
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


class _StepTimer(L.Callback):
    def __init__(self):
        self.times: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._t = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.times.append(time.perf_counter() - self._t)


def _time(make, data, steps: int) -> list[float]:
    torch.manual_seed(0)
    model = make()
    timer = _StepTimer()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
        num_sanity_val_steps=0,
    )
    trainer.fit(model, train_dataloaders=data.train_dataloader())
    return timer.times[3:]  # drop warm-up steps


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    steps = a.steps or (25 if a.quick else 60)
    rounds = a.rounds or (3 if a.quick else 5)
    torch.set_num_threads(a.threads)
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    data = DigitLinesDataModule(num_train=32 * (steps + 1), num_val=10, num_test=10, batch_size=32)
    data.setup()
    chars = data.chars
    makers = {
        "hand-written LightningModule": lambda: HandWritten(chars),
        "StructuredLossMixin (SequenceModule)": lambda: SequenceModule(
            NETWORK,
            {"_target_": "lightning_gtn.nn.CTCLoss", "zero_infinity": True},
            chars,
            8,
            optimizer={"_target_": "torch.optim.Adam", "lr": 3e-3},
        ),
    }
    samples: dict[str, list[float]] = {k: [] for k in makers}
    for _ in range(rounds):
        for name, make in makers.items():
            samples[name] += _time(make, data, steps)
    base = statistics.median(samples["hand-written LightningModule"])
    lines = [
        f"CPU, {a.threads} thread(s), batch 32 digit lines, CTC, {rounds} alternating rounds x {steps} steps; "
        "median time per training step (forward + loss + backward + optimizer).",
        "",
        "| module | median ms/step | vs hand-written |",
        "|---|---:|---:|",
    ]
    for name, ts in samples.items():
        med = statistics.median(ts)
        lines.append(f"| {name} | {1000 * med:.1f} | {100 * (med / base - 1):+.1f}% |")
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
