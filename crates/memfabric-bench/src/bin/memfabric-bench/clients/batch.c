/* One row of `memfabric-bench clients`: GETs in batches of IN_FLIGHT from C.
 *   batch iget HOST PORT GETS VALUE_SIZE KEYS IN_FLIGHT   memfabric.h: memcached_iget x N,
 *                                                         then memcached_wait_all
 *   batch mget HOST PORT GETS VALUE_SIZE KEYS IN_FLIGHT   libmemcached: memcached_mget of N
 *                                                         keys, then memcached_fetch_result
 * Prints JSON: microseconds per batch (p50, p99) and GETs per second. Built by the
 * benchmark (gcc) against libmemcached-dev's headers and memfabric.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef WITH_MEMFABRIC
#include "memfabric.h"
#else
#include <libmemcached/memcached.h>
#endif

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  long long x = *(const long long *)a, y = *(const long long *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc != 8) { fprintf(stderr, "usage: batch iget|mget HOST PORT GETS SIZE KEYS IN_FLIGHT\n"); return 2; }
  int use_iget = strcmp(argv[1], "iget") == 0;
  int gets = atoi(argv[4]), size = atoi(argv[5]), nkeys = atoi(argv[6]), depth = atoi(argv[7]);
  memcached_st *m = memcached_create(NULL);
  memcached_server_add(m, argv[2], (in_port_t)atoi(argv[3]));
  char *value = malloc((size_t)size);
  memset(value, 'x', (size_t)size);
  char (*keys)[32] = malloc((size_t)nkeys * 32);
  size_t *lens = malloc((size_t)nkeys * sizeof *lens);
  for (int i = 0; i < nkeys; i++) {
    lens[i] = (size_t)snprintf(keys[i], 32, "batch:%d", i);
    if (memcached_set(m, keys[i], lens[i], value, (size_t)size, 0, 0) != MEMCACHED_SUCCESS) { fprintf(stderr, "set failed\n"); return 1; }
  }
  int batches = gets / depth;
  long long *lat = malloc((size_t)batches * sizeof *lat);
  const char **batch_keys = malloc((size_t)depth * sizeof *batch_keys);
  size_t *batch_lens = malloc((size_t)depth * sizeof *batch_lens);
#ifdef WITH_MEMFABRIC
  memcached_request_st **req = malloc((size_t)depth * sizeof *req);
  for (int i = 0; i < depth; i++) req[i] = memcached_request_create(m);
#else
  if (use_iget) { fprintf(stderr, "iget needs memfabric.h\n"); return 2; }
#endif
  long long start = now_ns();
  for (int b = 0; b < batches; b++) {
    for (int i = 0; i < depth; i++) {
      int k = (b * depth + i) % nkeys;
      batch_keys[i] = keys[k];
      batch_lens[i] = lens[k];
    }
    long long t0 = now_ns();
    int hits = 0;
    if (use_iget) {
#ifdef WITH_MEMFABRIC
      for (int i = 0; i < depth; i++) memcached_iget(m, batch_keys[i], batch_lens[i], req[i]);
      if (memcached_wait_all(m, req, (size_t)depth, 5000) != MEMCACHED_SUCCESS) { fprintf(stderr, "timeout\n"); return 1; }
      for (int i = 0; i < depth; i++) hits += memcached_request_status(req[i]) == MEMCACHED_SUCCESS;
#endif
    } else {
      memcached_return_t rc = memcached_mget(m, batch_keys, batch_lens, (size_t)depth);
      if (rc != MEMCACHED_SUCCESS) { fprintf(stderr, "mget: %s\n", memcached_strerror(m, rc)); return 1; }
      memcached_result_st *r;
      while ((r = memcached_fetch_result(m, NULL, &rc)) != NULL) { hits++; memcached_result_free(r); }
    }
    lat[b] = now_ns() - t0;
    if (hits != depth) { fprintf(stderr, "batch %d: %d of %d hits\n", b, hits, depth); return 1; }
  }
  double secs = (double)(now_ns() - start) / 1e9;
  qsort(lat, (size_t)batches, sizeof *lat, cmp);
  printf("{\"p50_us\": %.2f, \"p99_us\": %.2f, \"gets_per_s\": %.0f, \"batches\": %d}\n",
         (double)lat[batches / 2] / 1000.0, (double)lat[(int)(batches * 0.99)] / 1000.0,
         (double)batches * depth / secs, batches);
  return 0;
}
