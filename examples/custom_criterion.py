"""A loss from your own criterion graph, built with ``lightning_gtn.wfst``.

You write a function ``target ids -> acceptor`` with the engine's GTN API;
:class:`lightning_gtn.nn.TargetGraphLoss` caches one compiled graph per target and scores the
batch in one pass. The criterion here is CTC where a blank is *optional*
between different tokens and only forced between repeats; writing CTC by hand and checking it
against :func:`lightning_gtn.functional.ctc_loss` first shows the graphs mean what you think.

As a Hydra config (``conf/loss/my_ctc.yaml``, with this file importable as ``my_criteria``)::

    _target_: lightning_gtn.nn.TargetGraphLoss
    builder: my_criteria.ctc_criterion
    builder_kwargs: {blank: 0}
    blank: 0                 # the blank's id in the targets (the vocabulary puts it at 0)
    repeat_label: false

and train with ``lightning-gtn-train loss=my_ctc trust_modules=[my_criteria]`` (a builder outside
lightning_gtn must be trusted before a config may name it).

Run:  python examples/custom_criterion.py [--steps 400 --lr 1e-2]

With the defaults it trains in about 30 s on one core and ends near 5% val/cer on the embedded
digit lines (lightning-gtn-train's CTC run, 2000 steps on 8000 lines, reaches about 2%).
"""

from __future__ import annotations

import argparse

import lightning as L
import torch

import lightning_gtn.wfst as gtn
from lightning_gtn.functional import ctc_loss
from lightning_gtn.lightning import ConvRNNEncoder, DigitLinesDataModule, StructuredLossMixin
from lightning_gtn.nn import TargetGraphLoss


def ctc_criterion(target, blank: int = 0) -> gtn.Graph:
    """CTC's acceptor: optional blanks around every token, forced only between repeats.

    Nodes alternate blank / token: node ``2i`` means "read blanks after token i - 1" (node 0,
    the only start, "nothing but blanks yet"), node ``2i + 1`` "read token i". Every arc reads
    the label of the node it enters. The last token node and the final blank node accept.
    """
    g = gtn.Graph(False)
    L_ = len(target)
    for n in range(2 * L_ + 1):
        g.add_node(n == 0, n >= 2 * L_ - 1)
    for n in range(2 * L_ + 1):
        label = blank if n % 2 == 0 else target[n // 2]
        g.add_arc(n, n, label)  # stay
        if n + 1 < 2 * L_ + 1:
            g.add_arc(n, n + 1, target[(n + 1) // 2] if n % 2 == 0 else blank)
        if n % 2 == 1 and n + 2 < 2 * L_ + 1 and target[n // 2] != target[n // 2 + 1]:
            g.add_arc(n, n + 2, target[n // 2 + 1])  # skip the blank between different tokens
    return g


class HandBuiltCTCModel(StructuredLossMixin, L.LightningModule):
    """The default emission model trained with the hand-built criterion."""

    def __init__(self, chars: str, lr: float = 1e-2):
        super().__init__()
        # The loss states its token convention (a blank at id 0); the mixin builds the vocabulary
        self.configure_structured_loss(
            TargetGraphLoss(ctc_criterion, blank=0), chars, optimizer=lambda p: torch.optim.Adam(p, lr=lr)
        )
        self.net = ConvRNNEncoder(8, self.num_classes, stride=2, hidden_size=64)

    def forward(self, inputs, input_lengths):
        return self.net(inputs, input_lengths)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--num-train", type=int, default=1000)
    p.add_argument("--lr", type=float, default=1e-2)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)  # small models: one thread is fastest on a shared machine

    # 1. The hand-built criterion against the library's CTC on random log-probabilities.
    B, T, C = 4, 15, 6
    log_probs = torch.randn(B, T, C).log_softmax(-1)
    targets = torch.tensor([[1, 2, 2], [3, 1, 0], [5, 5, 5], [2, 0, 0]])
    target_lengths = torch.tensor([3, 2, 3, 1])
    input_lengths = torch.tensor([15, 12, 9, 4])
    mine = TargetGraphLoss(ctc_criterion, blank=0, reduction="none")(log_probs, targets, input_lengths, target_lengths)
    ref = ctc_loss(log_probs, targets, input_lengths, target_lengths, reduction="none")
    max_diff = float((mine - ref).abs().max())
    print(f"hand-built CTC {mine.numpy().round(4)}\nlibrary CTC    {ref.numpy().round(4)}")

    # 2. Train the default model with it through the mixin.
    data = DigitLinesDataModule(num_train=a.num_train, num_val=100, num_test=100)
    model = HandBuiltCTCModel(data.chars, lr=a.lr)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=a.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        val_check_interval=a.steps,
        check_val_every_n_epoch=None,
    )
    first = None

    class _First(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            nonlocal first
            if first is None:
                first = float(outputs["loss"])

    trainer.callbacks.append(_First())
    trainer.fit(model, datamodule=data)
    last = float(trainer.callback_metrics["train/loss_step"])
    print(f"train/loss {first:.3f} -> {last:.3f}; val/cer {float(trainer.callback_metrics['val/cer']):.3f}")
    return {
        "max_diff": max_diff,
        "first_loss": first,
        "last_loss": last,
        "val/cer": float(trainer.callback_metrics["val/cer"]),
    }


if __name__ == "__main__":
    main()
