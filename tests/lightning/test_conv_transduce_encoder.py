"""ConvTransduceEncoder: shapes, lengths, identity lexicon, gradients, and training via the CLI."""

import json
import os
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from lightning_gtn.functional import ctc_loss
from lightning_gtn.lightning import ConvTransduceEncoder
from lightning_gtn.train import CONF_DIR, run


def small(**kw):
    args = dict(feature_dim=6, num_classes=5, conv_channels=8, hidden_size=8, dropout=0.0)
    args.update(kw)
    torch.manual_seed(0)
    return ConvTransduceEncoder(**args)


def test_identity_lexicon_shapes_and_lengths():
    m = small()
    assert m.transduce.lexicon == [[], [1], [2], [3], [4]] and m.letters == 4
    out, lengths = m(torch.randn(3, 17, 6), torch.tensor([17, 9, 1]))
    assert out.shape == (3, 9, 5) and lengths.tolist() == [9, 5, 1]
    assert torch.allclose(out.exp().sum(-1), torch.ones(3, 9), atol=1e-5)


def test_lexicon_and_stride():
    m = small(num_classes=3, lexicon=[[], [1, 2], [2, 2]], transduce_kernel_size=5, transduce_stride=2)
    assert m.letters == 2 and m.transduce.out_features == 3
    out, lengths = m(torch.randn(2, 20, 6), torch.tensor([20, 11]))
    assert out.shape == (2, 5, 3) and lengths.tolist() == [5, 3]
    with pytest.raises(ValueError, match="one entry per output class"):
        small(num_classes=4, lexicon=[[], [1]])
    with pytest.raises(ValueError, match="kernel_size must be at least 4"):
        small(num_classes=2, lexicon=[[], [2, 2, 1]], transduce_kernel_size=3)


def test_padding_does_not_leak_and_gradients_reach_kernels():
    m = small()  # the encoder's output layer runs in float32
    x = torch.randn(2, 16, 6)
    x[1, 10:] = 0  # zero-padded, as the data modules give it
    out, lengths = m(x, torch.tensor([16, 10]))
    alone, la = m(x[1:, :10], torch.tensor([10]))
    assert torch.allclose(out[1, : la[0]], alone[0], atol=1e-5)
    loss = ctc_loss(out, torch.tensor([[1, 2], [3, 0]]), lengths, torch.tensor([2, 1]))
    loss.backward()
    assert m.transduce.kernel_params.grad.abs().sum() > 0
    assert all(p.grad is not None for p in m.encoder.parameters())


def test_fast_dev_run_with_ctc(tmp_path):
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose(
            "train",
            overrides=[
                "model=conv_transduce",
                "data=text_small",
                "loss=ctc",
                "trainer.fast_dev_run=true",
                "trainer.enable_progress_bar=false",
            ],
            return_hydra_config=True,
        )
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(tmp_path)
        cfg.hydra.job.num = 0
    HydraConfig.instance().set_config(cfg)
    metrics = run(cfg, output_dir=tmp_path)
    assert metrics["global_step"] == 1 and metrics["train/loss"] > 0
    assert "val/cer" in metrics


@pytest.mark.slow
def test_cli_trains_a_few_steps(tmp_path):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    args = [
        "model=conv_transduce",
        "data=text_small",
        "loss=ctc",
        "trainer.max_steps=4",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_gtn.train", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert metrics["global_step"] == 4
    assert 0 < metrics["train/loss"] < float("inf")
