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
"""

from __future__ import annotations

import os

# numba's OpenMP threading layer kills forked DataLoader workers; workqueue is fork-safe.
os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")

import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

__all__ = ["main", "run", "build", "ConfigError", "CONF_DIR", "final_metrics"]

CONF_DIR = Path(__file__).resolve().parent / "conf"


class ConfigError(ValueError):
    """A config value that cannot be used; the message names the key."""


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
    missing = OmegaConf.missing_keys(cfg.data)
    if missing:
        raise ConfigError(f"data.{sorted(missing)[0]}: mandatory value missing (set it on the command line)")
    if cfg.ckpt_path is not None and not Path(str(cfg.ckpt_path)).is_file():
        raise ConfigError(f"ckpt_path: no such checkpoint file: {cfg.ckpt_path}")


def _number(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def final_metrics(trainer) -> dict:
    """The final metrics from ``trainer.callback_metrics`` (epoch values, plain floats)."""
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


def run(cfg: DictConfig, output_dir: str | os.PathLike | None = None) -> dict:
    """Builds everything from ``cfg``, fits, optionally tests, returns the final metrics.

    Args:
        cfg: the composed config (``conf/train.yaml``).
        output_dir: the run directory (default: Hydra's runtime output directory).
    """
    import lightning as L
    import torch

    from lightning_gtn.lightning import SequenceModule, SpawnedProcessGroupCleanup

    if output_dir is None:
        from hydra.core.hydra_config import HydraConfig

        output_dir = HydraConfig.get().runtime.output_dir
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    _check_keys(cfg)
    if cfg.get("num_threads"):
        torch.set_num_threads(int(cfg.num_threads))
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)

    datamodule = build(cfg.data, "data")
    try:
        model = SequenceModule(
            network=cfg.model,
            loss=cfg.loss,
            chars=datamodule.chars,
            feature_dim=datamodule.feature_dim,
            optimizer=cfg.optim.optimizer,
            scheduler=cfg.optim.get("scheduler"),
            scheduler_interval=cfg.optim.get("scheduler_interval", "epoch"),
        )
    except ValueError as e:
        raise ConfigError(str(e)) from e
    callbacks = [build(c, f"callbacks.{k}") for k, c in (cfg.get("callbacks") or {}).items() if c is not None]
    loggers = [build(c, f"logger.{k}") for k, c in (cfg.get("logger") or {}).items() if c is not None]
    callbacks += [_FinalProgress(), SpawnedProcessGroupCleanup()]
    trainer = build(cfg.trainer, "trainer", callbacks=callbacks, logger=loggers or False)

    start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule, ckpt_path=cfg.ckpt_path)
    fit_seconds = time.perf_counter() - start
    metrics = final_metrics(trainer)
    if cfg.get("test"):
        best = getattr(trainer.checkpoint_callback, "best_model_path", "") if trainer.checkpoint_callback else ""
        trainer.test(model, datamodule=datamodule, ckpt_path=best or None)
        metrics.update({k: v for k, v in final_metrics(trainer).items() if k.startswith("test/")})
    metrics["epoch"] = int(metrics.get("epoch", trainer.current_epoch))
    metrics["global_step"] = int(metrics.get("global_step", trainer.global_step))
    metrics["fit_seconds"] = round(fit_seconds, 2)
    if trainer.is_global_zero:
        (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def _hydra_main(cfg: DictConfig) -> dict:
    metrics = run(cfg)
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    if rank_zero_only.rank == 0:
        sys.stderr.flush()
        print(json.dumps(metrics), flush=True)
    return metrics


def main() -> None:
    """Console script entry point (``lightning-gtn-train``)."""
    _hydra_main()


if __name__ == "__main__":
    main()
