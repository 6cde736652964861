"""memfabric's Python package against pymemcache, on the same servers.

Every pymemcache-shaped call runs on ``memfabric.Client`` and on ``pymemcache``'s Client
with the same arguments, and must return the same (memcached and memfabricd; memfabric
reaches memfabricd over UCX). Then what pymemcache has no equivalent for: the non-blocking
iset/iget/wait, one-sided GETs, HashClient placed as libmemcached places keys, the asyncio
client, typed exceptions, and the GIL released while a request waits.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import memfabric
import pylibmc
import pytest
from pymemcache.client.base import Client as PymemcacheClient
from pymemcache.client.hash import HashClient as PymemcacheHashClient
from pymemcache import serde as pymemcache_serde


def _both(server, **kw):
    host, port = server.addr
    ours = memfabric.Client((host, port), **kw)
    theirs = PymemcacheClient((host, port), **kw)
    return ours, theirs


@pytest.fixture
def pair(server):
    ours, theirs = _both(server)
    yield ours, theirs
    ours.close()
    theirs.close()


def test_pymemcache_calls_answer_the_same(server, pair):
    ours, theirs = pair
    # Each step runs on a fresh key space per client, so neither sees the other's keys.
    def steps(c, p):
        out = []
        out.append(c.set(p + "a", b"1"))
        out.append(c.set(p + "a", b"1", noreply=False))
        out.append(c.get(p + "a"))
        out.append(c.get(p + "missing"))
        out.append(c.get(p + "missing", default=b"d"))
        out.append(c.add(p + "a", b"2", noreply=False))
        out.append(c.add(p + "b", b"2", noreply=False))
        out.append(c.replace(p + "nope", b"x", noreply=False))
        out.append(c.replace(p + "b", b"3", noreply=False))
        out.append(c.append(p + "b", b"-end", noreply=False))
        out.append(c.prepend(p + "b", b"start-", noreply=False))
        out.append(c.append(p + "nope", b"x", noreply=False))
        out.append(c.get(p + "b"))
        value, token = c.gets(p + "b")
        out.append(value)
        out.append(c.cas(p + "b", b"new", token))
        out.append(c.cas(p + "b", b"again", token))
        out.append(c.cas(p + "gone", b"x", 1))
        out.append(c.gets(p + "missing"))
        out.append(c.set(p + "n", b"10", noreply=False))
        out.append(c.incr(p + "n", 5))
        out.append(c.decr(p + "n", 100))
        out.append(c.incr(p + "nokey", 1))
        out.append(c.incr(p + "n", 1, noreply=True))
        out.append(c.get(p + "n"))
        out.append(c.touch(p + "n", 100, noreply=False))
        out.append(c.touch(p + "nope", 100, noreply=False))
        out.append(c.delete(p + "a", noreply=False))
        out.append(c.delete(p + "a", noreply=False))
        out.append(c.delete(p + "b"))
        out.append(c.set_many({p + f"m{i}": str(i).encode() for i in range(20)}, noreply=False))
        got = c.get_many([p + f"m{i}" for i in range(25)])
        out.append(sorted((k[len(p):], v) for k, v in got.items()))
        out.append(c.delete_many([p + "m0", p + "m1"], noreply=False))
        out.append(sorted(k[len(p):] for k in c.get_many([p + "m0", p + "m2"])))
        out.append(c.set(p + "exp", b"x", expire=-1, noreply=False))
        out.append(c.get(p + "exp"))
        out.append(c.set(p + "k" * 200, b"long", noreply=False))
        out.append(c.get(p + "k" * 200))
        out.append(c.set(p + "e", b"", noreply=False))
        out.append(c.get(p + "e"))
        out.append(c.set(p + "i", 42, noreply=False))
        out.append(c.get(p + "i"))
        return out

    assert steps(ours, "ours:") == steps(theirs, "theirs:")
    assert ours.version() == theirs.version()
    # get-and-touch, which pymemcache 4.0 lacks.
    assert ours.gat("ours:m2", 100) == b"2"
    assert ours.gats("ours:m3", 100)[0] == b"3"
    assert ours.gat("ours:missing", 100, default=b"d") == b"d"
    assert set(ours.stats()) >= {b"curr_items", b"get_hits", b"pid"}
    if server.kind == "memfabricd":
        assert ours.over_ucx() is True
    else:
        assert ours.over_ucx() is False


def test_serde_is_pymemcaches(server):
    host, port = server.addr
    ours = memfabric.Client((host, port), serde=memfabric.pickle_serde, default_noreply=False)
    # Both wait for their writes: the other client reads them on another connection.
    theirs = PymemcacheClient((host, port), serde=pymemcache_serde.pickle_serde,
                              default_noreply=False)
    values = {"b": b"bytes", "s": "text", "i": 42, "o": {"a": [1, 2]}, "t": (1, "x")}
    for k, v in values.items():
        assert ours.set("o:" + k, v) is True
        assert theirs.set("t:" + k, v) is True
    for k, v in values.items():
        # Each reads what the other wrote: the flags mean the same.
        assert ours.get("t:" + k) == v
        assert theirs.get("o:" + k) == v
    ours.close()
    theirs.close()


def test_errors_are_typed(server):
    host, port = server.addr
    c = memfabric.Client((host, port), default_noreply=False)
    with pytest.raises(memfabric.MemcacheIllegalInputError):
        c.set("bad key", b"x")
    with pytest.raises(memfabric.MemcacheIllegalInputError):
        c.get("k" * 251)
    with pytest.raises(memfabric.MemcacheServerError):
        c.set("huge", b"x" * (2 * 1024 * 1024))
    assert c.set("after", b"ok") is True
    c.set("s", b"abc")
    with pytest.raises(memfabric.MemcacheClientError):
        c.incr("s", 1)
    with pytest.raises(memfabric.MemcacheIllegalInputError):
        c.set("obj", object())
    assert issubclass(memfabric.MemcacheTimeoutError, memfabric.MemcacheError)
    down = memfabric.Client(("127.0.0.1", 1), transport="tcp", default_noreply=False)
    with pytest.raises(memfabric.MemcacheUnexpectedCloseError):
        down.get("k")
    ignoring = memfabric.Client(("127.0.0.1", 1), transport="tcp", ignore_exc=True)
    assert ignoring.get("k", default=b"fallback") == b"fallback"
    c.close()


def test_arguments_are_pymemcaches_and_what_cannot_be_honoured_is_refused(server):
    """Every pymemcache argument is taken; tls_context and hasher, which this package
    cannot honour, are refused rather than ignored (a client asked for TLS must never talk
    in the clear); an unknown argument is a TypeError, as in pymemcache itself. Before,
    every unknown argument was ignored silently."""
    import inspect
    import ssl

    from pymemcache.client.base import PooledClient

    host, port = server.addr
    # HashClient hands its keyword arguments to Client's.
    taken = set(inspect.signature(memfabric.Client.__init__).parameters)
    for theirs in (PymemcacheClient, PooledClient, PymemcacheHashClient):
        names = set(inspect.signature(theirs.__init__).parameters) - {"self", "server", "servers"}
        assert names <= taken, f"{theirs.__name__}: {sorted(names - taken)} not taken"
    quiet = memfabric.HashClient([(host, port)], socket_keepalive=None, max_pool_size=4,
                                 use_pooling=True, retry_attempts=3, retry_timeout=1,
                                 dead_timeout=30, default_noreply=False)
    assert quiet.set("args", b"ok") is True and quiet.get("args") == b"ok"
    quiet.close()
    with pytest.raises(memfabric.MemcacheNotSupportedError, match="TLS"):
        memfabric.Client((host, port), tls_context=ssl.create_default_context())
    with pytest.raises(memfabric.MemcacheNotSupportedError, match="ketama"):
        memfabric.HashClient([(host, port)], hasher=object)
    for bad in ({"replicas": 2}, {"ec": "4+2"}, {"tls": True}):
        with pytest.raises(TypeError):
            memfabric.HashClient([(host, port)], **bad)
        with pytest.raises(TypeError):
            PymemcacheHashClient([(host, port)], **bad)
    with pytest.raises(memfabric.MemcacheNotSupportedError, match="conn_args"):
        memfabric.AsyncClient(host, port, conn_args={"ssl": ssl.create_default_context()})
    with pytest.raises(TypeError):
        memfabric.AsyncClient(host, port, replicas=2)
    memfabric.AsyncClient(host, port, pool_size=4, pool_minsize=1)


def test_requests_in_flight(server):
    host, port = server.addr
    c = memfabric.Client((host, port), serde=memfabric.pickle_serde)
    sets = [c.iset(f"nb{i}", {"i": i}) for i in range(300)]
    assert c.wait(sets) == [True] * 300
    gets = [c.iget(f"nb{i}") for i in range(0, 320, 2)]
    results = c.wait(gets, timeout=5)
    assert results == [{"i": i} if i < 300 else None for i in range(0, 320, 2)]
    r = c.iget("nb7")
    assert r.wait() == {"i": 7}
    assert r.test() is True
    assert c.set_many({f"sm{i}": b"v" for i in range(100)}) == []
    c.close()


def test_one_sided_gets(servers):
    srv = servers("memfabricd")
    c = memfabric.Client(srv.addr, get_mode="one-sided", transport="ucx", default_noreply=False)
    for i in range(50):
        assert c.set(f"os{i}", f"value {i}".encode()) is True
    assert [c.get(f"os{i}") for i in range(50)] == [f"value {i}".encode() for i in range(50)]
    assert c.get("os-missing") is None
    assert c.over_ucx() is True
    c.close()


def test_hash_client_places_keys_as_libmemcached(servers):
    a, b, d = servers("memcached"), servers("memcached"), servers("memcached")
    addrs = [a.addr, b.addr, d.addr]
    ours = memfabric.HashClient(addrs, default_noreply=False)
    keys = [f"placed:{i}" for i in range(200)]
    for k in keys:
        assert ours.set(k, b"v") is True
    theirs = pylibmc.Client([f"{h}:{p}" for h, p in addrs],
                            behaviors={"ketama_weighted": True})
    # libmemcached's weighted ketama finds every key where memfabric put it.
    assert theirs.get_multi(keys) == {k: b"v" for k in keys}
    per_server = [len(memfabric.Client(s, default_noreply=False).get_many(keys)) for s in addrs]
    assert sum(per_server) == len(keys) and min(per_server) > 0, per_server
    ours.close()


def test_async_client(server):
    host, port = server.addr

    async def main():
        c = memfabric.AsyncClient(host, port)
        assert await c.set(b"ak", b"v1") is True
        assert await c.get(b"ak") == b"v1"
        assert await c.get(b"nope") is None
        assert await c.add(b"ak", b"x") is False
        value, token = await c.gets(b"ak")
        assert await c.cas(b"ak", b"v2", token) is True
        assert await c.cas(b"ak", b"v3", token) is False
        assert await c.multi_get(b"ak", b"nope") == (b"v2", None)
        assert await c.set(b"ac", b"5") is True
        assert await c.incr(b"ac", 3) == 8
        assert await c.decr(b"ac") == 7
        assert await c.touch(b"ac", 100) is True
        assert await c.delete(b"ac") is True
        assert await c.delete(b"ac") is False
        assert (await c.version()).startswith(b"1.")
        assert b"curr_items" in await c.stats()
        # Many at once: the loop runs while requests are on the network.
        results = await asyncio.gather(*(c.set(f"g{i}".encode(), b"x") for i in range(50)))
        assert results == [True] * 50
        await c.flush_all()
        assert await c.get(b"ak") is None
        await c.close()

    asyncio.run(main())


def test_the_gil_is_released_while_a_request_waits(servers):
    srv = servers("memfabricd")
    # Two-sided GETs need the server to answer (a one-sided one reads its memory even
    # while it is stopped).
    c = memfabric.Client(srv.addr, timeout=1.0, default_noreply=False, get_mode="two-sided")
    ready, stopped, done = threading.Event(), threading.Event(), threading.Event()
    outcome = []

    def waiter():
        try:
            assert c.set("g", b"v") is True  # this thread's connection, made while it answers
            ready.set()
            stopped.wait()
            outcome.append(c.get("g"))
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            outcome.append(e)
        finally:
            ready.set()
            done.set()

    t = threading.Thread(target=waiter)
    t.start()
    ready.wait(10)
    os.kill(srv.proc.pid, signal.SIGSTOP)
    progress = 0
    try:
        stopped.set()
        while not done.is_set():
            progress += 1  # runs only while the waiting call has let go of the GIL
        t.join()
    finally:
        os.kill(srv.proc.pid, signal.SIGCONT)
    assert len(outcome) == 1 and isinstance(outcome[0], memfabric.MemcacheTimeoutError), outcome
    assert progress > 10_000, progress
    # The client's own thread goes on (its connection was never used by the other).
    assert c.get("g") == b"v"


def test_a_coded_value_is_never_returned_as_one_fragment(servers):
    # Six servers; the `memfabric` CLI writes a 100 KB value erasure coded 4+2, so each
    # server holds one fragment (a header and a quarter of the value). The Python
    # package's pools reach servers one by one (libmemfabric's per-server clients) and
    # cannot rebuild the value: a read is an error, never a fragment's bytes as the value.
    # The CLI's plain get rebuilds it from the same six.
    import subprocess
    from test_ketama import memfabric_path

    six = [servers("memfabricd") for _ in range(6)]
    listed = ",".join(s.hostport for s in six)
    value = bytes((i * 7 + i // 251) % 256 for i in range(100_000))
    w = subprocess.run([memfabric_path(), "--servers", listed, "--ec", "4+2", "set", "coded", "-"],
                       input=value, capture_output=True, timeout=30)
    assert w.returncode == 0, w.stderr
    r = subprocess.run([memfabric_path(), "--servers", listed, "get", "coded"],
                       capture_output=True, timeout=30)
    assert (r.returncode, r.stdout == value) == (0, True), r.stderr
    pool = memfabric.HashClient([s.addr for s in six], default_noreply=False)
    # The message names the code, so the reader knows which pool reads it whole.
    with pytest.raises(memfabric.MemcacheError, match=r"RS\(4,2\)"):
        pool.get("coded")
    for s in six:
        one = memfabric.Client(s.addr, default_noreply=False)
        with pytest.raises(memfabric.MemcacheError, match=r"RS\(4,2\)"):
            one.get("coded")
        one.close()
    pool.close()
