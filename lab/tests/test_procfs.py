"""keel_lab.procfs: the lab's one reader of /proc figures."""
from __future__ import annotations

import os
import subprocess
import time

from keel_lab import procfs


def _wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_descendants_and_tree_sums_over_grandchildren():
    # sh -> (sh -> sleep) and sleep: a grandchild must be found and counted
    p = subprocess.Popen(["sh", "-c", "sh -c 'sleep 30; true' & sleep 30; wait"],
                         start_new_session=True)
    try:
        _wait_for(lambda: len(procfs.descendants(p.pid)) >= 3)
        kids = procfs.descendants(p.pid)
        assert len(kids) == 3 and p.pid not in kids
        own = procfs.rss_kib(p.pid)
        assert own and own > 0
        tree = procfs.tree_kib(p.pid)
        assert tree is not None and tree > own      # the children's RSS is added
        assert procfs.tree_kib(p.pid, "RssAnon") is not None
        assert procfs.cpu_seconds(p.pid, tree=True) is not None
    finally:
        os.killpg(p.pid, 9)
        p.wait()


def test_gone_and_zombie_processes():
    p = subprocess.Popen(["true"])
    _wait_for(lambda: not procfs.pid_running(p.pid))   # a zombie until waited for
    assert procfs.rss_kib(p.pid) is None                  # a zombie has no VmRSS
    assert procfs.status_kib(p.pid, "VmRSS", absent=0) == 0
    p.wait()
    for f in (procfs.rss_kib, procfs.tree_kib, procfs.pss_kib, procfs.cpu_seconds):
        assert f(p.pid) is None, f
    assert procfs.status_kib(p.pid, "VmRSS", absent=0) is None
    assert procfs.descendants(p.pid) == []
    assert not procfs.pid_running(p.pid)


def test_status_fields_of_this_process():
    me = os.getpid()
    assert procfs.rss_kib(me) == procfs.status_kib(me, "VmRSS") > 0
    assert procfs.status_kib(me, "VmHWM") >= procfs.rss_kib(me) * 0.5
    assert procfs.status_kib(me, "NoSuchField") is None
    assert procfs.status_kib(me, "NoSuchField", absent=0) == 0
    assert procfs.pss_kib(me) > 0
    assert procfs.pid_running(me)
