"""RNN-T losses in one's own LightningModule: every loss name, the network protocol a loss asks."""

import math

import lightning as L
import pytest
import torch

import lightning_gtn.nn as lnn
from lightning_gtn.lightning import DigitLinesDataModule, StructuredLossMixin
from lightning_gtn.lightning.losses import LOSS_CONFIG_DIR, loss_config, loss_names

CHARS = "0123456789 "


class _Named(StructuredLossMixin, L.LightningModule):
    def __init__(self, loss):
        super().__init__()
        self.configure_structured_loss(loss, CHARS)


class OwnTransducer(StructuredLossMixin, L.LightningModule):
    """The module is its own transducer network: encode, predict, select_state, join (no simple_am)."""

    def __init__(self, loss="rnnt", dim=16):
        super().__init__()
        self.configure_structured_loss(loss, CHARS, optimizer=lambda p: torch.optim.Adam(p, lr=3e-3))
        V = self.num_classes
        self.encoder = torch.nn.GRU(8, dim, batch_first=True)
        self.embed = torch.nn.Embedding(V, dim)
        self.out = torch.nn.Linear(dim, V)

    def encode(self, inputs, input_lengths):
        return self.encoder(inputs)[0], input_lengths

    def predict(self, tokens, state=None):
        return self.embed(tokens), None

    def select_state(self, state, index):
        return state

    def join(self, enc, pred):
        return self.out(torch.tanh(enc + pred))


def test_every_packaged_loss_name_builds():
    names = loss_names()
    assert names == sorted(p.stem for p in LOSS_CONFIG_DIR.glob("*.yaml")) and "rnnt" in names
    for name in names:
        if isinstance(loss_config(name).get("denominator"), dict):
            # a denominator recipe is built from training transcripts: the error says how to give the graph
            with pytest.raises(ValueError, match=r"loss: .*denominator: .*recipe.*denominator_graph"):
                _Named(name)
            continue
        m = _Named(name)
        assert type(m.structured_loss).__qualname__ == loss_config(name)["_target_"].rsplit(".", 1)[1]
    with pytest.raises(ValueError, match=r"loss: unknown name 'nope'; choose from \['asg'"):
        _Named("nope")
    with pytest.raises(ValueError, match="unknown name"):  # a name is never a path
        _Named("../loss/ctc")


def test_own_rnnt_module_trains_with_only_what_the_loss_uses(tmp_path):
    torch.manual_seed(0)
    data = DigitLinesDataModule(num_train=32, num_val=8, num_test=8, batch_size=8, eval_batch_size=8)
    model = OwnTransducer(lnn.RNNTLoss(blank=0))  # a plain RNN-T loss needs no simple_am / simple_lm
    assert isinstance(model.structured_loss, lnn.RNNTLoss) and model.transducer_network() is model
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=3,
        limit_val_batches=1,
        num_sanity_val_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=data)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert math.isfinite(metrics["train/loss"]) and 0 <= metrics["val/cer"]


def test_network_protocol_checked_at_construction():
    # the pruned loss's simple loss reads simple_am / simple_lm: asked for at once, in library words
    with pytest.raises(ValueError, match=r"PrunedRNNTLoss .*lacks simple_am, simple_lm$") as e:
        OwnTransducer("pruned_rnnt")
    assert "model=" not in str(e.value)

    class NoSelect(OwnTransducer):
        select_state = None

    with pytest.raises(ValueError, match=r"RNNTLoss .*NoSelect\) lacks select_state$"):
        NoSelect("rnnt")

    class Later(StructuredLossMixin, L.LightningModule):  # self.net assigned after the loss
        def __init__(self):
            super().__init__()
            self.configure_structured_loss("rnnt", CHARS)
            self.net = torch.nn.Linear(2, 2)

    m = Later()
    with pytest.raises(ValueError, match=r"self\.net \(Linear\) lacks encode, predict, select_state, join"):
        m.setup("fit")


def test_transducer_network_with_another_loss_is_named_in_library_words():
    class Net(torch.nn.Module):
        def encode(self, x, n): ...
        def predict(self, t, s=None): ...
        def select_state(self, s, i): ...
        def join(self, e, p): ...

    class CTCModule(StructuredLossMixin, L.LightningModule):
        def __init__(self):
            super().__init__()
            self.configure_structured_loss("ctc", CHARS)
            self.net = Net()

    msg = r"the loss names rnnt, pruned_rnnt, tdt, multiblank\), but the loss is CTC"
    with pytest.raises(ValueError, match=msg) as e:
        CTCModule().emissions(torch.zeros(1, 4, 8), torch.tensor([4]))
    assert "loss=" not in str(e.value)
