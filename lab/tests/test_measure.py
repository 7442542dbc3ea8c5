import itertools
import os
import subprocess
import sys
import time

import pytest

from keel_lab.measure import (RssSampler, geomean, latency_summary, memory_held_kib,
                              mesh_views, percentile, spread)
from keel_lab.procfs import proc_kib, pss_kib, rss_kib, tree_kib


def test_percentiles_match_numpy_linear():
    xs = list(range(1, 101))          # 1..100
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 95) == pytest.approx(95.05)
    assert percentile(xs, 99) == pytest.approx(99.01)
    assert percentile([7], 99) == 7
    assert percentile([], 50) is None


def test_latency_summary():
    s = latency_summary([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["mean_ms"] == 22.0
    assert s["p50_ms"] == 3.0
    assert s["p99_ms"] == pytest.approx(96.16)
    assert s["max_ms"] == 100.0 and s["count"] == 5
    assert latency_summary([]) == {}


def test_spread_and_geomean():
    assert spread([10, 11, 9]) == pytest.approx(0.2)
    assert spread([5]) == 0.0
    assert geomean([1, 4]) == pytest.approx(2.0)
    assert geomean([]) is None


def test_rss_sampler_sees_a_child_grow_and_gives_peak_and_final():
    code = ("import time; time.sleep(0.3); b = bytearray(64 * 1024 * 1024); "
            "b[::4096] = b'x' * len(b[::4096]); time.sleep(0.6); del b; time.sleep(0.5)")
    # a launcher shell whose child does the work: children=True must add it in
    p = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "{code}"; true'])
    try:
        with RssSampler(p.pid, interval=0.1, children=True) as s:
            p.wait(timeout=30)
        assert s.peak_kib is not None and s.peak_kib > 60 * 1024, s.series
        assert len(s.series) >= 5
        assert s.series[0][0] <= s.series[-1][0]
        r = s.result()
        assert r["rss_peak_kib"] == s.peak_kib and r["rss_final_kib"] == s.final_kib
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_rss_of_missing_process_is_none():
    p = subprocess.Popen(["true"])
    p.wait()
    assert rss_kib(p.pid) is None
    assert tree_kib(p.pid) is None
    s = RssSampler(p.pid, interval=0.05).start()
    time.sleep(0.2)
    s.stop()
    assert s.peak_kib is None


def test_rss_sampler_samples_itself_at_start_and_stop():
    with RssSampler(os.getpid(), interval=0.05) as s:
        assert len(s.series) == 1                 # start() samples at once
        time.sleep(0.3)
    n = len(s.series)
    assert n >= 4                                 # ... and stop() once more
    assert s.peak_kib >= s.series[0][1] > 0 and s.final_kib == s.series[-1][1]
    assert all(b[0] >= a[0] for a, b in itertools.pairwise(s.series))
    s.stop()                                      # idempotent: no further sample
    assert len(s.series) == n


def test_rss_sampler_field_and_fn():
    me = os.getpid()
    with RssSampler(me, interval=0.05, field="RssAnon") as anon:
        time.sleep(0.1)
    assert anon.peak_kib is not None and 0 < anon.peak_kib <= rss_kib(me) * 1.5
    values = iter([5, None, 7])

    def fn():
        v = next(values, None)
        if v == 7:
            raise ProcessLookupError               # an exception is no sample
        return v
    s = RssSampler(fn=fn, interval=0.02, t0=time.monotonic() - 10).start()
    time.sleep(0.2)
    s.stop()
    assert [k for _, k in s.series] == [5] and s.series[0][0] >= 10    # t from the t0 given
    with pytest.raises(ValueError, match="a pid or a fn"):
        RssSampler()


# -- memory held, Keel's meshing -------------------------------------------------------


def test_memory_held_without_meshing_is_vmrss():
    pid = os.getpid()
    held, rss, pss = memory_held_kib(pid), rss_kib(pid), pss_kib(pid)
    assert held is not None and rss is not None and pss is not None
    assert held == pytest.approx(rss, rel=0.03)
    assert 0 < pss <= rss * 1.03
    assert mesh_views(pid) == 0


def test_memory_held_of_missing_process():
    p = subprocess.Popen(["true"])
    p.wait()
    assert memory_held_kib(p.pid) is None and pss_kib(p.pid) is None
    assert mesh_views(p.pid) == 0


# A child that does by hand what Keel's meshing does: PAGES pages written into a memfd,
# each mapped MAP_PRIVATE by VIEWS views that all read every page (RssShmem counts each
# page VIEWS times), then COW pages of the first view written (now anonymous). A memfd
# of another name, mapped twice, stands for other shared memory, which must stay counted.
VIEWS_CHILD = r"""
import mmap, os, sys, time
name, views_n, pages, cow, other = sys.argv[1], *map(int, sys.argv[2:6])
P = mmap.PAGESIZE
fd = os.memfd_create(name)
os.write(fd, b"\1" * (pages * P))
views = [mmap.mmap(fd, pages * P, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
         for _ in range(views_n)]
s = sum(v[i] for v in views for i in range(0, pages * P, P))
for i in range(0, cow * P, P):
    views[0][i] = 2
if other:
    ofd = os.memfd_create("someone-else")
    os.write(ofd, b"\3" * (other * P))
    others = [mmap.mmap(ofd, other * P, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
              for _ in range(2)]
    s += sum(o[i] for o in others for i in range(0, other * P, P))
print("ready", s, flush=True)
time.sleep(60)
"""


def _views_child(name: str, views: int, pages: int, cow: int, other: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", VIEWS_CHILD, name, str(views), str(pages),
                          str(cow), str(other)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith("ready")
    return p


def test_memory_held_counts_a_mesh_memfd_once_and_keeps_other_shared_memory():
    views, pages, cow, other = 3, 2048, 100, 512
    page_kib = os.sysconf("SC_PAGE_SIZE") // 1024
    p = _views_child("keel-mesh", views, pages, cow, other)
    try:
        status = f"/proc/{p.pid}/status"
        rss, shmem = rss_kib(p.pid), proc_kib(status, "RssShmem")
        held = memory_held_kib(p.pid)
        assert mesh_views(p.pid) == views
        # RssShmem: every view's unwritten pages, and the other memfd twice
        assert shmem == pytest.approx(((views * pages - cow) + 2 * other) * page_kib, abs=256)
        # held: the views' pages replaced by the memfd once; the copies and the other
        # memfd stay
        expect = rss - (views * pages - cow) * page_kib + pages * page_kib
        assert held == pytest.approx(expect, abs=512)
        assert pss_kib(p.pid) is not None
    finally:
        p.kill()
        p.wait()


def test_memory_held_ignores_memfds_of_other_names():
    p = _views_child("not-keel", 3, 1024, 0, 0)
    try:
        assert mesh_views(p.pid) == 0
        assert memory_held_kib(p.pid) == pytest.approx(rss_kib(p.pid), rel=0.02)
    finally:
        p.kill()
        p.wait()


def test_memory_held_without_map_files_reads_the_open_memfd(monkeypatch):
    # /proc/PID/map_files needs CAP_SYS_ADMIN: without it the memfd is found by its fd
    from keel_lab import measure
    p = _views_child("keel-mesh", 2, 1024, 0, 0)
    try:
        full = memory_held_kib(p.pid)
        real_stat = os.stat

        def no_map_files(path, *a, **kw):
            if "/map_files/" in str(path):
                raise PermissionError(1, "Operation not permitted", path)
            return real_stat(path, *a, **kw)

        monkeypatch.setattr(measure.os, "stat", no_map_files)
        assert memory_held_kib(p.pid) == pytest.approx(full, abs=256)
    finally:
        p.kill()
        p.wait()


SPARSE_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* 200,000 blocks of 64 B, 7 in 8 of them freed at random: sparse pages for meshing. */
int main(int argc, char** argv) {
  int n = 200000;
  void** keep = malloc(sizeof(void*) * n);
  for (int i = 0; i < n; i++) { keep[i] = malloc(64); memset(keep[i], 1, 64); }
  srand(42);
  for (int i = 0; i < n; i++) if (rand() % 8) { free(keep[i]); keep[i] = NULL; }
  printf("ready\n");
  fflush(stdout);
  sleep(atoi(argv[1]));
  return 0;
}
"""


def test_memory_held_under_keel_mesh(tmp_path, cc, keel_path):
    from keel_lab.allocators import parse
    from keel_lab.paths import default_build_dir
    src, exe = tmp_path / "sparse.c", tmp_path / "sparse"
    src.write_text(SPARSE_C)
    subprocess.run([cc, "-O1", "-fno-builtin", str(src), "-o", str(exe)], check=True)
    alloc = parse("keel+mesh", default_build_dir())
    p = subprocess.Popen([str(exe), "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=alloc.env())
    try:
        assert p.stdout.readline().startswith("ready")

        def memfd_kib() -> int:
            for fd in os.listdir(f"/proc/{p.pid}/fd"):
                if os.readlink(f"/proc/{p.pid}/fd/{fd}") == "/memfd:keel-mesh (deleted)":
                    return os.stat(f"/proc/{p.pid}/fd/{fd}").st_blocks // 2
            return 0

        # wait for meshing to start, then to settle (the purger meshes a batch per tick)
        deadline, last = time.monotonic() + 20, (-1, -1)
        while time.monotonic() < deadline:
            now = (mesh_views(p.pid), memfd_kib())
            if now[0] and now == last:
                break
            last = now
            time.sleep(0.5)
        if mesh_views(p.pid) == 0:
            p.kill()
            pytest.skip("Keel did not mesh within 20 s (meshing refused here?): "
                        + p.communicate()[1][-500:])
        status = f"/proc/{p.pid}/status"
        for _ in range(10):     # a reading between two ticks of the purger
            before = memfd_kib()
            anon, file_ = proc_kib(status, "RssAnon"), proc_kib(status, "RssFile")
            held, rss = memory_held_kib(p.pid), rss_kib(p.pid)
            if memfd_kib() == before:
                break
            time.sleep(0.3)
        assert before > 0 and held is not None
        # the memfd once, the private memory, and none of the views' copies of it
        assert anon + file_ + before - 256 <= held <= rss + before + 256
    finally:
        p.kill()
        p.wait()
