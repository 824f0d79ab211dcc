"""Every Sphinx-style reference in the package's docstrings names something that exists.

Each module of ``lightning_gtn`` is read with :mod:`ast`: the docstrings of the module, of its
classes and functions (nested ones too) and the string statements that document attributes. In
them every ``:mod:``, ``:func:``, ``:class:``, ``:meth:``, ``:data:``, ``:attr:``, ``:exc:``,
``:obj:`` and ``:const:`` reference (and in the ``#:`` comments that document attributes) is
resolved the way Sphinx's Python domain looks it up:

* ``~`` (show the last component only) is dropped; ``title <target>`` keeps the target;
* a leading dot is relative: ``.name`` is tried against the enclosing class, the module and its
  package, ``..name`` against the package above, and so on;
* a plain name is tried against the enclosing class, then the module, then as an absolute dotted
  name (the longest importable module prefix, then attributes), then as a builtin;
* an attribute of a class is also found where the class (or a base) sets it on ``self`` or lists
  it under ``Attributes:`` in its docstring.

The package's own modules are imported; an outside target (``torch.*``, ``lightning.*``) resolves
by import too; one of the optional packages (:data:`OPTIONAL`) is checked only where it is installed.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from functools import cache
from pathlib import Path

import pytest

PACKAGE = "lightning_gtn"
SRC = Path(__file__).resolve().parents[1] / PACKAGE
# outside packages a docstring may name that need not be installed: their names are checked only
# where they are (any other name that does not import is unresolved)
OPTIONAL = {"gtn", "k2", "torchaudio", "triton", "lhotse", "datasets", "matplotlib", "kenlm", "pyctcdecode"}
ROLE = re.compile(r":(mod|func|class|meth|data|attr|exc|obj|const):`([^`]+)`")


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted((_module_name(p), p) for p in SRC.rglob("*.py"))


def _docstrings(tree: ast.Module):
    """``(line, enclosing class path or None, text)`` of every docstring of a module."""

    def walk(node, cls):
        body = getattr(node, "body", [])
        for i, child in enumerate(body):
            is_doc = isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant)
            if is_doc and isinstance(child.value.value, str):
                # the first statement is the docstring; one after an assignment documents it
                if i == 0 or isinstance(body[i - 1], (ast.Assign, ast.AnnAssign)):
                    yield child.lineno, cls, child.value.value
            if isinstance(child, ast.ClassDef):
                yield from walk(child, f"{cls}.{child.name}" if cls else child.name)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from walk(child, cls)
            elif isinstance(child, (ast.If, ast.Try, ast.With)):
                yield from walk(child, cls)

    yield from walk(tree, None)


def _doc_comments(tree: ast.Module, source: str):
    """``(line, enclosing class path or None, text)`` of every ``#:`` comment (Sphinx's
    attribute documentation) of a module."""
    classes = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, ast.ClassDef):
                name = f"{prefix}.{child.name}" if prefix else child.name
                classes.append((child.lineno, child.end_lineno, name))
            walk(child, name)

    walk(tree, None)
    for n, line in enumerate(source.splitlines(), 1):
        if line.lstrip().startswith("#:"):
            inside = [c for c in classes if c[0] < n <= c[1]]
            yield n, max(inside)[2] if inside else None, line.lstrip()[2:]


def _references():
    """``(module, line, enclosing class, role, raw target)`` of every reference in the package."""
    for mod, path in MODULES:
        source = path.read_text()
        tree = ast.parse(source, str(path))
        for line, cls, text in [*_docstrings(tree), *_doc_comments(tree, source)]:
            for m in ROLE.finditer(text):
                yield mod, line + text.count("\n", 0, m.start()), cls, m.group(1), m.group(2)


@cache
def _lookup(dotted: str):
    """The object a dotted name denotes (longest importable module prefix, then attributes), or
    ``None``; ``...`` where the name's top-level package is an :data:`OPTIONAL` one not installed."""
    parts = dotted.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if i == 1 and e.name == parts[0] in OPTIONAL:
                return ...  # an optional outside package that is not installed here: not checked
            continue
        except ImportError:
            continue
        for attr in parts[i:]:
            try:
                obj = getattr(obj, attr)
            except AttributeError:
                return None
        return NONE_VALUE if obj is None else obj  # an attribute whose value is None exists
    return None


#: what :func:`_lookup` gives for a name that exists and is None (a class attribute's default)
NONE_VALUE = object()


@cache
def _instance_attributes() -> dict:
    """``{"module.Class": names}``: the attributes each class of the package sets on ``self`` in
    its methods or lists under ``Attributes:`` in its docstring (Sphinx documents both)."""
    found: dict = {}

    def walk(node, mod, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = f"{prefix}.{child.name}" if prefix else child.name
                names = found.setdefault(f"{mod}.{name}", set())
                for sub in ast.walk(child):
                    targets = sub.targets if isinstance(sub, ast.Assign) else [getattr(sub, "target", None)]
                    for t in [e for g in targets for e in (g.elts if isinstance(g, ast.Tuple) else [g])]:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            names.add(t.attr)
                doc = ast.get_docstring(child) or ""
                section = re.search(r"^\s*Attributes:\n((?:[ \t]+.*\n?|\n)*)", doc, re.M)
                if section:
                    names |= set(re.findall(r"^[ \t]+(\w+)(?: \([^)]*\))?:", section.group(1), re.M))
                walk(child, mod, name)

    for mod, path in MODULES:
        walk(ast.parse(path.read_text(), str(path)), mod, None)
    return found


def _is_instance_attribute(dotted: str) -> bool:
    """Whether ``a.b.Class.name`` is an attribute instances of ``Class`` (or its bases) set."""
    owner, _, name = dotted.rpartition(".")
    cls = _lookup(owner) if owner else None
    if not isinstance(cls, type):
        return False
    attrs = _instance_attributes()
    return any(name in attrs.get(f"{c.__module__}.{c.__qualname__}", ()) for c in cls.__mro__)


def _candidates(target: str, module: str, cls: str | None):
    """The absolute dotted names a target may mean in ``module`` (inside class ``cls``)."""
    package = module if (SRC.parent / Path(*module.split("."))).is_dir() else module.rpartition(".")[0]
    scopes = [f"{module}.{cls}"] if cls else []
    if target.startswith("."):
        rest = target.lstrip(".")
        ups = len(target) - len(rest) - 1
        base = package
        for _ in range(ups):
            base = base.rpartition(".")[0]
        return [*(f"{s}.{rest}" for s in scopes), f"{module}.{rest}", f"{base}.{rest}"]
    return [*(f"{s}.{target}" for s in scopes), f"{module}.{target}", target]


def _resolves(role: str, raw: str, module: str, cls: str | None) -> bool:
    target = raw.strip()
    if "<" in target and target.endswith(">"):  # title <target>
        target = target[target.rindex("<") + 1 : -1].strip()
    target = target.lstrip("~").strip()
    target = target.removesuffix("()")
    if not target:
        return False
    for name in _candidates(target, module, cls):
        if name and (_lookup(name) is not None or _is_instance_attribute(name)):
            return True
    if "." not in target and hasattr(builtins, target):
        return True
    return False


def unresolved():
    """Every reference that does not resolve, as ``module:line :role:`target```."""
    bad = []
    for mod, line, cls, role, raw in _references():
        if not _resolves(role, raw, mod, cls):
            bad.append(f"{mod}:{line} :{role}:`{raw}`")
    return bad


def test_the_walk_finds_the_references():
    """The walk sees the whole package: many references, of several roles, in many modules."""
    refs = list(_references())
    assert len(refs) > 500
    assert {r[3] for r in refs} >= {"mod", "func", "class", "meth", "data", "attr"}
    assert len({r[0] for r in refs}) > 50


@pytest.mark.parametrize(
    ("role", "raw", "module", "cls", "ok"),
    [
        ("func", "~lightning_gtn.functional.ctc_loss", "lightning_gtn.nn", None, True),
        ("func", "lightning_gtn.functional.no_such_loss", "lightning_gtn.nn", None, False),
        ("mod", ".criterion", "lightning_gtn.core.scoring", None, True),
        ("mod", "._no_such_module", "lightning_gtn.core.scoring", None, False),
        ("mod", "..wfst", "lightning_gtn.core.scoring", None, True),
        ("class", "Plan", "lightning_gtn.core.scoring", None, True),
        ("meth", "forward", "lightning_gtn.nn.losses", "CTCLoss", True),
        ("meth", "no_such_method", "lightning_gtn.nn.losses", "CTCLoss", False),
        ("attr", "step", "lightning_gtn.nn.mmi", "LFMMILoss", True),
        ("attr", "LFMMILoss.no_such_attribute", "lightning_gtn.nn.mmi", None, False),
        ("exc", "ValueError", "lightning_gtn.core.checks", None, True),
        ("func", "torch.nn.functional.ctc_loss", "lightning_gtn.losses.ctc", None, True),
        ("func", "torch.nn.functional.no_such_function", "lightning_gtn.losses.ctc", None, False),
        ("class", "the module <lightning_gtn.nn.CTCLoss>", "lightning_gtn", None, True),
        ("func", "sys.exit", "lightning_gtn.train", None, True),
        ("func", "no_such_package.f", "lightning_gtn.train", None, False),
    ],
)
def test_the_resolver(role, raw, module, cls, ok):
    """Resolution follows Sphinx's rules, and a name that is not there is reported."""
    assert _resolves(role, raw, module, cls) is ok


def test_every_docstring_reference_resolves():
    bad = unresolved()
    assert not bad, f"{len(bad)} docstring references name nothing:\n" + "\n".join(bad)


if __name__ == "__main__":  # python -m tests.test_docstrings lists them
    for b in unresolved():
        print(b)
