"""keel_lab.procs: the lab's one place for killing child processes."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

from keel_lab import procs
from keel_lab.procfs import descendants, pid_running

# ignores SIGTERM, so that only SIGKILL ends it
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ok', flush=True); time.sleep(60)"


def _wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_stop_ends_the_whole_group():
    p = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "{STUBBORN}" & sleep 60; wait'],
                         stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ok"
        kids = descendants(p.pid)
        assert len(kids) == 2
        t = time.monotonic()
        procs.stop(p, grace=0.3)
        assert time.monotonic() - t < 5
        assert p.returncode is not None
        _wait_for(lambda: not any(pid_running(k) for k in kids))   # reparented, then reaped
    finally:
        procs.stop(p, grace=0)


def test_stop_of_an_exited_leader_kills_what_it_left():
    p = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!"], stdout=subprocess.PIPE,
                         start_new_session=True)
    assert p.stdout is not None
    left = int(p.stdout.readline())
    p.wait(10)
    assert pid_running(left)
    procs.stop(p)
    _wait_for(lambda: not pid_running(left))


def test_run_group_ends_what_the_command_started(tmp_path):
    # A set-up command whose child goes on writing (mariadb-install-db's bootstrap
    # server): a timeout, like Ctrl-C, must stop that child too, not only the command.
    mark = tmp_path / "still-writing"
    pidfile = tmp_path / "child"
    script = f'(echo $BASHPID > "{pidfile}"; while :; do : > "{mark}"; sleep 0.05; done) & wait'
    t = time.monotonic()
    try:
        procs.run_group(["bash", "-c", script], timeout=0.5)
    except subprocess.TimeoutExpired:
        pass
    else:
        raise AssertionError("the command was expected to time out")
    assert time.monotonic() - t < 10
    child = int(pidfile.read_text())
    _wait_for(lambda: not pid_running(child))
    assert procs.run_group(["sh", "-c", "exit 3"], timeout=10) == 3


def test_kill_pids_escalates_to_sigkill():
    p = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ok"
        reaper_done = []

        def reap():
            p.wait()
            reaper_done.append(p.returncode)
        th = threading.Thread(target=reap, daemon=True)
        th.start()
        t = time.monotonic()
        assert procs.kill_pids([p.pid], wait=0.5) == []
        assert 1.0 <= time.monotonic() - t < 5         # waited, SIGTERM was ignored, SIGKILL
        th.join(5)
        assert reaper_done == [-9]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_kill_pids_of_gone_processes_is_quick():
    p = subprocess.Popen(["true"])
    p.wait()
    t = time.monotonic()
    assert procs.kill_pids([p.pid]) == []
    assert time.monotonic() - t < 1
