"""lightning_gtn.trust: configs read from files may only name registered types, with plain data."""

import functools

import pytest
import torch

from lightning_gtn import trust
from lightning_gtn.trust import (
    UntrustedTargetError,
    check_config,
    check_target,
    instantiate,
    register_type,
    resolve,
    trusted,
)

ALLOWED = [
    "lightning_gtn.lightning.ConvRNNEncoder",
    "lightning_gtn.lightning.ConvEncoder",
    "lightning_gtn.nn.CTCLoss",
    "lightning_gtn.nn.ASGLoss",
    "lightning_gtn.nn.TransducerLoss",
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
    "lightning_gtn.train.os.system",
    "torch.optim.adam.torch.hub.load",
    "lightning_gtn.wfst.draw",
    "lightning_gtn.wfst.savetxt",
    "lightning_gtn.trust.add_trusted",
    "lightning_gtn.trust.register_type",
    "lightning_gtn.train.main",
    "lightning_gtn.__builtins__",
    "torch.optim.Adam.__init__.__globals__",
    "lightning_gtn.nn.losses",
    # the second probe's finding 1-2: functions of this library that write files or take addresses
    "lightning_gtn.wordpieces.save_word_pieces",
    "lightning_gtn.lm.cli.main",
    "lightning_gtn.wfst.openfst.write_symbols",
    "lightning_gtn.wfst.Graph.set_weights",
    "lightning_gtn.wfst.linear_graph",
    "lightning_gtn.wfst.ngram.save_transitions",
    "torch.load",
    "torch.nn.Module.load_state_dict",
    "torch.optim.lr_scheduler.LambdaLR",  # takes a function
]


@pytest.mark.parametrize("path", ALLOWED)
def test_registered_types_resolve(path):
    check_target(path, "k")
    assert callable(resolve(path, "k"))
    assert path in trust.registered_types()


@pytest.mark.parametrize("path", REFUSED)
def test_everything_else_is_refused_naming_key_path_and_opt_in(path):
    with pytest.raises(UntrustedTargetError) as e:
        check_target(path, "loss._target_")
    msg = str(e.value)
    assert msg.startswith("loss._target_: ") and repr(path) in msg and "trust_modules" in msg
    assert isinstance(e.value, ValueError)


def test_every_conf_target_is_registered():
    from omegaconf import OmegaConf

    from lightning_gtn.train import CONF_DIR

    for group, kind in (("model", "model"), ("loss", "loss")):
        for f in (CONF_DIR / group).glob("*.yaml"):
            cfg = OmegaConf.load(f)
            cfg.pop("defaults", None)
            check_config(cfg, group, kind)
    for f in (CONF_DIR / "optim").glob("*.yaml"):
        cfg = OmegaConf.load(f)
        check_config(cfg.optimizer, "optim.optimizer", "optimizer")
        if cfg.get("scheduler") is not None:
            check_config(cfg.scheduler, "optim.scheduler", "scheduler")


def test_kinds_keep_sections_apart():
    with pytest.raises(
        UntrustedTargetError, match=r"^optim\.scheduler\._target_: 'torch\.optim\.Adam'.*registered optimizer"
    ):
        check_config({"_target_": "torch.optim.Adam"}, "optim.scheduler", "scheduler")
    with pytest.raises(UntrustedTargetError, match=r"^loss\.builder: 'torch\.optim\.SGD'"):
        check_config({"_target_": "lightning_gtn.nn.TargetGraphLoss", "builder": "torch.optim.SGD"}, "loss", "loss")
    # nested targets are models/modules only: no data module, optimizer or loss inside a network
    for nested in ("lightning_gtn.lightning.TextLinesDataModule", "torch.optim.SGD", "lightning_gtn.nn.CTCLoss"):
        with pytest.raises(UntrustedTargetError, match=r"^model\.x\._target_"):
            check_config(
                {"_target_": "lightning_gtn.lightning.ConvRNNEncoder", "x": {"_target_": nested}}, "model", "model"
            )


def test_check_config_walks_nested_mappings_lists_and_builders():
    cfg = {
        "_target_": "lightning_gtn.lightning.ConvRNNEncoder",
        "layers": [{"_target_": "torch.nn.ReLU"}, {"act": {"_target_": "subprocess.run"}}],
    }
    with pytest.raises(UntrustedTargetError, match=r"^model\.layers\[1\]\.act\._target_: 'subprocess\.run'"):
        check_config(cfg, "model")
    with pytest.raises(UntrustedTargetError, match=r"^loss\.builder: 'os\.system'"):
        check_config({"_target_": "lightning_gtn.lightning.TargetGraphLoss", "builder": "os.system"}, "loss")
    from omegaconf import OmegaConf

    with pytest.raises(UntrustedTargetError, match=r"optim\.optimizer\.lr\._target_"):
        check_config(
            OmegaConf.create({"_target_": "torch.optim.Adam", "lr": {"_target_": "pydoc.pipepager"}}), "optim.optimizer"
        )
    # objects given in Python are the caller's own with data=False, refused as data otherwise
    check_config({"_target_": torch.optim.Adam, "builder": len}, "x", data=False)
    with pytest.raises(UntrustedTargetError, match=r"^x\._target_: <class"):
        check_config({"_target_": torch.optim.Adam}, "x")
    with pytest.raises(UntrustedTargetError, match=r"^x\.lr: .*not plain data"):
        check_config({"_target_": "torch.optim.Adam", "lr": object()}, "x")


def test_reserved_keys_and_depth():
    with pytest.raises(UntrustedTargetError, match=r"^x\._partial_: expected true or false"):
        check_config({"_target_": "torch.optim.Adam", "_partial_": "yes"}, "x")
    with pytest.raises(UntrustedTargetError, match=r"^x\._call_: unknown reserved key"):
        check_config({"_target_": "torch.optim.Adam", "_call_": 1}, "x")
    with pytest.raises(UntrustedTargetError, match=r"^x\._args_\[0\]\._target_: 'os\.system'"):
        check_config({"_target_": "torch.nn.ReLU", "_args_": [{"_target_": "os.system"}]}, "x")
    deep = 1
    for _ in range(100):
        deep = [deep]
    with pytest.raises(UntrustedTargetError, match="nested deeper than"):
        check_config({"_target_": "torch.nn.ReLU", "x": deep}, "x")
    with pytest.raises(UntrustedTargetError, match="mapping keys must be strings"):
        check_config({"_target_": "torch.nn.ReLU", "x": {1: 2}}, "x")


def test_instantiate_builds_only_registered_types_and_never_reads_strings():
    opt = instantiate({"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.5}, "optim.optimizer", "optimizer")
    assert isinstance(opt, functools.partial)
    assert opt([torch.nn.Parameter(torch.zeros(1))]).defaults["lr"] == 0.5
    net = instantiate({"_target_": "torch.nn.LeakyReLU", "negative_slope": "${oc.env:HOME}"}, "m", data=True)
    assert net.negative_slope == "${oc.env:HOME}"  # a string is data, never interpolated
    with pytest.raises(UntrustedTargetError, match=r"^m\.x\._target_"):
        instantiate(
            {
                "_target_": "torch.nn.ReLU",
                "x": {"_target_": "lightning_gtn.wordpieces.save_word_pieces", "pieces": ["a"], "path": "x.txt"},
            },
            "m",
        )


def test_opt_in_with_context_manager_and_add_trusted(monkeypatch):
    with pytest.raises(UntrustedTargetError):
        resolve("json.dumps", "loss.builder")
    with trusted(["json"]):
        assert resolve("json.dumps", "loss.builder")([1]) == "[1]"
        with pytest.raises(UntrustedTargetError):  # a module the opted-in one imports is not opted in
            check_target("json.decoder.re.compile", "k")
    with pytest.raises(UntrustedTargetError):
        resolve("json.dumps", "loss.builder")
    with trusted(paths=["subprocess.run"]):  # an exact path the user typed: that one only
        check_target("subprocess.run", "k")
        assert trust.is_trusted_path("subprocess.run")
        with pytest.raises(UntrustedTargetError):
            check_target("subprocess.call", "k")
    assert not trust.is_trusted_path("subprocess.run")
    monkeypatch.setattr(trust, "_added", [])
    trust.add_trusted("json")
    check_target("json.loads", "k")
    assert "json." in trust.trusted_prefixes()
    with pytest.raises(ValueError, match="trust_modules"):
        trust.add_trusted("os;rm")


def test_register_type(monkeypatch):
    monkeypatch.setattr(trust, "_registered", {})

    @register_type(name="mypkg.Net", kind="model")
    class Net(torch.nn.Module):
        def __init__(self, width=2):
            super().__init__()
            self.width = width

    assert trust.registered_types()["mypkg.Net"] == "model"
    register_type(torch.nn.Tanhshrink)  # default name: where it is defined
    assert "torch.nn.modules.activation.Tanhshrink" in trust.registered_types()
    assert instantiate({"_target_": "mypkg.Net", "width": 3}, "model", "model").width == 3
    with pytest.raises(UntrustedTargetError, match="registered model"):
        check_config({"_target_": "mypkg.Net"}, "loss", "loss")
    with pytest.raises(ValueError, match="kind must be one of"):
        register_type(Net, kind="anything")


def test_missing_names_are_refused_without_import():
    with pytest.raises(UntrustedTargetError, match=r"optim\.optimizer\._target_: 'torch\.optim\.NoSuchOpt'"):
        check_target("torch.optim.NoSuchOpt", "optim.optimizer._target_")


def test_targets_in():
    cfg = {"_target_": "a.B", "x": [{"_target_": "e.F", "builder": "c.d"}], "y": {"z": 1}}
    assert trust.targets_in(cfg, "loss") == [
        ("a.B", "loss._target_"),
        ("e.F", "loss.x[0]._target_"),
        ("c.d", "loss.x[0].builder"),
    ]
