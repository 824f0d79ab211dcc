"""The Hydra configs and the console scripts: compose every config, a shrunk run of every loss,
and (slow) end-to-end subprocess runs: CLI output, resume, evaluation, DDP on CPU, multirun."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict

from lightning_gtn.lightning import build_loss
from lightning_gtn.train import CONF_DIR, ConfigError, run
from tests._checkpoints import save_module_checkpoint

GROUPS = ["loss", "model", "data", "optim", "trainer", "callbacks", "logger", "experiment", "decoder"]
LOSSES = sorted(p.stem for p in (CONF_DIR / "loss").glob("*.yaml"))
SMOKE = ["experiment=smoke", "trainer.enable_progress_bar=false"]


def _compose(overrides, output_dir=None, config_name="train"):
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose(config_name, overrides=list(overrides), return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(output_dir or Path.cwd())
        cfg.hydra.job.num = 0
    HydraConfig.instance().set_config(cfg)
    return cfg


def _options(group):
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def test_conf_ships_inside_the_package():
    # The console script reads lightning_gtn/conf; in a checkout it is the top-level conf/.
    assert (CONF_DIR / "train.yaml").is_file()
    for g in GROUPS:
        assert _options(g), g
    assert set(LOSSES) >= {"ctc", "asg", "seq"}
    assert set(_options("trainer")) >= {"cpu", "gpu", "ddp", "ddp_cpu"}
    assert set(_options("logger")) >= {"csv", "tensorboard"}


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_compose_every_config(group, option, tmp_path):
    cfg = _compose([f"{group}={option}"], tmp_path)
    assert OmegaConf.select(cfg, "hydra.runtime.output_dir") == str(tmp_path)
    plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    for key in ("data", "model", "loss", "optim", "trainer"):
        assert "_target_" in plain[key] or key == "optim", key
    assert "_target_" in plain["optim"]["optimizer"]
    if group == "model":
        net = instantiate(cfg.model, feature_dim=8, num_classes=12)
        out, lengths = net(torch.zeros(2, 20, 8), torch.tensor([20, 11]))
        if hasattr(net, "join"):  # a transducer network: forward gives encoder frames, the joiner scores
            pred, _ = net.predict(torch.zeros(2, 3, dtype=torch.long))
            out = net.join(out[:, :, None], pred[:, None])
        assert out.shape[0] == 2 and out.shape[-1] == 12 and lengths.tolist()[1] <= 11
    elif group == "loss":
        if "denominator" in cfg.loss:  # LF-MMI: lightning-gtn-train builds it from the transcripts
            from types import SimpleNamespace

            from lightning_gtn.train import prepare_loss

            texts = SimpleNamespace(texts=["0123", "98 76", "5 5"])
            prepare_loss(cfg, SimpleNamespace(chars="0123456789 ", setup=lambda s: None, train_set=texts), tmp_path)
        adapter, vocab = build_loss(cfg.loss, "0123456789 ")
        assert vocab.num_classes in (11, 12)
    elif group == "optim":
        opt = instantiate(cfg.optim.optimizer)([torch.nn.Parameter(torch.zeros(2))])
        assert isinstance(opt, torch.optim.Optimizer)
        if cfg.optim.scheduler is not None:
            instantiate(cfg.optim.scheduler)(opt)
    elif group == "trainer" and option in ("cpu", "ddp_cpu"):
        trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False)
        assert trainer.num_devices == (2 if option == "ddp_cpu" else 1)
    elif group in ("callbacks", "logger"):
        for k, node in cfg[group].items():
            obj = instantiate(node)
            assert obj is not None, k
    elif group == "data" and option.startswith("speech"):
        dm = instantiate(cfg.data)  # nothing is synthesised until the manifests are read
        assert dm.chars == "abcdefghijklmnopqrstuvwxyz '" and dm.feature_dim == 80
        assert cfg.trainer.max_time == "00:00:09:30"  # data=speech picks trainer=cpu_speech
    elif group == "data" and not OmegaConf.missing_keys(cfg.data):  # not those that need the user's paths
        dm = instantiate(cfg.data)
        assert dm.chars == ("abcdefghijklmnopqrstuvwxyz '" if option.startswith("text") else "0123456789 ")
        assert dm.feature_dim == (32 if option.startswith("text") else 8)


def test_data_may_pick_the_model_and_a_loss_needing_its_own_model_wins(tmp_path):
    # conf/train.yaml lists data after model/trainer and loss after data
    cfg = _compose(["data=speech"], tmp_path)
    assert cfg.model._target_.endswith("ConvEncoder") and cfg.model.channels == 256  # model=conv_speech
    cfg = _compose(["data=speech", "loss=rnnt"], tmp_path)
    assert cfg.model._target_.endswith("TransducerModel")
    assert cfg.trainer.max_time == "00:00:09:30"
    cfg = _compose(["data=speech", "model=conv_lstm"], tmp_path)
    assert cfg.model.rnn == "lstm" and cfg.model.hidden_size != 128  # the command line wins


def test_compose_slurm_launcher(tmp_path):
    cfg = _compose(["hydra/launcher=slurm", "trainer=ddp", "trainer.devices=4"], tmp_path)
    assert "submitit" in cfg.hydra.launcher._target_.lower()
    assert cfg.hydra.launcher.tasks_per_node == 4 and cfg.hydra.launcher.gpus_per_node == 4


@pytest.mark.parametrize("loss", LOSSES)
def test_fast_dev_run_every_loss(loss, tmp_path):
    cfg = _compose([f"loss={loss}", "trainer.fast_dev_run=true", *SMOKE], tmp_path)
    metrics = run(cfg, output_dir=tmp_path)
    assert metrics["global_step"] == 1
    for key in ("train/loss", "val/loss", "val/cer", "val/wer"):
        assert key in metrics and metrics[key] >= 0, key
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    assert (tmp_path / "curves.png").stat().st_size > 1000
    # frame paths are drawn for the frame-level losses; an RNN-T loss (its own model) has none
    assert (tmp_path / "alignments.png").is_file() == (cfg.model._target_ != "lightning_gtn.lightning.TransducerModel")
    if (tmp_path / "alignments.png").is_file():
        assert (tmp_path / "alignments.png").stat().st_size > 1000


def test_loss_rnnt_trains_by_chunks_and_an_override_keeps_the_materialised_joiner(tmp_path):
    """``loss=rnnt`` builds RNNTLoss(joiner="chunked"), which scores the transducer model by chunks;
    ``loss.joiner=materialised`` builds the materialised path, and a run with it still trains."""
    from lightning_gtn.lightning import TransducerModel

    for override, joiner in ((), "chunked"), (("loss.joiner=materialised",), "materialised"):
        cfg = _compose(["loss=rnnt", *override], tmp_path)
        assert cfg.loss.joiner == joiner
        loss, _ = build_loss(cfg.loss, "0123456789 ")
        assert loss.joiner == joiner
        assert loss.chunked(TransducerModel(8, 12, conv_channels=8, hidden_size=8)) == (joiner == "chunked")
    with pytest.raises(ValueError, match="joiner must be one of"):
        build_loss(_compose(["loss=rnnt", "loss.joiner=full"], tmp_path).loss, "0123456789 ")
    cfg = _compose(["loss=rnnt", "loss.joiner=materialised", "trainer.fast_dev_run=true", *SMOKE], tmp_path)
    metrics = run(cfg, output_dir=tmp_path)
    assert metrics["global_step"] == 1 and math.isfinite(metrics["train/loss"]) and metrics["val/cer"] >= 0


@pytest.mark.parametrize("name", ["tdt", "multiblank"])
def test_duration_losses_train_by_chunks_and_an_override_keeps_the_materialised_joiner(name, tmp_path):
    """``loss=tdt`` / ``loss=multiblank`` build their module with ``joiner: chunked`` (the duration
    joiner losses; test_fast_dev_run_every_loss trains them so); ``loss.joiner=materialised``
    builds the materialised path, and a run with it still trains."""
    from lightning_gtn.lightning import TransducerModel

    for override, joiner in ((), "chunked"), (("loss.joiner=materialised",), "materialised"):
        cfg = _compose([f"loss={name}", *override], tmp_path)
        assert cfg.loss.joiner == joiner
        loss, _ = build_loss(cfg.loss, "0123456789 ")
        assert loss.joiner == joiner
        net = TransducerModel(8, 12, conv_channels=8, hidden_size=8, extra_outputs=loss.extra_outputs)
        assert loss.chunked(net) == (joiner == "chunked")
    with pytest.raises(ValueError, match="joiner must be one of"):
        build_loss(_compose([f"loss={name}", "loss.joiner=full"], tmp_path).loss, "0123456789 ")
    cfg = _compose([f"loss={name}", "loss.joiner=materialised", "trainer.fast_dev_run=true", *SMOKE], tmp_path)
    metrics = run(cfg, output_dir=tmp_path)
    assert metrics["global_step"] == 1 and math.isfinite(metrics["train/loss"]) and metrics["val/cer"] >= 0


def test_bad_configs_name_the_key(tmp_path):
    with pytest.raises(ConfigCompositionException, match="nonexistent"):
        _compose(["trainer.nonexistent=1"], tmp_path)
    with pytest.raises(ConfigCompositionException, match="loss"):
        _compose(["loss=does_not_exist"], tmp_path)
    cfg = _compose(["model.rnn=transformer", *SMOKE], tmp_path)
    with pytest.raises(ConfigError, match=r"model.*model\.rnn"):
        run(cfg, output_dir=tmp_path)
    cfg = _compose(["ckpt_path=/no/such.ckpt", *SMOKE], tmp_path)
    with pytest.raises(ConfigError, match="ckpt_path"):
        run(cfg, output_dir=tmp_path)
    cfg = _compose(["data=features"], tmp_path)
    with pytest.raises(ConfigError, match=r"^data\.train_features: mandatory value missing"):
        run(cfg, output_dir=tmp_path)
    for override, key in (
        ("trainer.max_epochs=abc", r"trainer\.max_epochs: expected an integer"),
        ("optim.optimizer.lr=abc", r"optim\.optimizer\.lr: expected a number"),
        ("model.hidden_size=abc", r"model\.hidden_size: expected an integer"),
    ):
        cfg = _compose([override, *SMOKE], tmp_path)
        with pytest.raises(ConfigError, match=rf"^{key}, got 'abc'"):
            run(cfg, output_dir=tmp_path)
    cfg = _compose(["loss.blank=3", *SMOKE], tmp_path)
    with pytest.raises(ConfigError, match=r"^loss\.blank: .* blank at id 0"):
        run(cfg, output_dir=tmp_path)
    cfg = _compose(["optim.optimizer._target_=torch.optim.NoSuchOpt", *SMOKE], tmp_path)
    with pytest.raises(ConfigError, match="optim.optimizer"):
        run(cfg, output_dir=tmp_path)


# ---------------------------------------------------------------------------------------------
# End-to-end runs in subprocesses (Lightning's DDP must not relaunch pytest).


def _cli(module, args, cwd, timeout=420):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    return json.loads(last), proc.stdout


@pytest.mark.slow
def test_cli_train_resume_evaluate_and_ddp_metrics_match(tmp_path):
    run1 = tmp_path / "run1"
    m1, _ = _cli("lightning_gtn.train", [*SMOKE, f"hydra.run.dir={run1}"], tmp_path)
    assert {"train/loss", "val/loss", "val/cer", "val/wer"} <= set(m1)
    assert json.loads((run1 / "metrics.json").read_text()) == m1
    for name in ("checkpoints/last.ckpt", "checkpoints/best.ckpt", "curves.png", "alignments.png"):
        assert (run1 / name).is_file(), name
    steps = m1["global_step"]
    assert steps > 0

    # resume: continues from the checkpoint's step instead of starting over
    run2 = tmp_path / "run2"
    m2, _ = _cli(
        "lightning_gtn.train",
        [*SMOKE, "trainer.max_epochs=2", f"hydra.run.dir={run2}", f"ckpt_path={run1 / 'checkpoints' / 'last.ckpt'}"],
        tmp_path,
    )
    assert m2["global_step"] == 2 * steps and m2["epoch"] == 2

    best = run2 / "checkpoints" / "last.ckpt"
    e1, out = _cli(
        "lightning_gtn.evaluate",
        [
            f"ckpt_path={best}",
            "data=digits_small",
            "trainer.enable_progress_bar=false",
            f"hydra.run.dir={tmp_path / 'ev1'}",
        ],
        tmp_path,
    )
    assert "->" in out and {"val/cer", "val/wer", "val/loss"} <= set(e1)
    e2, _ = _cli(
        "lightning_gtn.evaluate",
        [
            f"ckpt_path={best}",
            "data=digits_small",
            "trainer=ddp_cpu",
            "trainer.enable_progress_bar=false",
            f"hydra.run.dir={tmp_path / 'ev2'}",
        ],
        tmp_path,
    )
    # sum-reduced metric states: two processes give the single-process figures
    assert e2["val/cer"] == pytest.approx(e1["val/cer"], abs=1e-6)
    assert e2["val/wer"] == pytest.approx(e1["val/wer"], abs=1e-6)
    assert e2["val/loss"] == pytest.approx(e1["val/loss"], rel=1e-4)


@pytest.mark.slow
def test_last_checkpoint_holds_the_end_of_training(tmp_path):
    # a resumed run whose validations never beat the checkpoint's best: Lightning alone left
    # last.ckpt at the latest step checkpoint (step 39 of 40), not at the end of training
    args = [*SMOKE, "callbacks.step_checkpoint.every_n_train_steps=3"]
    m1, _ = _cli("lightning_gtn.train", [*args, "trainer.max_epochs=3", f"hydra.run.dir={tmp_path / 'a'}"], tmp_path)
    last = tmp_path / "a" / "checkpoints" / "last.ckpt"
    m2, _ = _cli(
        "lightning_gtn.train",
        [*args, "trainer.max_epochs=5", f"ckpt_path={last}", f"hydra.run.dir={tmp_path / 'b'}"],
        tmp_path,
    )
    assert m2["global_step"] % 3 != 0  # the end is no step checkpoint's
    for name, m in (("a", m1), ("b", m2)):
        ckpt = torch.load(tmp_path / name / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        assert ckpt["global_step"] == m["global_step"]


@pytest.mark.slow
def test_cli_killed_run_resumes_from_its_step_checkpoint(tmp_path):
    # a long run killed with SIGKILL right after its first mid-epoch checkpoint (every 3 steps;
    # an epoch of the smoke data is 8 steps) resumes from that step, not from the start
    run1 = tmp_path / "killed"
    last = run1 / "checkpoints" / "last.ckpt"
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lightning_gtn.train",
            *SMOKE,
            "trainer.max_epochs=100",
            "callbacks.step_checkpoint.every_n_train_steps=3",
            f"hydra.run.dir={run1}",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while not last.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # let the checkpoint file be written completely
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    step, epoch = ckpt["global_step"], ckpt["epoch"]
    assert step > 0 and epoch < 100

    run2 = tmp_path / "resumed"
    # one epoch more than the checkpoint's: the run was killed at any step (on a fast machine,
    # possibly at the last step of an epoch, after which a resumed run to epoch + 1 has no step left)
    m, _ = _cli(
        "lightning_gtn.train",
        [
            *SMOKE,
            f"trainer.max_epochs={epoch + 2}",
            f"ckpt_path={last}",
            "callbacks.step_checkpoint.every_n_train_steps=3",
            f"hydra.run.dir={run2}",
        ],
        tmp_path,
    )
    assert m["epoch"] == epoch + 2
    assert step < m["global_step"] <= step + 16  # continued from the checkpoint's step
    assert math.isfinite(m["train/loss"])
    # the step and the validation checkpoints share one last.ckpt (no last-v1.ckpt beside it)
    assert sorted(p.name for p in (run2 / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]
    assert (
        torch.load(run2 / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]
        == m["global_step"]
    )


@pytest.mark.slow
def test_cli_ddp_cpu_training(tmp_path):
    out = tmp_path / "ddp"
    m, _ = _cli("lightning_gtn.train", [*SMOKE, "trainer=ddp_cpu", "loss=asg", f"hydra.run.dir={out}"], tmp_path)
    assert {"train/loss", "val/cer", "val/wer"} <= set(m)
    # 64 training lines, batch 8, 2 processes -> 4 steps per epoch
    assert m["global_step"] == 4
    assert (out / "checkpoints" / "last.ckpt").is_file() and (out / "curves.png").is_file()


@pytest.mark.slow
def test_cli_ddp_relaunch_strategy_prints_one_result(tmp_path):
    # strategy=ddp re-runs the command in a subprocess per extra rank (what trainer=ddp does on
    # GPUs); only rank 0 reports.
    out = tmp_path / "ddp_sub"
    m, stdout = _cli(
        "lightning_gtn.train", [*SMOKE, "trainer=ddp_cpu", "trainer.strategy=ddp", f"hydra.run.dir={out}"], tmp_path
    )
    assert m["global_step"] == 4 and "val/cer" in m
    assert sum(line.startswith("{") for line in stdout.splitlines()) == 1
    assert json.loads((out / "metrics.json").read_text()) == m


@pytest.mark.slow
def test_cli_multirun_over_two_losses(tmp_path):
    sweep = tmp_path / "sweep"
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_gtn.train", "-m", "loss=ctc,seq", *SMOKE, f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sorted(sweep.glob("*/metrics.json"))
    assert len(results) == 2, list(sweep.iterdir())
    names = sorted(p.parent.name for p in results)
    assert "loss=ctc" in names[0] and "loss=seq" in names[1], names
    for p in results:
        assert "val/cer" in json.loads(p.read_text())


@pytest.mark.slow
def test_wheel_ships_the_configs(tmp_path):
    """A non-editable build carries conf/ as lightning_gtn/conf (the console script's config dir)."""
    import shutil
    import zipfile

    repo = Path(__file__).resolve().parents[1]
    src = tmp_path / "src"
    skip = shutil.ignore_patterns(
        ".venv",
        ".git",
        "build",
        "dist",
        "outputs",
        "multirun",
        "*.egg-info",
        "__pycache__",
        ".pytest_cache",
        ".hypothesis",
        "tests",
        "benchmarks",
    )
    shutil.copytree(repo, src, symlinks=True, ignore=skip)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("lightning_gtn-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"lightning_gtn/conf/{p.relative_to(CONF_DIR)}" for p in CONF_DIR.rglob("*.yaml")}
    assert len(expected) > 20 and expected <= names
    assert "lightning_gtn/train.py" in names and "lightning_gtn/lightning/mixin.py" in names


# ---------------------------------------------------------------------------------------------
# Loud failures: resume mismatches, non-finite losses, untrusted checkpoints, own data.


def _checkpoint_of(cfg, path):
    """A checkpoint with the hyper-parameters ``run(cfg)`` would store (no training)."""

    from lightning_gtn.lightning import SequenceModule

    dm = instantiate(cfg.data)
    model = SequenceModule(cfg.model, cfg.loss, dm.chars, dm.feature_dim, cfg.optim.optimizer)
    save_module_checkpoint(model, path)
    return path


@pytest.mark.parametrize(
    "override,key",
    [
        ("loss=seq", r"loss\._target_"),
        ("model.hidden_size=32", r"model\.hidden_size"),
        ("loss.zero_infinity=false", r"loss\.zero_infinity"),
    ],
)
def test_resume_refuses_a_checkpoint_of_another_loss_or_model(override, key, tmp_path):
    ckpt = _checkpoint_of(_compose(SMOKE, tmp_path), tmp_path / "ctc.ckpt")
    cfg = _compose([override, f"ckpt_path={ckpt}", *SMOKE], tmp_path)
    with pytest.raises(ConfigError, match=rf"^{key}: cannot resume from .*the checkpoint has"):
        run(cfg, output_dir=tmp_path)


def test_resume_refuses_another_vocabulary(tmp_path):
    ckpt = _checkpoint_of(_compose(SMOKE, tmp_path), tmp_path / "ctc.ckpt")
    hp = torch.load(ckpt, weights_only=True)
    hp["hyper_parameters"]["chars"] = "0123456789"
    torch.save(hp, ckpt)
    with pytest.raises(ConfigError, match=r"^data\.chars: cannot resume"):
        run(_compose([f"ckpt_path={ckpt}", *SMOKE], tmp_path), output_dir=tmp_path)


NAN_RUN = [
    "optim=sgd",
    "optim.optimizer.lr=1e30",
    "trainer.gradient_clip_val=null",
    "trainer.limit_train_batches=4",
    "trainer.limit_val_batches=1",
    "callbacks=none",
    "logger=none",
    *SMOKE,
]


def test_nonfinite_loss_stops_the_run_and_is_written(tmp_path):
    from lightning_gtn.train import TrainingFailed

    with pytest.raises(
        TrainingFailed, match=r"non-finite training loss nan at global step \d+ \(epoch 0, batch \d+\)"
    ) as e:
        run(_compose(NAN_RUN, tmp_path), output_dir=tmp_path)
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert math.isnan(written["train/loss"]) and "global step" in written["error"]
    assert written.keys() == e.value.metrics.keys()
    # with skipping enabled the run goes on, bounded by max_consecutive
    cfg = _compose([*NAN_RUN, "nonfinite.action=skip", "nonfinite.max_consecutive=1"], tmp_path / "skip")
    with pytest.raises(TrainingFailed, match=r"2 batches in a row \(nonfinite.max_consecutive=1\)"):
        run(cfg, output_dir=tmp_path / "skip")  # a run directory of its own


def _cli_fail(module, args, cwd, timeout=300):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode != 0, proc.stdout[-3000:]
    return proc


@pytest.mark.slow
def test_cli_nonfinite_run_exits_nonzero_with_nan_in_the_json(tmp_path):
    out = tmp_path / "nan"
    proc = _cli_fail("lightning_gtn.train", [*NAN_RUN, f"hydra.run.dir={out}"], tmp_path)
    last = json.loads(proc.stdout.strip().splitlines()[-1])  # NaN is written as JSON NaN
    assert math.isnan(last["train/loss"]) and "global step" in last["error"]
    assert json.loads((out / "metrics.json").read_text()).keys() == last.keys()
    assert "non-finite training loss" in proc.stderr


def test_cli_eval_refuses_a_crafted_checkpoint_and_model_overrides(tmp_path):
    good = _checkpoint_of(_compose(SMOKE, tmp_path), tmp_path / "good.ckpt")
    marker = tmp_path / "marker"
    ck = torch.load(good, weights_only=True)
    ck["hyper_parameters"]["loss"] = {"_target_": "pydoc.pipepager", "text": "", "cmd": f"touch {marker}"}
    torch.save(ck, tmp_path / "evil.ckpt")
    proc = _cli_fail(
        "lightning_gtn.evaluate",
        [f"ckpt_path={tmp_path / 'evil.ckpt'}", "data=digits_small", f"hydra.run.dir={tmp_path / 'ev'}"],
        tmp_path,
    )
    assert "loss._target_: 'pydoc.pipepager' is not trusted" in proc.stderr and "trust_modules" in proc.stderr
    assert not marker.exists()

    from lightning_gtn.evaluate import evaluate

    cfg = _compose([f"ckpt_path={good}", "data=digits_small", "loss=seq"], tmp_path, config_name="eval")
    for overrides, key in (
        (["loss=seq"], "loss"),
        (["model.hidden_size=8"], "model.hidden_size"),
        (["+optim.optimizer.foo=1"], "optim.optimizer.foo"),
    ):
        with pytest.raises(
            ConfigError, match=rf"^{key}: lightning-gtn-eval uses the network, loss and vocabulary stored"
        ):
            evaluate(cfg, overrides=overrides)


def test_eval_trust_modules_opts_in(tmp_path):
    from lightning_gtn import trust
    from lightning_gtn.evaluate import evaluate

    good = _checkpoint_of(_compose(SMOKE, tmp_path), tmp_path / "good.ckpt")
    ck = torch.load(good, weights_only=True)
    ck["hyper_parameters"]["scheduler"] = {"_target_": "json.dumps", "obj": 1}
    torch.save(ck, tmp_path / "mine.ckpt")
    base = [
        f"ckpt_path={tmp_path / 'mine.ckpt'}",
        "data=digits_small",
        "data.num_val=10",
        "num_samples=0",
        "trainer.enable_progress_bar=false",
    ]
    with pytest.raises(ConfigError, match=r"optim\.scheduler\._target_: 'json\.dumps' is not trusted"):
        evaluate(_compose(base, tmp_path, config_name="eval"), overrides=[])
    metrics = evaluate(_compose([*base, "trust_modules=[json]"], tmp_path, config_name="eval"), overrides=[])
    assert {"val/cer", "val/wer", "val/loss"} <= set(metrics)
    assert "json." not in trust.trusted_prefixes()  # the opt-in ends with the command


def test_cli_readme_own_data_command_with_the_default_logger(tmp_path, rng):
    # the README's command: data=features with the four paths, the default csv logger on
    import numpy as np

    words = ["ab", "ba", "abc", "cab", "a b", "bca"]
    for split, n in (("train", 8), ("val", 4)):
        np.savez(
            tmp_path / f"{split}.npz", **{f"u{i}": rng.normal(size=(12 + i, 5)).astype("float32") for i in range(n)}
        )
        (tmp_path / f"{split}.txt").write_text("".join(f"u{i} {words[i % len(words)]}\n" for i in range(n)))
    out = tmp_path / "run"
    m, _ = _cli(
        "lightning_gtn.train",
        [
            "data=features",
            f"data.train_features={tmp_path / 'train.npz'}",
            f"data.train_transcripts={tmp_path / 'train.txt'}",
            f"data.val_features={tmp_path / 'val.npz'}",
            f"data.val_transcripts={tmp_path / 'val.txt'}",
            "data.batch_size=4",
            "trainer.max_epochs=1",
            "trainer.enable_progress_bar=false",
            "model.conv_channels=8",
            "model.hidden_size=8",
            f"hydra.run.dir={out}",
        ],
        tmp_path,
        timeout=300,
    )
    assert {"train/loss", "val/loss", "val/cer", "val/wer"} <= set(m) and m["global_step"] == 2
    assert (out / "csv" / "metrics.csv").is_file() and (out / "csv" / "hparams.yaml").is_file()


# -- one run per directory (second probe, finding 15) ---------------------------------------------


def test_a_run_directory_holds_one_run(tmp_path):
    from lightning_gtn.train import RUN_LOCK, claim_run_dir

    d = tmp_path / "run"
    d.mkdir()
    (d / "lightning-gtn-train.log").write_text("hydra's job log\n")
    lock = claim_run_dir(d, None)  # only Hydra's log: a fresh directory
    assert lock.path == d / RUN_LOCK and lock.path.read_text().strip() == str(os.getpid())
    # a second run while the first holds the lock
    with pytest.raises(ConfigError, match=rf"hydra.run.dir: .* is in use by another run \(process {os.getpid()}"):
        claim_run_dir(d, None)
    (d / "checkpoints").mkdir()
    (d / "checkpoints" / "last.ckpt").write_bytes(b"x")
    lock.release()
    assert not (d / RUN_LOCK).exists()
    # a finished run's directory: refused, unless this run resumes a checkpoint inside it
    with pytest.raises(ConfigError, match=r"already holds another run \(checkpoints\).*ckpt_path=.*last\.ckpt$"):
        claim_run_dir(d, None)
    assert not (d / RUN_LOCK).exists()
    with pytest.raises(ConfigError, match="already holds another run"):
        claim_run_dir(d, tmp_path / "elsewhere.ckpt")
    lock = claim_run_dir(d, d / "checkpoints" / "last.ckpt")
    assert lock.path == d / RUN_LOCK
    lock.release()
    # a lock file left by a process that is gone (its flock went with it) is taken over
    (d / RUN_LOCK).write_text("999999999\n")
    claim_run_dir(d, d / "checkpoints" / "last.ckpt").release()


def test_run_directory_lock_is_atomic(tmp_path):
    import fcntl

    from lightning_gtn.train import RUN_LOCK, claim_run_dir

    d = tmp_path / "run"
    d.mkdir()
    # a lock file created by a run that has not written its pid yet: the directory is taken
    fd = os.open(d / RUN_LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match=r"is in use by another run \(a process that is starting"):
            claim_run_dir(d, None)
        assert (d / RUN_LOCK).read_text() == ""  # the other run's file is left alone
    finally:
        os.close(fd)
    # an empty lock file nobody holds (a run killed before it wrote its pid) is free
    claim_run_dir(d, None).release()
    # three processes claim one directory at once: exactly one wins (each holds what it got until
    # all have tried)
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from lightning_gtn.train import ConfigError, claim_run_dir\n"
        "print('ready', flush=True)\n"
        "while not Path(sys.argv[2]).exists(): time.sleep(0.001)\n"
        "try:\n"
        "    claim_run_dir(Path(sys.argv[1]), None)\n"
        "    print('won', flush=True)\n"
        "except ConfigError:\n"
        "    print('lost', flush=True)\n"
        "sys.stdin.read()\n"
    )
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(d), str(go)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    try:
        assert [p.stdout.readline().strip() for p in procs] == ["ready"] * 3
        go.touch()
        outs = [p.stdout.readline().strip() for p in procs]
    finally:
        for p in procs:
            p.communicate(timeout=60)
    assert sorted(outs) == ["lost"] * 2 + ["won"], outs


def test_a_run_killed_before_its_first_checkpoint_can_be_started_again(tmp_path):
    from lightning_gtn.train import claim_run_dir

    d = tmp_path / "run"
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (d / "csv").mkdir()
    (d / "checkpoints").mkdir()
    (d / "train.log").write_text("")
    claim_run_dir(d, None).release()  # nothing to resume: a fresh run may take it
    (d / "notes.txt").write_text("mine\n")  # anything else: refused, and nothing to resume
    with pytest.raises(ConfigError, match=r"already holds another run \(.*notes\.txt.*remove what is in it$"):
        claim_run_dir(d, None)


def test_second_run_into_the_same_directory_is_refused_and_mixes_nothing(tmp_path):
    out = tmp_path / "run"
    run(_compose(["loss=ctc", "trainer.fast_dev_run=true", *SMOKE], out), output_dir=out)
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert (out / ".hydra" / "config.yaml").is_file() and not (out / ".lightning_gtn.lock").exists()
    with pytest.raises(ConfigError, match="already holds another run"):
        run(_compose(["loss=seq", "trainer.fast_dev_run=true", *SMOKE], out), output_dir=out)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    saved = (out / ".hydra" / "config.yaml").read_text()
    assert "CTCLoss" in saved and "SequenceLoss" not in saved


def test_trainer_flags_users_reach_for_are_plain_overrides(tmp_path):
    # Newcomer edge of the second probe: trainer.max_steps=20 failed ("not in struct").
    flags = [
        "trainer.max_steps=20",
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=2",
        "trainer.limit_test_batches=2",
        "trainer.val_check_interval=0.5",
        "trainer.precision=bf16-mixed",
        "trainer.accumulate_grad_batches=2",
    ]
    for trainer in ("cpu", "gpu", "ddp", "ddp_cpu"):
        cfg = _compose([f"trainer={trainer}", *flags], tmp_path)
        assert cfg.trainer.max_steps == 20 and cfg.trainer.accumulate_grad_batches == 2
        assert cfg.trainer.limit_test_batches == 2 and cfg.trainer.val_check_interval == 0.5
    cfg = _compose(["trainer.max_steps=2", "trainer.limit_val_batches=1", *SMOKE], tmp_path)
    assert run(cfg, output_dir=tmp_path)["global_step"] == 2


def test_too_few_word_pieces_names_the_key(tmp_path):
    # Newcomer edge: loss=transducer loss.tokens=20 on 27 graphemes gave a raw ValueError.
    cfg = _compose(["loss=transducer", "loss.tokens=5", *SMOKE], tmp_path)
    with pytest.raises(
        ConfigError,
        match=r"^loss\.tokens=5: the number of word pieces must be at least the number " r"of distinct graphemes \(\d+",
    ):
        run(cfg, output_dir=tmp_path)
    assert not any(tmp_path.iterdir()) or sorted(p.name for p in tmp_path.iterdir()) == []


# -- resume: a checkpoint is data --------------------------------------------------------------

SHORT = [*SMOKE, "trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "callbacks.plots.num_alignments=0"]


def _trained_run(run_dir, epochs=1):
    """A run of ``epochs`` epochs of 2 steps in ``run_dir`` (in this process); its last.ckpt."""
    run(_compose([*SHORT, f"trainer.max_epochs={epochs}"], run_dir), output_dir=run_dir)
    return run_dir / "checkpoints" / "last.ckpt"


def test_resumed_checkpoint_paths_never_leave_the_run_folder(tmp_path):
    # a crafted last.ckpt whose checkpoint-callback states name files outside the run: Lightning
    # restored them and deleted them as "previous" top-k / last checkpoints when the run went on
    run_dir = tmp_path / "run"
    last = _trained_run(run_dir)
    victims = [tmp_path / "victim1.txt", tmp_path / "victim2.ckpt", tmp_path / "victim3.txt"]
    for v in victims:
        v.write_text("not the run's\n")
    ckpt = torch.load(last, map_location="cpu", weights_only=True)
    for state in ckpt["callbacks"].values():
        if "best_k_models" in state:
            d = state["dirpath"]
            state["best_k_models"] = {f"{d}/../../victim1.txt": torch.tensor(5.0)}
            state["kth_best_model_path"] = f"{d}/../../victim1.txt"
            state["kth_value"] = torch.tensor(5.0)
            state["best_model_score"] = torch.tensor(5.0)
            state["best_model_path"] = str(victims[1])
            state["last_model_path"] = f"{d}/../../victim3.txt"
    torch.save(ckpt, last)
    cfg = _compose([*SHORT, "trainer.max_epochs=2", f"ckpt_path={last}"], run_dir)
    metrics = run(cfg, output_dir=run_dir)  # resumed in place
    assert metrics["global_step"] == 4
    for v in victims:
        assert v.read_text() == "not the run's\n", v
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]
    states = torch.load(last, map_location="cpu", weights_only=True)["callbacks"].values()
    for state in (s for s in states if "best_k_models" in s):
        for p in [state["best_model_path"], state["last_model_path"], *state["best_k_models"]]:
            assert not p or Path(p).resolve().parent == (run_dir / "checkpoints").resolve(), p


def test_resume_keeps_scores_of_the_run_folder_and_checks_our_callback_states(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_gtn.lightning import TrainingPlots
    from lightning_gtn.lightning.callbacks import CheckpointStateError, checkpoint_state_in_folder

    d = tmp_path / "checkpoints"
    d.mkdir()
    (d / "best.ckpt").write_bytes(b"x")
    (tmp_path / "outside.ckpt").write_bytes(b"x")
    (d / "link.ckpt").symlink_to(tmp_path / "outside.ckpt")
    cb = ModelCheckpoint(dirpath=str(d), filename="best", monitor="val/cer", save_top_k=2)
    state = {
        "dirpath": "/elsewhere/checkpoints",  # a moved run: its file names still count
        "best_k_models": {
            "/elsewhere/checkpoints/best.ckpt": torch.tensor(0.25),
            "/elsewhere/checkpoints/link.ckpt": torch.tensor(0.5),  # resolves outside
            f"{d}/../outside.ckpt": torch.tensor(0.75),
        },
        "best_model_path": f"{d}/../outside.ckpt",
        "last_model_path": "/etc/passwd",
    }
    out = checkpoint_state_in_folder(cb, state)
    assert out["best_k_models"] == {str(d / "best.ckpt"): torch.tensor(0.25)}
    assert out["best_model_path"] == out["kth_best_model_path"] == str(d / "best.ckpt")
    assert float(out["best_model_score"]) == 0.25 and out["last_model_path"] == ""
    cb.load_state_dict(out)
    assert cb.best_k_models == {str(d / "best.ckpt"): torch.tensor(0.25)}
    empty = checkpoint_state_in_folder(cb, "not a mapping")
    assert empty["best_k_models"] == {} and empty["best_model_score"] is None
    plots = TrainingPlots(tmp_path)
    plots.load_state_dict({"history": {"val/cer": [[3, 0.5]]}})
    assert plots.history == {"val/cer": [(3, 0.5)]}
    with pytest.raises(CheckpointStateError, match=r"callbacks\[TrainingPlots\]\.history\['val/cer'\]"):
        plots.load_state_dict({"history": {"val/cer": [["/etc/passwd", 1]]}})


def test_resume_in_place_appends_to_the_logs_and_keeps_the_final_metrics(tmp_path):
    import csv

    run_dir = tmp_path / "run"
    last = _trained_run(run_dir)  # 2 steps
    log = run_dir / "csv" / "metrics.csv"

    def steps():
        with open(log, newline="") as f:
            return sorted({int(r["step"]) for r in csv.DictReader(f)})

    assert steps() == [0, 1]
    m2 = run(_compose([*SHORT, "trainer.max_epochs=2", f"ckpt_path={last}"], run_dir), output_dir=run_dir)
    assert m2["global_step"] == 4 and steps() == [0, 1, 2, 3]
    # resumed again with nothing left to train: the history and the final metrics stay
    m3 = run(_compose([*SHORT, "trainer.max_epochs=2", f"ckpt_path={last}"], run_dir), output_dir=run_dir)
    assert steps() == [0, 1, 2, 3]
    assert m3["global_step"] == 4 and m3["val/cer"] == m2["val/cer"] and m3["train/loss"] == m2["train/loss"]
    assert json.loads((run_dir / "metrics.json").read_text()) == m3


# -- the CLIs' messages ------------------------------------------------------------------------


def _cli_raw(module, args, cwd, timeout=300, **env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "HYDRA_FULL_ERROR")}
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_cli_config_errors_are_one_line_and_leave_no_run_folder(tmp_path):
    cases = [
        (
            "lightning_gtn.train",
            ["+trainer.max_step=10"],
            r"lightning-gtn-train: error: trainer: cannot build .*max_step",
        ),
        (
            "lightning_gtn.train",
            [
                "data=features",
                *(
                    f"data.{k}={tmp_path / 'nope'}"
                    for k in ("train_features", "train_transcripts", "val_features", "val_transcripts")
                ),
            ],
            r"lightning-gtn-train: error: data: .*not found: .*nope",
        ),
        ("lightning_gtn.evaluate", [], r"lightning-gtn-eval: error: ckpt_path: missing; name the checkpoint"),
        ("lightning_gtn.align_cli", ["--checkpoint", "nope"], r"lightning-gtn-align: error: --checkpoint: no such"),
    ]
    import re

    for module, args, pattern in cases:
        proc = _cli_raw(module, args, tmp_path)
        assert proc.returncode == 2, (module, args, proc.stderr[-2000:])
        last = proc.stderr.strip().splitlines()[-1]
        assert re.match(pattern, last), last
        assert (
            "Traceback" not in proc.stderr
            and "None" not in last
            and "ckpt_path:" not in last.replace("error: ckpt_path:", "")
        )
        assert not (tmp_path / "outputs").exists(), list((tmp_path / "outputs").rglob("*"))
    # the traceback on request
    proc = _cli_raw("lightning_gtn.evaluate", [], tmp_path, HYDRA_FULL_ERROR="1")
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "ConfigError" in proc.stderr


def test_cli_eval_help_lists_what_it_accepts(tmp_path):
    proc = _cli_raw("lightning_gtn.evaluate", ["--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    for word in ("ckpt_path=<file>", "split=val|test", "num_samples=", "data=<name>", "digits_small", "trust_modules="):
        assert word in proc.stdout, word
    assert "== Configuration groups ==" not in proc.stdout and "loss=" not in proc.stdout


def test_align_takes_trust_modules_spelled_as_the_other_clis(tmp_path):
    from lightning_gtn import align_cli

    good = _checkpoint_of(_compose(SMOKE, tmp_path), tmp_path / "good.ckpt")
    ck = torch.load(good, weights_only=True)
    ck["hyper_parameters"]["scheduler"] = {"_target_": "json.dumps", "obj": 1}
    torch.save(ck, tmp_path / "mine.ckpt")

    def align(name, *extra):
        args = ["--checkpoint", str(tmp_path / "mine.ckpt"), "--no-progress", "--out", str(tmp_path / name)]
        return align_cli.main([*args, *extra, "data=digits_small", "data.num_val=4"])

    assert align("refused.json") == 2
    assert align("a.json", "--trust-module", "json") == 0  # the older spelling
    assert len(json.loads((tmp_path / "a.json").read_text())) == 4
    args = ["--checkpoint", str(tmp_path / "mine.ckpt"), "--no-progress", "--out", str(tmp_path / "b.json")]
    assert align_cli.main([*args, "data=digits_small", "data.num_val=4", "trust_modules=[json]"]) == 0
    assert len(json.loads((tmp_path / "b.json").read_text())) == 4


def test_cli_run_prints_its_folder_logs_into_it_and_stays_quiet(tmp_path):
    out = tmp_path / "run"
    args = [*SHORT, "trainer.max_epochs=1", f"hydra.run.dir={out}"]
    proc = _cli_raw("lightning_gtn.train", args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"run folder: {out}" in proc.stderr
    log = (out / "train.log").read_text()
    assert f"run folder: {out}" in log and "`Trainer.fit` stopped" in log
    # resumed in place: Lightning's notes that are not the user's to act on stay out
    proc = _cli_raw(
        "lightning_gtn.train",
        [*args[:-2], "trainer.max_epochs=2", f"hydra.run.dir={out}", f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["global_step"] == 4
    for noise in ("litlogger", "LeafSpec", "weights_only", "exists and is not empty", "Previous log files"):
        assert noise not in proc.stderr, noise
    assert "Restored all states" in (out / "train.log").read_text()


def test_a_fresh_run_may_take_a_folder_holding_what_the_losses_prepare():
    from lightning_gtn.nn import StructuredLoss
    from lightning_gtn.train import EARLY_RUN_FILES, early_run_files

    class OwnLoss(StructuredLoss):  # a criterion's preparation declares the files it writes
        run_files = ("own_table.bin",)

    files = early_run_files()
    assert set(EARLY_RUN_FILES) < set(files)
    assert {"word_pieces.txt", "transitions.bin", "denominator.bin", "own_table.bin"} <= set(files)


def test_resume_takes_a_checkpoint_from_before_an_option_existed_at_its_default():
    from lightning_gtn.train import _first_difference

    old = {"_target_": "lightning_gtn.nn.RNNTLoss", "blank": 0}  # written before `joiner` existed
    assert _first_difference(old, {**old, "joiner": "chunked"}, "loss") is None  # the default
    d = _first_difference(old, {**old, "joiner": "materialised"}, "loss")
    assert d == "loss.joiner: the checkpoint has '<missing>', this run has 'materialised'"
    # a class this run cannot resolve gives no defaults: a missing key stays a difference
    unknown = {"_target_": "nowhere.Loss", "blank": 0}
    assert _first_difference(unknown, {**unknown, "joiner": "chunked"}, "loss").startswith("loss.joiner:")
