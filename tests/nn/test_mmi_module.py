"""nn.LFMMILoss: the same numbers as functional.mmi_loss (alone, mixed with CTC, after a CTC
warm-up), its denominator carried as data through a checkpoint, the training step setting the
warm-up's step, clear errors for bad arguments and bad ``loss.denominator`` configs."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf

import lightning_gtn.wfst as gtn
from lightning_gtn import functional as F
from lightning_gtn import trust
from lightning_gtn.lightning import SequenceModule, Vocabulary
from lightning_gtn.nn import LFMMILoss
from tests._checkpoints import save_module_checkpoint

CHARS = "abc"  # tokens 1..3, blank 0: C = 4
TEXTS = ["abc", "aab", "cab", "bca", "ab", "cc"]
NET = {"_target_": "lightning_gtn.lightning.ConvRNNEncoder", "conv_channels": 8, "hidden_size": 8, "stride": 2}
OPT = {"_target_": "torch.optim.Adam", "lr": 1e-3}


def _denominator(topology="ctc"):
    vocab = Vocabulary(CHARS, blank=True)
    return F.denominator_graph([vocab.encode(t) for t in TEXTS], len(CHARS), order=2, topology=topology)


def _batch(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 10, 4, generator=g, dtype=dtype).log_softmax(-1).requires_grad_()
    targets = torch.tensor([[1, 2, 3], [1, 1, 2], [3, 3, 0]])
    return x, targets, torch.tensor([10, 8, 7]), torch.tensor([3, 3, 2])


def _mmi(x, tg, il, tl, den, **kw):
    return F.mmi_loss(x, tg, il, tl, denominator=den, **kw)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_module_equals_functional_mmi_loss(reduction):
    den = _denominator()
    x, tg, il, tl = _batch()
    m = LFMMILoss(num_classes=4, denominator=den, reduction=reduction, den_scale=0.7, zero_infinity=False)
    got = m(x, tg, il, tl)
    ref = _mmi(x, tg, il, tl, den, reduction=reduction, den_scale=0.7)
    torch.testing.assert_close(got, ref)
    (gx,) = torch.autograd.grad(got.sum(), x)
    (rx,) = torch.autograd.grad(ref.sum(), x)
    torch.testing.assert_close(gx, rx)
    # the convention the decoders read: CTC's
    assert (m.blank, m.topology, m.repeat_label, m.target_classes) == (0, "ctc", False, None)
    assert m.decode(x.detach(), il) == [F.collapse(p, 0) for p in m.best_paths(x.detach(), il)[0].tolist()]


def test_denominator_as_data_is_rebuilt_and_scores_the_same():
    den = _denominator()
    data = F.mmi_graph_to_data(den)
    assert json.loads(json.dumps(data)) == data  # plain data (a config, a checkpoint's hparams)
    x, tg, il, tl = _batch()
    a = LFMMILoss(num_classes=4, denominator=den)
    b = LFMMILoss(num_classes=4, denominator=data)
    assert b.denominator is not den and b.denominator.num_arcs() == den.num_arcs()
    torch.testing.assert_close(a(x, tg, il, tl), b(x, tg, il, tl))


def test_ctc_weight_is_icefalls_weighted_sum():
    den = _denominator()
    x, tg, il, tl = _batch()
    m = LFMMILoss(num_classes=4, denominator=den, ctc_weight=0.3, reduction="none")
    ctc = F.ctc_loss(x, tg, il, tl, 0, "none", True)
    mmi = _mmi(x, tg, il, tl, den, reduction="none", zero_infinity=True)
    torch.testing.assert_close(m(x, tg, il, tl), 0.3 * ctc + 0.7 * mmi)
    # the ends: CTC alone, MMI alone
    torch.testing.assert_close(LFMMILoss(4, den, ctc_weight=1.0, reduction="none")(x, tg, il, tl), ctc)
    torch.testing.assert_close(LFMMILoss(4, den, reduction="none")(x, tg, il, tl), mmi)


def test_warmup_is_ctc_until_warmup_steps_then_mmi():
    den = _denominator()
    x, tg, il, tl = _batch()
    m = LFMMILoss(num_classes=4, denominator=den, warmup_steps=5, ctc_weight=0.25)
    ctc = F.ctc_loss(x, tg, il, tl, 0, "mean", True)
    mixed = 0.25 * ctc + 0.75 * _mmi(x, tg, il, tl, den, zero_infinity=True)
    assert m.step == 0 and m.warming_up
    torch.testing.assert_close(m(x, tg, il, tl), ctc)
    m.set_step(4)
    torch.testing.assert_close(m(x, tg, il, tl), ctc)
    m.set_step(5)
    assert not m.warming_up
    torch.testing.assert_close(m(x, tg, il, tl), mixed)
    with pytest.raises(ValueError, match="step must be an integer >= 0"):
        m.set_step(-1)


@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`")
def test_training_step_sets_the_loss_step(monkeypatch):
    # the mixin calls set_step(global_step) on any loss that has it, not only on RNN-T losses
    model = SequenceModule(NET, _loss_config(warmup_steps=10), CHARS, feature_dim=8, optimizer=OPT)
    monkeypatch.setattr(SequenceModule, "global_step", property(lambda self: 7))
    batch = {"inputs": torch.randn(2, 24, 8), "input_lengths": torch.tensor([24, 20]), "texts": ["ab", "c"]}
    loss = model.training_step(batch, 0)
    assert model.structured_loss.step == 7 and torch.isfinite(loss)


def _loss_config(**kw):
    return {"_target_": "lightning_gtn.nn.LFMMILoss", "denominator": F.mmi_graph_to_data(_denominator()), **kw}


def test_denominator_travels_through_a_checkpoint(tmp_path):
    model = SequenceModule(NET, _loss_config(ctc_weight=0.5), CHARS, feature_dim=8, optimizer=OPT)
    assert model.structured_loss.num_classes == 4  # filled from the vocabulary
    path = tmp_path / "mmi.ckpt"
    save_module_checkpoint(model, path)
    loaded = SequenceModule.load_from_checkpoint(str(path), map_location="cpu")  # weights_only, trust checks
    a, b = model.structured_loss.denominator, loaded.structured_loss.denominator
    assert gtn.equal(a, b)
    x, tg, il, tl = _batch()
    torch.testing.assert_close(model.structured_loss(x, tg, il, tl), loaded.structured_loss(x, tg, il, tl))
    # a crafted checkpoint: a denominator over more classes than the vocabulary has is refused
    big = Vocabulary("abcdef", blank=True)
    wide = F.denominator_graph([big.encode("fed")], 6, order=1)
    hp = dict(model.hparams)
    hp["loss"] = {**hp["loss"], "denominator": F.mmi_graph_to_data(wide)}
    torch.save(
        {"state_dict": model.state_dict(), "hyper_parameters": hp, "pytorch-lightning_version": L.__version__}, path
    )
    with pytest.raises(ValueError, match=r"denominator: labels must be classes in \[0, num_classes=4\)"):
        SequenceModule.load_from_checkpoint(str(path), map_location="cpu")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"denominator": None}, "denominator: required"),
        ({"denominator": {"order": 2, "prune": 0, "topology": "ctc"}}, "is a recipe"),
        ({"denominator": "denominator.bin"}, "expected a lightning_gtn.wfst.Graph or its data"),
        ({"topology": "hmm1"}, "topology must be one of"),
        ({"ctc_weight": 1.5}, r"ctc_weight must lie in \[0.0, 1.0\]"),
        ({"leaky_hmm": 1.0}, r"leaky_hmm must lie in \[0.0, 1.0\), got 1.0"),
        ({"den_scale": float("nan")}, "den_scale must be"),
        ({"warmup_steps": -1}, "warmup_steps must be an integer >= 0"),
        ({"warmup_steps": True}, "warmup_steps must be an integer >= 0"),
        ({"num_classes": 3}, r"labels must be classes in \[0, num_classes=3\)"),
        ({"reduction": "avg"}, "reduction"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    args = {"num_classes": 4, "denominator": _denominator(), **kwargs}
    with pytest.raises(ValueError, match=match):
        LFMMILoss(**args)


def test_wrong_class_count_at_call():
    x, tg, il, tl = _batch()
    with pytest.raises(ValueError, match=r"log_probs: expected \(B, T, C=5\)"):
        LFMMILoss(num_classes=5, denominator=_denominator())(x, tg, il, tl)


# --------------------------------------------------------------------------- lightning-gtn-train
class _Data:
    chars = CHARS

    def setup(self, stage):
        self.train_set = SimpleNamespace(texts=TEXTS)


def _resolve(denominator, tmp_path, **loss):
    from lightning_gtn.train import prepare_loss

    cfg = OmegaConf.create({"loss": {"_target_": "lightning_gtn.nn.LFMMILoss", "denominator": denominator, **loss}})
    prepare_loss(cfg, _Data(), tmp_path)
    return cfg


def test_train_resolves_the_recipe_into_data_and_a_file(tmp_path):
    cfg = _resolve({"order": 2, "prune": 0, "topology": "ctc"}, tmp_path)
    data = OmegaConf.to_container(cfg.loss.denominator)
    saved = gtn.load(str(tmp_path / "denominator.bin"))
    assert gtn.equal(saved, F.mmi_graph_from_data(data)) and gtn.equal(saved, _denominator())
    assert cfg.loss.topology == "ctc"
    again = _resolve(data, tmp_path / "again")  # data (a checkpoint's) is used as is
    assert OmegaConf.to_container(again.loss.denominator) == data and not (tmp_path / "again").exists()


@pytest.mark.parametrize(
    "denominator,loss,match",
    [
        (None, {}, r"^loss\.denominator: missing"),
        ("outputs/denominator.bin", {}, r"^loss\.denominator: expected .*recipe"),
        ({"order": 0}, {}, r"^loss\.denominator\.order: expected an integer"),
        ({"order": 2, "prune": -1}, {}, r"^loss\.denominator\.prune: expected an integer >= 0"),
        ({"order": 2, "pruning": 3}, {}, r"^loss\.denominator\.pruning: unknown key"),
        ({"order": 2, "topology": "hmm1"}, {"topology": "ctc"}, r"^loss\.denominator\.topology: 'hmm1' differs"),
    ],
)
def test_bad_denominator_configs_name_the_key(denominator, loss, match, tmp_path):
    from lightning_gtn.train import ConfigError

    with pytest.raises(ConfigError, match=match):
        _resolve(denominator, tmp_path, **loss)


def test_registered_as_a_loss():
    assert trust.check_target("lightning_gtn.nn.LFMMILoss", "loss._target_") is None
    with pytest.raises(trust.UntrustedTargetError):
        trust.check_config({"_target_": "lightning_gtn.nn.LFMMILoss"}, "optim.optimizer", "optimizer")


@pytest.mark.slow
def test_cli_trains_mmi_and_the_checkpoint_carries_the_denominator(tmp_path):
    run = tmp_path / "run"
    args = [
        "experiment=smoke",
        "loss=ctc_mmi",
        "loss.warmup_steps=3",
        "data.num_val=10",
        "trainer.enable_progress_bar=false",
        "logger=none",
        f"hydra.run.dir={run}",
    ]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_gtn.train", *args], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert metrics["global_step"] > 3 and 0 <= metrics["val/cer"]  # past the warm-up: MMI trained too
    saved = gtn.load(str(run / "denominator.bin"))
    ckpt = next(run.rglob("last.ckpt"))
    hp = torch.load(ckpt, weights_only=True)["hyper_parameters"]["loss"]
    assert gtn.equal(saved, F.mmi_graph_from_data(hp["denominator"])) and hp["topology"] == "ctc"
    assert str(run) not in repr(hp)
    loaded = SequenceModule.load_from_checkpoint(str(ckpt), map_location="cpu")
    assert gtn.equal(loaded.structured_loss.denominator, saved)
    assert loaded.structured_loss.ctc_weight == 0.5


def test_the_module_scores_through_the_one_prologue(apply_loss_calls):
    x, tg, il, tl = _batch()
    LFMMILoss(num_classes=4, denominator=_denominator())(x, tg, il, tl).backward()
    assert [type(c).__name__ for c, _ in apply_loss_calls] == ["_SharedDenominator", "_Numerators"]
