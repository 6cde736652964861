#!/usr/bin/env bash
# Installs libmemfabric (built by `cargo build --release`) under PREFIX so that
# applications linked with libmemcached load it instead:
#   PREFIX/lib/libmemfabric.so                     the library
#   PREFIX/lib/libmemfabric/libmemcached.so.11     the same, under libmemcached's SONAME:
#                                                  LD_LIBRARY_PATH=PREFIX/lib/libmemfabric
#   PREFIX/include/memfabric.h                     memfabric's own C API
#   PREFIX/lib/pkgconfig/memfabric.pc              pkg-config --cflags --libs memfabric
# Usage: scripts/libmemfabric-install.sh PREFIX   (docs/c-api.md)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PREFIX=${1:?usage: $0 PREFIX}
TARGET=${CARGO_TARGET_DIR:-target}
LIB=$TARGET/release/libmemfabric.so
[[ -f $LIB ]] || { echo "no $LIB: cargo build --release -p memfabric-c first" >&2; exit 1; }
mkdir -p "$PREFIX/lib/libmemfabric" "$PREFIX/include" "$PREFIX/lib/pkgconfig"
PREFIX=$(cd "$PREFIX" && pwd)
install -m 0755 "$LIB" "$PREFIX/lib/libmemfabric.so"
ln -sf ../libmemfabric.so "$PREFIX/lib/libmemfabric/libmemcached.so.11"
install -m 0644 crates/memfabric-c/include/memfabric.h "$PREFIX/include/memfabric.h"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
sed -e "s|@PREFIX@|$PREFIX|" -e "s|@VERSION@|$version|" crates/memfabric-c/memfabric.pc.in \
  >"$PREFIX/lib/pkgconfig/memfabric.pc"
echo "$PREFIX/lib/libmemfabric"
