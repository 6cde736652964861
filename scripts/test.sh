#!/usr/bin/env bash
# THE test command: setup, format, lint, build, unit tests, interop suite. Stops at the
# first failure and says which stage failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

stage() {
  local name=$1; shift
  local start=$SECONDS
  echo "==> $name"
  if ! "$@"; then
    echo "FAILED: $name (command: $*)" >&2
    exit 1
  fi
  echo "    ok ($((SECONDS - start))s)"
}

stage "setup" scripts/setup.sh
stage "cargo fmt --check" cargo fmt --all -- --check
stage "cargo clippy" cargo clippy --workspace --all-targets --release -- -D warnings
stage "cargo build --release" cargo build --release --workspace
stage "cargo test --release" cargo test --release --workspace
export MEMFABRICD=${MEMFABRICD:-target/release/memfabricd}
stage "pytest tests/interop (MEMFABRICD=$MEMFABRICD)" .venv/bin/python -m pytest tests/interop
echo "==> all stages passed"
