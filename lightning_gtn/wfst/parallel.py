"""``parallel_for`` and the bounded thread pool behind the engine's list overloads.

GTN starts one thread per core in every process; under DDP that is ranks x cores
threads fighting for the same cores. Here the pool is bounded (``set_num_threads``, or
the ``LIGHTNING_GTN_NUM_THREADS`` environment variable; default ``min(4, cores)``), it is
created lazily in each process (so forked and spawned DDP ranks each get their own), and a
``parallel_for`` called from inside a worker runs its loop inline instead of deadlocking.
The compiled kernels release the GIL, so graph operations run truly in parallel.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Iterable, List, Optional, Sequence

_lock = threading.Lock()
_pool: Optional[ThreadPoolExecutor] = None
_pool_pid: Optional[int] = None
_num_threads: Optional[int] = None
_local = threading.local()
#: the machine's cores, read once (os.cpu_count costs tens of microseconds here, at every kernel call)
_CPUS = os.cpu_count() or 1


def _default_threads() -> int:
    env = os.environ.get("LIGHTNING_GTN_NUM_THREADS")
    if env:
        try:
            return _check_threads(int(env.strip()), "LIGHTNING_GTN_NUM_THREADS")
        except ValueError:
            raise ValueError(
                f"LIGHTNING_GTN_NUM_THREADS must be an integer >= 1 and at most {MAX_THREADS}, got {env!r}"
            ) from None
    return max(1, min(4, _CPUS))


def get_num_threads() -> int:
    """The number of worker threads ``parallel_for`` uses in this process."""
    return _num_threads or _default_threads()


#: The most worker threads ``set_num_threads`` (or ``LIGHTNING_GTN_NUM_THREADS``) may ask for.
MAX_THREADS = 1024


def _check_threads(n, where: str) -> int:
    if isinstance(n, bool) or not hasattr(n, "__index__"):
        raise ValueError(f"{where}: n must be an integer >= 1 and at most {MAX_THREADS}, got {n!r}")
    n = int(n.__index__())
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(f"{where}: n must be >= 1 and at most {MAX_THREADS} (MAX_THREADS), got {n}")
    return n


def set_num_threads(n: int) -> None:
    """Bounds the worker threads of ``parallel_for`` in this process (``1 <= n <=``
    :data:`MAX_THREADS`; ValueError otherwise)."""
    global _num_threads, _pool
    n = _check_threads(n, "set_num_threads(n)")
    with _lock:
        _num_threads = int(n)
        if _pool is not None:
            _pool.shutdown(wait=False)
            _pool = None


def _get_pool() -> ThreadPoolExecutor:
    global _pool, _pool_pid
    with _lock:
        if _pool is None or _pool_pid != os.getpid():  # a forked child must not reuse the parent's
            _pool = ThreadPoolExecutor(
                max_workers=get_num_threads(), thread_name_prefix="gtn", initializer=_mark_worker
            )
            _pool_pid = os.getpid()
        return _pool


def _mark_worker() -> None:
    _local.worker = True


def _after_fork_in_child() -> None:
    # The parent's pool threads do not exist in a forked child, and its lock may have
    # been held by one of them at the fork: start afresh (the pool is made on first use).
    global _lock, _pool, _pool_pid, _local
    _lock = threading.Lock()
    _pool = None
    _pool_pid = None
    _local = threading.local()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _run_chunk(function: Callable, items: Sequence) -> list:
    # Every item runs even when an earlier one fails; the first failure is raised after.
    out = []
    error: Optional[BaseException] = None
    for it in items:
        try:
            out.append(function(*it))
        except BaseException as e:  # noqa: BLE001 - re-raised below
            if error is None:
                error = e
            out.append(None)
    if error is not None:
        raise error
    return out


def parallel_map(function: Callable, *arg_lists: Sequence) -> List:
    """Calls ``function(a[i], b[i], ...)`` for each i on the pool; returns the results in order.

    Lists of length one are broadcast against longer ones (as GTN's ``parallelMap``).
    Every call runs; the first exception raised (in item order) is re-raised here.
    """
    lists = [list(a) for a in arg_lists]
    n = max((len(a) for a in lists), default=0)
    for k, a in enumerate(lists):
        if len(a) not in (1, n):
            raise ValueError(f"argument list {k} has {len(a)} items; expected 1 or {n}")
    items = [tuple(a[i] if len(a) == n else a[0] for a in lists) for i in range(n)]
    threads = get_num_threads()
    if n <= 1 or threads == 1 or getattr(_local, "worker", False):
        return _run_chunk(function, items)
    pool = _get_pool()
    chunks = min(threads, n)
    bounds = [round(i * n / chunks) for i in range(chunks + 1)]
    # the last chunk runs on the calling thread, which would otherwise only wait (one hand-off less)
    futures = [pool.submit(_run_chunk, function, items[bounds[i] : bounds[i + 1]]) for i in range(chunks - 1)]
    error: Optional[BaseException] = None
    try:
        last = _run_chunk(function, items[bounds[-2] : bounds[-1]])
    except BaseException as e:  # noqa: BLE001 - re-raised after the earlier chunks' errors
        error, last = e, []
    wait(futures)
    out: List = []
    for f in futures:
        out.extend(f.result())  # raises the first failure of the earlier chunks, in item order
    if error is not None:
        raise error
    out.extend(last)
    return out


def parallel_for(function: Callable[[int], None], ints: Iterable[int]) -> None:
    """Calls ``function(i)`` for every ``i`` in ``ints``, on a bounded pool of threads.

    At most :func:`get_num_threads` threads run the calls; a ``parallel_for`` inside
    ``function`` runs its loop in the calling worker (no deadlock). The first exception
    raised by a call is re-raised here, after all calls have finished.
    """
    if not callable(function):
        raise TypeError(f"function must be callable, got {type(function).__name__}")
    parallel_map(function, list(ints))
