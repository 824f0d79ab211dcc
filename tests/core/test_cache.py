"""The two shared containers: the LRU and the weak handle registry."""

import gc
import threading

import pytest

from lightning_gtn.core.cache import LRU, HandleRegistry


class Obj:
    """A weakly referable object."""


def test_lru_builds_once_and_evicts_least_recently_used():
    c = LRU(2)
    calls = []

    def make(v):
        def f():
            calls.append(v)
            return v

        return f

    assert c.get("a", make(1)) == 1
    assert c.get("b", make(2)) == 2
    assert c.get("a", make(99)) == 1  # a hit: not rebuilt, now the most recent
    c.get("c", make(3))  # evicts "b", the least recently used
    assert "b" not in c and "a" in c and "c" in c
    assert calls == [1, 2, 3]
    assert len(c) == 2


def test_lru_get_without_make_and_peek():
    c = LRU(2)
    assert c.get("x") is None
    assert "x" not in c
    c.put("x", 1)
    c.put("y", 2)
    assert c.peek("x") == 1  # does not refresh "x"
    c.put("z", 3)
    assert "x" not in c
    assert c.get("y") == 2  # refreshes "y"
    c.put("w", 4)
    assert "z" not in c and "y" in c


def test_lru_put_refreshes_and_pop_discard():
    c = LRU(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("a", 10)  # replaced and most recent
    c.put("c", 3)
    assert c.peek("a") == 10 and "b" not in c
    assert c.pop("a") == 10 and c.pop("a") is None
    v = object()
    c.put("k", v)
    c.discard("k", object())  # another value: kept
    assert c.peek("k") is v
    c.discard("k", v)
    assert "k" not in c


def test_lru_resize_and_clear():
    c = LRU(4)
    for i in range(4):
        c.put(i, i)
    c.resize(2)
    assert c.maxsize == 2 and len(c) == 2 and 2 in c and 3 in c
    c.resize(3)
    c.put(4, 4)
    assert len(c) == 3
    c.clear()
    assert len(c) == 0
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="maxsize"):
            c.resize(bad)
    with pytest.raises(ValueError, match="maxsize"):
        LRU(0)


def test_lru_threads():
    c = LRU(8)
    errors = []

    def work(seed):
        try:
            for i in range(500):
                k = (seed * 7 + i) % 20
                assert c.get(k, lambda k=k: k * 2) == k * 2
                if i % 50 == 0:
                    c.resize(8 + (i // 50) % 3)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(c) <= c.maxsize


def test_registry_handles_are_distinct_and_die_with_their_object():
    r = HandleRegistry("widget")
    a, b = Obj(), Obj()
    ha, hb = r.register(a), r.register(b)
    assert ha != hb
    assert r.get(ha) is a and r.get(hb) is b
    assert len(r) == 2
    del a
    gc.collect()
    with pytest.raises(RuntimeError, match="no live widget is registered under handle"):
        r.get(ha)
    assert len(r) == 1
    with pytest.raises(RuntimeError, match="no live widget"):
        r.get(12345)
    hc = r.register(Obj())  # sweeps the dead entries; handles are never reused
    assert hc not in (ha, hb)


def test_registry_threads():
    r = HandleRegistry("thing")
    keep = []
    handles = []
    lock = threading.Lock()

    def work():
        mine = [Obj() for _ in range(200)]
        hs = [r.register(o) for o in mine]
        with lock:
            keep.extend(mine)
            handles.extend(hs)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(handles)) == len(handles) == 800
    assert all(r.get(h) is o for h, o in zip(handles, keep))
