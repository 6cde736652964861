"""memfabric's Python client: memcached over TCP, and over UCX to memfabricd (with one-sided
GETs from the server's memory), through memfabric's native client.

- ``Client`` / ``HashClient``: shaped like pymemcache's (same methods, arguments, return
  values and ``serde`` hooks, ``default_noreply``), for one server / a pool placed with
  libmemcached's weighted ketama (so pylibmc and PHP clients of the same fleet agree).
- ``AsyncClient``: shaped like aiomcache's, for asyncio.
- Non-blocking requests: ``Client.iset`` / ``Client.iget`` return a ``Request``;
  ``Client.wait(requests)`` completes many at once.
- Errors are typed (``MemcacheError`` and its subclasses, pymemcache's names).
- The GIL is released while a request is on the network.
- A client may be used from any thread: each thread gets its own connections (a native
  pool belongs to the thread that made it); a ``Request`` is completed on the thread that
  issued it.

The transport: ``transport="auto"`` (default) asks each server whether it offers UCX
(memfabricd does) and uses it, else TCP; "ucx" requires it, "tcp" never asks. UCX_TLS in
the environment chooses UCX's transports. See docs/python.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import pickle
import threading
from typing import Any, Iterable

from ._native import (
    MemcacheClientError,
    MemcacheError,
    MemcacheIllegalInputError,
    MemcacheNotSupportedError,
    MemcacheServerError,
    MemcacheTimeoutError,
    MemcacheUnexpectedCloseError,
    NativePool,
)

__all__ = [
    "AsyncClient",
    "Client",
    "HashClient",
    "MemcacheClientError",
    "MemcacheError",
    "MemcacheIllegalInputError",
    "MemcacheNotSupportedError",
    "MemcacheServerError",
    "MemcacheTimeoutError",
    "MemcacheUnexpectedCloseError",
    "PickleSerde",
    "Request",
    "pickle_serde",
]

# pymemcache's flags, so values are readable by either library.
FLAG_BYTES = 0
FLAG_PICKLE = 1 << 0
FLAG_INTEGER = 1 << 1
FLAG_LONG = 1 << 2
FLAG_COMPRESSED = 1 << 3
FLAG_TEXT = 1 << 4


class PickleSerde:
    """pymemcache's ``pickle_serde``: bytes as they are, str as UTF-8, int as digits,
    anything else pickled; each marked in the flags."""

    def __init__(self, pickle_version: int = pickle.DEFAULT_PROTOCOL):
        self._version = pickle_version

    def serialize(self, key, value):
        if isinstance(value, bytes):
            return value, FLAG_BYTES
        if isinstance(value, str):
            return value.encode("utf8"), FLAG_TEXT
        if isinstance(value, bool):
            return pickle.dumps(value, self._version), FLAG_PICKLE
        if isinstance(value, int):
            return str(value).encode("ascii"), FLAG_INTEGER
        return pickle.dumps(value, self._version), FLAG_PICKLE

    def deserialize(self, key, value, flags):
        if flags == FLAG_BYTES:
            return value
        if flags & FLAG_TEXT:
            return value.decode("utf8")
        if flags & (FLAG_INTEGER | FLAG_LONG):
            return int(value)
        if flags & FLAG_PICKLE:
            return pickle.loads(value)
        return value


pickle_serde = PickleSerde()


class _RawSerde:
    """No serde (pymemcache's default): bytes, str (UTF-8) and int stored as they are;
    values come back as bytes."""

    def serialize(self, key, value):
        if isinstance(value, bytes):
            return value, 0
        if isinstance(value, str):
            return value.encode("utf8"), 0
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value).encode("ascii"), 0
        raise MemcacheIllegalInputError(
            f"value of type {type(value).__name__}: give the client a serde to store it")

    def deserialize(self, key, value, flags):
        return value


def _server(s) -> tuple[str, int, int]:
    """(host, port[, weight]) or "host:port[:weight]" as (host, port, weight)."""
    if isinstance(s, (tuple, list)):
        host, port = s[0], int(s[1])
        return host, port, int(s[2]) if len(s) > 2 else 1
    text = str(s)
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        parts = rest.lstrip(":").split(":") if rest else []
    else:
        host, *parts = text.split(":")
    port = int(parts[0]) if parts and parts[0] else 11211
    weight = int(parts[1]) if len(parts) > 1 else 1
    return host, port, weight


def _ms(seconds) -> int:
    return -1 if seconds is None else max(1, int(seconds * 1000))


class Request:
    """A request issued without waiting (``iset``, ``iget``), completed on the thread that
    issued it."""

    __slots__ = ("_client", "_pool", "_id", "_key", "_kind", "_done", "_result")

    def __init__(self, client, rid, key, kind):
        self._client, self._id, self._key, self._kind = client, rid, key, kind
        self._pool = client._native  # this thread's pool, which holds the request
        self._done, self._result = False, None

    def _check_thread(self):
        if self._client._native is not self._pool:
            raise MemcacheIllegalInputError("a request is completed on the thread that issued it")

    def test(self) -> bool:
        """Whether it has completed (never blocks)."""
        if self._done:
            return True
        self._check_thread()
        return self._pool.test(self._id)

    def __del__(self):
        # A request nobody waits for is forgotten (abandoned if still in flight).
        try:
            if not self._done and self._client._native is self._pool:
                self._pool.discard(self._id)
        except Exception:  # noqa: BLE001 - interpreter shutdown, another thread
            pass

    def wait(self, timeout=None):
        """Its result (see ``Client.wait``); raises its error."""
        return self._client.wait([self], timeout=timeout, raise_errors=True)[0]


class Client:
    """One memcached or memfabricd server, pymemcache-style.

    ``server``: ``(host, port)`` or ``"host:port"``. ``timeout`` and ``connect_timeout`` in
    seconds (default 1). ``transport``: "auto", "ucx", "tcp"; ``get_mode``: "auto",
    "one-sided", "two-sided" (GETs over UCX). Other pymemcache arguments
    (``serde``/``serializer``/``deserializer``, ``key_prefix``, ``default_noreply``,
    ``allow_unicode_keys``, ``encoding``, ``ignore_exc``) mean what they mean there.
    """

    _distribution = "ketama"

    def __init__(self, server=("127.0.0.1", 11211), serde=None, serializer=None,
                 deserializer=None, connect_timeout=1.0, timeout=1.0, no_delay=True,
                 ignore_exc=False, socket_module=None, socket_keepalive=None, key_prefix=b"",
                 default_noreply=True, allow_unicode_keys=False, encoding="ascii",
                 tls_context=None, transport="auto", get_mode="auto",
                 max_pool_size=None, pool_idle_timeout=0, lock_generator=None,
                 use_pooling=False, retry_attempts=2, retry_timeout=None, dead_timeout=60,
                 hasher=None):
        # pymemcache's arguments are all taken (an unknown one is a TypeError, as there).
        # Those about its own sockets and pools (socket_module, socket_keepalive,
        # no_delay, max_pool_size, pool_idle_timeout, lock_generator, use_pooling,
        # retry_attempts, dead_timeout) mean nothing here: each thread has its own native
        # connections, TCP_NODELAY always on. Two cannot be honoured and are refused
        # rather than ignored: a client asked for TLS must never talk in the clear, and
        # one asked for another placement must not put keys where its fleet does not.
        if tls_context is not None:
            raise MemcacheNotSupportedError(
                "tls_context: memfabric's Python package has no TLS; it would send in the "
                "clear (use pymemcache for memcached -Z, or memfabric's Rust client)")
        if hasher is not None:
            raise MemcacheNotSupportedError(
                "hasher: keys are placed by libmemcached's weighted ketama, as pylibmc "
                "and PHP clients place them; another hasher is not supported")
        servers = server if isinstance(self, HashClient) else [server]
        self.servers = [_server(s) for s in servers]
        if serde is None and (serializer or deserializer):
            serde = _LegacySerde(serializer, deserializer)
        self.serde = serde or _RawSerde()
        self.key_prefix = key_prefix.encode(encoding) if isinstance(key_prefix, str) else key_prefix
        self.default_noreply = default_noreply
        self.allow_unicode_keys = allow_unicode_keys
        self.encoding = encoding
        self.ignore_exc = ignore_exc
        self._pool_args = dict(
            timeout_ms=_ms(timeout if timeout is not None else 1.0),
            connect_timeout_ms=_ms(connect_timeout if connect_timeout is not None else 1.0),
            transport=transport,
            get_mode=get_mode,
            distribution=self._distribution,
            retry_timeout_s=max(0, math.ceil(retry_timeout)) if retry_timeout is not None else 2,
        )
        # A native pool (its connections, its UCX worker) belongs to one thread: each
        # thread that uses this client gets its own, made on first use.
        self._local = threading.local()
        self._local.pool = NativePool(self.servers, **self._pool_args)

    @property
    def _native(self) -> NativePool:
        pool = getattr(self._local, "pool", None)
        if pool is None:
            pool = self._local.pool = NativePool(self.servers, **self._pool_args)
        return pool

    # ---- keys and values ---------------------------------------------------------------

    def _key(self, key) -> bytes:
        if isinstance(key, str):
            try:
                key = key.encode("utf8" if self.allow_unicode_keys else self.encoding)
            except UnicodeEncodeError as e:
                raise MemcacheIllegalInputError(f"non-ASCII key: {key!r}") from e
        elif not isinstance(key, bytes):
            raise MemcacheIllegalInputError(f"key of type {type(key).__name__}")
        return self.key_prefix + key

    def _value(self, key, value, flags):
        data, f = self.serde.serialize(key, value)
        if isinstance(data, str):
            data = data.encode("utf8")
        return data, (f if flags is None else flags)

    def _load(self, key, item):
        data, flags, _cas = item
        return self.serde.deserialize(key, data, flags)

    def _noreply(self, noreply):
        return self.default_noreply if noreply is None else noreply

    def _guard(self, f, default):
        try:
            return f()
        except MemcacheError:
            if self.ignore_exc:
                return default
            raise

    # ---- storage -----------------------------------------------------------------------

    def _store(self, mode, key, value, expire, noreply, flags, cas=0):
        k = self._key(key)
        data, f = self._value(key, value, flags)
        nr = self._noreply(noreply)
        r = self._guard(lambda: self._native.store(mode, k, data, f, int(expire), cas, nr), False)
        return True if nr else r

    def set(self, key, value, expire=0, noreply=None, flags=None):
        return self._store("set", key, value, expire, noreply, flags)

    def add(self, key, value, expire=0, noreply=None, flags=None):
        return self._store("add", key, value, expire, noreply, flags)

    def replace(self, key, value, expire=0, noreply=None, flags=None):
        return self._store("replace", key, value, expire, noreply, flags)

    def append(self, key, value, expire=0, noreply=None, flags=None):
        return self._store("append", key, value, expire, noreply, flags)

    def prepend(self, key, value, expire=0, noreply=None, flags=None):
        return self._store("prepend", key, value, expire, noreply, flags)

    def cas(self, key, value, cas, expire=0, noreply=False, flags=None):
        """True if stored, False if the item changed since ``cas``, None if it is gone."""
        k = self._key(key)
        data, f = self._value(key, value, flags)
        token = int(cas)
        r = self._guard(lambda: self._native.store("cas", k, data, f, int(expire), token, bool(noreply)), False)
        return True if noreply else r

    def set_many(self, values: dict, expire=0, noreply=None, flags=None) -> list:
        """Stores all, pipelined; the keys that were not stored."""
        reqs = []
        try:
            for key, value in values.items():
                reqs.append((key, self.iset(key, value, expire=expire, flags=flags)))
        finally:
            # Issued ones are completed even if a later key or value was refused.
            results = self.wait([r for _, r in reqs])
        return [key for (key, _), ok in zip(reqs, results) if ok is not True]

    set_multi = set_many

    # ---- reads -------------------------------------------------------------------------

    def get(self, key, default=None):
        item = self._guard(lambda: self._native.get(self._key(key)), None)
        return default if item is None else self._load(key, item)

    def gets(self, key, default=None, cas_default=None):
        item = self._guard(lambda: self._native.get(self._key(key)), None)
        if item is None:
            return default, cas_default
        return self._load(key, item), item[2]

    def gat(self, key, expire=0, default=None):
        item = self._guard(lambda: self._native.gat(self._key(key), int(expire)), None)
        return default if item is None else self._load(key, item)

    def gats(self, key, expire=0, default=None, cas_default=None):
        item = self._guard(lambda: self._native.gat(self._key(key), int(expire)), None)
        if item is None:
            return default, cas_default
        return self._load(key, item), item[2]

    def _many(self, keys):
        keys = list(keys)
        wire = {self._key(k): k for k in keys}
        found = self._guard(lambda: self._native.get_multi(list(wire)), {})
        return {wire[k]: item for k, item in found.items() if k in wire}

    def get_many(self, keys: Iterable) -> dict:
        return {k: self._load(k, item) for k, item in self._many(keys).items()}

    get_multi = get_many

    def gets_many(self, keys: Iterable) -> dict:
        return {k: (self._load(k, item), item[2]) for k, item in self._many(keys).items()}

    # ---- other commands ----------------------------------------------------------------

    def delete(self, key, noreply=None):
        nr = self._noreply(noreply)
        r = self._guard(lambda: self._native.delete(self._key(key), nr), False)
        return True if nr else r

    def delete_many(self, keys, noreply=None):
        for key in keys:
            self.delete(key, noreply)
        return True

    delete_multi = delete_many

    def incr(self, key, value, noreply=False):
        return self._guard(lambda: self._native.arith(self._key(key), int(value), True, bool(noreply)), None)

    def decr(self, key, value, noreply=False):
        return self._guard(lambda: self._native.arith(self._key(key), int(value), False, bool(noreply)), None)

    def touch(self, key, expire=0, noreply=None):
        r = self._guard(lambda: self._native.touch(self._key(key), int(expire)), False)
        return True if self._noreply(noreply) else r

    def stats(self, *args) -> dict:
        """The (first) server's statistics, numbers as numbers."""
        per_server = self._native.stats(" ".join(args) or None)
        out = {}
        for _name, values in per_server[:1]:
            for k, v in values.items():
                out[k.encode()] = _number(v)
        return out

    def version(self) -> bytes:
        return self._native.version()[0][1].encode()

    def flush_all(self, delay=0, noreply=None):
        self._native.flush_all(int(delay))
        return True

    # ---- non-blocking ------------------------------------------------------------------

    def iset(self, key, value, expire=0, flags=None) -> Request:
        """Issues a set and returns at once (the value is copied)."""
        data, f = self._value(key, value, flags)
        return Request(self, self._native.iset(self._key(key), data, f, int(expire)), key, "set")

    def iget(self, key) -> Request:
        """Issues a get and returns at once."""
        return Request(self, self._native.iget(self._key(key)), key, "get")

    def wait(self, requests, timeout=None, raise_errors=False) -> list:
        """Completes requests (at most ``timeout`` seconds in all; default the client's
        timeout): a get's value (deserialized) or None, a set's True/False. A request's
        error is returned in its place (raised with ``raise_errors``)."""
        pending = [r for r in requests if not r._done]
        for r in pending:
            r._check_thread()
        if pending:
            ms = None if timeout is None else max(0, int(timeout * 1000))
            for r, res in zip(pending, self._native.wait([r._id for r in pending], ms)):
                if r._kind == "get" and isinstance(res, tuple):
                    res = self._load(r._key, res)
                r._done, r._result = True, res
        out = [r._result for r in requests]
        if raise_errors:
            for res in out:
                if isinstance(res, BaseException):
                    raise res
        return out

    def over_ucx(self, index: int = 0):
        """Whether server ``index`` is reached over UCX (None before the first request)."""
        return self._native.over_ucx(index)

    def close(self):
        """Closes this thread's connections (the next request reconnects)."""
        pool = getattr(self._local, "pool", None)
        if pool is not None:
            pool.close()

    quit = close
    disconnect_all = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class HashClient(Client):
    """Several servers (``[(host, port), ...]`` or ``"host:port[:weight]"`` strings), keys
    placed by libmemcached's weighted ketama."""

    def __init__(self, servers, **kwargs):
        super().__init__(servers, **kwargs)


class _LegacySerde:
    def __init__(self, serializer, deserializer):
        self._s, self._d = serializer, deserializer

    def serialize(self, key, value):
        return self._s(key, value) if self._s else _RawSerde().serialize(key, value)

    def deserialize(self, key, value, flags):
        return self._d(key, value, flags) if self._d else value


def _number(v: str):
    for t in (int, float):
        try:
            return t(v)
        except ValueError:
            pass
    return v.encode()


class AsyncClient:
    """aiomcache's ``Client`` for asyncio: ``await client.get(b"k")`` and so on.

    Requests run one at a time on a thread of the client's own (the native client belongs
    to one thread), with the GIL released while on the network, so the event loop goes
    on meanwhile. Keys are bytes, values bytes.
    """

    def __init__(self, host="127.0.0.1", port=11211, *, pool_size=2, pool_minsize=None,
                 conn_args=None, timeout=1.0, transport="auto", get_mode="auto"):
        # aiomcache's pool sizes mean nothing here (one native client on a thread of its
        # own); its conn_args go to asyncio.open_connection (ssl=..., local_addr=...),
        # which this client does not use, so any is refused rather than ignored.
        if conn_args:
            raise MemcacheNotSupportedError(
                f"conn_args {sorted(conn_args)}: memfabric's client opens its own "
                "connections (no TLS, no local address)")
        self._args = dict(server=(host, port), timeout=timeout, transport=transport,
                          get_mode=get_mode, default_noreply=False)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="memfabric-async")
        self._client = None

    async def _run(self, f, *args):
        def call():
            if self._client is None:
                self._client = Client(**self._args)
            return f(self._client, *args)

        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def get(self, key: bytes, default=None):
        return await self._run(lambda c: c.get(key, default))

    async def gets(self, key: bytes, default=None):
        return await self._run(lambda c: c.gets(key, default))

    async def multi_get(self, key: bytes, *keys: bytes) -> tuple:
        wanted = (key, *keys)
        found = await self._run(lambda c: c.get_many(wanted))
        return tuple(found.get(k) for k in wanted)

    async def set(self, key: bytes, value: bytes, exptime: int = 0) -> bool:
        return await self._run(lambda c: c.set(key, value, exptime, noreply=False))

    async def add(self, key: bytes, value: bytes, exptime: int = 0) -> bool:
        return await self._run(lambda c: c.add(key, value, exptime, noreply=False))

    async def replace(self, key: bytes, value: bytes, exptime: int = 0) -> bool:
        return await self._run(lambda c: c.replace(key, value, exptime, noreply=False))

    async def append(self, key: bytes, value: bytes, exptime: int = 0) -> bool:
        return await self._run(lambda c: c.append(key, value, exptime, noreply=False))

    async def prepend(self, key: bytes, value: bytes, exptime: int = 0) -> bool:
        return await self._run(lambda c: c.prepend(key, value, exptime, noreply=False))

    async def cas(self, key: bytes, value: bytes, cas_token: int, exptime: int = 0) -> bool:
        return bool(await self._run(lambda c: c.cas(key, value, cas_token, exptime)))

    async def delete(self, key: bytes) -> bool:
        return await self._run(lambda c: c.delete(key, noreply=False))

    async def incr(self, key: bytes, increment: int = 1):
        return await self._run(lambda c: c.incr(key, increment))

    async def decr(self, key: bytes, decrement: int = 1):
        return await self._run(lambda c: c.decr(key, decrement))

    async def touch(self, key: bytes, exptime: int) -> bool:
        return await self._run(lambda c: c.touch(key, exptime, noreply=False))

    async def stats(self, args=None) -> dict:
        return await self._run(lambda c: c.stats(*([args] if args else [])))

    async def version(self) -> bytes:
        return await self._run(lambda c: c.version())

    async def flush_all(self) -> None:
        await self._run(lambda c: c.flush_all())

    async def close(self) -> None:
        if self._client is not None:
            await self._run(lambda c: c.close())
        self._executor.shutdown(wait=True)
