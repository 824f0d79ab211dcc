"""lightning_gtn._trust: the allow-list for dotted paths named by configs read from files."""

import pytest
import torch

from lightning_gtn import _trust
from lightning_gtn._trust import UntrustedTargetError, check_config, check_target, resolve, trusted

ALLOWED = [
    "lightning_gtn.lightning.ConvRNNEncoder",
    "lightning_gtn.nn.CTCLoss",
    "lightning_gtn.nn.ASGLoss",
    "lightning_gtn.lightning.TargetGraphLoss",
    "lightning_gtn.wfst.criterion.ctc_graph",
    "torch.optim.Adam",
    "torch.optim.AdamW",
    "torch.optim.SGD",
    "torch.optim.lr_scheduler.CosineAnnealingLR",
    "torch.nn.ReLU",
]

REFUSED = [
    "os.system",
    "subprocess.run",
    "pydoc.pipepager",
    "builtins.eval",
    "lightning_gtn.train.os.system",           # a trusted prefix leading out through a module
    "torch.optim.adam.torch.hub.load",         # through the torch module to torch.hub
    "lightning_gtn.wfst.draw",                 # runs `dot`; defined in the denied wfst.utils
    "lightning_gtn.wfst.savetxt",              # writes files
    "lightning_gtn._trust.add_trusted",        # would widen the allow-list
    "lightning_gtn.train.main",
    "lightning_gtn.__builtins__",
    "torch.optim.Adam.__init__.__globals__",
    "lightning_gtn.nn.losses",                 # a module, not a class or function
]


@pytest.mark.parametrize("path", ALLOWED)
def test_default_configs_are_trusted(path):
    check_target(path, "k")
    assert callable(resolve(path, "k"))


@pytest.mark.parametrize("path", REFUSED)
def test_dangerous_paths_are_refused_naming_key_path_and_opt_in(path):
    with pytest.raises(UntrustedTargetError) as e:
        check_target(path, "loss._target_")
    msg = str(e.value)
    assert msg.startswith("loss._target_: ") and repr(path) in msg and "trust_modules" in msg
    assert isinstance(e.value, ValueError)


def test_every_conf_target_is_trusted():
    from omegaconf import OmegaConf

    from lightning_gtn.train import CONF_DIR

    for group in ("model", "loss", "optim"):
        for f in (CONF_DIR / group).glob("*.yaml"):
            cfg = OmegaConf.load(f)
            cfg.pop("defaults", None)
            check_config(cfg, group)


def test_check_config_walks_nested_mappings_lists_and_builders():
    cfg = {"_target_": "lightning_gtn.lightning.ConvRNNEncoder",
           "layers": [{"_target_": "torch.nn.ReLU"}, {"act": {"_target_": "subprocess.run"}}]}
    with pytest.raises(UntrustedTargetError, match=r"^model\.layers\[1\]\.act\._target_: 'subprocess\.run'"):
        check_config(cfg, "model")
    with pytest.raises(UntrustedTargetError, match=r"^loss\.builder: 'os\.system'"):
        check_config({"_target_": "lightning_gtn.lightning.TargetGraphLoss", "builder": "os.system"}, "loss")
    from omegaconf import OmegaConf

    with pytest.raises(UntrustedTargetError, match=r"optim\.optimizer\.lr\._target_"):
        check_config(OmegaConf.create({"_target_": "torch.optim.Adam", "lr": {"_target_": "pydoc.pipepager"}}),
                     "optim.optimizer")
    check_config({"_target_": torch.optim.Adam, "builder": len}, "x")  # objects, not paths: nothing to check


def test_opt_in_with_context_manager_and_add_trusted(monkeypatch):
    with pytest.raises(UntrustedTargetError):
        resolve("json.dumps", "loss.builder")
    with trusted(["json"]):
        assert resolve("json.dumps", "loss.builder")([1]) == "[1]"
        with trusted("pydoc."):
            check_target("pydoc.pipepager", "k")
        with pytest.raises(UntrustedTargetError):
            check_target("pydoc.pipepager", "k")
    with pytest.raises(UntrustedTargetError):
        resolve("json.dumps", "loss.builder")
    with trusted(paths=["subprocess.run"]):  # an exact path: that one only
        check_target("subprocess.run", "k")
        with pytest.raises(UntrustedTargetError):
            check_target("subprocess.call", "k")
    monkeypatch.setattr(_trust, "_added", [])
    _trust.add_trusted("json")
    check_target("json.loads", "k")
    assert "json." in _trust.trusted_prefixes()


def test_missing_names_are_reported_not_refused():
    with pytest.raises(ValueError, match=r"optim\.optimizer\._target_: cannot import 'torch\.optim\.NoSuchOpt'") as e:
        check_target("torch.optim.NoSuchOpt", "optim.optimizer._target_")
    assert not isinstance(e.value, UntrustedTargetError)


def test_targets_in():
    cfg = {"_target_": "a.B", "x": [{"builder": "c.d"}], "y": {"z": 1}}
    assert _trust.targets_in(cfg, "loss") == [("a.B", "loss._target_"), ("c.d", "loss.x[0].builder")]
