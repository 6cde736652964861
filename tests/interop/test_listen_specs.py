"""``-l`` entries, side by side: memcached and memfabricd are started with the same
``-p`` and ``-l`` flags and must listen on exactly the same addresses, or both refuse to
start with the same exit status (and, for a malformed entry, the same first line).

memcached's reading of ``-l`` has corners its documentation does not give: a repeated
``-l`` whose text already occurs is skipped, an entry with more than one colon and no
brackets is an IPv6 address without a port, ``*`` is every interface, ``;`` separates as
``,`` does. Listening sockets are read from ``ss`` by process id.
"""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from conftest import free_port, memcached_path, memfabricd_path

CASES = [
    ["127.0.0.1", "127.0.0.1"],
    ["127.0.0.1:{q}", "127.0.0.1"],
    ["127.0.0.1", "127.0.0.1:{q}"],
    ["127.0.0.1;127.0.0.2"],
    ["*"],
    ["*:{q}"],
    ["[::1]:{q}"],
    ["[::1]x"],
    ["::1"],
    ["::1:{q}"],
    ["127.0.0.1:abc"],
    ["[::1"],
    ["localhost:{q}"],
    ["127.0.0.1,127.0.0.1"],
]


def listening(pid: int) -> set[str]:
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return {line.split()[3] for line in out.splitlines() if f"pid={pid}," in line}


def outcome(kind: str, port: int, listen: list[str]):
    """(exit status, first line of its output) if it refused to start, else the
    addresses it listens on."""
    argv = [memcached_path() if kind == "memcached" else memfabricd_path(),
            "-p", str(port), "-U", "0"]
    if kind == "memcached" and os.geteuid() == 0:
        argv += ["-u", "root"]
    if kind == "memfabricd":
        argv += ["--ucx-port", "0"]
    for entry in listen:
        argv += ["-l", entry]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 10
        seen: set[str] = set()
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                first = (proc.stdout.read() or "").splitlines()[:1]
                return ("exited", proc.returncode, first[0] if first else "")
            now = listening(proc.pid)
            if now and now == seen:
                return ("listens", sorted(now))
            seen = now
            time.sleep(0.2)
        pytest.fail(f"{kind} {argv}: neither listened nor exited", pytrace=False)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


@pytest.mark.parametrize("listen", CASES, ids=lambda c: " -l ".join(c))
def test_listen_entries_as_memcached(listen):
    port, q = free_port(), free_port()
    entries = [e.format(q=q) for e in listen]
    got = {kind: outcome(kind, port, entries) for kind in ("memcached", "memfabricd")}
    mc, mf = got["memcached"], got["memfabricd"]
    if mc[0] == "exited" and mf[0] == "exited":
        assert mf[1] == mc[1], got
        # A malformed entry: memcached's message (which it may run into the next one).
        said = re.match(r'Invalid [^"]*"[^"]*"', mc[2])
        if said:
            assert mf[2] == said.group(0), got
    else:
        assert mf == mc, got
