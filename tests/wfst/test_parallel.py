"""parallel_for / parallel_map: bounded threads, errors, nesting, fork safety."""

import multiprocessing as mp
import threading
import time

import pytest

import lightning_gtn.wfst as gtn
from lightning_gtn.wfst import parallel


@pytest.fixture
def threads():
    """Sets the pool size for one test and restores the previous setting after it."""
    saved = parallel._num_threads

    def set_threads(n):
        with parallel._lock:  # let an earlier pool's threads finish, so counts are exact
            old, parallel._pool = parallel._pool, None
        if old is not None:
            old.shutdown(wait=True)
        gtn.set_num_threads(n)

    yield set_threads
    with parallel._lock:
        parallel._num_threads = saved
        if parallel._pool is not None:
            parallel._pool.shutdown(wait=True)
            parallel._pool = None


def test_every_index_runs_once(threads):
    threads(3)
    seen = []
    lock = threading.Lock()

    def work(i):
        with lock:
            seen.append(i)

    gtn.parallel_for(work, range(50))
    assert sorted(seen) == list(range(50))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_never_more_threads_than_configured(threads, n):
    threads(n)
    assert gtn.get_num_threads() == n
    lock = threading.Lock()
    running = [0]
    peak = [0]
    idents = set()

    def work(i):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            idents.add(threading.get_ident())
        time.sleep(0.002)  # overlap the calls, so that extra threads would show
        with lock:
            running[0] -= 1

    gtn.parallel_for(work, range(40))
    assert peak[0] <= n and len(idents) <= n
    pool_threads = [t for t in threading.enumerate() if t.name.startswith("gtn")]
    assert len(pool_threads) <= n


def test_results_come_back_in_order_and_short_lists_broadcast(threads):
    threads(2)
    assert gtn.parallel_map(lambda a, b: a * b, [1, 2, 3, 4], [10]) == [10, 20, 30, 40]
    assert gtn.parallel_map(lambda a: a, []) == []
    with pytest.raises(ValueError, match="expected 1 or 3"):
        gtn.parallel_map(lambda a, b: a, [1, 2, 3], [1, 2])


def test_exceptions_propagate_after_every_call_ran(threads):
    threads(2)
    done = []

    def work(i):
        if i in (3, 7):
            raise KeyError(f"item {i}")
        done.append(i)

    with pytest.raises(KeyError, match="item 3"):  # the first failure, in item order
        gtn.parallel_for(work, range(10))
    assert sorted(done) == [0, 1, 2, 4, 5, 6, 8, 9]
    with pytest.raises(TypeError, match="callable"):
        gtn.parallel_for(None, range(3))


def test_the_last_chunk_runs_on_the_calling_thread_and_its_error_comes_last(threads):
    threads(2)
    where = {}

    def work(i):
        where[i] = threading.get_ident()
        if i in bad:
            raise KeyError(f"item {i}")
        return i

    bad = ()
    assert gtn.parallel_map(work, list(range(6))) == list(range(6))
    assert {where[i] for i in (3, 4, 5)} == {threading.get_ident()}
    assert threading.get_ident() not in {where[i] for i in (0, 1, 2)}
    bad = (5,)  # only the caller's chunk fails
    with pytest.raises(KeyError, match="item 5"):
        gtn.parallel_map(work, list(range(6)))
    bad = (1, 4)  # both fail: the earlier item's error
    with pytest.raises(KeyError, match="item 1"):
        gtn.parallel_map(work, list(range(6)))


def test_nested_calls_do_not_deadlock(threads):
    threads(2)
    out = {}

    def inner(i, j):
        out[(i, j)] = i * j

    def outer(i):
        gtn.parallel_for(lambda j: inner(i, j), range(5))

    runner = threading.Thread(target=gtn.parallel_for, args=(outer, range(6)), daemon=True)
    runner.start()
    runner.join(timeout=60)
    assert not runner.is_alive(), "nested parallel_for deadlocked"
    assert out == {(i, j): i * j for i in range(6) for j in range(5)}


def test_graph_operations_in_parallel_match_serial_ones(threads):
    threads(2)
    inputs1 = [gtn.scalar_graph(k) for k in (1.0, 2.0, 3.0)]
    inputs2 = [gtn.scalar_graph(k) for k in (4.0, 5.0, 6.0)]
    out = [None] * 3

    def process(b):
        out[b] = gtn.add(gtn.add(inputs1[b], inputs1[b]), gtn.negate(inputs2[b]))

    gtn.parallel_for(process, range(3))
    assert [o.item() for o in out] == [-2.0, -1.0, 0.0]
    gtn.backward(out)
    assert [g.grad().item() for g in inputs1] == [2.0] * 3
    assert [g.grad().item() for g in inputs2] == [-1.0] * 3


def test_thread_count_settings(threads, monkeypatch):
    with pytest.raises(ValueError, match="n must be >= 1"):
        gtn.set_num_threads(0)
    monkeypatch.setattr(parallel, "_num_threads", None)
    monkeypatch.setenv("LIGHTNING_GTN_NUM_THREADS", "3")
    assert gtn.get_num_threads() == 3
    monkeypatch.delenv("LIGHTNING_GTN_NUM_THREADS")
    assert 1 <= gtn.get_num_threads() <= 4


def _child_job(queue):
    try:
        res = gtn.parallel_map(lambda i: i * i, list(range(20)))
        queue.put(("ok", res, gtn.get_num_threads()))
    except BaseException as e:  # report, do not hang the parent
        queue.put(("error", repr(e), None))


def test_works_in_a_forked_child(threads):
    threads(2)
    gtn.parallel_for(lambda i: None, range(8))  # the parent's pool is up and running
    assert parallel._pool is not None
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_job, args=(queue,))
    child.start()
    status, res, n = queue.get(timeout=60)
    child.join(timeout=60)
    assert status == "ok", res
    assert res == [i * i for i in range(20)] and n == 2
    assert child.exitcode == 0


@pytest.mark.parametrize("n", [10**6, parallel.MAX_THREADS + 1, 2.5, "4", True, -3])
def test_set_num_threads_refuses_what_the_pool_cannot_start(n):
    # Finding 16 of the second probe: 10**6 was accepted and parallel_for then failed.
    before = gtn.get_num_threads()
    with pytest.raises(ValueError, match=r"set_num_threads\(n\): n must be .*at most 1024"):
        gtn.set_num_threads(n)
    assert gtn.get_num_threads() == before
    out = [0, 0, 0]

    def work(i):
        out[i] = i * 2

    gtn.parallel_for(work, range(3))
    assert out == [0, 2, 4]


def test_thread_count_from_the_environment_is_checked(monkeypatch):
    monkeypatch.setattr(parallel, "_num_threads", None)
    monkeypatch.setenv("LIGHTNING_GTN_NUM_THREADS", "1000000")
    with pytest.raises(ValueError, match="LIGHTNING_GTN_NUM_THREADS"):
        gtn.get_num_threads()
    monkeypatch.setenv("LIGHTNING_GTN_NUM_THREADS", "3")
    assert gtn.get_num_threads() == 3
