"""TLS (`-Z`) against Debian's memcached with the same certificates, made here.

pymemcache with an ``ssl.SSLContext`` runs the same operations against memcached and
memfabricd and must get the same results; client certificates under ``ssl_verify_mode``
(none, wrong, right) are accepted or refused alike; ``ssl_min_version``, ``notls:``
listeners and ``refresh_certs`` behave alike. The certificates are made with openssl
for each test (EC P-256; the server's for 127.0.0.1).
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess

import pytest
from pymemcache.client.base import Client

from conftest import KINDS, free_port


def _openssl(*args: str, cwd: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _key_and_request(name: str, cn: str, cwd: str) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=cwd)


def _sign(name: str, cwd: str, ext: str | None = None) -> None:
    args = ["x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2"]
    if ext:
        args += ["-extfile", ext]
    _openssl(*args, cwd=cwd)


@pytest.fixture
def certs(tmp_path):
    d = str(tmp_path)
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=memfabric-test-ca", cwd=d)
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    # X.509 v3 (an extension): rustls, like browsers, takes no v1 certificates.
    with open(os.path.join(d, "client.ext"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\n")
    for name, cn in (("server", "server-one"), ("server2", "server-two"), ("client", "client")):
        _key_and_request(name, cn, d)
        _sign(name, d, "san.ext" if name.startswith("server") else "client.ext")
    # A client certificate no CA of the server's signed.
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", "stranger.key", "-out", "stranger.crt", "-days", "2",
             "-subj", "/CN=stranger", cwd=d)
    return d


def _tls_args(certs: str, *extra: str) -> tuple[str, ...]:
    opts = [f"ssl_chain_cert={certs}/server.crt", f"ssl_key={certs}/server.key", *extra]
    return ("-Z", "-o", ",".join(opts))


def _context(certs: str, client: str | None = None, **kw) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca.crt"))
    if client:
        ctx.load_cert_chain(os.path.join(certs, f"{client}.crt"),
                            os.path.join(certs, f"{client}.key"))
    for k, v in kw.items():
        setattr(ctx, k, v)
    return ctx


def _client(server, ctx: ssl.SSLContext, port: int | None = None) -> Client:
    return Client(("127.0.0.1", port or server.port), tls_context=ctx, connect_timeout=5,
                  timeout=5)


def _workload(c: Client) -> list:
    """Operations whose results must be the same on both servers."""
    big = bytes(range(256)) * 2000  # 512000 bytes: many TLS records, pinned replies
    out = [
        c.set("k", b"v", noreply=False),
        c.get("k"),
        c.set("big", big, noreply=False),
        c.get("big") == big,
        c.add("k", b"x", noreply=False),
        c.incr("n", 1),
        c.set("n", b"10", noreply=False),
        c.incr("n", 5),
        c.get_many(["k", "n", "missing"]),
        c.delete("k", noreply=False),
        c.get("k"),
    ]
    # Pipelined: many requests in one write, many replies in one read.
    c.set_many({f"p{i}": str(i).encode() for i in range(200)}, noreply=False)
    out.append(c.get_many([f"p{i}" for i in range(200)]) ==
               {f"p{i}": str(i).encode() for i in range(200)})
    return out


def _refused(server, ctx: ssl.SSLContext) -> bool:
    """The server does not serve this client: the handshake or the first request fails."""
    c = _client(server, ctx)
    try:
        c.version()
        return False
    except (ssl.SSLError, OSError, Exception):  # noqa: BLE001 - any failure is a refusal
        return True
    finally:
        c.close()


def _stat(server, ctx, name: str, group: str | None = None) -> str:
    c = _client(server, ctx)
    try:
        stats = c.stats(group) if group else c.stats()
        return stats[name.encode()] if name.encode() in stats else stats[name]
    finally:
        c.close()


def test_pymemcache_over_tls_gets_the_same_results(servers, certs):
    results = {}
    for kind in KINDS:
        srv = servers(kind, args=_tls_args(certs))
        c = _client(srv, _context(certs))
        results[kind] = _workload(c)
        settings = c.stats("settings")
        assert settings[b"ssl_enabled"] in (True, b"yes", "yes"), kind
        c.close()
        # Plain text on a TLS port is not served.
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(b"version\r\n")
            try:
                got = s.recv(100)
            except OSError:
                got = b""
            assert not got.startswith(b"VERSION"), kind
    assert results["memfabricd"] == results["memcached"]


@pytest.mark.parametrize("mode", ["1", "2"])
def test_client_certificates_are_checked_as_memcached_checks_them(servers, certs, mode):
    verdicts = {}
    for kind in KINDS:
        srv = servers(kind, args=_tls_args(certs, f"ssl_verify_mode={mode}",
                                           f"ssl_ca_cert={certs}/ca.crt"))
        verdicts[kind] = {
            who: _refused(srv, _context(certs, who)) for who in (None, "client", "stranger")
        }
    assert verdicts["memfabricd"] == verdicts["memcached"], verdicts
    # Request (1): no certificate is fine, a wrong one is not; require (2): only the
    # CA's client gets in.
    want = {None: mode == "2", "client": False, "stranger": True}
    assert verdicts["memfabricd"] == want


def test_min_version_notls_listeners_and_refresh_certs(servers, certs):
    for kind in KINDS:
        plain_port = free_port()
        srv = servers(kind, args=(*_tls_args(certs, "ssl_min_version=3"),
                                  "-l", f"notls:127.0.0.1:{plain_port}"))
        # TLS 1.2 is below the minimum.
        assert _refused(srv, _context(certs, maximum_version=ssl.TLSVersion.TLSv1_2)), kind
        # The notls: listener speaks plain text.
        plain = Client(("127.0.0.1", plain_port), connect_timeout=5, timeout=5)
        assert plain.set("x", b"1", noreply=False), kind
        plain.close()
        # refresh_certs: a new certificate for new connections.
        ctx = _context(certs)
        for name in ("crt", "key"):
            os.replace(os.path.join(certs, f"server.{name}"),
                       os.path.join(certs, f"server-old.{name}"))
            os.link(os.path.join(certs, f"server2.{name}"), os.path.join(certs, f"server.{name}"))
        c = _client(srv, ctx)
        c.version()
        sock = c.sock
        sock.sendall(b"refresh_certs\r\n")
        assert sock.recv(100) == b"OK\r\n", kind
        c.close()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                subject = dict(x[0] for x in s.getpeercert()["subject"])
                assert subject["commonName"] == "server-two", kind
        # A certificate that cannot be read: memcached's error, and the old one stays.
        for name in ("crt", "key"):
            os.remove(os.path.join(certs, f"server.{name}"))
            os.replace(os.path.join(certs, f"server-old.{name}"),
                       os.path.join(certs, f"server.{name}"))
        with open(os.path.join(certs, "server.crt"), "w") as f:
            f.write("not a certificate\n")
        c = _client(srv, ctx)
        c.version()
        c.sock.sendall(b"refresh_certs\r\n")
        line = c.sock.recv(300)
        assert line.startswith(b"Error loading the certificate chain: "), (kind, line)
        assert c.version(), kind
        c.close()
        _key_and_request("server", "server-one", certs)
        _sign("server", certs, "san.ext")
