"""The `memfabric` CLI's output and exit codes (0 done, 1 miss / not found, 2 error),
against memcached and memfabricd alike."""

from __future__ import annotations

import subprocess

from conftest import free_port
from test_ketama import memfabric_path


def run(server_list: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([memfabric_path(), "--servers", server_list, "--timeout", "2000", *args],
                          input=stdin, capture_output=True, timeout=30)


def test_get_of_missing_key_exits_1(server):
    r = run(server.hostport, "get", "missing")
    assert (r.returncode, r.stdout) == (1, b"")


def test_set_then_get_prints_the_raw_value(server):
    assert run(server.hostport, "set", "k", "hello world").returncode == 0
    r = run(server.hostport, "get", "k")
    assert (r.returncode, r.stdout) == (0, b"hello world")


def test_set_reads_the_value_from_stdin_with_dash(server):
    data = bytes(range(256)) * 40 + b"\r\nEND\r\n"
    assert run(server.hostport, "set", "bin", "-", stdin=data).returncode == 0
    r = run(server.hostport, "get", "bin")
    assert (r.returncode, r.stdout) == (0, data)


def test_set_passes_flags_and_exptime(server):
    assert run(server.hostport, "set", "f", "v", "--flags", "77", "--exptime", "1000").returncode == 0
    import socket
    with socket.create_connection(server.addr, timeout=5) as s:
        s.sendall(b"mg f f t v\r\n")
        reply = s.recv(4096)
    assert reply.startswith(b"VA 1 f77 t"), reply
    ttl = int(reply.split(b" t")[1].split(b"\r\n")[0])
    assert 990 <= ttl <= 1000


def test_delete_exits_1_when_not_found(server):
    assert run(server.hostport, "set", "d", "v").returncode == 0
    assert run(server.hostport, "delete", "d").returncode == 0
    assert run(server.hostport, "delete", "d").returncode == 1
    assert run(server.hostport, "get", "d").returncode == 1


def test_stats_prints_every_server(servers, kind):
    a, b = servers(kind), servers(kind)
    r = run(f"{a.hostport},{b.hostport}", "stats")
    assert r.returncode == 0
    out = r.stdout.decode()
    assert out.count("STAT pid ") == 2
    assert a.hostport in out and b.hostport in out
    r = run(a.hostport, "stats", "settings")
    assert r.returncode == 0 and "STAT maxbytes " in r.stdout.decode()


def test_ping_prints_versions_and_exits_2_if_a_server_is_down(server):
    r = run(server.hostport, "ping")
    assert r.returncode == 0
    assert r.stdout.decode().startswith(f"{server.hostport} VERSION 1.")
    dead = f"127.0.0.1:{free_port()}"
    r = run(f"{server.hostport},{dead}", "ping")
    assert r.returncode == 2
    lines = r.stdout.decode().splitlines()
    assert lines[0].startswith(f"{server.hostport} VERSION")
    assert lines[1].startswith(f"{dead} DOWN")


def test_errors_exit_2(server):
    dead = f"127.0.0.1:{free_port()}"
    assert run(dead, "get", "k").returncode == 2
    assert run(dead, "set", "k", "v").returncode == 2
    assert run(dead, "stats").returncode == 2
    assert run(server.hostport, "get", "bad\x01key").returncode == 2
    assert run(server.hostport, "set", "x" * 251, "v").returncode == 2
    assert run("host:notaport", "get", "k").returncode == 2
    assert run(server.hostport, "nosuchcommand").returncode == 2


def test_locate_prints_one_server_per_key(servers):
    a, b = servers("memfabricd"), servers("memfabricd")
    keys = [f"k{i}" for i in range(50)]
    r = run(f"{a.hostport},{b.hostport}", "locate", *keys)
    assert r.returncode == 0
    lines = r.stdout.decode().splitlines()
    assert [line.split()[0] for line in lines] == keys
    assert {line.split()[1] for line in lines} == {a.hostport, b.hostport}
