"""pymemcache (pure-Python, text protocol) against memcached and memfabricd alike.

Every test runs once per server kind with the same assertions: memcached passing them is
what proves an assertion is right.
"""

from __future__ import annotations

import pytest
from pymemcache.client.base import Client
from pymemcache.exceptions import (
    MemcacheClientError,
    MemcacheIllegalInputError,
    MemcacheServerError,
)


@pytest.fixture(params=[False, True], ids=["reply", "noreply"])
def noreply(request) -> bool:
    return request.param


@pytest.fixture
def client(server):
    c = Client(server.addr, connect_timeout=3, timeout=5, default_noreply=False)
    yield c
    c.close()


@pytest.fixture
def nr_client(server, noreply):
    """A client whose storage commands use ``noreply`` or not, per the parameter."""
    c = Client(server.addr, connect_timeout=3, timeout=5, default_noreply=noreply)
    yield c
    c.close()


def test_set_then_get_returns_value(client):
    assert client.set("k", b"v", expire=0) is True
    assert client.get("k") == b"v"


def test_get_of_missing_key_returns_none(client):
    assert client.get("missing") is None


def test_set_with_flags_round_trips_through_serde(server):
    # The default serde stores flags on set and reads them on get.
    c = Client(server.addr, timeout=5, default_noreply=False,
               serializer=lambda k, v: (str(v).encode(), 77),
               deserializer=lambda k, v, f: (v, f))
    try:
        c.set("f", 12)
        assert c.get("f") == (b"12", 77)
    finally:
        c.close()


def test_storage_commands_with_and_without_noreply(nr_client):
    c = nr_client
    c.set("a", b"1")
    c.add("a", b"ignored")
    c.add("b", b"2")
    c.replace("b", b"3")
    c.replace("missing", b"x")
    c.append("b", b"4")
    c.prepend("b", b"0")
    # Read on the same connection: only it orders the reads after the noreply writes.
    assert c.get_many(["a", "b", "missing"]) == {"a": b"1", "b": b"034"}


def test_add_and_replace_report_not_stored(client):
    assert client.add("x", b"1") is True
    assert client.add("x", b"2") is False
    assert client.replace("y", b"1") is False
    assert client.replace("x", b"3") is True
    assert client.get("x") == b"3"


def test_append_and_prepend_to_missing_key_are_not_stored(client):
    assert client.append("nope", b"x") is False
    assert client.prepend("nope", b"x") is False


def test_multi_get_returns_only_present_keys_in_one_round_trip(client):
    assert client.set_many({f"k{i}": str(i).encode() for i in range(50)}) == []
    got = client.get_many([f"k{i}" for i in range(0, 60, 2)])
    assert got == {f"k{i}": str(i).encode() for i in range(0, 50, 2)}


def test_gets_and_cas(client):
    client.set("c", b"1")
    value, token = client.gets("c")
    assert value == b"1" and token
    assert client.cas("c", b"2", token) is True
    assert client.cas("c", b"3", token) is False  # stale token: EXISTS
    assert client.get("c") == b"2"
    assert client.cas("missing", b"x", token) is None  # NOT_FOUND
    assert client.gets("missing") == (None, None)


def test_gets_many_returns_distinct_cas_per_key(client):
    client.set_many({"g1": b"a", "g2": b"b"})
    got = client.gets_many(["g1", "g2", "g3"])
    assert set(got) == {"g1", "g2"}
    assert got["g1"][0] == b"a" and got["g2"][0] == b"b"
    assert got["g1"][1] != got["g2"][1]


def test_incr_and_decr(client):
    assert client.incr("n", 1) is None  # missing
    client.set("n", b"10")
    assert client.incr("n", 5) == 15
    assert client.decr("n", 3) == 12
    assert client.decr("n", 100) == 0  # clamps at zero
    client.set("w", b"18446744073709551615")
    assert client.incr("w", 2) == 1  # wraps at 2^64
    client.set("s", b"abc")
    with pytest.raises(MemcacheClientError):
        client.incr("s", 1)


def test_incr_noreply_still_applies(server):
    c = Client(server.addr, timeout=5, default_noreply=True)
    try:
        c.set("n", b"1", noreply=False)
        assert c.incr("n", 4, noreply=True) is None
        assert c.decr("n", 2, noreply=True) is None
        assert c.get("n") == b"3"
    finally:
        c.close()


def test_delete(nr_client, client):
    nr_client.set("d", b"x", noreply=False)
    nr_client.delete("d")
    assert nr_client.get("d") is None
    assert client.delete("d", noreply=False) is False
    client.set("d", b"y")
    assert client.delete("d", noreply=False) is True
    assert client.delete_many(["d", "e"], noreply=False) is True


def test_touch(client):
    client.set("t", b"x")
    assert client.touch("t", expire=100, noreply=False) is True
    assert client.touch("missing", expire=100, noreply=False) is False
    assert client.touch("t", expire=-1, noreply=False) is True
    assert client.get("t") is None


def test_negative_expiry_hides_item(client):
    client.set("e", b"x", expire=-1)
    assert client.get("e") is None


def test_flush_all(nr_client, client):
    nr_client.set_many({"f1": b"1", "f2": b"2"}, noreply=False)
    nr_client.flush_all()
    assert nr_client.get_many(["f1", "f2"]) == {}
    assert client.flush_all(noreply=False) is True


def test_large_values_round_trip(client):
    for size in (1, 1400, 16 * 1024, 100 * 1024, 1000 * 1000):
        value = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        assert client.set(f"big{size}", value) is True
        assert client.get(f"big{size}") == value


def test_too_large_value_is_refused_and_connection_stays_usable(client):
    with pytest.raises(MemcacheServerError):
        client.set("huge", b"x" * (2 * 1024 * 1024))
    assert client.get("huge") is None
    assert client.set("after", b"ok") is True


def test_unicode_keys_rejected_by_client(client):
    with pytest.raises(MemcacheIllegalInputError):
        client.set("ключ", b"v")
    with pytest.raises(MemcacheIllegalInputError):
        client.get("clé")


def test_unicode_keys_allowed_when_asked(server):
    c = Client(server.addr, timeout=5, default_noreply=False, allow_unicode_keys=True)
    try:
        assert c.set("ключ", b"v") is True
        assert c.get("ключ") == b"v"
    finally:
        c.close()


def test_keys_with_spaces_or_too_long_are_rejected_by_client(client):
    with pytest.raises(MemcacheIllegalInputError):
        client.set("a b", b"v")
    with pytest.raises(MemcacheIllegalInputError):
        client.get("k" * 251)
    assert client.set("k" * 250, b"v") is True
    assert client.get("k" * 250) == b"v"


def test_version_and_stats(client):
    assert client.version()
    stats = client.stats()
    assert b"curr_items" in stats or "curr_items" in stats


def test_binary_safe_values(client):
    value = b"\r\nEND\r\n\x00\xff"
    client.set("bin", value)
    assert client.get("bin") == value


def test_many_pipelined_noreply_sets_then_one_get(server):
    c = Client(server.addr, timeout=5, default_noreply=True)
    try:
        for i in range(500):
            c.set(f"p{i}", str(i).encode())
        assert c.get("p499") == b"499"
        assert len(c.get_many([f"p{i}" for i in range(500)])) == 500
    finally:
        c.close()
