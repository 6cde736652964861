/* memfabric.h: memfabric's C API.
 *
 * libmemfabric exports libmemcached 1.1.4's API (include <libmemcached/memcached.h> and
 * call it as usual; docs/c-api.md lists what is covered) plus the calls below, for new
 * code: which transport a server is reached over, and OSU RDMA-Libmemcached's
 * non-blocking requests. Link with `pkg-config --cflags --libs memfabric`.
 */
#ifndef MEMFABRIC_H
#define MEMFABRIC_H

#include <libmemcached/memcached.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- transports ---------------------------------------------------------------------- */

/* How server `index` of the pool is reached: 1 UCX, 0 TCP, -1 not connected yet. Servers
 * are connected by the first request that needs them: UCX where memfabricd advertises it
 * (`stats fabric` -> `ucx_port`), TCP otherwise. MEMFABRIC_TRANSPORT=tcp|ucx|auto (read
 * when the pool is created) forces TCP, requires UCX, or chooses (the default). */
int memfabric_server_over_ucx(const memcached_st *ptr, uint32_t index);

/* The MEMFABRIC_TRANSPORT the pool was created with: 0 tcp, 1 ucx, 2 auto. */
int memfabric_transport(const memcached_st *ptr);

#ifdef __cplusplus
}
#endif

#endif /* MEMFABRIC_H */
