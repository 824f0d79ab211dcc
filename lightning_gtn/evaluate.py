"""``lightning-gtn-eval``: loads a checkpoint, prints CER/WER and decoded samples.

Uses ``conf/eval.yaml`` (the training config plus ``ckpt_path``, ``split`` and ``num_samples``),
so data and trainer overrides work as in training::

    lightning-gtn-eval ckpt_path=outputs/2024-01-01/12-00-00/checkpoints/best.ckpt
    lightning-gtn-eval ckpt_path=... split=test trainer=ddp_cpu

The last line printed is one JSON object: ``{"val/cer": ..., "val/wer": ..., "val/loss": ...}``
(``test/...`` with ``split=test``); a non-finite metric is written as ``NaN``/``Infinity`` and makes
the exit status 1.

``output_ctm=PATH`` / ``output_json=PATH`` write every utterance of the split decoded with token
and word times and confidences (:func:`lightning_gtn.align.forced.to_ctm` / ``to_json``; times are
``frame_shift`` seconds per decoded frame), by whichever decoder is configured; only that file is
written, and a path that is a folder, or in no existing folder, is refused before anything runs.

The checkpoint defines the model: its network, loss and vocabulary are used, and command-line
overrides of ``model``, ``loss`` or ``optim`` are refused (an error says so) rather than silently
ignored. The checkpoint is data: its configs may only name registered types of
:mod:`lightning_gtn.trust` with plain-data arguments (``trust_modules=[mypkg]`` on the command
line opts whole modules in), and it carries its word pieces, transitions graph and decoder
lexicon and LM, so it loads from any directory. ``decoder=...`` on the command line replaces the
checkpoint's decoder (files it names are read: you typed them; a ``train`` lexicon or LM is the
one the checkpoint carries, never estimated from the data being evaluated). A missing, truncated or foreign
file, or a refused checkpoint, prints one ``lightning-gtn-eval: error: ...`` line naming the file
and exits with status 2.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")

import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from lightning_gtn.train import CONF_DIR, ConfigError, build  # noqa: E402

__all__ = [
    "main",
    "evaluate",
    "load_model",
    "read_checkpoint",
    "build_datamodule",
    "decode_samples",
    "write_timed",
    "check_overrides",
    "MODEL_GROUPS",
]

#: Config groups that the checkpoint defines; overriding them for evaluation is an error.
MODEL_GROUPS = ("model", "loss", "optim")


def check_overrides(overrides) -> None:
    """Refuses command-line overrides of the groups the checkpoint defines (:data:`MODEL_GROUPS`).

    Raises:
        ConfigError: an override names ``model``, ``loss`` or ``optim``.
    """
    for o in overrides or ():
        key = str(o).lstrip("~+").split("=", 1)[0].split("@", 1)[0]
        if key.split(".", 1)[0].split("/", 1)[0] in MODEL_GROUPS:
            raise ConfigError(
                f"{key}: lightning-gtn-eval uses the network, loss and vocabulary stored in the "
                f"checkpoint; remove the override {o!r} (to evaluate another model or loss, train it)"
            )


def decode_samples(model, dataloader, num: int) -> list[tuple[str, str]]:
    """``(reference, hypothesis)`` for the first ``num`` examples of ``dataloader``."""
    import torch

    out: list[tuple[str, str]] = []
    model.eval()
    with torch.no_grad():
        for batch in dataloader:
            inputs = batch["inputs"].to(model.device)
            lengths = batch["input_lengths"].to(model.device)
            emissions, out_lengths = model.outputs(inputs, lengths)  # encoder frames for RNN-T losses
            out += list(zip(batch["texts"], model.decode(emissions, out_lengths)))
            if len(out) >= num:
                break
    return out[:num]


#: the eval config keys naming the files of timed hypotheses, and their writer's format
TIMED_OUTPUTS = ("output_ctm", "output_json")


def _output_path(cfg: DictConfig, key: str) -> Path | None:
    """The file ``cfg.<key>`` names (the user's, from the command line or the eval config), or
    None; refused when it is a folder or its folder does not exist."""
    v = cfg.get(key)
    if v is None or v == "":
        return None
    if not isinstance(v, str):
        raise ConfigError(f"{key}: expected a file path, got {v!r}")
    path = Path(v).expanduser()
    if path.is_dir() or v.endswith(("/", "\\")):
        raise ConfigError(f"{key}: {path} is a folder; name the file to write")
    if not path.parent.is_dir():
        raise ConfigError(f"{key}: {path.parent} is not an existing folder (it is not created)")
    return path


def _frame_shift(cfg: DictConfig) -> float:
    fs = cfg.get("frame_shift", 0.01)
    if isinstance(fs, bool) or not isinstance(fs, (int, float)) or not (math.isfinite(fs) and fs > 0):
        raise ConfigError(f"frame_shift: expected a positive number of seconds per decoded frame, got {fs!r}")
    return float(fs)


def write_timed(model, dataloader, *, ctm: Path | None = None, json_path: Path | None = None, **kwargs) -> int:
    """Decodes every example of ``dataloader`` with ``model``'s decoder as timed hypotheses
    (:meth:`~lightning_gtn.lightning.mixin.StructuredLossMixin.decode_hypotheses`) and writes them
    to ``ctm`` (one line per word) and ``json_path`` (one record per utterance, its reference
    text under ``"reference"``); returns the number of utterances.

    Args:
        kwargs: ``frame_shift`` and ``prefix`` (utterance ids ``<prefix><index>`` when a batch
            has no ``"ids"``).
    """
    import torch

    from lightning_gtn.align.forced import to_ctm, to_records

    fs, prefix = float(kwargs.get("frame_shift", 0.01)), str(kwargs.get("prefix", "utt"))
    lines: list[str] = []
    records: list[dict] = []
    n = 0
    model.eval()
    with torch.no_grad():
        for batch in dataloader:
            inputs = batch["inputs"].to(model.device)
            lengths = batch["input_lengths"].to(model.device)
            outputs, out_lengths = model.outputs(inputs, lengths)
            hyps, texts = model.decode_hypotheses(outputs, out_lengths)
            ids = batch.get("ids") or [f"{prefix}{n + i}" for i in range(len(hyps))]
            args = dict(frame_shift=fs, tokens=texts, utterance_ids=[str(u) for u in ids])
            if ctm is not None:
                lines.append(to_ctm(hyps, **args))
            if json_path is not None:
                recs = to_records(hyps, **args)
                for r, ref in zip(recs, batch["texts"]):
                    r["reference"] = ref
                records += recs
            n += len(hyps)
    if ctm is not None:
        ctm.write_text("".join(lines), encoding="utf-8")
    if json_path is not None:
        json_path.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    return n


def read_checkpoint(ckpt_path) -> dict:
    """The checkpoint at ``ckpt_path`` as plain data (``torch.load`` with ``weights_only=True``),
    with a clear :class:`ConfigError` naming the file when it is missing, truncated, not a
    checkpoint, or not one of :class:`~lightning_gtn.lightning.SequenceModule`."""
    import torch

    ckpt = Path(str(ckpt_path))
    if not ckpt.is_file():
        raise ConfigError(f"ckpt_path: no such checkpoint file: {ckpt}")
    try:
        data = torch.load(str(ckpt), map_location="cpu", weights_only=True)
    except Exception as e:  # zip/pickle errors of a truncated or foreign file
        msg = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        raise ConfigError(
            f"ckpt_path: {ckpt} is not a readable checkpoint (truncated, or not written by "
            f"lightning-gtn-train): {msg}"
        ) from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("state_dict"), dict)
        or not isinstance(data.get("hyper_parameters"), dict)
    ):
        raise ConfigError(
            f"ckpt_path: {ckpt} is not a lightning-gtn-train checkpoint (it needs 'state_dict' and "
            "'hyper_parameters')"
        )
    return data


_CHECKPOINT = object()


def load_model(ckpt_path, trust_modules=None, *, decoder=_CHECKPOINT):
    """The :class:`~lightning_gtn.lightning.SequenceModule` of a checkpoint, on the CPU.

    The checkpoint is data: its hyper-parameters may only name registered types of
    :mod:`lightning_gtn.trust` with plain-data arguments (checked before anything is built);
    ``trust_modules`` (from the command line only) opts whole modules in. Word pieces,
    transitions graphs and a decoder's lexicon and LM travel inside it, so it loads from any
    directory; a file path in it is never read.

    Args:
        ckpt_path: the checkpoint file.
        trust_modules: module prefixes the user opts in (see :mod:`lightning_gtn.trust`).
        decoder: a decoder config replacing the checkpoint's (``None``: greedy), e.g. when the
            command line names another one; by default the checkpoint's.

    Raises:
        ConfigError: no such file, not a readable checkpoint, it names something that is not a
            registered type, or its model cannot be built from it.
    """
    from lightning_gtn import trust
    from lightning_gtn.lightning import SequenceModule
    from lightning_gtn.lightning.module import check_hyperparameters

    ckpt = Path(str(ckpt_path))
    data = read_checkpoint(ckpt)
    try:
        with trust.trusted(list(trust_modules or [])):
            check_hyperparameters(data["hyper_parameters"])  # refused before anything is built
            # (Lightning reads the file again with weights_only=True; SequenceModule checks again)
            extra = {} if decoder is _CHECKPOINT else {"decoder": decoder}
            return SequenceModule.load_from_checkpoint(str(ckpt), map_location="cpu", **extra)
    except trust.UntrustedTargetError as e:
        raise ConfigError(f"ckpt_path: {ckpt} names something that is not a registered type: {e}") from None
    except (ValueError, TypeError, RuntimeError, KeyError) as e:
        msg = " ".join(f"{type(e).__name__}: {e}".split())[:1000]
        raise ConfigError(f"ckpt_path: cannot build the model of {ckpt}: {msg}") from None


def build_datamodule(data_cfg: DictConfig, model):
    """The data module of ``data_cfg``, checked to give ``model`` what it was trained on: its
    characters, its features per frame and, when the checkpoint carries feature settings (speech:
    filterbank sizes, frame stacking, normalisation), those settings, whose normalisation the
    data module then applies.

    Raises:
        ConfigError: naming the data key that differs from the checkpoint's.
    """
    datamodule = build(data_cfg, "data")
    if datamodule.chars != model.hparams.chars:
        raise ConfigError(f"data: characters {datamodule.chars!r} differ from the checkpoint's {model.hparams.chars!r}")
    settings = getattr(model, "feature_settings", None)
    apply = getattr(datamodule, "apply_feature_settings", None)
    if settings is not None:
        if apply is None:
            raise ConfigError(
                f"data: the checkpoint's model was trained on speech features ({settings.get('features')}, "
                f"{settings.get('feature_dim')} per frame); {type(datamodule).__name__} gives other inputs"
            )
        try:
            apply(settings)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    dim, want = getattr(datamodule, "feature_dim", None), model.hparams.get("feature_dim")
    if isinstance(dim, int) and isinstance(want, int) and dim != want:
        raise ConfigError(f"data: {dim} features per frame, but the checkpoint's model reads {want}")
    return datamodule


def _trained_artefacts(own: dict, saved: Callable[[], Any]) -> dict:
    """``own`` (a decoder config from the command line) with each ``train`` lexicon / LM taken
    from the checkpoint's decoder config ``saved()`` (the ones estimated on the training
    transcripts when it was trained; checked as data when the decoder is built). Evaluation never
    estimates them: the data config's ``train`` split may hold the very transcripts being scored.

    Raises:
        ConfigError: naming ``decoder.lexicon`` / ``decoder.lm`` when the checkpoint has no such
            artefact of this decoder.
    """
    name = own.get("name", "greedy")
    keys = ("lexicon", "lm") if name == "beam_lm" else ("lm",) if name == "rnnt_beam" else ()
    out = dict(own)
    for key in keys:
        if out.get(key, "train" if name == "beam_lm" else None) != "train":
            continue
        ckpt = saved()
        given = ckpt.get(key) if isinstance(ckpt, dict) and ckpt.get("name") == name else None
        if not isinstance(given, dict):
            raise ConfigError(
                f"decoder.{key}=train: evaluation does not estimate a {key} from the data it scores, and the "
                f"checkpoint carries no {name} {key} of its training; name a file (decoder.{key}=/path/"
                f"{'lexicon.txt' if key == 'lexicon' else 'lm.arpa'}, e.g. the one its training run wrote)"
            )
        out[key] = given
    return out


def _no_texts() -> list:
    raise ConfigError("decoder: evaluation does not read training transcripts")  # guarded by _trained_artefacts


def _set_decoder(cfg: DictConfig, model, datamodule) -> None:
    """The command line's ``decoder`` replaces the checkpoint's. A ``train`` lexicon / LM is the
    checkpoint's own (estimated on its training transcripts when it was trained): evaluation
    never estimates one from its data, whose ``train`` split may be the transcripts it scores.
    Files named on the command line are read: the user typed them."""
    from omegaconf import OmegaConf

    from lightning_gtn.lightning.decoding import resolve_decoder

    own = OmegaConf.to_container(cfg.decoder, resolve=True) if isinstance(cfg.decoder, DictConfig) else cfg.decoder
    if isinstance(own, dict):
        # the checkpoint's own decoder config (the model was loaded without it)
        own = _trained_artefacts(own, lambda: read_checkpoint(cfg.ckpt_path)["hyper_parameters"].get("decoder"))
    out = Path(cfg.get("output_dir") or ".")
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            out = Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # pragma: no cover - hydra internals
        pass
    try:
        model.configure_decoder(resolve_decoder(own, _no_texts, out))
    except ValueError as e:
        raise ConfigError(str(e)) from e


def evaluate(cfg: DictConfig, overrides=None) -> dict:
    """Validates or tests ``cfg.ckpt_path`` on ``cfg.split``; returns the metrics.

    Args:
        cfg: the composed ``conf/eval.yaml``.
        overrides: the command-line overrides (default: Hydra's, when it runs); overrides of
            ``model``, ``loss`` or ``optim`` raise :class:`ConfigError`.
    """
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from lightning_gtn.lightning import SpawnedProcessGroupCleanup

    if overrides is None:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            overrides = list(HydraConfig.get().overrides.task)
    check_overrides(overrides)
    if OmegaConf.is_missing(cfg, "ckpt_path") or cfg.get("ckpt_path") is None:
        raise ConfigError(
            "ckpt_path: missing; name the checkpoint to evaluate, e.g. "
            "ckpt_path=outputs/<date>/<time>/checkpoints/best.ckpt (see lightning-gtn-eval --help)"
        )
    if cfg.split not in ("val", "test"):
        raise ConfigError(f"split: must be 'val' or 'test', got {cfg.split!r}")
    outs = {key: _output_path(cfg, key) for key in TIMED_OUTPUTS}
    if outs["output_ctm"] is not None and outs["output_ctm"] == outs["output_json"]:
        raise ConfigError(f"output_json: the same file as output_ctm ({outs['output_ctm']})")
    frame_shift = _frame_shift(cfg)
    own_decoder = any(str(o).lstrip("~+").startswith("decoder") for o in overrides or ())
    # with a decoder on the command line the checkpoint's is not built (an older checkpoint's may
    # name files, which are not read)
    model = load_model(cfg.ckpt_path, cfg.get("trust_modules"), **({"decoder": None} if own_decoder else {}))
    datamodule = build_datamodule(cfg.data, model)
    if own_decoder:
        _set_decoder(cfg, model, datamodule)
    trainer = build(
        cfg.trainer, "trainer", callbacks=[SpawnedProcessGroupCleanup()], logger=False, enable_checkpointing=False
    )
    run = trainer.validate if cfg.split == "val" else trainer.test
    results = run(model, datamodule=datamodule, verbose=False)
    metrics = {k: float(v) for k, v in sorted(results[0].items())}
    rank0 = rank_zero_only.rank == 0  # type: ignore[attr-defined]  # rank: set by Lightning
    if rank0 and any(p is not None for p in outs.values()):
        datamodule.setup("validate" if cfg.split == "val" else "test")
        loader = datamodule.val_dataloader() if cfg.split == "val" else datamodule.test_dataloader()
        try:
            write_timed(
                model,
                loader,
                ctm=outs["output_ctm"],
                json_path=outs["output_json"],
                frame_shift=frame_shift,
                prefix=f"{cfg.split}",
            )
        except (ValueError, OSError) as e:
            raise ConfigError(f"output_ctm/output_json: {e}") from None
    if rank0 and cfg.num_samples > 0:
        datamodule.setup("validate" if cfg.split == "val" else "test")
        loader = datamodule.val_dataloader() if cfg.split == "val" else datamodule.test_dataloader()
        print(f"decoded {cfg.split} samples (reference -> hypothesis):")
        for ref, hyp in decode_samples(model, loader, int(cfg.num_samples)):
            mark = "  " if ref == hyp else "x "
            print(f"{mark}{ref!r:>14} -> {hyp!r}")
        print(" ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    return metrics


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="eval")
def _hydra_main(cfg: DictConfig) -> dict:
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from lightning_gtn.train import cli_error, default_output_dir, use_run_log

    use_run_log()
    try:
        metrics = evaluate(cfg)
    except (ConfigError, FileNotFoundError) as e:  # a clear message, no traceback
        cli_error("lightning-gtn-eval", e, default_output_dir())
    if rank_zero_only.rank == 0:  # type: ignore[attr-defined]  # set by Lightning at import
        print(json.dumps(metrics), flush=True)  # NaN / Infinity as JSON NaN / Infinity
    bad = [k for k, v in metrics.items() if not math.isfinite(v)]
    if bad:
        print(f"non-finite metrics: {', '.join(bad)}", file=sys.stderr, flush=True)
        sys.exit(1)
    return metrics


def help_text() -> str:
    """The ``lightning-gtn-eval --help`` page: what the command accepts (the config groups it
    refuses, model, loss and optim, are the checkpoint's)."""

    def options(group: str) -> str:
        return ", ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))

    return f"""lightning-gtn-eval: evaluates a checkpoint written by lightning-gtn-train and prints CER/WER,
decoded samples and, last, one JSON line of the metrics.

usage: lightning-gtn-eval ckpt_path=<file> [key=value ...]

  ckpt_path=<file>        the checkpoint (required), e.g. outputs/<date>/<time>/checkpoints/best.ckpt
  split=val|test          the split to score (default: val)
  num_samples=<n>         decoded examples to print (default: 8)
  data=<name>             the data to score ({options("data")});
                          data.<key>=<value> sets one of its keys
  trainer=<name>          where to run ({options("trainer")}); trainer.<key>=<value>
  decoder=<name>          replaces the checkpoint's decoder ({options("decoder")})
  output_ctm=<file>       writes the split's decoded words with times and confidences as CTM
  output_json=<file>      ... and the tokens and words of each utterance as JSON
  frame_shift=<seconds>   seconds per decoded frame in those files (default: 0.01)
  trust_modules=[mypkg]   modules whose classes the checkpoint may name, beyond the registered types
  hydra.run.dir=<dir>     the evaluation's folder (default: outputs/eval/<date>/<time>)

The network, loss and vocabulary come from the checkpoint: overrides of model, loss or optim are
refused. Errors print one line 'lightning-gtn-eval: error: ...' and exit with status 2
(HYDRA_FULL_ERROR=1 shows the traceback). Hydra's own options: --hydra-help, --cfg job, -m.
"""


def main() -> None:
    """Console script entry point (``lightning-gtn-eval``)."""
    if any(a in ("--help", "-h") for a in sys.argv[1:]):
        print(help_text(), end="")
        sys.exit(0)
    _hydra_main()


if __name__ == "__main__":
    main()
