"""``lightning-gtn-train``: the Hydra entry point (layer 5).

Configs live in the top-level ``conf/`` of the repository and ship inside the package as
``lightning_gtn/conf``, so the console script finds them from a checkout and when installed.
With no overrides it trains the default model with the CTC loss on the embedded digit lines on
one CPU. The last line printed is one JSON object of the final metrics, also written to
``metrics.json`` in the run directory, together with checkpoints, ``curves.png`` and
``alignments.png``.

Examples::

    lightning-gtn-train
    lightning-gtn-train loss=asg trainer.max_epochs=3
    lightning-gtn-train trainer=ddp_cpu
    lightning-gtn-train ckpt_path=outputs/2024-01-01/12-00-00/checkpoints/last.ckpt
    lightning-gtn-train -m loss=ctc,asg,seq
    lightning-gtn-train model._target_=mypkg.Net trust_modules=[mypkg]

Trust: the configs given here are the user's own, so their dotted paths are allowed as they are;
anything else may only name registered types of :mod:`lightning_gtn.trust`, and
``trust_modules`` (module names) opts whole modules in. Resuming (``ckpt_path``) never instantiates anything from the
checkpoint; it checks that the checkpoint's loss, model and vocabulary equal this run's.

Each run prints its folder first (``run folder: outputs/<date>/<time>``) and logs into
``<run folder>/<job name>.log`` too. A config error or a missing file prints one line
``lightning-gtn-train: error: ...`` naming the key or the file and exits with status 2
(``HYDRA_FULL_ERROR=1``: the traceback), leaving no empty run folder behind.

Failures are loud: a non-finite training loss stops training (``nonfinite.action=skip`` skips such
batches, at most ``nonfinite.max_consecutive`` in a row); non-finite final metrics are written as
JSON ``NaN``/``Infinity`` (never dropped) and make the exit status 1, as does a stopped run (its
``metrics.json`` and final JSON line then carry ``"error"``).
"""

from __future__ import annotations

import os

# numba's OpenMP threading layer kills forked DataLoader workers; workqueue is fork-safe.
os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")

import inspect  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402
from omegaconf import DictConfig, OmegaConf, open_dict  # noqa: E402

#: this module's log (the run folder, at the start of a run)
log = logging.getLogger(__name__)

#: When this process started (a run folder made later was made by this command).
_STARTED = time.time()


class _DropLines(logging.Filter):
    """Drops log records whose message starts with one of ``prefixes``."""

    def __init__(self, *prefixes: str):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefixes)


def quiet_lightning() -> None:
    """Silences what Lightning and torch print that is not the user's to act on: the ``litlogger``
    tip, torch's ``_pytree`` ``LeafSpec`` deprecation inside Lightning, and "Checkpoint directory
    ... exists and is not empty" (a run directory holds one run: its own checkpoints are there
    when it resumes in place). Idempotent; the CLIs call it, also in spawned DDP processes."""
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropLines) for f in rank_zero.filters):
        rank_zero.addFilter(_DropLines("💡 Tip: For seamless cloud logging"))
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")


def use_run_log() -> None:
    """Hands Lightning's log lines to the handlers Hydra set up for the job (the console and the
    run's ``<job name>.log``, ``conf/hydra/job_logging``): Lightning gives its loggers a console
    handler of their own, and stops them propagating, when it is imported before logging is set up."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        lg = logging.getLogger(name)
        if logging.getLogger().handlers:
            for h in list(lg.handlers):
                if type(h) is logging.StreamHandler:
                    lg.removeHandler(h)
            lg.propagate = True


quiet_lightning()  # also in the processes DDP spawns, which import this module

__all__ = [
    "main",
    "train_texts",
    "prepare_loss",
    "run",
    "build",
    "ConfigError",
    "TrainingFailed",
    "CONF_DIR",
    "final_metrics",
    "check_resume",
    "check_types",
    "claim_run_dir",
    "RunLock",
    "RUN_LOCK",
    "EARLY_RUN_FILES",
    "early_run_files",
    "quiet_lightning",
    "use_run_log",
    "cli_error",
    "default_output_dir",
    "remove_empty_run_dir",
]

CONF_DIR = Path(__file__).resolve().parent / "conf"


class ConfigError(ValueError):
    """A config value that cannot be used; the message names the key."""


class TrainingFailed(RuntimeError):
    """Training stopped for a non-finite loss, or ended with non-finite final metrics.

    Attributes:
        metrics: the final metrics (also written to ``metrics.json``), with key ``"error"``.
    """

    def __init__(self, msg: str, metrics: dict):
        super().__init__(msg)
        self.metrics = metrics


def _annotation_types(tp) -> set:
    """The plain classes an annotation admits (``Optional[Union[int, float]]`` -> {int, float,
    NoneType}); ``object`` for anything it cannot read."""
    import typing

    if tp is inspect.Parameter.empty or tp is typing.Any:
        return {object}
    origin = typing.get_origin(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", typing.Union)):
        out = set()
        for a in typing.get_args(tp):
            out |= _annotation_types(a)
        return out
    if origin is typing.Literal:
        return {type(a) for a in typing.get_args(tp)}
    if origin is not None:
        return {origin}
    return {tp} if isinstance(tp, type) else {object}


def check_types(node, key: str) -> None:
    """Raises :class:`ConfigError` naming ``key.<name>`` when a string is given where the target
    class/function takes only numbers (``trainer.max_epochs=abc``, ``optim.optimizer.lr=abc``).

    Reads the target's type hints, or the type of a parameter's default when it has none."""
    import typing

    from hydra.utils import get_object

    if not isinstance(node, DictConfig) or not isinstance(node.get("_target_"), str):
        return
    try:
        target = get_object(node._target_)
        sig = inspect.signature(target)
    except Exception:
        return  # build() reports what cannot be imported
    try:
        hints = typing.get_type_hints(target.__init__ if inspect.isclass(target) else target)
    except Exception:
        hints = {}
    for name, p in sig.parameters.items():
        if name not in node or OmegaConf.is_missing(node, name):
            continue
        try:
            value = node[name]
        except Exception:
            continue
        if not isinstance(value, str):
            continue
        if name in hints:
            types_ = _annotation_types(hints[name])
        elif p.default is not inspect.Parameter.empty and p.default is not None:
            types_ = {type(p.default)}
        else:
            continue
        if object in types_ or str in types_ or not (types_ & {int, float}):
            continue
        try:
            float(value)
        except ValueError:
            want = "an integer" if float not in types_ else "a number"
            raise ConfigError(f"{key}.{name}: expected {want}, got {value!r}") from None


def build(node, key: str, **kwargs):
    """``hydra.utils.instantiate(node, **kwargs)`` with errors that name the config key."""
    from hydra.utils import instantiate

    if node is None:
        raise ConfigError(f"{key}: missing (null) but required")
    if isinstance(node, DictConfig) and "_target_" not in node:
        raise ConfigError(f"{key}: needs a '_target_' naming the class to build, got keys {list(node)}")
    try:
        return instantiate(node, **kwargs)
    except ConfigError:
        raise
    except Exception as e:
        cause = e.__cause__ if e.__cause__ is not None else e
        msg = " ".join(f"{type(cause).__name__}: {cause}".split())
        raise ConfigError(f"{key}: cannot build {node.get('_target_')}: {msg}") from e


def _check_keys(cfg: DictConfig) -> None:
    for key in ("data", "model", "loss", "optim", "trainer"):
        if cfg.get(key) is None:
            raise ConfigError(f"{key}: the config group is missing; pick one, e.g. {key}=<name>")
    missing = sorted(OmegaConf.missing_keys(cfg.data))
    if missing:
        name = missing[0] if missing[0].startswith("data.") else f"data.{missing[0]}"
        raise ConfigError(f"{name}: mandatory value missing (set it on the command line)")
    for key in ("data", "model", "trainer"):
        check_types(cfg[key], key)
    for key in ("optimizer", "scheduler"):
        check_types(cfg.optim.get(key), f"optim.{key}")
    if cfg.ckpt_path is not None and not Path(str(cfg.ckpt_path)).is_file():
        raise ConfigError(f"ckpt_path: no such checkpoint file: {cfg.ckpt_path}")


def train_texts(datamodule, key: str = "data") -> list[str]:
    """The training transcripts of ``datamodule`` (``train_set.texts`` after ``setup("fit")``),
    which a loss's preparation and the decoder's default lexicon and LM are learned from.

    Raises:
        ConfigError: naming ``key``: the data module has no training transcripts.
    """
    datamodule.setup("fit")
    texts = getattr(getattr(datamodule, "train_set", None), "texts", None)
    if not texts:
        raise ConfigError(
            f"{key}: learned from the training transcripts, but the data module has none (train_set.texts)"
        )
    return list(texts)


def prepare_loss(cfg: DictConfig, datamodule, output_dir: Path) -> None:
    """Runs the loss's preparation (:meth:`lightning_gtn.nn.StructuredLoss.prepare`) before the
    model is built: what ``cfg.loss`` learns from the training transcripts of ``datamodule`` (word
    pieces, a transitions graph, a denominator) is written into ``output_dir`` and put into
    ``cfg.loss`` as plain data, so the checkpoint's hyper-parameters carry it. Keys the
    preparation leaves alone are not touched.

    Raises:
        ConfigError: naming the ``loss.<key>`` at fault.
    """
    from lightning_gtn.lightning.loss_builder import prepare_loss as prepare
    from lightning_gtn.nn import Preparation

    loss = cfg.get("loss")
    if not isinstance(loss, DictConfig):
        return
    plain = OmegaConf.to_container(loss, resolve=True)
    assert isinstance(plain, dict)
    context = Preparation(datamodule.chars, lambda key: train_texts(datamodule, key), output_dir)
    try:
        new = prepare(plain, context)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    with open_dict(cfg):
        for k, v in new.items():
            if k not in plain or plain[k] != v:
                cfg.loss[k] = v


def _number(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _constructor_defaults(cfg: Mapping) -> dict:
    """The keyword defaults of the class this run's config names (``_target_``, resolved through
    the allow-list; {} where it names nothing registered or takes no keywords)."""
    import inspect

    from . import trust

    target = cfg.get("_target_")
    try:
        cls = trust.resolve(target, "_target_") if isinstance(target, str) else None
        params = inspect.signature(cls).parameters.values() if cls is not None else ()
    except (ValueError, TypeError, ImportError):
        return {}
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def _first_difference(old, new, key: str) -> str | None:
    """``"key.sub: the checkpoint has X, this run has Y"`` for the first difference, or None.

    A key this run's config has and the checkpoint's does not, set to its class's default, is
    no difference: the checkpoint was written before the option existed, and so ran with what
    the default stands for."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        defaults = _constructor_defaults(new) if "_target_" in new else {}
        for k in sorted(set(old) | set(new), key=str):
            if k not in old and k in defaults and new[k] == defaults[k]:
                continue
            d = _first_difference(old.get(k, "<missing>"), new.get(k, "<missing>"), f"{key}.{k}")
            if d:
                return d
        return None
    if old != new:
        return f"{key}: the checkpoint has {old!r}, this run has {new!r}"
    return None


def check_resume(ckpt_path, model) -> int:
    """Raises :class:`ConfigError` unless the checkpoint was trained with this run's loss config,
    model config, vocabulary (``chars``) and feature dimension; names the first differing key.

    Reads the checkpoint with ``weights_only=True`` and instantiates nothing from it.

    Returns:
        the checkpoint's ``global_step`` (0 when it has none).
    """
    import torch

    try:
        ckpt = torch.load(str(ckpt_path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise ConfigError(f"ckpt_path: cannot read {ckpt_path}: {' '.join(str(e).split())[:500]}") from e
    old = ckpt.get("hyper_parameters") if isinstance(ckpt, Mapping) else None
    if not isinstance(old, Mapping):
        raise ConfigError(f"ckpt_path: {ckpt_path} has no hyper-parameters (not written by lightning-gtn-train)")
    for name, key in (
        ("loss", "loss"),
        ("network", "model"),
        ("chars", "data.chars"),
        ("feature_dim", "data (feature_dim)"),
    ):
        d = _first_difference(old.get(name, "<missing>"), model.hparams.get(name), key)
        if d:
            raise ConfigError(
                f"{d.split(':')[0]}: cannot resume from {ckpt_path}: {d.split(': ', 1)[1]} "
                "(a checkpoint resumes only the run that wrote it; start a new run instead)"
            )
    step = ckpt.get("global_step", 0)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigError(f"ckpt_path: {ckpt_path}: checkpoint field global_step must be an integer >= 0, got {step!r}")
    return step


def final_metrics(trainer) -> dict:
    """The final metrics from ``trainer.callback_metrics`` (epoch values, plain floats; NaN and
    infinities are kept)."""
    out = {}
    for k, v in trainer.callback_metrics.items():
        if k.endswith("_step") and k != "global_step":  # per-step values of on_step+on_epoch logs
            continue
        name = k[: -len("_epoch")] if k.endswith("_epoch") else k
        f = _number(v)
        if f is not None:
            out[name] = f
    return dict(sorted(out.items()))


class _FinalProgress(Callback):
    """Copies epoch and step into ``callback_metrics`` at the end of fitting: with spawned
    processes (``trainer=ddp_cpu``) only the metrics come back to the launching process."""

    def on_fit_end(self, trainer, pl_module):
        import torch

        trainer.callback_metrics["epoch"] = torch.tensor(float(trainer.current_epoch))
        trainer.callback_metrics["global_step"] = torch.tensor(float(trainer.global_step))


#: the lock file a run keeps in its directory while it runs (its content: the owner's pid)
RUN_LOCK = ".lightning_gtn.lock"

#: What a run writes into its directory before its first checkpoint, besides the files the losses'
#: preparations write (their ``run_files``, :func:`early_run_files`): a directory holding nothing
#: else and no ``*.ckpt`` (a run killed that early) may be taken by a fresh run.
EARLY_RUN_FILES = (
    ".hydra",
    "csv",
    "tensorboard",
    "checkpoints",
    "lexicon.txt",
    "lm.arpa",
)


def early_run_files() -> tuple[str, ...]:
    """:data:`EARLY_RUN_FILES` and the ``run_files`` every loss class declares (the files its
    :meth:`~lightning_gtn.nn.StructuredLoss.prepare` writes)."""
    from lightning_gtn.nn import StructuredLoss

    names: list[str] = list(EARLY_RUN_FILES)
    todo = [StructuredLoss]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        names += [f for f in cls.run_files if f not in names]
    return tuple(names)


class RunLock:
    """This process's hold on a run directory: an exclusive ``flock`` on its lock file, which the
    system drops when the process ends, however it ends.

    Attributes:
        path: the lock file (its content: the owner's pid).
    """

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Removes the lock file and lets the directory go (idempotent)."""
        if self._fd is None:
            return
        try:
            if _same_file(self.path, self._fd):
                self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None


def _same_file(path: Path, fd: int) -> bool:
    try:
        a, b = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _lock_run_dir(output_dir: Path) -> RunLock:
    """Takes the directory's lock file atomically (``flock``), or raises :class:`ConfigError`."""
    import fcntl

    lock = output_dir / RUN_LOCK
    for _ in range(100):
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            try:
                owner = lock.read_text().strip()
            except OSError:
                owner = ""
            who = f"process {owner}" if owner.isdigit() else "a process that is starting"
            raise ConfigError(
                f"hydra.run.dir: {output_dir} is in use by another run ({who}, lock file {lock}); "
                "give this run its own directory"
            ) from None
        if not _same_file(lock, fd):  # the owner removed the file between our open and flock
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return RunLock(lock, fd)
    raise ConfigError(f"hydra.run.dir: cannot take the lock file {lock} (it keeps being replaced)")


def claim_run_dir(output_dir: Path, ckpt_path) -> RunLock | None:
    """Makes ``output_dir`` this run's alone, or raises :class:`ConfigError`.

    A run directory holds one run: two runs into one ``hydra.run.dir`` would mix checkpoints,
    logs and configs (an old ``best.ckpt`` beside a new ``last.ckpt``). So a directory that
    holds a run is refused, unless this run resumes a checkpoint inside it; a directory holding
    only what a run writes before its first checkpoint (:func:`early_run_files`, no ``*.ckpt``:
    a run killed that early) is taken by a fresh run. The lock file (:data:`RUN_LOCK`, held with
    ``flock`` while the run runs, so a killed run's lock is free at once) keeps a second run out.

    Returns the lock to release when the run ends (None for DDP ranks other than 0, which
    relaunch this script into the directory rank 0 claimed).
    """
    if os.environ.get("LOCAL_RANK", "0") != "0" or os.environ.get("NODE_RANK", "0") != "0":
        return None
    held = _lock_run_dir(output_dir)
    resuming = ckpt_path is not None and output_dir.resolve() in Path(str(ckpt_path)).resolve().parents
    if not resuming:
        other = sorted(
            p.name for p in output_dir.iterdir() if p.name != RUN_LOCK and not (p.is_file() and p.suffix == ".log")
        )
        ckpts = sorted([*output_dir.glob("*.ckpt"), *(output_dir / "checkpoints").glob("*.ckpt")])
        if ckpts or not set(other) <= set(early_run_files()):
            held.release()
            last = [p for p in ckpts if p.name == "last.ckpt"] or ckpts
            hint = f"resume that run with ckpt_path={last[0]}" if last else "remove what is in it"
            raise ConfigError(
                f"hydra.run.dir: {output_dir} already holds another run ({', '.join(other[:5])}"
                f"{', ...' if len(other) > 5 else ''}); a run directory holds one run: choose a new "
                f"hydra.run.dir, or {hint}"
            )
    return held


def _save_run_config(cfg: DictConfig, output_dir: Path) -> None:
    """``.hydra/config.yaml`` and ``overrides.yaml``, written once the directory is this run's
    (Hydra's own copy is turned off in ``conf/train.yaml``: it would overwrite another run's)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # run() called without Hydra (tests, Python)
        overrides = []
    d = output_dir / ".hydra"
    d.mkdir(exist_ok=True)
    (d / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (d / "overrides.yaml").write_text(OmegaConf.to_yaml(overrides))


def run(cfg: DictConfig, output_dir: str | os.PathLike | None = None) -> dict:
    """Builds everything from ``cfg``, fits, optionally tests, returns the final metrics.

    Args:
        cfg: the composed config (``conf/train.yaml``).
        output_dir: the run directory (default: Hydra's runtime output directory).
    """
    if output_dir is None:
        from hydra.core.hydra_config import HydraConfig

        output_dir = HydraConfig.get().runtime.output_dir
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    _check_keys(cfg)
    lock = claim_run_dir(output_dir, cfg.ckpt_path)
    if lock is not None:
        log.info(f"run folder: {output_dir}")
    try:
        return _run(cfg, output_dir, save_config=lock is not None)
    finally:
        if lock is not None:
            lock.release()


def _run(cfg: DictConfig, output_dir: Path, save_config: bool) -> dict:
    import lightning as L
    import torch

    from lightning_gtn import trust
    from lightning_gtn.lightning import (
        FinalLastCheckpoint,
        NonFiniteLossError,
        SequenceModule,
        SpawnedProcessGroupCleanup,
    )
    from lightning_gtn.lightning.callbacks import CheckpointStateError, ResumeInRunFolder
    from lightning_gtn.lightning.decoding import resolve_decoder

    if cfg.get("num_threads"):
        torch.set_num_threads(int(cfg.num_threads))
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)

    datamodule = build(cfg.data, "data")
    # the user's own config: its dotted paths are trusted as given
    own = [p for key in ("model", "loss", "optim") for p, _ in trust.targets_in(cfg.get(key), key)]
    with trust.trusted(list(cfg.get("trust_modules") or []), paths=own):
        prepare_loss(cfg, datamodule, output_dir)
    try:
        with trust.trusted(list(cfg.get("trust_modules") or []), paths=own):
            model = SequenceModule(
                network=cfg.model,
                loss=cfg.loss,
                chars=datamodule.chars,
                feature_dim=datamodule.feature_dim,
                optimizer=cfg.optim.optimizer,
                scheduler=cfg.optim.get("scheduler"),
                scheduler_interval=cfg.optim.get("scheduler_interval", "epoch"),
                nonfinite=cfg.get("nonfinite"),
                decoder=resolve_decoder(cfg.get("decoder"), lambda: train_texts(datamodule), output_dir),
            )
    except ValueError as e:
        raise ConfigError(str(e)) from e
    resumed_step = check_resume(cfg.ckpt_path, model) if cfg.ckpt_path is not None else None
    callbacks = [build(c, f"callbacks.{k}") for k, c in (cfg.get("callbacks") or {}).items() if c is not None]
    loggers = [build(c, f"logger.{k}") for k, c in (cfg.get("logger") or {}).items() if c is not None]
    # a checkpoint is data: what it restores into the checkpoint callbacks names only their own files
    callbacks += [ResumeInRunFolder(), FinalLastCheckpoint(), _FinalProgress(), SpawnedProcessGroupCleanup()]
    trainer = build(cfg.trainer, "trainer", callbacks=callbacks, logger=loggers or False)

    if save_config:  # everything was built: the directory now holds this run
        _save_run_config(cfg, output_dir)
    if resumed_step is not None:
        _continue_csv_logs(loggers, resumed_step)
    start = time.perf_counter()
    try:
        trainer.fit(model, datamodule=datamodule, ckpt_path=cfg.ckpt_path, weights_only=True)
    except CheckpointStateError as e:
        raise ConfigError(f"ckpt_path: cannot resume from {cfg.ckpt_path}: {e}") from None
    except NonFiniteLossError as e:
        metrics = final_metrics(trainer)
        metrics.update(
            {
                "train/loss": float("nan"),
                "epoch": e.epoch,
                "global_step": e.global_step,
                "fit_seconds": round(time.perf_counter() - start, 2),
                "error": str(e),
            }
        )
        _write_metrics(trainer, output_dir, metrics)
        raise TrainingFailed(str(e), metrics) from e
    fit_seconds = time.perf_counter() - start
    metrics = final_metrics(trainer)
    if cfg.get("test"):
        best = getattr(trainer.checkpoint_callback, "best_model_path", "") if trainer.checkpoint_callback else ""
        trainer.test(model, datamodule=datamodule, ckpt_path=best or None, weights_only=True)
        metrics.update({k: v for k, v in final_metrics(trainer).items() if k.startswith("test/")})
    metrics["epoch"] = int(metrics.get("epoch", trainer.current_epoch))
    metrics["global_step"] = int(metrics.get("global_step", trainer.global_step))
    metrics["fit_seconds"] = round(fit_seconds, 2)
    if resumed_step is not None:
        metrics = _with_earlier_metrics(metrics, output_dir)
    bad = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        metrics["error"] = f"non-finite final metrics: {', '.join(f'{k}={metrics[k]}' for k in bad)}"
    _write_metrics(trainer, output_dir, metrics)
    if bad:
        raise TrainingFailed(metrics["error"], metrics)
    return metrics


def _continue_csv_logs(loggers, step: int) -> None:
    """A run resumed into its own directory continues its ``metrics.csv`` (Lightning's CSV writer
    empties the file when it starts): the rows logged before the checkpoint's ``step`` are kept,
    those a killed run logged after it are dropped (the resumed run logs those steps again)."""
    import csv
    import warnings

    from lightning.fabric.utilities.rank_zero import rank_zero_only
    from lightning.pytorch.loggers import CSVLogger

    if rank_zero_only.rank != 0:  # type: ignore[attr-defined]  # set by Lightning at import
        return
    for lg in loggers:
        if not isinstance(lg, CSVLogger):
            continue
        path = Path(lg.log_dir) / "metrics.csv"
        if not path.is_file():
            continue
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            header = list(reader.fieldnames or [])
            rows = [r for r in reader if (s := _number(r.get("step"))) is not None and s < step]
        with warnings.catch_warnings():  # "Previous log files ... will be deleted": they are put back
            warnings.simplefilter("ignore")
            writer = lg.experiment
        with open(path, "w", newline="") as f:
            out = csv.DictWriter(f, fieldnames=header)
            out.writeheader()
            out.writerows(rows)
        writer.metrics_keys = sorted(header)


def _with_earlier_metrics(metrics: dict, output_dir: Path) -> dict:
    """``metrics`` completed by the numbers of the run directory's own ``metrics.json`` (a run
    resumed in place with no validation left keeps the final ``val/cer`` it had)."""
    try:
        old = json.loads((output_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return metrics
    if not isinstance(old, dict):
        return metrics
    kept = {
        k: v
        for k, v in old.items()
        if isinstance(k, str) and k != "error" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    out = dict(metrics)
    for k, v in kept.items():
        out.setdefault(k, v)
    return out


def _write_metrics(trainer, output_dir: Path, metrics: dict) -> None:
    if trainer.is_global_zero:
        # NaN and infinities are written as JSON NaN / Infinity / -Infinity (Python's json reads them)
        (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


def remove_empty_run_dir(output_dir) -> None:
    """Removes ``output_dir`` when it holds nothing but ``.log`` files (their lines also went to
    the console) and changed since this command started, and the folders above it (up to the
    working directory) that are then empty (``outputs/<date>/``): a command that stopped on a
    config error leaves no empty run folder."""
    d = Path(output_dir)
    try:
        if not d.is_dir() or d.stat().st_ctime < _STARTED - 1:
            return
        entries = list(d.iterdir())
        if any(not (p.is_file() and p.suffix == ".log") for p in entries):
            return
        for p in entries:
            p.unlink()
        cwd = Path.cwd().resolve()
        d.rmdir()
        d = d.parent
        while cwd in d.resolve().parents and d.stat().st_ctime >= _STARTED - 1 and not any(d.iterdir()):
            d.rmdir()
            d = d.parent
    except OSError:
        return


def cli_error(prog: str, e: BaseException, output_dir=None) -> None:
    """Prints ``<prog>: error: <message>`` (one line) and exits with status 2; with
    ``HYDRA_FULL_ERROR=1`` the exception is raised again for its traceback."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise e
    if output_dir is not None:
        remove_empty_run_dir(output_dir)
    if isinstance(e, OSError) and e.filename is not None:
        msg = f"cannot read {e.filename}: {e.strerror or e}"
    else:
        msg = " ".join(str(e).split())
    print(f"{prog}: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def default_output_dir():
    """Hydra's run directory when Hydra chose it (``outputs/<date>/<time>``, a single run without
    ``hydra.run.dir`` on the command line), else None: a directory the user named is left alone."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    if hc.mode != RunMode.RUN or any(str(o).lstrip("+~").startswith("hydra.run.dir=") for o in hc.overrides.hydra):
        return None
    return hc.runtime.output_dir


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def _hydra_main(cfg: DictConfig) -> dict:
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    use_run_log()
    failed = None
    try:
        metrics = run(cfg)
    except TrainingFailed as e:
        failed, metrics = e, e.metrics
    except (ConfigError, FileNotFoundError) as e:  # one clear line, no traceback
        cli_error("lightning-gtn-train", e, default_output_dir())
    if rank_zero_only.rank == 0:  # type: ignore[attr-defined]  # set by Lightning at import
        sys.stderr.flush()
        print(json.dumps(metrics), flush=True)
    if failed is not None:
        print(f"TrainingFailed: {failed}", file=sys.stderr, flush=True)
        sys.exit(1)
    return metrics


def main() -> None:
    """Console script entry point (``lightning-gtn-train``)."""
    _hydra_main()


if __name__ == "__main__":
    main()
