/* options.c -- Keel's settings, read once from the environment (KEEL_<NAME>) without
 * allocating. Sizes take K/M/G suffixes; booleans take 1/0, on/off, yes/no, true/false.
 * A bad value gets one warning line and the default. */
#include "core/internal.h"

keel_options_t _keel_options = {
    .purge_delay_ms = 1000,
    .tcache_bytes = 1u << 20,
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
};

static bool eq(const char* a, const char* b) { return strcmp(a, b) == 0; }

static bool parse_bool(const char* v, bool* out) {
  if (eq(v, "1") || eq(v, "on") || eq(v, "yes") || eq(v, "true")) return *out = true, true;
  if (eq(v, "0") || eq(v, "off") || eq(v, "no") || eq(v, "false")) return *out = false, true;
  return false;
}

/* Decimal number with an optional K/M/G (binary) suffix and optional trailing B/iB. */
static bool parse_size(const char* v, uint64_t* out) {
  uint64_t n = 0;
  const char* s = v;
  if (*s < '0' || *s > '9') return false;
  for (; *s >= '0' && *s <= '9'; s++) {
    if (n > (UINT64_MAX - 9) / 10) return false;
    n = n * 10 + (uint64_t)(*s - '0');
  }
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

static void read_size(const char* name, uint64_t* field) {
  char v[64];
  if (!_keel_prim_getenv(name, v, sizeof v)) return;
  if (!parse_size(v, field)) _keel_warn("ignoring bad value (want a size like 512K, 4M) of ", name);
}

static void read_bool(const char* name, bool* field) {
  char v[64];
  if (!_keel_prim_getenv(name, v, sizeof v)) return;
  if (!parse_bool(v, field)) _keel_warn("ignoring bad value (want 1/0, on/off) of ", name);
}

void _keel_options_init(void) {
  read_size("KEEL_PURGE_DELAY", &_keel_options.purge_delay_ms); /* milliseconds */
  read_size("KEEL_TCACHE_MAX", &_keel_options.tcache_bytes);
  read_size("KEEL_HUGE_PAGE_SIZE", &_keel_options.huge_page_size);
  read_bool("KEEL_STATS", &_keel_options.stats_at_exit);
  read_bool("KEEL_BACKGROUND_PURGE", &_keel_options.background_purge);
  read_bool("KEEL_CHECK", &_keel_options.check);
  read_bool("KEEL_PUBLISH", &_keel_options.publish);
  read_size("KEEL_PROFILE_RATE", &_keel_options.profile_rate);
  read_size("KEEL_PROFILE_GROWTH", &_keel_options.profile_growth);
  read_bool("KEEL_PROFILE_AT_EXIT", &_keel_options.profile_at_exit);
  read_bool("KEEL_PROFILE_LEAKS", &_keel_options.profile_leaks);
  char prefix[sizeof _keel_options.profile_prefix];
  if (_keel_prim_getenv("KEEL_PROFILE_PREFIX", prefix, sizeof prefix) && prefix[0])
    memcpy(_keel_options.profile_prefix, prefix, sizeof prefix);
}
