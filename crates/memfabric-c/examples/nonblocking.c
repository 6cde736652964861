/* memfabric.h's non-blocking calls: 64 sets and 64 gets, 32 in flight at a time, against
 * the server named on the command line (memfabricd: over UCX when it offers it).
 *
 *   cc nonblocking.c $(pkg-config --cflags --libs memfabric) -o nonblocking
 *   ./nonblocking 127.0.0.1 11211
 *
 * Prints what it fetched and exits 0 if every value came back as stored. */
#include <memfabric.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IN_FLIGHT 32
#define KEYS 64

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s HOST PORT\n", argv[0]);
    return 2;
  }
  memcached_st *memc = memcached_create(NULL);
  memcached_server_add(memc, argv[1], (in_port_t)atoi(argv[2]));
  memcached_request_st *req[IN_FLIGHT];
  for (int i = 0; i < IN_FLIGHT; i++) req[i] = memcached_request_create(memc);
  char key[32], value[64];
  int bad = 0;
  for (int round = 0; round < KEYS / IN_FLIGHT; round++) {
    for (int i = 0; i < IN_FLIGHT; i++) {
      int k = round * IN_FLIGHT + i;
      int kl = snprintf(key, sizeof key, "nb:%d", k);
      int vl = snprintf(value, sizeof value, "value of %d", k);
      memcached_return_t rc = memcached_iset(memc, key, (size_t)kl, value, (size_t)vl, 0, (uint32_t)k, req[i]);
      if (rc != MEMCACHED_SUCCESS) { fprintf(stderr, "iset %s: %s\n", key, memcached_strerror(memc, rc)); return 1; }
    }
    if (memcached_wait_all(memc, req, IN_FLIGHT, 5000) != MEMCACHED_SUCCESS) { fprintf(stderr, "sets timed out\n"); return 1; }
    for (int i = 0; i < IN_FLIGHT; i++)
      if (memcached_request_status(req[i]) != MEMCACHED_SUCCESS) { fprintf(stderr, "set %d: %s\n", i, memcached_strerror(memc, memcached_request_status(req[i]))); return 1; }
  }
  for (int round = 0; round < KEYS / IN_FLIGHT; round++) {
    for (int i = 0; i < IN_FLIGHT; i++) {
      int kl = snprintf(key, sizeof key, "nb:%d", round * IN_FLIGHT + i);
      memcached_iget(memc, key, (size_t)kl, req[i]);
    }
    /* memcached_test never blocks: poll until all are done (bounded by wait_all below). */
    int done = 0;
    for (int spins = 0; spins < 1000 && done < IN_FLIGHT; spins++) {
      done = 0;
      for (int i = 0; i < IN_FLIGHT; i++) done += memcached_test(memc, req[i]) != MEMCACHED_IN_PROGRESS;
    }
    if (memcached_wait_all(memc, req, IN_FLIGHT, 5000) != MEMCACHED_SUCCESS) { fprintf(stderr, "gets timed out\n"); return 1; }
    for (int i = 0; i < IN_FLIGHT; i++) {
      int k = round * IN_FLIGHT + i;
      size_t len; uint32_t flags;
      const char *v = memcached_request_value(req[i], &len, &flags);
      int vl = snprintf(value, sizeof value, "value of %d", k);
      if (v == NULL || len != (size_t)vl || memcmp(v, value, len) != 0 || flags != (uint32_t)k) {
        fprintf(stderr, "nb:%d: %s\n", k, v ? "wrong value" : memcached_strerror(memc, memcached_request_status(req[i])));
        bad++;
      }
    }
  }
  memcached_iget(memc, "nb:missing", 10, req[0]);
  printf("missing key: %s\n", memcached_strerror(memc, memcached_wait(memc, req[0])));
  printf("%d of %d values fetched as stored, server reached over %s\n", KEYS - bad, KEYS,
         memfabric_server_over_ucx(memc, 0) == 1 ? "UCX" : "TCP");
  for (int i = 0; i < IN_FLIGHT; i++) memcached_request_free(req[i]);
  memcached_free(memc);
  return bad ? 1 : 0;
}
