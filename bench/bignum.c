/* bignum -- single-threaded arbitrary-precision arithmetic, GMP-style.
 *
 * Every operation allocates its result (a header plus a limb array) and the caller
 * frees the operands it no longer needs; Karatsuba multiplication allocates its
 * temporaries on the heap at every level of the recursion. Per round:
 *   - Fibonacci numbers by repeated addition (results grow to a few KiB);
 *   - a factorial by product tree (Karatsuba on the big products);
 *   - its conversion to decimal by repeated division by 10^9, into a string that
 *     grows with realloc;
 *   - many small factorials and powers (results of tens to hundreds of bytes).
 * Allocation sizes therefore range from 16 bytes to ~40 KiB, with short lifetimes.
 * Checksum: hash of every result's limbs and of the decimal strings.
 * Usage: bignum [scale]
 */
#include "bench.h"

typedef uint32_t limb_t;
typedef struct big {
  size_t n; /* limbs in use; n == 0 means zero; d[n-1] != 0 otherwise */
  limb_t d[];
} big;

enum { KARA_THRESHOLD = 32 };

static big* big_alloc(size_t n) {
  big* b = xmalloc(sizeof(big) + (n ? n : 1) * sizeof(limb_t));
  b->n = n;
  return b;
}
static void big_norm(big* b) {
  while (b->n && b->d[b->n - 1] == 0) b->n--;
}
static big* big_from(uint32_t v) {
  big* b = big_alloc(1);
  b->d[0] = v;
  big_norm(b);
  return b;
}
static uint64_t big_hash(const big* b) { return hash_bytes(b->d, b->n * sizeof(limb_t)) ^ b->n; }

static big* big_add(const big* a, const big* b) {
  if (a->n < b->n) {
    const big* t = a;
    a = b;
    b = t;
  }
  big* r = big_alloc(a->n + 1);
  uint64_t c = 0;
  size_t i = 0;
  for (; i < b->n; i++) {
    c += (uint64_t)a->d[i] + b->d[i];
    r->d[i] = (limb_t)c;
    c >>= 32;
  }
  for (; i < a->n; i++) {
    c += a->d[i];
    r->d[i] = (limb_t)c;
    c >>= 32;
  }
  r->d[i] = (limb_t)c;
  big_norm(r);
  return r;
}

static big* big_mul_small(const big* a, uint32_t m) {
  big* r = big_alloc(a->n + 1);
  uint64_t c = 0;
  for (size_t i = 0; i < a->n; i++) {
    c += (uint64_t)a->d[i] * m;
    r->d[i] = (limb_t)c;
    c >>= 32;
  }
  r->d[a->n] = (limb_t)c;
  big_norm(r);
  return r;
}

/* q = a / m, *rem = a % m */
static big* big_divmod_small(const big* a, uint32_t m, uint32_t* rem) {
  big* q = big_alloc(a->n);
  uint64_t r = 0;
  for (size_t i = a->n; i-- > 0;) {
    r = (r << 32) | a->d[i];
    q->d[i] = (limb_t)(r / m);
    r %= m;
  }
  *rem = (uint32_t)r;
  big_norm(q);
  return q;
}

/* ---- limb-array multiplication ---- */

/* r[0..an+bn) = a * b, schoolbook */
static void mul_base(limb_t* r, const limb_t* a, size_t an, const limb_t* b, size_t bn) {
  memset(r, 0, (an + bn) * sizeof(limb_t));
  for (size_t j = 0; j < bn; j++) {
    uint64_t c = 0, bj = b[j];
    if (bj == 0) continue;
    for (size_t i = 0; i < an; i++) {
      c += (uint64_t)a[i] * bj + r[i + j];
      r[i + j] = (limb_t)c;
      c >>= 32;
    }
    r[an + j] = (limb_t)c;
  }
}

/* r[off..rn) += x[0..xn); the carry must not run past rn and x's limbs past rn must be 0. */
static void add_into(limb_t* r, size_t rn, size_t off, const limb_t* x, size_t xn) {
  uint64_t c = 0;
  size_t i = 0;
  for (; i < xn && off + i < rn; i++) {
    c += (uint64_t)r[off + i] + x[i];
    r[off + i] = (limb_t)c;
    c >>= 32;
  }
  for (; i < xn; i++) BENCH_CHECK(x[i] == 0);
  for (size_t k = off + i; c && k < rn; k++) {
    c += r[k];
    r[k] = (limb_t)c;
    c >>= 32;
  }
  BENCH_CHECK(c == 0);
}

/* x[0..xn) -= y[0..yn), yn <= xn, no final borrow */
static void sub_into(limb_t* x, size_t xn, const limb_t* y, size_t yn) {
  int64_t br = 0;
  size_t i = 0;
  for (; i < yn; i++) {
    int64_t v = (int64_t)x[i] - y[i] + br;
    x[i] = (limb_t)v;
    br = v >> 32; /* 0 or -1 */
  }
  for (; br && i < xn; i++) {
    int64_t v = (int64_t)x[i] + br;
    x[i] = (limb_t)v;
    br = v >> 32;
  }
  BENCH_CHECK(br == 0);
}

/* s[0..max(an,bn)+1) = a + b */
static size_t add_limbs(limb_t* s, const limb_t* a, size_t an, const limb_t* b, size_t bn) {
  if (an < bn) {
    const limb_t* t = a;
    a = b;
    b = t;
    size_t tn = an;
    an = bn;
    bn = tn;
  }
  uint64_t c = 0;
  size_t i = 0;
  for (; i < bn; i++) {
    c += (uint64_t)a[i] + b[i];
    s[i] = (limb_t)c;
    c >>= 32;
  }
  for (; i < an; i++) {
    c += a[i];
    s[i] = (limb_t)c;
    c >>= 32;
  }
  s[an] = (limb_t)c;
  return an + 1;
}

/* r[0..an+bn) = a * b; temporaries come from malloc. */
static void mul_rec(limb_t* r, const limb_t* a, size_t an, const limb_t* b, size_t bn) {
  if (an < bn) {
    const limb_t* t = a;
    a = b;
    b = t;
    size_t tn = an;
    an = bn;
    bn = tn;
  }
  if (bn < KARA_THRESHOLD) {
    mul_base(r, a, an, b, bn);
    return;
  }
  if (an >= 2 * bn) {
    /* unbalanced: multiply bn-limb chunks of a by b and accumulate */
    memset(r, 0, (an + bn) * sizeof(limb_t));
    limb_t* t = xmalloc(2 * bn * sizeof(limb_t));
    for (size_t off = 0; off < an; off += bn) {
      size_t cl = an - off < bn ? an - off : bn;
      mul_rec(t, a + off, cl, b, bn);
      add_into(r, an + bn, off, t, cl + bn);
    }
    free(t);
    return;
  }
  /* Karatsuba, split at h: a = a1*B^h + a0, b = b1*B^h + b0 */
  size_t h = bn / 2;
  size_t a1n = an - h, b1n = bn - h;
  mul_rec(r, a, h, b, h);                        /* z0 -> r[0..2h) */
  mul_rec(r + 2 * h, a + h, a1n, b + h, b1n);    /* z2 -> r[2h..an+bn) */
  limb_t* sa = xmalloc((a1n + 1) * sizeof(limb_t));
  limb_t* sb = xmalloc((b1n + 1) * sizeof(limb_t));
  size_t san = add_limbs(sa, a, h, a + h, a1n);
  size_t sbn = add_limbs(sb, b, h, b + h, b1n);
  size_t zn = san + sbn;
  limb_t* z1 = xmalloc(zn * sizeof(limb_t));
  mul_rec(z1, sa, san, sb, sbn);
  free(sb);
  free(sa);
  sub_into(z1, zn, r, 2 * h);
  sub_into(z1, zn, r + 2 * h, an + bn - 2 * h);
  add_into(r, an + bn, h, z1, zn);
  free(z1);
}

static big* big_mul(const big* a, const big* b) {
  if (a->n == 0 || b->n == 0) return big_alloc(0);
  big* r = big_alloc(a->n + b->n);
  mul_rec(r->d, a->d, a->n, b->d, b->n);
  big_norm(r);
  return r;
}

/* ---- workloads ---- */

static big* fib(unsigned k, uint64_t* ck) {
  big* a = big_from(0);
  big* b = big_from(1);
  for (unsigned i = 0; i < k; i++) {
    big* c = big_add(a, b);
    free(a);
    a = b;
    b = c;
    if ((i & 1023) == 0) *ck = ck_step(*ck, big_hash(a));
  }
  free(b);
  return a;
}

/* product lo*(lo+1)*...*hi */
static big* prod_tree(uint32_t lo, uint32_t hi) {
  if (hi - lo < 16) {
    big* r = big_from(lo);
    for (uint32_t i = lo + 1; i <= hi; i++) {
      big* t = big_mul_small(r, i);
      free(r);
      r = t;
    }
    return r;
  }
  uint32_t mid = lo + (hi - lo) / 2;
  big* x = prod_tree(lo, mid);
  big* y = prod_tree(mid + 1, hi);
  big* r = big_mul(x, y);
  free(x);
  free(y);
  return r;
}

/* Decimal string of a, built back to front in 9-digit groups with realloc growth. */
static char* to_decimal(const big* a, size_t* len) {
  size_t cap = 16, n = 0;
  char* s = xmalloc(cap);
  big* cur = big_alloc(a->n);
  memcpy(cur->d, a->d, a->n * sizeof(limb_t));
  while (cur->n) {
    uint32_t rem;
    big* q = big_divmod_small(cur, 1000000000u, &rem);
    free(cur);
    cur = q;
    if (n + 9 > cap) {
      cap *= 2;
      s = xrealloc(s, cap);
    }
    for (int k = 0; k < 9; k++) {
      s[n++] = (char)('0' + rem % 10);
      rem /= 10;
    }
  }
  free(cur);
  while (n > 1 && s[n - 1] == '0') n--;
  if (n == 0) s[n++] = '0';
  for (size_t i = 0; i < n / 2; i++) {
    char t = s[i];
    s[i] = s[n - 1 - i];
    s[n - 1 - i] = t;
  }
  *len = n;
  return s;
}

int main(int argc, char** argv) {
  bench_init("bignum", argc, argv, 0);
  uint64_t rounds = bench_scaled(60, 1);
  rng_t rng;
  rng_seed(&rng, 42);
  uint64_t ck = 0;

  /* sanity: 25! and fib(100) */
  {
    big* f = prod_tree(1, 25);
    size_t n;
    char* s = to_decimal(f, &n);
    BENCH_CHECK(n == 26 && memcmp(s, "15511210043330985984000000", 26) == 0);
    free(s);
    free(f);
    uint64_t dummy = 0;
    f = fib(100, &dummy);
    s = to_decimal(f, &n);
    BENCH_CHECK(n == 21 && memcmp(s, "354224848179261915075", 21) == 0);
    free(s);
    free(f);
  }

  for (uint64_t r = 0; r < rounds; r++) {
    /* Fibonacci by addition: ~20k results of up to ~3.5 KiB */
    big* f = fib(12000 + rng_below(&rng, 8000), &ck);
    ck = ck_step(ck, big_hash(f));
    free(f);

    /* factorial by product tree, then its decimal expansion */
    uint32_t n = 2500 + rng_below(&rng, 2500);
    big* fact = prod_tree(1, n);
    ck = ck_step(ck, big_hash(fact));
    size_t len;
    char* dec = to_decimal(fact, &len);
    ck = ck_step(ck, hash_bytes(dec, len));
    free(dec);
    free(fact);

    /* many small numbers: k^e by repeated multiplication, small factorials */
    for (int i = 0; i < 1500; i++) {
      uint32_t base = rng_range(&rng, 2, 1000), e = rng_range(&rng, 2, 120);
      big* p = big_from(base);
      big* acc = big_from(1);
      for (uint32_t k = e; k; k >>= 1) { /* square-and-multiply */
        if (k & 1) {
          big* t = big_mul(acc, p);
          free(acc);
          acc = t;
        }
        big* t = big_mul(p, p);
        free(p);
        p = t;
      }
      free(p);
      big* sf = prod_tree(1, rng_range(&rng, 10, 200));
      big* sum = big_add(acc, sf);
      ck = ck_step(ck, big_hash(sum));
      if ((i & 15) == 0) {
        char* d = to_decimal(sum, &len);
        ck = ck_step(ck, hash_bytes(d, len));
        free(d);
      }
      free(sum);
      free(sf);
      free(acc);
    }
  }
  printf("bignum rounds=%" PRIu64 " checksum=%016" PRIx64 "\n", rounds, ck);
  return 0;
}
