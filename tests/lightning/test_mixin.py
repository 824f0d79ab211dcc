import lightning as L
import pytest
import torch
from torch import nn

import lightning_gtn.nn as lnn
from lightning_gtn.lightning import (
    ConvRNNEncoder,
    DigitLinesDataModule,
    SequenceModule,
    StructuredLossMixin,
    Vocabulary,
    build_loss,
)

CHARS = "0123456789 "
NET = {"_target_": "lightning_gtn.lightning.ConvRNNEncoder", "conv_channels": 16, "hidden_size": 16, "stride": 2}


@pytest.fixture(scope="module")
def tiny_data():
    dm = DigitLinesDataModule(num_train=32, num_val=16, num_test=16, batch_size=8, eval_batch_size=8)
    dm.setup()
    return dm


def _trainer(**kw):
    base = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    base.update(kw)
    return L.Trainer(**base)


def test_build_loss_conventions():
    ctc, v = build_loss({"_target_": "lightning_gtn.nn.CTCLoss"}, CHARS)
    assert isinstance(ctc, lnn.CTCLoss) and ctc.blank == 0
    assert v.blank and not v.repeat_label and v.num_classes == 12
    asg, w = build_loss("asg", CHARS)
    assert not w.blank and w.repeat_label and w.num_classes == 12
    # ASG's transitions are parameters of the loss, hence of any model holding it
    assert sum(p.numel() for p in asg.parameters()) > 0
    _, s = build_loss("seq", CHARS)
    assert not s.blank and s.repeat_label


def test_build_loss_errors():
    class Mystery(nn.Module):
        def forward(self, *a):
            return torch.zeros(())

    with pytest.raises(ValueError, match="blank"):
        build_loss(Mystery(), CHARS)
    wrapped, v = build_loss(Mystery(), CHARS, blank=False, repeat_label=False)
    assert isinstance(wrapped, lnn.ModuleLoss) and wrapped.blank is None
    assert not v.blank and v.num_classes == len(CHARS)
    with pytest.raises(ValueError, match="loss.blank"):  # the vocabulary puts the blank at id 0
        build_loss({"_target_": "lightning_gtn.nn.CTCLoss", "blank": 3}, CHARS)
    with pytest.raises(ValueError, match="contradicts"):  # the loss states its own convention
        build_loss(lnn.TargetGraphLoss(lambda t: None), CHARS, blank=True)
    with pytest.raises(
        ValueError, match=r"loss\._target_: 'torch\.nn\.CTCLoss' is not trusted"
    ):  # not a registered loss
        build_loss({"_target_": "torch.nn.CTCLoss"}, CHARS)
    with pytest.raises(ValueError, match="_target_"):
        build_loss({"blank": 0}, CHARS)
    with pytest.raises(ValueError, match="loss._target_"):
        build_loss({"_target_": "lightning_gtn.nn.NoSuchLoss"}, CHARS)
    with pytest.raises(ValueError, match="unknown name"):
        build_loss("nope", CHARS)
    with pytest.raises(ValueError, match="does not match"):
        build_loss("ctc", Vocabulary(CHARS, blank=False))


def test_padded_batch_equals_one_by_one(tiny_data):
    torch.manual_seed(0)
    model = SequenceModule(NET, "ctc", CHARS, feature_dim=8)
    model.eval()
    batch = next(iter(tiny_data.val_dataloader()))
    x, n, texts = batch["inputs"], batch["input_lengths"], batch["texts"]
    targets, target_lengths = model.vocabulary.batch_encode(texts)
    with torch.no_grad():
        em, lengths = model(x, n)
        batch_loss = model.compute_loss(em, lengths, targets, target_lengths)
        singles, decoded = [], []
        for b in range(len(texts)):
            e1, l1 = model(x[b : b + 1, : int(n[b])], n[b : b + 1])
            torch.testing.assert_close(e1[0, : int(l1[0])], em[b, : int(lengths[b])], atol=1e-5, rtol=1e-5)
            t1, tl1 = model.vocabulary.batch_encode([texts[b]])
            singles.append(model.compute_loss(e1, l1, t1, tl1))
            decoded += model.decode(e1, l1)
    torch.testing.assert_close(batch_loss, torch.stack(singles).mean(), atol=1e-4, rtol=1e-4)
    assert model.decode(em, lengths) == decoded


def test_wrong_number_of_classes_is_reported():
    model = SequenceModule(NET, "ctc", CHARS, feature_dim=8)
    model.net = ConvRNNEncoder(8, 5, conv_channels=8, hidden_size=8)
    with pytest.raises(ValueError, match="classes"):
        model.emissions(torch.zeros(2, 10, 8), torch.tensor([10, 7]))


def test_fit_validate_predict_and_metrics(tiny_data):
    torch.manual_seed(0)
    model = SequenceModule(NET, "ctc", CHARS, feature_dim=8, optimizer={"_target_": "torch.optim.Adam", "lr": 1e-2})
    trainer = _trainer(max_epochs=1, limit_train_batches=3)
    trainer.fit(model, datamodule=tiny_data)
    m = trainer.callback_metrics
    for key in ("train/loss", "val/loss", "val/cer", "val/wer"):
        assert key in m and torch.isfinite(m[key]), key
    assert 0.0 <= float(m["val/cer"]) and 0.0 <= float(m["val/wer"]) <= 1.0 + 1e-6
    assert isinstance(trainer.optimizers[0], torch.optim.Adam)
    assert trainer.optimizers[0].param_groups[0]["lr"] == 1e-2
    preds = trainer.predict(model, dataloaders=tiny_data.val_dataloader())
    flat = [p for batch in preds for p in batch]
    assert len(flat) == 16 and all(isinstance(p, str) for p in flat)
    assert set("".join(flat)) <= set(CHARS)
    out = trainer.test(model, datamodule=tiny_data, verbose=False)[0]
    assert set(out) == {"test/loss", "test/cer", "test/wer"}


def test_cer_metric_counts_errors(tiny_data):
    model = SequenceModule(NET, "ctc", CHARS, feature_dim=8)
    model.val_cer.update(["12", "3"], ["12", "34"])
    assert abs(float(model.val_cer.compute()) - 1 / 4) < 1e-6
    model.setup("validate")  # setup resets the metric states
    model.val_cer.update(["1"], ["1"])
    assert float(model.val_cer.compute()) == 0.0


def test_bf16_mixed_precision(tiny_data):
    torch.manual_seed(0)
    model = SequenceModule(NET, "ctc", CHARS, feature_dim=8)
    trainer = _trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, precision="bf16-mixed")
    trainer.fit(model, datamodule=tiny_data)
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    assert torch.isfinite(trainer.callback_metrics["val/cer"])


class UserModel(StructuredLossMixin, L.LightningModule):
    """A user's own model: a plain linear emission layer; training_step overridden."""

    def __init__(self):
        super().__init__()
        self.configure_structured_loss("ctc", chars=CHARS, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
        self.proj = nn.Linear(8, self.num_classes)
        self.calls = 0

    def forward(self, inputs, input_lengths):
        return self.proj(inputs).log_softmax(-1), input_lengths

    def training_step(self, batch, batch_idx):
        self.calls += 1
        loss = super().training_step(batch, batch_idx)
        self.log("train/custom", 2 * loss.detach())
        return 2 * loss


def test_user_subclass_overrides_a_step(tiny_data):
    model = UserModel()
    trainer = _trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1)
    trainer.fit(model, datamodule=tiny_data)
    assert model.calls == 2
    m = trainer.callback_metrics
    assert "train/custom" in m and "val/cer" in m
    assert isinstance(trainer.optimizers[0], torch.optim.SGD)


def test_targets_in_batch_are_used():
    model = UserModel()
    v = model.vocabulary
    targets, lengths = v.batch_encode(["12", "3"])
    batch = {
        "inputs": torch.randn(2, 9, 8),
        "input_lengths": torch.tensor([9, 6]),
        "targets": targets,
        "target_lengths": lengths,
    }
    x, n, t, tl, texts = model.unpack_batch(batch)
    assert texts is None and t is targets
    with pytest.raises(TypeError, match="dict batches"):
        model.unpack_batch((batch["inputs"], batch["input_lengths"]))


def test_target_graph_loss_config_matches_ctc_and_pickles():
    import pickle

    from omegaconf import OmegaConf

    from lightning_gtn.train import CONF_DIR

    graph, v = build_loss(OmegaConf.load(CONF_DIR / "loss" / "graph.yaml"), CHARS)
    ctc, _ = build_loss(OmegaConf.load(CONF_DIR / "loss" / "ctc.yaml"), CHARS)
    assert v.blank
    torch.manual_seed(0)
    em = torch.randn(3, 20, v.num_classes).log_softmax(-1).requires_grad_()
    targets, target_lengths = v.batch_encode(["12", "3 45", "77"])
    lengths = torch.tensor([20, 15, 9])
    a = graph(em, targets, lengths, target_lengths)
    (ga,) = torch.autograd.grad(a, em)
    b = ctc(em, targets, lengths, target_lengths)
    (gb,) = torch.autograd.grad(b, em)
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ga, gb, atol=1e-4, rtol=1e-4)
    clone = pickle.loads(pickle.dumps(graph))
    torch.testing.assert_close(clone(em, targets, lengths, target_lengths), a)


def test_multiprocess_run_says_how_many_steps_it_trains(caplog):
    import logging
    from types import SimpleNamespace

    model = SequenceModule(NET, "ctc", CHARS, feature_dim=8)
    model._trainer = SimpleNamespace(world_size=2, num_training_batches=250, estimated_stepping_batches=1000)
    with caplog.at_level(logging.INFO):
        model.on_train_start()
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert "2 processes" in msg and "an epoch is 250 steps (one process: 500)" in msg
    assert "at most 1000 steps" in msg and "multiply max_epochs by 2" in msg
    caplog.clear()
    model._trainer = SimpleNamespace(world_size=1, num_training_batches=500, estimated_stepping_batches=2000)
    with caplog.at_level(logging.INFO):
        model.on_train_start()
    assert "processes" not in " ".join(r.getMessage() for r in caplog.records)
