"""TransducerModel (the protocol of nn.rnnt) and the mixin's RNN-T seam: shapes, the prediction
network stepped one token at a time equals it run over the whole history, the seam's errors, the
extra joiner outputs and the global step reaching the loss, training/decoding through the mixin,
and a checkpoint that loads with weights_only."""

import itertools

import lightning as L
import pytest
import torch

from lightning_gtn import trust
from lightning_gtn.lightning import DigitLinesDataModule, SequenceModule, TransducerModel
from lightning_gtn.nn import MultiBlankRNNTLoss, RNNTLoss, TDTLoss
from lightning_gtn.nn.rnnt import RNNTStructuredLoss

CHARS = "0123456789 "
SMALL = dict(conv_channels=8, hidden_size=8, predictor_dim=8, joiner_dim=12, stride=2)
NET = {"_target_": "lightning_gtn.lightning.TransducerModel", **SMALL}
LOSS = {"_target_": f"{__name__}.TorchRNNTLoss"}
STEPS = {"_target_": f"{__name__}.StepRecordingRNNTLoss", "blank": 0}
HERE = [__name__.split(".")[0]]  # trusted inside the tests that build TorchRNNTLoss from a config


class TorchRNNTLoss(RNNTStructuredLoss):
    """RNN-T by a plain torch forward recursion (row by row over t; along u a log-cumsum), for
    these tests only: alpha[t, u] = logaddexp(alpha[t-1, u] + blank[t-1, u], alpha[t, u-1] + emit[t, u-1])."""

    def __init__(self, blank: int = 0, reduction: str = "mean", extra_outputs: int = 0):
        super().__init__()
        self.blank = blank
        self.reduction = reduction
        self.extra_outputs = extra_outputs
        self.steps: list[int] = []

    def set_step(self, step: int) -> None:
        self.steps.append(step)

    def forward(self, logits, targets, logit_lengths, target_lengths):
        if self.extra_outputs:
            logits = logits[..., : logits.shape[-1] - self.extra_outputs]
        lp = logits.float().log_softmax(-1)
        B, T, U1, _ = lp.shape
        blank = lp[..., self.blank]
        idx = targets[:, None, : U1 - 1, None].long().expand(B, T, U1 - 1, 1)
        emit = lp[:, :, :-1].gather(-1, idx).squeeze(-1)
        E = torch.cat([lp.new_zeros(B, T, 1), emit.cumsum(-1)], -1)
        first = torch.full((B, U1), -1e30, dtype=lp.dtype)
        first[:, 0] = 0
        rows: list[torch.Tensor] = []
        for t in range(T):
            start = first if t == 0 else rows[-1] + blank[:, t - 1]
            rows.append(E[:, t] + torch.logcumsumexp(start - E[:, t], -1))
        alpha = torch.stack(rows, 1)
        b = torch.arange(B)
        tl, ul = logit_lengths.long() - 1, target_lengths.long()
        loss = -(alpha[b, tl, ul] + blank[b, tl, ul])
        return loss.mean() if self.reduction == "mean" else loss.sum() if self.reduction == "sum" else loss


class StepRecordingRNNTLoss(RNNTLoss):
    """nn.RNNTLoss that records the steps the mixin tells it (the pruned loss's warm-up reads them)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.steps: list[int] = []

    def set_step(self, step: int) -> None:
        self.steps.append(step)


def _brute(lp, y, T):
    """-log P(y) of one example by enumerating every path of T blanks and len(y) labels."""
    U, scores = len(y), []
    for pos in itertools.combinations(range(T - 1 + U), U):
        t = u = 0
        s = lp.new_zeros(())
        for i in range(T - 1 + U):
            if i in pos:
                s, u = s + lp[t, u, y[u]], u + 1
            else:
                s, t = s + lp[t, u, 0], t + 1
        scores.append(s + lp[T - 1, U, 0])
    return -torch.logsumexp(torch.stack(scores), 0)


def test_reference_loss_equals_path_enumeration():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 3, 5, dtype=torch.float64)
    targets = torch.tensor([[1, 2], [3, 0]])
    got = TorchRNNTLoss(reduction="none")(logits, targets, torch.tensor([4, 3]), torch.tensor([2, 1]))
    lp = logits.log_softmax(-1)
    want = torch.stack([_brute(lp[0], [1, 2], 4), _brute(lp[1], [3], 3)])
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("predictor", ["stateless", "lstm"])
def test_shapes_and_stepwise_prediction(predictor):
    torch.manual_seed(0)
    m = TransducerModel(6, 7, predictor=predictor, context_size=3, extra_outputs=2, **SMALL).eval()
    enc, lengths = m.encode(torch.randn(3, 15, 6), torch.tensor([15, 9, 1]))
    assert enc.shape == (3, 8, 12) and lengths.tolist() == [8, 5, 1]
    tokens = torch.tensor([[0, 3, 4, 4, 1], [0, 6, 2, 0, 0], [0, 1, 1, 1, 1]])
    pred, _ = m.predict(tokens)
    assert pred.shape == (3, 5, 12)
    assert m.join(enc[:, :, None], pred[:, None]).shape == (3, 8, 5, 7 + 2)
    assert m.simple_am(enc).shape == (3, 8, 7) and m.simple_lm(pred).shape == (3, 5, 7)
    # one token at a time through the state gives the same outputs as the whole history
    state, steps = None, []
    for s in range(tokens.shape[1]):
        out, state = m.predict(tokens[:, s : s + 1], state)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), pred, rtol=1e-5, atol=1e-6)
    # select_state picks hypotheses: row 2 alone continues as it does in the batch
    one, _ = m.predict(torch.tensor([[5]]), m.select_state(state, torch.tensor([2])))
    all3, _ = m.predict(torch.tensor([[5], [5], [5]]), state)
    torch.testing.assert_close(one[0], all3[2], rtol=1e-5, atol=1e-6)


def test_stateless_predictor_sees_only_its_context():
    torch.manual_seed(0)
    m = TransducerModel(6, 7, context_size=2, **SMALL)
    a, _ = m.predict(torch.tensor([[0, 3, 1, 4]]))
    b, _ = m.predict(torch.tensor([[0, 5, 1, 4]]))
    assert not torch.allclose(a[0, 1], b[0, 1]) and not torch.allclose(a[0, 2], b[0, 2])
    torch.testing.assert_close(a[0, 3], b[0, 3])  # the last two tokens are equal: 1, 4


def test_constructor_and_predict_errors():
    with pytest.raises(ValueError, match="model.predictor"):
        TransducerModel(6, 7, predictor="gru")
    with pytest.raises(ValueError, match="model.context_size"):
        TransducerModel(6, 7, context_size=0)
    with pytest.raises(ValueError, match="model.extra_outputs"):
        TransducerModel(6, 7, extra_outputs=-1)
    m = TransducerModel(6, 7, **SMALL)
    with pytest.raises(ValueError, match=r"tokens must be ids in \[0, 7\)"):
        m.predict(torch.tensor([[0, 7]]))
    with pytest.raises(ValueError, match=r"\(N, S\)"):
        m.predict(torch.tensor([0, 1]))


def test_joint_loss_of_the_model_equals_the_lattice_scored_directly():
    torch.manual_seed(0)
    m = TransducerModel(6, 5, **SMALL)
    enc, lengths = m.encode(torch.randn(2, 12, 6), torch.tensor([12, 7]))
    targets, target_lengths = torch.tensor([[1, 2, 3], [4, 4, 0]]), torch.tensor([3, 2])
    loss = TorchRNNTLoss(reduction="none")
    got = loss.joint_loss(m, enc, lengths, targets, target_lengths)
    pred, _ = m.predict(torch.tensor([[0, 1, 2, 3], [0, 4, 4, 0]]))
    lp = m.join(enc[:, :, None], pred[:, None]).log_softmax(-1)
    want = torch.stack([_brute(lp[0], [1, 2, 3], 6), _brute(lp[1], [4, 4], 4)])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- the seam
def test_rnnt_loss_needs_a_transducer_network_and_vice_versa():
    conv = {"_target_": "lightning_gtn.lightning.ConvRNNEncoder", "conv_channels": 8, "hidden_size": 8}
    with trust.trusted(HERE), pytest.raises(ValueError, match="needs a network that offers them.*add model=transducer"):
        SequenceModule(conv, LOSS, CHARS, feature_dim=8)
    with pytest.raises(ValueError, match="model=transducer needs an RNN-T loss"):
        SequenceModule(NET, "ctc", CHARS, feature_dim=8)


def test_mixin_names_what_a_network_lacks():
    with trust.trusted(HERE):
        model = SequenceModule(NET, LOSS, CHARS, feature_dim=8)
    model.net = torch.nn.Linear(3, 3)  # a user's module that swapped its network
    with pytest.raises(ValueError, match=r"self\.net \(Linear\) lacks encode, predict, select_state, join$"):
        model.outputs(torch.zeros(1, 10, 8), torch.tensor([10]))


def test_extra_outputs_come_from_the_loss():
    with trust.trusted(HERE):
        model = SequenceModule(NET, {**LOSS, "extra_outputs": 3}, CHARS, feature_dim=8)
        assert model.net.joiner.out_features == len(CHARS) + 1 + 3
        with pytest.raises(ValueError, match="model.extra_outputs: 2 does not match the loss's 3"):
            SequenceModule({**NET, "extra_outputs": 2}, {**LOSS, "extra_outputs": 3}, CHARS, feature_dim=8)


@pytest.fixture(scope="module")
def tiny_data():
    dm = DigitLinesDataModule(num_train=24, num_val=8, num_test=8, batch_size=8, eval_batch_size=8)
    dm.setup()
    return dm


def test_training_steps_reach_the_loss_and_decode(tiny_data, tmp_path):
    torch.manual_seed(0)
    with trust.trusted(HERE):
        model = SequenceModule(NET, STEPS, CHARS, feature_dim=8, optimizer={"_target_": "torch.optim.Adam", "lr": 1e-2})
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    trainer.fit(model, datamodule=tiny_data)
    assert model.structured_loss.steps == [0, 1, 2]  # the global step before each batch
    m = trainer.callback_metrics
    for key in ("train/loss", "val/loss", "val/cer", "val/wer"):
        assert key in m and torch.isfinite(m[key]), key
    after = model.net.state_dict()
    for name in ("embedding.weight", "context.weight", "joiner.weight", "encoder.output.weight"):
        assert not torch.equal(before[name], after[name]), f"{name} was not trained"
    preds = [p for batch in trainer.predict(model, dataloaders=tiny_data.val_dataloader()) for p in batch]
    assert len(preds) == 8 and set("".join(preds)) <= set(CHARS)
    # checkpoints are data: the transducer's config loads back with weights_only=True
    path = tmp_path / "t.ckpt"
    trainer.save_checkpoint(path)
    with trust.trusted(HERE):
        back = SequenceModule.load_from_checkpoint(str(path), map_location="cpu")
    batch = next(iter(tiny_data.val_dataloader()))
    model.eval(), back.eval()
    with torch.no_grad():
        x, n = batch["inputs"], batch["input_lengths"]
        assert model.decode(*model.outputs(x, n)) == back.decode(*back.outputs(x, n))
    assert isinstance(back.net, TransducerModel) and back.net.joiner.out_features == len(CHARS) + 1


def test_checkpoint_naming_an_untrusted_loss_is_refused(tmp_path):
    with trust.trusted(HERE):
        model = SequenceModule(NET, LOSS, CHARS, feature_dim=8)
    path = tmp_path / "t.ckpt"
    torch.save(
        {
            "state_dict": model.state_dict(),
            "hyper_parameters": dict(model.hparams),
            "pytorch-lightning_version": L.__version__,
        },
        path,
    )
    with pytest.raises(trust.UntrustedTargetError, match=r"^loss\._target_"):
        SequenceModule.load_from_checkpoint(str(path), map_location="cpu")


def test_decoder_configs_match_the_loss():
    from lightning_gtn.lightning.decoding import NetworkDecoder, build_decoder
    from lightning_gtn.lightning.vocabulary import Vocabulary
    from lightning_gtn.nn import CTCLoss

    vocab = Vocabulary(CHARS)
    loss = TorchRNNTLoss()
    assert isinstance(build_decoder(None, loss, vocab), NetworkDecoder)
    d = build_decoder({"name": "greedy", "max_symbols_per_frame": 2}, loss, vocab)
    assert d.name == "greedy" and d.max_symbols_per_frame == 2
    assert build_decoder({"name": "rnnt_beam", "beam_size": 3}, loss, vocab).beam_size == 3
    with pytest.raises(ValueError, match="decoded by decoder=greedy or decoder=rnnt_beam"):
        build_decoder({"name": "beam"}, loss, vocab)
    with pytest.raises(ValueError, match="decoder=rnnt_beam decodes RNN-T losses"):
        build_decoder({"name": "rnnt_beam"}, CTCLoss(), vocab)
    with pytest.raises(ValueError, match="max_symbols_per_frame"):
        build_decoder({"name": "greedy", "max_symbols_per_frame": 0}, loss, vocab)


def test_big_blanks_are_read_in_the_multiblank_layout():
    from lightning_gtn.lightning.decoding import build_decoder
    from lightning_gtn.lightning.vocabulary import Vocabulary
    from lightning_gtn.nn import MultiBlankRNNTLoss, TDTLoss

    def big_blanks(loss, V):  # what the loss declares for greedy decoding
        return loss.decoding(V).options["big_blank_durations"]

    # with the blank at 0 the big blanks are appended from the last class down: 14 is 2 frames
    assert big_blanks(MultiBlankRNNTLoss(blank=0, big_blank_durations=[2, 4, 8]), 12) == [8, 4, 2]
    mb = MultiBlankRNNTLoss(blank=0, big_blank_durations=[2, 4, 8], big_blank_ids=[12, 13, 14])
    assert big_blanks(mb, 12) == [2, 4, 8]
    mb.big_blank_ids = [3, 13, 14]
    with pytest.raises(ValueError, match="extra joiner outputs 12..14"):
        big_blanks(mb, 12)
    assert TDTLoss(blank=0, durations=[0, 1, 2]).decoding(12).options == {"durations": [0, 1, 2]}
    # the modified beam search is refused by the loss's own description, naming it
    vocab = Vocabulary(CHARS)
    for loss in (MultiBlankRNNTLoss(blank=0, big_blank_durations=[2]), TDTLoss(blank=0, durations=[0, 1])):
        assert loss.decoding(vocab.num_classes).beam is not None
        with pytest.raises(ValueError, match=rf"^decoder=rnnt_beam: .*{type(loss).__name__} has durations"):
            build_decoder({"name": "rnnt_beam"}, loss, vocab)
    assert MultiBlankRNNTLoss(blank=0, big_blank_durations=[]).decoding(12).beam is None


@pytest.mark.slow
def test_loss_rnnt_config_trains_the_transducer_end_to_end(tmp_path):
    """``loss=rnnt`` alone picks model=transducer; a few dozen steps on digits_small lower the
    training loss, and validation decodes with the greedy search."""
    import csv

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from lightning_gtn.train import CONF_DIR, run

    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose(
            "train",
            overrides=["loss=rnnt", "data=digits_small", "trainer.max_epochs=5", "trainer.log_every_n_steps=1"]
            + ["trainer.enable_progress_bar=false", "callbacks=none"],
            return_hydra_config=True,
        )
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(tmp_path)
        cfg.hydra.job.num = 0
    HydraConfig.instance().set_config(cfg)
    assert cfg.model._target_ == "lightning_gtn.lightning.TransducerModel"
    metrics = run(cfg, output_dir=tmp_path)
    assert metrics["global_step"] == 40
    rows = list(csv.DictReader(open(tmp_path / "csv" / "metrics.csv")))
    epochs = [float(r["train/loss_epoch"]) for r in rows if r.get("train/loss_epoch")]
    assert len(epochs) == 5 and epochs[-1] < 0.8 * epochs[0], epochs
    assert 0.0 <= metrics["val/cer"] and metrics["val/wer"] <= 1.0 + 1e-6


def test_a_transducer_too_large_to_build_is_refused_before_it_is_built():
    """10^6 chars with joiner_dim = predictor_dim = 65536 asked for 262 GB: the whole network's
    weights are counted first and the message names the settings; the estimate bounds the real count."""
    import lightning_gtn.lightning.transducer as tr

    with pytest.raises(ValueError, match=r"model.num_classes=1000001 .*model.joiner_dim=65536 .*over the limit"):
        TransducerModel(feature_dim=8, num_classes=10**6 + 1, predictor_dim=65536, joiner_dim=65536)
    with pytest.raises(ValueError, match=r"model.extra_outputs=1000000000 .*over the limit"):
        TransducerModel(feature_dim=8, num_classes=5, extra_outputs=10**9)
    for kw in (dict(), dict(predictor="lstm", predictor_dim=40, joiner_dim=30, extra_outputs=3)):
        seen: list = []
        real = tr._check_params
        tr._check_params = lambda n, sizes, seen=seen: seen.append(n)
        try:
            net = TransducerModel(feature_dim=8, num_classes=7, **kw)
        finally:
            tr._check_params = real
        n = sum(p.numel() for p in net.parameters())
        assert n <= seen[-1] <= 1.1 * n, (seen, n)


@pytest.mark.parametrize("dropout", [float("nan"), 1.0, True, "0.1"])
def test_a_checkpoint_dropout_out_of_range_is_a_config_error(tmp_path, dropout):
    from lightning_gtn.evaluate import load_model
    from lightning_gtn.train import ConfigError
    from tests.lightning.test_checkpoint_trust import NET, write_checkpoint

    ckpt = write_checkpoint(tmp_path / "m.ckpt", network={**NET, "dropout": dropout})
    with pytest.raises(ConfigError, match=r"model.dropout must be a number in \[0, 1\)"):
        load_model(ckpt)
    with pytest.raises(ValueError, match=r"model.dropout must be a number in \[0, 1\)"):
        TransducerModel(feature_dim=8, num_classes=5, dropout=dropout)


def test_joint_loss_bounds_the_joiner_before_it_runs(monkeypatch):
    """A 1 s cut with a 400,000-character transcript asked the joiner for 30.7 GB: the lattice's
    B * T * (U + 1) * (J + V) is checked before the joiner (or the prediction network) runs."""
    import lightning_gtn.nn.rnnt as rnnt

    m = TransducerModel(6, 5, **SMALL)
    calls = []
    monkeypatch.setattr(m, "predict", lambda *a, **k: calls.append(a) or TransducerModel.predict(m, *a, **k))
    long = torch.ones(1, 400_000, dtype=torch.long)
    materialised = RNNTLoss(blank=0, joiner="materialised")
    with pytest.raises(ValueError, match=r"B \* T \* \(U \+ 1\) \* J = 1 \* 500 \* 400001 \* 12 = .* over the limit"):
        materialised.joint_loss(m, torch.zeros(1, 500, 12), torch.tensor([500]), long, torch.tensor([400_000]))
    assert not calls
    # within the bound for the hidden (J = 12), over it once V = 5 is known: 2 * 12 * 4 * 17 = 1632
    enc, lengths = m.encode(torch.randn(2, 24, 6), torch.tensor([24, 20]))
    targets, target_lengths = torch.tensor([[1, 2, 3], [4, 4, 0]]), torch.tensor([3, 2])
    monkeypatch.setattr(rnnt, "MAX_JOINER_VALUES", 1631)
    with pytest.raises(ValueError, match=r"\(12 \+ 5\) = 1,632 values, over the limit of 1,631"):
        materialised.joint_loss(m, enc, lengths, targets, target_lengths)
    # the chunked path (the default) never holds the joiner output: bounded by the joiner loss's nodes
    assert torch.isfinite(RNNTLoss(blank=0).joint_loss(m, enc, lengths, targets, target_lengths))
    monkeypatch.setattr(rnnt, "MAX_JOINER_VALUES", 1632)
    assert torch.isfinite(materialised.joint_loss(m, enc, lengths, targets, target_lengths))
    with pytest.raises(ValueError, match=r"B \* T \* \(U \+ 1\) = 1 \* 500 \* 400001 = .* nodes is over the limit"):
        RNNTLoss(blank=0).joint_loss(m, torch.zeros(1, 500, 12), torch.tensor([500]), long, torch.tensor([400_000]))


def _joint_grads(loss, m, enc, lengths, targets, target_lengths):
    """The loss of ``m``'s lattice through ``loss.joint_loss`` and the gradients of the encoder
    frames and of ``m``'s parameters."""
    m.zero_grad()
    enc = enc.detach().requires_grad_()
    value = loss.joint_loss(m, enc, lengths, targets, target_lengths)
    value.sum().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    return value.detach(), {"encoder_out": enc.grad, **grads}


@pytest.mark.parametrize(
    "options",
    [dict(), dict(reduction="none", clamp=0.05), dict(reduction="sum", fastemit_lambda=0.01, zero_infinity=True)],
)
def test_joint_loss_chunked_equals_materialised(options):
    torch.manual_seed(0)
    m = TransducerModel(6, 5, **SMALL).double()  # the encoder's output layer computes in float32
    enc, lengths = torch.randn(3, 8, 12, dtype=torch.float64), torch.tensor([8, 6, 1])
    # the third example has 1 encoder frame for 3 labels: fine for RNN-T (several labels a frame)
    targets, target_lengths = torch.tensor([[1, 2, 3], [4, 4, 0], [2, 1, 3]]), torch.tensor([3, 2, 3])
    chunked, materialised = RNNTLoss(blank=0, **options), RNNTLoss(blank=0, joiner="materialised", **options)
    assert chunked.chunked(m) and not materialised.chunked(m)
    got, got_grads = _joint_grads(chunked, m, enc, lengths, targets, target_lengths)
    want, want_grads = _joint_grads(materialised, m, enc, lengths, targets, target_lengths)
    torch.testing.assert_close(got, want, rtol=1e-7, atol=0)
    assert got_grads.keys() == want_grads.keys() and "joiner.weight" in got_grads
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], rtol=1e-7, atol=1e-12, msg=name)


@pytest.mark.parametrize(
    "make",
    [
        lambda **k: TDTLoss(blank=0, durations=[0, 1, 2], **k),
        lambda **k: TDTLoss(blank=0, durations=[1, 3], sigma=0.05, omega=0.3, reduction="sum", **k),
        lambda **k: MultiBlankRNNTLoss(blank=0, big_blank_durations=[2, 4], **k),
        lambda **k: MultiBlankRNNTLoss(blank=0, big_blank_durations=[3], sigma=0.05, reduction="none", **k),
    ],
)
def test_duration_joint_loss_chunked_equals_materialised(make):
    """TDT and multi-blank RNN-T: joiner="chunked" (the duration joiner losses) gives the loss and
    every parameter's gradient of joiner="materialised" (the losses of ``network.join``'s output)."""
    torch.manual_seed(0)
    chunked, materialised = make(), make(joiner="materialised")
    m = TransducerModel(6, 5, **{**SMALL, "extra_outputs": chunked.extra_outputs}).double()
    enc, lengths = torch.randn(3, 8, 12, dtype=torch.float64), torch.tensor([8, 6, 5])
    targets, target_lengths = torch.tensor([[1, 2, 3], [4, 4, 0], [2, 1, 3]]), torch.tensor([3, 2, 3])
    assert chunked.chunked(m) and not materialised.chunked(m) and chunked.joiner == "chunked"
    got, got_grads = _joint_grads(chunked, m, enc, lengths, targets, target_lengths)
    want, want_grads = _joint_grads(materialised, m, enc, lengths, targets, target_lengths)
    assert torch.isfinite(want).all() and want.abs().sum() > 0
    torch.testing.assert_close(got, want, rtol=1e-7, atol=0)
    assert got_grads.keys() == want_grads.keys() and "joiner.weight" in got_grads
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], rtol=1e-7, atol=1e-12, msg=name)


def test_duration_joint_loss_falls_back_to_the_materialised_joiner(monkeypatch):
    """FastEmit or clamp (which the duration joiner losses lack), or a network without
    ``joiner_parameters``, score ``network.join`` as joiner="materialised" does."""
    import lightning_gtn.functional as lgf

    torch.manual_seed(0)
    monkeypatch.setattr(lgf, "tdt_joiner_loss", None)  # never called on these paths
    monkeypatch.setattr(lgf, "multiblank_rnnt_joiner_loss", None)
    targets, target_lengths = torch.tensor([[1, 2, 3], [4, 4, 0]]), torch.tensor([3, 2])
    for cls, kw in ((TDTLoss, dict(durations=[0, 1, 2])), (MultiBlankRNNTLoss, dict(big_blank_durations=[2]))):
        m = TransducerModel(6, 5, **{**SMALL, "extra_outputs": len(next(iter(kw.values())))})
        enc, lengths = m.encode(torch.randn(2, 12, 6), torch.tensor([12, 7]))
        pred, _ = m.predict(torch.tensor([[0, 1, 2, 3], [0, 4, 4, 0]]))
        logits = m.join(enc[:, :, None], pred[:, None])
        for options in (dict(fastemit_lambda=0.01), dict(clamp=0.1), dict(joiner="materialised")):
            loss = cls(blank=0, **kw, **options)
            assert not loss.chunked(m)
            got = loss.joint_loss(m, enc, lengths, targets, target_lengths)
            assert torch.equal(got, loss(logits, targets, lengths, target_lengths))
        assert not cls(blank=0, **kw).chunked(_NoJoinerParameters())
        with pytest.raises(ValueError, match=r"joiner must be one of \('chunked', 'materialised'\), got 'full'"):
            cls(blank=0, joiner="full", **kw)


def test_joint_loss_chunked_under_autocast_scores_in_autocast_dtype():
    """bf16-mixed: the chunked path casts the four tensors to bfloat16 (as the joiner's Linear under
    autocast would) and gives the materialised path's dtype and value up to bfloat16 rounding."""
    torch.manual_seed(0)
    m = TransducerModel(6, 5, **SMALL)
    targets, target_lengths = torch.tensor([[1, 2, 3], [4, 4, 0]]), torch.tensor([3, 2])
    x, lengths = torch.randn(2, 16, 6), torch.tensor([16, 11])
    values = []
    for joiner in ("chunked", "materialised"):
        m.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            enc, el = m.encode(x, lengths)
            value = RNNTLoss(blank=0, joiner=joiner).joint_loss(m, enc, el, targets, target_lengths)
        value.backward()
        assert value.dtype == torch.bfloat16 and m.joiner.weight.grad.dtype == torch.float32
        assert torch.isfinite(m.joiner.weight.grad).all() and m.joiner.weight.grad.abs().sum() > 0
        values.append(float(value))
    assert abs(values[0] - values[1]) <= 2**-6 * abs(values[1]), values  # two bfloat16 ulps


class _NoJoinerParameters(torch.nn.Module):
    """A transducer network without ``joiner_parameters`` (its joiner is not ``Linear(tanh(.))``)."""

    def __init__(self):
        super().__init__()
        self.inner = TransducerModel(6, 5, **SMALL)

    def predict(self, tokens, state=None):
        return self.inner.predict(tokens, state)

    def join(self, enc, pred):
        return self.inner.join(enc, pred) * 0.5


def test_joint_loss_without_joiner_parameters_or_options_of_the_joiner_loss_is_materialised(monkeypatch):
    import lightning_gtn.functional as lgf

    torch.manual_seed(0)
    net = _NoJoinerParameters()
    enc, lengths = net.inner.encode(torch.randn(2, 12, 6), torch.tensor([12, 7]))
    targets, target_lengths = torch.tensor([[1, 2, 3], [4, 4, 0]]), torch.tensor([3, 2])
    pred, _ = net.predict(torch.tensor([[0, 1, 2, 3], [0, 4, 4, 0]]))
    logits = net.join(enc[:, :, None], pred[:, None])
    monkeypatch.setattr(lgf, "rnnt_joiner_loss", None)  # never called on these paths
    for loss in (RNNTLoss(blank=0), RNNTLoss(blank=0, joiner="materialised")):
        assert not loss.chunked(net)
        got = loss.joint_loss(net, enc, lengths, targets, target_lengths)
        assert torch.equal(got, loss(logits, targets, lengths, target_lengths))
    for options in (dict(fused_log_softmax=False), dict(impl="torch")):
        loss = RNNTLoss(blank=0, **options)
        assert not loss.chunked(net.inner)
        want = loss(net.inner.join(enc[:, :, None], pred[:, None]), targets, lengths, target_lengths)
        assert torch.equal(loss.joint_loss(net.inner, enc, lengths, targets, target_lengths), want)
    with pytest.raises(ValueError, match=r"joiner must be one of \('chunked', 'materialised'\), got 'full'"):
        RNNTLoss(blank=0, joiner="full")


def test_pruned_joint_loss_bounds_its_lattices(monkeypatch):
    import lightning_gtn.nn.rnnt as rnnt
    from lightning_gtn.nn import PrunedRNNTLoss

    m = TransducerModel(6, 5, **SMALL)
    enc, lengths = m.encode(torch.randn(2, 24, 6), torch.tensor([24, 20]))
    targets, target_lengths = torch.tensor([[1, 2, 3], [4, 4, 0]]), torch.tensor([3, 2])
    loss = PrunedRNNTLoss(blank=0, s_range=2)
    monkeypatch.setattr(rnnt, "MAX_JOINER_VALUES", 2 * 12 * 4 * 8 - 1)  # the smoothed loss's (B, U + 1, T)
    with pytest.raises(ValueError, match=r"\(U \+ 1\) \* \(J \+ V\) = 2 \* 12 \* 4 \* \(4 \+ 4\)"):
        loss.joint_loss(m, enc, lengths, targets, target_lengths)
    monkeypatch.setattr(rnnt, "MAX_JOINER_VALUES", 2 * 12 * 2 * 17)  # the pruned joiner's (B, T, s_range)
    assert torch.isfinite(loss.joint_loss(m, enc, lengths, targets, target_lengths))
    monkeypatch.setattr(rnnt, "MAX_JOINER_VALUES", 815)
    with pytest.raises(ValueError, match=r"\(s_range\) \* \(J \+ V\) = 2 \* 12 \* 2 \* \(12 \+ 5\)"):
        loss.joint_loss(m, enc, lengths, targets, target_lengths)


def test_joint_loss_refuses_targets_longer_than_a_loss_can_place_on_the_frames():
    """A loss that places at most one token on a frame (k2's modified lattice, TDT without a zero
    duration) declares it; joint_loss names the example, U and T before the joiner runs."""
    from lightning_gtn.nn import PrunedRNNTLoss

    m = TransducerModel(6, 5, **{**SMALL, "extra_outputs": 2})
    enc, lengths = m.encode(torch.randn(2, 8, 6), torch.tensor([8, 4]))  # T = 4 and 2 frames
    targets, target_lengths = torch.tensor([[1, 2, 3], [4, 4, 1]]), torch.tensor([3, 3])
    m3 = TransducerModel(6, 5, **SMALL)
    for loss, net in ((PrunedRNNTLoss(blank=0, rnnt_type="modified"), m3), (TDTLoss(blank=0, durations=[1, 2]), m)):
        with pytest.raises(ValueError, match=r"example 1 has U=3 tokens for T=2 encoder frames.*at most 1 token"):
            loss.joint_loss(net, enc, lengths, targets, target_lengths)
    assert PrunedRNNTLoss(blank=0).max_symbols_per_frame is None
    assert TDTLoss(blank=0).max_symbols_per_frame is None and RNNTLoss(blank=0).max_symbols_per_frame is None
    zi = PrunedRNNTLoss(blank=0, rnnt_type="modified", zero_infinity=True, reduction="none")
    out = zi.joint_loss(m3, enc, lengths, targets, target_lengths)
    assert torch.isfinite(out[0]) and out[1] == 0
    assert torch.isfinite(RNNTLoss(blank=0).joint_loss(m3, enc, lengths, targets, target_lengths))


def test_the_network_gets_the_arguments_the_loss_declares():
    from lightning_gtn.lightning import SequenceModule

    net = {"_target_": "lightning_gtn.lightning.TransducerModel", **SMALL}
    m = SequenceModule(net, "tdt", CHARS, feature_dim=6)
    assert m.structured_loss.network_arguments() == {"extra_outputs": 5} and m.net.extra_outputs == 5
    with pytest.raises(ValueError, match=r"^model\.extra_outputs: 1 does not match the loss's 5 \(leave it out"):
        SequenceModule({**net, "extra_outputs": 1}, "tdt", CHARS, feature_dim=6)
    assert SequenceModule(net, "rnnt", CHARS, feature_dim=6).net.extra_outputs == 0
