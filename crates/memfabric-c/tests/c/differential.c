/* One program, two libraries: compiled against Debian's libmemcached-dev headers, run once
 * with the real libmemcached.so.11 and once with libmemfabric in its place; the two outputs
 * must be identical (crates/memfabric-c/tests/c_abi.rs). Every line is one call and what it
 * returned, so a difference names the call. Usage: differential HOST PORT DEADPORT
 * SILENTPORT, where DEADPORT refuses connections and SILENTPORT accepts and never answers. */
#include <libmemcached/memcached.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *host;
static int port, dead_port, silent_port;

#define RC(call) do { memcached_return_t rc_ = (call); printf("%-48s %s\n", #call, memcached_strerror(NULL, rc_)); } while (0)

static void show_get(memcached_st *m, const char *what, const char *key, size_t klen) {
  size_t len = 0; uint32_t flags = 0; memcached_return_t rc;
  char *v = memcached_get(m, key, klen, &len, &flags, &rc);
  printf("get %-44s %s", what, memcached_strerror(NULL, rc));
  if (v) { printf(" len=%zu flags=%u value=%.*s", len, flags, (int)(len > 40 ? 40 : len), v); free(v); }
  else printf(" (null)");
  printf("\n");
}

static memcached_st *pool(int binary, int p) {
  memcached_st *m = memcached_create(NULL);
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_BINARY_PROTOCOL, binary);
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_POLL_TIMEOUT, 500);
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT, 500);
  memcached_server_add(m, host, p);
  return m;
}

static void commands(int binary) {
  printf("== commands, %s\n", binary ? "binary" : "ascii");
  memcached_st *m = pool(binary, port);
  char key[300], big[2 * 1024 * 1024];
  memset(big, 'x', sizeof big);
  RC(memcached_flush(m, 0));
  RC(memcached_set(m, "a", 1, "one", 3, 0, 5));
  show_get(m, "a", "a", 1);
  show_get(m, "missing", "missing", 7);
  RC(memcached_add(m, "a", 1, "two", 3, 0, 0));
  RC(memcached_add(m, "b", 1, "two", 3, 0, 0));
  RC(memcached_replace(m, "nope", 4, "x", 1, 0, 0));
  RC(memcached_replace(m, "b", 1, "three", 5, 0, 7));
  show_get(m, "b", "b", 1);
  RC(memcached_append(m, "b", 1, "-end", 4, 0, 0));
  RC(memcached_prepend(m, "b", 1, "start-", 6, 0, 0));
  RC(memcached_append(m, "nope", 4, "x", 1, 0, 0));
  RC(memcached_prepend(m, "nope", 4, "x", 1, 0, 0));
  show_get(m, "b", "b", 1);
  RC(memcached_cas(m, "nope", 4, "x", 1, 0, 0, 12345));
  RC(memcached_cas(m, "b", 1, "x", 1, 0, 0, 12345));
  RC(memcached_delete(m, "b", 1, 0));
  RC(memcached_delete(m, "b", 1, 0));
  uint64_t v = 99;
  RC(memcached_set(m, "n", 1, "10", 2, 0, 0));
  RC(memcached_increment(m, "n", 1, 5, &v)); printf("value %llu\n", (unsigned long long)v);
  RC(memcached_decrement(m, "n", 1, 100, &v)); printf("value %llu\n", (unsigned long long)v);
  RC(memcached_increment(m, "nokey", 5, 1, &v));
  RC(memcached_decrement(m, "nokey", 5, 1, &v));
  RC(memcached_increment(m, "a", 1, 1, &v));
  RC(memcached_touch(m, "a", 1, 100));
  RC(memcached_touch(m, "nope", 4, 100));
  /* too large, then bad keys */
  RC(memcached_set(m, "big", 3, big, sizeof big, 0, 0));
  show_get(m, "big", "big", 3);
  RC(memcached_set(m, "", 0, "v", 1, 0, 0));
  show_get(m, "empty key", "", 0);
  memset(key, 'k', sizeof key);
  RC(memcached_set(m, key, 250, "v", 1, 0, 0));
  RC(memcached_set(m, key, 251, "v", 1, 0, 0));
  show_get(m, "251-byte key", key, 251);
  RC(memcached_delete(m, key, 251, 0));
  RC(memcached_behavior_set(m, MEMCACHED_BEHAVIOR_VERIFY_KEY, 1));
  RC(memcached_set(m, "with space", 10, "v", 1, 0, 0));
  RC(memcached_set(m, "ctl\x01key", 7, "v", 1, 0, 0));
  show_get(m, "key with space", "with space", 10);
  /* cas through a fetched result */
  RC(memcached_behavior_set(m, MEMCACHED_BEHAVIOR_SUPPORT_CAS, 1));
  const char *keys[] = {"a", "missing", "n"};
  size_t lens[] = {1, 7, 1};
  RC(memcached_mget(m, keys, lens, 3));
  memcached_result_st *r; memcached_return_t rc; uint64_t cas_a = 0; int results = 0;
  while ((r = memcached_fetch_result(m, NULL, &rc)) != NULL) {
    printf("result %.*s len=%zu flags=%u rc=%s\n", (int)memcached_result_key_length(r), memcached_result_key_value(r),
           memcached_result_length(r), memcached_result_flags(r), memcached_strerror(NULL, rc));
    if (memcached_result_key_length(r) == 1 && memcached_result_key_value(r)[0] == 'a') cas_a = memcached_result_cas(r);
    results++;
    memcached_result_free(r);
  }
  printf("fetch end %s after %d results, cas seen %d\n", memcached_strerror(NULL, rc), results, cas_a != 0);
  RC(memcached_cas(m, "a", 1, "casd", 4, 0, 0, cas_a));
  RC(memcached_cas(m, "a", 1, "again", 5, 0, 0, cas_a));
  show_get(m, "a", "a", 1);
  /* mget with nothing */
  RC(memcached_mget(m, keys, lens, 0));
  r = memcached_fetch_result(m, NULL, &rc);
  printf("fetch after empty mget %s %s\n", r ? "result" : "null", memcached_strerror(NULL, rc));
  /* fetch with memcached_fetch */
  RC(memcached_mget(m, keys, lens, 3));
  char kbuf[MEMCACHED_MAX_KEY]; size_t kl, vl; uint32_t fl; char *val;
  while ((val = memcached_fetch(m, kbuf, &kl, &vl, &fl, &rc)) != NULL) {
    printf("fetch %.*s=%.*s %s\n", (int)kl, kbuf, (int)vl, val, memcached_strerror(NULL, rc)); free(val);
  }
  printf("fetch end %s\n", memcached_strerror(NULL, rc));
  /* namespace */
  RC(memcached_callback_set(m, MEMCACHED_CALLBACK_NAMESPACE, "ns:"));
  RC(memcached_set(m, "a", 1, "spaced", 6, 0, 0));
  show_get(m, "a in namespace", "a", 1);
  RC(memcached_callback_set(m, MEMCACHED_CALLBACK_NAMESPACE, NULL));
  show_get(m, "ns:a without namespace", "ns:a", 4);
  RC(memcached_callback_set(m, MEMCACHED_CALLBACK_NAMESPACE, "bad space"));
  memcached_free(m);
}

static void failures(int binary) {
  printf("== failures, %s\n", binary ? "binary" : "ascii");
  memcached_st *m = memcached_create(NULL);
  RC(memcached_set(m, "a", 1, "v", 1, 0, 0));
  show_get(m, "no servers", "a", 1);
  memcached_free(m);
  m = pool(binary, dead_port);
  RC(memcached_set(m, "a", 1, "v", 1, 0, 0));
  show_get(m, "server down", "a", 1);
  RC(memcached_delete(m, "a", 1, 0));
  memcached_free(m);
  m = pool(binary, silent_port);
  RC(memcached_set(m, "a", 1, "v", 1, 0, 0));
  show_get(m, "server silent", "a", 1);
  memcached_free(m);
}

static void behaviours(void) {
  printf("== behaviours\n");
  memcached_st *m = memcached_create(NULL);
  for (int b = 0; b < MEMCACHED_BEHAVIOR_MAX; b++)
    if (b != MEMCACHED_BEHAVIOR_SOCKET_SEND_SIZE && b != MEMCACHED_BEHAVIOR_SOCKET_RECV_SIZE)
      printf("default %d = %llu\n", b, (unsigned long long)memcached_behavior_get(m, b));
  for (int b = 0; b < MEMCACHED_BEHAVIOR_MAX; b++) {
    if (b == MEMCACHED_BEHAVIOR_SOCKET_SEND_SIZE || b == MEMCACHED_BEHAVIOR_SOCKET_RECV_SIZE) continue;
    uint64_t vals[] = {0, 1, 7, 5000};
    for (int i = 0; i < 4; i++) {
      memcached_st *x = memcached_create(NULL);
      memcached_return_t rc = memcached_behavior_set(x, b, vals[i]);
      printf("set %d=%llu %s:", b, (unsigned long long)vals[i], memcached_strerror(NULL, rc));
      for (int c = 0; c < MEMCACHED_BEHAVIOR_MAX; c++)
        if (c != MEMCACHED_BEHAVIOR_SOCKET_SEND_SIZE && c != MEMCACHED_BEHAVIOR_SOCKET_RECV_SIZE
            && memcached_behavior_get(x, c) != memcached_behavior_get(m, c))
          printf(" %d=%llu", c, (unsigned long long)memcached_behavior_get(x, c));
      printf("\n");
      memcached_free(x);
    }
  }
  memcached_free(m);
}

static void hashes(void) {
  printf("== hashes\n");
  static const char *servers = "h1:11211,h2:11212:3,h3:11213,h4";
  for (int dist = 0; dist < 3; dist++) {
    for (int h = 0; h < 11; h++) {
      if (h == MEMCACHED_HASH_HSIEH) continue;
      memcached_st *m = memcached_create(NULL);
      memcached_server_st *list = memcached_servers_parse(servers);
      memcached_server_push(m, list);
      memcached_server_list_free(list);
      if (dist == 1) memcached_behavior_set(m, MEMCACHED_BEHAVIOR_KETAMA, 1);
      if (dist == 2) memcached_behavior_set(m, MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED, 1);
      if (memcached_behavior_set(m, MEMCACHED_BEHAVIOR_HASH, h) != MEMCACHED_SUCCESS) { memcached_free(m); continue; }
      printf("dist %d hash %d:", dist, h);
      for (int k = 0; k < 40; k++) {
        char key[32]; int n = snprintf(key, sizeof key, "key-%d", k * 7919);
        printf(" %u", memcached_generate_hash(m, key, n));
      }
      printf("\n");
      memcached_free(m);
    }
  }
}

static memcached_return_t print_server(const memcached_st *m, const memcached_instance_st *s, void *ctx) {
  (void)m; (void)ctx;
  printf("server %s:%u\n", memcached_server_name(s), (unsigned)memcached_server_port(s));
  return MEMCACHED_SUCCESS;
}

static void servers_and_config(void) {
  printf("== servers and configuration\n");
  memcached_server_st *list = memcached_servers_parse("cache-a:1, cache-b:2:3,cache-c");
  printf("parsed %u\n", memcached_server_list_count(list));
  memcached_st *m = memcached_create(NULL);
  RC(memcached_server_push(m, list));
  memcached_server_list_free(list);
  RC(memcached_server_add(m, "e", 0));
  RC(memcached_server_add_with_weight(m, "f", 6, 2));
  printf("count %u\n", memcached_server_count(m));
  memcached_server_fn fns[] = {print_server};
  RC(memcached_server_cursor(m, fns, NULL, 1));
  memcached_free(m);
  const char *confs[] = {"--SERVER=cache1.example:1 --SERVER=10.0.0.2:2/?3 --BINARY-PROTOCOL", "--SERVER=cache1 --TCP-NODELAY",
                         "--SERVER=host.a:1 --CONNECT-TIMEOUT=77 --NOREPLY", "--SERVER=a.b --DISTRIBUTION=consistent --HASH=MD5",
                         "--SERVER=a.b --DISTRIBUTION=modula", "--SERVER=a.b --DISTRIBUTION=random", "--SERVER=a.b --DISTRIBUTION=consistent,CRC",
                         "--SERVER=a.b:11211 --SERVER=a.b:11212/?2", "--BOGUS", "", "--SERVER=a.b --HASH=bogus", "--SERVER=a.b,--TCP-NODELAY",
                         "--SERVER=a.b --POOL-MIN=1 --POOL-MAX=5", "--SERVER=localhost"};
  for (size_t i = 0; i < sizeof confs / sizeof *confs; i++) {
    memcached_st *c = memcached(confs[i], strlen(confs[i]));
    printf("config \"%s\": %s", confs[i], c ? "ok" : "NULL");
    if (c) {
      printf(" servers=%u bin=%llu nodelay=%llu noreply=%llu ct=%llu dist=%llu hash=%llu replicas=%llu poll=%llu verify=%llu",
             memcached_server_count(c), (unsigned long long)memcached_behavior_get(c, MEMCACHED_BEHAVIOR_BINARY_PROTOCOL),
             (unsigned long long)memcached_behavior_get(c, MEMCACHED_BEHAVIOR_TCP_NODELAY), (unsigned long long)memcached_behavior_get(c, MEMCACHED_BEHAVIOR_NOREPLY),
             (unsigned long long)memcached_behavior_get(c, MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT), (unsigned long long)memcached_behavior_get(c, MEMCACHED_BEHAVIOR_DISTRIBUTION),
             (unsigned long long)memcached_behavior_get(c, MEMCACHED_BEHAVIOR_HASH), (unsigned long long)memcached_behavior_get(c, MEMCACHED_BEHAVIOR_NUMBER_OF_REPLICAS),
             (unsigned long long)memcached_behavior_get(c, MEMCACHED_BEHAVIOR_POLL_TIMEOUT), (unsigned long long)memcached_behavior_get(c, MEMCACHED_BEHAVIOR_VERIFY_KEY));
      memcached_free(c);
    }
    printf("\n");
  }
}

static void layout(void) {
  printf("== layout\n");
  memcached_st on_stack;
  memcached_st *m = memcached_create(&on_stack);
  printf("create in place %s\n", m == &on_stack ? "same" : "other");
  memcached_server_add(m, "x", 1);
  memcached_server_add(m, "y", 2);
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_SND_TIMEOUT, 1234);
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_RCV_TIMEOUT, 4321);
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_NUMBER_OF_REPLICAS, 2);
  int token;
  memcached_set_user_data(m, &token);
  printf("fields hosts=%u snd=%d rcv=%d replicas=%u user_data=%d get_user_data=%d poll=%d connect=%d retry=%d\n",
         on_stack.number_of_hosts, on_stack.snd_timeout, on_stack.rcv_timeout, on_stack.number_of_replicas,
         on_stack.user_data == &token, memcached_get_user_data(m) == &token, on_stack.poll_timeout, on_stack.connect_timeout, on_stack.retry_timeout);
  memcached_st *clone = memcached_clone(NULL, m);
  printf("clone hosts=%u replicas=%llu user_data=%d\n", memcached_server_count(clone),
         (unsigned long long)memcached_behavior_get(clone, MEMCACHED_BEHAVIOR_NUMBER_OF_REPLICAS), memcached_get_user_data(clone) == &token);
  memcached_free(clone);
  memcached_free(m);
  memcached_result_st res_on_stack;
  memcached_st *n = memcached_create(NULL);
  memcached_result_st *r = memcached_result_create(n, &res_on_stack);
  printf("result in place %s len=%zu\n", r == &res_on_stack ? "same" : "other", memcached_result_length(r));
  memcached_result_free(r);
  memcached_free(n);
  /* what libmemcached survives */
  memcached_free(NULL);
  memcached_result_free(NULL);
  memcached_server_list_free(NULL);
  printf("strerror 0..48:");
  for (int i = 0; i < MEMCACHED_MAXIMUM_RETURN; i++) printf(" [%s]", memcached_strerror(NULL, i));
  printf("\n");
}

/* Misuse libmemcached survives (NULL where it accepts NULL, a second free of a struct on
 * the stack): libmemfabric must survive it too and answer the same. */
static void misuse(void) {
  printf("== misuse\n");
  size_t l; uint32_t f; memcached_return_t rc;
  memcached_free(NULL);
  memcached_result_free(NULL);
  memcached_server_list_free(NULL);
  printf("strerror(999) %s\n", memcached_strerror(NULL, 999));
  printf("server_count(NULL) %u\n", memcached_server_count(NULL));
  RC(memcached_set(NULL, "a", 1, "v", 1, 0, 0));
  char *v = memcached_get(NULL, "a", 1, &l, &f, &rc);
  printf("get(NULL) %s %s\n", v ? "value" : "null", memcached_strerror(NULL, rc));
  printf("behavior_get(NULL) %llu\n", (unsigned long long)memcached_behavior_get(NULL, 1));
  RC(memcached_behavior_set(NULL, 1, 1));
  printf("last_error(NULL) %s [%s]\n", memcached_strerror(NULL, memcached_last_error(NULL)), memcached_last_error_message(NULL));
  memcached_st *m = memcached_create(NULL);
  v = memcached_get(m, NULL, 0, NULL, NULL, &rc);
  printf("get NULL key, no servers %s %s\n", v ? "value" : "null", memcached_strerror(NULL, rc));
  RC(memcached_mget(m, NULL, NULL, 3));
  RC(memcached_delete(m, "a", 1, 0));
  RC(memcached_flush(m, 0));
  memcached_stat_st *st = memcached_stat(m, NULL, &rc);
  printf("stat, no servers %s %s\n", st ? "array" : "null", memcached_strerror(NULL, rc));
  memcached_result_st *r = memcached_fetch_result(m, NULL, &rc);
  printf("fetch_result without mget %s %s\n", r ? "result" : "null", memcached_strerror(NULL, rc));
  RC(memcached_callback_set(m, MEMCACHED_CALLBACK_NAMESPACE, NULL));
  RC(memcached_server_add(m, NULL, 0));
  printf("server_add(NULL) count %u\n", memcached_server_count(m));
  memcached_free(m);
  m = pool(0, port);
  v = memcached_get(m, "a", 1, NULL, NULL, &rc);
  printf("get with NULL out-parameters %s %s\n", v ? "value" : "null", memcached_strerror(NULL, rc));
  free(v);
  RC(memcached_set(m, NULL, 0, NULL, 0, 0, 0));
  RC(memcached_set(m, "k", 1, NULL, 0, 0, 0));
  RC(memcached_mget(m, NULL, NULL, 3));
  RC(memcached_increment(m, "nokey", 5, 1, NULL));
  memcached_free(m);
  m = memcached_clone(NULL, NULL);
  printf("clone(NULL, NULL) servers %u\n", memcached_server_count(m));
  memcached_free(m);
  memcached_st on_stack;
  memcached_create(&on_stack);
  memcached_free(&on_stack);
  memcached_free(&on_stack);
  printf("second free of a struct on the stack: survived\n");
}

/* The codes at the end of an mget's results: END once into a caller's result after hits,
 * NOT FOUND otherwise; memcached_fetch likewise. */
static void fetch_ends(int binary) {
  printf("== fetch ends, %s\n", binary ? "binary" : "ascii");
  memcached_st *m = pool(binary, port);
  memcached_set(m, "p1", 2, "v", 1, 0, 0);
  memcached_set(m, "p2", 2, "v", 1, 0, 0);
  const char *sets[][2] = {{"p1", NULL}, {"p1", "p2"}, {"p1", "zz"}, {"zz", NULL}, {"zz", "yy"}};
  for (int i = 0; i < 5; i++) {
    const char *keys[2] = {sets[i][0], sets[i][1]};
    size_t lens[2] = {2, 2};
    size_t n = sets[i][1] ? 2 : 1;
    memcached_result_st res;
    memcached_result_create(m, &res);
    memcached_return_t rc = memcached_mget(m, keys, lens, n);
    int c = 0;
    while (memcached_fetch_result(m, &res, &rc) != NULL) c++;
    printf("%s,%s: %d into caller's result, end %s", keys[0], n > 1 ? keys[1] : "-", c, memcached_strerror(NULL, rc));
    memcached_result_st *r = memcached_fetch_result(m, &res, &rc);
    printf("; again %s %s", r ? "result" : "null", memcached_strerror(NULL, rc));
    memcached_result_free(&res);
    memcached_mget(m, keys, lens, n);
    c = 0;
    while ((r = memcached_fetch_result(m, NULL, &rc)) != NULL) { c++; memcached_result_free(r); }
    printf("; %d allocated, end %s", c, memcached_strerror(NULL, rc));
    char k[MEMCACHED_MAX_KEY]; size_t kl, vl; uint32_t f; char *v;
    memcached_mget(m, keys, lens, n);
    c = 0;
    while ((v = memcached_fetch(m, k, &kl, &vl, &f, &rc)) != NULL) { c++; free(v); }
    printf("; fetch %d, end %s", c, memcached_strerror(NULL, rc));
    v = memcached_fetch(m, k, &kl, &vl, &f, &rc);
    printf("; again %s\n", memcached_strerror(NULL, rc));
  }
  memcached_free(m);
}

int main(int argc, char **argv) {
  if (argc < 5) { fprintf(stderr, "usage: %s HOST PORT DEADPORT SILENTPORT\n", argv[0]); return 2; }
  setvbuf(stdout, NULL, _IOLBF, 0);
  host = argv[1]; port = atoi(argv[2]); dead_port = atoi(argv[3]); silent_port = atoi(argv[4]);
  layout();
  behaviours();
  hashes();
  servers_and_config();
  commands(0);
  commands(1);
  fetch_ends(0);
  fetch_ends(1);
  misuse();
  failures(0);
  failures(1);
  return 0;
}
