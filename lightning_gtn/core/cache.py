"""The two small containers the losses share: a thread-safe LRU and a weak handle registry.

:class:`LRU` bounds every cache of this library (compiled criterion graphs, user graphs,
criteria per configuration, kernel banks); :class:`HandleRegistry` names live Python objects
(criteria held by a module, kernel banks) by integers, which is what a ``torch.library`` custom
op can take as an argument.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict
from typing import Callable, Dict, Generic, Hashable, Optional, TypeVar, overload

__all__ = ["LRU", "HandleRegistry"]

V = TypeVar("V")
T = TypeVar("T")


class LRU(Generic[V]):
    """A dictionary that keeps its ``maxsize`` most recently used entries.

    :meth:`get` builds a missing value with ``make()`` outside the lock (two threads missing the
    same key may both build it; the last one stored wins, both get a valid value), so a slow
    build never blocks readers of other keys. The lock is re-entrant: a weak-reference callback
    that drops an entry (:meth:`discard`) may run, through the garbage collector, while the same
    thread holds it.

    Args:
        maxsize: the number of entries kept (``>= 1``).
    """

    def __init__(self, maxsize: int) -> None:
        self._data: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.RLock()
        self.maxsize = self._check_size(maxsize)

    @staticmethod
    def _check_size(n: int) -> int:
        if isinstance(n, bool) or int(n) != n or int(n) < 1:
            raise ValueError(f"maxsize must be an integer >= 1, got {n!r}")
        return int(n)

    @overload
    def get(self, key: Hashable) -> Optional[V]: ...

    @overload
    def get(self, key: Hashable, make: Callable[[], V]) -> V: ...

    def get(self, key: Hashable, make: Optional[Callable[[], V]] = None) -> Optional[V]:
        """The value of ``key`` (now the most recent entry), built by ``make()`` (and stored) on
        a miss; without ``make`` a miss gives None."""
        with self._lock:
            v = self._data.get(key)
            if v is not None:
                self._data.move_to_end(key)
                return v
        if make is None:
            return None
        v = make()
        self.put(key, v)
        return v

    def peek(self, key: Hashable) -> Optional[V]:
        """The value of ``key`` or None, without taking the lock or refreshing its recency (one
        atomic dictionary read: safe to call from code that ``torch.compile`` traces)."""
        return self._data.get(key)

    def put(self, key: Hashable, value: V) -> None:
        """Stores ``value`` under ``key`` as the most recent entry, dropping the oldest beyond
        ``maxsize``."""
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def pop(self, key: Hashable) -> Optional[V]:
        """Removes ``key``; returns its value or None."""
        with self._lock:
            return self._data.pop(key, None)

    def discard(self, key: Hashable, value: V) -> None:
        """Removes ``key`` only while it still holds ``value`` (the same object): an entry
        replaced meanwhile stays."""
        with self._lock:
            if self._data.get(key) is value:
                del self._data[key]

    def resize(self, maxsize: int) -> None:
        """Sets ``maxsize``, dropping the oldest entries beyond it."""
        n = self._check_size(maxsize)
        with self._lock:
            self.maxsize = n
            while len(self._data) > n:
                self._data.popitem(last=False)

    def clear(self) -> None:
        """Drops every entry."""
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data


class HandleRegistry(Generic[T]):
    """Integer handles for live objects, held weakly: a handle dies with its object.

    Args:
        what: how errors name the objects (``"criterion"``, ``"kernel bank"``).
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._refs: Dict[int, weakref.ref[T]] = {}
        self._lock = threading.Lock()
        self._next = itertools.count(1)

    def register(self, obj: T) -> int:
        """A new handle for ``obj`` (dead entries are swept first)."""
        with self._lock:
            for h, ref in list(self._refs.items()):
                if ref() is None:
                    del self._refs[h]
            h = next(self._next)
            self._refs[h] = weakref.ref(obj)
        return h

    def get(self, handle: int) -> T:
        """The object of ``handle``; RuntimeError when none is alive under it."""
        ref = self._refs.get(int(handle))
        obj = ref() if ref is not None else None
        if obj is None:
            raise RuntimeError(f"no live {self.what} is registered under handle {handle}")
        return obj

    def __len__(self) -> int:
        return sum(1 for r in list(self._refs.values()) if r() is not None)
