"""Loud failures in the mixin: a non-finite training loss stops training (or is skipped, bounded),
and a loss whose blank disagrees with the vocabulary is a start-up error."""

import lightning as L
import pytest
import torch
from torch import nn

from lightning_gtn.lightning import DigitLinesDataModule, NonFiniteLossError, SequenceModule, StructuredLossMixin

CHARS = "0123456789 "
NET = {"_target_": "lightning_gtn.lightning.ConvRNNEncoder", "conv_channels": 8, "hidden_size": 8, "stride": 2}


class NaNAt(StructuredLossMixin, L.LightningModule):
    """Emissions turn NaN on the training batches whose index is in ``bad``."""

    def __init__(self, bad, nonfinite=None):
        super().__init__()
        self.configure_structured_loss("ctc", CHARS, nonfinite=nonfinite)
        self.lin = nn.Linear(8, self.num_classes)
        self.bad = set(bad)
        self.batch = None

    def forward(self, inputs, lengths):
        x = self.lin(inputs)
        if self.training and self.batch in self.bad:
            x = x * float("nan")
        return x.log_softmax(-1), lengths

    def on_train_batch_start(self, batch, batch_idx):
        self.batch = batch_idx


@pytest.fixture(scope="module")
def data():
    dm = DigitLinesDataModule(num_train=32, num_val=8, num_test=8, batch_size=8, eval_batch_size=8)
    dm.setup()
    return dm


def _fit(model, data, **kw):
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_epochs=1,
        limit_val_batches=0,
        **kw,
    )
    trainer.fit(model, datamodule=data)
    return trainer


def test_nonfinite_loss_stops_before_the_optimizer_step(data):
    model = NaNAt(bad={2})
    with pytest.raises(NonFiniteLossError, match=r"global step 2 \(epoch 0, batch 2\)") as e:
        _fit(model, data)
    assert (e.value.global_step, e.value.batch_idx) == (2, 2)
    assert all(torch.isfinite(p).all() for p in model.parameters())  # weights never saw the NaN


def test_skip_skips_with_a_warning_and_is_bounded(data):
    # every batch NaN: all skipped, the weights are exactly the initial ones
    model = NaNAt(bad={0, 1, 2, 3}, nonfinite={"action": "skip", "max_consecutive": 10})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.warns(RuntimeWarning, match="batch skipped"):
        _fit(model, data)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # some batches NaN: the others train
    model = NaNAt(bad={1, 2}, nonfinite={"action": "skip", "max_consecutive": 2})
    with pytest.warns(RuntimeWarning, match=r"batch skipped \(2 in a row, at most 2\)"):
        _fit(model, data)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert not torch.equal(before["lin.weight"], model.lin.weight)

    model = NaNAt(bad={0, 1, 2}, nonfinite={"action": "skip", "max_consecutive": 2})
    with pytest.warns(RuntimeWarning), pytest.raises(NonFiniteLossError, match=r"3 batches in a row"):
        _fit(model, data)


@pytest.mark.parametrize(
    "spec,key",
    [
        ({"action": "ignore"}, "nonfinite.action"),
        ({"max_consecutive": -1}, "nonfinite.max_consecutive"),
        ({"when": 1}, "nonfinite.when"),
    ],
)
def test_bad_nonfinite_options_name_the_key(spec, key):
    with pytest.raises(ValueError, match=rf"^{key}"):
        NaNAt(bad=(), nonfinite=spec)


def test_loss_blank_must_match_the_vocabulary():
    with pytest.raises(ValueError, match=r"^loss\.blank: the loss uses blank id 3 .* blank at id 0"):
        SequenceModule(NET, {"_target_": "lightning_gtn.nn.CTCLoss", "blank": 3}, CHARS, feature_dim=8)
    SequenceModule(NET, {"_target_": "lightning_gtn.nn.CTCLoss", "blank": 0}, CHARS, feature_dim=8)
