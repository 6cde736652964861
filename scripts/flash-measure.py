#!/usr/bin/env python3
"""Measure the flash tier's memory, write amplification and restart (docs/flash.md).

    scripts/flash-measure.py [--ram-mb 256] [--flash-gb 4] [--valsize 4096] [--dir DIR]

With the same -m and flash file size, for memfabricd (target/release/memfabricd) and
Debian's memcached with extstore:

1. DRAM per flash item at a full flash tier. memfabricd: resident memory of the flash run
   minus that of a RAM-only run given the same items, divided by the items on flash (the
   index is sized for RAM; a flash item's own cost is its 8-byte slot; the difference
   also holds the write buffers and read threads). memcached: an extstore item keeps its
   header and key in RAM (inside -m) plus its hash-table pointer: the slab memory of the
   classes below the value size plus 8 bytes per item, divided by the items on flash.
2. Write amplification: bytes written to the device / bytes of items evicted into the
   tier, after writing 2.5 times the tier (memfabricd's flash_device_bytes_written /
   flash_admitted_bytes).
3. Restart: items on flash before a clean shutdown (SIGTERM) and before `kill -9`, items
   re-indexed at the start (`flash_recovered`), and of the test's own keys (the latency
   phase's SET flood wrote others) those on flash before (served before, less those in
   RAM) and those served after; the time from start to the first answer, and the
   server's own `flash_recovery_ms`.
4. Latency (memfabricd), one connection pacing 2,000 requests/s for 5 s: GETs of flash
   items, GETs of RAM items (beside the same in the RAM-only run), and SETs while another
   connection floods SETs that keep the flash writer saturated (beside the same flood on
   the RAM-only run). p50/p99 in microseconds, measured by this client (Python: add its
   ~20 us).

Prints a table and writes JSON with --json FILE. Takes a few minutes at the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, argv: list[str], port: int):
        self.port = port
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"server did not start: {' '.join(argv)}")
                time.sleep(0.01)
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.f = self.sock.makefile("rb")
        # Listening is not serving: the listeners are bound before the store (and its
        # flash recovery) is ready; the first answer is.
        self.sock.sendall(b"version\r\n")
        self.f.readline()
        self.serving_after = time.monotonic() - self.started

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def stats(self, group: str = "") -> dict[str, str]:
        self.sock.sendall(f"stats {group}".strip().encode() + b"\r\n")
        out = {}
        while True:
            line = self.f.readline()
            if line in (b"END\r\n", b""):
                return out
            parts = line.decode().split(" ", 2)
            out[parts[1]] = parts[2].strip()

    def fill(self, first: int, count: int, vlen: int) -> None:
        batch = bytearray()
        for i in range(first, first + count):
            v = value(i, vlen)
            batch += b"set k%09d 0 0 %d noreply\r\n" % (i, len(v)) + v + b"\r\n"
            if len(batch) > 1 << 20:
                self.sock.sendall(batch)
                batch.clear()
        self.sock.sendall(batch + b"mn\r\n")
        assert self.f.readline() == b"MN\r\n"

    def served(self, count: int, vlen: int) -> int:
        hits = 0
        for base in range(0, count, 100):
            keys = b" ".join(b"k%09d" % i for i in range(base, min(base + 100, count)))
            self.sock.sendall(b"get " + keys + b"\r\n")
            while True:
                line = self.f.readline()
                if line == b"END\r\n":
                    break
                _, key, _, n = line.split()
                data = self.f.read(int(n) + 2)[:-2]
                if data != value(int(key[1:]), vlen):
                    raise SystemExit(f"wrong value for {key!r}")
                hits += 1
        return hits

    def settle(self) -> None:
        if "pages_buffered" not in self.stats("extstore"):
            time.sleep(2)  # memcached: its storage thread works in the background
            return
        while int(self.stats("extstore").get("pages_buffered", "0")) > 1:
            time.sleep(0.05)
        time.sleep(0.6)  # the last partial page's snapshot

    def stop(self, sig=signal.SIGTERM) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=120)


def value(i: int, vlen: int) -> bytes:
    head = b"value-of-%09d:" % i
    return (head * (vlen // len(head) + 1))[:vlen]


def memfabricd(port: int, ram_mb: int, flash: str | None, extra=()) -> Server:
    argv = [os.path.join(ROOT, "target/release/memfabricd"), "-p", str(port),
            "-l", "127.0.0.1", "--ucx-port", "0", "-m", str(ram_mb), "-t", "4"]
    if flash:
        argv += ["-o", f"ext_path={flash}"]
    return Server(argv + list(extra), port)


def memcached(port: int, ram_mb: int, flash: str | None) -> Server:
    argv = ["memcached", "-p", str(port), "-l", "127.0.0.1", "-U", "0", "-m", str(ram_mb),
            "-t", "4"]
    if os.geteuid() == 0:
        argv += ["-u", "root"]
    if flash:
        argv += ["-o", f"ext_path={flash}"]
    return Server(argv, port)


def paced(s: Server, requests: list[bytes], rate: int = 2000) -> tuple[float, float]:
    """Send one request at a time at `rate`/s; p50 and p99 of the reply time (us)."""
    lat = []
    gap = 1.0 / rate
    nxt = time.perf_counter()
    for req in requests:
        while time.perf_counter() < nxt:
            pass
        nxt += gap
        t = time.perf_counter()
        s.sock.sendall(req)
        line = s.f.readline()
        if line.startswith(b"VALUE"):
            n = int(line.split()[3])
            s.f.read(n + 2)
            line = s.f.readline()
        lat.append(time.perf_counter() - t)
    lat.sort()
    return lat[len(lat) // 2] * 1e6, lat[len(lat) * 99 // 100] * 1e6


def flood(port: int, first: int, seconds: float, vlen: int) -> subprocess.Popen:
    """Another process sending noreply SETs of new keys as fast as it can."""
    code = (
        "import socket,time,sys\n"
        f"s=socket.create_connection(('127.0.0.1',{port}))\n"
        f"i={first}; end=time.time()+{seconds}; v=b'f'*{vlen}\n"
        "while time.time()<end:\n"
        "    b=bytearray()\n"
        "    for _ in range(64):\n"
        "        b+=b'set f%09d 0 0 %d noreply\\r\\n'%(i,len(v))+v+b'\\r\\n'; i+=1\n"
        "    s.sendall(b)\n"
        "print(i)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)


def latencies(s: Server, fill: int, vlen: int, flash_keys: range | None) -> dict:
    r = {}
    n = 10_000
    ram = [b"get k%09d\r\n" % (fill - 1 - (i % 20_000)) for i in range(n)]
    r["ram_get_p50"], r["ram_get_p99"] = paced(s, ram)
    if flash_keys is not None:
        keys = list(flash_keys)
        reqs = [b"get k%09d\r\n" % keys[(i * 7919) % len(keys)] for i in range(n)]
        r["flash_get_p50"], r["flash_get_p99"] = paced(s, reqs)
    v = value(0, vlen)
    sets = [b"set s%09d 0 0 %d\r\n" % (i, len(v)) + v + b"\r\n" for i in range(n)]
    fl = flood(s.port, 0, 8, vlen)
    time.sleep(1)
    r["set_p50_flooded"], r["set_p99_flooded"] = paced(s, sets)
    fl.communicate()
    return {k: round(x, 1) for k, x in r.items()}


def memcached_header_bytes(s: Server, vlen: int) -> int:
    """Slab memory of the classes too small for a value (extstore's item headers)."""
    slabs = s.stats("slabs")
    total = 0
    for k, v in slabs.items():
        parts = k.split(":")
        if len(parts) == 2 and parts[1] == "used_chunks":
            size = int(slabs.get(f"{parts[0]}:chunk_size", "0"))
            if size < vlen // 2:
                total += int(v) * size
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ram-mb", type=int, default=256)
    ap.add_argument("--flash-gb", type=int, default=4)
    ap.add_argument("--valsize", type=int, default=4096)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--json")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="mf-flash-measure-", dir=a.dir)
    flash_bytes = a.flash_gb << 30
    cap = (a.ram_mb * (1 << 20) + flash_bytes) // a.valsize
    fill = cap * 12 // 10  # a full tier: 1.2x what RAM and flash hold
    res: dict[str, dict] = {}
    try:
        # 1. DRAM per flash item.
        for name, start in (("memfabricd", memfabricd), ("memcached", memcached)):
            s = start(free_port(), a.ram_mb, None)
            s.fill(0, fill, a.valsize)
            ram_rss = s.rss()
            ram_lat = latencies(s, fill, a.valsize, None) if name == "memfabricd" else {}
            s.stop()
            path = os.path.join(work, name)
            s = start(free_port(), a.ram_mb, f"{path}:{a.flash_gb}g")
            s.fill(0, fill, a.valsize)
            s.settle()
            st = s.stats()
            on_flash = int(st["extstore_objects_used"])
            r = {"flash_items": on_flash, "ram_only_rss": ram_rss, "flash_rss": s.rss(),
                 "curr_items": int(st["curr_items"])}
            if name == "memfabricd":
                r["dram_per_flash_item"] = (r["flash_rss"] - ram_rss) / max(on_flash, 1)
                r["index_bytes_per_flash_item"] = 8
                # Keys stored first went to flash (RAM keeps the newest).
                lat = latencies(s, fill, a.valsize, range(fill // 10, fill // 10 + 200_000))
                r.update(lat)
                r.update({f"ramonly_{k}": v for k, v in ram_lat.items()})
                st = s.stats()
                r["flash_reads_during_latency"] = int(st["extstore_objects_read"])

            # 2. Write amplification: write on to 2.5x the tier.
            more = int(flash_bytes * 25 // 10 // a.valsize) - fill
            s.fill(fill, max(more, 0), a.valsize)
            s.settle()
            st = s.stats()
            if "flash_device_bytes_written" in st:
                r["write_amplification"] = (int(st["flash_device_bytes_written"])
                                            / max(int(st["flash_admitted_bytes"]), 1))
            else:
                # extstore moves items to flash in the background: measured once it has
                # taken in the second fill.
                time.sleep(5)
                st = s.stats()
                r["flash_items"] = int(st["extstore_objects_used"])
                r["extstore_bytes_written"] = int(st["extstore_bytes_written"])
                hdr = memcached_header_bytes(s, a.valsize)
                r["dram_per_flash_item"] = (hdr + 8 * r["flash_items"]) / max(r["flash_items"], 1)
            # 3. Restarts: clean, then kill -9.
            total = fill + max(more, 0)
            # Items on flash are the test's keys and the latency phase's (its SET
            # flood); the served counts are of the test's keys: those served before the
            # stop, less those in RAM then (the newest: the flood's went to flash or
            # away long before), are the ones on flash a restart must bring back.
            for how, sig in (("clean", signal.SIGTERM), ("kill9", signal.SIGKILL)):
                st = s.stats()
                before = int(st["extstore_objects_used"])
                served_before = s.served(total, a.valsize)
                in_ram = int(st["curr_items"])
                s.stop(sig)
                s = start(free_port(), a.ram_mb, f"{path}:{a.flash_gb}g")
                r[f"{how}_on_flash_before"] = before
                r[f"{how}_recovered"] = int(s.stats().get("flash_recovered", 0))
                r[f"{how}_keys_on_flash_before"] = max(served_before - in_ram, 0)
                r[f"{how}_serving_s"] = round(s.serving_after, 2)
                r[f"{how}_recovery_ms"] = int(s.stats().get("flash_recovery_ms", -1))
                r[f"{how}_served_after"] = s.served(total, a.valsize)
                s.settle()
            s.stop()
            shutil.rmtree(path, ignore_errors=True)
            res[name] = r
            print(name, json.dumps(r), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(f"-m {a.ram_mb}, flash {a.flash_gb} GiB, {a.valsize}-byte values, {fill} items "
          f"stored (1.2x RAM + flash), then up to 2.5x the tier")
    print(f"{'':34}{'memfabricd':>14}{'memcached':>14}")
    rows = [("items on flash", "flash_items", "{:.0f}"),
            ("DRAM bytes per flash item", "dram_per_flash_item", "{:.1f}"),
            ("write amplification", "write_amplification", "{:.3f}"),
            ("clean: on flash before", "clean_on_flash_before", "{:.0f}"),
            ("clean: re-indexed at start", "clean_recovered", "{:.0f}"),
            ("clean: test keys on flash before", "clean_keys_on_flash_before", "{:.0f}"),
            ("clean: served after", "clean_served_after", "{:.0f}"),
            ("clean: serving after (s)", "clean_serving_s", "{:.2f}"),
            ("clean: recovery (ms)", "clean_recovery_ms", "{:.0f}"),
            ("kill -9: on flash before", "kill9_on_flash_before", "{:.0f}"),
            ("kill -9: re-indexed at start", "kill9_recovered", "{:.0f}"),
            ("kill -9: test keys on flash before", "kill9_keys_on_flash_before", "{:.0f}"),
            ("kill -9: served after", "kill9_served_after", "{:.0f}"),
            ("kill -9: serving after (s)", "kill9_serving_s", "{:.2f}"),
            ("kill -9: recovery (ms)", "kill9_recovery_ms", "{:.0f}"),
            ("flash-hit GET p50/p99 (us)", "flash_get", None),
            ("RAM-hit GET p50/p99 (us)", "ram_get", None),
            ("  same, RAM-only run", "ramonly_ram_get", None),
            ("SET p50/p99, writer flooded (us)", "set", None),
            ("  same, RAM-only run", "ramonly_set", None)]
    for label, key, fmt in rows:
        if fmt is None:
            suffix = "_flooded" if key.endswith("set") else ""
            cells = [f"{res[n][key + '_p50' + suffix]:.0f}/{res[n][key + '_p99' + suffix]:.0f}"
                     if key + "_p99" + suffix in res.get(n, {}) else "-"
                     for n in ("memfabricd", "memcached")]
        else:
            cells = [fmt.format(res[n][key]) if key in res.get(n, {}) else "-"
                     for n in ("memfabricd", "memcached")]
        print(f"{label:34}{cells[0]:>14}{cells[1]:>14}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
