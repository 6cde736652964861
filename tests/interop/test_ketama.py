"""memfabric's ketama places keys where libmemcached (through pylibmc) places them.

Three memcached servers; pylibmc stores 1,000 keys with a ketama behaviour; a plain
socket `get` on each server finds which one holds each key; `memfabric locate` must
name that server for every key. Cases: plain ketama with libmemcached's default hash
(one-at-a-time) and with MD5, and weighted ketama with equal and with unequal weights.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pylibmc
import pytest

from conftest import REPO

NKEYS = 1000
KEYS = [f"ketama:{i}:{'x' * (i % 7)}" for i in range(NKEYS)]


def memfabric_path() -> str:
    env = os.environ.get("MEMFABRIC")
    if env:
        p = Path(env)
        return str(p if p.is_absolute() else REPO / p)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    if not target.is_absolute():
        target = REPO / target
    for profile in ("release", "debug"):
        p = target / profile / "memfabric"
        if p.exists():
            return str(p)
    pytest.fail(f"memfabric not found under {target}/{{release,debug}} (build it: cargo build"
                " --release -p memfabric-cli, or set MEMFABRIC)", pytrace=False)


def held_keys(server) -> set[str]:
    """The keys of KEYS that `server` holds, by a plain multi-get over a socket."""
    with socket.create_connection(server.addr, timeout=5) as s:
        s.sendall(("get " + " ".join(KEYS) + "\r\n").encode())
        buf = b""
        while not buf.endswith(b"END\r\n"):
            chunk = s.recv(65536)
            assert chunk, "server closed the connection"
            buf += chunk
    held = set()
    lines = buf.split(b"\r\n")
    for line in lines:
        if line.startswith(b"VALUE "):
            held.add(line.split()[1].decode())
    return held


CASES = {
    # id: (pylibmc behaviours, weights, memfabric distribution flags)
    "ketama-default-hash": ({"ketama": True}, (1, 1, 1),
                            ["--distribution", "ketama", "--hash", "default"]),
    "ketama-md5": ({"ketama": True, "hash": "md5"}, (1, 1, 1),
                   ["--distribution", "ketama", "--hash", "md5"]),
    "weighted-equal": ({"ketama_weighted": True}, (1, 1, 1), ["--distribution", "weighted"]),
    "weighted-1-3-2": ({"ketama_weighted": True}, (1, 3, 2), ["--distribution", "weighted"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_memfabric_locate_agrees_with_libmemcached(servers, case):
    behaviors, weights, flags = CASES[case]
    srvs = [servers("memcached") for _ in range(3)]
    specs = [f"{s.hostport}:{w}" for s, w in zip(srvs, weights)]
    mc = pylibmc.Client(specs, behaviors=behaviors)
    try:
        for k in KEYS:
            assert mc.set(k, b"v") is True
    finally:
        mc.disconnect_all()

    holder = {}
    for s in srvs:
        for k in held_keys(s):
            assert k not in holder, f"{k} on two servers"
            holder[k] = s.hostport
    assert len(holder) == NKEYS
    counts = {s.hostport: sum(1 for h in holder.values() if h == s.hostport) for s in srvs}
    assert all(c > 0 for c in counts.values()), counts

    out = subprocess.run([memfabric_path(), "--servers", ",".join(specs), *flags, "locate", *KEYS],
                         capture_output=True, timeout=60, check=True).stdout.decode()
    located = dict(line.rsplit(" ", 1) for line in out.splitlines())
    assert len(located) == NKEYS
    wrong = [(k, holder[k], located[k]) for k in KEYS if located[k] != holder[k]]
    assert not wrong, f"{len(wrong)} of {NKEYS} keys disagree, e.g. {wrong[:5]}"
    if case == "weighted-1-3-2":
        # The weights matter: the weight-3 server holds the most keys.
        assert counts[srvs[1].hostport] == max(counts.values()), counts
