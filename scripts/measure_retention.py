#!/usr/bin/env python3
"""How many items does a server keep at a given -m? memfabricd against memcached.

Starts Debian's memcached and memfabricd with the same -m and -t on free loopback ports,
writes keys "k<i>" with values of each size until well past what fits, then counts how
many keys are still readable (multi-get in batches). Prints a markdown table; with
--write-doc, replaces the table in docs/store.md after the <!-- retention-table --> mark.

    scripts/measure_retention.py [--memory 64] [--sizes 32,1024] [--write-doc]
"""
import argparse
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd, port):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return p
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise RuntimeError(f"server did not start: {cmd}")


def recv_until(sock, end):
    buf = b""
    while not buf.endswith(end):
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("connection closed")
        buf += chunk
    return buf


def fill_and_count(port, nkeys, size):
    s = socket.create_connection(("127.0.0.1", port))
    value = b"x" * size
    batch = 500
    for start_i in range(0, nkeys, batch):
        req = b"".join(
            b"set k%d 0 0 %d noreply\r\n%s\r\n" % (i, size, value)
            for i in range(start_i, min(nkeys, start_i + batch))
        )
        s.sendall(req + b"mn\r\n")
        recv_until(s, b"MN\r\n")
    held = 0
    for start_i in range(0, nkeys, batch):
        keys = b" ".join(b"k%d" % i for i in range(start_i, min(nkeys, start_i + batch)))
        s.sendall(b"get " + keys + b"\r\n")
        held += recv_until(s, b"END\r\n").count(b"VALUE ")
    s.close()
    return held


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memory", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default="32,1024")
    ap.add_argument("--memfabricd", default=os.path.join(ROOT, "target/release/memfabricd"))
    ap.add_argument("--write-doc", action="store_true")
    a = ap.parse_args()
    rows = []
    for size in [int(x) for x in a.sizes.split(",")]:
        # Enough keys to overflow the memory twice over even at zero overhead.
        nkeys = 2 * a.memory * (1 << 20) // (size + 8)
        counts = {}
        for name in ("memcached", "memfabricd"):
            port = free_port()
            args = ["-p", str(port), "-U", "0", "-l", "127.0.0.1", "-m", str(a.memory), "-t", str(a.threads)]
            cmd = (["memcached", "-u", "root"] if name == "memcached" else [a.memfabricd]) + args
            p = start(cmd, port)
            try:
                counts[name] = fill_and_count(port, nkeys, size)
            finally:
                p.kill()
                p.wait()
        ratio = counts["memfabricd"] / max(1, counts["memcached"])
        rows.append((size, counts["memcached"], counts["memfabricd"], ratio))
    table = [
        f"Items retained at `-m {a.memory}` (twice as many writes as fit, then every key read back):",
        "",
        "| value size | memcached 1.6 | memfabricd | ratio |",
        "|---:|---:|---:|---:|",
    ]
    for size, mc, mf, r in rows:
        table.append(f"| {size} B | {mc} | {mf} | {r:.2f}x |")
    text = "\n".join(table)
    print(text)
    if a.write_doc:
        path = os.path.join(ROOT, "docs/store.md")
        doc = open(path).read()
        mark = "<!-- retention-table -->"
        head = doc.split(mark)[0]
        cmd = "scripts/measure_retention.py --memory %d --sizes %s --write-doc" % (a.memory, a.sizes)
        open(path, "w").write(head + mark + "\n\n" + text + f"\n\nCommand: `{cmd}`\n")
    return 0 if all(r >= 1.0 for *_, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
