/* mesh.h -- meshing (mesh.c, mesh_estimate.c): the calls the purger and the central lists
 * make. */
#ifndef KEEL_MESH_H
#define KEEL_MESH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base.h"

/* ---- meshing (mesh.c, mesh_estimate.c; docs/meshing.md) --------------------------------
 * Pages of two slabs of a class whose blocks in use sit at different offsets share one
 * physical page: both become private views of one page of a memory file. */
#define KEEL_MESH_MAX_BLOCK 2048u           /* larger blocks: a page touches at most two */
#define KEEL_MESH_MAX_PAGE ((size_t)16 << 10) /* larger OS pages: too few blocks a page */
#define KEEL_MESH_WAYS 8u /* pages that may share one physical page */
/* Called for each group the matcher proposes: 2..KEEL_MESH_WAYS page addresses of the
 * same index in slabs of class cls. Returns false to stop planning. */
typedef bool (*keel_mesh_visit_t)(void* ctx, unsigned cls, const uintptr_t* pages, unsigned n);
/* Runs the candidate search and the matcher on class cls's partly used slabs (their
 * bitmaps copied under the class lock, matched unlocked) and calls visit per group; the
 * slab the class refills from is left out. Returns false if scratch memory ran out. */
bool _keel_mesh_plan(unsigned cls, keel_mesh_visit_t visit, void* ctx) KEEL_INTERNAL;
/* Whether page p may mesh: not a view, or a view written since it was meshed. */
bool _keel_mesh_page_meshable(uintptr_t p) KEEL_INTERNAL;
/* Class lock held: the views among the pages of [addr, addr + len) are replaced by fresh
 * memory (their blocks are all free). Returns false if one could not be (it stays a
 * view: the caller must then keep the memory it is in). The central lists reach it as
 * _keel_central_unmesh. */
bool _keel_mesh_leave(void* addr, size_t len) KEEL_INTERNAL;
void _keel_mesh_tick(void) KEEL_INTERNAL; /* the purger's meshing pass */
void _keel_mesh_lock_all(void) KEEL_INTERNAL;   /* fork: before the central locks */
void _keel_mesh_unlock_all(void) KEEL_INTERNAL;
void _keel_mesh_table_lock(void) KEEL_INTERNAL; /* fork: the innermost lock */
void _keel_mesh_table_unlock(void) KEEL_INTERNAL;
void _keel_mesh_after_fork_child(void) KEEL_INTERNAL;
void _keel_mesh_verify(void) KEEL_INTERNAL; /* central locks held */

#endif /* KEEL_MESH_H */
