"""libmemcached (through pylibmc) against memcached and memfabricd alike.

Each test runs for both servers x ascii/binary protocol; the noreply and no_block
behaviours get their own tests. pylibmc wraps libmemcached's C client, so this checks
what the most common C client library sends and expects.
"""

from __future__ import annotations

import os
import socket

import pylibmc
import pytest

# scripts/test.sh also runs this suite with Debian's python3-pylibmc on libmemfabric in
# place of libmemcached.so.11 (MEMFABRIC_PYLIBMC=debian-on-libmemfabric): then memfabricd
# must be reached over UCX.
ON_LIBMEMFABRIC = os.environ.get("MEMFABRIC_PYLIBMC") == "debian-on-libmemfabric"
if ON_LIBMEMFABRIC:
    import _pylibmc

    for module in (pylibmc, _pylibmc):
        path = os.path.realpath(module.__file__)
        assert path.startswith("/usr/lib/python3/dist-packages/"), path
    with open("/proc/self/maps") as maps:
        mapped = maps.read()
    assert "libmemfabric.so" in mapped, "libmemcached.so.11 is not libmemfabric here"
    assert "libmemcached.so.11.0" not in mapped, "the real libmemcached is loaded too"


def _ucx_sessions(server) -> int:
    with socket.create_connection(server.addr, timeout=5) as s:
        s.sendall(b"stats fabric\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    for line in data.decode().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "ucx_total_sessions":
            return int(parts[2])
    raise AssertionError("no ucx_total_sessions in stats fabric")


@pytest.fixture(autouse=True)
def _memfabricd_is_reached_over_ucx(request):
    # Asked for before the test runs, so the server is torn down after this check.
    server = request.getfixturevalue("server") if "server" in request.fixturenames else None
    yield
    if ON_LIBMEMFABRIC and server is not None and server.kind == "memfabricd":
        assert _ucx_sessions(server) > 0, "pylibmc on libmemfabric did not use UCX"


@pytest.fixture(params=[False, True], ids=["ascii", "binary"])
def binary(request) -> bool:
    return request.param


def _client(server, binary: bool, **behaviors) -> pylibmc.Client:
    base = {"connect_timeout": 3000, "receive_timeout": 5_000_000, "send_timeout": 5_000_000}
    base.update(behaviors)
    return pylibmc.Client([server.hostport], binary=binary, behaviors=base)


@pytest.fixture
def mc(server, binary):
    c = _client(server, binary)
    yield c
    c.disconnect_all()


def test_set_then_get_returns_value(mc):
    assert mc.set("k", b"v") is True
    assert mc.get("k") == b"v"


def test_get_of_missing_key_returns_none(mc):
    assert mc.get("missing") is None


def test_python_types_round_trip_through_flags(mc):
    # pylibmc encodes the Python type in the item flags: ints, str, pickled objects.
    mc.set("i", 42)
    mc.set("s", "text")
    mc.set("o", {"a": [1, 2]})
    assert mc.get("i") == 42
    assert mc.get("s") == "text"
    assert mc.get("o") == {"a": [1, 2]}


def test_multi_set_and_multi_get(mc):
    assert mc.set_multi({f"k{i}": str(i).encode() for i in range(100)}) == []
    got = mc.get_multi([f"k{i}" for i in range(0, 120, 3)])
    assert got == {f"k{i}": str(i).encode() for i in range(0, 100, 3)}


def test_add_and_replace(mc, binary):
    assert mc.add("a", b"1") is True
    assert mc.add("a", b"2") is False
    if binary:
        # libmemcached maps the binary KEY_ENOENT status to NOTFOUND, ascii's NOT_STORED
        # to a plain failure.
        with pytest.raises(pylibmc.NotFound):
            mc.replace("nope", b"x")
    else:
        assert mc.replace("nope", b"x") is False
    assert mc.replace("a", b"3") is True
    assert mc.get("a") == b"3"


def test_append_and_prepend(mc):
    mc.set("ap", b"mid")
    assert mc.append("ap", b"-end") is True
    assert mc.prepend("ap", b"start-") is True
    assert mc.get("ap") == b"start-mid-end"
    assert mc.append("missing", b"x") is False


def test_delete(mc):
    mc.set("d", b"x")
    assert mc.delete("d") is True
    assert mc.delete("d") is False
    assert mc.get("d") is None
    mc.set_multi({"d1": b"1", "d2": b"2"})
    assert mc.delete_multi(["d1", "d2", "d3"]) is False  # d3 missing
    assert mc.get_multi(["d1", "d2"]) == {}


def test_incr_and_decr(mc):
    mc.set("n", b"10")
    assert mc.incr("n") == 11
    assert mc.incr("n", 9) == 20
    assert mc.decr("n", 5) == 15
    assert mc.decr("n", 100) == 0
    with pytest.raises(pylibmc.NotFound):
        mc.incr("missing")
    mc.set("s", b"abc")
    with pytest.raises(pylibmc.Error):
        mc.incr("s")


def test_incr_wraps_at_2_to_64(mc):
    mc.set("w", b"18446744073709551615")
    assert mc.incr("w", 3) == 2


def test_touch(mc):
    mc.set("t", b"x")
    assert mc.touch("t", 100) is True
    assert mc.touch("missing", 100) is False
    assert mc.get("t") == b"x"


def test_negative_expiry(mc, binary):
    mc.set("e", b"x", time=-1)
    if binary:
        # The binary exptime field is unsigned: -1 arrives as 0xffffffff, an absolute
        # time far in the future, so the item lives.
        assert mc.get("e") == b"x"
    else:
        assert mc.get("e") is None


def test_gets_and_cas(server, binary):
    c = _client(server, binary, cas=True)
    try:
        c.set("c", b"1")
        value, token = c.gets("c")
        assert value == b"1" and token
        assert c.cas("c", b"2", token) is True
        assert c.cas("c", b"3", token) is False
        assert c.get("c") == b"2"
        assert c.gets("missing") == (None, None)
    finally:
        c.disconnect_all()


def test_flush_all(mc):
    mc.set_multi({"f1": b"1", "f2": b"2"})
    assert mc.flush_all() is True
    assert mc.get_multi(["f1", "f2"]) == {}


def test_large_values_round_trip(mc):
    for size in (1400, 64 * 1024, 1000 * 1000):
        value = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
        assert mc.set(f"big{size}", value) is True
        assert mc.get(f"big{size}") == value


def test_too_large_value_is_refused_and_connection_stays_usable(mc):
    with pytest.raises(pylibmc.Error):
        mc.set("huge", b"x" * (2 * 1024 * 1024))
    assert mc.get("huge") is None
    assert mc.set("after", b"ok") is True
    assert mc.get("after") == b"ok"


def test_long_keys(mc):
    assert mc.set("k" * 250, b"v") is True
    assert mc.get("k" * 250) == b"v"


def test_stats(mc):
    stats = mc.get_stats()
    assert len(stats) == 1
    _name, values = stats[0]
    assert "curr_items" in values


def test_no_block_writes_are_all_applied(server, binary):
    c = _client(server, binary, no_block=True)
    try:
        for i in range(300):
            c.set(f"nb{i}", str(i).encode())
        if binary:
            c.incr("nb7", 5)
        # A get flushes libmemcached's buffered writes and waits for them in order.
        got = c.get_multi([f"nb{i}" for i in range(300)])
        assert len(got) == 300
        assert got["nb299"] == b"299"
        if binary:
            assert got["nb7"] == b"12"
    finally:
        c.disconnect_all()


def test_noreply_writes_are_applied_in_order(server, binary):
    c = _client(server, binary, _noreply=True)
    try:
        for i in range(200):
            c.set(f"nr{i}", str(i).encode())
        c.set("nr5", b"overwritten")
        c.delete("nr6")
        c.append("nr7", b"+")
        got = c.get_multi([f"nr{i}" for i in range(200)])
        assert len(got) == 199
        assert got["nr5"] == b"overwritten"
        assert got["nr7"] == b"7+"
        assert "nr6" not in got
    finally:
        c.disconnect_all()

