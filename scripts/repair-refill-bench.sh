#!/usr/bin/env bash
# Usage: [N=50000] [SIZE=1024] [BW=bytes/s, 0 = unbounded] scripts/repair-refill-bench.sh
# (needs target/release from `cargo build --release` and the .venv setup makes.)
# Refill speed of `memfabric repair`: 3 memfabricd, 3 copies of N values of SIZE bytes
# (every key on every server), one server killed and restarted empty, then repaired.
B=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/target/release; N=${N:-50000}; SIZE=${SIZE:-1024}; BW=${BW:-0}
for p in 23501 23502 23503; do $B/memfabricd -p $p -U 0 --ucx-port 0 -l 127.0.0.1 -m 1024 >/dev/null 2>&1 & done
sleep 0.5
"$B/../../.venv/bin/python" - <<PY
from pymemcache.client.base import Client
v=b"x"*$SIZE
for p in (23501,23502,23503):
    c=Client(("127.0.0.1",p))
    for i in range(0,$N,500):
        c.set_many({f"key:{j}":v for j in range(i,min(i+500,$N))}, noreply=False)
PY
pkill -f "memfabricd -p 23502"; sleep 0.3
$B/memfabricd -p 23502 -U 0 --ucx-port 0 -l 127.0.0.1 -m 1024 >/dev/null 2>&1 & sleep 0.5
S=127.0.0.1:23501,127.0.0.1:23502,127.0.0.1:23503
/usr/bin/time -f "%e s wall, %U s user, %S s sys (client)" $B/memfabric --servers $S --replicas 2 --repair-bandwidth $BW repair 127.0.0.1:23502 2>&1 | tail -3
printf 'stats\r\n' | timeout 1 nc -q1 127.0.0.1 23502 | grep -E "^STAT (curr_items|bytes) "
pkill -f "memfabricd -p 235"
