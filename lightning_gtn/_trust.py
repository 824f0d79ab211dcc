"""Which dotted paths a config may name: the allow-list for configs read from files.

A config names classes and functions by dotted path (``_target_: torch.optim.Adam``, a loss's
``builder: lightning_gtn.wfst.criterion.ctc_graph``) and building it imports and calls them. A
checkpoint stores such configs in its hyper-parameters, so loading one
(``SequenceModule.load_from_checkpoint``, ``lightning-gtn-eval``) would call whatever the file
names, ``os.system`` included, although ``torch.load`` itself runs with ``weights_only``.

Policy:

* Configs the user gives (the command line of ``lightning-gtn-train``) are trusted: their own
  paths are allowed exactly (:func:`trusted` with ``paths=``), so ``model._target_=mypkg.Net``
  trains without any opt-in.
* Everything else, in particular every config read from a checkpoint, may only name classes and
  functions *defined in* modules under the allow-list: :data:`DEFAULT_TRUSTED` (this library,
  torch's optimizers and learning-rate schedulers, torch's ``nn`` modules) minus
  :data:`DENIED` (file writers, the CLIs, this module), plus what the user opts in:
  ``trust_modules=[mypkg]`` on the command line of either CLI (never read from a checkpoint),
  :func:`add_trusted` for the process, or the :func:`trusted` context manager for a block.

The check runs before anything is called: the path must be made of plain identifiers (no
dunders), match a trusted prefix, and resolve, through trusted modules only, to a class or a
function whose defining module is trusted too (``lightning_gtn.train.os.system`` names a trusted
prefix but resolves to ``posix.system`` and is refused). Only trusted modules are imported while
checking. Pure standard library: every layer may use it.

Example:
    >>> check_target("torch.optim.Adam", "optim.optimizer._target_")
    >>> check_target("os.system", "loss._target_")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lightning_gtn._trust.UntrustedTargetError: loss._target_: 'os.system' is not trusted ...
    >>> with trusted(["json"]):
    ...     resolve("json.dumps", "loss.builder")([1])
    '[1]'
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import inspect
import types
from collections.abc import Iterable, Iterator, Mapping

__all__ = [
    "DEFAULT_TRUSTED",
    "DENIED",
    "CALLABLE_KEYS",
    "UntrustedTargetError",
    "check_target",
    "check_config",
    "resolve",
    "trusted",
    "add_trusted",
    "trusted_prefixes",
    "targets_in",
]

#: Module prefixes whose classes and functions a config read from a file may name by default.
DEFAULT_TRUSTED: tuple[str, ...] = ("lightning_gtn.", "torch.optim.", "torch.nn.")

#: Modules under the default prefixes that are refused anyway: they write or read files, run
#: external programs, start the CLIs, or change this allow-list. An exact path the user trusts
#: (``trusted(paths=...)``) or an explicitly added prefix that names them still allows them.
DENIED: tuple[str, ...] = (
    "lightning_gtn._trust",
    "lightning_gtn.train",
    "lightning_gtn.evaluate",
    "lightning_gtn.wfst.utils",
    "lightning_gtn.lightning.plots",
    "lightning_gtn.align_cli",
    "lightning_gtn.functional.align_plot",
)

#: Config keys whose string values are resolved as dotted paths.
CALLABLE_KEYS: tuple[str, ...] = ("_target_", "builder")

_added: list[str] = []  # add_trusted(), for the whole process
_ctx_prefixes: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("trusted_prefixes", default=())
_ctx_paths: contextvars.ContextVar[frozenset] = contextvars.ContextVar("trusted_paths", default=frozenset())


class UntrustedTargetError(ValueError):
    """A config names a dotted path outside the allow-list; the message names the config key,
    the path and how to opt in."""


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
        out.append(p if p.endswith(".") else p + ".")
    return out


def add_trusted(prefixes: str | Iterable[str]) -> None:
    """Trusts the modules ``prefixes`` (``"mypkg"`` or ``"mypkg."``: ``mypkg`` and everything
    under it) for the rest of the process."""
    for p in _normalize(prefixes):
        if p not in _added:
            _added.append(p)


@contextlib.contextmanager
def trusted(prefixes: str | Iterable[str] = (), *, paths: Iterable[str] = ()) -> Iterator[None]:
    """Trusts module ``prefixes`` (as :func:`add_trusted`) and exact dotted ``paths`` (allowed
    as they are, wherever they are defined) inside the ``with`` block (this thread/task only)."""
    t1 = _ctx_prefixes.set(_ctx_prefixes.get() + tuple(_normalize(prefixes)))
    t2 = _ctx_paths.set(_ctx_paths.get() | {p for p in paths if isinstance(p, str)})
    try:
        yield
    finally:
        _ctx_paths.reset(t2)
        _ctx_prefixes.reset(t1)


def trusted_prefixes() -> tuple[str, ...]:
    """The module prefixes trusted here and now: defaults, :func:`add_trusted`, :func:`trusted`."""
    return DEFAULT_TRUSTED + tuple(_added) + _ctx_prefixes.get()


def _explicit_prefixes() -> tuple[str, ...]:
    return tuple(_added) + _ctx_prefixes.get()


def _under(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p[:-1] or name.startswith(p) for p in prefixes)


def _allowed_name(name: str) -> bool:
    """``name`` (a module or ``module.qualname``) lies under a trusted prefix and, unless a
    prefix the user added covers it, outside :data:`DENIED`."""
    if _under(name, _explicit_prefixes()):
        return True
    return _under(name, DEFAULT_TRUSTED) and not _under(name, [d + "." for d in DENIED])


def _refuse(path: str, key: str, why: str) -> UntrustedTargetError:
    top = path.split(".")[0] if isinstance(path, str) else "mypkg"
    return UntrustedTargetError(
        f"{key}: {path!r} is not trusted ({why}). A config read from a checkpoint may only name "
        f"classes and functions of {', '.join(p[:-1] for p in trusted_prefixes())}. If you trust "
        f"the file, opt in with trust_modules=[{top}] on the command line of lightning-gtn-train "
        f"or lightning-gtn-eval, or in Python with lightning_gtn._trust.add_trusted({top!r}) or "
        f"`with lightning_gtn._trust.trusted({top!r}):`"
    )


def _locate(path: str, key: str, check: bool):
    """Imports ``path`` the way Hydra does (longest importable module, then attributes); with
    ``check``, only through trusted modules."""
    parts = path.split(".")
    try:  # with check, the caller has made sure that the path lies under a trusted prefix
        obj = importlib.import_module(parts[0])
    except Exception as e:
        raise ValueError(f"{key}: cannot import {path!r}: {type(e).__name__}: {e}") from e
    for i, part in enumerate(parts[1:], 1):
        if isinstance(obj, types.ModuleType):
            # a submodule that is not imported yet, or an attribute of the module
            name = f"{obj.__name__}.{part}"
            if not hasattr(obj, part):
                if check and not _under(name, trusted_prefixes()):
                    raise _refuse(path, key, f"module {name} is outside the allow-list")
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
        if check and isinstance(obj, types.ModuleType) and not _under(obj.__name__, trusted_prefixes()):
            raise _refuse(path, key, f"it goes through module {obj.__name__}")
    return obj


def _check(path: str, key: str):
    """Returns the located object if ``path`` is allowed, ``None`` for exact trusted paths."""
    if path in _ctx_paths.get():
        return None
    parts = path.split(".")
    if not all(p.isidentifier() and not p.startswith("__") for p in parts):
        raise _refuse(path, key, "not a dotted path of plain names")
    if not _under(path, trusted_prefixes()):
        raise _refuse(path, key, "outside the allow-list")
    if not _allowed_name(path):
        raise _refuse(path, key, "on the deny-list of file writers and entry points")
    obj = _locate(path, key, check=True)
    if isinstance(obj, types.ModuleType) or not (inspect.isclass(obj) or inspect.isroutine(obj)):
        raise _refuse(path, key, f"it is a {type(obj).__name__}, not a class or a function")
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", getattr(obj, "__name__", ""))
    defined = f"{module}.{qualname}" if module else ""
    # a prefix the user added covers its re-exports too; default prefixes only their own code
    if not _under(path, _explicit_prefixes()) and (not defined or not _allowed_name(defined)):
        raise _refuse(path, key, f"it is defined in {module or 'an unknown module'}")
    return obj


def check_target(path: str, key: str) -> None:
    """Raises :class:`UntrustedTargetError` unless ``path`` may be imported and called.

    Args:
        path: a dotted path (``"torch.optim.Adam"``). Objects (a class given in Python rather
            than by name) are not checked.
        key: the config key it was found under, for the message (``"loss._target_"``).
    """
    if isinstance(path, str):
        _check(path, key)


def resolve(path, key: str):
    """Checks ``path`` as :func:`check_target` does, then returns the object it names (a
    non-string ``path``, already an object, is returned as is)."""
    if not isinstance(path, str):
        return path
    obj = _check(path, key)
    return obj if obj is not None else _locate(path, key, check=False)


def _container(cfg):
    """A DictConfig/ListConfig as plain containers (interpolations resolved where possible)."""
    mod = type(cfg).__module__ or ""
    if mod.startswith("omegaconf"):
        from omegaconf import OmegaConf  # only reached when omegaconf is in use

        try:
            return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
        except Exception:
            return OmegaConf.to_container(cfg, resolve=False)
    return cfg


def _walk(cfg, key: str):
    cfg = _container(cfg)
    if isinstance(cfg, Mapping):
        for k, v in cfg.items():
            sub = f"{key}.{k}" if key else str(k)
            if k in CALLABLE_KEYS and isinstance(v, str):
                yield v, sub
            else:
                yield from _walk(v, sub)
    elif isinstance(cfg, (list, tuple)):
        for i, v in enumerate(cfg):
            yield from _walk(v, f"{key}[{i}]")


def targets_in(cfg, key: str = "") -> list[tuple[str, str]]:
    """Every ``(dotted path, config key)`` of ``_target_``/``builder`` values in ``cfg``."""
    return list(_walk(cfg, key))


def check_config(cfg, key: str) -> None:
    """Checks every ``_target_`` and ``builder`` string in ``cfg`` (a mapping, a DictConfig, a
    list, nested) with :func:`check_target`; the message names the full key, e.g.
    ``loss.builder`` or ``model.layers[2]._target_``."""
    for path, sub in _walk(cfg, key):
        _check(path, sub)
