"""RNN-T losses in one's own LightningModule: every loss name, the network protocol a loss asks."""

import math
import re
from types import SimpleNamespace

import lightning as L
import pytest
import torch

import lightning_gtn.nn as lnn
from lightning_gtn.lightning import DigitLinesDataModule, StructuredLossMixin
from lightning_gtn.lightning.loss_builder import LOSS_CONFIG_DIR, build_loss, loss_config, loss_names

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
    data = DigitLinesDataModule(num_train=8, num_val=4, num_test=4, batch_size=4)
    data.setup("fit")
    for name in names:
        m = _Named(name)
        if isinstance(loss_config(name).get("denominator"), dict):
            # a denominator recipe is learned from the training transcripts: the loss is built at setup
            assert not hasattr(m, "structured_loss") and m.num_classes == len(CHARS) + 1
            m._trainer = SimpleNamespace(datamodule=data)
            m.setup("fit")
        assert type(m.structured_loss).__qualname__ == loss_config(name)["_target_"].rsplit(".", 1)[1]
    with pytest.raises(ValueError, match=r"loss: unknown name 'nope'; choose from \['asg'"):
        _Named("nope")
    with pytest.raises(ValueError, match="unknown name"):  # a name is never a path
        _Named("../loss/ctc")


def test_own_rnnt_module_trains_with_only_what_the_loss_uses(tmp_path):
    torch.manual_seed(0)
    data = DigitLinesDataModule(num_train=32, num_val=8, num_test=8, batch_size=8, eval_batch_size=8)
    model = OwnTransducer(lnn.RNNTLoss(blank=0))  # a plain RNN-T loss needs no simple_am / simple_lm
    assert isinstance(model.structured_loss, lnn.RNNTLoss) and model.loss_network() is model
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


class _MMIDigits(StructuredLossMixin, L.LightningModule):
    def __init__(self, loss):
        super().__init__()
        self.configure_structured_loss(loss, CHARS)
        self.net = torch.nn.Linear(8, self.num_classes)  # the classes are known before the loss is built

    def forward(self, inputs, input_lengths):
        return self.net(inputs).log_softmax(-1), input_lengths


@pytest.mark.parametrize("name", ["mmi", "ctc_mmi"])
def test_mmi_by_name_prepares_its_denominator_from_the_training_transcripts(name, tmp_path):
    from lightning_gtn import functional as F
    from lightning_gtn import wfst as gtn
    from lightning_gtn.lightning import Vocabulary

    torch.manual_seed(0)
    data = DigitLinesDataModule(num_train=16, num_val=4, num_test=4, batch_size=4, eval_batch_size=4)
    model = _MMIDigits(name)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=2,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=data)
    loss = model.structured_loss
    assert isinstance(loss, lnn.LFMMILoss) and loss.ctc_weight == loss_config(name)["ctc_weight"]
    # the denominator is the one lightning-gtn-train builds from the same transcripts
    vocab = Vocabulary(CHARS, blank=True)
    want = F.denominator_graph([vocab.encode(t) for t in data.train_set.texts], len(CHARS), order=2, topology="ctc")
    assert gtn.equal(loss.denominator, want)
    assert math.isfinite(float(trainer.callback_metrics["train/loss"]))


def test_a_prepared_loss_without_training_transcripts_says_so():
    m = _MMIDigits("mmi")
    m._trainer = SimpleNamespace(datamodule=None)
    with pytest.raises(ValueError, match=r"^loss\.denominator: built from the training transcripts, but the trainer"):
        m.setup("fit")
    with pytest.raises(ValueError, match=r"^loss\.tokens: built from the training transcripts, which are not"):
        build_loss({**loss_config("transducer"), "tokens": 6}, CHARS)


def test_sequence_module_needs_a_prepared_loss():
    from lightning_gtn.lightning import SequenceModule

    with pytest.raises(ValueError, match=r"^loss\.denominator: built from .* prepare the loss config first"):
        SequenceModule({"_target_": "lightning_gtn.lightning.ConvRNNEncoder"}, "mmi", CHARS, feature_dim=8)


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

    msg = r"the loss names ([a-z_0-9, ]+)\), but the loss is CTC"
    with pytest.raises(ValueError, match=msg) as e:
        CTCModule().emissions(torch.zeros(1, 4, 8), torch.tensor([4]))
    assert "loss=" not in str(e.value)
    names = re.search(msg, str(e.value)).group(1).split(", ")
    # the packaged network losses, read from the configs (a new one joins the list by itself)
    assert {"rnnt", "pruned_rnnt", "tdt", "multiblank"} <= set(names) and "ctc" not in names
    assert names == sorted(names)


def test_emissions_of_a_transducer_loss_points_to_outputs():
    class Net(torch.nn.Module):
        def encode(self, x, n): ...
        def predict(self, t, s=None): ...
        def select_state(self, s, i): ...
        def join(self, e, p): ...

    class RNNTModule(StructuredLossMixin, L.LightningModule):
        def __init__(self):
            super().__init__()
            self.configure_structured_loss(lnn.RNNTLoss(blank=0), CHARS)
            self.net = Net()

        def loss_network(self):
            return self.net

    m = RNNTModule()
    assert m.reads_network
    msg = r"the loss RNNTLoss reads the transducer network's encoder frames.*model\.outputs"
    with pytest.raises(ValueError, match=msg):
        m.emissions(torch.zeros(1, 4, 8), torch.tensor([4]))
