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
