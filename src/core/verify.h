/* verify.h -- the invariant walk (verify.c). */
#ifndef KEEL_VERIFY_H
#define KEEL_VERIFY_H

#include "core/base.h"

/* ---- invariants (verify.c) ----------------------------------------------------------
 * Walks every structure and aborts on the first inconsistency. Expensive: tests, and
 * KEEL_DEBUG >= 2 builds (which run it every KEEL_VERIFY_EVERY slow-path calls). */
void _keel_verify(void) KEEL_INTERNAL;
#define KEEL_VERIFY_EVERY 4096

#endif /* KEEL_VERIFY_H */
