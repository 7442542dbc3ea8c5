/* publish.h -- publishing statistics to `keel stats PID` (publish.c). */
#ifndef KEEL_PUBLISH_H
#define KEEL_PUBLISH_H

#include "core/base.h"

/* ---- publishing (publish.c) --------------------------------------------------------- */
void _keel_publish_init(void) KEEL_INTERNAL;
void _keel_publish_after_fork_child(void) KEEL_INTERNAL;
void _keel_publish_exit(void) KEEL_INTERNAL;
void _keel_publish_tick(void) KEEL_INTERNAL;

#endif /* KEEL_PUBLISH_H */
