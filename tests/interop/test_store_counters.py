"""The store's counters against Debian's memcached 1.6.18 after the same operations.

Background reclaim is asynchronous in both servers (memcached's LRU maintainer, the
store's sweeper): a scenario waits, boundedly, until ``curr_items`` settles on the value
both must reach, then requires the same counters. No timing is asserted.
"""

from __future__ import annotations

import socket
import time

import pytest

from conftest import KINDS

COUNTERS = ("curr_items", "total_items", "reclaimed", "expired_unfetched", "get_expired",
            "get_flushed", "crawler_reclaimed", "evictions", "get_hits", "get_misses")
SETTLE = 20.0


class Client:
    def __init__(self, srv):
        self.sock = socket.create_connection(srv.addr, timeout=10)
        self.buf = b""

    def read_until(self, ends: tuple[bytes, ...]) -> bytes:
        while not any(self.buf.endswith(e) for e in ends):
            data = self.sock.recv(1 << 16)
            if not data:
                raise EOFError("server closed the connection")
            self.buf += data
        out, self.buf = self.buf, b""
        return out

    def cmd(self, line: bytes, ends: tuple[bytes, ...] = (b"\r\n",)) -> bytes:
        self.sock.sendall(line)
        return self.read_until(ends)

    def set_many(self, prefix: str, n: int, exptime: int = 0, batch: int = 100) -> None:
        for start in range(0, n, batch):
            k = min(n, start + batch) - start
            self.sock.sendall(b"".join(
                b"set %s%d 0 %d 10\r\n0123456789\r\n" % (prefix.encode(), i, exptime)
                for i in range(start, start + k)))
            while self.buf.count(b"STORED\r\n") < k:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise EOFError("server closed the connection")
                self.buf += data
            self.buf = b""

    def stats(self) -> dict[str, int]:
        out = {}
        for line in self.cmd(b"stats\r\n", (b"END\r\n",)).decode().split("\r\n"):
            parts = line.split(" ")
            if len(parts) == 3 and parts[0] == "STAT" and parts[2].lstrip("-").isdigit():
                out[parts[1]] = int(parts[2])
        return out

    def settle(self, curr_items: int) -> dict[str, int]:
        deadline = time.monotonic() + SETTLE
        while True:
            st = self.stats()
            if st["curr_items"] == curr_items or time.monotonic() > deadline:
                return st
            time.sleep(0.1)


def run_each(servers, scenario) -> dict[str, dict[str, int]]:
    """The scenario's final stats on a fresh server of each kind."""
    result = {}
    for kind in KINDS:
        client = Client(servers(kind))
        st = scenario(client)
        result[kind] = {k: st[k] for k in (*COUNTERS, "value") if k in st}
    return result


def test_flush_all_lowers_curr_items_and_counts_reclaimed_as_memcached_does(servers):
    def scenario(c: Client) -> dict[str, int]:
        c.set_many("a", 20_000)
        assert c.cmd(b"flush_all\r\n") == b"OK\r\n"
        st = c.settle(0)
        assert st["bytes"] == 0
        c.set_many("b", 5_000)
        return c.stats()

    got = run_each(servers, scenario)
    assert got["memfabricd"] == got["memcached"]
    assert got["memcached"]["curr_items"] == 5_000
    assert got["memcached"]["reclaimed"] == 20_000


def test_a_mass_expiry_is_reclaimed_and_counted_as_memcached_does(servers):
    def scenario(c: Client) -> dict[str, int]:
        c.set_many("e", 20_000, exptime=2)
        c.set_many("p", 100)
        return c.settle(100)

    got = run_each(servers, scenario)
    assert got["memfabricd"] == got["memcached"]
    assert got["memcached"]["expired_unfetched"] == 20_000


@pytest.mark.parametrize("ops", [
    [b"incr z 1", b"incr z 1", b"decr z 5"],  # 9 -> 10 is a new item; then in place
    [b"decr z 1", b"decr z 1", b"incr z 3"],  # all in place
    [b"ma z", b"ma z", b"ma z MD D5"],  # meta arithmetic: new item, then in place
    [b"ma z MD N0 T100", b"ma z MD N0", b"ma z D1 N0 T100"],  # with a TTL: all in place
])
def test_in_place_incr_and_decr_are_not_stores(servers, ops):
    def scenario(c: Client) -> dict[str, int]:
        assert c.cmd(b"set z 0 0 1\r\n9\r\n") == b"STORED\r\n"
        for op in ops:
            c.cmd(op + b"\r\n")
        assert c.cmd(b"append z 0 0 1\r\n0\r\n") == b"STORED\r\n"
        assert c.cmd(b"touch z 0\r\n") == b"TOUCHED\r\n"
        st = c.stats()
        st["value"] = c.cmd(b"get z\r\n", (b"END\r\n",))
        return st

    got = run_each(servers, scenario)
    assert got["memfabricd"] == got["memcached"]
