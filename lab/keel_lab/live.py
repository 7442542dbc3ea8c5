"""Reading a running Keel process's statistics from outside, without stopping it.

A process under Keel (after its first second) has /dev/shm/keel-<pid>, mode 0600, laid
out as below (layout version 9, little-endian; see src/core/publish.c and docs/design.md
"Statistics another process can read"; layouts 2 to 8 are still read). A reader bumps
`request`; the process's purger thread refreshes the figures within ~250 ms under a
sequence lock and copies `request` to `answered`. `purge_request` works the same way
and makes the process return its free memory to the OS.
"""
from __future__ import annotations

import mmap
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from . import procfs

MAGIC = 0x5441545354454B4B
HEADER = struct.Struct("<QIIQQQQQQQQQQ256sII")  # magic .. pad: 360 bytes
STATS_FIELDS = ["allocated", "active", "cached", "mapped", "committed", "retained", "metadata",
                "huge_allocated", "purged_bytes", "purge_runs", "threads", "threads_total",
                "os_page_size", "huge_page_size"]
STATS = struct.Struct("<II" + "Q" * len(STATS_FIELDS))  # keel_stats_t: 120 bytes
CLASS = struct.Struct("<QQQQQ")  # keel_class_stats_t
OFF_REQUEST, OFF_ANSWERED, OFF_PURGE_REQ, OFF_PURGE_ANS, OFF_SEQ = 24, 32, 40, 48, 56
OFF_PROFILE_REQ, OFF_PROFILE_ANS, OFF_PROFILE_PATH = 80, 88, 96
LAYOUT_VERSION = 10
# 2: without the lock counters; 3: without the mesh estimate; 4: without the mesh stats;
# 5: 120 classes and 72 mesh rows (6: 127 and 73), so everything after the classes sits
# 280 bytes earlier and the mesh statistics 352; 6: without borrowed_blocks; 7: without
# carved_holes; 8: without caches_taken_back; 9: without gathers and blocks_gathered.
LAYOUTS_READ = (2, 3, 4, 5, 6, 7, 8, 9, 10)
LOCK = struct.Struct("<QQQ")  # acquired, contended, sleeps


@dataclass(frozen=True)
class Offsets:
    nlocks: int       # layout 3
    mesh_req: int     # layout 4: mesh_request, mesh_answered, nmesh, then the rows
    mesh_rows: int    # most rows
    mesh_stats: int   # layout 5

    @property
    def borrowed(self) -> int:  # layout 7: borrowed_blocks, appended after the mesh stats
        return self.mesh_stats + MESH_STATS.size

    @property
    def carved(self) -> int:  # layout 8: carved_holes, appended after borrowed_blocks
        return self.borrowed + 8

    @property
    def taken_back(self) -> int:  # layout 9: caches_taken_back, appended after carved_holes
        return self.carved + 8

    @property
    def gathers(self) -> int:  # layout 10: gathers, blocks_gathered, after caches_taken_back
        return self.taken_back + 8


OFFSETS_5 = Offsets(nlocks=5280, mesh_req=5480, mesh_rows=72, mesh_stats=10688)
OFFSETS_6 = Offsets(nlocks=5560, mesh_req=5760, mesh_rows=73, mesh_stats=11040)


def offsets(version: int) -> Offsets:
    return OFFSETS_6 if version >= 6 else OFFSETS_5


MESH_FIELDS = ["block_size", "pages", "free_pages", "candidates", "pair_saved", "pair_views",
               "pair_runs", "group_saved", "group_views"]
MESH_ROW = struct.Struct("<" + "Q" * len(MESH_FIELDS))  # keel_mesh_estimate_t
MESH_STATS_FIELDS = ["groups", "views", "view_limit", "file_bytes", "meshed", "failed", "eroded",
                     "left", "released", "longest_ns", "busy_ns"]
MESH_STATS = struct.Struct("<II" + "Q" * len(MESH_STATS_FIELDS))  # 96 bytes
MESH_STATE_OFF, MESH_STATE_ON, MESH_STATE_REFUSED, MESH_STATE_CHILD = 0, 1, 2, 3
MESH_STATES = {0: "off", 1: "on", 2: "refused", 3: "forked child"}
MESH_BARRIERS = {0: "none (yet)", 1: "user mode", 2: "kernel"}
LOCK_NAMES = ["central", "page heap", "huge", "threads", "metadata", "page map", "profile",
              "quarantine"]


class LiveError(RuntimeError):
    """A message for the operator (no such process, not running Keel, no permission)."""


@dataclass
class ClassStats:
    block_size: int
    blocks_in_use: int
    blocks_cached: int
    slabs: int
    slab_bytes: int

    @property
    def utilisation(self) -> float:
        return self.blocks_in_use * self.block_size / self.slab_bytes if self.slab_bytes else 0.0


@dataclass
class Snapshot:
    pid: int
    stats: dict
    classes: list[ClassStats]
    updated_ms: int
    purged_on_request: int
    locks: dict = field(default_factory=dict)  # name -> {"acquired", "contended", "sleeps"} (layout 3)
    # Meshing's own counters (keel_mesh_stats_t, layout 5; None before): "state" and
    # "barrier" (numbers, MESH_STATES / MESH_BARRIERS name them), then MESH_STATS_FIELDS.
    mesh_stats: dict | None = None
    layout: int = 0
    # Blocks a size class took from a larger class's free holes instead of a new slab
    # (layout 7; None before): docs/design.md "Borrowing".
    borrowed_blocks: int | None = None
    # Free blocks of larger classes carved into blocks of a smaller one, now (layout 8;
    # None before): docs/design.md "Carving".
    carved_holes: int | None = None
    # Thread caches the purger took back from waiting threads, so far (layout 9; None
    # before): docs/design.md "Caches of waiting threads".
    caches_taken_back: int | None = None
    # Gathers, and the blocks they moved from other threads' bins to the slabs, so far
    # (layout 10; None before): docs/design.md "Blocks above 8 KiB are gathered".
    gathers: int | None = None
    blocks_gathered: int | None = None


def parse_mesh_stats(buf, offset: int = OFFSETS_6.mesh_stats) -> dict:
    """keel_mesh_stats_t (include/keel.h) at `offset` of a buffer, as a dict."""
    state, barrier, *rest = MESH_STATS.unpack_from(buf, offset)
    return {"state": state, "barrier": barrier, **dict(zip(MESH_STATS_FIELDS, rest, strict=True))}


def shm_path(pid: int) -> Path:
    return Path(f"/dev/shm/keel-{pid}")


def _check_process(pid: int) -> None:
    if not Path(f"/proc/{pid}").exists():
        raise LiveError(f"no process with PID {pid}")


def _exited(pid: int) -> LiveError:
    return LiveError(f"process {pid} exited while its statistics were being read")


def _open(pid: int) -> tuple[mmap.mmap, BinaryIO]:
    _check_process(pid)
    path = shm_path(pid)
    if not path.exists():
        maps = Path(f"/proc/{pid}/maps")
        try:
            uses_keel = "libkeel" in maps.read_text()
        except PermissionError:
            raise LiveError(f"cannot read /proc/{pid}/maps: permission denied (run as the "
                            f"process's user or root)") from None
        except (FileNotFoundError, ProcessLookupError):
            raise _exited(pid) from None
        if not uses_keel:
            raise LiveError(f"process {pid} is not running Keel (libkeel is not mapped)")
        raise LiveError(f"process {pid} runs Keel but publishes no statistics yet "
                        f"(it publishes after its first second unless KEEL_PUBLISH=0 or "
                        f"KEEL_BACKGROUND_PURGE=0; a forked child, once it has taken "
                        f"KEEL_CHILD_PURGER, 4 MiB by default, since the fork)")
    try:
        f = open(path, "r+b")
    except PermissionError:
        raise LiveError(f"{path} belongs to another user: run as the process's user or root") from None
    except FileNotFoundError:       # the process exited and removed it
        raise _exited(pid) from None
    try:
        m = mmap.mmap(f.fileno(), 0)
    except ValueError:              # empty: being created, or cut short
        f.close()
        raise LiveError(f"{path} is empty: not a Keel statistics file (yet)") from None
    if len(m) < HEADER.size + STATS.size:
        m.close()
        f.close()
        raise LiveError(f"{path} is too short for a Keel statistics file")
    magic, version, *_ = HEADER.unpack_from(m, 0)
    if magic != MAGIC or version not in LAYOUTS_READ:
        m.close()
        f.close()
        raise LiveError(f"{path} is not a Keel statistics file of a known layout")
    pid_in_file = HEADER.unpack_from(m, 0)[3]
    if pid_in_file != pid:
        m.close()
        f.close()
        raise LiveError(f"{path} is stale (written by PID {pid_in_file})")
    return m, f


def _bump_and_wait(m: mmap.mmap, req_off: int, ans_off: int, timeout: float,
                   pid: int | None = None) -> None:
    req = struct.unpack_from("<Q", m, req_off)[0] + 1
    struct.pack_into("<Q", m, req_off, req)
    deadline = time.monotonic() + timeout
    while struct.unpack_from("<Q", m, ans_off)[0] < req:
        if pid is not None and not Path(f"/proc/{pid}").exists():
            raise _exited(pid)
        if time.monotonic() > deadline:
            raise LiveError(f"the process did not answer within {timeout:.1f} s (is it stopped, "
                            "or is its purger thread disabled?)")
        time.sleep(0.02)


def _read_consistent(m, pid: int) -> Snapshot:
    """The figures in a published file's mapping (or any buffer holding one)."""
    for _ in range(100):
        seq1 = struct.unpack_from("<Q", m, OFF_SEQ)[0]
        if seq1 % 2:
            time.sleep(0.001)
            continue
        header = HEADER.unpack_from(m, 0)
        header_size, updated_ms, purged, nclasses = header[2], header[9], header[10], header[14]
        st = STATS.unpack_from(m, HEADER.size)
        classes = [ClassStats(*CLASS.unpack_from(m, header_size + i * CLASS.size))
                   for i in range(nclasses)]
        off = offsets(header[1])
        locks = {}
        if header[1] >= 3:
            nlocks = struct.unpack_from("<I", m, off.nlocks)[0]
            for i in range(min(nlocks, len(LOCK_NAMES))):
                locks[LOCK_NAMES[i]] = dict(zip(("acquired", "contended", "sleeps"),
                                                LOCK.unpack_from(m, off.nlocks + 8 + i * LOCK.size),
                                                strict=True))
        mesh_stats = (parse_mesh_stats(m, off.mesh_stats)
                      if header[1] >= 5 and len(m) >= off.mesh_stats + MESH_STATS.size else None)
        borrowed = (struct.unpack_from("<Q", m, off.borrowed)[0]
                    if header[1] >= 7 and len(m) >= off.borrowed + 8 else None)
        carved = (struct.unpack_from("<Q", m, off.carved)[0]
                  if header[1] >= 8 and len(m) >= off.carved + 8 else None)
        taken = (struct.unpack_from("<Q", m, off.taken_back)[0]
                 if header[1] >= 9 and len(m) >= off.taken_back + 8 else None)
        gathers, gathered = (struct.unpack_from("<QQ", m, off.gathers)
                             if header[1] >= 10 and len(m) >= off.gathers + 16 else (None, None))
        if struct.unpack_from("<Q", m, OFF_SEQ)[0] == seq1:
            return Snapshot(pid, dict(zip(STATS_FIELDS, st[2:], strict=True)), classes, updated_ms, purged, locks,
                            mesh_stats, header[1], borrowed, carved, taken, gathers, gathered)
    raise LiveError("could not read a consistent snapshot")


def _request(pid: int, req_off: int, ans_off: int, timeout: float) -> Snapshot:
    """Bumps one request counter, waits for the process's answer, reads the figures."""
    m, f = _open(pid)
    try:
        _bump_and_wait(m, req_off, ans_off, timeout, pid)
        return _read_consistent(m, pid)
    finally:
        m.close()
        f.close()


def read(pid: int, timeout: float = 3.0) -> Snapshot:
    """Fresh statistics of a running Keel process."""
    return _request(pid, OFF_REQUEST, OFF_ANSWERED, timeout)


def purge(pid: int, timeout: float = 10.0) -> Snapshot:
    """Asks the process to return its free memory to the OS now; returns the figures after."""
    return _request(pid, OFF_PURGE_REQ, OFF_PURGE_ANS, timeout)


def profile(pid: int, timeout: float = 30.0) -> str:
    """Asks the process to write a heap profile now; returns the file's path."""
    m, f = _open(pid)
    try:
        _bump_and_wait(m, OFF_PROFILE_REQ, OFF_PROFILE_ANS, timeout, pid)
        raw = bytes(m[OFF_PROFILE_PATH:OFF_PROFILE_PATH + 256])
    finally:
        m.close()
        f.close()
    path = raw.split(b"\0", 1)[0].decode(errors="replace")
    if not path:
        raise LiveError(f"process {pid} is not profiling: start it with KEEL_PROFILE_RATE "
                        f"(e.g. KEEL_PROFILE_RATE=512K) to record allocation stacks")
    if path.startswith("!"):
        raise LiveError(f"process {pid} could not write its heap profile to {path[1:]}: "
                        f"check KEEL_PROFILE_PREFIX (a directory it can write to)")
    return path


def mesh_estimate(pid: int, timeout: float = 30.0) -> list[dict]:
    """What meshing could give back in a running process (keel_mesh_estimate in
    include/keel.h): one dict per size class up to 2 KiB, counts in OS pages."""
    m, f = _open(pid)
    try:
        version = HEADER.unpack_from(m, 0)[1]
        if version < 4:
            raise LiveError(f"process {pid} runs a Keel without the meshing estimate (layout < 4)")
        off = offsets(version)
        _bump_and_wait(m, off.mesh_req, off.mesh_req + 8, timeout, pid)
        for _ in range(100):
            seq1 = struct.unpack_from("<Q", m, OFF_SEQ)[0]
            if seq1 % 2:
                time.sleep(0.001)
                continue
            n = struct.unpack_from("<I", m, off.mesh_req + 16)[0]
            rows = [dict(zip(MESH_FIELDS, MESH_ROW.unpack_from(m, off.mesh_req + 24 + i * MESH_ROW.size),
                             strict=True))
                    for i in range(min(n, off.mesh_rows))]
            if struct.unpack_from("<Q", m, OFF_SEQ)[0] == seq1:
                return rows
        raise LiveError("could not read a consistent meshing estimate")
    finally:
        m.close()
        f.close()


def mesh_totals(rows: list[dict], page_size: int) -> dict:
    """Sums of a mesh estimate in bytes: slab memory, the part on pages in use, and what
    pairs / groups of up to 8 would free, with the mappings each needs."""
    tot = {k: sum(r[k] for r in rows) for k in MESH_FIELDS[1:]}
    return {"slab_bytes": tot["pages"] * page_size,
            "in_use_bytes": (tot["pages"] - tot["free_pages"]) * page_size,
            "pair_saved_bytes": tot["pair_saved"] * page_size, "pair_views": tot["pair_views"],
            "pair_runs": tot["pair_runs"],
            "group_saved_bytes": tot["group_saved"] * page_size, "group_views": tot["group_views"]}


def rss_kib(pid: int) -> int:
    """VmRSS of the process; LiveError if it has exited (0 for a zombie)."""
    kib = procfs.status_kib(pid, "VmRSS", absent=0)
    if kib is None:
        raise _exited(pid)
    return kib


def remove_stale() -> list[int]:
    """Deletes statistics files of processes that no longer exist; returns their PIDs."""
    gone = []
    for p in Path("/dev/shm").glob("keel-*"):
        try:
            pid = int(p.name.split("-", 1)[1])
        except ValueError:
            continue
        if not Path(f"/proc/{pid}").exists():
            try:
                p.unlink()
                gone.append(pid)
            except OSError:
                pass
    return gone
