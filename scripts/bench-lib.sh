# Shared by the scripts/bench-*.sh runners (sourced, not run): builds the binaries, and
# gives free ports, server start-up waits and a cleanup that kills every started server.
export UCX_TLS=${UCX_TLS:-posix,cma,self}
OUT=docs/img
mkdir -p "$OUT"
cargo build --release -q -p memfabric-server -p memfabric-bench
BENCH=target/release/memfabric-bench

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
wait_port() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; return 1; }

echo "== machine: $(nproc) cores, $(uname -r), UCX $(ucx_info -v | sed -n 's/# Version //p'), UCX_TLS=$UCX_TLS"
