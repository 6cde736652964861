#!/usr/bin/env bash
# Clients that break the UCX bootstrap protocol: each says HELLO, makes its endpoint at
# once instead of waiting for the server's READY, and dies. Counts how often that aborts
# memfabricd inside UCX's own wire-up (docs/fabric-protocol.md 1.3), restarting the server
# after each abort. Not part of CI: a measurement of UCX, not a test of memfabric.
#
#   scripts/stress-ucx-hello-rush.sh [CHILDREN] [TARGET_DIR]   (defaults 300, target;
#   UCX_TLS from the environment, default tcp,self; THREADS the server's -t, default 1. TARGET_DIR: a build's target
#   directory, e.g. the one `scripts/ucx-newer.sh --build` prints, to measure another UCX)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export UCX_TLS=${UCX_TLS:-tcp,self}
. scripts/bench-lib.sh
CHILDREN=${1:-300}
TARGET=${2:-target}
# One worker (the tests' servers run -t 1): every dead client's wire-up on one UCX worker.
THREADS=${THREADS:-1}
# The child is a mode of the client's ucx_faults test binary (built by cargo test).
faults=$(ls -t "$TARGET"/release/deps/ucx_faults-* 2>/dev/null | grep -v '\.d$' | head -1)
[[ -x $faults ]] || { echo "no ucx_faults test binary under $TARGET (cargo test --release -p memfabric-client --test ucx_faults --no-run)" >&2; exit 2; }
log=$(mktemp)
start_server() {
  P=$(free_port); U=$(free_port)
  "$TARGET"/release/memfabricd -p "$P" -U 0 -l 127.0.0.1 -t "$THREADS" -m 64 --ucx-port "$U" >>"$log" 2>&1 & S=$!; pids+=("$S")
  wait_port "$U"
}
start_server
aborts=0
# How long each child answers UCX before it dies (µs): at once, mid wire-up, after it.
DELAYS=(0 200 2000 8000)
# The children die by abort or segfault, as intended; bash's word on each is not wanted.
exec 3>&2 2>/dev/null
for i in $(seq 1 "$CHILDREN"); do
  # Every third child first says HELLO for a worker that is gone, as the CI test does
  # before its dying children (the server's endpoint to it fails on its own).
  if (( i % 3 == 0 )); then
    MF_HELLO_AND_DIE="ucx://127.0.0.1:$U stale 0" timeout 60 "$faults" --exact \
      hostile_hellos_and_clients_gone_after_hello_leave_the_server_serving --nocapture >/dev/null 2>&1
  fi
  MF_HELLO_AND_DIE="ucx://127.0.0.1:$U rush ${DELAYS[RANDOM % ${#DELAYS[@]}]}" timeout 60 "$faults" --exact \
    hostile_hellos_and_clients_gone_after_hello_leave_the_server_serving --nocapture >/dev/null 2>&1
  # No pause: the next child's connection is wired up while the last one's still fails.
  if ! kill -0 "$S" 2>/dev/null; then
    aborts=$((aborts + 1))
    wait "$S" 2>/dev/null
    start_server
  fi
done
exec 2>&3 3>&-
# A graceful stop (SIGTERM) with the dead clients' endpoints still wiring up.
kill "$S" 2>/dev/null; wait "$S" 2>/dev/null; stop_status=$?
echo "the last server's exit status on SIGTERM: $stop_status (0: a clean stop)"
echo "$CHILDREN rushing clients, $aborts server abort(s) (UCX_TLS=$UCX_TLS, libucp: $(ldd "$TARGET"/release/memfabricd | awk '/libucp/ {print $3}'))"
grep -m3 -i "assert" "$log" | sed 's/^/  /'
rm -f "$log"
