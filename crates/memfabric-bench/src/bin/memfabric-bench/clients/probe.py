"""One row of `memfabric-bench clients`: GET latency from Python through a client library.

argv: LIBRARY HOST PORT GETS VALUE_SIZE KEYS BINARY(0|1)
LIBRARY is pylibmc (whatever libmemcached.so.11 the loader finds: Debian's, or
libmemfabric under that name), pymemcache, or memfabric (memfabric's own package; UCX
where the server offers it). Prints one JSON object: microseconds per
GET (p50, p90, p99, mean), the transport libmemfabric chose (when it is loaded), and the
library actually loaded, so a row can never silently measure the wrong thing.
"""
import json
import sys
import time

lib, host, port, gets, size, nkeys, binary = sys.argv[1:8]
port, gets, size, nkeys, binary = int(port), int(gets), int(size), int(nkeys), binary == "1"
value = b"x" * size
keys = [f"bench:{i}" for i in range(nkeys)]

if lib == "pylibmc":
    import pylibmc

    c = pylibmc.Client([f"{host}:{port}"], binary=binary)
    for k in keys:
        c.set(k, value)
    get = c.get
elif lib == "pymemcache":
    from pymemcache.client.base import Client

    c = Client((host, port), no_delay=True)
    for k in keys:
        c.set(k, value)
    get = c.get
elif lib == "memfabric":
    import memfabric

    c = memfabric.Client((host, port), default_noreply=False)
    for k in keys:
        c.set(k, value)
    get = c.get
else:
    raise SystemExit(f"unknown library {lib}")

with open("/proc/self/maps") as f:
    maps = f.read()
loaded = "libmemfabric" if "libmemfabric.so" in maps else (
    "libmemcached" if "libmemcached" in maps else "none")
if lib == "memfabric":
    loaded = "memfabric-ucx" if c.over_ucx() else "memfabric-tcp"

for k in keys[: min(nkeys, 1000)]:  # warm up: connections, caches
    assert get(k) == value
lat = []
perf = time.perf_counter_ns
for i in range(gets):
    k = keys[i % nkeys]
    t0 = perf()
    v = get(k)
    lat.append(perf() - t0)
    if v is None:
        raise SystemExit(f"{k}: miss")
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] / 1000.0  # noqa: E731
print(json.dumps({"p50_us": q(0.50), "p90_us": q(0.90), "p99_us": q(0.99),
                  "mean_us": sum(lat) / len(lat) / 1000.0, "gets": gets, "loaded": loaded}))
