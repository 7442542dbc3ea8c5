/* redis -- a Redis-like key-value store: churn of small strings (16-100 bytes).
 *
 * Single-threaded, like Redis. The store is a chained hash table (24-byte entries,
 * keys copied as length-prefixed strings, values as 16-byte objects with the string
 * embedded when it is at most 44 bytes and separate otherwise, as Redis does); the
 * bucket array doubles as the table grows. Every command is first "parsed" into an
 * argument vector of freshly allocated string objects, which are freed after the
 * command unless the store keeps them, so most allocations live for one command.
 * Command mix over a 100k-key space: 45% GET, 30% SET (values 8-92 bytes), 8% APPEND
 * (realloc of a value that grows), 7% DEL, 5% INCR, 5% EXISTS.
 * Checksum: hash of every reply, then of the final contents.
 * Usage: redis [scale]
 */
#include "bench.h"

enum { KEYSPACE = 100000, EMBSTR_MAX = 44, VAL_MAX = 92 };

/* ---- length-prefixed strings (sdshdr8-like: 3-byte header, NUL-terminated) ---- */
typedef struct {
  uint8_t len, alloc, flags;
  char buf[];
} sds;

static sds* sds_new(const char* s, size_t len) {
  sds* r = xmalloc(sizeof(sds) + len + 1);
  r->len = r->alloc = (uint8_t)len;
  r->flags = 1;
  memcpy(r->buf, s, len);
  r->buf[len] = 0;
  return r;
}
static sds* sds_cat(sds* s, const char* t, size_t n) {
  if ((size_t)(s->alloc - s->len) < n) {
    size_t want = (s->len + n) * 2;
    if (want > 255) want = 255;
    s = xrealloc(s, sizeof(sds) + want + 1);
    s->alloc = (uint8_t)want;
  }
  memcpy(s->buf + s->len, t, n);
  s->len = (uint8_t)(s->len + n);
  s->buf[s->len] = 0;
  return s;
}

/* ---- string objects ---- */
enum { ENC_EMBSTR = 1, ENC_RAW = 2 };
typedef struct {
  uint32_t enc : 4, lru : 28;
  int32_t refcount;
  sds* ptr;
} robj;

static robj* obj_new(const char* s, size_t len) {
  robj* o;
  if (len <= EMBSTR_MAX) {
    o = xmalloc(sizeof(robj) + sizeof(sds) + len + 1);
    o->enc = ENC_EMBSTR;
    o->ptr = (sds*)(o + 1);
    o->ptr->len = o->ptr->alloc = (uint8_t)len;
    o->ptr->flags = 1;
    memcpy(o->ptr->buf, s, len);
    o->ptr->buf[len] = 0;
  } else {
    o = xmalloc(sizeof(robj));
    o->enc = ENC_RAW;
    o->ptr = sds_new(s, len);
  }
  o->lru = 0;
  o->refcount = 1;
  return o;
}
static void obj_decr(robj* o) {
  BENCH_CHECK(o->refcount > 0 && o->ptr->buf[o->ptr->len] == 0);
  if (--o->refcount == 0) {
    if (o->enc == ENC_RAW) free(o->ptr);
    free(o);
  }
}

/* ---- dictionary ---- */
typedef struct entry {
  sds* key;
  robj* val;
  struct entry* next;
} entry;

static struct {
  entry** table;
  size_t size, used;
} db;

static uint64_t key_hash(const char* s, size_t n) { return hash_bytes(s, n); }

static void db_resize(size_t newsize) {
  entry** t = xcalloc(newsize, sizeof(entry*));
  for (size_t i = 0; i < db.size; i++) {
    for (entry* e = db.table[i]; e;) {
      entry* nx = e->next;
      size_t b = key_hash(e->key->buf, e->key->len) & (newsize - 1);
      e->next = t[b];
      t[b] = e;
      e = nx;
    }
  }
  free(db.table);
  db.table = t;
  db.size = newsize;
}

static entry** db_find(const char* k, size_t n) {
  entry** pp = &db.table[key_hash(k, n) & (db.size - 1)];
  for (; *pp; pp = &(*pp)->next)
    if ((*pp)->key->len == n && memcmp((*pp)->key->buf, k, n) == 0) return pp;
  return pp;
}

static void db_set(robj* key, robj* val) {
  entry** pp = db_find(key->ptr->buf, key->ptr->len);
  val->refcount++;
  if (*pp) {
    obj_decr((*pp)->val);
    (*pp)->val = val;
    return;
  }
  entry* e = xmalloc(sizeof *e);
  e->key = sds_new(key->ptr->buf, key->ptr->len);
  e->val = val;
  e->next = NULL;
  *pp = e;
  if (++db.used > db.size) db_resize(db.size * 2);
}

static int db_del(robj* key) {
  entry** pp = db_find(key->ptr->buf, key->ptr->len);
  entry* e = *pp;
  if (!e) return 0;
  *pp = e->next;
  free(e->key);
  obj_decr(e->val);
  free(e);
  if (--db.used < db.size / 10 && db.size > 16) db_resize(db.size / 2);
  return 1;
}

/* ---- commands ---- */
static uint64_t ck;

static void reply(const void* p, size_t n) { ck = ck_step(ck, hash_bytes(p, n)); }
static void reply_int(int64_t v) { ck = ck_step(ck, (uint64_t)v); }

static void exec(robj** argv, int argc) {
  const char* cmd = argv[0]->ptr->buf;
  robj* key = argv[1];
  switch (cmd[0]) {
    case 'G': { /* GET */
      entry* e = *db_find(key->ptr->buf, key->ptr->len);
      if (e)
        reply(e->val->ptr->buf, e->val->ptr->len);
      else
        reply_int(-1);
      break;
    }
    case 'S': /* SET */
      BENCH_CHECK(argc == 3);
      db_set(key, argv[2]);
      reply_int(0);
      break;
    case 'A': { /* APPEND */
      entry* e = *db_find(key->ptr->buf, key->ptr->len);
      if (!e || e->val->ptr->len + argv[2]->ptr->len > VAL_MAX) {
        db_set(key, argv[2]);
        reply_int(argv[2]->ptr->len);
        break;
      }
      robj* v = e->val;
      if (v->enc == ENC_EMBSTR || v->refcount > 1) { /* unshare: make a raw copy */
        robj* c = xmalloc(sizeof(robj));
        c->enc = ENC_RAW;
        c->lru = 0;
        c->refcount = 1;
        c->ptr = sds_new(v->ptr->buf, v->ptr->len);
        obj_decr(v);
        e->val = v = c;
      }
      v->ptr = sds_cat(v->ptr, argv[2]->ptr->buf, argv[2]->ptr->len);
      reply_int(v->ptr->len);
      break;
    }
    case 'D': /* DEL */ reply_int(db_del(key)); break;
    case 'I': { /* INCR */
      entry* e = *db_find(key->ptr->buf, key->ptr->len);
      int64_t v = 0;
      if (e) {
        char* end;
        v = strtoll(e->val->ptr->buf, &end, 10);
        if (*end || e->val->ptr->len == 0) {
          reply_int(-2); /* not an integer */
          break;
        }
      }
      char num[24];
      int n = snprintf(num, sizeof num, "%" PRId64, v + 1);
      robj* o = obj_new(num, (size_t)n);
      db_set(key, o);
      obj_decr(o);
      reply_int(v + 1);
      break;
    }
    case 'E': /* EXISTS */ reply_int(*db_find(key->ptr->buf, key->ptr->len) != NULL); break;
    default: bench_die("unknown command %s", cmd);
  }
}

int main(int argc, char** argv) {
  bench_init("redis", argc, argv, 0);
  uint64_t ncmds = bench_scaled(1500000, 1);
  rng_t rng;
  rng_seed(&rng, 6379);
  db.size = 16;
  db.table = xcalloc(db.size, sizeof(entry*));
  static const char* names[] = {"GET", "SET", "APPEND", "DEL", "INCR", "EXISTS"};
  char keybuf[32], valbuf[VAL_MAX + 1];

  for (uint64_t i = 0; i < ncmds; i++) {
    uint32_t p = rng_below(&rng, 100);
    int c = p < 45 ? 0 : p < 75 ? 1 : p < 83 ? 2 : p < 90 ? 3 : p < 95 ? 4 : 5;
    uint32_t k = rng_below(&rng, KEYSPACE);
    if (c == 4) k %= 1000; /* counters live in a small part of the key space */
    int klen = snprintf(keybuf, sizeof keybuf, "%s:%u", c == 4 ? "ctr" : "key", k);
    size_t vlen = 0;
    if (c == 1 || c == 2) {
      vlen = c == 1 ? rng_range(&rng, 8, VAL_MAX) : rng_range(&rng, 1, 16);
      uint64_t x = rng_next(&rng);
      for (size_t j = 0; j < vlen; j++) valbuf[j] = (char)('a' + (x >> ((j * 5) % 60) & 15) + (j & 7));
    }
    /* "parse" the request into freshly allocated argument objects */
    int ac = (c == 1 || c == 2) ? 3 : 2;
    robj** av = xmalloc((size_t)ac * sizeof(robj*));
    av[0] = obj_new(names[c], strlen(names[c]));
    av[1] = obj_new(keybuf, (size_t)klen);
    if (ac == 3) av[2] = obj_new(valbuf, vlen);
    exec(av, ac);
    for (int j = 0; j < ac; j++) obj_decr(av[j]);
    free(av);
  }

  /* final contents (order-independent), then tear down */
  uint64_t content = 0;
  for (size_t b = 0; b < db.size; b++) {
    for (entry* e = db.table[b]; e;) {
      entry* nx = e->next;
      content += mix64(hash_bytes(e->key->buf, e->key->len) ^ hash_bytes(e->val->ptr->buf, e->val->ptr->len));
      free(e->key);
      obj_decr(e->val);
      free(e);
      e = nx;
    }
  }
  printf("redis commands=%" PRIu64 " keys=%zu checksum=%016" PRIx64 "\n", ncmds, db.used, ck_step(ck, content));
  free(db.table);
  return 0;
}
