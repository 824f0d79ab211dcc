"""Output arrays handed out again once nobody holds them: no fresh pages per call.

A kernel that returns a ``(B, T, C)`` gradient allocates it at every call, and a large allocation
comes from fresh pages, each faulted in at its first write. Where that is dear (microseconds per
page on a virtual machine: milliseconds for the megabytes of a gradient, as long as the kernel
itself on a small graph), :class:`BufferPool` keeps the arrays it handed out and hands one out
again when only the pool still refers to it: the tensor made from it (``torch.from_numpy``), and
every view of it, hold a reference, so an array is reused only after all of them are gone
(CPython's reference count, read with :func:`sys.getrefcount`; an interpreter that counts
differently only makes the pool allocate more). The pool keeps at most ``keep_bytes`` of arrays;
larger requests are plain allocations.
"""

from __future__ import annotations

import sys
import threading
from typing import List, Tuple

import numpy as np

__all__ = ["BufferPool", "OUTPUTS"]

# references to a free array while :meth:`BufferPool.empty` looks at it: the pool's list, the loop
# variable, and getrefcount's own argument
_FREE_REFS = 3


class BufferPool:
    """Arrays of any shape and dtype, reused once only the pool holds them.

    Args:
        keep_bytes: the most bytes of arrays the pool keeps between calls.
        max_arrays: the most arrays it keeps.
    """

    def __init__(self, keep_bytes: int, max_arrays: int = 8) -> None:
        self.keep_bytes = int(keep_bytes)
        self.max_arrays = int(max_arrays)
        self._arrays: List[np.ndarray] = []
        self._lock = threading.Lock()

    def empty(self, shape: Tuple[int, ...], dtype) -> np.ndarray:
        """An uninitialised array of ``shape`` and ``dtype``: one the pool handed out before and
        that nobody holds any more, else a new one (kept by the pool while it has room)."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64))
        with self._lock:
            for a in self._arrays:
                if a.dtype == dt and a.size == n and sys.getrefcount(a) <= _FREE_REFS:
                    return a.reshape(shape)  # the view refers to ``a``: busy until it is gone
            a = np.empty(n, dtype=dt)
            if a.nbytes <= self.keep_bytes:
                self._make_room(a.nbytes)
                if len(self._arrays) < self.max_arrays:
                    self._arrays.append(a)
            return a.reshape(shape)

    def _make_room(self, nbytes: int) -> None:
        """Forgets free arrays, oldest first, until ``nbytes`` more fit (busy ones stay: their
        holders free them)."""
        kept = sum(a.nbytes for a in self._arrays)
        i = 0
        while (kept + nbytes > self.keep_bytes or len(self._arrays) >= self.max_arrays) and i < len(self._arrays):
            a = self._arrays[i]
            if sys.getrefcount(a) <= _FREE_REFS:
                kept -= a.nbytes
                del self._arrays[i]
            else:
                i += 1
            del a

    def clear(self) -> None:
        """Forgets every array (the ones still in use live on with their holders)."""
        with self._lock:
            self._arrays.clear()

    @property
    def kept_bytes(self) -> int:
        """Bytes of the arrays the pool refers to now."""
        with self._lock:
            return sum(a.nbytes for a in self._arrays)


#: the pool of the kernels' CPU outputs (gradients with respect to the emissions)
OUTPUTS = BufferPool(128 << 20)
