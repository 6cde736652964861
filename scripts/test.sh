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

# Tests SIGKILL UCX servers and clients on purpose; one killed while UCX fills a new
# shared-memory file leaves the file in /dev/shm. Removed at the end, pass or fail.
trap 'scripts/remove-orphaned-ucx-shm.sh || true' EXIT

stage "setup" scripts/setup.sh
stage "cargo fmt --check" cargo fmt --all -- --check
stage "cargo clippy" cargo clippy --workspace --all-targets --release -- -D warnings
stage "no module import cycles in any crate" \
  bash -c 'for c in crates/*/src; do scripts/module-cycles.sh "$c" >/dev/null || { scripts/module-cycles.sh "$c" | grep cycle; exit 1; }; done'
stage "cargo build --release" cargo build --release --workspace
# The UCX tests (fabric runtime, client over UCX, server's UCX path, UCX benchmarks) run
# under both transport families a machine without RDMA has: shared memory (with the whole
# workspace), then TCP. On InfiniBand/RoCE the same tests run with UCX_TLS=rc_x,ud_x etc.
stage "cargo test --release (UCX_TLS=posix,cma,self)" \
  env UCX_TLS=posix,cma,self cargo test --release --workspace
stage "cargo test --release, UCX crates (UCX_TLS=tcp,self)" \
  env UCX_TLS=tcp,self cargo test --release -p memfabric-ucx -p memfabric-client -p memfabric-bench
stage "fuzz every parser, decoder and the executor (20 s each)" scripts/fuzz.sh 20
export MEMFABRICD=${MEMFABRICD:-target/release/memfabricd}
stage "pytest tests/interop (MEMFABRICD=$MEMFABRICD)" .venv/bin/python -m pytest tests/interop
# Debian's python3-pylibmc, unmodified, on libmemfabric in place of libmemcached.so.11
# (installed under target/libmemfabric by the documented step): the pylibmc suite against
# memcached (TCP) and memfabricd (UCX, over shared memory and over TCP).
prefix=${CARGO_TARGET_DIR:-target}/libmemfabric
stage "install libmemfabric under $prefix" scripts/libmemfabric-install.sh "$prefix"
pylibmc_dir=$prefix/debian-pylibmc   # Debian's pylibmc alone, not all of dist-packages
mkdir -p "$pylibmc_dir"
ln -sfn /usr/lib/python3/dist-packages/pylibmc "$pylibmc_dir/pylibmc"
ln -sf /usr/lib/python3/dist-packages/_pylibmc.cpython-*.so "$pylibmc_dir/"
for tls in posix,cma,self tcp,self; do
  stage "pytest test_pylibmc.py: Debian's pylibmc on libmemfabric (UCX_TLS=$tls)" \
    env UCX_TLS=$tls LD_LIBRARY_PATH="$prefix/lib/libmemfabric" PYTHONPATH="$pylibmc_dir" \
    MEMFABRIC_PYLIBMC=debian-on-libmemfabric .venv/bin/python -m pytest -q tests/interop/test_pylibmc.py
done
echo "==> all stages passed"
