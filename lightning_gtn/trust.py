"""What a config read from a file may call: a registry of constructible types.

A config names classes by dotted path (``_target_: torch.optim.Adam``, a loss's ``builder:
lightning_gtn.wfst.criterion.ctc_graph``) and building it calls them. A checkpoint stores such
configs in its hyper-parameters, so loading one (``SequenceModule.load_from_checkpoint``,
``lightning-gtn-eval``, ``lightning-gtn-align --checkpoint``) must not call whatever the file
names. ``torch.load`` itself runs with ``weights_only``.

Design: **checkpoints are data**. A config read from a file may only name *registered types*,
with plain data as arguments:

* A registered type is a class (or a pure constructor function) put in the registry under a
  name: this library's losses, encoders and layers, the graph builders that configs name by
  ``builder:`` (pure constructors: they return a graph and read no file), torch's optimizers and
  learning-rate schedulers (those that take plain data), a few parameter-free ``torch.nn`` layers,
  and the data modules (see :func:`registered_types`). Add your own with :func:`register_type`
  (also a decorator). Each has a *kind* (``"loss"``, ``"model"``, ``"module"``, ``"builder"``,
  ``"optimizer"``, ``"scheduler"``, ``"data"``; ``None``: any), and a config section admits only
  its own kinds (a loss config's ``_target_`` must be a loss, its ``builder`` a builder).
* Arguments are plain data: ``None``, booleans, numbers, strings, lists and mappings with string
  keys, or nested ``{_target_: <registered type>, ...}`` mappings (built first, as Hydra does).
  Strings are never interpreted (no ``${...}`` interpolation, no import). Hydra's ``_partial_``,
  ``_args_``, ``_recursive_`` and ``_convert_`` keep their meaning; any other ``_name_`` key is
  refused.
* Nothing else is ever imported or called: the whole config is checked before the first call,
  and :func:`instantiate` (not Hydra's) builds it. Errors name the config key path
  (``optim.scheduler.T_max._target_``).
* Artefacts a model needs (word pieces, transitions graphs) travel inside the checkpoint as data,
  never as file paths (see ``docs/training.md``).

Opt-ins, all from the user, never from a file:

* exact dotted paths the user typed (the command line of ``lightning-gtn-train``): the
  :func:`trusted` context manager with ``paths=``; ``model._target_=mypkg.Net`` trains as is;
* whole modules: ``trust_modules=[mypkg]`` on the command line of ``lightning-gtn-eval`` /
  ``lightning-gtn-align`` / ``lightning-gtn-train``, :func:`add_trusted` for the process, or
  ``with trusted(["mypkg"]):`` for a block: classes and functions *defined in* those modules may
  be named (arguments are still plain data).

Pure standard library: every layer may use it.

Example:
    >>> check_target("torch.optim.Adam", "optim.optimizer._target_")
    >>> check_target("os.system", "loss._target_")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lightning_gtn.trust.UntrustedTargetError: loss._target_: 'os.system' is not trusted ...
    >>> with trusted(["json"]):
    ...     resolve("json.dumps", "loss.builder")([1])
    '[1]'
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import inspect
import types
from collections.abc import Iterable, Iterator, Mapping

__all__ = [
    "KINDS",
    "CALLABLE_KEYS",
    "MAX_DEPTH",
    "UntrustedTargetError",
    "register_type",
    "registered_types",
    "check_target",
    "check_config",
    "instantiate",
    "resolve",
    "trusted",
    "add_trusted",
    "trusted_prefixes",
    "is_trusted_path",
    "targets_in",
]

#: The kinds of registered types; a config section admits only its own (``None``: any section).
KINDS = ("loss", "model", "module", "builder", "optimizer", "scheduler", "data")

#: Config keys whose string values name a registered type.
CALLABLE_KEYS: tuple[str, ...] = ("_target_", "builder")

#: Hydra's reserved keys that :func:`instantiate` understands; other ``_x_`` keys are refused.
_RESERVED = ("_target_", "_args_", "_partial_", "_recursive_", "_convert_")

#: The deepest nesting of lists and mappings a config may have.
MAX_DEPTH = 32

# name -> (module, attribute, kind): imported only when a config names it
_BUILTIN: dict[str, tuple[str, str, str]] = {}


def _add_builtin(module: str, names: Iterable[str], kind: str, public: str | None = None) -> None:
    for n in names:
        _BUILTIN[f"{public or module}.{n}"] = (module, n, kind)


_add_builtin(
    "lightning_gtn.nn",
    [
        "CTCLoss",
        "ASGLoss",
        "SequenceLoss",
        "STCLoss",
        "TargetGraphLoss",
        "TransducerLoss",
        "RNNTLoss",
        "PrunedRNNTLoss",
    ],
    "loss",
)
_add_builtin("lightning_gtn.nn", ["LFMMILoss"], "loss")  # LF-MMI (docs/mmi.md): its denominator travels as data
_add_builtin("lightning_gtn.nn", ["MultiBlankRNNTLoss", "TDTLoss"], "loss")  # RNN-T variants (docs/rnnt_variants.md)
_add_builtin("lightning_gtn.nn", ["RNNTJoinerLoss"], "loss")  # RNN-T without the joiner output (docs/rnnt.md)
_add_builtin("lightning_gtn.nn", ["WordPieceRNNTLoss"], "loss")  # RNN-T over word pieces (docs/rnnt.md)
_add_builtin("lightning_gtn.nn", ["TargetGraphLoss"], "loss", "lightning_gtn.lightning")  # older configs
_add_builtin("lightning_gtn.nn", ["TargetGraphLoss"], "loss", "lightning_gtn.lightning.losses")
_add_builtin("lightning_gtn.nn", ["Linear", "ConvTransduce1D"], "module")
_add_builtin("lightning_gtn.lightning", ["ConvRNNEncoder", "ConvTransduceEncoder", "TransducerModel"], "model")
_add_builtin("lightning_gtn.lightning", ["ConvEncoder"], "model")  # the speech encoder (docs/speech.md)
_add_builtin("lightning_gtn.lightning", ["DigitLinesDataModule", "TextLinesDataModule", "FeatureDataModule"], "data")
_add_builtin("lightning_gtn.lightning", ["LhotseDataModule"], "data")  # speech from Lhotse manifests
_add_builtin("lightning_gtn.lightning", ["SpokenTaskDataModule"], "data")  # the embedded spoken task
_add_builtin("lightning_gtn.wfst.criterion", ["ctc_graph"], "builder")
_add_builtin("lightning_gtn.lightning", ["HFDataModule"], "data")  # speech: HF datasets on disk (docs/speech.md)
_add_builtin(
    "torch.optim",
    [
        "ASGD",
        "Adadelta",
        "Adafactor",
        "Adagrad",
        "Adam",
        "AdamW",
        "Adamax",
        "LBFGS",
        "NAdam",
        "RAdam",
        "RMSprop",
        "Rprop",
        "SGD",
        "SparseAdam",
    ],
    "optimizer",
)
# not LambdaLR / MultiplicativeLR (they take functions) nor SequentialLR / ChainedScheduler
# (they take scheduler objects)
_add_builtin(
    "torch.optim.lr_scheduler",
    [
        "ConstantLR",
        "CosineAnnealingLR",
        "CosineAnnealingWarmRestarts",
        "CyclicLR",
        "ExponentialLR",
        "LinearLR",
        "MultiStepLR",
        "OneCycleLR",
        "PolynomialLR",
        "ReduceLROnPlateau",
        "StepLR",
    ],
    "scheduler",
)
_add_builtin(
    "torch.nn", ["ReLU", "GELU", "Tanh", "Sigmoid", "SiLU", "LeakyReLU", "ELU", "Identity", "Dropout"], "module"
)

_registered: dict[str, tuple[object, str | None]] = {}  # register_type(): name -> (object, kind)
_added: list[str] = []  # add_trusted(), for the whole process
_ctx_prefixes: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("trusted_prefixes", default=())
_ctx_paths: contextvars.ContextVar[frozenset] = contextvars.ContextVar("trusted_paths", default=frozenset())


class UntrustedTargetError(ValueError):
    """A config names something that is not a registered type, or gives an argument that is not
    plain data; the message names the config key, the value and how to opt in."""


# ----------------------------------------------------------------------------- registry
def register_type(obj=None, name: str | None = None, *, kind: str | None = None):
    """Registers a class (or a pure constructor function) that configs read from files may name.

    Usable as ``register_type(MyNet)``, ``register_type(MyNet, "mypkg.Net", kind="model")`` or
    as a decorator (``@register_type`` / ``@register_type(kind="loss")``). Register only types
    whose construction from plain data is safe: no file access, no raw addresses, no callables
    among the arguments.

    Args:
        obj: the class or function.
        name: the dotted name configs use (default ``obj.__module__ + "." + obj.__qualname__``).
        kind: one of :data:`KINDS`, or ``None`` (any config section).

    Returns:
        ``obj`` (so it works as a decorator).
    """
    if obj is None:
        return lambda o: register_type(o, name, kind=kind)
    if kind is not None and kind not in KINDS:
        raise ValueError(f"register_type: kind must be one of {KINDS} or None, got {kind!r}")
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        raise TypeError(f"register_type: expected a class or a function, got {type(obj).__name__}")
    if name is None:
        name = f"{obj.__module__}.{obj.__qualname__}"
    if not isinstance(name, str) or not all(p.isidentifier() for p in name.split(".")):
        raise ValueError(f"register_type: name must be a dotted path of identifiers, got {name!r}")
    _registered[name] = (obj, kind)
    return obj


def registered_types() -> dict[str, str | None]:
    """``{dotted name: kind}`` of every registered type (built-in and :func:`register_type`)."""
    out: dict[str, str | None] = {n: k for n, (_, _, k) in _BUILTIN.items()}
    out.update({n: k for n, (_, k) in _registered.items()})
    return dict(sorted(out.items()))


def _registry_lookup(name: str):
    """``(object, kind)`` of a registered name, or ``None``."""
    if name in _registered:
        return _registered[name]
    if name in _BUILTIN:
        module, attr, kind = _BUILTIN[name]
        obj = getattr(importlib.import_module(module), attr, None)  # a fixed name of this table
        if obj is None:  # e.g. an optimizer this torch version lacks
            return None
        return obj, kind
    return None


# ----------------------------------------------------------------------------- opt-ins
def _normalize(prefixes) -> list[str]:
    if prefixes is None:
        return []
    if isinstance(prefixes, str):
        prefixes = [prefixes]
    out = []
    for p in prefixes:
        if not isinstance(p, str) or not p.strip(". "):
            raise ValueError(f"trust_modules: expected module names such as 'mypkg', got {p!r}")
        p = p.strip()
        if not all(s.isidentifier() for s in p.rstrip(".").split(".")):
            raise ValueError(f"trust_modules: expected module names such as 'mypkg', got {p!r}")
        out.append(p if p.endswith(".") else p + ".")
    return out


def add_trusted(prefixes: str | Iterable[str]) -> None:
    """Trusts the modules ``prefixes`` (``"mypkg"`` or ``"mypkg."``: ``mypkg`` and everything
    under it) for the rest of the process: their classes and functions may be named."""
    for p in _normalize(prefixes):
        if p not in _added:
            _added.append(p)


@contextlib.contextmanager
def trusted(prefixes: str | Iterable[str] = (), *, paths: Iterable[str] = ()) -> Iterator[None]:
    """Trusts module ``prefixes`` (as :func:`add_trusted`) and exact ``paths`` (dotted paths the
    user typed, allowed as they are; also file paths a config may name, see
    :func:`is_trusted_path`) inside the ``with`` block (this thread/task only)."""
    t1 = _ctx_prefixes.set(_ctx_prefixes.get() + tuple(_normalize(prefixes)))
    t2 = _ctx_paths.set(_ctx_paths.get() | {p for p in paths if isinstance(p, str)})
    try:
        yield
    finally:
        _ctx_paths.reset(t2)
        _ctx_prefixes.reset(t1)


def trusted_prefixes() -> tuple[str, ...]:
    """The module prefixes the user opted in here and now (:func:`add_trusted`, :func:`trusted`)."""
    return tuple(_added) + _ctx_prefixes.get()


def is_trusted_path(path) -> bool:
    """Whether ``path`` is one of the exact paths of an enclosing ``trusted(paths=...)``."""
    return isinstance(path, str) and path in _ctx_paths.get()


def _under(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p[:-1] or name.startswith(p) for p in prefixes)


# ----------------------------------------------------------------------------- checks
def _refuse(path, key: str, why: str) -> UntrustedTargetError:
    top = path.split(".")[0] if isinstance(path, str) and path.split(".")[0].isidentifier() else "mypkg"
    return UntrustedTargetError(
        f"{key}: {path!r} is not trusted ({why}). A config read from a file or checkpoint may only name "
        "registered types (lightning_gtn.trust.registered_types(): this library's losses, encoders and "
        "graph builders, torch's optimizers and schedulers) with plain data as arguments. If you trust "
        f"the file, register the type (lightning_gtn.trust.register_type) or opt in with "
        f"trust_modules=[{top}] on the command line of lightning-gtn-train / lightning-gtn-eval, or in "
        f"Python with lightning_gtn.trust.add_trusted({top!r}) or `with lightning_gtn.trust.trusted({top!r}):`"
    )


def _locate(path: str, key: str, check: bool):
    """Imports ``path`` the way Hydra does (longest importable module, then attributes); with
    ``check``, only through modules under the user's opted-in prefixes."""
    parts = path.split(".")
    prefixes = trusted_prefixes()
    if check and not _under(parts[0], prefixes) and not _under(path, prefixes):
        raise _refuse(path, key, "outside the registry")
    try:
        obj = importlib.import_module(parts[0])
    except Exception as e:
        raise ValueError(f"{key}: cannot import {path!r}: {type(e).__name__}: {e}") from e
    for i, part in enumerate(parts[1:], 1):
        if isinstance(obj, types.ModuleType) and not hasattr(obj, part):
            name = f"{obj.__name__}.{part}"
            if check and not _under(name, prefixes):
                raise _refuse(path, key, f"module {name} is outside the opted-in modules")
            try:
                obj = importlib.import_module(name)
                continue
            except ModuleNotFoundError as e:
                if e.name != name:
                    raise ValueError(f"{key}: cannot import {path!r}: {e}") from e
                raise ValueError(f"{key}: cannot import {path!r}: no {part!r} in {obj.__name__}") from e
            except Exception as e:
                raise ValueError(f"{key}: cannot import {path!r}: {type(e).__name__}: {e}") from e
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise ValueError(f"{key}: cannot import {path!r}: {'.'.join(parts[:i])} has no {part!r}") from e
        if check and isinstance(obj, types.ModuleType) and not _under(obj.__name__, prefixes):
            raise _refuse(path, key, f"it goes through module {obj.__name__}")
    return obj


def _lookup(path, key: str, kinds):
    """The object ``path`` names if a config may call it, else :class:`UntrustedTargetError`."""
    if not isinstance(path, str):
        raise _refuse(path, key, f"a {type(path).__name__}, not the dotted name of a registered type")
    if path in _ctx_paths.get():  # typed by the user
        return _locate(path, key, check=False)
    parts = path.split(".")
    if not all(p.isidentifier() and not p.startswith("__") for p in parts):
        raise _refuse(path, key, "not a dotted path of plain names")
    hit = _registry_lookup(path)
    if hit is not None:
        obj, kind = hit
        if kinds is not None and kind is not None and kind not in kinds:
            raise _refuse(path, key, f"a registered {kind}, where this key takes a {' or '.join(kinds)}")
        return obj
    if not _under(path, trusted_prefixes()):
        raise _refuse(path, key, "not a registered type")
    obj = _locate(path, key, check=True)
    if isinstance(obj, types.ModuleType) or not (inspect.isclass(obj) or inspect.isroutine(obj)):
        raise _refuse(path, key, f"it is a {type(obj).__name__}, not a class or a function")
    module = getattr(obj, "__module__", None) or ""
    if not _under(module, trusted_prefixes()):
        raise _refuse(path, key, f"it is defined in {module or 'an unknown module'}, outside the opted-in modules")
    return obj


def check_target(path, key: str, kinds=None) -> None:
    """Raises :class:`UntrustedTargetError` unless ``path`` names a registered type (of one of
    ``kinds``, when given) or a class/function of an opted-in module.

    Args:
        path: a dotted name (``"torch.optim.Adam"``). Objects (a class given in Python rather
            than by name) are the caller's own and are not checked.
        key: the config key it was found under, for the message (``"loss._target_"``).
        kinds: the kinds this key admits (see :data:`KINDS`), or None for any.
    """
    if isinstance(path, str):
        _lookup(path, key, kinds)


def resolve(path, key: str, kinds=None):
    """Checks ``path`` as :func:`check_target` does, then returns the object it names (a
    non-string ``path``, already an object, is returned as is)."""
    if not isinstance(path, str):
        return path
    return _lookup(path, key, kinds)


def _container(cfg):
    """A DictConfig/ListConfig as plain containers (interpolations of the user's own config
    resolved; a config read from a checkpoint is plain already)."""
    mod = type(cfg).__module__ or ""
    if mod.startswith("omegaconf"):
        from omegaconf import OmegaConf  # only reached when omegaconf is in use

        try:
            return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
        except Exception:  # an interpolation into a part of the config not given here: kept as a string
            return OmegaConf.to_container(cfg, resolve=False)
    return cfg


_NESTED_KINDS = ("model", "module")


def _walk(cfg, key: str, kinds, depth: int, check_data: bool):
    """Yields ``(path, key, kinds)`` of every name to look up; checks plain data on the way."""
    if depth > MAX_DEPTH:
        raise UntrustedTargetError(f"{key}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(cfg, Mapping):
        for k in cfg:
            if not isinstance(k, str):
                raise UntrustedTargetError(f"{key}: mapping keys must be strings, got {k!r}")
        if "_target_" in cfg:
            yield cfg["_target_"], f"{key}._target_" if key else "_target_", kinds
            for k in cfg:
                if k.startswith("_") and k.endswith("_") and len(k) > 2 and k not in _RESERVED:
                    raise UntrustedTargetError(f"{key}.{k}: unknown reserved key (allowed: {', '.join(_RESERVED)})")
            for k in ("_partial_", "_recursive_"):
                if k in cfg and not isinstance(cfg[k], bool):
                    raise UntrustedTargetError(f"{key}.{k}: expected true or false, got {cfg[k]!r}")
            if "_args_" in cfg and not isinstance(cfg["_args_"], (list, tuple)):
                raise UntrustedTargetError(f"{key}._args_: expected a list, got {type(cfg['_args_']).__name__}")
            nested = _NESTED_KINDS
        else:
            nested = kinds if depth == 0 else _NESTED_KINDS
        for k, v in cfg.items():
            if k == "_target_":
                continue
            sub = f"{key}.{k}" if key else k
            if k == "builder" and isinstance(v, str) and "_target_" in cfg:
                yield v, sub, ("builder",)
            else:
                yield from _walk(v, sub, nested, depth + 1, check_data)
    elif isinstance(cfg, (list, tuple)):
        for i, v in enumerate(cfg):
            yield from _walk(v, f"{key}[{i}]", _NESTED_KINDS, depth + 1, check_data)
    elif check_data and not (cfg is None or isinstance(cfg, (bool, int, float, str))):
        raise UntrustedTargetError(
            f"{key}: {type(cfg).__name__} is not plain data (None, a boolean, a number, "
            "a string, a list or a mapping)"
        )


def targets_in(cfg, key: str = "") -> list[tuple[str, str]]:
    """Every ``(dotted name, config key)`` of ``_target_``/``builder`` strings in ``cfg``."""
    return [(p, k) for p, k, _ in _walk(_container(cfg), key, None, 0, False) if isinstance(p, str)]


def check_config(cfg, key: str, kind: str | None = None, *, data: bool = True) -> None:
    """Checks a whole config before anything is called: every ``_target_`` names a registered type
    (the top one of ``kind`` when given, nested ones models or modules), every ``builder`` of a
    target a registered builder, and (with ``data``) every other value is plain data.

    Args:
        cfg: a mapping, a DictConfig, a list, nested.
        key: where it was found (``"loss"``, ``"optim.scheduler"``); messages name the full key,
            e.g. ``loss.builder`` or ``model.layers[2]._target_``.
        kind: the kind the top ``_target_`` must have (see :data:`KINDS`), or None for any.
        data: also require plain data (False: objects given in Python pass).

    Raises:
        UntrustedTargetError: naming the key path.
    """
    for path, sub, kinds in _walk(_container(cfg), key, (kind,) if kind else None, 0, data):
        if isinstance(path, str):
            _lookup(path, sub, kinds)
        elif data:
            raise _refuse(path, sub, f"a {type(path).__name__}, not the dotted name of a registered type")


def _build(cfg, key: str, kinds, recursive: bool):
    if isinstance(cfg, Mapping):
        if "_target_" not in cfg:
            return {k: _build(v, f"{key}.{k}", _NESTED_KINDS, recursive) if recursive else v for k, v in cfg.items()}
        target = (
            _lookup(cfg["_target_"], f"{key}._target_", kinds) if isinstance(cfg["_target_"], str) else cfg["_target_"]
        )
        rec = bool(cfg.get("_recursive_", recursive))
        args = [
            _build(a, f"{key}._args_[{i}]", _NESTED_KINDS, rec) if rec else a
            for i, a in enumerate(cfg.get("_args_", ()))
        ]
        kwargs = {}
        for k, v in cfg.items():
            if k in _RESERVED:
                continue
            if k == "builder" and isinstance(v, str):
                kwargs[k] = v  # resolved by the loss itself, through resolve(..., kinds=("builder",))
            else:
                kwargs[k] = _build(v, f"{key}.{k}", _NESTED_KINDS, rec) if rec else v
        if cfg.get("_partial_", False):
            return functools.partial(target, *args, **kwargs)
        return target(*args, **kwargs)
    if isinstance(cfg, (list, tuple)):
        return [_build(v, f"{key}[{i}]", _NESTED_KINDS, recursive) for i, v in enumerate(cfg)]
    return cfg


def instantiate(cfg, key: str, kind: str | None = None, *, data: bool = True, **kwargs):
    """Builds ``cfg`` (a mapping with ``_target_``) after :func:`check_config`, calling nothing but
    the registered (or opted-in) types it names; ``kwargs`` are added to the top call (the
    caller's own objects, e.g. ``feature_dim=``).

    Hydra's ``_partial_`` (a ``functools.partial``), ``_args_`` (positional arguments) and
    ``_recursive_: false`` (nested mappings passed as data) keep their meaning; strings are
    passed as they are.

    Raises:
        UntrustedTargetError: before any call, naming the key path.
    """
    cfg = _container(cfg)
    if not isinstance(cfg, Mapping) or "_target_" not in cfg:
        raise ValueError(f"{key}: expected a config with '_target_', got {cfg!r}")
    check_config(cfg, key, kind, data=data)
    cfg = dict(cfg)
    cfg.update(kwargs)
    return _build(cfg, key, (kind,) if kind else None, bool(cfg.get("_recursive_", True)))
