#!/usr/bin/env bash
# Build and test memfabric against a newer UCX than Debian's: the UCX shared libraries and
# headers that PyPI's `libucx` wheels ship (RAPIDS' builds of upstream UCX). CI keeps running
# on Debian's UCX (scripts/test.sh); this is the check that the same code runs on the newer
# one, where UCX's 1.13 limits (1,024 async handlers per worker, ...) are gone.
#
#   scripts/ucx-newer.sh            fetch, build, run the UCX tests (shared memory, then TCP)
#   scripts/ucx-newer.sh --prefix   fetch only; print the UCX prefix (for MEMFABRIC_UCX_PREFIX)
#   scripts/ucx-newer.sh --build    fetch and build; print the target directory
#
# UCX_WHEEL (default libucx-cu12) and UCX_WHEEL_VERSION (default 1.22.0) choose the wheel.
# No GPU or CUDA driver is needed: the wheel's CUDA transport finds no device and stays out
# of the way, as on any machine without one. Everything lands under target/ucx-newer: the wheel's files in
# target/ucx-newer/libucx-VERSION, the build beside them (its own target directory, so the
# Debian build in target/ is untouched). The binaries find the newer libucp through their
# run path; `stats` says which UCX a server runs (`ucx_version`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD

mode=test
case "${1:-}" in
  "") ;;
  --prefix) mode=prefix ;;
  --build) mode=build ;;
  -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
  *) echo "ucx-newer.sh: unknown argument '$1' (use --prefix, --build or nothing)" >&2; exit 2 ;;
esac

WHEEL=${UCX_WHEEL:-libucx-cu12}
VERSION=${UCX_WHEEL_VERSION:-1.22.0}
ROOT=$REPO/target/ucx-newer
PREFIX=$ROOT/libucx-$VERSION

die() { echo "ucx-newer.sh: $*" >&2; exit 1; }

# --- fetch: the wheel is a zip; its libucx/ directory is a UCX install prefix -------------
if [[ ! -f $PREFIX/include/ucp/api/ucp.h ]]; then
  PYTHON=$REPO/.venv/bin/python
  [[ -x $PYTHON ]] || PYTHON=python3
  mkdir -p "$ROOT/wheels"
  "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps \
    --only-binary=:all: -d "$ROOT/wheels" "$WHEEL==$VERSION" \
    || die "cannot download $WHEEL==$VERSION from PyPI"
  whl=$(ls "$ROOT"/wheels/"${WHEEL//-/_}"-"$VERSION"-*.whl | head -n1)
  rm -rf "$ROOT/unpack" && mkdir -p "$ROOT/unpack"
  "$PYTHON" -m zipfile -e "$whl" "$ROOT/unpack" || die "cannot unpack $whl"
  [[ -f $ROOT/unpack/libucx/include/ucp/api/ucp.h ]] || die "$whl has no UCX headers (libucx/include)"
  rm -rf "$PREFIX" && mv "$ROOT/unpack/libucx" "$PREFIX"
  # The wheel's bundled libraries (e.g. cudart for the CUDA module) stay beside it, where
  # that module's run path looks for them.
  for d in "$ROOT"/unpack/*.libs; do [[ -d $d ]] && rm -rf "$ROOT/$(basename "$d")" && mv "$d" "$ROOT/"; done
  rm -rf "$ROOT/unpack"
  # zipfile drops the symlinks' meaning and modes: the wheel stores each .so once per
  # name, so only the execute bits need restoring.
  chmod -R u+rwX,go+rX "$PREFIX"
fi
if [[ $mode == prefix ]]; then echo "$PREFIX"; exit 0; fi

# --- build: its own target directory; the run path points at the wheel's lib/ --------------
export MEMFABRIC_UCX_PREFIX=$PREFIX
export CARGO_TARGET_DIR=$ROOT/target
export RUSTFLAGS="${RUSTFLAGS:-} -C link-arg=-Wl,-rpath,$PREFIX/lib"
cargo build --release --workspace >&2
if [[ $mode == build ]]; then echo "$CARGO_TARGET_DIR"; exit 0; fi

# --- test: the UCX tests, as scripts/test.sh runs them on Debian's UCX -----------------------
export MEMFABRIC_EXPECT_UCX=$VERSION
export MEMFABRICD=$CARGO_TARGET_DIR/release/memfabricd
"$MEMFABRICD" --version >/dev/null
for tls in posix,cma,self tcp,self; do
  echo "==> UCX $VERSION, UCX_TLS=$tls: memfabric-ucx, memfabric-client, memfabric-bench"
  UCX_TLS=$tls cargo test --release -p memfabric-ucx -p memfabric-client -p memfabric-bench
done
echo "==> UCX $VERSION: all UCX tests passed"
