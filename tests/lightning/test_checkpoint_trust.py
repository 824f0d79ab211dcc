"""A crafted checkpoint never runs code: every dotted path in its hyper-parameters is checked by
lightning_gtn.trust before SequenceModule.load_from_checkpoint imports or calls it."""

import os
import shlex
import sys

import lightning as L
import pytest
import torch

from lightning_gtn import trust
from lightning_gtn.lightning import SequenceModule
from tests._checkpoints import save_module_checkpoint

CHARS = "0123456789 "
NET = {"_target_": "lightning_gtn.lightning.ConvRNNEncoder", "conv_channels": 8, "hidden_size": 8, "stride": 2}
OPT = {"_target_": "torch.optim.Adam", "lr": 1e-3}


def write_checkpoint(path, **hparams):
    """A checkpoint as lightning-gtn-train writes it, with ``hparams`` replacing the stored ones."""
    model = SequenceModule(NET, {"_target_": "lightning_gtn.nn.CTCLoss"}, CHARS, feature_dim=8, optimizer=OPT)
    hp = dict(model.hparams)
    hp.update(hparams)
    torch.save(
        {
            "state_dict": model.state_dict(),
            "hyper_parameters": hp,
            "epoch": 0,
            "global_step": 0,
            "pytorch-lightning_version": L.__version__,
        },
        path,
    )
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
    with pytest.raises(trust.UntrustedTargetError) as e:
        SequenceModule.load_from_checkpoint(str(ckpt), map_location="cpu")
    assert not marker.exists(), "a command named by the checkpoint ran"
    assert "trust_modules" in str(e.value)
    key = next(iter(payloads(marker)[case]))
    assert str(e.value).startswith(
        {"network": "model", "optimizer": "optim.optimizer", "scheduler": "optim.scheduler"}.get(key, key)
    )


def test_builder_path_from_a_checkpoint_is_checked(tmp_path):
    loss = {
        "_target_": "lightning_gtn.lightning.TargetGraphLoss",
        "builder": "os.system",
        "vocabulary": {"blank": True, "repeat_label": False},
    }
    ckpt = write_checkpoint(tmp_path / "evil.ckpt", loss=loss)
    with pytest.raises(trust.UntrustedTargetError, match=r"^loss\.builder: 'os\.system'"):
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
    with pytest.raises(trust.UntrustedTargetError, match=r"^optim\.scheduler\._target_"):
        SequenceModule.load_from_checkpoint(str(ckpt), map_location="cpu")
    assert not marker.exists()
    with trust.trusted([__name__.split(".")[0]]):
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
    trans = transitions_to_data(
        transitions_graph([[0, 1, 11], [2, 12, 3]], len(tokens) + 1, order=2, blank="optional", self_loops=True)
    )
    loss = {"_target_": "lightning_gtn.nn.TransducerLoss", "tokens": tokens, "blank": "optional", "transitions": trans}
    model = SequenceModule(
        NET,
        loss,
        CHARS,
        feature_dim=8,
        optimizer=OPT,
        scheduler={"_target_": "torch.optim.lr_scheduler.CosineAnnealingLR", "T_max": 10},
        nonfinite={"action": "skip", "max_consecutive": 3},
        decoder={"name": "greedy"},
    )
    save_module_checkpoint(model, path)
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
    return subprocess.run(
        [sys.executable, "-m", "lightning_gtn.evaluate", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_eval_cli_refuses_a_raw_address_checkpoint_and_a_truncated_file(tmp_path):
    # finding 2: this checkpoint segfaulted lightning-gtn-eval (rc 139); now one clear line, rc 2
    good = write_checkpoint(tmp_path / "good.ckpt")
    ck = torch.load(good, weights_only=True)
    ck["hyper_parameters"]["optimizer"]["lr"] = {
        "_target_": "lightning_gtn.wfst.Graph.set_weights",
        "weights": 2**46,
        "self": {"_target_": "lightning_gtn.wfst.linear_graph", "M": 1000, "N": 1000},
    }
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
    with pytest.raises(trust.UntrustedTargetError, match=r"^loss\.transitions: .*names a file"):
        SequenceModule.load_from_checkpoint(str(tmp_path / "old.ckpt"), map_location="cpu")
    with trust.trusted(paths=[str(tmp_path / "t.bin")]):  # the user vouches for that exact file
        model = SequenceModule.load_from_checkpoint(str(tmp_path / "old.ckpt"), map_location="cpu")
    assert model.structured_loss.transitions.num_arcs() == g.num_arcs()


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"num_nodes": 0}, "num_nodes"),
        ({"start": [99]}, "start"),
        ({"arcs": "0 1"}, "3 integers per arc"),
        ({"arcs": "0 1_0 2"}, "only decimal integers"),
        ({"arcs": "0 99 1"}, "node id outside"),
        ({"arcs": "0 1 -2"}, "label below -1"),
        ({"extra": 1}, "unknown key"),
        ({"format": "x"}, "format"),
    ],
)
def test_transitions_data_is_range_checked(bad, match):
    from lightning_gtn.nn.transducer import transitions_from_data

    data = {
        "format": "lightning_gtn.transitions/1",
        "num_nodes": 2,
        "start": [0],
        "accept": [1],
        "arcs": "0 1 0\n1 1 -1",
    }
    transitions_from_data(data)
    with pytest.raises(ValueError, match=match):
        transitions_from_data({**data, **bad})


def test_a_moved_checkpoint_with_word_pieces_and_transitions_evaluates_identically(tmp_path):
    from lightning_gtn.train import run
    from tests.test_train_cli import _compose

    run_dir = tmp_path / "run"
    cfg = _compose(
        [
            "experiment=smoke",
            "trainer.enable_progress_bar=false",
            "loss=transducer",
            "loss.tokens=16",
            "loss.transitions={order: 2, prune: 0}",
            "data.num_train=40",
            "data.num_val=10",
            "+trainer.limit_train_batches=2",
            "logger=none",
        ],
        run_dir,
    )
    run(cfg, output_dir=run_dir)
    ckpt = next(run_dir.rglob("last.ckpt"))
    hp = torch.load(ckpt, weights_only=True)["hyper_parameters"]["loss"]
    assert len(hp["tokens"]) >= 16 and hp["transitions"]["format"] == "lightning_gtn.transitions/1"
    assert str(run_dir) not in repr(hp)  # no path into the run directory
    before, after = _evaluate_moved(ckpt, run_dir, tmp_path, "data.num_val=10")
    assert after == before and "val/cer" in after


def _evaluate_moved(ckpt, run_dir, tmp_path, num_val: str):
    """Eval metrics of ``ckpt`` in place, then of a copy elsewhere after ``run_dir`` is deleted."""
    import shutil

    from lightning_gtn.evaluate import evaluate
    from tests.test_train_cli import _compose

    base = ["data=digits_small", num_val, "num_samples=0", "trainer.enable_progress_bar=false"]
    before = evaluate(_compose([f"ckpt_path={ckpt}", *base], tmp_path / "e1", config_name="eval"), overrides=[])
    moved = tmp_path / "elsewhere" / "model.ckpt"
    moved.parent.mkdir()
    shutil.copy(ckpt, moved)
    shutil.rmtree(run_dir)
    after = evaluate(_compose([f"ckpt_path={moved}", *base], tmp_path / "e2", config_name="eval"), overrides=[])
    return before, after


# --------------------------------------------------------------------------- the decoder's lexicon and LM
def test_a_moved_checkpoint_with_a_beam_lm_decoder_evaluates_identically(tmp_path):
    # the lexicon and LM travel inside the checkpoint: it evaluates after its run directory (with
    # <run>/lexicon.txt and <run>/lm.arpa) is gone

    from lightning_gtn.train import run
    from tests.test_train_cli import _compose

    run_dir = tmp_path / "run"
    cfg = _compose(
        [
            "experiment=smoke",
            "trainer.enable_progress_bar=false",
            "decoder=beam_lm",
            "decoder.lm_order=2",
            "decoder.beam_size=4",
            "data.num_train=40",
            "data.num_val=6",
            "+trainer.limit_train_batches=2",
            "logger=none",
        ],
        run_dir,
    )
    run(cfg, output_dir=run_dir)
    assert (run_dir / "lexicon.txt").is_file() and (run_dir / "lm.arpa").is_file()
    ckpt = next(run_dir.rglob("last.ckpt"))
    dec = torch.load(ckpt, weights_only=True)["hyper_parameters"]["decoder"]
    assert dec["lexicon"]["format"] == "lightning_gtn.lexicon/1" and dec["lm"]["format"] == "lightning_gtn.arpa/1"
    assert dec["lm"]["text"] == (run_dir / "lm.arpa").read_text()
    assert str(tmp_path) not in repr(dec)  # no path at all
    before, after = _evaluate_moved(ckpt, run_dir, tmp_path, "data.num_val=6")
    assert after == before and "val/cer" in after


def _lm_and_lexicon_files(tmp_path):
    from lightning_gtn.lm import estimate

    texts = ["12 34", "34 5", "12 5 34"]
    (tmp_path / "lex.txt").write_text("12 1 2\n34 3 4\n5 5\n", encoding="utf-8")
    estimate([t.split() for t in texts], order=2).to_arpa(str(tmp_path / "lm.arpa"))
    return str(tmp_path / "lex.txt"), str(tmp_path / "lm.arpa")


def test_decoder_files_named_by_a_checkpoint_are_not_read(tmp_path, monkeypatch):
    # older checkpoints held <run>/lexicon.txt and <run>/lm.arpa: the files can be moved or swapped,
    # and a checkpoint must not make the library read a file it names
    import builtins
    import io

    lex, lm = _lm_and_lexicon_files(tmp_path)
    ckpt = torch.load(real_checkpoint(tmp_path / "r.ckpt"), weights_only=True)
    ckpt["hyper_parameters"]["loss"] = {"_target_": "lightning_gtn.nn.CTCLoss"}
    ckpt["hyper_parameters"]["decoder"] = {"name": "beam_lm", "lexicon": lex, "lm": lm, "beam_size": 4}
    ckpt["state_dict"] = torch.load(write_checkpoint(tmp_path / "c.ckpt"), weights_only=True)["state_dict"]
    torch.save(ckpt, tmp_path / "old.ckpt")
    opened = []
    real_open, real_io_open = builtins.open, io.open

    def spy(real):
        def _open(file, *a, **k):
            if str(file) in (lex, lm):
                opened.append(str(file))
            return real(file, *a, **k)

        return _open

    monkeypatch.setattr(builtins, "open", spy(real_open))
    monkeypatch.setattr(io, "open", spy(real_io_open))
    monkeypatch.setattr(os, "open", spy(os.open))  # how lightning_gtn._files opens a named file
    with pytest.raises(trust.UntrustedTargetError, match=r"^decoder\.lexicon: .*names a file.*trusted\(paths="):
        SequenceModule.load_from_checkpoint(str(tmp_path / "old.ckpt"), map_location="cpu")
    ckpt["hyper_parameters"]["decoder"]["lexicon"] = {"format": "lightning_gtn.lexicon/1", "entries": [["5", "5"]]}
    torch.save(ckpt, tmp_path / "old2.ckpt")
    with pytest.raises(trust.UntrustedTargetError, match=r"^decoder\.lm: .*names a file"):
        SequenceModule.load_from_checkpoint(str(tmp_path / "old2.ckpt"), map_location="cpu")
    assert opened == [], "a file named by the checkpoint was opened"
    # the eval CLI: one clear line naming the key, status 2
    from lightning_gtn.evaluate import ConfigError, load_model

    with pytest.raises(ConfigError, match=r"old\.ckpt.*decoder\.lexicon: .*names a file"):
        load_model(tmp_path / "old.ckpt")
    assert opened == []
    # the user vouches for those exact files, or names them on the eval command line
    with trust.trusted(paths=[lex, lm]):
        model = SequenceModule.load_from_checkpoint(str(tmp_path / "old.ckpt"), map_location="cpu")
    assert model.beam_decoder.lexicon.words == ["12", "34", "5"] and sorted(opened) == [lex, lm]
    assert load_model(tmp_path / "old.ckpt", decoder=None).beam_decoder is None
    from lightning_gtn.evaluate import evaluate
    from tests.test_train_cli import _compose

    own = ["decoder=beam_lm", f"decoder.lexicon={lex}", f"decoder.lm={lm}", "decoder.beam_size=4"]
    cfg = _compose(
        [
            f"ckpt_path={tmp_path / 'old.ckpt'}",
            "data=digits_small",
            "data.num_val=4",
            "num_samples=0",
            "trainer.enable_progress_bar=false",
            *own,
        ],
        tmp_path / "ev",
        config_name="eval",
    )
    assert "val/cer" in evaluate(cfg, overrides=own)


@pytest.mark.parametrize(
    "key,bad,match",
    [
        ("lexicon", {"format": "x", "entries": [["a", "a"]]}, r"decoder\.lexicon: expected a lexicon as data"),
        (
            "lexicon",
            {"format": "lightning_gtn.lexicon/1", "entries": [["a", "a"]], "path": "/etc/passwd"},
            r"decoder\.lexicon\.path: unknown key",
        ),
        ("lexicon", {"format": "lightning_gtn.lexicon/1", "entries": []}, r"decoder\.lexicon\.entries: no entries"),
        (
            "lexicon",
            {"format": "lightning_gtn.lexicon/1", "entries": "1 1"},
            r"decoder\.lexicon\.entries: expected a list",
        ),
        ("lexicon", {"format": "lightning_gtn.lexicon/1", "entries": [["1"]]}, r"entries\[0\]: expected \[word, token"),
        (
            "lexicon",
            {"format": "lightning_gtn.lexicon/1", "entries": [["1", "1 2"]]},
            r"entries\[0\]: .*without whitespace",
        ),
        ("lexicon", {"format": "lightning_gtn.lexicon/1", "entries": [["1", 1]]}, r"entries\[0\]: .*non-empty strings"),
        (
            "lexicon",
            {"format": "lightning_gtn.lexicon/1", "entries": [["1", "1" * 300]]},
            r"entries\[0\]: .*at most 256",
        ),
        ("lexicon", {"format": "lightning_gtn.lexicon/1", "entries": [["1"] + ["1"] * 300]}, r"entries\[0\]: "),
        (
            "lexicon",
            {"format": "lightning_gtn.lexicon/1", "entries": [["1", "x"]]},
            r"decoder\.lexicon: .*'x', not a token",
        ),
        ("lm", "/etc/passwd", r"decoder\.lm: '/etc/passwd' names a file"),
        ("lm", {"format": "lightning_gtn.arpa/1", "text": 7}, r"decoder\.lm\.text: expected ARPA text"),
        ("lm", {"format": "lightning_gtn.arpa/1", "text": "no arpa"}, r"decoder\.lm\.text: ARPA"),
        (
            "lm",
            {"format": "lightning_gtn.arpa/1", "text": "\\data\\\nngram 1=99999999999\n\\1-grams:\n"},
            r"decoder\.lm\.text: .*max_bytes",
        ),
        (
            "lm",
            {"format": "lightning_gtn.arpa/1", "text": "\\data\\\nngram 1=1\n\n\\1-grams:\n-0.5 1 nan\n\\end\\\n"},
            r"decoder\.lm\.text: ARPA line 5",
        ),
    ],
)
def test_decoder_data_in_a_checkpoint_is_range_checked(tmp_path, key, bad, match):
    from lightning_gtn.lightning.decoding import lexicon_to_data, lm_to_data
    from lightning_gtn.lm import NGramLM, read_lexicon

    lex, lm = _lm_and_lexicon_files(tmp_path)
    good = {
        "name": "beam_lm",
        "beam_size": 4,
        "lexicon": lexicon_to_data(read_lexicon(lex)),
        "lm": lm_to_data(NGramLM.from_arpa(lm)),
    }
    ckpt = torch.load(write_checkpoint(tmp_path / "c.ckpt", decoder=good), weights_only=True)
    assert SequenceModule.load_from_checkpoint(str(tmp_path / "c.ckpt"), map_location="cpu").beam_decoder is not None
    ckpt["hyper_parameters"]["decoder"][key] = bad
    torch.save(ckpt, tmp_path / "bad.ckpt")
    with pytest.raises(ValueError, match=match):
        SequenceModule.load_from_checkpoint(str(tmp_path / "bad.ckpt"), map_location="cpu")


def test_decoder_data_is_bounded(tmp_path, monkeypatch):
    # the bounds apply when training stores the data (errors name decoder.<key>) and on load
    from lightning_gtn.lightning import decoding

    lex, lm = _lm_and_lexicon_files(tmp_path)
    monkeypatch.setattr(decoding, "MAX_LM_CHARS", 50)
    with pytest.raises(ValueError, match=r"decoder\.lm: .*ARPA text has \d+ characters; at most 50"):
        decoding.resolve_decoder({"name": "beam_lm", "lexicon": lex, "lm": lm}, list, tmp_path)
    with pytest.raises(ValueError, match=r"decoder\.lm\.text: expected ARPA text of at most 50 characters"):
        decoding.lm_from_data({"format": "lightning_gtn.arpa/1", "text": "x" * 51})
    monkeypatch.setattr(decoding, "MAX_LM_CHARS", 10**6)
    monkeypatch.setattr(decoding, "MAX_LEXICON_ENTRIES", 2)
    with pytest.raises(ValueError, match=r"decoder\.lexicon\.entries: 3 entries; at most 2"):
        decoding.resolve_decoder({"name": "beam_lm", "lexicon": lex, "lm": "train"}, lambda: ["1"], tmp_path)
    monkeypatch.setattr(decoding, "MAX_LEXICON_ENTRIES", 10)
    monkeypatch.setattr(decoding, "MAX_LEXICON_CHARS", 12)
    with pytest.raises(ValueError, match=r"decoder\.lexicon\.entries: over 12 characters"):
        decoding.lexicon_from_data({"format": "lightning_gtn.lexicon/1", "entries": [["12", "1", "2"]] * 3})
    with pytest.raises(ValueError, match=r"decoder\.lexicon: cannot use .*missing"):
        decoding.resolve_decoder({"name": "beam_lm", "lexicon": str(tmp_path / "missing"), "lm": lm}, list, tmp_path)
