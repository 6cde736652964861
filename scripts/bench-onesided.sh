#!/usr/bin/env bash
# One-sided GETs against the active-message path, in one run on one machine:
#   1. one-op latency by size (ohb_memlat style), AM GET and one-sided GET against the
#      same memfabricd (-t 1), twice: with --poll-us 200 (the AM path at its fastest: the
#      worker spins instead of sleeping, so its CPU is wall time) and without (the worker
#      sleeps when idle: its CPU seconds per million GETs are what serving costs);
#   2. closed-loop GET throughput with 1, 2, 4 and 8 client threads against a server with
#      ONE worker thread, AM against one-sided, with the server's CPU per million GETs
#      (the claim: one-sided throughput grows with clients while the worker stays idle).
# Writes docs/img/onesided-*.json|png and prints the tables docs/benchmarks.md quotes.
#
#   scripts/bench-onesided.sh [ITERATIONS] [SECONDS]   (defaults 20000, 3; UCX_TLS default posix,cma,self)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ITER=${1:-20000}
SECS=${2:-3}
SIZES=4,64,1024,4096,16384,65536,262144
. scripts/bench-lib.sh

MF_PORT=$(free_port); MF_UCX=$(free_port); MP_PORT=$(free_port); MP_UCX=$(free_port)
# No --poll-us: the worker sleeps when idle, so its CPU time is what serving costs.
target/release/memfabricd -p "$MF_PORT" -U 0 -l 127.0.0.1 -t 1 -m 1024 --ucx-port "$MF_UCX" & MF=$!; pids+=($MF)
target/release/memfabricd -p "$MP_PORT" -U 0 -l 127.0.0.1 -t 1 -m 1024 --ucx-port "$MP_UCX" --poll-us 200 & MP=$!; pids+=($MP)
wait_port "$MF_PORT"; wait_port "$MF_UCX"; wait_port "$MP_PORT"; wait_port "$MP_UCX"

# 1. Latency by size, both GET paths in one invocation (same server, same keys).
$BENCH latency --transport ucx,onesided --server 127.0.0.1:"$MP_PORT" --ucx-server 127.0.0.1:"$MP_UCX" \
  --server-pid "$MP" --ops get --sizes "$SIZES" --iterations "$ITER" \
  --json "$OUT/onesided-latency.json" --plot "$OUT/onesided-latency.png"
$BENCH latency --transport ucx,onesided --server 127.0.0.1:"$MF_PORT" --ucx-server 127.0.0.1:"$MF_UCX" \
  --server-pid "$MF" --ops get --sizes "$SIZES" --iterations "$ITER" \
  --json "$OUT/onesided-latency-nopoll.json"
kill "$MP"

# 2. Throughput by client threads, one server worker, 4 KB values, GET only.
for t in ucx onesided; do
  for n in 1 2 4 8; do
    $BENCH throughput --transport "$t" --server 127.0.0.1:"$MF_UCX" --server-pid "$MF" \
      --name "$t-$n" --keys 10000 --value-size 4096 --mix 100:0 --threads "$n" --conns 1 \
      --depth 1 --duration "$SECS" --quiet --json "$OUT/onesided-tput-$t-$n.json"
  done
done

python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
for name, title in (("onesided-latency", "server --poll-us 200"), ("onesided-latency-nopoll", "server without --poll-us")):
    rows = json.load(open(f"{out}/{name}.json"))["results"]
    by = {(r["transport"], r["size"]): r for r in rows}
    print(f"\n{title}\n")
    print("| size | AM GET p50 / p99 us | one-sided GET p50 / p99 us | one-sided / AM p50 | server CPU s/Mop AM | one-sided |")
    print("|---:|---:|---:|---:|---:|---:|")
    for size in sorted({s for (_, s) in by}):
        a, o = by.get(("ucx", size)), by.get(("onesided", size))
        if not a or not o:
            continue
        cpu = lambda r: "-" if r.get("server_cpu_s_per_mop") is None else f"{r['server_cpu_s_per_mop']:.2f}"
        print(f"| {size} | {a['p50_us']:.2f} / {a['p99_us']:.2f} | {o['p50_us']:.2f} / {o['p99_us']:.2f} | "
              f"{o['p50_us']/a['p50_us']:.2f}x | {cpu(a)} | {cpu(o)} |")
print("\n| client threads | AM GETs/s | AM server CPU s/Mop | one-sided GETs/s | one-sided server CPU s/Mop | CPU ratio |")
print("|---:|---:|---:|---:|---:|---:|")
for n in (1, 2, 4, 8):
    r = {t: json.load(open(f"{out}/onesided-tput-{t}-{n}.json"))["results"][0] for t in ("ucx", "onesided")}
    a, o = r["ucx"], r["onesided"]
    ratio = o["server_cpu_s_per_mop"] / a["server_cpu_s_per_mop"] if a["server_cpu_s_per_mop"] else float("nan")
    print(f"| {n} | {a['ops_per_sec']/1e3:.1f}k | {a['server_cpu_s_per_mop']:.2f} | "
          f"{o['ops_per_sec']/1e3:.1f}k | {o['server_cpu_s_per_mop']:.3f} | {ratio:.3f} |")
EOF
