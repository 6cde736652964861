#!/usr/bin/env python3
"""Flash tier latencies, servers side by side, rounds alternating (docs/flash.md).

    scripts/flash-latency.py [--ram-mb 64] [--flash-mb 1024] [--rounds 5] [--json FILE]

Starts, all at once, memfabricd RAM-only, memfabricd with its flash tier read by
io_uring, and the same read by the psync threads (same -m, same flash size, 4 KB
values), fills each with 1.2x what RAM + flash hold, then runs --rounds rounds; in each
round every server in turn (the order rotating) gets, from one connection pacing 2,000
requests/s (flash-measure.py's client):

  * GETs of keys on flash (the oldest), on the flash servers;
  * GETs of keys in RAM (the newest);
  * SETs of new keys while another connection floods SETs (the flash servers' writer is
    saturated: their `flash_dropped_writer_behind` grows during the flood, reported).

Prints per server and kind the median over rounds of p50 and p99 (us, including the
Python client's ~20 us), and the ratios the acceptance asks for: RAM-hit p99 and SET
p99 of each flash server against the RAM-only server.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("flash_measure",
                                               os.path.join(HERE, "flash-measure.py"))
fm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fm)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ram-mb", type=int, default=64)
    ap.add_argument("--flash-mb", type=int, default=1024)
    ap.add_argument("--valsize", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=6000, help="per kind and round")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--json")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="mf-flash-latency-", dir=a.dir)
    cap = (a.ram_mb + a.flash_mb) * (1 << 20) // a.valsize
    fill = cap * 12 // 10
    flash = lambda name: f"{os.path.join(work, name)}:{a.flash_mb}m"  # noqa: E731
    servers = {}
    try:
        servers["ram-only"] = fm.memfabricd(fm.free_port(), a.ram_mb, None)
        servers["flash-io_uring"] = fm.memfabricd(
            fm.free_port(), a.ram_mb, flash("u"), ["--flash-io-engine", "io_uring"])
        servers["flash-psync"] = fm.memfabricd(
            fm.free_port(), a.ram_mb, flash("p"), ["--flash-io-engine", "psync"])
        for name, s in servers.items():
            print(f"filling {name} with {fill} items", flush=True)
            s.fill(0, fill, a.valsize)
            if name != "ram-only":
                s.settle()
        n = a.requests
        # Keys on flash: at first the oldest of the fill (RAM keeps the newest); after a
        # flood, the oldest keys of that flood the tier still holds (it churns the tier).
        flash_keys = {name: [b"k%09d" % k for k in range(fill // 10, fill // 10 + cap // 2)]
                      for name in servers}
        ram_items = a.ram_mb * (1 << 20) // a.valsize
        rounds: dict[str, list[dict]] = {k: [] for k in servers}
        names = list(servers)
        set_base = 0
        last_flood: dict[str, int] = {}
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                s = servers[name]
                res = {}
                if r == 0:
                    ram = [b"get k%09d\r\n" % (fill - 1 - ((i * 7919) % 20_000))
                           for i in range(n)]
                else:
                    # RAM keeps the newest keys of the last flood.
                    ram = [b"get f%09d\r\n" % (last_flood[name] - 1 - ((i * 7919) % 2_000))
                           for i in range(n)]
                res["ram_get"] = fm.paced(s, ram)
                if name != "ram-only":
                    reads0 = int(s.stats()["extstore_objects_read"])
                    keys = flash_keys[name]
                    reqs = [b"get " + keys[(i * 104_729 + r * 31) % len(keys)] + b"\r\n"
                            for i in range(n)]
                    res["flash_get"] = fm.paced(s, reqs)
                    res["flash_reads"] = int(s.stats()["extstore_objects_read"]) - reads0
                v = fm.value(0, a.valsize)
                sets = [b"set s%09d 0 0 %d\r\n" % (set_base + i, len(v)) + v + b"\r\n"
                        for i in range(n)]
                set_base += n
                behind0 = int(s.stats().get("flash_dropped_writer_behind", 0))
                first = 1_000_000_000 + r * 10_000_000
                fl = fm.flood(s.port, first, n / 2000 + 3, a.valsize)
                time.sleep(1)
                res["set_flooded"] = fm.paced(s, sets)
                out, _ = fl.communicate()
                end = int(out.split()[-1])
                last_flood[name] = end
                s.settle()
                res["writer_behind"] = int(s.stats().get("flash_dropped_writer_behind", 0)) \
                    - behind0
                res["flood_sets"] = end - first
                # The flood's keys that went to flash: older than RAM's share, newer than
                # the tier's reach.
                lo = max(first, end - cap * 9 // 10)
                hi = end - 2 * ram_items
                flash_keys[name] = [b"f%09d" % k for k in range(lo, max(hi, lo + 1))]
                rounds[name].append(res)
                print(r, name, json.dumps(res), flush=True)
        summary: dict[str, dict] = {}
        for name, rs in rounds.items():
            summ = {}
            for kind in ("ram_get", "flash_get", "set_flooded"):
                if kind in rs[0]:
                    summ[kind] = [round(statistics.median(x[kind][0] for x in rs), 1),
                                  round(statistics.median(x[kind][1] for x in rs), 1)]
            if "writer_behind" in rs[0]:
                summ["writer_behind_per_round"] = statistics.median(
                    x["writer_behind"] for x in rs)
            summary[name] = summ
        base = summary["ram-only"]
        print()
        print(f"-m {a.ram_mb}, flash {a.flash_mb} MiB, {a.valsize}-byte values, {fill} items;"
              f" {a.rounds} rounds x {n} requests per kind at 2,000/s; medians over rounds")
        print(f"{'server':16}{'RAM GET p50/p99':>18}{'flash GET p50/p99':>20}"
              f"{'SET p50/p99 flooded':>22}{'RAM p99 x':>11}{'SET p99 x':>11}")
        for name, sm in summary.items():
            def cell(k):
                return f"{sm[k][0]:.0f}/{sm[k][1]:.0f}" if k in sm else "-"
            rx = sm["ram_get"][1] / base["ram_get"][1]
            sx = sm["set_flooded"][1] / base["set_flooded"][1]
            sm["ram_p99_ratio"], sm["set_p99_ratio"] = round(rx, 3), round(sx, 3)
            print(f"{name:16}{cell('ram_get'):>18}{cell('flash_get'):>20}"
                  f"{cell('set_flooded'):>22}{rx:>10.2f}x{sx:>10.2f}x")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"rounds": rounds, "summary": summary}, f, indent=2)
    finally:
        for s in servers.values():
            s.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
