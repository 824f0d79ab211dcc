"""Timing several calls in turn, each after a pause (the benchmarks that compare two calls).

The calls run one after the other, round after round, so a change of the machine's load hits them
alike; each is preceded by a pause of :data:`QUIESCE` seconds: torch's OpenMP workers spin-wait for
milliseconds after a parallel region (``OMP_WAIT_POLICY`` unset), and on two cores a spinning
thread halves whatever runs next on two threads, so without the pause a call would pay for its
predecessor's threads.
"""

from __future__ import annotations

import time
from typing import Callable, List, Sequence, Tuple

#: seconds of pause before each timed call
QUIESCE = 0.05


def times_in_turn(fns: Sequence[Callable[[], object]], repeats: int) -> List[List[Tuple[float, float]]]:
    """Per function of ``fns``, its ``repeats`` ``(wall, process CPU of all threads)`` times in
    seconds, the functions called in turn, each after a pause of :data:`QUIESCE` seconds."""
    out: List[List[Tuple[float, float]]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            time.sleep(QUIESCE)
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            out[i].append((time.perf_counter() - t0, time.process_time() - c0))
    return out
