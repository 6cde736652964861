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


/* ---- non-blocking requests (OSU RDMA-Libmemcached's calls) ----------------------------
 *
 * Issue now, complete later: many requests may be in flight at once (pipelined on each
 * server's connection, or UCX endpoint). A request object is created for a pool, issued
 * with one of the i/b calls, completed with memcached_test (never blocks) or
 * memcached_wait* (always bounded), and may then be issued again.
 *
 *   memcached_request_st *r[32];
 *   for (i = 0; i < 32; i++) {
 *     r[i] = memcached_request_create(memc);
 *     memcached_iget(memc, keys[i], strlen(keys[i]), r[i]);
 *   }
 *   memcached_wait_all(memc, r, 32, 1000);
 *   v = memcached_request_value(r[0], &len, &flags);    // NULL on a miss
 *
 * i-calls return as soon as the request is issued; b-calls once the caller's buffers may
 * be reused. libmemfabric copies key and value at issue in both, so both may be reused
 * on return. The pool must outlive its requests; a request freed in flight is abandoned.
 * Codes: SUCCESS once issued (or the reason it could not be: BAD_KEY_PROVIDED,
 * NO_SERVERS, CONNECTION_FAILURE, ...); memcached_test: MEMCACHED_IN_PROGRESS while in
 * flight, then the command's code as the blocking call would give it. */
typedef struct memcached_request_st memcached_request_st;

memcached_request_st *memcached_request_create(memcached_st *ptr);
void memcached_request_free(memcached_request_st *req);

memcached_return_t memcached_iset(memcached_st *ptr, const char *key, size_t key_length,
                                  const char *value, size_t value_length, time_t expiration,
                                  uint32_t flags, memcached_request_st *req);
memcached_return_t memcached_bset(memcached_st *ptr, const char *key, size_t key_length,
                                  const char *value, size_t value_length, time_t expiration,
                                  uint32_t flags, memcached_request_st *req);
memcached_return_t memcached_iget(memcached_st *ptr, const char *key, size_t key_length,
                                  memcached_request_st *req);
memcached_return_t memcached_bget(memcached_st *ptr, const char *key, size_t key_length,
                                  memcached_request_st *req);
memcached_return_t memcached_idelete(memcached_st *ptr, const char *key, size_t key_length,
                                     memcached_request_st *req);

/* MEMCACHED_IN_PROGRESS while in flight, else the request's code. Never blocks. */
memcached_return_t memcached_test(memcached_st *ptr, memcached_request_st *req);
/* Waits at most the pool's MEMCACHED_BEHAVIOR_POLL_TIMEOUT; MEMCACHED_TIMEOUT if the
 * request did not complete (it is then abandoned). */
memcached_return_t memcached_wait(memcached_st *ptr, memcached_request_st *req);
/* The same with an explicit timeout (negative: the poll timeout). */
memcached_return_t memcached_wait_for(memcached_st *ptr, memcached_request_st *req,
                                      int32_t timeout_ms);
/* Waits for n requests, at most timeout_ms in all: SUCCESS when all completed (each has
 * its own code), MEMCACHED_TIMEOUT if some did not. */
memcached_return_t memcached_wait_all(memcached_st *ptr, memcached_request_st *const *reqs,
                                      size_t n, int32_t timeout_ms);

/* A request's code (MEMCACHED_IN_PROGRESS while in flight). */
memcached_return_t memcached_request_status(const memcached_request_st *req);
/* A completed get's value (not NUL-terminated; NULL on a miss), valid until the request
 * is issued again or freed; and its flags and CAS value. */
const char *memcached_request_value(const memcached_request_st *req, size_t *value_length,
                                    uint32_t *flags);
uint64_t memcached_request_cas(const memcached_request_st *req);

#ifdef __cplusplus
}
#endif

#endif /* MEMFABRIC_H */
