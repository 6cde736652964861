"""Fixtures: Debian's memcached and memfabricd on free loopback ports.

Every server a test starts is killed when the test ends, whatever happens. memfabricd
is found through ``$MEMFABRICD`` (relative paths are taken from the repository root),
else ``target/release/memfabricd``, else ``target/debug/memfabricd``. A missing or
crashing memfabricd makes its tests FAIL, never skip: CI must not pass silently.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KINDS = ("memcached", "memfabricd")
START_TIMEOUT = 10.0


def memcached_path() -> str:
    path = shutil.which("memcached") or "/usr/bin/memcached"
    if not os.path.exists(path):
        pytest.fail("memcached is not installed (run scripts/setup.sh)", pytrace=False)
    return path


def memfabricd_path() -> str:
    env = os.environ.get("MEMFABRICD")
    if env:
        p = Path(env)
        if not p.is_absolute():
            p = REPO / p
        if not p.exists():
            pytest.fail(f"MEMFABRICD={env} does not exist (build it: cargo build --release"
                        " -p memfabric-server)", pytrace=False)
        return str(p)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    if not target.is_absolute():
        target = REPO / target
    for profile in ("release", "debug"):
        p = target / profile / "memfabricd"
        if p.exists():
            return str(p)
    pytest.fail(f"memfabricd not found under {target}/{{release,debug}} (build it: cargo build"
                " --release -p memfabric-server, or set MEMFABRICD)", pytrace=False)


def free_port() -> int:
    """A port that is free for both TCP and UDP on 127.0.0.1 right now."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                    u.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


@dataclass
class Server:
    kind: str
    argv: list[str]
    proc: subprocess.Popen | None = None
    port: int = 0
    udp_port: int = 0
    unix_path: str | None = None
    log_path: str = ""
    tmpdir: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def addr(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # SIGKILL: memcached takes a full second to honour SIGTERM, and a test
            # server has nothing worth a graceful shutdown.
            self.proc.kill()
            self.proc.wait(timeout=10)
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def _accepts(server: Server) -> bool:
    try:
        if server.unix_path:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(0.5)
                s.connect(server.unix_path)
        else:
            socket.create_connection(server.addr, timeout=0.5).close()
        return True
    except OSError:
        return False


def start_server(kind: str, *, udp: bool = False, unix: bool = False,
                 args: tuple[str, ...] = (), port: int | None = None) -> Server:
    """Start ``kind`` on a fresh port (or unix socket) and wait until it accepts.

    ``port`` asks for that TCP port (a restart on a killed server's port); other ports
    the server needs are still fresh ones, never the same number twice."""
    if kind not in KINDS:
        raise ValueError(kind)
    exe = memcached_path() if kind == "memcached" else memfabricd_path()
    last_error = ""
    for _attempt in range(3):  # another process may grab the port between probe and bind
        tmpdir = tempfile.mkdtemp(prefix="mfi-")  # short: sun_path is 108 bytes at most
        srv = Server(kind=kind, argv=[], tmpdir=tmpdir, log_path=os.path.join(tmpdir, "log"))
        argv = [exe]
        if unix:
            srv.unix_path = os.path.join(tmpdir, "sock")
            argv += ["-s", srv.unix_path]
        else:
            srv.port = port if port is not None else free_port()
            srv.udp_port = srv.port if udp else 0
            argv += ["-p", str(srv.port), "-U", str(srv.udp_port), "-l", "127.0.0.1"]
        if kind == "memcached" and os.geteuid() == 0:
            argv += ["-u", "root"]  # memcached refuses to run as root without it
        if kind == "memfabricd" and "--ucx-port" not in args:
            # Its UCX listener on a free port of its own (the default, 11311, is one port
            # for every server on the machine): clients find it with `stats fabric`.
            ucx_port = free_port()
            while ucx_port == srv.port:
                ucx_port = free_port()
            argv += ["--ucx-port", str(ucx_port)]
        argv += list(args)
        srv.argv = argv
        with open(srv.log_path, "wb") as log:
            srv.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, cwd=tmpdir)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if not srv.alive():
                break
            if _accepts(srv):
                if udp:
                    time.sleep(0.05)  # UDP has no accept; TCP being up means setup is done
                return srv
            time.sleep(0.01)
        code = srv.proc.poll()
        output = srv.log()
        last_error = (f"{kind} ({' '.join(argv)}) "
                      + (f"exited with {code}" if code is not None else
                         f"did not accept within {START_TIMEOUT}s")
                      + f"; its output:\n{output}")
        srv.stop()
        if code is None or "in use" not in output:
            break
    pytest.fail(last_error, pytrace=False)


@pytest.fixture
def servers():
    """A factory: ``servers(kind, udp=..., unix=...)``; all started ones die at teardown."""
    started: list[Server] = []

    def _start(kind: str, **kw) -> Server:
        srv = start_server(kind, **kw)
        started.append(srv)
        return srv

    yield _start
    for srv in started:
        srv.stop()


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture
def server(kind, servers) -> Server:
    """A fresh TCP server of each kind (tests using it run once per kind)."""
    return servers(kind)


@pytest.fixture
def udp_server(kind, servers) -> Server:
    return servers(kind, udp=True)


@pytest.fixture
def unix_server(kind, servers) -> Server:
    return servers(kind, unix=True)
