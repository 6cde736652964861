#!/usr/bin/env bash
# Builds and runs memfabricd (release). Arguments are memcached-style flags, passed through.
# Without -l/-s it listens on 127.0.0.1 only (memcached listens on all interfaces).
#
#   scripts/run-server.sh                 # 127.0.0.1:11211
#   scripts/run-server.sh -p 22122 -U 22122 -m 1024 -t 2
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh --server
if ! cargo build --release -q -p memfabric-server; then
  echo "run-server.sh: cargo build --release -p memfabric-server failed" >&2
  exit 1
fi

args=("$@")
have_listen=no
for a in "${args[@]}"; do
  case $a in
    -l|-l*|--listen|--listen=*|-s|-s*|--unix-socket|--unix-socket=*) have_listen=yes ;;
  esac
done
if [[ $have_listen == no ]]; then
  args=(-l 127.0.0.1 "${args[@]}")
fi

exec target/release/memfabricd "${args[@]}"
