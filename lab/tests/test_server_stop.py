"""Server.stop when it is interrupted (a second Ctrl-C while it waits for the server to
exit) or cannot confirm the server is gone: the server and its children are killed by
pid before the directory is removed, and the directory is kept while anything may still
run. Offline: the "server" is a shell, or a fake process."""
from __future__ import annotations

import subprocess
import time

import pytest

from keel_lab import servers
from keel_lab.errors import SuiteError
from keel_lab.procfs import descendants, pid_running

NO_SUCH_PID = 2**22 + 4321      # above Linux's largest pid_max: never a process


class Dummy(servers.Server):
    name = "dummy"


def _adopt(srv: servers.Server, popen, tmp_path) -> servers.Server:
    """Makes srv look started (as start() leaves it) with popen as its process."""
    srv.dir = tmp_path / "own"
    srv.dir.mkdir()
    (srv.dir / "data").write_text("the server's files")
    srv.popen = popen
    srv.pid = popen.pid
    with servers._live_lock:
        servers._live[srv.pid] = srv
    return srv


class InterruptedWait:
    """A real Popen whose first wait() raises KeyboardInterrupt, as a second Ctrl-C
    pressed while Server.stop waits for the server would."""

    def __init__(self, popen: subprocess.Popen):
        self._p = popen
        self.interrupts = 1

    def __getattr__(self, name):
        return getattr(self._p, name)

    def wait(self, timeout=None):
        if self.interrupts:
            self.interrupts -= 1
            raise KeyboardInterrupt
        return self._p.wait(timeout)


def test_second_ctrl_c_kills_by_pid_before_the_directory_goes(tmp_path):
    # a "server" that ignores its stop signal (SIGTERM), with a child that does too
    p = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 60 & echo started; wait"],
                         stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"started"
        (kid,) = descendants(p.pid)
        srv = _adopt(Dummy(), InterruptedWait(p), tmp_path)
        t = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            srv.stop(timeout=60)
        assert time.monotonic() - t < 20           # did not sit out the 60 s timeout
        assert not pid_running(p.pid) and not pid_running(kid)
        assert p.returncode == -9                  # SIGKILL, as SIGTERM was ignored
        assert not srv.dir.exists()                # removed once both were gone
        assert srv not in servers.live_servers()
        assert srv.stop() == -9                    # idempotent from here on
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


class Unkillable:
    """A fake server process that neither exits nor dies until told to (dead = True):
    every wait() is interrupted or times out."""

    def __init__(self):
        self.pid = NO_SUCH_PID
        self.returncode = None
        self.dead = False
        self.calls: list[str] = []
        self.interrupts = 1

    def poll(self):
        if self.dead:
            self.returncode = -9
        return self.returncode

    def send_signal(self, sig):
        self.calls.append(f"signal {sig}")

    def kill(self):
        self.calls.append("kill")

    def wait(self, timeout=None):
        self.calls.append("wait")
        if self.interrupts:
            self.interrupts -= 1
            raise KeyboardInterrupt
        if self.poll() is None:
            raise subprocess.TimeoutExpired("fake", timeout)
        return self.returncode


def test_directory_is_kept_while_the_server_may_run(tmp_path, monkeypatch):
    monkeypatch.setattr(servers, "descendants", lambda pid: [])
    fake = Unkillable()
    srv = _adopt(Dummy(), fake, tmp_path)
    try:
        with pytest.raises(KeyboardInterrupt):
            srv.stop(timeout=1)
        assert "kill" in fake.calls                # it tried SIGKILL by pid
        assert (srv.dir / "data").exists()         # not confirmed gone: the files stay
        assert srv in servers.live_servers()       # for the atexit hook to try again
        assert not srv._stopped
        # a later stop() (the atexit hook's) that finds it gone finishes the job
        fake.dead = True
        assert srv.stop() == -9
        assert not srv.dir.exists() and srv not in servers.live_servers()
    finally:
        with servers._live_lock:
            servers._live.pop(fake.pid, None)


def test_children_that_outlive_sigkill_keep_the_directory(tmp_path, monkeypatch):
    """No interrupt, the server exits, but a child it had is still running after the
    kill steps: SuiteError naming it, and the directory stays."""
    kid = NO_SUCH_PID + 1
    monkeypatch.setattr(servers, "descendants", lambda pid: [kid])
    monkeypatch.setattr(servers.procs, "kill_pids", lambda pids, **kw: list(pids))
    monkeypatch.setattr(servers, "pid_running", lambda pid: pid == kid)
    fake = Unkillable()
    fake.interrupts = 0
    fake.send_signal = lambda sig: setattr(fake, "dead", True)    # exits on its stop signal
    srv = _adopt(Dummy(), fake, tmp_path)
    try:
        with pytest.raises(SuiteError, match=f"did not stop: still running: {kid}; its directory"):
            srv.stop(timeout=1)
        assert srv.dir.exists() and srv in servers.live_servers()
    finally:
        with servers._live_lock:
            servers._live.pop(fake.pid, None)
