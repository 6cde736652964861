#!/usr/bin/env bash
# The UCX data path against memcached, in one run on one machine:
#   1. raw UCX: ucx_perftest -t ucp_am_lat (the floor for an active-message round trip);
#   2. one-op latency (OHB ohb_memlat style) by size: memfabricd over UCX, memcached over
#      TCP, and memfabricd over TCP, all with the same client (memfabric-bench);
#   3. server CPU seconds per million GETs, UCX against TCP, in a closed-loop run.
# Writes docs/img/fabric-*.json|png and prints the tables that docs/benchmarks.md quotes.
#
#   scripts/bench-fabric.sh [ITERATIONS]        (default 20000; UCX_TLS default posix,cma,self)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ITER=${1:-20000}
SIZES=1,4,64,1024,4096,16384,65536,524288
. scripts/bench-lib.sh

# 1. Raw UCX active-message latency (one-way; a round trip is twice that). ucx_perftest
#    on a shared 2-core VM varies from run to run: the median of 5 runs is reported.
for s in 4 4096; do
  for run in 1 2 3 4 5; do
    p=$(free_port)
    ucx_perftest -p "$p" >/dev/null 2>&1 & pids+=($!)
    sleep 0.5
    ucx_perftest 127.0.0.1 -p "$p" -t ucp_am_lat -s "$s" -n 200000 2>/dev/null | awk '/^Final:/ {print $3}'
  done | sort -n | awk -v s="$s" '{v[NR]=$1} END {printf "ucx_perftest ucp_am_lat size %s: p50 one-way %.3f us, round trip %.3f us (median of %d runs; runs %s..%s)\n", s, v[3], 2*v[3], NR, v[1], v[NR]}'
done | tee "$OUT/fabric-perftest.txt"

# 2. Latency by size.
MC_PORT=$(free_port); MF_PORT=$(free_port); MF_UCX=$(free_port)
memcached -u root -p "$MC_PORT" -U 0 -l 127.0.0.1 -t 1 -m 1024 & MC=$!; pids+=($MC)
target/release/memfabricd -p "$MF_PORT" -U 0 -l 127.0.0.1 -t 1 -m 1024 --poll-us 200 \
  --ucx-port "$MF_UCX" & MF=$!; pids+=($MF)
wait_port "$MC_PORT"; wait_port "$MF_PORT"; wait_port "$MF_UCX"
$BENCH latency --transport ucx --server 127.0.0.1:"$MF_UCX" --server-pid "$MF" --ops get,set \
  --sizes "$SIZES" --iterations "$ITER" --json "$OUT/fabric-latency-ucx.json" \
  --plot "$OUT/fabric-latency-ucx.png"
$BENCH latency --transport tcp --server 127.0.0.1:"$MC_PORT" --server-pid "$MC" --ops get,set \
  --sizes "$SIZES" --iterations "$ITER" --json "$OUT/fabric-latency-memcached-tcp.json"
$BENCH latency --transport tcp --server 127.0.0.1:"$MF_PORT" --server-pid "$MF" --ops get,set \
  --sizes "$SIZES" --iterations "$ITER" --json "$OUT/fabric-latency-memfabricd-tcp.json"

# 3. Server CPU per million GETs under closed-loop load (4 KB values, 1 client thread,
#    8 requests in flight), UCX against TCP on the same memfabricd, and memcached.
for t in ucx tcp; do
  port=$MF_PORT; [[ $t == ucx ]] && port=$MF_UCX
  $BENCH throughput --transport "$t" --server 127.0.0.1:"$port" --server-pid "$MF" --name "memfabricd-$t" \
    --keys 10000 --value-size 4096 --mix 100:0 --threads 1 --conns 2 --depth 4 --duration 3 \
    --json "$OUT/fabric-cpu-$t.json"
done
$BENCH throughput --transport tcp --server 127.0.0.1:"$MC_PORT" --server-pid "$MC" --name memcached-tcp \
  --keys 10000 --value-size 4096 --mix 100:0 --threads 1 --conns 2 --depth 4 --duration 3 \
  --json "$OUT/fabric-cpu-memcached.json"

# Ratios for the report.
python3 - "$OUT" <<'EOF'
import json, sys, re
out = sys.argv[1]
def rows(name):
    return {(r["op"], r["size"]): r for r in json.load(open(f"{out}/{name}"))["results"]}
ucx, mc, mft = rows("fabric-latency-ucx.json"), rows("fabric-latency-memcached-tcp.json"), rows("fabric-latency-memfabricd-tcp.json")
print("\n| op | size | memfabricd UCX p50 / p99 (us) | memcached TCP p50 / p99 | memfabricd TCP p50 | memcached p50 / UCX p50 |")
print("|---|---:|---:|---:|---:|---:|")
for (op, size) in sorted(ucx, key=lambda k: (k[0], k[1])):
    u, m, t = ucx[(op, size)], mc[(op, size)], mft[(op, size)]
    print(f"| {op} | {size} | {u['p50_us']:.2f} / {u['p99_us']:.2f} | {m['p50_us']:.1f} / {m['p99_us']:.1f} | {t['p50_us']:.1f} | {m['p50_us']/u['p50_us']:.1f}x |")
pt = {}
for line in open(f"{out}/fabric-perftest.txt"):
    m = re.search(r"size (\d+): .*round trip ([\d.]+)", line)
    if m: pt[int(m.group(1))] = float(m.group(2))
if 4096 in pt:
    g = ucx[("get", 4096)]["p50_us"]
    print(f"\n4 KB GET p50 over UCX {g:.2f} us = {g/pt[4096]:.2f}x the raw UCX AM round trip ({pt[4096]:.2f} us)")
print("\n| server / transport | GETs/s | server CPU s per million GETs |")
print("|---|---:|---:|")
for f in ["fabric-cpu-ucx.json", "fabric-cpu-tcp.json", "fabric-cpu-memcached.json"]:
    d = json.load(open(f"{out}/{f}"))
    r = d["results"][0] if "results" in d else d
    def find(o, *names):
        for n in names:
            if isinstance(o, dict) and n in o: return o[n]
        return None
    print(f"| {f[11:-5]} | {find(r,'ops_per_sec','throughput','ops_s') or '?'} | {find(r,'server_cpu_s_per_mop','cpu_s_per_mop','server_cpu_per_mop') or '?'} |")
EOF
