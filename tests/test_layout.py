"""The package's layout: its import graph has no cycle, respects the layer ranks, and no module
reaches into another package's private names.

Every ``import`` of every module of ``lightning_gtn`` is read with :mod:`ast`: module level, inside
functions and methods, under ``if TYPE_CHECKING:`` and ``try:``, plus ``importlib.import_module``
calls with a literal name. Relative imports are resolved against the importing module. A private
name read through an imported module (``graph_numba._np``) counts as importing it.

``python tests/test_layout.py`` prints the package-level graph in Graphviz DOT::

    python tests/test_layout.py | dot -Tsvg > layout.svg
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = "lightning_gtn"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

# The layer ranks, bottom to top. A module may import modules of its own rank or lower, never
# higher. The longest matching prefix decides a module's rank. Two chains meet at ``functional``:
# the criteria (trust < wfst < kernels < core < losses) and the decoders (lm < decode < align),
# both under the public surface (functional < nn); above them the word pieces, the Lightning layer
# and the command lines. ``lm`` (ARPA n-gram models, numpy only) imports nothing of the package
# today; it shares rank 4 with ``losses`` so that it may later build graphs from wfst and core
# (neither imports the other: see ``test_no_package_cycle``).
RANKS = {
    f"{PACKAGE}": 0,  # the root __init__: only __version__ and a docstring
    f"{PACKAGE}.trust": 0,  # the registry of constructible types: pure standard library
    f"{PACKAGE}.integers": 0,  # the integer argument check: pure standard library
    f"{PACKAGE}.opargs": 0,  # the custom ops' argument schemas: pure standard library
    f"{PACKAGE}.wfst": 1,  # the GTN-compatible engine
    f"{PACKAGE}.kernels": 2,  # what is computed and where (numba, torch, triton)
    f"{PACKAGE}.core": 3,  # criterion base, plans, graphs, checks, DP driver, best paths
    f"{PACKAGE}.losses": 4,  # one module per criterion
    f"{PACKAGE}.lm": 4,  # ARPA n-gram models as graphs
    f"{PACKAGE}.wordpieces": 4,  # word-piece vocabularies: plain Python, which a loss's preparation learns
    f"{PACKAGE}.decode": 5,  # viterbi, greedy, beam search over T o L o G
    f"{PACKAGE}.align": 6,  # forced alignment and its plots
    f"{PACKAGE}.functional": 7,  # the public functional surface
    f"{PACKAGE}.k2": 7,  # k2's RNN-T API under k2's names (a second public functional surface)
    f"{PACKAGE}.nn": 8,  # modules over functional
    f"{PACKAGE}.lightning": 10,  # mixin, metrics, data, models
    f"{PACKAGE}.train": 11,  # the command lines
    f"{PACKAGE}.evaluate": 11,
    f"{PACKAGE}.align_cli": 11,
    f"{PACKAGE}.lm.cli": 11,
}

# What the packages at the bottom may import (computation never reaches up to the losses).
LOW_PACKAGES = (f"{PACKAGE}.kernels", f"{PACKAGE}.core")
LOW_ALLOWED = (
    f"{PACKAGE}.trust",
    f"{PACKAGE}.integers",
    f"{PACKAGE}.opargs",
    f"{PACKAGE}.wfst",
    f"{PACKAGE}.kernels",
    f"{PACKAGE}.core",
)

# What ``nn`` may import from the package: computation only through the public functional
# surface, argument checks from core.checks, the reduction of core.reduction, graphs from wfst,
# the registry, the argument schemas of custom ops (its Linear layer is one), and the word
# pieces a loss's preparation learns.
NN_ALLOWED = (
    f"{PACKAGE}.nn",
    f"{PACKAGE}.wordpieces",
    f"{PACKAGE}.functional",
    f"{PACKAGE}.k2",
    f"{PACKAGE}.core.checks",
    f"{PACKAGE}.core.reduction",
    f"{PACKAGE}.opargs",
    f"{PACKAGE}.wfst",
    f"{PACKAGE}.trust",
)


@dataclasses.dataclass(frozen=True)
class Import:
    """One import statement's view of one name: ``source`` imports module ``target`` (and from
    it the attribute ``name``, when that is not itself a module)."""

    source: str  # importing module, dotted
    target: str  # imported module of this package, dotted (the deepest one that exists)
    name: str | None  # the attribute taken from ``target`` (``from target import name``), or None
    line: int

    def where(self) -> str:
        """``module:line`` for messages."""
        return f"{self.source}:{self.line}"


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """``{dotted module name: path}`` of every module of the package."""
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


MODULES = modules()
PACKAGES = {_module_name(p) for p in ROOT.rglob("__init__.py")}


def package_of(module: str) -> str:
    """The package a module belongs to (a package's ``__init__`` belongs to itself)."""
    return module if module in PACKAGES else module.rpartition(".")[0]


def unit_of(module: str) -> str:
    """What owns a module's private names: its package, except for the modules at the top of
    ``lightning_gtn`` (``trust``, ``wordpieces``, ``train``, ``evaluate``, ...), which are
    separate layers and each their own unit."""
    package = package_of(module)
    return module if package == PACKAGE and module != PACKAGE else package


def _resolve_from(source: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = package_of(source).split(".")
    if node.level > 1:
        base = base[: -(node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _deepest_module(dotted: str) -> str | None:
    """The longest prefix of ``dotted`` that is a module of the package (None: not ours)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in MODULES:
            return ".".join(parts[:i])
    return None


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` of an attribute chain on a name, as ``["a", "b", "c"]`` (None: not one)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def imports_of(source: str) -> list[Import]:
    """Every import of this package's modules made anywhere in module ``source``.

    A name bound to one of the package's modules (``from lightning_gtn import x``, ``import
    lightning_gtn.x as x``) and then read as ``x._y`` counts as importing ``_y`` from it."""
    tree = ast.parse(MODULES[source].read_text(), filename=str(MODULES[source]))
    out = []
    bound: dict[str, str] = {}  # local name -> dotted module it stands for

    def add(dotted: str, line: int) -> None:
        target = _deepest_module(dotted)
        if target is not None:
            rest = dotted[len(target) + 1 :] or None
            out.append(Import(source, target, rest, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound[alias.name.partition(".")[0]] = alias.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(source, node)
            for alias in node.names:
                add(base if alias.name == "*" else f"{base}.{alias.name}", node.lineno)
                if f"{base}.{alias.name}" in MODULES:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            add(node.args[0].value, node.lineno)
    # attribute reads of private names through a bound module: x._y, lightning_gtn.x._y
    for node in ast.walk(tree):
        chain = _dotted(node) if isinstance(node, ast.Attribute) else None
        if chain and chain[0] in bound and any(_private(p) for p in chain[1:]):
            dotted = ".".join([bound[chain[0]], *chain[1:]])
            target = _deepest_module(dotted)
            if target is not None and dotted != target:
                rest = dotted[len(target) + 1 :].split(".")
                if _private(rest[0]):
                    out.append(Import(source, target, rest[0], node.lineno))
    return out


ALL_IMPORTS = [imp for m in MODULES for imp in imports_of(m)]


def module_graph() -> dict[str, set[str]]:
    """``{module: modules it imports}`` (self-imports left out)."""
    graph = {m: set() for m in MODULES}
    for imp in ALL_IMPORTS:
        if imp.target != imp.source:
            graph[imp.source].add(imp.target)
    return graph


def top_package(module: str) -> str:
    """The node of the package-level graph: ``lightning_gtn.<first part>`` (``lm.cli`` and the
    root's modules stand for themselves)."""
    parts = module.split(".")
    if module == f"{PACKAGE}.lm.cli":
        return module
    return ".".join(parts[:2])


def package_graph() -> dict[str, set[str]]:
    """``{package: packages it imports}`` over :func:`top_package` nodes."""
    graph = defaultdict(set)
    for m, targets in module_graph().items():
        graph[top_package(m)]
        for t in targets:
            if top_package(t) != top_package(m):
                graph[top_package(m)].add(top_package(t))
    return dict(graph)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def rank_of(module: str) -> int:
    """The rank of the longest prefix of ``module`` in :data:`RANKS`."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in RANKS:
            return RANKS[".".join(parts[:i])]
    raise KeyError(f"{module} has no rank: add its package to RANKS in tests/test_layout.py")


def private_owner(imp: Import) -> str | None:
    """The unit (see :func:`unit_of`) that owns the first private part of what ``imp`` names
    (None: all public).

    ``a.b._c`` (a private module) and ``a.b.c._x`` (a private name of module ``a.b.c``) are both
    owned by package ``a.b``: only the modules of ``a.b`` itself may import them (not those of its
    sub-packages). ``lightning_gtn.evaluate._x`` is owned by ``lightning_gtn.evaluate``."""
    parts = imp.target.split(".") + ([imp.name] if imp.name else [])
    for i, part in enumerate(parts):
        if _private(part):
            owner = ".".join(parts[:i])
            return owner if owner in PACKAGES else unit_of(owner)
    return None


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _listing(lines: list[str]) -> str:
    return "\n  " + "\n  ".join(sorted(set(lines)))


# ----------------------------------------------------------------------------- tests
def test_the_graph_is_read():
    # the reader itself: relative imports resolve to modules, every module has a rank
    assert len(MODULES) > 50
    assert f"{PACKAGE}.losses.ctc" in module_graph()[f"{PACKAGE}.functional"]  # from ..losses.ctc import
    for m in MODULES:
        rank_of(m)


def test_the_reader_sees_every_kind_of_import(tmp_path, monkeypatch):
    source = f"{PACKAGE}.decode.viterbi"
    text = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..wfst import Graph\n"
        "def f():\n    from ..losses import graph\n    import lightning_gtn.kernels.compiled_graphs as b\n"
        "    return b._x, graph\n"
        "class C:\n    def g(self):\n        import importlib\n"
        "        return importlib.import_module('lightning_gtn.align.forced')\n"
    )
    path = tmp_path / "viterbi.py"
    path.write_text(text)
    monkeypatch.setitem(MODULES, source, path)
    got = {(imp.target, imp.name) for imp in imports_of(source)}
    assert got == {
        (f"{PACKAGE}.wfst", "Graph"),
        (f"{PACKAGE}.losses.graph", None),
        (f"{PACKAGE}.kernels.compiled_graphs", None),
        (f"{PACKAGE}.kernels.compiled_graphs", "_x"),
        (f"{PACKAGE}.align.forced", None),
    }


def test_no_module_cycle():
    cycle = find_cycle(module_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_package_cycle():
    cycle = find_cycle(package_graph())
    assert cycle is None, "package-level import cycle: " + " -> ".join(cycle)


def test_no_private_name_of_another_package():
    bad = []
    for imp in ALL_IMPORTS:
        owner = private_owner(imp)
        if owner is not None and unit_of(imp.source) != owner:
            what = imp.target + (f".{imp.name}" if imp.name else "")
            bad.append(f"{imp.where()} imports {what} (private to {owner})")
    assert not bad, "private names taken from another package:" + _listing(bad)


def test_imports_go_down_the_ranks():
    bad = [
        f"{imp.where()} (rank {rank_of(imp.source)}) imports {imp.target} (rank {rank_of(imp.target)})"
        for imp in ALL_IMPORTS
        if rank_of(imp.target) > rank_of(imp.source)
    ]
    assert not bad, "imports of a higher rank:" + _listing(bad)


@pytest.mark.parametrize("low", LOW_PACKAGES)
def test_kernels_and_core_import_nothing_above_them(low):
    bad = [
        f"{imp.where()} imports {imp.target}"
        for imp in ALL_IMPORTS
        if _inside(imp.source, low) and not any(_inside(imp.target, ok) for ok in LOW_ALLOWED)
    ]
    assert not bad, f"{low} imports from above core:" + _listing(bad)


def test_nn_computes_only_through_functional():
    bad = [
        f"{imp.where()} imports {imp.target}"
        for imp in ALL_IMPORTS
        if _inside(imp.source, f"{PACKAGE}.nn") and not any(_inside(imp.target, ok) for ok in NN_ALLOWED)
    ]
    assert not bad, "nn imports computation outside lightning_gtn.functional:" + _listing(bad)


# ----------------------------------------------------------------------------- generic layers
#: The modules above the losses that name no loss: each loss declares its preparation
#: (``StructuredLoss.prepare``), its decoding (``StructuredLoss.decoding``) and the network methods it
#: calls (``network_methods``), and these modules only call that protocol.
GENERIC_MODULES = (
    f"{PACKAGE}.train",
    f"{PACKAGE}.evaluate",
    f"{PACKAGE}.lightning.mixin",
    f"{PACKAGE}.lightning.decoding",
    f"{PACKAGE}.align_cli",
)
#: Words of loss names that are generic (``TargetGraphLoss``, ``SequenceLoss``, ``ModuleLoss``; the
#: word of ``WordPieceRNNTLoss``, which the word error rate shares).
_GENERIC_WORDS = {"loss", "structured", "module", "graph", "target", "sequence", "blank", "multi", "word"}
#: Constructor parameters every loss shares, Python's own names, and ``viterbi`` (the best path every
#: loss decodes, not only the word-piece transducer's method of that name) and ``step`` (what ``set_step`` sets).
_SHARED_PARAMETERS = {"reduction", "zero_infinity", "impl", "args", "kwargs", "module", "viterbi", "step"}


def _words(name: str) -> list[str]:
    """``_resolve_rnnt_lm`` -> ``["resolve", "rnnt", "lm"]``; ``LFMMILoss`` -> ``["lfmmi", "loss"]``."""
    import re

    return [w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", name)]


def _loss_classes() -> set[type]:
    import lightning_gtn.nn as lnn

    def below(c):
        for s in c.__subclasses__():
            yield s
            yield from below(s)

    return {c for c in below(lnn.StructuredLoss) if c.__module__.startswith(f"{PACKAGE}.")}


def loss_specific_names() -> tuple[set[str], set[str], set[str]]:
    """``(names, words, phrases)`` that name a loss or what only some losses have: the loss classes
    of the package; the words of their names and of the packaged loss configs (``conf/loss/*.yaml``);
    the public attributes and constructor parameters of the loss classes that the base
    ``StructuredLoss`` does not declare (``denominator``, ``blank_mode``, ``big_blank_durations``,
    ...), and the stems of the files their preparations write (``word_pieces``), matched as whole
    words or runs of words of an identifier."""
    import inspect

    import torch

    import lightning_gtn.nn as lnn
    from lightning_gtn.lightning.decoding import DECODER_KEYS
    from lightning_gtn.lightning.loss_builder import build_loss, loss_names

    classes = _loss_classes()
    names = {c.__name__ for c in classes}
    # every packaged loss built (its preparation reads these transcripts), for its instance attributes
    texts = ["0123", "98 76", "5 5"]
    built = [build_loss(n, "0123456789 ", texts=lambda key: texts)[0] for n in loss_names()]
    stems = {p.stem for p in (ROOT / "conf" / "loss").glob("*.yaml")}
    words = {w for n in names | stems for w in _words(n)} - _GENERIC_WORDS
    base = set(dir(lnn.StructuredLoss)) | set(vars(torch.nn.Module())) | _SHARED_PARAMETERS
    base |= set(DECODER_KEYS)  # the decoders' own options
    phrases = {a for m in built for a in vars(m)}
    for c in classes:
        phrases |= {a for a in vars(c) if not a.startswith("_")}
        phrases |= set(inspect.signature(c.__init__).parameters) - {"self"}
        phrases |= {Path(f).stem for f in c.run_files}
    phrases = {p for p in phrases - base if not p.startswith("_")}
    return names, words, phrases


def loss_specific_identifiers(module: str) -> list[tuple[int, str]]:
    """``(line, identifier)`` of every identifier of ``module`` (names, attributes, definitions,
    arguments, keywords, imports) that is loss-specific (:func:`loss_specific_names`)."""
    import lightning_gtn.nn as lnn

    names, words, phrases = loss_specific_names()
    protocol = set(dir(lnn.StructuredLoss))  # what every loss declares (frame_transitions) is generic
    out = []
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Name):
            ids = [node.id]
        elif isinstance(node, ast.Attribute):
            ids = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            ids = [node.name]
        elif isinstance(node, ast.arg):
            ids = [node.arg]
        elif isinstance(node, ast.keyword) and node.arg:
            ids = [node.arg]
        elif isinstance(node, ast.alias):
            ids = [node.asname or node.name.rpartition(".")[2]]
        else:
            continue
        for i in ids:
            w = _words(i)
            # attribute phrases are snake_case: matched in snake_case identifiers (not OmegaConf's "omega")
            snake = i == i.lower()
            runs = {"_".join(w[a:b]) for a in range(len(w)) for b in range(a + 1, len(w) + 1)} if snake else set()
            if i not in protocol and (i in names or set(w) & words or runs & phrases):
                out.append((node.lineno, i))
    return out


def test_the_loss_specific_names_are_gathered_from_the_package():
    names, words, phrases = loss_specific_names()
    assert {"LFMMILoss", "TransducerLoss", "RNNTStructuredLoss", "TDTLoss"} <= names
    assert {"mmi", "rnnt", "transducer", "tdt", "multiblank"} <= words
    assert {"denominator", "blank_mode", "big_blank_durations", "joint_loss", "word_pieces"} <= phrases
    assert not {"blank", "tokens", "topology", "network_methods", "prepare", "decoding"} & phrases  # the protocol
    # the counter sees what it should (a module naming losses is counted)
    found = {i for _, i in loss_specific_identifiers(f"{PACKAGE}.nn.mmi")}
    assert "denominator" in found, "nn.mmi names the MMI denominator; the counter must see it"


@pytest.mark.parametrize("module", GENERIC_MODULES)
def test_generic_layers_name_no_loss(module):
    hits = loss_specific_identifiers(module)
    assert not hits, f"{module} names losses:" + _listing([f"line {n}: {i}" for n, i in hits])


# ----------------------------------------------------------------------------- custom ops
def _custom_ops() -> dict[str, tuple[str, ast.FunctionDef]]:
    """``{op name: (module, function)}`` of every ``@torch.library.custom_op("lightning_gtn::...")``."""
    found = {}
    for m, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for d in node.decorator_list:
                if (
                    isinstance(d, ast.Call)
                    and (_dotted(d.func) or [""])[-1] == "custom_op"
                    and d.args
                    and isinstance(d.args[0], ast.Constant)
                ):
                    found[d.args[0].value] = (m, node)
    # ops declared with the low-level API: ``lib.impl("name", function, "CompositeExplicitAutograd")``
    tree_funcs = {}
    for m, path in MODULES.items():
        tree = ast.parse(path.read_text())
        funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and (_dotted(node.func) or [""])[-1] == "impl"
                and len(node.args) == 3
                and all(isinstance(a, ast.Constant) for a in (node.args[0], node.args[2]))
                and node.args[2].value == "CompositeExplicitAutograd"
                and isinstance(node.args[1], ast.Name)
                and node.args[1].id in funcs
            ):
                tree_funcs[f"lightning_gtn::{node.args[0].value}"] = (m, funcs[node.args[1].id])
    found.update(tree_funcs)
    return found


def _autograd_functions(tree: ast.Module) -> set[str]:
    """Names of the functions passed to ``register_autograd`` (backward and setup_context) and
    ``register_fake`` (as a decorator) in a module."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (_dotted(node.func) or [""])[-1] == "register_autograd":
            for arg in list(node.args) + [k.value for k in node.keywords]:
                if isinstance(arg, ast.Name):
                    names.add(arg.id)
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                if (_dotted(d.func if isinstance(d, ast.Call) else d) or [""])[-1] == "register_fake":
                    names.add(node.name)
    return names


def test_every_custom_op_has_one_schema():
    import importlib

    from lightning_gtn import opargs

    ops = _custom_ops()
    assert len(ops) >= 13
    assert "lightning_gtn::kernel_loss" in ops
    for op, (module, fn) in ops.items():
        importlib.import_module(module)  # its op_schema decorator records the schema
        key = f"{module}.{fn.name}"
        assert key in opargs.SCHEMAS, f"{op} ({key}) is not declared with lightning_gtn.opargs.op_schema"
        assert opargs.SCHEMAS[key]._fields == tuple(a.arg for a in fn.args.args), op


def test_no_positional_reads_of_op_arguments():
    # fakes, setup_context and backward functions read the arguments through the op's schema: no
    # inputs[6], no unpacking of inputs, no flat parameter lists
    bad = []
    for m, path in MODULES.items():
        tree = ast.parse(path.read_text())
        names = _autograd_functions(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.FunctionDef) and node.name in names):
                continue
            params = [a.arg for a in node.args.args]
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Subscript)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id in ("inputs", "args")
                ):
                    bad.append(f"{m}:{sub.lineno} {node.name} reads {sub.value.id}[...]")
                if (
                    isinstance(sub, ast.Subscript)
                    and isinstance(sub.value, ast.Attribute)
                    and sub.value.attr == "needs_input_grad"
                ):
                    bad.append(f"{m}:{sub.lineno} {node.name} reads needs_input_grad[...]")
                if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Name) and sub.value.id == "inputs":
                    if any(isinstance(t, (ast.Tuple, ast.List)) for t in sub.targets):
                        bad.append(f"{m}:{sub.lineno} {node.name} unpacks inputs by position")
                if (
                    isinstance(sub, ast.Tuple)
                    and len(sub.elts) > 2
                    and all(isinstance(e, ast.Constant) and e.value is None for e in sub.elts)
                ):
                    bad.append(f"{m}:{sub.lineno} {node.name} returns a tuple of Nones by position")
            if node.args.vararg is None and len(params) > 3 and params[0] != "ctx":
                bad.append(f"{m}:{node.lineno} {node.name} spells out {len(params)} op arguments")
    assert not bad, "positional reads of op arguments:" + _listing(bad)


# ----------------------------------------------------------------------------- drawing
def to_dot() -> str:
    """The package-level graph in Graphviz DOT, one rank per row, edges labelled with the
    number of import statements behind them."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for imp in ALL_IMPORTS:
        a, b = top_package(imp.source), top_package(imp.target)
        if a != b:
            counts[a, b] += 1
    nodes = sorted(package_graph(), key=lambda n: (rank_of(n), n))
    by_rank = defaultdict(list)
    for n in nodes:
        by_rank[rank_of(n)].append(n)
    short = {n: n[len(PACKAGE) + 1 :] or PACKAGE for n in nodes}
    lines = [f'digraph "{PACKAGE}" {{', "  rankdir=BT;", "  node [shape=box, fontname=Helvetica];"]
    for rank, members in sorted(by_rank.items()):
        names = " ".join(f'"{short[n]}";' for n in members)
        lines.append(f"  {{ rank=same; {names} }}  // rank {rank}")
    for (a, b), k in sorted(counts.items()):
        lines.append(f'  "{short[a]}" -> "{short[b]}" [label="{k}"];')
    lines.append("}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(to_dot() + "\n")
