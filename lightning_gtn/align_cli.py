"""``lightning-gtn-align``: forced alignment of a trained model's data, or of saved emissions.

Two sources::

    # a checkpoint of lightning-gtn-train on its validation or test split (Hydra overrides of
    # the data and trainer groups after the options, as for lightning-gtn-eval)
    lightning-gtn-align --checkpoint outputs/.../checkpoints/best.ckpt --split val \\
        --out val_align.json --plot-dir plots data=digits_small

    # saved emissions (B, T, C): a tensor, or a dict {"emissions": ..., "input_lengths": ...},
    # read with torch.load(weights_only=True); one line of integer token ids per example
    lightning-gtn-align --emissions em.pt --targets targets.txt --blank 0 --format ctm --out a.ctm

Emissions go through ``log_softmax`` first (the best path does not change: every frame
emits exactly one label, so a per-frame constant moves every path's score alike; the
confidences become posterior probabilities). JSON (default) is a list with one record per
utterance (see :func:`lightning_gtn.functional.to_records`); CTM has one line per word. With a
checkpoint the loss's convention (blank or not, ASG transitions) and the vocabulary come from
the checkpoint, which is loaded as data (registered types only, :mod:`lightning_gtn.trust`)
(``trust_modules=[mypkg]`` among the overrides opts in to more, spelled as for
lightning-gtn-train and lightning-gtn-eval; the older ``--trust-module mypkg`` is still
accepted). A checkpoint of a loss that scores a network's outputs (one that declares
``network_methods``: ``loss=rnnt``, ``pruned_rnnt``) is aligned through its network's ``(T, U + 1)``
lattice
(:func:`lightning_gtn.functional.rnnt_align`): each token's emission frame (its span is that one
frame) and the posterior probability of that emission; frames are the encoder's; plots draw the
lattice and the path (:func:`lightning_gtn.align.rnnt_plot.plot_rnnt_alignment`).

Times: ``--frame-shift`` seconds per emission frame; by default, with a checkpoint of speech data,
the data's frame shift (its feature settings) times the model's stride (:func:`output_stride`),
else 0.01. Utterances are named by their cut ids (``batch["ids"]``) where the data has them.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

__all__ = ["main", "parse_args", "read_targets", "load_emissions"]

#: lines and tokens a targets file may hold (a bound on what a bad file can allocate)
MAX_TARGET_LINES = 1_000_000
MAX_TARGET_TOKENS = 100_000
#: blank lines a targets file may hold after its B lines (the rest of a file is not read)
MAX_TRAILING_BLANK_LINES = 1000
#: values ``B * T * C`` an emissions file may hold (4 GiB of float32)
MAX_EMISSION_VALUES = 1 << 30
_ID_RE = re.compile(r"[+-]?[0-9]{1,10}", re.ASCII)


class AlignError(Exception):
    """A bad argument or input file (printed without a traceback, exit status 2)."""


def parse_args(argv=None) -> argparse.Namespace:
    """The command line of ``lightning-gtn-align`` (``argv`` None: ``sys.argv[1:]``) as a namespace."""
    p = argparse.ArgumentParser(
        prog="lightning-gtn-align",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a checkpoint written by lightning-gtn-train")
    src.add_argument("--emissions", help="a .pt file: a (B, T, C) tensor or {'emissions', 'input_lengths'}")
    p.add_argument("--split", default="val", choices=["val", "test"], help="with --checkpoint (default: val)")
    p.add_argument("--targets", help="with --emissions: one line of integer token ids per example")
    p.add_argument("--blank", default="0", help="with --emissions: the blank id, or 'none' (default: 0)")
    p.add_argument(
        "--tokens",
        default=None,
        help="with --emissions: the text of each token id as one string (character i for id i)",
    )
    p.add_argument(
        "--word-separator-id",
        type=int,
        default=None,
        help="token id between words (default: the space of a checkpoint's vocabulary)",
    )
    p.add_argument("--star", type=float, default=None, help="allow a star with this log-penalty per frame")
    p.add_argument(
        "--frame-shift",
        type=float,
        default=None,
        help="seconds per emission frame (default: with --checkpoint, the data's frame shift times the "
        "model's stride, found from its output lengths; otherwise 0.01)",
    )
    p.add_argument("--format", default="json", choices=["json", "ctm"])
    p.add_argument("--out", default="-", help="output file (default: standard output)")
    p.add_argument("--plot-dir", default=None, help="write PNGs of the first --num-plots alignments here")
    p.add_argument("--num-plots", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32, help="with --emissions: examples per batch")
    # the older spelling of the override trust_modules=[mypkg] (one spelling across the CLIs)
    p.add_argument("--trust-module", action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "overrides",
        nargs="*",
        help="with --checkpoint: Hydra overrides of the data config, and trust_modules=[mypkg] (modules "
        "whose classes the checkpoint may name)",
    )
    a = p.parse_args(argv)
    if a.emissions is not None and a.targets is None:
        p.error("--emissions needs --targets")
    if a.checkpoint is not None and a.targets is not None:
        p.error("--targets goes with --emissions; a checkpoint's data brings its own transcripts")
    if a.emissions is not None and a.overrides:
        p.error(f"overrides {a.overrides} go with --checkpoint")
    if a.frame_shift is not None and not (0 < a.frame_shift < float("inf")):
        p.error(f"--frame-shift must be positive, got {a.frame_shift}")
    if a.num_plots < 0 or a.batch_size < 1:
        p.error("--num-plots must be >= 0 and --batch-size >= 1")
    return a


def load_emissions(path):
    """``(emissions (B, T, C) float, input_lengths (B,) int64)`` from a file of
    ``torch.save``: a tensor, or a dict with ``"emissions"`` and optional ``"input_lengths"``.

    Only dense CPU tensors whose elements each have their own storage are read (a 1 KB file of an
    expanded view would otherwise stand for gigabytes), at most :data:`MAX_EMISSION_VALUES`
    values ``B * T * C``; the lengths are integers (not bools) in ``[0, T]``; and every frame
    within its length holds finite scores, at least one of them above ``-inf``.
    """
    import torch

    from lightning_gtn.core import checks

    f = Path(path)
    if not f.is_file():
        raise AlignError(f"--emissions: no such file: {f}")
    try:
        obj = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise AlignError(f"--emissions: cannot read {f} as a tensor file ({type(e).__name__}: {e})") from None
    lengths = None
    if isinstance(obj, dict):
        if "emissions" not in obj:
            keys = sorted(repr(k) for k in obj)  # keys of any types (mixed types do not sort)
            shown = ", ".join(keys[:20]) + (", ..." if len(keys) > 20 else "")
            raise AlignError(f"--emissions: {f} holds a dict without an 'emissions' key (keys: {shown})")
        obj, lengths = obj["emissions"], obj.get("input_lengths")
    _check_stored(obj, f, "emissions")
    if obj.dim() != 3 or not obj.is_floating_point():
        got = f"shape {tuple(obj.shape)} {obj.dtype}"
        raise AlignError(f"--emissions: expected a float tensor of shape (B, T, C), got {got}")
    B, T, C = obj.shape
    if B * T * C > MAX_EMISSION_VALUES:
        raise AlignError(
            f"--emissions: {f} holds B * T * C = {B} * {T} * {C} = {B * T * C:,} values, over the limit of "
            f"{MAX_EMISSION_VALUES:,} (lightning_gtn.align_cli.MAX_EMISSION_VALUES)"
        )
    if lengths is None:
        lengths = torch.full((B,), T, dtype=torch.int64)
    else:
        _check_stored(lengths, f, "input_lengths")
        if lengths.shape != (B,) or lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
            raise AlignError(
                f"--emissions: input_lengths must be an integer tensor of shape (B,) = ({B},), "
                f"got shape {tuple(lengths.shape)} {lengths.dtype}"
            )
        lengths = lengths.long()
        if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > T):
            raise AlignError(f"--emissions: input_lengths must lie in [0, T={T}]")
    try:
        checks.check_emission_values(obj, "--emissions", lengths, checks.compute_dtype(obj))
    except ValueError as e:
        raise AlignError(str(e)) from None
    return obj, lengths


def _check_stored(obj, f: Path, what: str) -> None:
    """AlignError unless ``obj`` is a dense CPU tensor whose elements all lie in its own storage."""
    import torch

    if not isinstance(obj, torch.Tensor):
        raise AlignError(f"--emissions: {what} in {f} must be a tensor, got {type(obj).__name__}")
    if obj.layout != torch.strided or obj.is_quantized:
        raise AlignError(f"--emissions: {what} in {f} must be a dense tensor, got layout {obj.layout}")
    if obj.device.type != "cpu":
        raise AlignError(f"--emissions: {what} in {f} must hold its values on the CPU, got device {obj.device}")
    need = obj.numel() * obj.element_size()
    have = obj.untyped_storage().nbytes() - obj.storage_offset() * obj.element_size()
    if need > have:
        raise AlignError(
            f"--emissions: {what} in {f} of shape {tuple(obj.shape)} has {obj.numel():,} elements but stores "
            f"{max(have, 0):,} bytes (an expanded or overlapping view); save a contiguous tensor"
        )


def read_targets(path, B: int):
    """B lists of token ids, one line each (integers separated by white space)."""
    f = Path(path)
    if not f.is_file():
        raise AlignError(f"--targets: no such file: {f}")
    try:
        return _read_target_lines(f, B)
    except UnicodeDecodeError as e:
        raise AlignError(
            f"--targets: {f} is not UTF-8 text (byte {e.start}: {e.reason}); "
            f"expected one line of integer token ids per example"
        ) from None


def _read_target_lines(f: Path, B: int):
    if B > MAX_TARGET_LINES:
        raise AlignError(f"--targets: the emissions have B={B} examples, more than the {MAX_TARGET_LINES} lines read")
    out = []
    # a line holds at most MAX_TARGET_TOKENS ids of at most 10 digits and their separators
    max_line = MAX_TARGET_TOKENS * 12 + 2
    with open(f, "rb") as fh:
        for i in itertools.count(1):
            raw = fh.readline(max_line + 1)
            if not raw:
                break
            if len(raw) > max_line:
                raise AlignError(f"--targets: line {i} is longer than {max_line} bytes")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise AlignError(
                    f"--targets: line {i} is not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r})"
                ) from None
            if i > B:
                if line.strip():
                    raise AlignError(f"--targets: more lines than the {B} examples of the emissions")
                if i - B > MAX_TRAILING_BLANK_LINES:
                    raise AlignError(
                        f"--targets: more than {MAX_TRAILING_BLANK_LINES} blank lines after the {B} lines "
                        "of the examples"
                    )
                continue
            parts = line.split()
            if len(parts) > MAX_TARGET_TOKENS:
                raise AlignError(f"--targets: line {i} has more than {MAX_TARGET_TOKENS} tokens")
            if not all(_ID_RE.fullmatch(v) for v in parts):
                bad = line.strip()[:60]
                raise AlignError(f"--targets: line {i} must hold integer token ids (ASCII digits), got {bad!r}")
            out.append([int(v) for v in parts])
    if len(out) != B:
        raise AlignError(f"--targets: {len(out)} lines for {B} examples of the emissions")
    return out


def _vocab_tokens(vocab) -> list:
    C = vocab.num_classes
    off = 1 if vocab.blank else 0
    toks: list[str | None] = [None] * C
    if vocab.blank:
        toks[0] = "<blank>"
    for i, c in enumerate(vocab.chars):
        toks[i + off] = c
    if vocab.repeat_id is not None:
        toks[vocab.repeat_id] = "<rep>"
    return toks


#: seconds per emission frame when neither --frame-shift nor the data says (image frames, emissions)
DEFAULT_FRAME_SHIFT = 0.01
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


def _file_name(name: str) -> str:
    """An utterance id as a plot's file name inside --plot-dir (a cut id may hold ``/`` or ``..``)."""
    safe = _UNSAFE.sub("_", name)[:200]
    return "_" + safe if safe.startswith(".") or not safe else safe


def output_stride(input_lengths, output_lengths, known: int | None = None) -> int:
    """The model's stride: the integer ``s`` with ``ceil(T / s)`` output frames for every input of
    ``T`` frames (the smallest such; ``known``: checked instead of searched).

    Raises:
        AlignError: no integer stride fits (give ``--frame-shift``).
    """
    pairs = [(int(i), int(o)) for i, o in zip(input_lengths.tolist(), output_lengths.tolist())]
    fits = lambda s: all((i + s - 1) // s == o for i, o in pairs if i > 0)  # noqa: E731
    if known is not None and fits(known):
        return known
    top = max([i for i, _ in pairs] + [1])
    for s in range(1, top + 1) if known is None else ():
        if fits(s):
            return s
    raise AlignError(
        "cannot tell the model's stride from its output lengths "
        f"({pairs[:3]} (input, output) frames{'' if known is None else f', first batch: {known}'}); "
        "give --frame-shift"
    )


class _Writer:
    """Collects records (JSON) or CTM lines, plots the first few alignments. ``frame_shift``:
    seconds per emission frame (``--frame-shift``, else set by the caller, else the default)."""

    def __init__(self, a, tokens, word_sep, blank, frame_transitions=None):
        self.a, self.tokens, self.word_sep, self.blank = a, tokens, word_sep, blank
        # forced_align's keyword: the loss's frame-label transition scores (its protocol's frame_transitions)
        self.frame_options = {} if frame_transitions is None else {"transitions": frame_transitions}
        self.frame_shift = a.frame_shift if a.frame_shift is not None else DEFAULT_FRAME_SHIFT
        self.records, self.lines, self.plots, self.count = [], [], 0, 0
        self.on_frames = None  # hook(n) told of the frames aligned while forced_align runs
        if a.plot_dir:
            Path(a.plot_dir).mkdir(parents=True, exist_ok=True)

    def add(self, x, targets, lengths, names):
        import torch

        from lightning_gtn.align.forced import alignment_progress
        from lightning_gtn.functional import forced_align, plot_alignment, to_ctm, to_records

        x = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32).log_softmax(-1)
        hook = self.on_frames
        with contextlib.nullcontext() if hook is None else alignment_progress(hook):
            al = forced_align(x, targets, lengths, blank=self.blank, star=self.a.star, **self.frame_options)
        kw = dict(
            frame_shift=self.frame_shift, tokens=self.tokens, utterance_ids=names, word_separator_id=self.word_sep
        )
        if self.a.format == "json":
            self.records += to_records(al, targets, **kw)
        else:
            self.lines.append(to_ctm(al, targets, **kw))
        for b in range(len(names)):
            if self.plots >= self.a.num_plots or not self.a.plot_dir:
                break
            path = Path(self.a.plot_dir) / f"{_file_name(names[b])}.png"
            plot_alignment(x, al, b, tokens=self.tokens, path=path)
            self.plots += 1
        self.count += len(names)

    def add_alignment(self, al, targets, names):
        """Records of an alignment computed elsewhere (RNN-T), without plots."""
        from lightning_gtn.functional import to_ctm, to_records

        kw = dict(
            frame_shift=self.frame_shift, tokens=self.tokens, utterance_ids=names, word_separator_id=self.word_sep
        )
        if self.a.format == "json":
            self.records += to_records(al, targets, **kw)
        else:
            self.lines.append(to_ctm(al, targets, **kw))
        self.count += len(names)

    def write(self):
        text = json.dumps(self.records, indent=1) + "\n" if self.a.format == "json" else "".join(self.lines)
        if self.a.out == "-":
            sys.stdout.write(text)
        else:
            Path(self.a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(self.a.out).write_text(text, encoding="utf-8")


def _progress(it, a, total=None):
    from tqdm import tqdm

    return tqdm(it, total=total, disable=a.no_progress, desc="aligning", unit="batch", file=sys.stderr)


def _frame_progress(a, total: int):
    """A bar of the frames aligned (it moves inside a long recording's search too)."""
    from tqdm import tqdm

    return tqdm(total=total, disable=a.no_progress, desc="aligning", unit="frame", unit_scale=True, file=sys.stderr)


def _from_emissions(a):
    x, lengths = load_emissions(a.emissions)
    B, T, C = x.shape
    blank = None if a.blank.lower() == "none" else a.blank
    if blank is not None:
        try:
            blank = int(blank)
        except ValueError:
            raise AlignError(f"--blank must be an integer id or 'none', got {a.blank!r}") from None
        if not 0 <= blank < C:
            raise AlignError(f"--blank must lie in [0, C={C}), got {blank}")
    targets = read_targets(a.targets, B)
    tokens = None
    if a.tokens is not None:
        if len(a.tokens) < C:
            raise AlignError(f"--tokens must give one character per class (C={C}), got {len(a.tokens)}")
        tokens = list(a.tokens)
    w = _Writer(a, tokens, a.word_separator_id, blank)
    with _frame_progress(a, int(lengths.sum())) as bar:
        w.on_frames = bar.update
        for s in range(0, B, a.batch_size):
            e = min(B, s + a.batch_size)
            try:
                w.add(x[s:e], targets[s:e], lengths[s:e], [f"utt{i}" for i in range(s, e)])
            except ValueError as err:
                raise AlignError(f"examples {s}..{e - 1}: {err}") from None
    return w


def _from_checkpoint(a):
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lightning_gtn.evaluate import build_datamodule, check_overrides, load_model
    from lightning_gtn.train import CONF_DIR, ConfigError

    try:
        check_overrides(a.overrides)
        GlobalHydra.instance().clear()
        with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
            cfg = compose("eval", overrides=list(a.overrides))
        trust = [*a.trust_module, *(cfg.get("trust_modules") or [])]
        model = load_model(a.checkpoint, trust, decoder=None)  # aligning needs no decoder
        dm = build_datamodule(cfg.data, model)
    except ConfigError as e:
        msg = str(e).replace("lightning-gtn-eval", "lightning-gtn-align")
        raise AlignError("--checkpoint:" + msg[len("ckpt_path:") :] if msg.startswith("ckpt_path:") else msg) from None
    except Exception as e:  # noqa: BLE001 - Hydra's composition errors name the bad override
        raise AlignError(f"{type(e).__name__}: {e}") from None
    model.eval()
    loss = model.structured_loss  # a StructuredLoss: its declared convention is all that is read
    if loss.network_methods:  # it scores a network's outputs: the network's lattice is aligned
        return _from_network_checkpoint(a, model, dm, loss)
    blank = loss.blank
    frame_transitions = loss.frame_transitions
    if loss.target_classes is not None:
        # targets are graphemes, not emission classes: with one token per grapheme (in the
        # graphemes' order) and no transition model its frames align like CTC's, blank last; learned
        # weights beyond frame_transitions (a graph over the tokens) are a model not aligned here
        letters = [t if isinstance(t, str) else None for t in loss.tokens or []]
        own_weights = any(True for _ in loss.parameters())
        if frame_transitions is not None or own_weights or letters != list(model.vocabulary.chars):
            raise AlignError(
                f"--checkpoint: {type(loss).__qualname__} has targets that are not its emission classes "
                "(word pieces, or a transition model over its tokens); only letter tokens without "
                "transitions are aligned here; export its emissions and token targets and use --emissions"
            )
    if frame_transitions is not None:
        frame_transitions = frame_transitions.detach()
    vocab = model.vocabulary
    tokens = _vocab_tokens(vocab)
    word_sep = a.word_separator_id
    if word_sep is None and " " in vocab.chars:
        word_sep = tokens.index(" ")
    dm.setup("validate" if a.split == "val" else "test")
    loader = dm.val_dataloader() if a.split == "val" else dm.test_dataloader()
    w = _Writer(a, tokens, word_sep, blank, frame_transitions)
    timing = _Timing(a, model, dm)
    n = 0
    with torch.no_grad():
        for batch in _progress(loader, a):
            inputs, input_lengths, targets, target_lengths, _ = model.unpack_batch(batch)
            em, em_lengths = model.emissions(inputs, input_lengths)
            B = em.shape[0]
            seqs = [t[: int(k)] for t, k in zip(targets.tolist(), target_lengths.tolist())]
            w.frame_shift = timing.frame_shift(input_lengths, em_lengths, w.frame_shift)
            w.add(em, seqs, em_lengths, _names(batch, a.split, n, B))
            n += B
    return w


def _names(batch, split: str, first: int, B: int) -> list[str]:
    """The batch's utterance ids: its cut ids (``batch["ids"]``, white space replaced by ``_`` to
    keep CTM's columns), or ``<split><index>``."""
    ids = batch.get("ids") if isinstance(batch, dict) else None
    if isinstance(ids, (list, tuple)) and len(ids) == B and all(isinstance(i, str) and i for i in ids):
        return ["_".join(i.split()) or "_" for i in ids]
    return [f"{split}{i}" for i in range(first, first + B)]


class _Timing:
    """Seconds per emission frame of a checkpoint's model: ``--frame-shift``, or the data's frame
    shift (the checkpoint's feature settings, or the data module's ``frame_shift``) times the
    model's stride (:func:`output_stride`, found on the first batch, checked on the others)."""

    def __init__(self, a, model, dm):
        settings = getattr(model, "feature_settings", None) or {}
        shift = settings.get("frame_shift", getattr(dm, "frame_shift", None))
        self.input_shift = None if a.frame_shift is not None else shift
        self.stride: int | None = None

    def frame_shift(self, input_lengths, output_lengths, current: float) -> float:
        if self.input_shift is None:
            return current
        self.stride = output_stride(input_lengths, output_lengths, self.stride)
        return float(self.input_shift) * self.stride


def _from_network_checkpoint(a, model, dm, loss):
    """A checkpoint of a loss with ``network_methods`` (the transducer protocol: encode, predict,
    join): its network's lattice, aligned token by token (each token's emission frame and
    posterior). A loss whose greedy search takes options (``decoding().options``: frames advanced
    by extra joiner outputs) or whose network has extra outputs (``network_arguments()``) is not
    a regular lattice and is refused."""
    import torch

    from lightning_gtn.align.rnnt import rnnt_forced_align as align_lattice
    from lightning_gtn.align.rnnt import rnnt_lattice as network_lattice
    from lightning_gtn.align.rnnt_plot import plot_rnnt_alignment as plot_lattice_alignment

    name = type(loss).__qualname__
    if a.star is not None:
        raise AlignError(
            f"--star: not available for {name} (it scores a network's lattice, which has no frame labels to absorb)"
        )
    try:
        options = loss.decoding(model.vocabulary.num_classes).options
    except ValueError as e:
        raise AlignError(f"--checkpoint: {e}") from None
    if options:
        raise AlignError(
            f"--checkpoint: {name} decodes with {', '.join(sorted(options))}: its lattice advances frames by "
            "extra joiner outputs; alignment covers the regular lattice (one frame per blank)"
        )
    if any(loss.network_arguments().values()):
        raise AlignError(
            f"--checkpoint: {name} gives its network {loss.network_arguments()} (extra joiner outputs); "
            "alignment covers the regular lattice"
        )
    try:
        net = model.loss_network()
    except ValueError as e:
        raise AlignError(f"--checkpoint: {e}") from None
    vocab = model.vocabulary
    tokens = _vocab_tokens(vocab)
    word_sep = a.word_separator_id
    if word_sep is None and " " in vocab.chars:
        word_sep = tokens.index(" ")
    blank = int(loss.blank or 0)
    dm.setup("validate" if a.split == "val" else "test")
    loader = dm.val_dataloader() if a.split == "val" else dm.test_dataloader()
    w = _Writer(a, tokens, word_sep, blank)
    timing = _Timing(a, model, dm)
    n = 0
    with torch.no_grad():
        for batch in _progress(loader, a):
            inputs, input_lengths, targets, target_lengths, _ = model.unpack_batch(batch)
            logits, enc_lengths = network_lattice(net, inputs, input_lengths, targets, target_lengths, blank=blank)
            al = align_lattice(logits, targets, enc_lengths, target_lengths, blank=blank)
            B = inputs.shape[0]
            seqs = [t[: int(k)] for t, k in zip(targets.tolist(), target_lengths.tolist())]
            names = _names(batch, a.split, n, B)
            w.frame_shift = timing.frame_shift(input_lengths, enc_lengths, w.frame_shift)
            w.add_alignment(al, seqs, names)
            for b in range(B):
                if w.plots >= a.num_plots or not a.plot_dir:
                    break
                path = Path(a.plot_dir) / f"{_file_name(names[b])}.png"
                plot_lattice_alignment(logits, al, targets, b, tokens=tokens, path=path)
                w.plots += 1
            n += B
    return w


def main(argv=None) -> int:
    """Console script entry point (``lightning-gtn-align``); returns the exit status."""
    a = parse_args(argv)
    try:
        w = _from_checkpoint(a) if a.checkpoint is not None else _from_emissions(a)
        w.write()
    except AlignError as e:
        print(f"lightning-gtn-align: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # an output path that cannot be written
        print(f"lightning-gtn-align: error: cannot write {e.filename or a.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    where = "standard output" if a.out == "-" else a.out
    print(
        f"aligned {w.count} utterances -> {where}" + (f", {w.plots} plots in {a.plot_dir}" if w.plots else ""),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
