"""lightning-gtn-eval's data side: the decoder's lexicon and LM at evaluation, and the feature
settings a checkpoint carries."""

import pytest
import torch

from lightning_gtn.evaluate import ConfigError, _set_decoder, evaluate, load_model
from tests.lightning.test_checkpoint_trust import write_checkpoint
from tests.lightning.test_lhotse_data import corpus  # noqa: F401 - the fixture
from tests.test_train_cli import _compose

EVAL = ["data=digits_small", "data.num_val=4", "num_samples=0", "trainer.enable_progress_bar=false"]


def test_evaluation_never_estimates_a_lexicon_or_lm_from_its_data(tmp_path):
    # data.train_* at evaluation may be the very transcripts being scored: a `train` lexicon / LM is
    # the checkpoint's own, estimated when it was trained, or an error
    from lightning_gtn.lightning.decoding import lexicon_to_data, lm_to_data
    from lightning_gtn.lm import estimate

    greedy = write_checkpoint(tmp_path / "greedy.ckpt")
    own = ["decoder=beam_lm", "decoder.beam_size=4"]
    cfg = _compose([f"ckpt_path={greedy}", *EVAL, *own], tmp_path / "e1", config_name="eval")
    with pytest.raises(ConfigError, match=r"decoder.lexicon=train: evaluation does not estimate a lexicon"):
        evaluate(cfg, overrides=own)
    assert not (tmp_path / "e1" / "lexicon.txt").exists()
    lex = lexicon_to_data({"12": [["1", "2"]], "34": [["3", "4"]], "5": [["5"]]})
    lm = lm_to_data(estimate([["12", "34"], ["34", "5"]], order=2))
    trained = write_checkpoint(tmp_path / "lm.ckpt", decoder={"name": "beam_lm", "lexicon": lex, "lm": lm})
    model = load_model(trained, decoder=None)
    cfg = _compose([f"ckpt_path={trained}", *EVAL, *own], tmp_path / "e2", config_name="eval")
    _set_decoder(cfg, model, None)
    assert model.beam_decoder.lexicon.words == ["12", "34", "5"] and model.beam_decoder.beam_size == 4
    assert torch.isfinite(torch.tensor(evaluate(cfg, overrides=own)["val/cer"]))


def test_a_checkpoint_carries_its_feature_settings_and_refuses_others(corpus, tmp_path):  # noqa: F811
    # 80 mel bins unstacked have the size of 40 x 2 (or here 20 x 2 of 40): only the settings tell
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from lightning_gtn.evaluate import build_datamodule
    from lightning_gtn.lightning import LhotseDataModule, SequenceModule
    from tests._checkpoints import save_module_checkpoint
    from tests.lightning.test_checkpoint_trust import NET, OPT

    sizes = dict(max_duration=2.0, max_cut_duration=2.0, num_buckets=3)
    train = LhotseDataModule(corpus["train"], corpus["val"], num_mel_bins=20, stack_frames=2, **sizes)
    mean, std = torch.linspace(-1.0, 1.0, 40), torch.linspace(1.0, 2.0, 40)
    train._norm = (mean, std)  # a normalisation, as the spoken task estimates one
    model = SequenceModule(NET, {"_target_": "lightning_gtn.nn.CTCLoss"}, train.chars, feature_dim=40, optimizer=OPT)
    ckpt: dict = {}
    model._trainer = SimpleNamespace(datamodule=train)
    model.on_save_checkpoint(ckpt)
    model._trainer = None
    settings = ckpt["feature_settings"]
    assert settings["num_mel_bins"] == 20 and settings["stack_frames"] == 2 and settings["frame_shift"] == 0.02
    assert settings["normalization"]["mean"] == pytest.approx(mean.tolist())
    save_module_checkpoint(model, tmp_path / "speech.ckpt", feature_settings=settings)
    loaded = load_model(tmp_path / "speech.ckpt", decoder=None)
    assert loaded.feature_settings == settings

    def data(**kw):
        cfg = {"_target_": "lightning_gtn.lightning.LhotseDataModule", "train_cuts": corpus["train"]}
        return OmegaConf.create({**cfg, "val_cuts": corpus["val"], **sizes, **kw})

    msg = r"data.num_mel_bins: 80 and data.stack_frames: 1, but the model of the checkpoint was trained on 20 mel"
    with pytest.raises(ConfigError, match=msg):
        build_datamodule(data(num_mel_bins=80), loaded)
    with pytest.raises(ConfigError, match=r"data.stack_frames: 1, .*\(set data.stack_frames=2\)"):
        build_datamodule(data(num_mel_bins=20), loaded)
    dm = build_datamodule(data(num_mel_bins=20, stack_frames=2), loaded)  # normalised as in training
    plain = LhotseDataModule(corpus["train"], corpus["val"], num_mel_bins=20, stack_frames=2, **sizes)
    got, raw = next(iter(dm.val_dataloader())), next(iter(plain.val_dataloader()))
    n = int(raw["input_lengths"][0])
    torch.testing.assert_close(got["inputs"][0, :n], (raw["inputs"][0, :n] - mean) / std)
    bad = dict(settings, normalization={"mean": [0.0] * 40, "std": [0.0] * 40})
    save_module_checkpoint(model, tmp_path / "bad.ckpt", feature_settings=bad)
    with pytest.raises(ConfigError, match=r"feature_settings.normalization.std: expected finite numbers > 0"):
        load_model(tmp_path / "bad.ckpt", decoder=None)
