#!/usr/bin/env bash
# Usage: [ROUNDS=3] [SECS=5] [THREADS=2] [CONNS=4] [SIZE=4096] [GETS=100] scripts/tls-bench.sh
# (needs target/release from `cargo build --release`; openssl and memcached come with
# scripts/setup.sh.)
# TLS GET throughput and server CPU per operation, memfabricd -Z vs Debian's memcached -Z
# with the same certificate (EC P-256, made here) and the same flags (-t 2 -m 1024), in one
# run: ROUNDS alternating rounds of `memfabric-bench throughput --tls-ca`, GETS% gets of
# SIZE-byte values over THREADS x CONNS connections. Prints each round and the ratios
# (memfabricd / memcached) of the pooled throughput and CPU/op. Nothing is asserted.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=$ROOT/target/release
ROUNDS=${ROUNDS:-3}; SECS=${SECS:-5}; THREADS=${THREADS:-2}; CONNS=${CONNS:-4}
SIZE=${SIZE:-4096}; GETS=${GETS:-100}
D=$(mktemp -d /tmp/memfabric-tls-bench.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$D"; }
trap cleanup EXIT
cd "$D"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.crt -days 2 -subj /CN=bench-ca 2>/dev/null
openssl req "${ec[@]}" -keyout server.key -out server.csr -subj /CN=bench 2>/dev/null
echo "subjectAltName=IP:127.0.0.1" > san.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt \
  -days 2 -extfile san.ext 2>/dev/null
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
TLS="ssl_chain_cert=$D/server.crt,ssl_key=$D/server.key"
MCP=$(free_port); MFP=$(free_port)
ROOT_FLAG=(); [[ $(id -u) -eq 0 ]] && ROOT_FLAG=(-u root)
/usr/bin/memcached -Z -o "$TLS" -p "$MCP" -U 0 -l 127.0.0.1 -t 2 -m 1024 "${ROOT_FLAG[@]}" >mc.log 2>&1 &
PIDS+=($!); MC=$!
"$B/memfabricd" -Z -o "$TLS" -p "$MFP" -U 0 -l 127.0.0.1 -t 2 -m 1024 --ucx-port 0 >mf.log 2>&1 &
PIDS+=($!); MF=$!
sleep 1
run() { # name port pid round
  "$B/memfabric-bench" throughput --server "127.0.0.1:$2" --tls-ca "$D/ca.crt" --server-pid "$3" \
    --name "$1" --value-size "$SIZE" --threads "$THREADS" --conns "$CONNS" --duration "$SECS" \
    --keys 10000 --mix "$GETS:$((100 - GETS))" --json "$D/$1-$4.json" | tail -1
}
echo "TLS GET benchmark: ${SIZE} B values, ${GETS}% gets, ${THREADS} threads x ${CONNS} conns, ${SECS} s x ${ROUNDS} rounds; servers -t 2 -m 1024"
for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 )); then run memcached "$MCP" "$MC" "$r"; run memfabricd "$MFP" "$MF" "$r"
  else run memfabricd "$MFP" "$MF" "$r"; run memcached "$MCP" "$MC" "$r"; fi
done
python3 - "$D" <<'PY'
import glob, json, sys
d = sys.argv[1]
tot = {}
for f in glob.glob(f"{d}/*.json"):
    r = json.load(open(f))["results"][0]
    t = tot.setdefault(r["server"], [0, 0.0, 0.0])
    t[0] += r["ops"]; t[1] += r["duration_s"]; t[2] += r["server_cpu_s"]
rate = {k: v[0] / v[1] for k, v in tot.items()}
cpu = {k: v[2] / v[0] * 1e6 for k, v in tot.items()}
print(f"{'server':<11} {'ops/s':>10} {'srv cpu us/op':>14}")
for k in ("memcached", "memfabricd"):
    print(f"{k:<11} {rate[k]:>10.0f} {cpu[k]:>14.2f}")
print(f"memfabricd / memcached: throughput {rate['memfabricd'] / rate['memcached']:.2f}x, "
      f"CPU/op {cpu['memfabricd'] / cpu['memcached']:.2f}x")
PY
