"""``lightning_gtn.wfst``: a WFST engine that speaks GTN's Python API.

``import lightning_gtn.wfst as gtn`` runs code written for the ``gtn`` package:
graphs (:class:`Graph`), the operations on them (compose, intersect, forward_score, ...),
``backward`` for their gradients, the text format, and ``criterion.ctc_loss``.
"""

from . import criterion, cuda
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
from .parallel import get_num_threads, parallel_for, parallel_map, set_num_threads
from .rand import rand_equivalent, sample
from .utils import draw, equal, isomorphic, load, loadtxt, save, savetxt, write_dot

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
    "draw",
    "sample",
    "rand_equivalent",
    "parallel_for",
    "parallel_map",
    "set_num_threads",
    "get_num_threads",
]
