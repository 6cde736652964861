"""UDP (with memcached's 8-byte frame header) and unix-socket transports, both servers.

UDP frame header, big endian: request id, sequence number, total datagrams, reserved (0).
A reply larger than one datagram is split; every datagram carries the request id, its
own sequence number and the total count.
"""

from __future__ import annotations

import socket
import struct
import time

import pytest

HEADER = struct.Struct(">HHHH")


def udp_exchange(server, request: bytes, req_id: int, timeout: float = 3.0):
    """Send one framed request; collect datagrams until all ``total`` have arrived."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(HEADER.pack(req_id, 0, 1, 0) + request, ("127.0.0.1", server.udp_port))
        frames: dict[int, bytes] = {}
        total = None
        headers = []
        deadline = time.monotonic() + timeout
        while total is None or len(frames) < total:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data, _ = s.recvfrom(65536)
            except socket.timeout:
                pytest.fail(f"{server.kind}: UDP reply incomplete: got seqs {sorted(frames)}"
                            f" of {total}", pytrace=False)
            assert len(data) >= HEADER.size, f"{server.kind}: datagram shorter than header"
            rid, seq, tot, reserved = HEADER.unpack_from(data)
            headers.append((rid, seq, tot, reserved))
            if rid != req_id:
                continue  # a late reply to an earlier request
            total = tot
            frames[seq] = data[HEADER.size:]
        return b"".join(frames[i] for i in range(total)), headers


def test_udp_set_then_get(udp_server):
    reply, headers = udp_exchange(udp_server, b"set k 7 0 5\r\nhello\r\n", req_id=1)
    assert reply == b"STORED\r\n"
    assert headers == [(1, 0, 1, 0)]
    reply, headers = udp_exchange(udp_server, b"get k\r\n", req_id=0xBEEF)
    assert reply == b"VALUE k 7 5\r\nhello\r\nEND\r\n"
    assert headers == [(0xBEEF, 0, 1, 0)]


def test_udp_get_of_missing_key(udp_server):
    reply, _ = udp_exchange(udp_server, b"get nothere\r\n", req_id=2)
    assert reply == b"END\r\n"


def test_udp_multi_datagram_reply_is_framed_in_sequence(udp_server):
    value = bytes(range(97, 123)) * 400  # 10 400 bytes: several 1400-byte datagrams
    with socket.create_connection(udp_server.addr, timeout=3) as t:
        t.sendall(b"set big 0 0 %d\r\n%s\r\n" % (len(value), value))
        assert t.recv(100) == b"STORED\r\n"
    reply, headers = udp_exchange(udp_server, b"get big\r\n", req_id=77)
    assert reply == b"VALUE big 0 %d\r\n%s\r\nEND\r\n" % (len(value), value)
    total = headers[0][2]
    assert total > 1
    assert sorted(h[1] for h in headers) == list(range(total))
    assert all(h[0] == 77 and h[2] == total and h[3] == 0 for h in headers)


def test_udp_multi_datagram_reply_sizes_match_memcached(servers):
    """memfabricd splits a large reply into the same datagram sizes as memcached."""
    value = b"v" * 10_000
    sizes = {}
    for kind in ("memcached", "memfabricd"):
        srv = servers(kind, udp=True)
        with socket.create_connection(srv.addr, timeout=3) as t:
            t.sendall(b"set big 0 0 %d\r\n%s\r\n" % (len(value), value))
            assert t.recv(100) == b"STORED\r\n"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(3)
            s.sendto(HEADER.pack(5, 0, 1, 0) + b"get big\r\n", ("127.0.0.1", srv.udp_port))
            got = []
            while True:
                data, _ = s.recvfrom(65536)
                got.append((HEADER.unpack_from(data)[1], len(data)))
                if len(got) == HEADER.unpack_from(data)[2]:
                    break
        sizes[kind] = sorted(got)
    assert sizes["memfabricd"] == sizes["memcached"]


def test_udp_set_of_10k_value_in_one_datagram(udp_server):
    value = b"x" * 10_000
    reply, _ = udp_exchange(udp_server, b"set u 0 0 %d\r\n%s\r\n" % (len(value), value), req_id=9)
    assert reply == b"STORED\r\n"
    reply, _ = udp_exchange(udp_server, b"get u\r\n", req_id=10)
    assert reply == b"VALUE u 0 %d\r\n%s\r\nEND\r\n" % (len(value), value)


def test_udp_meta_commands(udp_server):
    reply, _ = udp_exchange(udp_server, b"ms m 2 T0\r\nhi\r\n", req_id=11)
    assert reply == b"HD\r\n"
    reply, _ = udp_exchange(udp_server, b"mg m v k\r\n", req_id=12)
    assert reply == b"VA 2 km\r\nhi\r\n"


def test_udp_datagram_with_multiple_packets_declared_is_ignored(servers):
    """memcached drops requests whose header says they span several datagrams."""
    replies = {}
    for kind in ("memcached", "memfabricd"):
        srv = servers(kind, udp=True)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(0.5)
            s.sendto(HEADER.pack(3, 0, 2, 0) + b"get k\r\n", ("127.0.0.1", srv.udp_port))
            try:
                replies[kind] = s.recvfrom(65536)[0]
            except socket.timeout:
                replies[kind] = None
    assert replies["memfabricd"] == replies["memcached"]


def _unix_talk(path: str, data: bytes, until: bytes = b"", min_len: int = 1) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(3)
        s.connect(path)
        s.sendall(data)
        buf = b""
        while len(buf) < min_len or not buf.endswith(until):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        return buf


def test_unix_socket_round_trip(unix_server):
    path = unix_server.unix_path
    assert _unix_talk(path, b"set u 3 0 2\r\nhi\r\n", b"\r\n") == b"STORED\r\n"
    assert _unix_talk(path, b"get u\r\n", b"END\r\n") == b"VALUE u 3 2\r\nhi\r\nEND\r\n"
    assert _unix_talk(path, b"mg u v f\r\nmn\r\n", b"MN\r\n") == b"VA 2 f3\r\nhi\r\nMN\r\n"


def test_unix_socket_binary_protocol(unix_server):
    noop = struct.pack(">BBHBBHIIQ", 0x80, 0x0A, 0, 0, 0, 0, 0, 0x1234, 0)
    reply = _unix_talk(unix_server.unix_path, noop, min_len=24)
    assert reply[:2] == b"\x81\x0a" and reply[12:16] == b"\x00\x00\x12\x34"


def test_unix_socket_disables_tcp(unix_server):
    # memcached: -s turns TCP and UDP off; nothing listens on a port for this server.
    assert unix_server.port == 0


@pytest.mark.parametrize("value_size", [0, 1, 1399, 1400, 5000])
def test_udp_reply_boundaries(udp_server, value_size):
    value = b"b" * value_size
    reply, _ = udp_exchange(udp_server, b"set s 0 0 %d\r\n%s\r\n" % (value_size, value), 20)
    assert reply == b"STORED\r\n"
    reply, headers = udp_exchange(udp_server, b"get s\r\n", 21)
    assert reply == b"VALUE s 0 %d\r\n%s\r\nEND\r\n" % (value_size, value)
    assert len(headers) == headers[0][2]


def _binary(opcode: int, key: bytes = b"", extras: bytes = b"", value: bytes = b"") -> bytes:
    body = extras + key + value
    return struct.pack(">BBHBBHIIQ", 0x80, opcode, len(key), len(extras), 0, 0, len(body),
                       0x11223344, 0) + body


QUIET_CASES = [
    ("getq miss", _binary(0x09, b"nokey")),
    ("getkq miss", _binary(0x0D, b"nokey")),
    ("setq", _binary(0x11, b"qk", struct.pack(">II", 0, 0), b"v")),
    ("deleteq miss (errors are answered)", _binary(0x14, b"nokey")),
    ("quitq", _binary(0x17)),
    ("getq miss, noop", _binary(0x09, b"nokey") + _binary(0x0A)),
    ("two getq misses", _binary(0x09, b"nokey") + _binary(0x09, b"nokey2")),
    ("noop, getq miss", _binary(0x0A) + _binary(0x09, b"nokey")),
    ("ascii noreply", b"set a 0 0 1 noreply\r\nx\r\n"),
    ("meta quiet miss", b"mg nokey v q\r\n"),
    ("binary cut short", _binary(0x09, b"nokey")[:10]),
]


def _datagrams_until_sentinel(port: int, request: bytes, req_id: int) -> list:
    """Every datagram the server sends for ``request``, in order: a sentinel request sent
    right behind it (one worker thread, so answered after it) marks the end."""
    sentinel = req_id + 1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(HEADER.pack(req_id, 0, 1, 0) + request, ("127.0.0.1", port))
        s.sendto(HEADER.pack(sentinel, 0, 1, 0) + b"version\r\n", ("127.0.0.1", port))
        got = []
        while True:
            data, _ = s.recvfrom(65536)
            header = HEADER.unpack_from(data)
            if header[0] == sentinel:
                return got
            got.append((header, data[HEADER.size:]))


def test_udp_quiet_binary_requests_frame_as_memcached(servers):
    """memcached 1.6 answers a datagram whose first request is a binary one that says
    nothing (getq miss, setq, quitq) with a frame header alone (count 0), once per
    datagram; quiet ascii and meta requests, and a request cut short, get nothing."""
    seen = {}
    for kind in ("memcached", "memfabricd"):
        srv = servers(kind, udp=True, args=("-t", "1"))
        seen[kind] = [(name, _datagrams_until_sentinel(srv.udp_port, req, 100 + 2 * i))
                      for i, (name, req) in enumerate(QUIET_CASES)]
    assert seen["memfabricd"] == seen["memcached"]
    assert dict(seen["memcached"])["getq miss"] == [((100, 0, 0, 0), b"")]
