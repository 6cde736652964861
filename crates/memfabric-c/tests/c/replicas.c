/* libmemcached's replicas (MEMCACHED_BEHAVIOR_NUMBER_OF_REPLICAS, binary protocol). Run on
 * the real libmemcached and on libmemfabric with the same three servers; the outputs must
 * match (tests/c_abi.rs).
 *   replicas placement P1 P2 P3     which servers hold each key once writes are flushed,
 *                                   and what a pool finds after a key's server lost it
 *   replicas write DIST REPS P1 P2 P3   stores 12 keys (then the test kills a server)
 *   replicas read DIST REPS P1 P2 P3    what the pool still finds */
#include <libmemcached/memcached.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int ports[3];

static memcached_st *single(int s) {
  memcached_st *m = memcached_create(NULL);
  memcached_server_add(m, "127.0.0.1", (in_port_t)ports[s]);
  return m;
}

static int holds(int s, const char *k) {
  memcached_st *m = single(s);
  size_t l; uint32_t f; memcached_return_t rc;
  char *v = memcached_get(m, k, strlen(k), &l, &f, &rc);
  free(v);
  memcached_free(m);
  return rc == MEMCACHED_SUCCESS;
}

/* libmemcached writes replicas with quiet binary commands, which no reply confirms: the
 * servers may not have applied the last of them when memcached_flush_buffers returns, and
 * `holds` asks on another connection. Give them time to, so the reference is not racy. */
static void settle(void) { usleep(100000); }

static void drop(int s, const char *k) {
  memcached_st *m = single(s);
  memcached_delete(m, k, strlen(k), 0);
  memcached_free(m);
}

static memcached_st *pool3(int dist, int reps) {
  memcached_st *m = memcached_create(NULL);
  for (int i = 0; i < 3; i++) memcached_server_add(m, "127.0.0.1", (in_port_t)ports[i]);
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_BINARY_PROTOCOL, 1);
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_NUMBER_OF_REPLICAS, (uint64_t)reps);
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_POLL_TIMEOUT, 500);
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT, 500);
  if (dist) memcached_behavior_set(m, MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED, 1);
  return m;
}

static int phased(int argc, char **argv) {
  if (argc != 7) return 2;
  int dist = atoi(argv[2]), reps = atoi(argv[3]);
  for (int i = 0; i < 3; i++) ports[i] = atoi(argv[i + 4]);
  memcached_st *m = pool3(dist, reps);
  char keys[12][16];
  const char *list[12]; size_t lens[12];
  for (int k = 0; k < 12; k++) {
    snprintf(keys[k], sizeof keys[k], "dead%d", k * 7);
    list[k] = keys[k];
    lens[k] = strlen(keys[k]);
  }
  if (strcmp(argv[1], "write") == 0) {
    memcached_flush(m, 0);
    for (int k = 0; k < 12; k++) memcached_set(m, keys[k], lens[k], "v", 1, 0, 0);
    memcached_flush_buffers(m);
    settle();
    memcached_free(m);
    return 0;
  }
  printf("read dist=%d replicas=%d:", dist, reps);
  for (int k = 0; k < 12; k++) {
    size_t l; uint32_t f; memcached_return_t rc;
    char *v = memcached_get(m, keys[k], lens[k], &l, &f, &rc);
    printf(" %d", v != NULL);
    free(v);
  }
  memcached_return_t rc = memcached_mget(m, list, lens, 12);
  memcached_result_st *r; int n = 0;
  while ((r = memcached_fetch_result(m, NULL, &rc)) != NULL) { n++; memcached_result_free(r); }
  printf(" | mget finds %d\n", n);
  memcached_free(m);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc > 1 && strcmp(argv[1], "placement") != 0) return phased(argc, argv);
  if (argc != 5) return 2;
  for (int i = 0; i < 3; i++) ports[i] = atoi(argv[i + 2]);
  for (int dist = 0; dist < 2; dist++)
    for (int binary = 0; binary < 2; binary++)
      for (int reps = 0; reps < 4; reps++) {
        memcached_st *m = memcached_create(NULL);
        for (int i = 0; i < 3; i++) memcached_server_add(m, "127.0.0.1", (in_port_t)ports[i]);
        memcached_behavior_set(m, MEMCACHED_BEHAVIOR_BINARY_PROTOCOL, (uint64_t)binary);
        memcached_behavior_set(m, MEMCACHED_BEHAVIOR_NUMBER_OF_REPLICAS, (uint64_t)reps);
        if (dist) memcached_behavior_set(m, MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED, 1);
        memcached_flush(m, 0);
        printf("%s binary=%d replicas=%d:", dist ? "ketama" : "modula", binary, reps);
        char keys[12][16];
        for (int k = 0; k < 12; k++) {
          snprintf(keys[k], sizeof keys[k], "rep%d", k * 7);
          memcached_return_t rc = memcached_set(m, keys[k], strlen(keys[k]), "v", 1, 0, 0);
          if (rc != MEMCACHED_SUCCESS) printf(" %s", memcached_strerror(m, rc));
        }
        memcached_flush_buffers(m);
        settle();
        for (int k = 0; k < 12; k++) printf(" [%d%d%d]", holds(0, keys[k]), holds(1, keys[k]), holds(2, keys[k]));
        int found = 0;
        for (int k = 0; k < 12; k++) {
          drop((int)memcached_generate_hash(m, keys[k], strlen(keys[k])), keys[k]);
          size_t l; uint32_t f; memcached_return_t rc;
          char *v = memcached_get(m, keys[k], strlen(keys[k]), &l, &f, &rc);
          found += v != NULL;
          free(v);
        }
        printf(" | own servers lost: get finds %d", found);
        const char *list[12]; size_t lens[12];
        for (int k = 0; k < 12; k++) { list[k] = keys[k]; lens[k] = strlen(keys[k]); }
        memcached_mget(m, list, lens, 12);
        memcached_result_st *r; memcached_return_t rc; int n = 0;
        while ((r = memcached_fetch_result(m, NULL, &rc)) != NULL) { n++; memcached_result_free(r); }
        printf(", mget finds %d", n);
        memcached_delete(m, keys[1], strlen(keys[1]), 0);
        memcached_flush_buffers(m);
        /* A copy that outlives the delete for 2 s is a copy the delete never reached. */
        int left = 0;
        for (int tries = 0; tries < 100; tries++) {
          left = holds(0, keys[1]) * 100 + holds(1, keys[1]) * 10 + holds(2, keys[1]);
          if (left == 0) break;
          usleep(20000);
        }
        printf(", after a delete [%03d]\n", left);
        memcached_free(m);
      }
  return 0;
}
