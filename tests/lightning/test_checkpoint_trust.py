"""A crafted checkpoint never runs code: every dotted path in its hyper-parameters is checked by
lightning_gtn._trust before SequenceModule.load_from_checkpoint imports or calls it."""

import shlex
import sys

import lightning as L
import pytest
import torch

from lightning_gtn import _trust
from lightning_gtn.lightning import SequenceModule

CHARS = "0123456789 "
NET = {"_target_": "lightning_gtn.lightning.ConvRNNEncoder", "conv_channels": 8, "hidden_size": 8, "stride": 2}
OPT = {"_target_": "torch.optim.Adam", "lr": 1e-3}


def write_checkpoint(path, **hparams):
    """A checkpoint as lightning-gtn-train writes it, with ``hparams`` replacing the stored ones."""
    model = SequenceModule(NET, {"_target_": "lightning_gtn.nn.CTCLoss"}, CHARS, feature_dim=8, optimizer=OPT)
    hp = dict(model.hparams)
    hp.update(hparams)
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": hp, "epoch": 0, "global_step": 0,
                "pytorch-lightning_version": L.__version__}, path)
    return path


def payloads(marker):
    """Configs that each create ``marker`` when instantiated without the allow-list."""
    touch = f"touch {shlex.quote(str(marker))}"
    py = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    return {
        "loss=pydoc.pipepager": {"loss": {"_target_": "pydoc.pipepager", "text": "", "cmd": touch}},
        "loss=os.system": {"loss": {"_target_": "os.system", "_args_": [touch]}},
        "loss=subprocess.run": {"loss": {"_target_": "subprocess.run", "_args_": [py]}},
        "network nested": {"network": {**NET, "rnn": {"_target_": "subprocess.run", "_args_": [py]}}},
        "optimizer nested": {"optimizer": {**OPT, "lr": {"_target_": "pydoc.pipepager", "text": "", "cmd": touch}}},
        "scheduler": {"scheduler": {"_target_": "subprocess.run", "_args_": [py]}},
    }


CASES = list(payloads("m"))


@pytest.mark.parametrize("case", CASES)
def test_crafted_checkpoint_runs_nothing(case, tmp_path):
    marker = tmp_path / "marker"
    ckpt = write_checkpoint(tmp_path / "evil.ckpt", **payloads(marker)[case])
    with pytest.raises(_trust.UntrustedTargetError) as e:
        SequenceModule.load_from_checkpoint(str(ckpt), map_location="cpu")
    assert not marker.exists(), "a command named by the checkpoint ran"
    assert "trust_modules" in str(e.value)
    key = next(iter(payloads(marker)[case]))
    assert str(e.value).startswith({"network": "model", "optimizer": "optim.optimizer",
                                    "scheduler": "optim.scheduler"}.get(key, key))


def test_builder_path_from_a_checkpoint_is_checked(tmp_path):
    loss = {"_target_": "lightning_gtn.lightning.TargetGraphLoss", "builder": "os.system",
            "vocabulary": {"blank": True, "repeat_label": False}}
    ckpt = write_checkpoint(tmp_path / "evil.ckpt", loss=loss)
    with pytest.raises(_trust.UntrustedTargetError, match=r"^loss\.builder: 'os\.system'"):
        SequenceModule.load_from_checkpoint(str(ckpt), map_location="cpu")


def make_marker(optimizer, path):
    """A user's own scheduler factory (here: it leaves a mark)."""
    open(path, "w").close()
    return None


def test_trusted_opt_in_lets_the_named_code_run(tmp_path):
    # a path outside the allow-list runs once the user opts its module in, and only then
    marker = tmp_path / "marker"
    sched = {"_target_": f"{__name__}.make_marker", "path": str(marker)}
    ckpt = write_checkpoint(tmp_path / "mine.ckpt", scheduler=sched)
    with pytest.raises(_trust.UntrustedTargetError, match=r"^optim\.scheduler\._target_"):
        SequenceModule.load_from_checkpoint(str(ckpt), map_location="cpu")
    assert not marker.exists()
    with _trust.trusted([__name__.split(".")[0]]):
        model = SequenceModule.load_from_checkpoint(str(ckpt), map_location="cpu")
    assert isinstance(model, SequenceModule)
    model._scheduler_factory(torch.optim.SGD(model.parameters(), lr=0.1))
    assert marker.exists()


def test_honest_checkpoint_loads_with_its_weights(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ok.ckpt")
    model = SequenceModule.load_from_checkpoint(str(ckpt), map_location="cpu")
    saved = torch.load(ckpt, weights_only=True)["state_dict"]
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
