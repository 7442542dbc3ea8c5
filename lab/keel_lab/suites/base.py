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

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..allocators import Allocator
# SuiteError is defined in keel_lab.errors (see why there) and is imported from here too
from ..errors import SuiteError
from ..measure import memory_held_kib, mesh_views
from ..procfs import pss_kib


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


def published_mesh_stats(pid: int, timeout: float = 1.0) -> Optional[dict]:
    """Meshing's own counters (keel_mesh_stats_t) as a running process under Keel
    publishes them (live.read: layout 5), or None when they cannot be had: another
    allocator (no /dev/shm/keel-<pid>), a Keel before layout 5, a process in its first
    second (nothing published yet) or one that did not answer within `timeout` (its
    purger answers within ~250 ms). Never raises: the suites record nothing then."""
    from .. import live
    if not live.shm_path(pid).exists():
        return None
    try:
        return live.read(pid, timeout=timeout).mesh_stats
    except (live.LiveError, OSError, ValueError, struct.error):
        return None


# metric name (mesh_<name>[_<suffix>]) -> its value from keel_mesh_stats_t
MESH_STATS_METRICS = {
    "pages": lambda ms: ms["meshed"],                          # given back since start
    "longest_ms": lambda ms: round(ms["longest_ns"] / 1e6, 3),  # writers waited this long
    "busy_s": lambda ms: round(ms["busy_ns"] / 1e9, 3),
    "eroded": lambda ms: ms["eroded"],
    "file_kib": lambda ms: ms["file_bytes"] // 1024,
    "views": lambda ms: ms["views"],
}
MESH_STATS_PHASE = ("pages", "longest_ms", "busy_s", "eroded", "file_kib")


def mesh_stats_metrics(ms: Optional[dict], suffix: Optional[str] = None,
                       names: tuple[str, ...] = MESH_STATS_PHASE) -> dict:
    """mesh_<name>_<suffix> (mesh_<name> without a suffix) for each of `names` (keys of
    MESH_STATS_METRICS) from published_mesh_stats' answer, when meshing is on and
    running (state 1); empty otherwise (no answer, KEEL_MESH off, refused, a child)."""
    from .. import live
    if not ms or ms.get("state") != live.MESH_STATE_ON:
        return {}
    tail = f"_{suffix}" if suffix else ""
    return {f"mesh_{n}{tail}": MESH_STATS_METRICS[n](ms) for n in names}


MESH_STATS_NOTE = ("mesh_pages_*: pages meshing gave back since the server started; "
                   "mesh_longest_ms_*: its longest operation (writers to those pages waited "
                   "that long); mesh_busy_s_*: time spent in operations; mesh_eroded_*: views "
                   "written since (private again); mesh_file_kib_*: the mesh file. From the "
                   "server's published statistics (keel_mesh_stats), only while meshing runs "
                   "(keel+mesh).")


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

    def check_options(self, ctx: SuiteContext) -> None:
        """Raise SuiteError for an option value (keel bench --set SUITE.KEY=VALUE) the
        suite cannot use. Quick and side-effect free: the bench calls it for every suite
        before it runs anything or waits for the machine's lock."""

    def check(self, ctx: SuiteContext) -> None:
        """Raise SuiteError if something the suite needs is missing."""

    def run(self, ctx: SuiteContext) -> dict:
        raise NotImplementedError


# ---- options, for the server suites (redis, mariadb, postgres, sphinx) ----------------
# Options come from `keel bench --set SUITE.KEY=VALUE` as strings, or from tests as
# Python values; these accept both.

def opt_bool(ctx: SuiteContext, key: str, default: bool = False) -> bool:
    v = ctx.options.get(key, default)
    if isinstance(v, str):
        return v.strip().lower() not in ("", "0", "no", "false", "off")
    return bool(v)


def opt_float(ctx: SuiteContext, key: str, default):
    v = ctx.options.get(key)
    if v is None or v == "":
        return default
    try:
        return float(v)
    except (TypeError, ValueError):
        raise SuiteError(f"option {key}={v!r}: expected a number") from None


def opt_list(ctx: SuiteContext, key: str, default: tuple, conv=int) -> tuple:
    v = ctx.options.get(key)
    if v is None or v == "":
        return tuple(default)
    items = v.split(",") if isinstance(v, str) else (v if isinstance(v, (list, tuple)) else [v])
    try:
        return tuple(conv(str(x).strip()) if isinstance(x, str) else conv(x)
                     for x in items if str(x).strip())
    except (TypeError, ValueError):
        raise SuiteError(f"option {key}={v!r}: expected a comma-separated list") from None


def opt_env(ctx: SuiteContext, key: str = "extra_env") -> dict:
    """Extra environment for the server: a dict, or "NAME=VALUE[,NAME=VALUE...]"."""
    v = ctx.options.get(key)
    if not v:
        return {}
    if isinstance(v, dict):
        return {str(k): str(x) for k, x in v.items()}
    out = {}
    for item in str(v).replace(";", ",").split(","):
        if item.strip():
            if "=" not in item:
                raise SuiteError(f"option {key}: {item!r} is not NAME=VALUE")
            k, x = item.split("=", 1)
            out[k.strip()] = x.strip()
    return out


def size_mode(ctx: SuiteContext) -> str:
    """'tiny' (tests: option tiny=1), 'quick' or 'full'."""
    if opt_bool(ctx, "tiny"):
        return "tiny"
    return "quick" if ctx.quick else "full"
