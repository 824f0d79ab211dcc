"""lightning-gtn-align: on an emissions file (in process) and on a checkpoint trained for a few
steps (subprocess, as the other CLIs)."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from lightning_gtn.align_cli import main
from lightning_gtn.functional import forced_align
from tests._checkpoints import save_module_checkpoint


@pytest.fixture
def em_file(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 30, 6, generator=g)
    lengths = torch.tensor([30, 25, 12, 30, 3])
    torch.save({"emissions": x, "input_lengths": lengths}, tmp_path / "em.pt")
    targets = [[1, 2, 3], [4, 4, 5], [], [1, 5, 2, 5, 3], [1, 2, 3, 4]]  # the last is infeasible
    (tmp_path / "t.txt").write_text("\n".join(" ".join(map(str, t)) for t in targets) + "\n")
    return tmp_path, x, lengths, targets


def test_emissions_file_to_json_plots_and_ctm(em_file, capsys):
    d, x, lengths, targets = em_file
    out = d / "a.json"
    rc = main(
        [
            "--emissions",
            str(d / "em.pt"),
            "--targets",
            str(d / "t.txt"),
            "--out",
            str(out),
            "--plot-dir",
            str(d / "plots"),
            "--num-plots",
            "2",
            "--batch-size",
            "2",
            "--tokens",
            "_abc d",
            "--word-separator-id",
            "5",
            "--frame-shift",
            "0.02",
            "--no-progress",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    recs = json.loads(out.read_text())
    ref = forced_align(x.log_softmax(-1), targets, lengths)
    assert [r["utterance"] for r in recs] == [f"utt{i}" for i in range(5)]
    for b, r in enumerate(recs):
        if b == 4:
            assert r["score"] is None and r["tokens"] == []
            continue
        assert r["score"] == pytest.approx(float(ref.score[b]), rel=1e-5)
        assert [t["start_frame"] for t in r["tokens"]] == ref.token_start[b, : len(targets[b])].tolist()
        ends = ref.token_end[b, : len(targets[b])].tolist()
        assert [t["end"] for t in r["tokens"]] == pytest.approx([0.02 * v for v in ends])
    assert [w["text"] for w in recs[3]["words"]] == ["a", "b", "c"]
    assert sorted(p.name for p in (d / "plots").iterdir()) == ["utt0.png", "utt1.png"]
    rc = main(
        [
            "--emissions",
            str(d / "em.pt"),
            "--targets",
            str(d / "t.txt"),
            "--format",
            "ctm",
            "--star",
            "-2",
            "--no-progress",
        ]
    )
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 + 3 + 5  # one word per token by default; the empty and infeasible give none
    for line in lines:
        utt, ch, start, dur, word, conf = line.split()
        assert utt.startswith("utt") and ch == "1" and float(dur) > 0 and 0 <= float(conf) <= 1


@pytest.mark.parametrize(
    "make,args,msg",
    [
        (None, ["--emissions", "{d}/none.pt", "--targets", "{d}/t.txt"], "--emissions: no such file"),
        ("bad", ["--emissions", "{d}/bad.pt", "--targets", "{d}/t.txt"], "cannot read"),
        ("shape", ["--emissions", "{d}/shape.pt", "--targets", "{d}/t.txt"], r"shape \(B, T, C\)"),
        (None, ["--emissions", "{d}/em.pt", "--targets", "{d}/short.txt"], "2 lines for 5 examples"),
        (None, ["--emissions", "{d}/em.pt", "--targets", "{d}/words.txt"], "line 1 must hold integer"),
        (
            None,
            ["--emissions", "{d}/em.pt", "--targets", "{d}/t.txt", "--blank", "9"],
            r"--blank must lie in \[0, C=6\)",
        ),
        (None, ["--emissions", "{d}/em.pt", "--targets", "{d}/range.txt"], "label 7 out of range"),
        (None, ["--checkpoint", "{d}/no.ckpt"], "--checkpoint: no such checkpoint file"),
        # second probe, finding 17: raw tracebacks before
        (None, ["--emissions", "{d}/em.pt", "--targets", "{d}/latin1.txt"], "line 2 is not UTF-8 text"),
        (
            None,
            ["--emissions", "{d}/mixed.pt", "--targets", "{d}/t.txt"],
            r"mixed.pt holds a dict without an 'emissions' key \(keys: 'a', 1\)",
        ),
        (None, ["--emissions", "{d}/em.pt", "--targets", "{d}/lenient.txt"], "line 1 must hold integer token ids"),
        (None, ["--emissions", "{d}/em.pt", "--targets", "{d}/arabic.txt"], "line 1 must hold integer token ids"),
    ],
)
def test_bad_inputs_give_clear_errors(em_file, capsys, make, args, msg):
    d = em_file[0]
    (d / "bad.pt").write_bytes(b"not a tensor file")
    torch.save(torch.zeros(3, 4), d / "shape.pt")
    (d / "short.txt").write_text("1 2\n3\n")
    (d / "words.txt").write_text("a b\n" * 5)
    (d / "range.txt").write_text("1 7\n" * 5)
    (d / "latin1.txt").write_bytes(b"1 2\n\xe9 3\n" + b"1\n" * 3)
    (d / "lenient.txt").write_text("1_0 2\n" * 5)
    (d / "arabic.txt").write_text("\u0661 2\n" * 5)
    torch.save({1: torch.zeros(1), "a": torch.zeros(1)}, d / "mixed.pt")
    rc = main([a.format(d=d) for a in args] + ["--no-progress"])
    assert rc == 2
    import re

    assert re.search(msg, capsys.readouterr().err)


def test_unwritable_output_is_a_clear_error(em_file, capsys):
    d = em_file[0]
    rc = main(["--emissions", str(d / "em.pt"), "--targets", str(d / "t.txt"), "--out", str(d), "--no-progress"])
    assert rc == 2 and "cannot write" in capsys.readouterr().err


def test_argument_errors_exit(capsys):
    with pytest.raises(SystemExit):
        main(["--emissions", "x.pt"])  # no --targets
    assert "--emissions needs --targets" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([])  # no source
    assert "one of the arguments --checkpoint --emissions is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--emissions", "x.pt", "--targets", "t.txt", "--frame-shift", "0"])
    assert "--frame-shift must be positive" in capsys.readouterr().err


def _run(module, args, cwd, timeout=300):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow  # trains in a subprocess
def test_checkpoint_trained_a_few_steps(tmp_path, capsys):
    run = tmp_path / "run"
    p = _run(
        "lightning_gtn.train",
        [
            "experiment=smoke",
            "trainer.max_steps=3",
            "trainer.enable_progress_bar=false",
            "trainer.num_sanity_val_steps=0",
            "data.num_train=24",
            "data.num_val=6",
            "logger=none",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    ckpt = run / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    out = tmp_path / "val.json"
    rc = main(
        [
            "--checkpoint",
            str(ckpt),
            "--split",
            "val",
            "--out",
            str(out),
            "--plot-dir",
            str(tmp_path / "plots"),
            "--num-plots",
            "2",
            "data=digits_small",
            "data.num_val=6",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "aligning" in err  # the progress bar
    recs = json.loads(out.read_text())
    assert len(recs) == 6

    for r in recs:
        assert r["utterance"].startswith("val")
        if r["score"] is None:
            continue
        text = "".join(t["text"] for t in r["tokens"])
        assert set(text) <= set("0123456789 ") and text.strip()
        ends = [t["end_frame"] for t in r["tokens"]]
        starts = [t["start_frame"] for t in r["tokens"]]
        assert all(s < e for s, e in zip(starts, ends)) and all(e <= s for e, s in zip(ends, starts[1:]))
        assert r["words"] and all(" " not in w["text"] for w in r["words"])
    assert len(list((tmp_path / "plots").glob("*.png"))) == 2
    # a model override is refused: the checkpoint defines the model
    assert main(["--checkpoint", str(ckpt), "--no-progress", "loss=seq"]) == 2
    assert "loss: lightning-gtn-align uses the network" in capsys.readouterr().err


def test_checkpoint_of_an_asg_model_uses_its_transitions(tmp_path, capsys):
    # an untrained ASG model saved as lightning-gtn-train would (no subprocess needed)
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate

    from lightning_gtn.lightning import SequenceModule
    from lightning_gtn.train import CONF_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose("train", overrides=["loss=asg", "data=digits_small", "data.num_val=4"])
    dm = instantiate(cfg.data)
    model = SequenceModule(cfg.model, cfg.loss, dm.chars, dm.feature_dim, cfg.optim.optimizer)
    with torch.no_grad():
        model.structured_loss.transitions.normal_()
    ckpt = tmp_path / "asg.ckpt"
    save_module_checkpoint(model, ckpt)
    out = tmp_path / "a.json"
    rc = main(
        [
            "--checkpoint",
            str(ckpt),
            "--split",
            "test",
            "--out",
            str(out),
            "--no-progress",
            "data=digits_small",
            "data.num_test=4",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    recs = json.loads(out.read_text())
    assert len(recs) == 4 and all(r["utterance"].startswith("test") for r in recs)
    # the same alignment by hand: the model's emissions, no blank, the checkpoint's transitions
    dm.setup("test")
    batch = next(iter(dm.test_dataloader()))
    model.eval()
    with torch.no_grad():
        inputs, il, tg, tl, _ = model.unpack_batch(batch)
        em, el = model.emissions(inputs, il)
    ref = forced_align(
        em.log_softmax(-1), tg, el, tl, blank=None, transitions=model.structured_loss.transitions.detach()
    )
    plain = forced_align(em.log_softmax(-1), tg, el, tl, blank=None)
    for b in range(4):
        if recs[b]["score"] is None:
            assert math.isinf(float(ref.score[b]))
            continue
        assert recs[b]["score"] == pytest.approx(float(ref.score[b]), rel=1e-5)
        assert recs[b]["score"] != pytest.approx(float(plain.score[b]), rel=1e-5)
        assert [t["end_frame"] for t in recs[b]["tokens"]] == ref.token_end[b, : int(tl[b])].tolist()


def test_a_speech_checkpoint_times_frames_by_its_stride_and_names_cuts(tmp_path, capsys):
    """The frame shift is the data's (10 ms x stack_frames) times the model's stride, and
    utterances are named by their cut ids (plots too, kept inside --plot-dir)."""
    pytest.importorskip("lhotse")
    from lightning_gtn.lightning import LhotseDataModule, SequenceModule
    from tests.lightning.test_checkpoint_trust import OPT
    from tests.lightning.test_lhotse_data import _cut, _wav, _write

    cuts = [_cut(_wav(tmp_path / f"a{i}.wav", 0.6, 200 + 50 * i, i), f"spk/../utt {i}", "one two") for i in range(3)]
    manifest = _write(cuts, tmp_path / "cuts.jsonl")
    data = dict(num_mel_bins=20, stack_frames=2, max_duration=2.0, max_cut_duration=2.0)
    dm = LhotseDataModule(manifest, manifest, **data)
    net = {"_target_": "lightning_gtn.lightning.ConvRNNEncoder", "conv_channels": 8, "hidden_size": 8, "stride": 2}
    model = SequenceModule(net, {"_target_": "lightning_gtn.nn.CTCLoss"}, dm.chars, feature_dim=40, optimizer=OPT)
    save_module_checkpoint(model, tmp_path / "m.ckpt", feature_settings=dm.feature_settings())
    overrides = ["data=lhotse", f"data.train_cuts={manifest}", f"data.val_cuts={manifest}"]
    overrides += [f"data.{k}={v}" for k, v in data.items()]
    plots = tmp_path / "plots"
    args = ["--checkpoint", str(tmp_path / "m.ckpt"), "--no-progress", "--plot-dir", str(plots), *overrides]
    assert main([*args, "--out", str(tmp_path / "a.json")]) == 0, capsys.readouterr().err
    recs = json.loads((tmp_path / "a.json").read_text())
    assert sorted(r["utterance"] for r in recs) == ["spk/../utt_0", "spk/../utt_1", "spk/../utt_2"]
    toks = [t for r in recs for t in r["tokens"]]
    assert toks and all(t["start"] == pytest.approx(t["start_frame"] * 0.04) for t in toks)  # 10 ms x 2 x 2
    assert sorted(p.name for p in plots.iterdir()) == ["spk_.._utt_0.png", "spk_.._utt_1.png", "spk_.._utt_2.png"]
    assert main([*args, "--format", "ctm", "--out", str(tmp_path / "a.ctm")]) == 0
    lines = (tmp_path / "a.ctm").read_text().splitlines()
    assert lines and {ln.split()[0] for ln in lines} <= {"spk/../utt_0", "spk/../utt_1", "spk/../utt_2"}
    assert main([*args, "--frame-shift", "0.5", "--out", str(tmp_path / "b.json")]) == 0  # given: used as is
    toks = [t for r in json.loads((tmp_path / "b.json").read_text()) for t in r["tokens"]]
    assert all(t["start"] == pytest.approx(t["start_frame"] * 0.5) for t in toks)


def _neg_inf_frame():
    x = torch.zeros(2, 3, 4)
    x[1, 2] = -math.inf
    return x


@pytest.mark.parametrize(
    "obj,msg",
    [
        (lambda: torch.zeros(1, 1, 1).expand(2, 200000, 20000), r"8,000,000,000 elements but stores 4 bytes"),
        (lambda: torch.zeros(2, 3, 4).to_sparse(), "must be a dense tensor, got layout torch.sparse_coo"),
        (lambda: torch.zeros(2, 3, 4, device="meta"), "must hold its values on the CPU, got device meta"),
        (
            lambda: {"emissions": torch.zeros(2, 3, 4), "input_lengths": torch.tensor([True, True])},
            r"input_lengths must be an integer tensor .* torch.bool",
        ),
        (_neg_inf_frame, r"example 1, frame 2: no finite emission \(every class is -inf\)"),
        (lambda: torch.full((2, 3, 4), math.inf), r"example 0, frame 0: \+inf"),
        (lambda: torch.full((2, 3, 4), math.nan), "example 0, frame 0: NaN"),
    ],
)
def test_emission_files_that_are_refused_by_what_is_wrong(tmp_path, capsys, obj, msg):
    """Sparse, meta, expanded (a 1 KB file standing for 32 GB), bool lengths and frames without a
    finite score: one line naming the problem, never a traceback or an allocation."""
    import re

    torch.save(obj(), tmp_path / "em.pt")
    (tmp_path / "t.txt").write_text("1\n1\n")
    rc = main(["--emissions", str(tmp_path / "em.pt"), "--targets", str(tmp_path / "t.txt"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and re.search(msg, err) and "Traceback" not in err, err


def test_float64_emissions_beyond_float32_are_aligned_in_float64(tmp_path, capsys):
    x = torch.zeros(2, 3, 4, dtype=torch.float64)
    x[1, 2, 1] = 1e300
    torch.save(x, tmp_path / "em.pt")
    (tmp_path / "t.txt").write_text("1\n1\n")
    out = tmp_path / "a.json"
    rc = main(["--emissions", str(tmp_path / "em.pt"), "--targets", str(tmp_path / "t.txt"), "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    recs = json.loads(out.read_text())
    assert recs[1]["score"] == pytest.approx(-2 * math.log(4))  # the frame of 1e300 emits the token: log p = 0


def test_blank_lines_after_the_targets_are_bounded(tmp_path, capsys, monkeypatch):
    import lightning_gtn.align_cli as cli

    torch.save(torch.zeros(2, 3, 4), tmp_path / "em.pt")
    monkeypatch.setattr(cli, "MAX_TRAILING_BLANK_LINES", 10)
    args = ["--emissions", str(tmp_path / "em.pt"), "--targets", str(tmp_path / "t.txt"), "--no-progress"]
    (tmp_path / "t.txt").write_text("1\n1\n" + "\n" * 10)
    assert main(args) == 0
    (tmp_path / "t.txt").write_text("1\n1\n" + "\n" * 11)
    assert main(args) == 2
    assert "more than 10 blank lines after the 2 lines" in capsys.readouterr().err


def test_emission_values_are_bounded_as_a_product(tmp_path, capsys, monkeypatch):
    import lightning_gtn.align_cli as cli

    torch.save(torch.zeros(2, 3, 4), tmp_path / "em.pt")
    (tmp_path / "t.txt").write_text("1\n1\n")
    monkeypatch.setattr(cli, "MAX_EMISSION_VALUES", 23)
    assert main(["--emissions", str(tmp_path / "em.pt"), "--targets", str(tmp_path / "t.txt"), "--no-progress"]) == 2
    assert "B * T * C = 2 * 3 * 4 = 24 values, over the limit of 23" in capsys.readouterr().err


class _NetworkLoss:
    """What the checkpoint path reads of a loss over a network's outputs: its declared protocol."""

    network_methods = ("encode", "predict", "join")
    blank = 0

    def __init__(self, options=None, arguments=None, refused=None):
        self._options, self._arguments, self._refused = options or {}, arguments or {}, refused

    def decoding(self, num_classes):
        from lightning_gtn.nn import Decoding

        if self._refused:
            raise ValueError(self._refused)
        return Decoding(options=self._options)

    def network_arguments(self):
        return self._arguments


@pytest.mark.parametrize(
    "loss, msg",
    [
        (_NetworkLoss(options={"durations": [0, 1, 2]}), "_NetworkLoss decodes with durations"),
        (_NetworkLoss(arguments={"extra_outputs": 2}), r"gives its network \{'extra_outputs': 2\}"),
        (_NetworkLoss(refused="big blanks are not the extra outputs"), "--checkpoint: big blanks are not"),
    ],
)
def test_a_network_loss_is_aligned_only_on_its_regular_lattice(loss, msg):
    """The loss's declared decoding options and network arguments decide, not its name."""
    from types import SimpleNamespace

    from lightning_gtn.align_cli import AlignError, _from_network_checkpoint

    model = SimpleNamespace(vocabulary=SimpleNamespace(num_classes=5), loss_network=lambda: None)
    with pytest.raises(AlignError, match=msg):
        _from_network_checkpoint(SimpleNamespace(star=None), model, None, loss)
    with pytest.raises(AlignError, match="--star: not available for _NetworkLoss"):
        _from_network_checkpoint(SimpleNamespace(star=-1.0), model, None, loss)


def test_a_long_recording_with_a_star_shows_frames_aligned(tmp_path, capsys, monkeypatch):
    from lightning_gtn.kernels import viterbi_paths

    monkeypatch.setattr(viterbi_paths, "PROGRESS_INTERVAL", 0.001)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(1, 6000, 8, generator=g)
    torch.save(x, tmp_path / "em.pt")
    target = torch.randint(1, 8, (2000,), generator=g).tolist()
    (tmp_path / "t.txt").write_text(" ".join(map(str, target)) + "\n")
    out = tmp_path / "a.json"
    rc = main(
        [
            "--emissions",
            str(tmp_path / "em.pt"),
            "--targets",
            str(tmp_path / "t.txt"),
            "--star",
            "-2",
            "--out",
            str(out),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "aligning" in err and "frame" in err and "6.00k/6.00k" in err  # the bar counts frames
    rec = json.loads(out.read_text())[0]
    ref = forced_align(x.log_softmax(-1), [target], [6000], star=-2.0)
    assert rec["score"] == pytest.approx(float(ref.score[0]), rel=1e-6)
    assert rec["star_frames"] == int(ref.star_frames.sum())
