/* options.c -- Keel's settings, from three places, later ones winning:
 *   1. the defaults below;
 *   2. `keel_conf`, a string the program may define ("purge_delay:500,thp:never"), read
 *      once at start-up like jemalloc's malloc_conf -- the only way for a program to set
 *      the options that cannot change once memory has been handed out (check,
 *      profile_rate from zero, huge_page_size);
 *   3. the environment, KEEL_<NAME> -- the operator's word, so it overrides the program.
 * keel_option_set()/keel_option_get() change and read them while the program runs.
 * Sizes take K/M/G suffixes; booleans 1/0, on/off, yes/no, true/false; durations are
 * milliseconds, or seconds with an "s" suffix. Nothing here allocates: start-up runs
 * inside the first malloc. A bad value or unknown name from keel_conf or the environment
 * gets one warning line and the current value is kept; from the API, an error code.
 * Every field is written with relaxed atomic stores and read with keel_opt() (options.h
 * has the rule and its exceptions). */
#include "core/internal.h"

#include <errno.h>

keel_options_t _keel_options = {
    .purge_delay_ms = 1000,
    .tcache_bytes = 1u << 20,
    .tcache_total = 32u << 20,
    .tcache_idle_ms = 1000,
    .huge_page_size = 0,
    .stats_at_exit = false,
    .background_purge = true,
    .check = false,
    .publish = true,
    .profile_rate = 0,
    .profile_growth = 0,
    .profile_at_exit = true,
    .profile_leaks = false,
    .profile_prefix = "/tmp/keel-profile",
    .thp = KEEL_THP_SYSTEM,
    .mesh = KEEL_MESH_OFF,
    .check_guard = 0,
    .child_purger = 4u << 20,
    .fine_classes = 4u << 20,
};

/* The program's configuration string, if it defines one (weak: most do not). */
extern const char* keel_conf __attribute__((weak, visibility("default")));

typedef enum { K_MS, K_SIZE, K_BOOL, K_ENUM, K_PATH } opt_kind_t;

/* When a value may change. */
typedef enum {
  AT_ANY_TIME,  /* read where it is used, so a new value takes effect at once */
  AT_START,     /* fixed once the first block exists */
  AT_START_ON,  /* profiling: the rate may change while on, not switch on or off */
} opt_when_t;

typedef struct {
  const char* name; /* keel_conf and API name; the variable is KEEL_ + NAME in capitals */
  opt_kind_t kind;
  opt_when_t when;
  void* field;
  const char* const* names; /* K_ENUM: the values' names, by value, NULL-terminated */
} opt_t;

static const char* const THP_NAMES[] = {"system", "always", "never", "dense", NULL};
static const char* const MESH_NAMES[] = {"off", "on", "user", NULL};

static const opt_t OPTS[] = {
    {"purge_delay", K_MS, AT_ANY_TIME, &_keel_options.purge_delay_ms, NULL},
    {"tcache_max", K_SIZE, AT_ANY_TIME, &_keel_options.tcache_bytes, NULL},
    {"tcache_total", K_SIZE, AT_ANY_TIME, &_keel_options.tcache_total, NULL},
    {"tcache_idle", K_MS, AT_ANY_TIME, &_keel_options.tcache_idle_ms, NULL},
    {"huge_page_size", K_SIZE, AT_START, &_keel_options.huge_page_size, NULL},
    {"thp", K_ENUM, AT_ANY_TIME, &_keel_options.thp, THP_NAMES},
    {"mesh", K_ENUM, AT_ANY_TIME, &_keel_options.mesh, MESH_NAMES},
    {"stats", K_BOOL, AT_ANY_TIME, &_keel_options.stats_at_exit, NULL},
    {"background_purge", K_BOOL, AT_ANY_TIME, &_keel_options.background_purge, NULL},
    {"child_purger", K_SIZE, AT_ANY_TIME, &_keel_options.child_purger, NULL},
    {"fine_classes", K_SIZE, AT_ANY_TIME, &_keel_options.fine_classes, NULL},
    {"cpus", K_SIZE, AT_START, &_keel_options.cpus, NULL},
    {"own_lines", K_BOOL, AT_ANY_TIME, &_keel_options.own_lines, NULL},
    {"check", K_BOOL, AT_START, &_keel_options.check, NULL},
    {"check_guard", K_SIZE, AT_ANY_TIME, &_keel_options.check_guard, NULL},
    {"publish", K_BOOL, AT_ANY_TIME, &_keel_options.publish, NULL},
    {"profile_rate", K_SIZE, AT_START_ON, &_keel_options.profile_rate, NULL},
    {"profile_growth", K_SIZE, AT_ANY_TIME, &_keel_options.profile_growth, NULL},
    {"profile_at_exit", K_BOOL, AT_ANY_TIME, &_keel_options.profile_at_exit, NULL},
    {"profile_leaks", K_BOOL, AT_ANY_TIME, &_keel_options.profile_leaks, NULL},
    {"profile_prefix", K_PATH, AT_ANY_TIME, &_keel_options.profile_prefix, NULL},
};
#define NOPTS (sizeof OPTS / sizeof OPTS[0])

static const char* const KIND_HINT[] = {
    [K_MS] = "milliseconds, or seconds with an s suffix",
    [K_SIZE] = "a size like 512K, 4M",
    [K_BOOL] = "1/0, on/off",
    [K_PATH] = "a path prefix",
};

static bool eq(const char* a, const char* b) { return strcmp(a, b) == 0; }

/* Decimal digits into *n; returns the first character after them, NULL on overflow or
 * when there are no digits. */
static const char* parse_digits(const char* s, uint64_t* n) {
  if (*s < '0' || *s > '9') return NULL;
  uint64_t v = 0;
  for (; *s >= '0' && *s <= '9'; s++) {
    if (v > (UINT64_MAX - 9) / 10) return NULL;
    v = v * 10 + (uint64_t)(*s - '0');
  }
  *n = v;
  return s;
}

/* Decimal number with an optional K/M/G (binary) suffix and optional trailing B/iB. */
static bool parse_size(const char* v, uint64_t* out) {
  uint64_t n;
  const char* s = parse_digits(v, &n);
  if (s == NULL) return false;
  unsigned shift = 0;
  switch (*s) {
    case 'k': case 'K': shift = 10; s++; break;
    case 'm': case 'M': shift = 20; s++; break;
    case 'g': case 'G': shift = 30; s++; break;
    default: break;
  }
  if (shift && *s == 'i') s++;
  if (*s == 'b' || *s == 'B') s++;
  if (*s != 0) return false;
  if (shift && n > (UINT64_MAX >> shift)) return false;
  *out = n << shift;
  return true;
}

/* Milliseconds: "250", "250ms", "2s". */
static bool parse_ms(const char* v, uint64_t* out) {
  uint64_t n;
  const char* s = parse_digits(v, &n);
  if (s == NULL) return false;
  if (eq(s, "") || eq(s, "ms")) return *out = n, true;
  if (eq(s, "s") && n <= UINT64_MAX / 1000) return *out = n * 1000, true;
  return false;
}

static bool parse_bool(const char* v, bool* out) {
  if (eq(v, "1") || eq(v, "on") || eq(v, "yes") || eq(v, "true")) return *out = true, true;
  if (eq(v, "0") || eq(v, "off") || eq(v, "no") || eq(v, "false")) return *out = false, true;
  return false;
}

/* One of o's names; "default" is THP's first, and a boolean switches KEEL_MESH. */
static bool parse_enum(const opt_t* o, const char* v, int* out) {
  for (int i = 0; o->names[i] != NULL; i++)
    if (eq(v, o->names[i])) return *out = i, true;
  bool b;
  if (o->names == THP_NAMES && eq(v, "default")) return *out = KEEL_THP_SYSTEM, true;
  if (o->names == MESH_NAMES && parse_bool(v, &b)) return *out = b ? KEEL_MESH_ON : KEEL_MESH_OFF, true;
  return false;
}

/* The parsed form of any option's value. */
typedef struct {
  uint64_t u;
  bool b;
  int e;
  const char* s;
} opt_value_t;

static bool parse(const opt_t* o, const char* v, opt_value_t* out) {
  switch (o->kind) {
    case K_MS: return parse_ms(v, &out->u);
    case K_SIZE: return parse_size(v, &out->u);
    case K_BOOL: return parse_bool(v, &out->b);
    case K_ENUM: return parse_enum(o, v, &out->e);
    case K_PATH:
      out->s = v;
      return v[0] != 0 && strlen(v) < sizeof _keel_options.profile_prefix;
  }
  return false;
}

/* Relaxed atomic stores: other threads read these fields while they change (the rule
 * is keel_opt's, options.h). */
static void store(const opt_t* o, const opt_value_t* v) {
  switch (o->kind) {
    case K_MS:
    case K_SIZE: __atomic_store_n((uint64_t*)o->field, v->u, __ATOMIC_RELAXED); break;
    case K_BOOL: __atomic_store_n((bool*)o->field, v->b, __ATOMIC_RELAXED); break;
    case K_ENUM: __atomic_store_n((int*)o->field, v->e, __ATOMIC_RELAXED); break;
    case K_PATH: {
      char* dst = (char*)o->field;
      size_t n = strlen(v->s);
      for (size_t i = 0; i <= n; i++) __atomic_store_n(&dst[i], v->s[i], __ATOMIC_RELAXED);
      break;
    }
  }
}

/* A K_PATH option's value, copied (keel_opt_str). */
static void path_of(const opt_t* o, char* out, size_t cap) {
  keel_opt_str_copy(out, cap, (const char*)o->field, sizeof _keel_options.profile_prefix);
}

static const opt_t* find(const char* name, size_t len) {
  for (size_t i = 0; i < NOPTS; i++)
    if (strlen(OPTS[i].name) == len && memcmp(OPTS[i].name, name, len) == 0) return &OPTS[i];
  return NULL;
}

KEEL_COLD static void warn_bad(const char* where, const opt_t* o) {
  char msg[160];
  keel_buf_t b = {msg, 0, sizeof msg};
  _keel_buf_str(&b, "ignoring bad value (want ");
  if (o->kind == K_ENUM) {
    for (int i = 0; o->names[i] != NULL; i++) {
      if (i) _keel_buf_str(&b, o->names[i + 1] ? ", " : " or ");
      _keel_buf_str(&b, o->names[i]);
    }
  } else {
    _keel_buf_str(&b, KIND_HINT[o->kind]);
  }
  _keel_buf_str(&b, ") of ");
  _keel_buf_str(&b, where);
  _keel_warn(msg, o->name);
}

/* keel_conf: "name:value,name:value" ('=' also separates a name from its value). */
static void read_conf(const char* conf) {
  const char* p = conf;
  while (*p) {
    const char* end = p;
    while (*end && *end != ',') end++;
    const char* sep = p;
    while (sep < end && *sep != ':' && *sep != '=') sep++;
    char value[sizeof _keel_options.profile_prefix];
    const opt_t* o = find(p, (size_t)(sep - p));
    if (sep == end || o == NULL) {
      char name[64];
      size_t n = (size_t)(sep - p) < sizeof name - 1 ? (size_t)(sep - p) : sizeof name - 1;
      memcpy(name, p, n);
      name[n] = 0;
      if (n > 0) _keel_warn("keel_conf: ignoring an unknown option (keel options lists them): ", name);
    } else if ((size_t)(end - sep - 1) >= sizeof value) {
      warn_bad("keel_conf option ", o);
    } else {
      memcpy(value, sep + 1, (size_t)(end - sep - 1));
      value[end - sep - 1] = 0;
      opt_value_t v;
      if (parse(o, value, &v)) store(o, &v);
      else warn_bad("keel_conf option ", o);
    }
    p = *end ? end + 1 : end;
  }
}

#define TEXT_OF(x) #x
#define TEXT_OF_VALUE(x) TEXT_OF(x)
#define VALUE_MAX_TEXT TEXT_OF_VALUE(KEEL_OPTION_VALUE_MAX)

static void read_env(const opt_t* o) {
  char var[48] = "KEEL_";
  size_t n = 5;
  for (const char* s = o->name; *s && n + 1 < sizeof var; s++)
    var[n++] = (char)(*s >= 'a' && *s <= 'z' ? *s - 'a' + 'A' : *s);
  var[n] = 0;
  char value[sizeof _keel_options.profile_prefix];
  long len = _keel_prim_getenv(var, value, sizeof value);
  if (len < 0) return;
  if ((size_t)len >= sizeof value) { /* cut short, it would name another value */
    _keel_warn("ignoring a value longer than " VALUE_MAX_TEXT " bytes of ", var);
    return;
  }
  opt_value_t v;
  if (parse(o, value, &v)) store(o, &v);
  else warn_bad("", &(opt_t){var, o->kind, o->when, o->field, o->names});
}

void _keel_options_init(void) {
  if (&keel_conf != NULL && keel_conf != NULL) read_conf(keel_conf);
  for (size_t i = 0; i < NOPTS; i++) read_env(&OPTS[i]);
}

/* ---- run-time API --------------------------------------------------------------------- */

static bool same_value(const opt_t* o, const opt_value_t* v) {
  char path[sizeof _keel_options.profile_prefix];
  switch (o->kind) {
    case K_MS:
    case K_SIZE: return __atomic_load_n((uint64_t*)o->field, __ATOMIC_RELAXED) == v->u;
    case K_BOOL: return __atomic_load_n((bool*)o->field, __ATOMIC_RELAXED) == v->b;
    case K_ENUM: return __atomic_load_n((int*)o->field, __ATOMIC_RELAXED) == v->e;
    case K_PATH: path_of(o, path, sizeof path); return eq(path, v->s);
  }
  return false;
}

KEEL_API KEEL_COLD int keel_option_set(const char* name, const char* value) {
  keel_ensure_init();
  if (name == NULL || value == NULL) return EINVAL;
  const opt_t* o = find(name, strlen(name));
  if (o == NULL) return ENOENT;
  opt_value_t v;
  if (!parse(o, value, &v)) return EINVAL;
  if (same_value(o, &v)) return 0;
  /* Checked mode changes the layout of every block, the page size is built into the
   * size classes, and a profile must see every allocation from the start. */
  if (o->when == AT_START) return EBUSY;
  if (o->when == AT_START_ON && (v.u == 0 || __atomic_load_n((uint64_t*)o->field, __ATOMIC_RELAXED) == 0))
    return EBUSY;
  store(o, &v);
  if (o->field == &_keel_options.thp) _keel_thp_apply_all();
  /* Switched off: the caches exited threads kept for the purger go back now. */
  if (o->field == &_keel_options.background_purge) {
    if (v.b) _keel_background_start();
    else _keel_tcache_release_spares(0);
  }
  if (o->field == &_keel_options.publish) _keel_publish_option_changed();
  return 0;
}

KEEL_API KEEL_COLD int keel_option_get(const char* name, char* buf, size_t size) {
  if (name == NULL) return EINVAL;
  const opt_t* o = find(name, strlen(name));
  if (o == NULL) return ENOENT;
  char text[sizeof _keel_options.profile_prefix];
  keel_buf_t b = {text, 0, sizeof text};
  switch (o->kind) {
    case K_MS:
    case K_SIZE: _keel_buf_u64(&b, __atomic_load_n((uint64_t*)o->field, __ATOMIC_RELAXED)); break;
    case K_BOOL: _keel_buf_str(&b, __atomic_load_n((bool*)o->field, __ATOMIC_RELAXED) ? "1" : "0"); break;
    case K_ENUM: _keel_buf_str(&b, o->names[__atomic_load_n((int*)o->field, __ATOMIC_RELAXED)]); break;
    case K_PATH: path_of(o, text, sizeof text); b.len = strlen(text); break;
  }
  if (buf == NULL || size <= b.len) return ERANGE;
  memcpy(buf, text, b.len + 1);
  return 0;
}
