"""Monitoring-facing stats: memfabricd prints the keys memcached 1.6.18 prints.

The same operations run on a fresh memcached and a fresh memfabricd (both ``-m 8``):
sets of several sizes (so several slab classes), get hits and misses, deletes, incr and
decr, cas good, bad and missing, touch and gat, an append, enough large sets to evict.
Then every stats group memcached answers is read from both, again after ``stats reset``
and again after ``flush_all``:

* ``stats``, ``stats settings``, ``stats sizes``, ``stats extstore``: the same keys in
  the same order.
* ``stats slabs``, ``stats items``, ``stats conns``: the same keys in the same order once
  the leading id (slab class, connection) is replaced by ``N``. Class ids differ by
  design (memfabric's item header is smaller, so the same item can land in a smaller
  class: docs/ARCHITECTURE.md, "Limits and deliberate differences").
* Values must be equal except for the keys in the allow-lists below, each of which
  says why and is documented in docs/ARCHITECTURE.md.
* The per-class command counters of ``stats slabs`` are checked against what the
  operations did, exactly, in the class each key was stored in (learnt per server from
  ``stats cachedump``), and ``stats reset`` must zero exactly what memcached zeroes.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time

import pytest

from conftest import start_server

MEMORY_MB = "8"
# Value sizes of the key groups: each group lands in its own slab class on both servers.
GROUP_SIZES = [10, 100, 1000, 5000, 20000]
KEYS_PER_GROUP = 4
# Large values that overflow -m 8 and force evictions in their class.
EVICT_SIZE = 100_000
EVICT_SETS = 200

PER_CLASS = ["get_hits", "cmd_set", "delete_hits", "incr_hits", "decr_hits", "cas_hits",
             "cas_badval", "touch_hits"]

# ---- keys whose VALUES may differ (every other value must be equal) ----------------------

# `stats`: facts about the process, not the cache.
GENERAL_MAY_DIFFER = {
    "pid", "uptime", "time", "rusage_user", "rusage_system",
    # No libevent: memfabric names its event loop ("mio").
    "libevent",
    # Descriptors and buffers: memfabric has no connection-structure, read-buffer or
    # response-object pools, and reserves its own descriptors (epoll, wake-ups, UCX).
    "connection_structures", "reserved_fds", "read_buf_count", "read_buf_bytes",
    "read_buf_bytes_free", "response_obj_count", "response_obj_bytes",
    # memfabric's index is set-associative (7 slots per bucket) and sized at start.
    "hash_power_level", "hash_bytes",
    # Item sizes differ (smaller header), so the bytes stored differ; the stats replies
    # read back differ in their values, so the bytes written do too.
    "bytes", "bytes_written",
    # How many items a class holds before it evicts follows its chunk and page sizes
    # (both servers must evict: checked per class below).
    "evictions", "evicted_unfetched", "evicted_active",
    # CLOCK has no LRU segments or maintainer: those counters are 0 here (memcached's
    # move with its maintainer thread's timing).
    "lru_maintainer_juggles", "moves_to_cold", "moves_to_warm", "moves_within_lru",
    "direct_reclaims", "lrutail_reflocked",
    # Background reclaiming runs on each server's own schedule (memcached's crawler,
    # memfabric's sweeper): how much of the flushed data each has reclaimed by the time
    # of reading, and how often the crawler started, differ.
    "lru_crawler_starts", "lru_crawler_running", "crawler_items_checked",
    "crawler_reclaimed", "reclaimed", "expired_unfetched",
    # The automover's rule differs (docs/store.md).
    "slabs_moved",
}

# Store-side counters (issue 9 item 7: in-place incr/decr are not stores): also compared
# in a test of their own.
STORE_SIDE = {"total_items"}

# Right after flush_all: memcached's LRU maintainer reclaims the flushed items within
# about a second, memfabric's sweeper within its next tick (woken by the flush), so
# either may still count some of them (docs/store.md, "Counters").
FLUSHED_MAY_DIFFER = {"curr_items"}

# `stats settings`: where memfabric's design differs (docs/ARCHITECTURE.md).
SETTINGS_MAY_DIFFER = {
    "tcpport",  # each server has its own free port
    # memcached prints the time of the last flush_all in its own relative clock;
    # memfabric's immediate flush_all is a CAS boundary with no time: 0.
    "oldest",
    "hash_algorithm",  # xxh3
    "lru_segmented",  # CLOCK, no segments
    "watcher_logbuf_size", "worker_logbuf_size",  # no `watch` log buffers
}

# `stats slabs` / `stats items` (per class, `N:` already stripped): sizes and eviction
# bookkeeping follow each server's class sizes.
SLABS_MAY_DIFFER = {
    "chunk_size", "chunks_per_page", "total_pages", "total_chunks", "used_chunks",
    "free_chunks", "active_slabs", "total_malloced",
}
ITEMS_MAY_DIFFER = {
    "age", "mem_requested", "evicted", "evicted_unfetched", "evicted_time", "number",
    "number_cold", "number_hot", "number_warm", "moves_to_cold", "moves_to_warm",
    "moves_within_lru", "direct_reclaims", "hits_to_hot", "hits_to_warm", "hits_to_cold",
    "hits_to_temp", "crawler_items_checked", "lrutail_reflocked", "reclaimed",
    "expired_unfetched", "crawler_reclaimed", "outofmemory", "evicted_nonzero",
    "evicted_active",
}
CONNS_MAY_DIFFER = {"addr", "listen_addr", "state", "secs_since_last_cmd"}


class Client:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("server closed the connection")
            self.buf += data
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def cmd(self, line: str, data: bytes | None = None) -> str:
        """One command with a one-line reply."""
        payload = line.encode() + b"\r\n"
        if data is not None:
            payload += data + b"\r\n"
        self.sock.sendall(payload)
        return self._line().decode()

    def lines(self, line: str) -> list[str]:
        """A command whose reply ends with END (or is one error line)."""
        self.sock.sendall(line.encode() + b"\r\n")
        out = []
        while True:
            reply = self._line().decode(errors="replace")
            if reply == "END":
                return out
            if reply.endswith("ERROR") or reply.startswith(("CLIENT_ERROR", "SERVER_ERROR")):
                return out + [reply]
            out.append(reply)

    def get(self, keys: str) -> list[str]:
        """Values of a get/gets/gat: the VALUE lines (data lines dropped)."""
        got = []
        for l in self.lines(keys):
            if l.startswith("VALUE "):
                got.append(l)
        return got

    def stats(self, group: str = "") -> list[tuple[str, str]]:
        out = []
        for l in self.lines(f"stats {group}".strip()):
            if not l.startswith("STAT "):
                # An error reply is kept as a pseudo key, so that the comparison fails.
                out.append((f"<{l}>", ""))
                continue
            _, k, v = l.split(" ", 2)
            out.append((k, v))
        return out


def workload(c: Client) -> dict:
    """The operations, identical on both servers. Returns what they should have counted
    per key (the class of each key is learnt afterwards, per server)."""
    expect = {"get_hits": {}, "cmd_set": {}, "delete_hits": {}, "incr_hits": {},
              "decr_hits": {}, "cas_hits": {}, "cas_badval": {}, "touch_hits": {}}

    def count(what: str, key: str, n: int = 1) -> None:
        expect[what][key] = expect[what].get(key, 0) + n

    # Keys of a group share their shape (4-byte key, the group's value size), so they
    # share a class; `p<g>_` keys are never touched again (memcached's cachedump lists
    # only items that stayed in its cold LRU: these are the ones that tell the class).
    for g, size in enumerate(GROUP_SIZES):
        for j in range(KEYS_PER_GROUP):
            assert c.cmd(f"set p{g}_{j} 0 0 {size}", b"v" * size) == "STORED"
            count("cmd_set", f"g{g}")
    for g, size in enumerate(GROUP_SIZES):
        for j in range(KEYS_PER_GROUP):
            assert c.cmd(f"set g{g}_{j} 0 0 {size}", b"v" * size) == "STORED"
            count("cmd_set", f"g{g}")
    # A counter with group 0's shape (ten digits, and it stays ten digits).
    assert c.cmd("set g0_n 0 0 10", b"1000000000") == "STORED"
    count("cmd_set", "g0")

    # get hits: a different number per group; misses count in no class.
    for g in range(len(GROUP_SIZES)):
        for _ in range(g + 1):
            assert len(c.get(f"get g{g}_0")) == 1
            count("get_hits", f"g{g}")
    assert c.get("get nope1 nope2") == []
    assert len(c.get("get g0_0 g1_0 nope3")) == 2
    count("get_hits", "g0")
    count("get_hits", "g1")

    # deletes
    for g in (1, 2):
        assert c.cmd(f"delete g{g}_1") == "DELETED"
        count("delete_hits", f"g{g}")
    assert c.cmd("delete nope") == "NOT_FOUND"

    # incr/decr on a two-digit counter (it stays two digits, so its class holds)
    for _ in range(3):
        c.cmd("incr g0_n 1")
        count("incr_hits", "g0")
    for _ in range(2):
        c.cmd("decr g0_n 1")
        count("decr_hits", "g0")
    assert c.get("get g0_n") == ["VALUE g0_n 0 10"]
    count("get_hits", "g0")
    assert c.cmd("incr nope 1") == "NOT_FOUND"
    assert c.cmd("decr nope 1") == "NOT_FOUND"

    # cas: good, bad, missing (each also a cmd_set in the class of its value's item,
    # which is the group's own class here: same key length, same value size)
    size = GROUP_SIZES[3]
    (value_line,) = c.get("gets g3_2")
    count("get_hits", "g3")
    cas = int(value_line.split()[-1])
    assert c.cmd(f"cas g3_2 0 0 {size} {cas + 1000}", b"w" * size) == "EXISTS"
    count("cas_badval", "g3")
    count("cmd_set", "g3")
    assert c.cmd(f"cas g3_2 0 0 {size} {cas}", b"w" * size) == "STORED"
    count("cas_hits", "g3")
    count("cmd_set", "g3")
    assert c.cmd(f"cas g3_9 0 0 {size} 1", b"w" * size) == "NOT_FOUND"
    count("cmd_set", "g3")

    # touch and gat (a gat hit is a touch hit, not a get hit)
    for _ in range(2):
        assert c.cmd("touch g4_3 1000") == "TOUCHED"
        count("touch_hits", "g4")
    assert c.cmd("touch nope 1000") == "NOT_FOUND"
    assert len(c.get("gat 1000 g0_3")) == 1
    count("touch_hits", "g0")

    # append one byte: cmd_set in the class of the 1-byte request item, the smallest
    # class, which is g0's on both servers (checked by the caller)
    assert c.cmd("append g0_2 0 0 1", b"a") == "STORED"
    count("cmd_set", "g0")
    return expect


def classes_of_groups(c: Client) -> dict[str, int]:
    """group ("g0", ...) -> slab class, from `stats items` and `stats cachedump` of the
    untouched `p<g>_` keys."""
    ids = sorted({int(k.split(":")[1]) for k, _ in c.stats("items")})
    where: dict[str, set[int]] = {}
    for cls in ids:
        for l in c.lines(f"stats cachedump {cls} 0"):
            m = re.match(r"ITEM p(\d+)_\d+ ", l)
            if m:
                where.setdefault(f"g{m.group(1)}", set()).add(cls)
    for g, classes in where.items():
        assert len(classes) == 1, f"group {g} is in several classes: {classes}"
    return {g: classes.pop() for g, classes in where.items()}


def evict(c: Client) -> None:
    for i in range(EVICT_SETS):
        assert c.cmd(f"set ev{i} 0 0 {EVICT_SIZE}", b"e" * EVICT_SIZE) == "STORED"


def strip_id(pairs: list[tuple[str, str]], prefix: str = "") -> list[tuple[str, str, str]]:
    """(id, key with the id replaced by N, value); id "" for keys without one."""
    out = []
    for k, v in pairs:
        m = re.match(rf"^({prefix})(\d+):(.*)$", k)
        if m:
            out.append((m.group(2), f"{m.group(1)}N:{m.group(3)}", v))
        else:
            out.append(("", k, v))
    return out


def per_id_templates(pairs: list[tuple[str, str, str]]) -> tuple[list[list[str]], list[str]]:
    """Key lists of each id (in order) and the trailing id-less keys."""
    blocks: dict[str, list[str]] = {}
    order: list[str] = []
    tail = []
    for i, k, _ in pairs:
        if i == "":
            tail.append(k)
            continue
        if i not in blocks:
            blocks[i] = []
            order.append(i)
        blocks[i].append(k)
    return [blocks[i] for i in order], tail


def probes_closed(port: int) -> None:
    """Wait (bounded) until the server has closed the harness's readiness probes: a probe
    it has not yet closed is still in its curr_connections (it was once read as 2 where
    memcached had 1). Their server sides sit in CLOSE-WAIT until then; the kernel says so
    without a request that would move the counters compared here."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        out = subprocess.run(["ss", "-Htn", "state", "close-wait", f"( sport = :{port} )"],
                             capture_output=True, text=True, check=True).stdout
        if not out.strip():
            return
        time.sleep(0.01)


@pytest.fixture(scope="module")
def runs():
    """Both servers, the workload on each, and everything read back."""
    result = {}
    started = []
    try:
        for kind in ("memcached", "memfabricd"):
            srv = start_server(kind, args=("-m", MEMORY_MB))
            started.append(srv)
            probes_closed(srv.port)
            c = Client(srv.port)
            r = {"expect": workload(c)}
            r["classes"] = classes_of_groups(c)
            r["slabs_before_evict"] = dict(c.stats("slabs"))
            r["general_before_evict"] = dict(c.stats())
            evict(c)
            r["slabs_after_evict"] = dict(c.stats("slabs"))
            r["items_after_evict"] = dict(c.stats("items"))
            r["evict_class"] = r["items_after_evict"] and next(
                int(k.split(":")[1]) for k, v in c.stats("items")
                if k.endswith(":evicted") and v != "0")
            for group in ("", "settings", "items", "slabs", "sizes", "conns", "extstore"):
                r[group or "general"] = c.stats(group)
            assert c.cmd("stats reset") == "RESET"
            r["general_reset"] = c.stats()
            r["items_reset"] = c.stats("items")
            r["slabs_reset"] = c.stats("slabs")
            # After flush_all, what `stats items` lists depends on when each server's
            # background reclaiming runs: only the keys are compared.
            assert c.cmd("flush_all") == "OK"
            r["general_flushed"] = c.stats()
            r["items_flushed"] = c.stats("items")
            r["slabs_flushed"] = c.stats("slabs")
            c.close()
            assert srv.alive(), f"{kind} died: {srv.log()}"
            result[kind] = r
        yield result
    finally:
        for srv in started:
            srv.stop()


def compare(name, mc, mf, may_differ):
    mc_keys = [k for k, _ in mc]
    mf_keys = [k for k, _ in mf]
    missing = [k for k in mc_keys if k not in mf_keys]
    extra = [k for k in mf_keys if k not in mc_keys]
    assert not missing and not extra, f"{name}: missing {missing}, extra {extra}"
    assert mf_keys == mc_keys, f"{name}: order differs"
    differ = [(k, a, b) for (k, a), (_, b) in zip(mc, mf) if a != b and k not in may_differ]
    assert not differ, f"{name}: values differ (memcached, memfabricd): {differ}"


def test_stats_general_has_memcacheds_keys_in_its_order(runs):
    compare("stats", runs["memcached"]["general"], runs["memfabricd"]["general"],
            GENERAL_MAY_DIFFER)


@pytest.mark.parametrize("group", ["general_reset", "general_flushed"])
def test_stats_general_after_reset_and_flush_has_memcacheds_keys(runs, group):
    # Right after `stats reset`, and after flush_all (curr_items, bytes included).
    may_differ = GENERAL_MAY_DIFFER | (FLUSHED_MAY_DIFFER if group == "general_flushed"
                                       else set())
    compare(f"stats ({group})", runs["memcached"][group], runs["memfabricd"][group],
            may_differ)


def test_store_side_counters_equal_memcacheds(runs):
    mc = dict(runs["memcached"]["general"])
    mf = dict(runs["memfabricd"]["general"])
    assert {k: mf[k] for k in STORE_SIDE} == {k: mc[k] for k in STORE_SIDE}


@pytest.mark.parametrize("group", ["settings", "sizes", "extstore"])
def test_fixed_stats_groups_have_memcacheds_keys_in_its_order(runs, group):
    mc, mf = runs["memcached"][group], runs["memfabricd"][group]
    compare(f"stats {group}", mc, mf, SETTINGS_MAY_DIFFER if group == "settings" else set())


@pytest.mark.parametrize("group,prefix,may_differ", [
    ("slabs", "", SLABS_MAY_DIFFER),
    ("items", "items:", ITEMS_MAY_DIFFER),
    ("conns", "", CONNS_MAY_DIFFER),
    ("slabs_reset", "", SLABS_MAY_DIFFER),
    ("items_reset", "items:", ITEMS_MAY_DIFFER),
    ("slabs_flushed", "", SLABS_MAY_DIFFER),
    ("items_flushed", "items:", ITEMS_MAY_DIFFER),
])
def test_per_class_stats_have_memcacheds_keys_for_every_class(runs, group, prefix, may_differ):
    mc = strip_id(runs["memcached"][group], prefix)
    mf = strip_id(runs["memfabricd"][group], prefix)
    mc_blocks, mc_tail = per_id_templates(mc)
    mf_blocks, mf_tail = per_id_templates(mf)
    if group == "items_flushed":
        # Either server may have reclaimed every flushed item by now; a class that is
        # still listed must print memcached's keys.
        template = per_id_templates(strip_id(runs["memcached"]["items"], prefix))[0][0]
        assert all(b == template for b in mc_blocks + mf_blocks), f"{mf_blocks}"
        assert mf_tail == mc_tail
        return
    assert mc_blocks and mf_blocks, f"stats {group}: no per-id keys"
    if group == "conns":
        # A listener and this test's client connection, in that order, on both.
        assert mf_blocks == mc_blocks, f"stats conns: {mf_blocks} != {mc_blocks}"
        return
    # Every id prints the same keys, in the same order, on both servers.
    template = mc_blocks[0]
    assert all(b == template for b in mc_blocks), f"memcached's {group} blocks vary"
    for b in mf_blocks:
        assert b == template, (f"stats {group}: memfabricd prints {b}, memcached {template}; "
                               f"missing {[k for k in template if k not in b]}, "
                               f"extra {[k for k in b if k not in template]}")
    assert mf_tail == mc_tail, f"stats {group}: trailing keys {mf_tail} != {mc_tail}"
    # Values: id-less keys, and per-id keys not allowed to differ, must agree when the
    # counts of ids agree (the per-class counters are checked exactly elsewhere).
    tail_mc = {k: v for i, k, v in mc if i == ""}
    tail_mf = {k: v for i, k, v in mf if i == ""}
    differ = [k for k in tail_mc if tail_mc[k] != tail_mf[k] and k not in may_differ]
    assert not differ, f"stats {group}: {[(k, tail_mc[k], tail_mf[k]) for k in differ]}"


@pytest.mark.parametrize("kind", ["memcached", "memfabricd"])
def test_per_class_counters_count_each_command_in_its_items_class(runs, kind):
    r = runs[kind]
    where = r["classes"]
    for g in range(len(GROUP_SIZES)):
        assert f"g{g}" in where, f"{kind}: no key of group g{g} found by cachedump"
    assert len(set(where.values())) == len(GROUP_SIZES), (
        f"{kind}: the groups must land in distinct classes: {where}")
    slabs = r["slabs_before_evict"]
    classes = sorted({int(k.split(":")[0]) for k in slabs if ":" in k})
    # The 1-byte append's item and group 0's share the smallest class.
    assert where["g0"] == classes[0] == 1, f"{kind}: {where}, classes {classes}"
    want: dict[tuple[int, str], int] = {}
    for what, per_key in r["expect"].items():
        for key, n in per_key.items():
            want[(where[key], what)] = want.get((where[key], what), 0) + n
    got = {(cls, what): int(slabs[f"{cls}:{what}"]) for cls in classes for what in PER_CLASS}
    want_all = {key: want.get(key, 0) for key in got}
    assert got == want_all, f"{kind}: per-class counters {got}, expected {want_all}"
    # The totals of `stats` are the sums over the classes.
    general = r["general_before_evict"]
    for what in PER_CLASS:
        assert int(general[what]) == sum(got[(cls, what)] for cls in classes), (
            f"{kind}: {what} total {general[what]} is not the sum of its classes")


@pytest.mark.parametrize("kind", ["memcached", "memfabricd"])
def test_evictions_count_in_the_evicting_class(runs, kind):
    r = runs[kind]
    cls = r["evict_class"]
    assert cls, f"{kind}: nothing was evicted"
    assert int(r["items_after_evict"][f"items:{cls}:evicted"]) > 0
    # Every large set counted in its class.
    before = int(r["slabs_before_evict"].get(f"{cls}:cmd_set", 0))
    assert int(r["slabs_after_evict"][f"{cls}:cmd_set"]) - before == EVICT_SETS


@pytest.mark.parametrize("kind", ["memcached", "memfabricd"])
def test_stats_reset_zeroes_per_class_event_counters(runs, kind):
    r = runs[kind]
    for k, v in r["slabs_reset"]:
        if k.split(":")[-1] in PER_CLASS:
            assert v == "0", f"{kind}: {k} = {v} after stats reset"
    zeroed = {"evicted", "evicted_nonzero", "evicted_time", "outofmemory", "tailrepairs",
              "reclaimed", "expired_unfetched", "evicted_unfetched", "evicted_active",
              "crawler_reclaimed", "crawler_items_checked", "lrutail_reflocked",
              "moves_to_cold", "moves_to_warm", "moves_within_lru", "direct_reclaims",
              "hits_to_hot", "hits_to_warm", "hits_to_cold", "hits_to_temp"}
    if kind == "memcached":
        # memcached's LRU maintainer thread moves items on its own schedule: between the
        # reset and the read it may count a few moves (seen once in CI-like load).
        zeroed -= {"moves_to_cold", "moves_to_warm", "moves_within_lru"}
    for k, v in r["items_reset"]:
        if k.split(":")[-1] in zeroed:
            assert v == "0", f"{kind}: {k} = {v} after stats reset"
    general = dict(r["general_reset"])
    for k in ("cmd_get", "cmd_set", "get_hits", "get_misses", "cas_hits", "touch_hits",
              "total_items", "evictions", "total_connections"):
        assert general[k] == "0", f"{kind}: {k} = {general[k]} after stats reset"


def _conn_states(port: int) -> dict[str, str]:
    """``stats conns`` states of connections left in known places, by role."""
    def connect() -> socket.socket:
        return socket.create_connection(("127.0.0.1", port), timeout=10)

    roles = {"fresh": connect(), "answered": connect(), "partial line": connect(),
             "part of a value": connect()}
    try:
        roles["answered"].sendall(b"version\r\n")
        assert roles["answered"].recv(100).startswith(b"VERSION ")
        roles["partial line"].sendall(b"get ab")
        roles["part of a value"].sendall(b"set k 0 0 10\r\nabc")
        asker = Client(port)
        deadline = time.monotonic() + 10
        last = None
        while True:
            addr_of, state_of = {}, {}
            for key, value in asker.stats("conns"):
                conn, _, field = key.partition(":")
                if field == "addr":
                    addr_of[value] = conn
                elif field == "state":
                    state_of[conn] = value
            # A connection the server has not accepted yet is not listed: asked again.
            states = {role: state_of.get(addr_of.get("tcp:127.0.0.1:%d" % sock.getsockname()[1]))
                      for role, sock in roles.items()}
            # Until the server has read what the last two sent (a worker of its own may
            # not have yet), they still show the state of a connection that sent nothing,
            # and a worker part way through shows conn_parse_cmd: the states that stay.
            seen = None not in states.values() and all(
                states[r] != "conn_new_cmd" for r in ("partial line", "part of a value"))
            if (seen and states == last) or time.monotonic() > deadline:
                return states
            last = states
            time.sleep(0.1)
    finally:
        for sock in roles.values():
            sock.close()


def test_stats_conns_states_are_memcacheds(servers):
    """A connection that has sent nothing is conn_new_cmd, one waiting for its next
    command or the rest of a line conn_read, one part way through a value conn_nread."""
    states = {kind: _conn_states(servers(kind).port) for kind in ("memcached", "memfabricd")}
    assert states["memfabricd"] == states["memcached"], states
    assert states["memcached"]["part of a value"] == "conn_nread", states
