"""Child processes that are always cleaned up: own process group, killed on the way out.

Set-up, as preexec_fn: pdeathsig (SIGTERM to the child if the lab dies), thp_disable.
The lab's one place for killing processes:
    stop(p)          a child started with start_new_session=True: its whole process group
                     (SIGTERM, SIGKILL after a grace period), reaped;
    run_group(argv)  subprocess.run for a set-up command that starts helpers of its own,
                     in a group of its own that stop() ends, whatever ends the wait;
    kill_pids(pids)  processes known by pid (a stopped server's leftover children): a
                     moment to exit, then SIGTERM, then SIGKILL.
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from typing import Optional

from .procfs import pid_running


# ---- set-up of a child (preexec_fn) --------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1
PR_SET_THP_DISABLE = 41


def pdeathsig() -> None:
    """prctl(PR_SET_PDEATHSIG, SIGTERM), as a preexec_fn: the child gets SIGTERM if the
    lab process dies without stopping it (e.g. SIGKILL)."""
    # Linux sends it when the *thread* that started the child exits: start servers from
    # a thread that outlives them (the suites run in the main thread).
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def thp_disable() -> None:
    """prctl(PR_SET_THP_DISABLE, 1): no transparent huge pages for this process and
    everything it forks/execs (inherited across fork and execve). Use as preexec_fn."""
    if _libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_THP_DISABLE): {os.strerror(err)}")


# ---- ending children ------------------------------------------------------------------


def stop(p: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM to the child's process group (it must have been started with
    start_new_session=True), SIGKILL after `grace` seconds; reaps it."""
    if p.poll() is not None:
        _kill_group(p.pid, signal.SIGKILL)   # stragglers it left behind
        return
    _kill_group(p.pid, signal.SIGTERM)
    try:
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    _kill_group(p.pid, signal.SIGKILL)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def run_group(argv: Sequence[str], timeout: float, **popen_kw) -> int:
    """Runs argv to its end and returns its exit status, as subprocess.run, but in a
    process group of its own that is stopped whole however the wait ends: a timeout
    (TimeoutExpired is raised after), Ctrl-C, SIGTERM turned into an exception, and the
    stragglers of a normal end. mariadb-install-db's bootstrap server and initdb's backend
    are children of the command's own children, which outlived a plain run's kill of
    the command alone and went on writing into a directory being removed."""
    p = subprocess.Popen(list(argv), start_new_session=True, **popen_kw)
    try:
        return p.wait(timeout=timeout)
    finally:
        stop(p)


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_pids(pids: Iterable[int], signals: Sequence[Optional[int]] = (None, signal.SIGTERM, signal.SIGKILL),
              wait: float = 5.0) -> list[int]:
    """Ends processes known by pid, each step waiting up to `wait` seconds for them to go:
    by default first a moment to exit by themselves (None), then SIGTERM, then SIGKILL.
    Only for pids known to be ours (e.g. children seen under a server before it stopped).
    Returns those still running at the end (empty when all are gone)."""
    left = [p for p in pids if pid_running(p)]
    for sig in signals:
        if not left:
            break
        if sig is not None:
            for p in left:
                try:
                    os.kill(p, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + wait
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [p for p in left if pid_running(p)]
    return left


def describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "still running"
    if code >= 0:
        return f"exit status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"killed by {name}"


class LineReader:
    """Reads lines from a child's stdout pipe with a timeout."""

    def __init__(self, p: subprocess.Popen):
        if p.stdout is None:
            raise ValueError("LineReader needs a child started with stdout=subprocess.PIPE")
        self.p = p
        self.fd = p.stdout.fileno()
        self.buf = b""

    def readline(self, timeout: float) -> Optional[str]:
        """The next line (without newline); None on EOF; TimeoutError after timeout."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            r, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if not r:
                continue
            chunk = os.read(self.fd, 65536)
            if not chunk:
                if self.buf:
                    line, self.buf = self.buf, b""
                    return line.decode("utf-8", "replace")
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode("utf-8", "replace")


def tail(text: str, lines: int = 8) -> str:
    t = text.strip().splitlines()
    return "\n".join("    " + x for x in t[-lines:])
