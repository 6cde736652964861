"""Issue 12, acceptance 6: the same kill scenario through pylibmc with libmemcached's
replication (``num_replicas``) and through memfabric's replicated pool (the ``memfabric``
CLI, ``--replicas 2``), on three memfabricd servers each time.

Every key is written (and acknowledged) while all servers are up; then one server is
killed and restarted empty, and every key is read back. libmemcached reads the primary
and fails over only on connection errors: a miss from the restarted, empty primary is
returned as a miss, so about a third of the acknowledged writes come back missing (its
documented behaviour). memfabric reads past a miss to the next copy: none is lost.
"""

from __future__ import annotations

import subprocess

import pylibmc

from conftest import start_server
from test_ketama import memfabric_path

KEYS = [f"side:{i}" for i in range(150)]


def value(key: str) -> bytes:
    return (key * 7).encode()


def three_servers():
    return [start_server("memfabricd") for _ in range(3)]


def test_libmemcached_replication_loses_acknowledged_writes_when_a_primary_restarts():
    servers = three_servers()
    try:
        mc = pylibmc.Client([s.hostport for s in servers], binary=True,
                            behaviors={"ketama": True, "num_replicas": 2})
        for k in KEYS:
            assert mc.set(k, value(k)) is True  # acknowledged
        victim = 0
        servers[victim].stop()
        servers[victim] = start_server_on(servers[victim].port)
        mc2 = pylibmc.Client([s.hostport for s in servers], binary=True,
                             behaviors={"ketama": True, "num_replicas": 2})
        lost = sum(1 for k in KEYS if mc2.get(k) != value(k))
        print(f"libmemcached (pylibmc, num_replicas=2): {lost} of {len(KEYS)} "
              "acknowledged writes read back missing")
        assert lost > 0, "libmemcached was expected to return the empty primary's misses"
    finally:
        for s in servers:
            s.stop()


def memfabric(server_list: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([memfabric_path(), "--servers", server_list, "--replicas", "2",
                           "--timeout", "2000", *args], capture_output=True, timeout=30)


def test_memfabric_replication_loses_none_in_the_same_scenario():
    servers = three_servers()
    try:
        hosts = ",".join(s.hostport for s in servers)
        for k in KEYS:
            r = memfabric(hosts, "set", k, value(k).decode())
            assert r.returncode == 0, r.stderr
            assert b" of 3 copies" in r.stderr, r.stderr
        victim = 0
        servers[victim].stop()
        servers[victim] = start_server_on(servers[victim].port)
        lost = 0
        for k in KEYS:
            r = memfabric(hosts, "get", k)
            if (r.returncode, r.stdout) != (0, value(k)):
                lost += 1
        print(f"memfabric (--replicas 2): {lost} of {len(KEYS)} acknowledged writes lost")
        assert lost == 0
    finally:
        for s in servers:
            s.stop()


def start_server_on(port: int):
    """memfabricd again on `port` (the one a killed server had), empty."""
    return start_server("memfabricd", port=port)
