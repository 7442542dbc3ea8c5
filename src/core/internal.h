/* internal.h -- Keel's core data structures and the functions the core files share.
 * Read docs/design.md first: it explains the layers and how these structures fit.
 *
 *   address space:  chunk (4 MiB, aligned) = 64 units of 64 KiB; unit 0 is the header
 *   small blocks:   slab = 1..16 units holding blocks of one size class
 *   large blocks:   span of units holding one block (up to KEEL_LARGE_MAX)
 *   huge blocks:    their own mapping, described out of line (huge.c)
 *   lookup:         pagemap: one byte per unit = size class, or a KEEL_KIND_* tag
 *
 * An umbrella: the types, inlines and prototypes live in one header per concern in
 * src/core/, included below in dependency order, so a file that includes this one gets
 * them all. */
#ifndef KEEL_INTERNAL_H
#define KEEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/lock.h"
#include "keel.h"
#include "platform/prim.h"

#include "core/base.h"
#include "core/geometry.h"
#include "core/size_class.h"
#include "core/chunk.h"
#include "core/pageheap.h"
#include "core/lock_stats.h"
#include "core/pagemap.h"
#include "core/meta.h"
#include "core/transfer.h"
#include "core/central.h"
#include "core/mesh.h"
#include "core/large.h"
#include "core/tiers.h"
#include "core/checked.h"
#include "core/tcache.h"
#include "core/options.h"
#include "core/init.h"
#include "core/report.h"
#include "core/verify.h"
#include "core/profile.h"
#include "core/publish.h"
#include "core/stats.h"

/* The lists of free blocks and the bins' primitives (they need the types above). */
#include "core/freelist.h"

#endif /* KEEL_INTERNAL_H */
