from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from lightning_gtn.lightning import (
    TEXT_CHARS,
    SequenceModule,
    TextLinesDataModule,
    make_sentences,
    make_text_lines,
    save_text_lines_png,
)
from lightning_gtn.lightning.text import DEFAULT_FONTS, font_path, render_line, vocabulary_words

CONF = Path(__file__).resolve().parents[2] / "conf"
SMALL = dict(num_train=40, num_val=12, num_test=12, batch_size=8, eval_batch_size=6, max_chars=24)


@pytest.fixture(scope="module")
def small():
    dm = TextLinesDataModule(**SMALL, seed=5)
    dm.setup()
    return dm


def test_deterministic_in_seed(small):
    again = TextLinesDataModule(**SMALL, seed=5)
    again.setup()
    for a, b in ((again.train_set, small.train_set), (again.test_set, small.test_set)):
        assert a.texts == b.texts
        assert all(np.array_equal(x, y) for x, y in zip(a.features, b.features))
    other = TextLinesDataModule(**SMALL, seed=6)
    other.setup()
    assert other.train_set.texts != small.train_set.texts
    f1, _ = make_text_lines(["a cat sleeps"], seed=1)
    f2, _ = make_text_lines(["a cat sleeps"], seed=2)
    assert f1[0].shape != f2[0].shape or not np.array_equal(f1[0], f2[0])


def test_splits_disjoint_by_sentence(small):
    tr, va, te = (set(s.texts) for s in (small.train_set, small.val_set, small.test_set))
    assert len(tr) == 40 and len(va) == 12 and len(te) == 12  # distinct within a split too
    assert not tr & va and not tr & te and not va & te
    s = make_sentences(200, seed=0, max_chars=30, exclude=["the cat sleeps"])
    assert len(set(s)) == 200 and "the cat sleeps" not in s and max(map(len, s)) <= 30
    with pytest.raises(ValueError, match="max_chars"):
        make_sentences(100, seed=0, max_chars=5)


def test_features_shape_dtype_and_texts(small):
    assert small.feature_dim == 32 and small.chars == TEXT_CHARS
    for split in (small.train_set, small.val_set, small.test_set):
        for f, t in zip(split.features, split.texts):
            assert f.dtype == np.float32 and f.ndim == 2 and f.shape[1] == 32
            assert f.shape[0] >= 4 * len(t)  # several frames per character
            assert set(t) <= set(TEXT_CHARS) and 0 < len(t) <= 24
            assert t == t.strip() and "  " not in t
            assert np.isfinite(f).all() and f.max() > 0.4  # ink is there
    batch = next(iter(small.train_dataloader()))
    assert batch["inputs"].shape[0] == 8 and batch["inputs"].shape[2] == 32
    assert batch["inputs"].dtype == torch.float32 and batch["input_lengths"].dtype == torch.int64
    assert int(batch["input_lengths"].max()) == batch["inputs"].shape[1]
    assert len(batch["texts"]) == 8
    # height pooling
    f, _ = make_text_lines(["two dogs"], seed=0, height=32, downsample=2)
    assert f[0].shape[1] == 16


def test_grammar_has_a_real_vocabulary():
    words = vocabulary_words()
    assert 300 <= len(words) <= 1000
    assert all(set(w) <= set(TEXT_CHARS) for w in words)
    sents = make_sentences(500, seed=0)
    used = {w for s in sents for w in s.split()}
    assert len(used) > 200 and used <= set(words)
    assert any("'" in s for s in sents)
    # structure a word n-gram model can use: determiners are never followed by a verb form
    verbs = {"sleeps", "runs", "walks", "sees", "finds"}
    assert not any(a in ("the", "a", "every") and b in verbs for s in sents for a, b in zip(s.split(), s.split()[1:]))


def test_several_fonts_are_used(small):
    assert len(set(small.fonts_used["train"])) >= 6
    assert set(small.fonts_used["train"]) <= set(DEFAULT_FONTS)
    images = [
        render_line("the quick fox", face, 20)
        for face in ("DejaVuSans", "DejaVuSerif", "DejaVuSansMono", "DejaVuSans-Bold")
    ]
    for i in range(len(images)):
        for j in range(i):
            assert images[i].shape != images[j].shape or not np.array_equal(images[i], images[j])
    assert images[2].shape[1] > images[0].shape[1]  # monospace is wider
    with pytest.raises(ValueError, match="DejaVuSans"):
        font_path("NoSuchFont")
    with pytest.raises(ValueError, match="NoSuchFont"):
        TextLinesDataModule(fonts=["NoSuchFont"])


def test_configs_compose_and_build():
    cfg = OmegaConf.load(CONF / "data" / "text.yaml")
    assert cfg._target_ == "lightning_gtn.lightning.TextLinesDataModule"
    args = {k: v for k, v in OmegaConf.to_container(cfg).items() if k != "_target_"}
    dm = TextLinesDataModule(**args)
    assert dm.feature_dim == 32 and len(dm.hparams.fonts) == 12
    small = OmegaConf.load(CONF / "data" / "text_small.yaml")
    assert small.num_train <= 100


def test_picture_helper(small, tmp_path):
    path = tmp_path / "lines.png"
    save_text_lines_png(small.val_set.features, small.val_set.texts, path, max_lines=4)
    assert path.stat().st_size > 2000


def test_one_training_step_with_the_default_model(small):
    import lightning as L

    torch.manual_seed(0)
    network = OmegaConf.to_container(OmegaConf.load(CONF / "model" / "conv_gru.yaml"))
    model = SequenceModule(network, "ctc", small.chars, feature_dim=small.feature_dim)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        fast_dev_run=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=small)
    m = trainer.callback_metrics
    for key in ("train/loss", "val/loss", "val/cer"):
        assert key in m and torch.isfinite(m[key]), key
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    model.eval()
    batch = next(iter(small.val_dataloader()))
    with torch.no_grad():
        em, lengths = model(batch["inputs"], batch["input_lengths"])
    assert em.shape[2] == len(TEXT_CHARS) + 1  # CTC: the blank and the characters
    decoded = model.decode(em, lengths)
    assert len(decoded) == 6 and all(set(d) <= set(TEXT_CHARS) for d in decoded)


def test_hyperparameters_load_with_weights_only():
    # Hydra passes ListConfigs; a checkpoint must hold plain lists so that lightning-gtn-eval
    # (torch.load(weights_only=True)) can read it
    import io

    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(
        {
            "_target_": "lightning_gtn.lightning.TextLinesDataModule",
            "num_train": 4,
            "num_val": 2,
            "num_test": 2,
            "sizes": [16, 18],
            "blur": [0.0, 0.5],
            "contrast": [0.8, 1.0],
            "fonts": ["DejaVuSans"],
        }
    )
    dm = instantiate(cfg)
    buf = io.BytesIO()
    torch.save({"datamodule_hyper_parameters": dict(dm.hparams)}, buf)
    buf.seek(0)
    h = torch.load(buf, weights_only=True)["datamodule_hyper_parameters"]
    assert h["sizes"] == [16, 18] and h["blur"] == [0.0, 0.5] and h["contrast"] == [0.8, 1.0]
