"""Measuring processes: resident memory (RSS) over time, and latency statistics.

    sampler = RssSampler(pid, interval=0.2, children=True)
    sampler.start()
    ...                                # the workload runs
    sampler.stop()
    sampler.peak_kib, sampler.final_kib, sampler.series   # series: [[t_seconds, kib], ...]

    RssSampler(pid, field="RssAnon"), RssSampler(fn=lambda: ...)   # other figures

    latency_summary([1.2, 0.9, ...])   # {"mean_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms", "count"}

RSS is read from /proc/PID/status (VmRSS), which is what `ps`/`top` show and what the
kernel charges the process for; with children=True the RSS of all descendants is added
(e.g. PostgreSQL's backends, or a program started through a launcher).

    memory_held_kib(pid)   # RssAnon + RssFile + RssShmem, Keel's meshed pages counted once
    mesh_views(pid)        # mappings of Keel's mesh memfd (0 without meshing)

The single figures (VmRSS, Pss, any /proc/PID/status field, summed over a process tree)
are read by keel_lab.procfs.

Under Keel with KEEL_MESH=on, VmRSS counts a meshed page once per virtual page mapping
it, so it does not fall when meshing gives memory back: compare memory_held_kib then.
"""
from __future__ import annotations

import math
import os
import statistics
import threading
import time
from typing import Optional
from collections.abc import Callable, Iterable, Sequence

import psutil

from .procfs import status_kib, tree_kib


# Keel's meshing (docs/meshing.md; KEEL_MESH=on) makes several virtual pages MAP_PRIVATE
# views of one page of a memfd named "keel-mesh". VmRSS counts that page (in RssShmem)
# once per view that maps it, so it does not fall when meshing saves memory, and neither
# VmRSS nor Pss sees views not touched since they were meshed (not mapped yet).
# memory_held_kib counts the memfd once instead.
MESH_MEMFD_TAG = "memfd:keel-mesh"
MESH_MEMFD_LINK = "/memfd:keel-mesh (deleted)"


def _mesh_maps(pid: int) -> Optional[list[tuple[str, int]]]:
    """(address range, inode) of each line of /proc/PID/maps that maps Keel's mesh memfd;
    None if the process is gone."""
    out = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if MESH_MEMFD_TAG in line:
                    fields = line.split()
                    out.append((fields[0], int(fields[4])))
    except (OSError, ValueError, IndexError):
        return None
    return out


def mesh_views(pid: int) -> int:
    """How many mappings of Keel's mesh memfd the process has (lines of /proc/PID/maps
    naming memfd:keel-mesh; one mapping can hold a run of views). 0 without meshing, or
    if the process is gone."""
    return len(_mesh_maps(pid) or ())


def _mesh_memfd_bytes(pid: int, maps: list[tuple[str, int]]) -> Optional[int]:
    """Bytes held by Keel's mesh memfd(s), each file counted once (st_blocks * 512): the
    mapped ones through /proc/PID/map_files (needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE),
    every open one through /proc/PID/fd (the library keeps its memfd open; a forked child
    closes its parent's but may still map it). None if a mapped memfd cannot be stat'ed
    either way."""
    held: dict[int, int] = {}        # inode -> bytes
    for rng, ino in maps:
        if ino in held:
            continue
        try:
            st = os.stat(f"/proc/{pid}/map_files/{rng}")
        except OSError:
            continue
        held[st.st_ino] = st.st_blocks * 512
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != MESH_MEMFD_LINK:
                continue
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        held.setdefault(st.st_ino, st.st_blocks * 512)
    if {ino for _, ino in maps} - held.keys():
        return None
    return sum(held.values())


def _mesh_views_shmem_kib(pid: int) -> Optional[int]:
    """The memfd pages the mesh views have mapped, counted once per view as RssShmem
    counts them: Rss - Anonymous (copies made by writes into a view are anonymous and
    stay in RssAnon) summed over the keel-mesh mappings of /proc/PID/smaps."""
    total = 0
    inside = False
    rss = anon = 0
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0] if line.strip() else ""
                if not head.endswith(":"):           # a mapping's header line
                    if inside:
                        total += rss - anon
                    inside = MESH_MEMFD_TAG in line
                    rss = anon = 0
                elif inside and head == "Rss:":
                    rss = int(line.split()[1])
                elif inside and head == "Anonymous:":
                    anon = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    if inside:
        total += rss - anon
    return total


def memory_held_kib(pid: int) -> Optional[int]:
    """The memory a process holds, in KiB, with Keel's meshed pages counted once:
    RssAnon + RssFile + RssShmem, where the part of RssShmem that is the keel-mesh views
    (each shared page once per view) is replaced by the bytes resident in the keel-mesh
    memfd. Other shared memory (SysV, /dev/shm, other memfds) stays. Without the memfd
    (glibc, jemalloc, ..., Keel without meshing) this is VmRSS. None if the process is
    gone or a mapped mesh memfd cannot be measured."""
    rss = {"RssAnon": 0, "RssFile": 0, "RssShmem": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name = line.split(":", 1)[0]
                if name in rss:
                    rss[name] = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    anon, file_, shmem = rss["RssAnon"], rss["RssFile"], rss["RssShmem"]
    maps = _mesh_maps(pid)
    if maps is None:
        return None
    memfd = _mesh_memfd_bytes(pid, maps)
    if memfd is None:
        return None
    if maps:
        views = _mesh_views_shmem_kib(pid)
        if views is None:
            return None
        shmem = max(0, shmem - views)
    return anon + file_ + shmem + memfd // 1024


class RssSampler:
    """Samples a process's RSS every `interval` seconds on a background thread, from
    start() (which takes the first sample at once) to stop() (which takes one more).
    What is sampled: `field` of /proc/PID/status (VmRSS; RssAnon ...), with
    children=True summed over the process and its descendants; or, with fn, whatever
    fn() returns in KiB (None or an exception: no sample). Sampling a pid stops by itself
    once the process is gone. series: [[seconds since t0, kib], ...], where t0 is the
    one given or the time of start(). Use as a context manager or start()/stop()."""

    def __init__(self, pid: Optional[int] = None, interval: float = 0.2, children: bool = False,
                 *, fn: Optional[Callable[[], Optional[int]]] = None, field: str = "VmRSS",
                 t0: Optional[float] = None):
        if not 0.01 <= interval <= 10:
            raise ValueError("interval must be between 0.01 and 10 s")
        if fn is None:
            if pid is None:
                raise ValueError("RssSampler needs a pid or a fn")
            p = pid
            fn = (lambda: tree_kib(p, field)) if children else (lambda: status_kib(p, field))
        self.pid = pid
        self.fn = fn
        self.interval = interval
        self.children = children
        self._t0_given = t0
        self.t0 = time.monotonic() if t0 is None else t0
        self.series: list[list[float]] = []     # [[seconds since t0, kib], ...]
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def sample(self) -> Optional[int]:
        """Takes one sample now (and returns it; None: none taken)."""
        try:
            kib = self.fn()
        except Exception:  # noqa: BLE001 -- e.g. a process that vanished: no sample
            kib = None
        if kib is not None:
            with self._lock:
                self.series.append([round(time.monotonic() - self.t0, 3), int(kib)])
        return kib

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            if self.sample() is None and self.pid is not None and not psutil.pid_exists(self.pid):
                break

    def start(self) -> RssSampler:
        if self._t0_given is None:
            self.t0 = time.monotonic()
        self.sample()
        self._thread = threading.Thread(target=self._loop, name=f"rss-{self.pid}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> RssSampler:
        """Stops the thread and takes a last sample (idempotent)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
            self.sample()
        return self

    def __enter__(self) -> RssSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def peak_kib(self) -> Optional[int]:
        with self._lock:
            peak = max((k for _, k in self.series), default=None)
            return None if peak is None else int(peak)

    @property
    def final_kib(self) -> Optional[int]:
        with self._lock:
            return int(self.series[-1][1]) if self.series else None

    def result(self) -> dict:
        """{"rss_peak_kib", "rss_final_kib"} metrics and the series, for a suite result."""
        return {"rss_peak_kib": self.peak_kib, "rss_final_kib": self.final_kib,
                "series": [list(p) for p in self.series]}


# ---------------------------------------------------------------------------------
# statistics


def percentile(values: Sequence[float], p: float) -> Optional[float]:
    """The p-th percentile (0..100) with linear interpolation between closest ranks
    (numpy's default); None for an empty list."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    k = (len(xs) - 1) * (p / 100.0)
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return float(xs[int(k)])
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def latency_summary(latencies_ms: Iterable[float]) -> dict:
    """mean, p50, p95, p99 and max of latencies (milliseconds), rounded to µs, as
    metrics keys; empty input gives an empty dict."""
    xs = sorted(float(v) for v in latencies_ms)
    if not xs:
        return {}
    r = lambda v: round(v, 3)  # noqa: E731
    return {"mean_ms": r(statistics.fmean(xs)), "p50_ms": r(percentile(xs, 50)),
            "p95_ms": r(percentile(xs, 95)), "p99_ms": r(percentile(xs, 99)),
            "max_ms": r(xs[-1]), "count": len(xs)}


def spread(values: Sequence[float]) -> Optional[float]:
    """(max - min) / median: how far apart repeated runs are (0.05 = 5%)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    if len(vals) < 2:
        return 0.0
    med = statistics.median(vals)
    if med == 0:
        return 0.0
    return (max(vals) - min(vals)) / abs(med)


def geomean(values: Iterable[float]) -> Optional[float]:
    vals = [v for v in values if v is not None and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))
