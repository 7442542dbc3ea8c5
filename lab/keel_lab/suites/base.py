"""The contract every benchmark suite follows.

A suite runs one workload once under one allocator and returns plain JSON-able data.
The bench driver (keel_lab.bench) decides the order (allocators alternate within each
round), repeats rounds, collects every run and writes results JSON; reports are
rendered from that JSON only.

A run's result (every key optional except "metrics"):
    {
      "metrics": {"throughput": 1234.5,            # ops/s or TPS (higher is better)
                  "mean_ms": .., "p50_ms": .., "p95_ms": .., "p99_ms": ..,
                  "rss_peak_kib": .., "rss_final_kib": .., ...suite-specific...},
      "series":  {"rss_kib": [[t_seconds, kib], ...]},       # sampled over time
      "points":  [{"x": 16, "throughput": .., "p95_ms": .., "rss_kib": ..}, ...],  # sweeps
      "x_label": "threads",                                   # what "x" is in points
      "phases":  [{"phase": "fill", "rss_kib": .., "used_memory_kib": .., "frag": ..}, ...],
      "notes":   ["free text shown in the report"],
    }
Suites raise SuiteError with a message an operator can act on (missing binary, port in
use, server died); they must stop every process they started, also on exceptions and
KeyboardInterrupt (use try/finally and keel_lab.servers helpers).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..allocators import Allocator
from ..measure import memory_held_kib, mesh_views, pss_kib


class SuiteError(RuntimeError):
    """A failure with a message meant for the operator."""


def cpu_us_per_txn(before: Optional[float], after: Optional[float], tps: Optional[float],
                   secs: float) -> Optional[float]:
    """Server CPU microseconds per transaction over one point: the server's own cost,
    which does not count time the server spent waiting for a client that was not
    scheduled (on a 2-core machine running both, TPS does). Compare it beside TPS."""
    if before is None or after is None or not tps:
        return None
    return round((after - before) / (tps * secs) * 1e6, 1)


def mesh_estimate_metrics(pid: int, rss_kib: int, suffix: str) -> dict:
    """Under Keel, what meshing (docs/meshing.md) could give back in a running server,
    from its live slab bitmaps (keel stats --mesh): the RSS given less the pages pairs /
    groups of up to 8 would free, the views each needs, and the kernel mappings pairs
    need when a slab keeps its partner over consecutive pages. Empty for other
    allocators (they publish nothing) or a Keel without the estimate."""
    from .. import live
    if not live.shm_path(pid).exists():
        return {}
    try:
        rows = live.mesh_estimate(pid)
        page = live.read(pid).stats["os_page_size"]
    except live.LiveError:
        return {}
    tot = live.mesh_totals(rows, page)
    return {f"mesh_est_pairs_rss_kib_{suffix}": rss_kib - tot["pair_saved_bytes"] // 1024,
            f"mesh_est_pairs_views_{suffix}": tot["pair_views"],
            f"mesh_est_pairs_mappings_{suffix}": tot["pair_runs"],
            f"mesh_est_groups_rss_kib_{suffix}": rss_kib - tot["group_saved_bytes"] // 1024,
            f"mesh_est_groups_views_{suffix}": tot["group_views"]}


HELD_NOTE = ("held_*_kib is the memory the server holds with Keel's meshed pages counted "
             "once: RssAnon + RssFile + RssShmem, with the keel-mesh views' part of RssShmem "
             "replaced by the bytes resident in Keel's mesh memfd; without meshing it is "
             "VmRSS. Compare held_*_kib, not rss_*_kib, when an allocator meshes "
             "(keel+mesh): VmRSS counts a meshed page once for every view that touched it "
             "since it was meshed (so it does not fall when meshing gives memory back) and "
             "not at all while none has, and Pss (pss_*_kib) misses those unread views too. "
             "mesh_views_*: mappings of the mesh memfd.")


def held_metrics(pid: int, phase: str, suffix: str) -> dict:
    """held_<phase>_kib_<suffix> (measure.memory_held_kib), pss_<phase>_kib_<suffix> and,
    when the process has meshed pages, mesh_views_<phase>_<suffix>: named like the
    suites' rss_<phase>_kib_<suffix>. Readings that failed (process gone) are left out."""
    out = {f"held_{phase}_kib_{suffix}": memory_held_kib(pid),
           f"pss_{phase}_kib_{suffix}": pss_kib(pid)}
    views = mesh_views(pid)
    if views:
        out[f"mesh_views_{phase}_{suffix}"] = views
    return {k: v for k, v in out.items() if v is not None}


def _no_progress(message: str, fraction: Optional[float] = None) -> None:
    pass


@dataclass
class SuiteContext:
    allocator: Allocator
    quick: bool
    workdir: Path                       # throw-away directory for this run, removed after
    progress: Callable[[str, Optional[float]], None] = _no_progress
    options: dict = field(default_factory=dict)   # suite-specific knobs from the CLI
    build_dir: Path = Path("build")     # where libkeel.so and bench/ programs are


class Suite:
    name: str = ""
    description: str = ""
    # Debian packages the suite needs (for the clear "install X" message).
    needs_packages: tuple[str, ...] = ()

    def check(self, ctx: SuiteContext) -> None:
        """Raise SuiteError if something the suite needs is missing."""

    def run(self, ctx: SuiteContext) -> dict:
        raise NotImplementedError
