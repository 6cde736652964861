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
  # Skipped: the clients benchmark's smoke test, which drives the Python package in .venv
  # (built by scripts/setup.sh against Debian's UCX: a client of another release).
  UCX_TLS=$tls cargo test --release -p memfabric-ucx -p memfabric-client -p memfabric-bench \
    -- --skip clients_tiny_run_measures_every_library_it_names
done

# --- mixed releases: a client of one UCX and a server of the other are refused cleanly ---------
# (UCX peers of different releases abort on each other's wireup; the HELLO says the
# client's UCX and the server refuses another one before UCX sees it.) Needs the Debian
# build beside this one (cargo build --release): skipped, and said, without it.
DEBIAN=$REPO/target/release
if [[ -x $DEBIAN/memfabricd && -x $DEBIAN/memfabric ]]; then
  free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
  cross() {  # cross SERVER_DIR CLIENT_DIR
    local tcp ucx pid out
    tcp=$(free_port); ucx=$(free_port)
    UCX_TLS=tcp,self "$1/memfabricd" -l 127.0.0.1 -p "$tcp" -U 0 --ucx-port "$ucx" 2>/dev/null &
    pid=$!
    trap 'kill $pid 2>/dev/null' RETURN
    for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$ucx") 2>/dev/null && break; sleep 0.1; done
    if out=$(UCX_TLS=tcp,self timeout 30 "$2/memfabric" --servers "ucx://127.0.0.1:$ucx" set k v 2>&1); then
      die "a client of another UCX release was served ($1 server, $2 client)"
    fi
    grep -q "cannot talk to each other" <<<"$out" || die "unexpected refusal ($1 server, $2 client): $out"
    kill -0 "$pid" || die "the server ($1) died on a client of another UCX release"
    echo "    refused cleanly: $(grep -o 'the server runs UCX [0-9.]*, this client UCX [0-9.]*' <<<"$out")"
  }
  echo "==> mixed UCX releases (Debian's and $VERSION), both ways"
  cross "$CARGO_TARGET_DIR/release" "$DEBIAN"
  cross "$DEBIAN" "$CARGO_TARGET_DIR/release"
else
  echo "==> mixed UCX releases: skipped (no Debian build in target/release: cargo build --release)"
fi
echo "==> UCX $VERSION: all UCX tests passed"
