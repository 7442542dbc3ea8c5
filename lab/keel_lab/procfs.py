"""Reading a process's figures from /proc: memory (status, smaps_rollup), CPU time,
whether it still runs, and its descendants. The one place the lab reads these.

    rss_kib(pid)                     # VmRSS
    status_kib(pid, "RssAnon")       # any "kB" line of /proc/PID/status
    tree_kib(pid, "VmRSS")           # summed over the process and its descendants
    descendants(pid)                 # children, grandchildren ... (psutil)

Every reader returns None for a process that is gone (never raises for it). A process's
descendants come from psutil (parent pids of all processes), not from
/proc/PID/task/*/children, which proc(5) calls unreliable while children exit (a child
that exits can hide a sibling from the list).
"""
from __future__ import annotations

import os
from typing import Optional

import psutil


def proc_kib(path: str, field: str, absent: Optional[int] = None) -> Optional[int]:
    """The value of a "FIELD:  N kB" line of a /proc file (status, smaps_rollup) in KiB:
    None if the file cannot be read (the process is gone), `absent` if it has no such line."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return absent


def status_kib(pid: int, field: str = "VmRSS", absent: Optional[int] = None) -> Optional[int]:
    """A "kB" field of /proc/PID/status (VmRSS, VmHWM, RssAnon ...): None if the process
    is gone, `absent` if it has no such line (a zombie has no memory lines)."""
    return proc_kib(f"/proc/{pid}/status", field, absent)


def rss_kib(pid: int) -> Optional[int]:
    """VmRSS of one process in KiB, or None if it is gone (or a zombie: no VmRSS)."""
    return status_kib(pid, "VmRSS")


def smaps_rollup_kib(pid: int, field: str, absent: Optional[int] = None) -> Optional[int]:
    """A field of /proc/PID/smaps_rollup (Pss, AnonHugePages ...) in KiB; None if the
    process is gone, `absent` if it has no such line."""
    return proc_kib(f"/proc/{pid}/smaps_rollup", field, absent)


def pss_kib(pid: int) -> Optional[int]:
    """Pss of one process in KiB (/proc/PID/smaps_rollup: each page divided by the number
    of processes mapping it), or None if it is gone. Under Keel's meshing it under-counts:
    a view that was not read since its page was meshed is not mapped at all."""
    return smaps_rollup_kib(pid, "Pss")


def pid_running(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read().rsplit(")", 1)[1].split()[0]
        return st not in ("Z", "X")
    except (OSError, IndexError):
        return False


def descendants(pid: int) -> list[int]:
    """The pids of all live descendants of a process (empty if it is gone)."""
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def tree_kib(pid: int, field: str = "VmRSS") -> Optional[int]:
    """A /proc/PID/status field summed over the process and its descendants; None if
    neither the process nor any descendant could be read (gone)."""
    own = status_kib(pid, field)
    total = own or 0
    alive = own is not None
    for c in descendants(pid):
        kib = status_kib(c, field)
        if kib is not None:
            total += kib
            alive = True
    return total if alive else None


def cpu_seconds(pid: int, tree: bool = False) -> Optional[float]:
    """User + system CPU seconds of a process (all its threads); with tree, plus its
    live descendants and the children it has reaped (so a PostgreSQL backend that exits
    between two readings still counts once). None if the process is gone."""
    tick = os.sysconf("SC_CLK_TCK")

    def times(p: int) -> Optional[tuple[int, int]]:
        try:
            with open(f"/proc/{p}/stat") as f:
                f_ = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        # after the command: state is field 3, utime 14, stime 15, cutime 16, cstime 17
        return int(f_[11]) + int(f_[12]), int(f_[13]) + int(f_[14])

    own = times(pid)
    if own is None:
        return None
    total = own[0] + (own[1] if tree else 0)
    if tree:
        total += sum((times(c) or (0, 0))[0] for c in descendants(pid))
    return total / tick
