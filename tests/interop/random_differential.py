#!/usr/bin/env python3
"""Random differential sessions: the same random requests to memcached and memfabricd.

Not a test (pytest does not collect it): a tool that looks for replies in which
memfabricd differs from Debian's memcached, beyond what the transcripts under
``transcripts/`` pin down. Each step sends one generated request (ascii and meta, or
binary packets) to a fresh memcached and a fresh memfabricd in lockstep, followed by a
sentinel (``mn``, or a binary NOOP with its own opaque), and compares the normalised
replies; with ``--batch N`` each text step is up to N requests in one write (a pipeline). A difference is printed with the earlier steps that named the same keys, then
both stores are flushed and the session goes on.

    .venv/bin/python tests/interop/random_differential.py --protocol text --seed 21 --steps 2500
    .venv/bin/python tests/interop/random_differential.py --protocol binary --seed 3 --steps 1500
    .venv/bin/python tests/interop/random_differential.py --seed 5 --steps 1000 --batch 8
    .venv/bin/python tests/interop/random_differential.py --seed 9 --steps 1000 --batch 4 --udp

The servers run on free loopback ports and are always stopped. A step that does not
complete within a second (a server waiting for data the request only announced) reconnects
both sides. The exit status is 1 when a difference was found.

Differences that are memcached's, not memfabricd's (seen in these sessions, 2026-11-29):

* An ``incr`` of a value made only of whitespace (``"\\r"``, ``"\\n"``): memcached's
  ``strtoull`` skips the value's own ``\\r\\n`` and reads the bytes after the item in its
  slab, so it may answer a number taken from a neighbouring item (memfabricd: non-numeric).
* An ``incr`` that fits is done in place by memcached only when nothing else holds the
  item; a reply still waiting to be written (a pipelined ``get`` just before) or a
  reference some earlier error path left makes it a new item of the exact length, so
  ``"17   "`` becomes ``"17"`` and the item's fetched mark goes. memfabricd always rewrites
  in place.
* Binary: a request that makes memcached close the connection (bad magic, a body shorter
  than its header says) also drops the replies of the requests before it in the same
  read; memfabricd sends them, then closes.
* A ``get``, ``gets``, ``gat`` or ``gats`` whose key is too long answers ``CLIENT_ERROR bad
  command line format`` and, in memcached, throws away the replies of the earlier
  requests of the same pipeline that were not written yet (``conn_release_items``):
  ``add k 0 0 1\r\nx\r\nget <251 bytes>\r\n`` in one write gets only the error, though
  ``k`` was stored. memfabricd answers every request.
* UDP: a datagram without a whole request (a ``set`` whose data is not all in it):
  memcached waits, and takes the next datagrams it reads as the missing data;
  memfabricd drops the datagram (``server/src/udp.rs``). The session then starts
  both servers afresh. Both run one worker thread over UDP (``-t 1``), so that which
  thread reads a datagram does not change the session.
* Unknown binary opcodes (a documented deviation, ``transcripts/binary_misc.txt``),
  ``watch`` (memfabricd has none and answers as memcached does with watch disabled) and
  ``me``'s ``cls=`` (the slab classes differ) are left out or normalised here.
"""

from __future__ import annotations

import argparse
import random
import re
import socket
import struct
import sys
import time

from conftest import start_server

# Long enough for a busy machine; a request that announced data it never sends costs this.
STEP_TIMEOUT = 1.0


# --------------------------------------------------------------------------- CAS tokens

class CasMap:
    """A server's CAS values, numbered in the order they first appear in its replies."""

    def __init__(self) -> None:
        self.raw2tok: dict[int, int] = {}
        self.tok2raw: dict[int, int] = {}

    def token(self, raw: int) -> int:
        if raw not in self.raw2tok:
            tok = len(self.raw2tok) + 1
            self.raw2tok[raw] = tok
            self.tok2raw[tok] = raw
        return self.raw2tok[raw]

    def raw(self, tok: int) -> int:
        return self.tok2raw.get(tok, 999_000 + tok)


# --------------------------------------------------------------------------- text protocol

KEYS = [b"a", b"b", b"num", b"k" * 250, b"k" * 251, b"x\x01y", b"bWFn", b"\xc3\xa9"]
NUMS = [b"0", b"1", b"2", b"-1", b"18446744073709551615", b"18446744073709551616",
        b"4294967295", b"4294967296", b"abc", b"00", b"+1", b"1x", b" ", b"9" * 30,
        b"-0", b"0x10", b"2147483647", b"2147483648", b"-2147483649", b"60", b"2592001"]
META_FLAGS = [b"b", b"c", b"f", b"h", b"k", b"l", b"q", b"s", b"t", b"v", b"u", b"I", b"x",
              b"O", b"E", b"N", b"R", b"T", b"M", b"D", b"J", b"C", b"F", b"S", b"P", b"L",
              b"Z", b"@", b"a"]
NUMBER_FLAGS = (b"O", b"E", b"N", b"R", b"T", b"D", b"J", b"C", b"F", b"S", b"L")
MISC = [b"flush_all\r\n", b"flush_all 0\r\n", b"flush_all noreply\r\n", b"flush_all -1\r\n",
        b"flush_all abc\r\n", b"verbosity\r\n", b"verbosity 1\r\n", b"verbosity x\r\n",
        b"\r\n", b" \r\n", b"GET a\r\n", b"get\r\n", b"quit2\r\n", b"cache_memlimit\r\n",
        b"cache_memlimit 100\r\n", b"shutdown x\r\n", b"gets a b\n", b"set a 0 0 1\nx\n",
        b"mg a v\n", b"misbehave\r\n", b"lru_crawler x\r\n", b"slabs x\r\n"]


def rnum(r: random.Random) -> bytes:
    if r.random() < 0.5:
        return str(r.choice([0, 1, 2, 5, 10, 100])).encode()
    return r.choice(NUMS)


def rexp(r: random.Random) -> bytes:
    """An expiry time that cannot run out during a session (a second's boundary would
    make the two servers differ by chance)."""
    v = rnum(r)
    try:
        if 0 < int(v) < 100_000:
            return b"100000"
    except ValueError:
        pass
    return v


def rdata(r: random.Random) -> bytes:
    c = r.random()
    if c < 0.3:
        return str(r.randint(0, 200)).encode()
    if c < 0.5:
        return b"18446744073709551615"
    if c < 0.6:
        return b"12 34"
    if c < 0.7:
        return b""
    # No "MN" inside a value: it would look like the sentinel's reply.
    return bytes(r.choice(b"abcxyz09 \r\n") for _ in range(r.randint(0, 40)))


def text_request(r: random.Random) -> bytes:
    c = r.random()
    if c < 0.3:
        cmd = r.choice([b"set", b"add", b"replace", b"append", b"prepend", b"cas"])
        data = rdata(r)
        nbytes = str(len(data)).encode() if r.random() < 0.85 else rnum(r)
        toks = [cmd, r.choice(KEYS), rnum(r) if r.random() < 0.2 else b"0",
                rexp(r) if r.random() < 0.2 else b"0", nbytes]
        if cmd == b"cas" and r.random() < 0.9:
            toks.append(b"{CAS%d}" % r.randint(1, 6) if r.random() < 0.7 else rnum(r))
        if r.random() < 0.1:
            toks.append(b"noreply")
        if r.random() < 0.05:
            toks.append(b"extra")
        if r.random() < 0.05:
            r.shuffle(toks)
        end = b"\r\n" if r.random() < 0.95 else b"XX\r\n"
        return b" ".join(toks) + b"\r\n" + data + end
    if c < 0.45:
        cmd = r.choice([b"get", b"gets", b"gat", b"gats"])
        toks = [cmd] + ([rexp(r)] if cmd.startswith(b"gat") else [])
        toks += [r.choice(KEYS) for _ in range(r.randint(0, 3))]
        return b" ".join(toks) + b"\r\n"
    if c < 0.55:
        toks = [r.choice([b"incr", b"decr"]), r.choice(KEYS) if r.random() < 0.7 else b"num",
                rnum(r)]
        if r.random() < 0.1:
            toks.append(b"noreply")
        if r.random() < 0.05:
            toks = toks[: r.randint(1, 3)]
        return b" ".join(toks) + b"\r\n"
    if c < 0.62:
        cmd = r.choice([b"delete", b"touch"])
        toks = [cmd, r.choice(KEYS)]
        if cmd == b"touch" or r.random() < 0.2:
            toks.append(rexp(r))
        if r.random() < 0.1:
            toks.append(b"noreply")
        return b" ".join(toks) + b"\r\n"
    if c < 0.9:
        cmd = r.choice([b"mg", b"ms", b"md", b"ma", b"me", b"mn"])
        toks = [cmd] + ([r.choice(KEYS)] if r.random() < 0.97 else [])
        data = None
        if cmd == b"ms":
            data = rdata(r)
            toks.append(str(len(data)).encode() if r.random() < 0.85 else rnum(r))
        for _ in range(r.randint(0, 5)):
            f = r.choice(META_FLAGS)
            if f == b"C" and r.random() < 0.5:
                f += b"{CAS%d}" % r.randint(1, 6)
            elif f in NUMBER_FLAGS and r.random() < 0.8:
                f += rexp(r) if f in (b"T", b"N") else rnum(r)
            elif f == b"M" and r.random() < 0.9:
                f += r.choice([b"E", b"A", b"P", b"R", b"S", b"I", b"D", b"+", b"-", b"a",
                               b"s", b"x", b""])
            toks.append(f)
        line = b" ".join(toks) + b"\r\n"
        if data is not None:
            line += data + (b"\r\n" if r.random() < 0.95 else b"XX\r\n")
        return line
    if c < 0.93:
        return r.choice(MISC)
    return bytes(r.choice(b"ab mgset0123\t-") for _ in range(r.randint(1, 40))) + b"\r\n"


ARITH = (b"incr", b"decr", b"ma")
GETS = (b"get", b"gets", b"gat", b"gats")


def text_batch(r: random.Random, most: int) -> bytes:
    """1 to `most` requests sent in one write (a pipeline). Left out: an arithmetic request
    on a key an earlier request of the same batch named (memcached does not rewrite in
    place an item that a reply still waiting to be written refers to), and a get-family
    request with a key over 250 bytes after the first (memcached drops the unwritten
    replies of the requests before it): both in the module docs."""
    out, named = [], set()
    for _ in range(r.randint(1, most)):
        req = text_request(r)
        toks = req.split()
        if len(toks) > 1 and toks[0] in ARITH and toks[1] in named:
            continue
        if out and toks and toks[0] in GETS and any(len(t) > 250 for t in toks[1:]):
            continue
        named.update(toks[1:])
        out.append(req)
    return b"".join(out)


def expand_text(req: bytes, cas: CasMap) -> bytes:
    return re.sub(rb"\{CAS(\d+)\}", lambda m: str(cas.raw(int(m.group(1)))).encode(), req)


_VALUE_CAS = re.compile(rb"^(VALUE \S+ \d+ \d+ )(\d+)$")
_META = re.compile(rb"^(HD|VA|EN|NF|NS|EX|MN)((?: .*)?)$")


def normalise_text(buf: bytes, cas: CasMap) -> bytes:
    out = []
    for line in buf.split(b"\r\n"):
        # `me`: times, CAS and slab class numbers are the servers' own.
        line = re.sub(rb" la=\d+", b" la=<t>", line)
        line = re.sub(rb" cas=\d+", b" cas=<c>", line)
        line = re.sub(rb" cls=\d+", b" cls=<n>", line)
        line = re.sub(rb" exp=-?\d+", b" exp=<t>", line)
        m = _VALUE_CAS.match(line)
        if m:
            line = m.group(1) + b"<%d>" % cas.token(int(m.group(2)))
        elif (m := _META.match(line)) is not None:
            toks = m.group(2).split(b" ")
            for i, t in enumerate(toks):
                if re.fullmatch(rb"c\d+", t):
                    toks[i] = b"c<%d>" % cas.token(int(t[1:]))
                elif re.fullmatch(rb"t\d+", t):
                    toks[i] = b"t<%d>" % (int(t[1:]) // 10)
            line = m.group(1) + b" ".join(toks)
        out.append(line)
    return b"\r\n".join(out)


# --------------------------------------------------------------------------- binary protocol

OPS = {0x00: "get", 0x01: "set", 0x02: "add", 0x03: "replace", 0x04: "delete", 0x05: "incr",
       0x06: "decr", 0x07: "quit", 0x08: "flush", 0x09: "getq", 0x0a: "noop",
       0x0b: "version", 0x0c: "getk", 0x0d: "getkq", 0x0e: "append", 0x0f: "prepend",
       0x11: "setq", 0x12: "addq", 0x13: "replaceq", 0x14: "deleteq", 0x15: "incrq",
       0x16: "decrq", 0x17: "quitq", 0x18: "flushq", 0x19: "appendq", 0x1a: "prependq",
       0x1c: "touch", 0x1d: "gat", 0x1e: "gatq", 0x23: "gatk", 0x24: "gatkq"}
BIN_KEYS = [b"a", b"b", b"num", b"k" * 250, b"k" * 251, b"", b"x y", b"\x00z"]
SENTINEL_OPAQUE = 0xDEADBEEF


def packet(op: int, key: bytes = b"", extras: bytes = b"", value: bytes = b"", cas: int = 0,
           opaque: int = 0, magic: int = 0x80, datatype: int = 0) -> bytes:
    return struct.pack(">BBHBBHIIQ", magic, op, len(key), len(extras), datatype, 0,
                       len(key) + len(extras) + len(value), opaque, cas) + extras + key + value


def binary_request(r: random.Random) -> list[dict]:
    reqs = []
    for _ in range(r.randint(1, 3)):
        op = r.choice(list(OPS))
        name = OPS[op]
        extras, value = b"", b""
        if name.startswith(("set", "add", "replace")):
            extras = struct.pack(">II", r.choice([0, 1, 0xFFFFFFFF]),
                                 r.choice([0, 0, 100_000, 0xFFFFFFFF, 0x80000000]))
            # No value made only of whitespace: memcached's incr of one reads past the
            # item (module docs) and every later arithmetic on the key would differ.
            value = r.choice([b"", b"1", b"12 34", b"18446744073709551615", b"v" * 100,
                              b"  7", b"\t9\r"])
        elif name.startswith(("incr", "decr")):
            extras = struct.pack(">QQI", r.choice([0, 1, 5, 2**64 - 1]),
                                 r.choice([0, 7, 2**64 - 1]),
                                 r.choice([0, 0xFFFFFFFF, 100_000]))
        elif name.startswith(("touch", "gat")):
            extras = struct.pack(">I", r.choice([0, 100_000, 0xFFFFFFFF]))
        elif name.startswith("flush"):
            extras = r.choice([b"", struct.pack(">I", 0)])
        c = r.random()
        if c < 0.05:
            extras = extras[: r.randint(0, max(0, len(extras) - 1))]
        elif c < 0.1:
            extras += b"\x00" * r.randint(1, 8)
        elif c < 0.13:
            value = b"junk"
        reqs.append(dict(op=op, key=r.choice(BIN_KEYS), extras=extras, value=value,
                         cas=r.randint(1, 6) if r.random() < 0.3 else 0,
                         magic=0x80 if r.random() < 0.98 else r.choice([0x81, 0x00]),
                         datatype=0 if r.random() < 0.97 else 1, opaque=r.randint(0, 5)))
    return reqs


def expand_binary(reqs: list[dict], cas: CasMap) -> bytes:
    return b"".join(packet(q["op"], q["key"], q["extras"], q["value"],
                           cas.raw(q["cas"]) if q["cas"] else 0, q["opaque"], q["magic"],
                           q["datatype"]) for q in reqs)


def parse_binary(buf: bytes) -> tuple[list[tuple], bytes]:
    out = []
    while len(buf) >= 24:
        magic, op, kl, el, dt, st, bl, opq, cas = struct.unpack(">BBHBBHIIQ", buf[:24])
        if len(buf) < 24 + bl:
            break
        out.append((magic, op, kl, el, dt, st, opq, cas, buf[24:24 + bl]))
        buf = buf[24 + bl:]
    return out, buf


def normalise_binary(buf: bytes, cas: CasMap) -> bytes:
    marker = b""
    for m in (b"<closed>", b"<timeout>", b"<send failed>"):
        if buf.endswith(m):
            buf, marker = buf[: -len(m)], m
    packets, rest = parse_binary(buf)
    lines = []
    for magic, op, kl, el, dt, st, opq, c, body in packets:
        if op == 0x0B and st == 0:
            body = b"<version>"
        lines.append(repr((hex(magic), OPS.get(op, hex(op)), kl, el, dt, hex(st), opq,
                           cas.token(c) if c else 0, body)).encode())
    if rest:
        lines.append(b"<%d bytes unparsed>" % len(rest))
    if marker:
        lines.append(marker)
    return b"\n".join(lines)


def dropped_before_close(mc: bytes, mf: bytes) -> bool:
    """memcached closed the connection and sent a subset of what memfabricd sent before
    closing it too: the replies memcached drops when a later request in the same read
    makes it close (see the module docs)."""
    if not (mc.endswith(b"<closed>") and mf.endswith(b"<closed>")):
        return False
    ours = mf.split(b"\n")[:-1]
    theirs = mc.split(b"\n")[:-1]
    it = iter(ours)
    return len(theirs) < len(ours) and all(line in it for line in theirs)


# --------------------------------------------------------------------------- sessions

class Peer:
    """One server, one connection, its CAS tokens."""

    def __init__(self, kind: str, protocol: str, udp: bool = False):
        # One worker thread over UDP: with several, consecutive datagrams may be read by
        # different threads, and a request whose data never came leaves a thread
        # waiting for it or not, which makes sessions differ from run to run.
        self.srv = start_server(kind, udp=udp, args=("-t", "1") if udp else ())
        self.protocol = protocol
        self.udp = udp
        self.req_id = 0
        self.cas = CasMap()
        self.connect()

    def connect(self) -> None:
        if self.udp:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.sock.connect(("127.0.0.1", self.srv.udp_port))
            return
        self.sock = socket.create_connection(self.srv.addr)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def exchange_udp(self, request: bytes, want_mn: int) -> bytes:
        """One datagram (memcached's 8-byte frame header, then the request and the
        sentinel). Each request in it is answered by datagrams of its own (sequence
        numbers from 0, with their total), all with the datagram's request id."""
        sentinel = b"mn\r\n" if self.protocol == "text" else packet(0x0A, opaque=SENTINEL_OPAQUE)
        self.req_id = (self.req_id + 1) & 0xFFFF
        try:
            self.sock.send(struct.pack(">HHHH", self.req_id, 0, 1, 0) + request + sentinel)
        except OSError as e:
            return b"<send failed: %s>" % str(e).encode()
        out = b""
        group: dict[int, bytes] = {}
        deadline = time.monotonic() + STEP_TIMEOUT
        self.sock.settimeout(0.05)
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(1 << 17)
            except (socket.timeout, ConnectionRefusedError):
                continue
            if len(data) < 8:
                return out + b"<short datagram %r>" % data
            rid, seq, total, _ = struct.unpack_from(">HHHH", data)
            if rid != self.req_id:
                continue  # a late reply to an earlier step
            group[seq] = data[8:]
            if len(group) == total:
                out += b"".join(group.get(i, b"<lost %d>" % i) for i in range(total))
                group = {}
                if self.done(out, want_mn):
                    return out
        return out + b"<timeout>"

    def done(self, buf: bytes, want_mn: int) -> bool:
        if self.protocol == "text":
            return buf.count(b"MN\r\n") >= want_mn and buf.endswith(b"MN\r\n")
        packets, rest = parse_binary(buf)
        return bool(packets) and packets[-1][6] == SENTINEL_OPAQUE and not rest

    def exchange(self, request: bytes, want_mn: int) -> bytes:
        if self.udp:
            return self.exchange_udp(request, want_mn)
        sentinel = b"mn\r\n" if self.protocol == "text" else packet(0x0A, opaque=SENTINEL_OPAQUE)
        buf = b""
        try:
            self.sock.sendall(request + sentinel)
        except OSError:
            self.sock.close()
            self.connect()
            return b"<send failed>"
        deadline = time.monotonic() + STEP_TIMEOUT
        self.sock.settimeout(0.05)
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(1 << 20)
            except socket.timeout:
                continue
            except OSError:
                data = b""
            if not data:
                self.sock.close()
                self.connect()
                return buf + b"<closed>"
            buf += data
            if self.done(buf, want_mn):
                return buf
        self.sock.close()
        self.connect()
        return buf + b"<timeout>"

    def stop(self) -> None:
        try:
            self.sock.close()
        finally:
            self.srv.stop()

    def restart(self) -> None:
        """A fresh server (over UDP, memcached may be waiting for data no flush reaches)."""
        self.stop()
        self.__init__(self.srv.kind, self.protocol, self.udp)


def session(protocol: str, seed: int, steps: int, max_diffs: int, batch: int = 1,
            udp: bool = False) -> int:
    r = random.Random(seed)
    peers = []
    try:
        peers = [Peer("memcached", protocol, udp), Peer("memfabricd", protocol, udp)]
        history: list[tuple[bytes, list[bytes]]] = []
        diffs = dropped = 0
        resync = False
        for step in range(steps):
            if protocol == "text":
                gen = text_batch(r, batch)
                shown = gen
                keys = set(gen.split()[1:])
                want_mn = 1 + sum(1 for line in gen.split(b"\n") if line.startswith(b"mn"))
                replies = [p.exchange(expand_text(gen, p.cas), want_mn) for p in peers]
                norm = [normalise_text(b, p.cas) for b, p in zip(replies, peers)]
            else:
                reqs = binary_request(r)
                shown = repr([(OPS[q["op"]], q["key"][:12], q["extras"].hex(), q["value"][:16],
                               q["cas"], hex(q["magic"]), q["datatype"]) for q in reqs]).encode()
                keys = {q["key"] for q in reqs}
                replies = [p.exchange(expand_binary(reqs, p.cas), 0) for p in peers]
                norm = [normalise_binary(b, p.cas) for b, p in zip(replies, peers)]
            history.append((shown, replies))
            # memcached that stopped answering (it waits for the data a request announced,
            # memfabricd may refuse the request at once) says nothing more to compare.
            if protocol == "binary" and dropped_before_close(norm[0], norm[1]):
                dropped += 1
                resync = True
            elif norm[0] != norm[1] and not (
                norm[0].endswith(b"<timeout>")
                and norm[1].startswith(norm[0][: -len(b"<timeout>")])
            ):
                resync = True
                diffs += 1
                print(f"=== {protocol} seed {seed} step {step}: {shown!r}")
                print(f"  memcached : {norm[0]!r}")
                print(f"  memfabricd: {norm[1]!r}")
                named = keys - {b"k" * 250, b"k" * 251, b""}

                def names(req: bytes) -> bool:
                    if protocol == "text":
                        return bool(named & set(req.split()))
                    return any(repr(k).encode() in req for k in named)

                earlier = [(i, h) for i, h in enumerate(history[:-1]) if names(h[0])]
                for i, (req, (a, b)) in earlier[-12:]:
                    print(f"    step {i}: {req[:100]!r}")
                    print(f"      memcached {a[:80]!r}\n      memfabricd {b[:80]!r}")
                if diffs >= max_diffs:
                    break
            if norm[0].endswith(b"<timeout>"):
                # memcached still waits for data: what follows would differ by design.
                # Over UDP it takes the next datagrams as that data (memfabricd drops a
                # datagram without a whole request), so both start afresh.
                if udp:
                    for p in peers:
                        p.restart()
                else:
                    resync = True
            if resync:
                # Both stores empty again, and the CAS values seen so far forgotten: a
                # reply one server sent and the other did not carried one.
                resync = False
                flush = b"flush_all\r\n" if protocol == "text" else packet(0x08)
                for p in peers:
                    p.exchange(flush, 1)
                    p.cas = CasMap()
            if not peers[1].srv.alive():
                print(f"memfabricd died at step {step}:\n{peers[1].srv.log()}")
                return 2
        extra = f" ({dropped} replies memcached dropped at a close)" if dropped else ""
        print(f"{protocol} seed {seed}: {step + 1} steps, {diffs} differences{extra}")
        return 1 if diffs else 0
    finally:
        for p in peers:
            p.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", choices=["text", "binary"], default="text")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--max-diffs", type=int, default=15)
    ap.add_argument("--batch", type=int, default=1,
                    help="text: send up to this many requests in one write per step")
    ap.add_argument("--udp", action="store_true",
                    help="each step is one UDP datagram (memcached's frame header)")
    a = ap.parse_args()
    return session(a.protocol, a.seed, a.steps, a.max_diffs, a.batch, a.udp)


if __name__ == "__main__":
    sys.exit(main())
