/* tree -- a compiler-like pass over many small ASTs.
 *
 * For each "function" the program parses (generates) a random AST of mixed node types
 * (16-48 byte nodes, identifier strings, argument arrays, statement lists that grow
 * with realloc), then runs two transformation passes that each copy the tree with
 * changes (constant folding, renaming, dead-branch removal; then lowering of unary
 * operators and flattening of nested blocks), freeing the previous version after each
 * pass, and finally emits the code as text into a realloc-grown buffer. The last 400
 * functions (tree and text) stay alive, as in a module being compiled, so allocations
 * of different ages interleave.
 * Checksum: hash of the emitted text of every function and of node counts.
 * Usage: tree [scale]
 */
#include "bench.h"

enum kind { K_NUM, K_VAR, K_BIN, K_UN, K_CALL, K_BLOCK, K_IF, K_LET };
enum { OP_ADD, OP_SUB, OP_MUL, OP_AND, OP_OR, OP_XOR, OP_SHL, OP_LT, NOPS };
enum { UN_NEG, UN_NOT };

typedef struct node {
  uint8_t kind;
} node;
typedef struct {
  uint8_t kind;
  int64_t v;
} num_n; /* 16 B */
typedef struct {
  uint8_t kind;
  uint16_t len;
  char* name;
} var_n; /* 16 B + name */
typedef struct {
  uint8_t kind, op;
  node *l, *r;
} bin_n; /* 24 B */
typedef struct {
  uint8_t kind, op;
  node* x;
} un_n; /* 16 B */
typedef struct {
  uint8_t kind;
  uint16_t nargs;
  char* fn;
  node** args;
} call_n; /* 24 B + name + args */
typedef struct {
  uint8_t kind;
  uint32_t n, cap;
  node** stmts;
} block_n; /* 24 B + stmts */
typedef struct {
  uint8_t kind;
  node *cond, *then, *els;
} if_n; /* 32 B */
typedef struct {
  uint8_t kind;
  uint32_t line;
  char* name;
  node* init;
  uint64_t type_info[2];
} let_n; /* 40 B + name */

static rng_t rng;

static char* str_dup(const char* s, size_t n) {
  char* d = xmalloc(n + 1);
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

static node* mk_num(int64_t v) {
  num_n* n = xmalloc(sizeof *n);
  n->kind = K_NUM;
  n->v = v;
  return (node*)n;
}
static node* mk_var(const char* s, size_t len) {
  var_n* n = xmalloc(sizeof *n);
  n->kind = K_VAR;
  n->len = (uint16_t)len;
  n->name = str_dup(s, len);
  return (node*)n;
}
static node* mk_bin(int op, node* l, node* r) {
  bin_n* n = xmalloc(sizeof *n);
  n->kind = K_BIN;
  n->op = (uint8_t)op;
  n->l = l;
  n->r = r;
  return (node*)n;
}
static node* mk_un(int op, node* x) {
  un_n* n = xmalloc(sizeof *n);
  n->kind = K_UN;
  n->op = (uint8_t)op;
  n->x = x;
  return (node*)n;
}
static block_n* mk_block(void) {
  block_n* b = xmalloc(sizeof *b);
  b->kind = K_BLOCK;
  b->n = b->cap = 0;
  b->stmts = NULL;
  return b;
}
static void block_push(block_n* b, node* s) {
  if (b->n == b->cap) {
    b->cap = b->cap ? 2 * b->cap : 2;
    b->stmts = xrealloc(b->stmts, b->cap * sizeof(node*));
  }
  b->stmts[b->n++] = s;
}

static void free_tree(node* t) {
  if (!t) return;
  switch (t->kind) {
    case K_NUM: break;
    case K_VAR: free(((var_n*)t)->name); break;
    case K_BIN:
      free_tree(((bin_n*)t)->l);
      free_tree(((bin_n*)t)->r);
      break;
    case K_UN: free_tree(((un_n*)t)->x); break;
    case K_CALL: {
      call_n* c = (call_n*)t;
      for (int i = 0; i < c->nargs; i++) free_tree(c->args[i]);
      free(c->args);
      free(c->fn);
      break;
    }
    case K_BLOCK: {
      block_n* b = (block_n*)t;
      for (uint32_t i = 0; i < b->n; i++) free_tree(b->stmts[i]);
      free(b->stmts);
      break;
    }
    case K_IF:
      free_tree(((if_n*)t)->cond);
      free_tree(((if_n*)t)->then);
      free_tree(((if_n*)t)->els);
      break;
    case K_LET:
      free(((let_n*)t)->name);
      free_tree(((let_n*)t)->init);
      break;
    default: bench_die("bad node kind %d", t->kind);
  }
  free(t);
}

/* ---- "parser": random generation ---- */

static char names[32][24];
static size_t name_len[32];

static void gen_names(void) {
  for (int i = 0; i < 32; i++) {
    size_t len = rng_range(&rng, 1, 14);
    for (size_t k = 0; k < len; k++) names[i][k] = (char)('a' + rng_below(&rng, 26));
    name_len[i] = len;
  }
}

static node* gen_expr(int depth) {
  uint32_t r = rng_below(&rng, 100);
  if (depth == 0 || r < 25) {
    if (rng_pct(&rng, 45)) return mk_num((int64_t)rng_below(&rng, 1000));
    int k = (int)rng_below(&rng, 32);
    return mk_var(names[k], name_len[k]);
  }
  if (r < 70) {
    node* l = gen_expr(depth - 1);
    return mk_bin((int)rng_below(&rng, NOPS), l, gen_expr(depth - 1));
  }
  if (r < 82) return mk_un((int)rng_below(&rng, 2), gen_expr(depth - 1));
  call_n* c = xmalloc(sizeof *c);
  c->kind = K_CALL;
  c->nargs = (uint16_t)rng_below(&rng, 5);
  int k = (int)rng_below(&rng, 32);
  c->fn = str_dup(names[k], name_len[k]);
  c->args = c->nargs ? xmalloc(c->nargs * sizeof(node*)) : NULL;
  for (int i = 0; i < c->nargs; i++) c->args[i] = gen_expr(depth - 2 > 0 ? depth - 2 : 0);
  return (node*)c;
}

static node* gen_block(int depth, uint32_t nstmts);

static node* gen_stmt(int depth) {
  uint32_t r = rng_below(&rng, 100);
  if (r < 40) {
    let_n* l = xmalloc(sizeof *l);
    l->kind = K_LET;
    int k = (int)rng_below(&rng, 32);
    l->name = str_dup(names[k], name_len[k]);
    l->line = rng_below(&rng, 100000);
    l->type_info[0] = l->type_info[1] = 0;
    l->init = gen_expr(4);
    return (node*)l;
  }
  if (r < 60 && depth > 0) {
    if_n* f = xmalloc(sizeof *f);
    f->kind = K_IF;
    f->cond = gen_expr(2);
    f->then = gen_block(depth - 1, rng_range(&rng, 1, 6));
    f->els = rng_pct(&rng, 50) ? gen_block(depth - 1, rng_range(&rng, 1, 4)) : NULL;
    return (node*)f;
  }
  if (r < 68 && depth > 0) return gen_block(depth - 1, rng_range(&rng, 1, 5));
  return gen_expr(3);
}

static node* gen_block(int depth, uint32_t nstmts) {
  block_n* b = mk_block();
  for (uint32_t i = 0; i < nstmts; i++) block_push(b, gen_stmt(depth));
  return (node*)b;
}

/* ---- pass 1: constant folding, renaming, dead-branch removal (copying) ---- */

static int64_t eval_op(int op, int64_t a, int64_t b) {
  uint64_t x = (uint64_t)a, y = (uint64_t)b;
  switch (op) {
    case OP_ADD: return (int64_t)(x + y);
    case OP_SUB: return (int64_t)(x - y);
    case OP_MUL: return (int64_t)(x * y);
    case OP_AND: return (int64_t)(x & y);
    case OP_OR: return (int64_t)(x | y);
    case OP_XOR: return (int64_t)(x ^ y);
    case OP_SHL: return (int64_t)(x << (y & 63));
    default: return a < b;
  }
}

static node* rename_var(const char* name, size_t len, int pass) {
  char buf[64];
  if (len > 40) len = 40;
  memcpy(buf, name, len);
  int extra = snprintf(buf + len, sizeof buf - len, "_%d", pass);
  return mk_var(buf, len + (size_t)extra);
}

static node* fold(const node* t) {
  if (!t) return NULL;
  switch (t->kind) {
    case K_NUM: return mk_num(((const num_n*)t)->v);
    case K_VAR: return rename_var(((const var_n*)t)->name, ((const var_n*)t)->len, 1);
    case K_BIN: {
      const bin_n* b = (const bin_n*)t;
      node* l = fold(b->l);
      node* r = fold(b->r);
      if (l->kind == K_NUM && r->kind == K_NUM) {
        int64_t v = eval_op(b->op, ((num_n*)l)->v, ((num_n*)r)->v);
        free(l);
        free(r);
        return mk_num(v);
      }
      return mk_bin(b->op, l, r);
    }
    case K_UN: {
      const un_n* u = (const un_n*)t;
      node* x = fold(u->x);
      if (x->kind == K_NUM) {
        int64_t v = ((num_n*)x)->v;
        ((num_n*)x)->v = u->op == UN_NEG ? (int64_t)(0 - (uint64_t)v) : !v;
        return x;
      }
      return mk_un(u->op, x);
    }
    case K_CALL: {
      const call_n* c = (const call_n*)t;
      call_n* d = xmalloc(sizeof *d);
      d->kind = K_CALL;
      d->nargs = c->nargs;
      d->fn = str_dup(c->fn, strlen(c->fn));
      d->args = c->nargs ? xmalloc(c->nargs * sizeof(node*)) : NULL;
      for (int i = 0; i < c->nargs; i++) d->args[i] = fold(c->args[i]);
      return (node*)d;
    }
    case K_BLOCK: {
      const block_n* b = (const block_n*)t;
      block_n* d = mk_block();
      for (uint32_t i = 0; i < b->n; i++) {
        node* s = fold(b->stmts[i]);
        if (s && s->kind == K_NUM) { /* expression statement without effect */
          free(s);
          continue;
        }
        if (s) block_push(d, s);
      }
      return (node*)d;
    }
    case K_IF: {
      const if_n* f = (const if_n*)t;
      node* c = fold(f->cond);
      if (c->kind == K_NUM) {
        int taken = ((num_n*)c)->v != 0;
        free(c);
        if (taken) return fold(f->then);
        return f->els ? fold(f->els) : (node*)mk_block();
      }
      if_n* d = xmalloc(sizeof *d);
      d->kind = K_IF;
      d->cond = c;
      d->then = fold(f->then);
      d->els = fold(f->els);
      return (node*)d;
    }
    case K_LET: {
      const let_n* l = (const let_n*)t;
      let_n* d = xmalloc(sizeof *d);
      *d = *l;
      size_t len = strlen(l->name);
      char buf[64];
      memcpy(buf, l->name, len);
      memcpy(buf + len, "_1", 3);
      d->name = str_dup(buf, len + 2);
      d->init = fold(l->init);
      d->type_info[0] = d->init->kind;
      return (node*)d;
    }
  }
  bench_die("bad node kind %d", t->kind);
}

/* ---- pass 2: lowering (copying): -x => 0-x, !x => x<1, nested blocks flattened ---- */

static node* lower(const node* t);

static void lower_into(block_n* d, const node* s) {
  if (s->kind == K_BLOCK) {
    const block_n* b = (const block_n*)s;
    for (uint32_t i = 0; i < b->n; i++) lower_into(d, b->stmts[i]);
  } else {
    block_push(d, lower(s));
  }
}

static node* lower(const node* t) {
  if (!t) return NULL;
  switch (t->kind) {
    case K_NUM: return mk_num(((const num_n*)t)->v);
    case K_VAR: return mk_var(((const var_n*)t)->name, ((const var_n*)t)->len);
    case K_BIN: {
      const bin_n* b = (const bin_n*)t;
      node* l = lower(b->l);
      return mk_bin(b->op, l, lower(b->r));
    }
    case K_UN: {
      const un_n* u = (const un_n*)t;
      if (u->op == UN_NEG) return mk_bin(OP_SUB, mk_num(0), lower(u->x));
      return mk_bin(OP_LT, lower(u->x), mk_num(1));
    }
    case K_CALL: {
      const call_n* c = (const call_n*)t;
      call_n* d = xmalloc(sizeof *d);
      *d = *c;
      d->fn = str_dup(c->fn, strlen(c->fn));
      d->args = c->nargs ? xmalloc(c->nargs * sizeof(node*)) : NULL;
      for (int i = 0; i < c->nargs; i++) d->args[i] = lower(c->args[i]);
      return (node*)d;
    }
    case K_BLOCK: {
      block_n* d = mk_block();
      lower_into(d, t);
      return (node*)d;
    }
    case K_IF: {
      const if_n* f = (const if_n*)t;
      if_n* d = xmalloc(sizeof *d);
      d->kind = K_IF;
      d->cond = lower(f->cond);
      d->then = lower(f->then);
      d->els = lower(f->els);
      return (node*)d;
    }
    case K_LET: {
      const let_n* l = (const let_n*)t;
      let_n* d = xmalloc(sizeof *d);
      *d = *l;
      d->name = str_dup(l->name, strlen(l->name));
      d->init = lower(l->init);
      return (node*)d;
    }
  }
  bench_die("bad node kind %d", t->kind);
}

/* ---- emission into a growing string ---- */

typedef struct {
  char* s;
  size_t n, cap;
} sbuf;

static void sb_put(sbuf* b, const char* s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    while (b->n + n + 1 > b->cap) b->cap = b->cap ? b->cap * 2 : 64;
    b->s = xrealloc(b->s, b->cap);
  }
  memcpy(b->s + b->n, s, n);
  b->n += n;
  b->s[b->n] = 0;
}
static void sb_str(sbuf* b, const char* s) { sb_put(b, s, strlen(s)); }

static uint64_t emit(sbuf* b, const node* t, int indent) {
  static const char* ops[] = {"+", "-", "*", "&", "|", "^", "<<", "<"};
  char tmp[32];
  uint64_t count = 1;
  switch (t->kind) {
    case K_NUM: sb_put(b, tmp, (size_t)snprintf(tmp, sizeof tmp, "%" PRId64, ((const num_n*)t)->v)); break;
    case K_VAR: sb_put(b, ((const var_n*)t)->name, ((const var_n*)t)->len); break;
    case K_BIN:
      sb_str(b, "(");
      count += emit(b, ((const bin_n*)t)->l, indent);
      sb_str(b, ops[((const bin_n*)t)->op]);
      count += emit(b, ((const bin_n*)t)->r, indent);
      sb_str(b, ")");
      break;
    case K_UN:
      sb_str(b, ((const un_n*)t)->op == UN_NEG ? "-" : "!");
      count += emit(b, ((const un_n*)t)->x, indent);
      break;
    case K_CALL: {
      const call_n* c = (const call_n*)t;
      sb_str(b, c->fn);
      sb_str(b, "(");
      for (int i = 0; i < c->nargs; i++) {
        if (i) sb_str(b, ", ");
        count += emit(b, c->args[i], indent);
      }
      sb_str(b, ")");
      break;
    }
    case K_BLOCK: {
      const block_n* bl = (const block_n*)t;
      sb_str(b, "{\n");
      for (uint32_t i = 0; i < bl->n; i++) {
        for (int k = 0; k <= indent; k++) sb_str(b, "  ");
        count += emit(b, bl->stmts[i], indent + 1);
        sb_str(b, ";\n");
      }
      for (int k = 0; k < indent; k++) sb_str(b, "  ");
      sb_str(b, "}");
      break;
    }
    case K_IF: {
      const if_n* f = (const if_n*)t;
      sb_str(b, "if ");
      count += emit(b, f->cond, indent);
      sb_str(b, " ");
      count += emit(b, f->then, indent);
      if (f->els) {
        sb_str(b, " else ");
        count += emit(b, f->els, indent);
      }
      break;
    }
    case K_LET:
      sb_str(b, "let ");
      sb_str(b, ((const let_n*)t)->name);
      sb_str(b, " = ");
      count += emit(b, ((const let_n*)t)->init, indent);
      break;
    default: bench_die("bad node kind %d", t->kind);
  }
  return count;
}

enum { LIVE = 400 };

int main(int argc, char** argv) {
  bench_init("tree", argc, argv, 0);
  uint64_t nfuncs = bench_scaled(3000, 1);
  rng_seed(&rng, 7);
  struct {
    node* tree;
    char* text;
  } live[LIVE] = {{0}};
  uint64_t ck = 0, nodes = 0;

  for (uint64_t f = 0; f < nfuncs; f++) {
    if (f % 64 == 0) gen_names(); /* a new "file" */
    node* ast = gen_block(3, rng_range(&rng, 8, 40));
    node* folded = fold(ast);
    free_tree(ast);
    node* lowered = lower(folded);
    free_tree(folded);
    sbuf sb = {0};
    nodes += emit(&sb, lowered, 0);
    ck = ck_step(ck, hash_bytes(sb.s, sb.n));
    sb.s = xrealloc(sb.s, sb.n + 1); /* shrink to fit, as a module's string table would */
    int slot = (int)(f % LIVE);
    free_tree(live[slot].tree);
    free(live[slot].text);
    live[slot].tree = lowered;
    live[slot].text = sb.s;
  }
  for (int i = 0; i < LIVE; i++) {
    if (live[i].text) ck = ck_step(ck, hash_bytes(live[i].text, strlen(live[i].text)));
    free_tree(live[i].tree);
    free(live[i].text);
  }
  ck = ck_step(ck, nodes);
  printf("tree functions=%" PRIu64 " nodes=%" PRIu64 " checksum=%016" PRIx64 "\n", nfuncs, nodes, ck);
  return 0;
}
