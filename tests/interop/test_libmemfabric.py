"""libmemfabric in place of libmemcached.so.11, for applications that load it unchanged.

libmemcached's own tools (memccp, memccat, memcrm, memcstat from libmemcached-tools) and
PHP's memcached extension (php8.2-memcached) run twice against the same server: with
Debian's libmemcached, then with ``target/release/libmemfabric.so`` found under the SONAME
(``LD_LIBRARY_PATH``). Exit codes and output must be the same (error messages: the same
error; libmemcached prints a pointer and its source line, libmemfabric what failed). With
memfabricd, libmemfabric reaches it over UCX (``stats fabric``: ``ucx_total_sessions``).

Debian's python3-pylibmc on libmemfabric runs the whole pylibmc suite (test_pylibmc.py) in
its own pytest run (scripts/test.sh), since the library is chosen when Python starts.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

PHP_SCRIPT = REPO / "tests" / "interop" / "php" / "commands.php"


def libmemfabric_path() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    if not target.is_absolute():
        target = REPO / target
    for profile in ("release", "debug"):
        p = target / profile / "libmemfabric.so"
        if p.exists():
            return p
    pytest.fail(f"libmemfabric.so not found under {target}/{{release,debug}} (build it: cargo"
                " build --release -p memfabric-c)", pytrace=False)


@pytest.fixture(scope="module")
def soname_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("libmemfabric")
    (d / "libmemcached.so.11").symlink_to(libmemfabric_path())
    return d


def run(argv, *, lib: Path | None, cwd: Path | None = None,
        preload: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if lib is None:
        env.pop("LD_LIBRARY_PATH", None)
    else:
        env["LD_LIBRARY_PATH"] = str(lib)
    if preload is not None:
        env["LD_PRELOAD"] = str(preload)
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def error_names(text: str) -> list[str]:
    """The error names (libmemcached's strerror texts) a tool printed, in order."""
    return re.findall(r"\b[A-Z][A-Z]+(?: [A-Z]+)*\b", text)


def same(a: subprocess.CompletedProcess, b: subprocess.CompletedProcess, what: str):
    assert a.returncode == b.returncode, f"{what}: exit {a.returncode} vs {b.returncode}"
    assert a.stdout == b.stdout, f"{what}: stdout\n{a.stdout}\n---\n{b.stdout}"
    assert error_names(a.stderr) == error_names(b.stderr), \
        f"{what}: stderr\n{a.stderr}\n---\n{b.stderr}"


def ucx_sessions(server) -> int:
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


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flush(server):
    with socket.create_connection(server.addr, timeout=5) as s:
        s.sendall(b"flush_all\r\n")
        assert s.recv(64).startswith(b"OK")


def test_libmemcached_tools_work_the_same(server, soname_dir, tmp_path):
    servers = f"--servers=127.0.0.1:{server.port}"
    dead = f"--servers=127.0.0.1:{dead_port()}"
    (tmp_path / "file-a.txt").write_text("hello world\n")
    steps = [
        ["memccp", servers, "file-a.txt"],
        ["memccat", servers, "file-a.txt"],
        ["memccat", servers, "missing.txt"],
        ["memccp", "--add", servers, "file-a.txt"],
        ["memcrm", servers, "file-a.txt"],
        ["memcrm", servers, "file-a.txt"],
        ["memccp", "--replace", servers, "file-a.txt"],
        ["memccp", "--add", servers, "file-a.txt"],
        ["memccat", servers, "file-a.txt"],
        ["memcstat", servers, "--server-version"],
        ["memccp", dead, "file-a.txt"],
        ["memccat", dead, "file-a.txt"],
        ["memcrm", servers, "file-a.txt"],
    ]
    # Each library runs the whole sequence from an empty cache.
    flush(server)
    real = [run(step, lib=None, cwd=tmp_path) for step in steps]
    flush(server)
    before = ucx_sessions(server) if server.kind == "memfabricd" else 0
    ours = [run(step, lib=soname_dir, cwd=tmp_path) for step in steps]
    for step, a, b in zip(steps, real, ours):
        same(a, b, " ".join(step))
    assert real[1].stdout == "hello world\n\n" or real[1].stdout.startswith("hello world")
    # memcstat: the same statistics, by name (their values move between the two runs).
    real = run(["memcstat", servers], lib=None)
    ours = run(["memcstat", servers], lib=soname_dir)
    names = lambda out: [l.split(":")[0].strip() for l in out.splitlines()]  # noqa: E731
    assert real.returncode == ours.returncode == 0
    assert names(real.stdout) == names(ours.stdout)
    real = run(["memcstat", servers, "--analyze"], lib=None)
    ours = run(["memcstat", servers, "--analyze"], lib=soname_dir)
    assert real.returncode == ours.returncode == 0
    assert names(real.stdout) == names(ours.stdout)
    if server.kind == "memfabricd":
        assert ucx_sessions(server) > before, "libmemfabric did not reach memfabricd over UCX"


@pytest.mark.parametrize("binary", [False, True], ids=["ascii", "binary"])
def test_php_memcached_works_the_same(server, soname_dir, binary):
    argv = ["php", str(PHP_SCRIPT), str(server.port), "1" if binary else "0", str(dead_port())]
    before = ucx_sessions(server) if server.kind == "memfabricd" else 0
    flush(server)
    real = run(argv, lib=None)
    flush(server)
    ours = run(argv, lib=soname_dir)
    assert "Memcached" not in real.stderr, real.stderr  # the extension loaded
    assert real.returncode == 0, real.stderr
    assert (ours.returncode, ours.stdout, ours.stderr) == (real.returncode, real.stdout, real.stderr)
    assert "bool(true)" in ours.stdout
    if server.kind == "memfabricd":
        assert ucx_sessions(server) > before, "libmemfabric did not reach memfabricd over UCX"


PRELOAD_SCRIPT = """
import sys
import pylibmc
c = pylibmc.Client(["127.0.0.1:%s" % sys.argv[1]], binary=sys.argv[2] == "1")
print(c.set("p1", "one"), c.get("p1"), c.get("nope"), c.add("p1", "x"))
print(sorted(c.get_multi(["p1", "nope"]).items()))
c.set("n", 5)
print(c.incr("n", 3), c.decr("n", 10), c.delete("n"), c.delete("n"))
with open("/proc/self/maps") as maps:
    print("libmemfabric mapped:", "libmemfabric.so" in maps.read())
"""


@pytest.mark.parametrize("binary", ["0", "1"], ids=["ascii", "binary"])
def test_ld_preload_works_for_pylibmc(server, binary, tmp_path):
    """LD_PRELOAD=libmemfabric.so with Debian's pylibmc: the real libmemcached is loaded as
    well, and every function pylibmc calls resolves to libmemfabric's. (PHP loads its
    extensions with RTLD_DEEPBIND, which puts an extension's own libraries before preloaded
    ones: PHP needs LD_LIBRARY_PATH; docs/c-api.md.)"""
    pyl = tmp_path / "pylibmc"
    pyl.mkdir()
    for entry in Path("/usr/lib/python3/dist-packages").iterdir():
        if entry.name == "pylibmc" or entry.name.startswith("_pylibmc"):
            (pyl / entry.name).symlink_to(entry)
    argv = ["/usr/bin/python3", "-c", PRELOAD_SCRIPT, str(server.port), binary]
    env = {"PYTHONPATH": str(pyl)}
    flush(server)
    real = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    flush(server)
    before = ucx_sessions(server) if server.kind == "memfabricd" else 0
    ours = subprocess.run(argv, env={**os.environ, **env, "LD_PRELOAD": str(libmemfabric_path())},
                          capture_output=True, text=True, timeout=60)
    assert real.returncode == 0, real.stderr
    assert ours.returncode == 0, ours.stderr
    assert real.stdout.replace("mapped: False", "") == ours.stdout.replace("mapped: True", "")
    assert "libmemfabric mapped: True" in ours.stdout
    if server.kind == "memfabricd":
        assert ucx_sessions(server) > before, "LD_PRELOAD did not bring libmemfabric in"
