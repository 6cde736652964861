#!/usr/bin/env bash
# Installs what memfabric needs on a Debian machine, only when missing (idempotent).
#
#   scripts/setup.sh            everything: build deps, memcached + tools, the Python venv
#   scripts/setup.sh --server   only what building and running memfabricd needs
#
# Quiet on success; on failure it says what failed and shows the tool's output.
# Installing packages needs root (CI runs as root); without root it names what is missing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD

mode=all
case "${1:-}" in
  "") ;;
  --server) mode=server ;;
  -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
  *) echo "setup.sh: unknown argument '$1' (use --server or nothing)" >&2; exit 2 ;;
esac

die() { echo "setup.sh: $*" >&2; exit 1; }

LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
# Runs a command with its output captured; prints the output only when it fails.
quietly() {
  if ! "$@" >"$LOG" 2>&1; then
    echo "setup.sh: failed: $*" >&2
    tail -n 60 "$LOG" >&2
    exit 1
  fi
}

# --- Debian packages ------------------------------------------------------------------
# Build: pkg-config, libucx-dev (the fabric's UCX), libclang-dev (bindgen), gcc.
# The README's quick start talks to the server with nc (OpenBSD's: `-q1`) and telnet, so
# both come with the server too.
# libsasl2-2: libmemfabric links it as Debian's libmemcached does (applications built
# against libmemcached reach Cyrus SASL through it). libmemcached-tools: the README's
# libmemfabric example (memccp, memccat). fuse3: the burst buffer's mount (`memfabric bb
# mount`: fusermount3 for users other than root, /etc/fuse.conf); rsync: the README's
# burst-buffer example and the mount's tests.
pkgs=(pkg-config libucx-dev libclang-dev gcc netcat-openbsd telnet libsasl2-2 libmemcached-tools
  fuse3 rsync)
if [[ $mode == all ]]; then
  # Reference server and conformance tools, pylibmc's C library, network namespaces,
  # UCX's own tools (ucx_info, ucx_perftest: the raw-UCX baseline of the benchmarks),
  # saslpasswd2 (the SASL differential test's Cyrus sasldb), openssl (test certificates).
  pkgs+=(memcached libmemcached-tools libmemcached-dev iproute2 ucx-utils sasl2-bin openssl)
  # Applications that load libmemcached.so.11 unchanged, run on libmemfabric by the tests:
  # Debian's pylibmc and PHP's memcached extension.
  pkgs+=(python3-pylibmc php8.2-cli php8.2-memcached)
fi

# Python for the interop suite: Debian's python3 when present (a fresh machine's), else
# whatever python3 is on PATH.
PYTHON=${PYTHON:-}
if [[ $mode == all && -z $PYTHON ]]; then
  if [[ -x /usr/bin/python3 ]]; then PYTHON=/usr/bin/python3; else PYTHON=python3; fi
fi
if [[ $mode == all ]]; then
  if ! command -v "$PYTHON" >/dev/null 2>&1; then
    pkgs+=(python3 python3-venv python3-dev)
    PYTHON=/usr/bin/python3
  elif [[ $PYTHON == /usr/bin/python3 ]]; then
    # venv needs ensurepip (python3-venv); building pylibmc from source needs Python.h.
    "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1 || pkgs+=(python3-venv)
    "$PYTHON" -c 'import sysconfig, os, sys
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' \
      || pkgs+=(python3-dev)
  fi
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    die "missing Debian packages: ${missing[*]} (run this script as root, or: sudo apt-get install ${missing[*]})"
  fi
  export DEBIAN_FRONTEND=noninteractive
  quietly apt-get update -q
  quietly apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# --- Rust toolchain -----------------------------------------------------------------------
command -v cargo >/dev/null 2>&1 || die "cargo not found: install a stable Rust toolchain (rustup) first"
if [[ $mode == all ]]; then
  cargo fmt --version >/dev/null 2>&1 || die "rustfmt missing (rustup component add rustfmt)"
  cargo clippy --version >/dev/null 2>&1 || die "clippy missing (rustup component add clippy)"
fi

[[ $mode == server ]] && exit 0

# --- cargo-fuzz: the bounded fuzzing stage of the tests (scripts/fuzz.sh) -------------------
if ! cargo fuzz --version >/dev/null 2>&1; then
  quietly cargo install cargo-fuzz --version 0.13.2 --locked
fi

# --- Python venv for tests/interop ----------------------------------------------------------
VENV=$REPO/.venv
REQ=$REPO/tests/interop/requirements.txt
STAMP=$VENV/.requirements.sha256
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [[ ! -x $VENV/bin/python ]] || [[ $(cat "$STAMP" 2>/dev/null) != "$want" ]] \
   || ! "$VENV/bin/python" -c 'import pytest, pymemcache, pylibmc, fsspec, pandas' >/dev/null 2>&1; then
  if [[ ! -x $VENV/bin/python ]]; then
    quietly "$PYTHON" -m venv "$VENV"
  fi
  quietly "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ"
  "$VENV/bin/python" -c 'import pytest, pymemcache, pylibmc, fsspec, pandas' >"$LOG" 2>&1 \
    || { cat "$LOG" >&2; die "the venv at .venv cannot import pytest, pymemcache, pylibmc, fsspec and pandas"; }
  echo "$want" >"$STAMP"
fi

# --- memfabric's Python package (crates/memfabric-py), built into the venv ------------------
# maturin builds the extension with cargo (in the workspace's target directory, so the
# later `cargo build` reuses what it compiled) and pip installs the wheel. The wheel links
# the system's UCX, so it is not "repaired" for other machines (--auditwheel skip).
WHEELS=${CARGO_TARGET_DIR:-$REPO/target}/wheels
rm -rf "$WHEELS"
quietly "$VENV/bin/maturin" build --release --auditwheel skip \
  -m "$REPO/crates/memfabric-py/Cargo.toml" -o "$WHEELS"
quietly "$VENV/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall \
  --no-deps "$WHEELS"/memfabric-*.whl
"$VENV/bin/python" -c 'import memfabric' >"$LOG" 2>&1 \
  || { cat "$LOG" >&2; die "the venv cannot import memfabric (crates/memfabric-py)"; }
