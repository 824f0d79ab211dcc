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


# --------------------------------------------------------------------------- issue 16, findings 1-2
SECTION_KEYS = {"network": "model", "optimizer": "optim.optimizer", "scheduler": "optim.scheduler"}


def real_checkpoint(path):
    """A checkpoint of the word-piece transducer with a transitions graph (artefacts as data), an
    optimizer, a scheduler, a decoder and a non-finite policy: every kind of hyper-parameter."""
    from lightning_gtn.nn.transducer import transitions_to_data
    from lightning_gtn.wfst.ngram import transitions_graph

    tokens = list(CHARS) + ["12", "34"]
    trans = transitions_to_data(transitions_graph([[0, 1, 11], [2, 12, 3]], len(tokens) + 1, order=2,
                                                  blank="optional", self_loops=True))
    loss = {"_target_": "lightning_gtn.nn.TransducerLoss", "tokens": tokens, "blank": "optional",
            "transitions": trans}
    model = SequenceModule(NET, loss, CHARS, feature_dim=8, optimizer=OPT,
                           scheduler={"_target_": "torch.optim.lr_scheduler.CosineAnnealingLR", "T_max": 10},
                           nonfinite={"action": "skip", "max_consecutive": 3}, decoder={"name": "greedy"})
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams), "epoch": 0,
                "global_step": 0, "pytorch-lightning_version": L.__version__}, path)
    return path


def key_paths(hp, prefix=()):
    """Every key path of a hyper-parameter tree (mappings and lists, leaves and inner nodes)."""
    out = []
    items = hp.items() if isinstance(hp, dict) else enumerate(hp) if isinstance(hp, list) else ()
    for k, v in items:
        out.append(prefix + (k,))
        out += key_paths(v, prefix + (k,))
    return out


def replaced(ckpt, path, value):
    """A copy of checkpoint ``ckpt`` with its hyper-parameter at key ``path`` set to ``value``."""
    import copy

    ckpt = copy.deepcopy(ckpt)
    node = ckpt["hyper_parameters"]
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return ckpt


def test_nested_targets_in_every_hyper_parameter_are_refused_before_any_call():
    # in a child process: on the code before the registry, some of these overwrote files or
    # segfaulted (Graph.set_weights on a raw address)
    from tests._child import run_as_child

    res = run_as_child(__file__.replace("test_checkpoint_trust.py", "fuzz_checkpoint_targets.py"), timeout=300)
    assert int(res.stdout.split("fuzzed")[-1]) > 300


def _eval_cli(args, cwd):
    import os
    import subprocess

    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "lightning_gtn.evaluate", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_eval_cli_refuses_a_raw_address_checkpoint_and_a_truncated_file(tmp_path):
    # finding 2: this checkpoint segfaulted lightning-gtn-eval (rc 139); now one clear line, rc 2
    good = write_checkpoint(tmp_path / "good.ckpt")
    ck = torch.load(good, weights_only=True)
    ck["hyper_parameters"]["optimizer"]["lr"] = {
        "_target_": "lightning_gtn.wfst.Graph.set_weights", "weights": 2**46,
        "self": {"_target_": "lightning_gtn.wfst.linear_graph", "M": 1000, "N": 1000}}
    torch.save(ck, tmp_path / "e.ckpt")
    proc = _eval_cli(["ckpt_path=e.ckpt", "data=digits_small", f"hydra.run.dir={tmp_path / 'ev'}"], tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "optim.optimizer.lr._target_: 'lightning_gtn.wfst.Graph.set_weights' is not trusted" in proc.stderr
    assert "Traceback" not in proc.stderr
    # the newcomer's truncated checkpoint: names the file, no traceback
    (tmp_path / "t.ckpt").write_bytes(good.read_bytes()[:1000])
    proc = _eval_cli(["ckpt_path=t.ckpt", "data=digits_small", f"hydra.run.dir={tmp_path / 'ev2'}"], tmp_path)
    assert proc.returncode == 2 and "t.ckpt is not a readable checkpoint" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("content", [b"", b"not a checkpoint\n", b"PK\x03\x04" + b"\0" * 100])
def test_load_model_names_the_file_of_a_foreign_or_broken_checkpoint(tmp_path, content):
    from lightning_gtn.evaluate import ConfigError, load_model

    (tmp_path / "x.ckpt").write_bytes(content)
    with pytest.raises(ConfigError, match=r"^ckpt_path: .*x\.ckpt is not a readable checkpoint"):
        load_model(tmp_path / "x.ckpt")
    torch.save({"hello": 1}, tmp_path / "y.ckpt")
    with pytest.raises(ConfigError, match=r"y\.ckpt is not a lightning-gtn-train checkpoint"):
        load_model(tmp_path / "y.ckpt")


def test_a_transitions_file_named_by_a_checkpoint_is_not_read(tmp_path):
    # older checkpoints held <run>/transitions.bin; the file can be moved or swapped
    from lightning_gtn.nn.transducer import transitions_from_data
    from lightning_gtn.wfst.ngram import save_transitions

    ckpt = torch.load(real_checkpoint(tmp_path / "r.ckpt"), weights_only=True)
    g = transitions_from_data(ckpt["hyper_parameters"]["loss"]["transitions"])
    save_transitions(str(tmp_path / "t.bin"), g, 14)
    ckpt["hyper_parameters"]["loss"]["transitions"] = str(tmp_path / "t.bin")
    torch.save(ckpt, tmp_path / "old.ckpt")
    with pytest.raises(_trust.UntrustedTargetError, match=r"^loss\.transitions: .*names a file"):
        SequenceModule.load_from_checkpoint(str(tmp_path / "old.ckpt"), map_location="cpu")
    with _trust.trusted(paths=[str(tmp_path / "t.bin")]):  # the user vouches for that exact file
        model = SequenceModule.load_from_checkpoint(str(tmp_path / "old.ckpt"), map_location="cpu")
    assert model.structured_loss.transitions.num_arcs() == g.num_arcs()


@pytest.mark.parametrize("bad,match", [
    ({"num_nodes": 0}, "num_nodes"), ({"start": [99]}, "start"), ({"arcs": "0 1"}, "3 integers per arc"),
    ({"arcs": "0 1_0 2"}, "only decimal integers"), ({"arcs": "0 99 1"}, "node id outside"),
    ({"arcs": "0 1 -2"}, "label below -1"), ({"extra": 1}, "unknown key"), ({"format": "x"}, "format")])
def test_transitions_data_is_range_checked(bad, match):
    from lightning_gtn.nn.transducer import transitions_from_data

    data = {"format": "lightning_gtn.transitions/1", "num_nodes": 2, "start": [0], "accept": [1],
            "arcs": "0 1 0\n1 1 -1"}
    transitions_from_data(data)
    with pytest.raises(ValueError, match=match):
        transitions_from_data({**data, **bad})


def test_a_moved_checkpoint_with_word_pieces_and_transitions_evaluates_identically(tmp_path):
    import shutil

    from tests.test_train_cli import _compose

    from lightning_gtn.evaluate import evaluate
    from lightning_gtn.train import run

    run_dir = tmp_path / "run"
    cfg = _compose(["experiment=smoke", "trainer.enable_progress_bar=false", "loss=transducer", "loss.tokens=16",
                    "loss.transitions={order: 2, prune: 0}", "data.num_train=40", "data.num_val=10",
                    "+trainer.limit_train_batches=2", "logger=none"], run_dir)
    run(cfg, output_dir=run_dir)
    ckpt = next(run_dir.rglob("last.ckpt"))
    hp = torch.load(ckpt, weights_only=True)["hyper_parameters"]["loss"]
    assert len(hp["tokens"]) >= 16 and hp["transitions"]["format"] == "lightning_gtn.transitions/1"
    assert str(run_dir) not in repr(hp)  # no path into the run directory
    base = ["data=digits_small", "data.num_val=10", "num_samples=0", "trainer.enable_progress_bar=false"]
    before = evaluate(_compose([f"ckpt_path={ckpt}", *base], tmp_path / "e1", config_name="eval"), overrides=[])
    moved = tmp_path / "elsewhere" / "model.ckpt"
    moved.parent.mkdir()
    shutil.copy(ckpt, moved)
    shutil.rmtree(run_dir)
    after = evaluate(_compose([f"ckpt_path={moved}", *base], tmp_path / "e2", config_name="eval"), overrides=[])
    assert after == before and "val/cer" in after
