#!/usr/bin/env bash
# A bounded fuzzing run of every cargo-fuzz target (stable toolchain, no sanitizer):
#
#   scripts/fuzz.sh [SECONDS]     each target for SECONDS (default 20)
#
# The targets cover every parser and decoder (ascii, meta, binary, the UCX wire format,
# the client's meta reply decoder, EC fragments, metadump lines, libmemfabric's
# configuration language, the burst buffer's objects) and the whole executor
# against a real store. A crash
# leaves its input in fuzz/artifacts/<target>/ and fails the run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../fuzz"
secs=${1:-20}
command -v cargo-fuzz >/dev/null 2>&1 || { echo "fuzz.sh: cargo-fuzz missing (scripts/setup.sh installs it)" >&2; exit 1; }
cargo fuzz build -s none --release
for target in $(cargo fuzz list); do
  mkdir -p "corpus/$target"
  echo "    fuzz $target (${secs}s)"
  log=$(mktemp)
  if ! cargo fuzz run -s none --release "$target" "corpus/$target" -- \
      -max_total_time="$secs" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    rm -f "$log"
    echo "fuzz.sh: $target failed (its input is in fuzz/artifacts/$target/)" >&2
    exit 1
  fi
  grep -E '^Done [0-9]+ runs' "$log" || true
  rm -f "$log"
done
