"""``lightning_gtn.wfst``: a WFST engine that speaks GTN's Python API.

``import lightning_gtn.wfst as gtn`` runs code written for the ``gtn`` package:
graphs (:class:`Graph`), the operations on them (compose, intersect, forward_score, ...),
``backward`` for their gradients, the text format, and ``criterion.ctc_loss``.
"""

from . import criterion, cuda, ngram
from .autograd import backward
from .creations import linear_graph, scalar_graph
from .device import CPU, CUDA, Device, DeviceType
from .functions import (
    add,
    clone,
    closure,
    compose,
    concat,
    forward_score,
    intersect,
    negate,
    project_input,
    project_output,
    remove,
    subtract,
    union,
    viterbi_path,
    viterbi_score,
)
from .graph import Graph, epsilon
from .openfst import (
    from_pywrapfst,
    read_fst_text,
    read_symbols,
    to_pywrapfst,
    write_fst_text,
    write_symbols,
)
from .parallel import get_num_threads, parallel_for, parallel_map, set_num_threads
from .rand import rand_equivalent, sample
from .utils import (
    dot_text,
    draw,
    equal,
    graph_from_text,
    graph_to_text,
    isomorphic,
    load,
    loadtxt,
    save,
    savetxt,
    write_dot,
)

__version__ = "0.1.0"

__all__ = [
    "Graph",
    "epsilon",
    "Device",
    "DeviceType",
    "CPU",
    "CUDA",
    "cuda",
    "criterion",
    "ngram",
    "backward",
    "scalar_graph",
    "linear_graph",
    "negate",
    "add",
    "subtract",
    "clone",
    "project_input",
    "project_output",
    "concat",
    "closure",
    "union",
    "intersect",
    "compose",
    "remove",
    "forward_score",
    "viterbi_score",
    "viterbi_path",
    "equal",
    "isomorphic",
    "loadtxt",
    "savetxt",
    "save",
    "load",
    "write_dot",
    "dot_text",
    "draw",
    "graph_to_text",
    "graph_from_text",
    "read_fst_text",
    "write_fst_text",
    "read_symbols",
    "write_symbols",
    "to_pywrapfst",
    "from_pywrapfst",
    "sample",
    "rand_equivalent",
    "parallel_for",
    "parallel_map",
    "set_num_threads",
    "get_num_threads",
]


# -- aliases ------------------------------------------------------------------------------
# Code written for GTN may alias this package as ``gtn`` (``sys.modules["gtn"] = ...``) and
# then ``import gtn.criterion``. Python would load a second copy of the submodule under the
# alias, with its own Graph class; this finder hands out the already loaded submodule.


def _install_alias_finder() -> None:
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import sys

    package = sys.modules[__name__]

    class _Loader(importlib.abc.Loader):
        spec: "importlib.machinery.ModuleSpec | None"  # the real module's spec, set by the finder

        def __init__(self, real: str) -> None:
            self.real = real

        def create_module(self, spec):
            return sys.modules[self.real]

        def exec_module(self, module) -> None:
            module.__spec__ = self.spec  # importlib replaced it with the alias's spec

    class _AliasFinder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            parent, _, child = fullname.rpartition(".")
            if not parent or parent == __name__ or sys.modules.get(parent) is not package:
                return None
            real = f"{__name__}.{child}"
            try:
                module = importlib.import_module(real)
            except ImportError:
                return None
            loader = _Loader(real)
            loader.spec = module.__spec__
            return importlib.util.spec_from_loader(fullname, loader)

    if not any(type(f).__name__ == "_AliasFinder" for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())


_install_alias_finder()
del _install_alias_finder
