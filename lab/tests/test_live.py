"""keel stats / top / purge / profile against real processes running under Keel."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import keel
from keel_lab import live, livecmd

HOG = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* Each function keeps a known amount of memory alive, then the program waits. */
static char stats[1 << 16], line[256];
/* A counter from keel_stats_json (the library's own view, in-process), or -1. */
static long long counter(const char* name) {
  const char* p = strstr(stats, name);
  return p ? atoll(p + strlen(name) + 1) : -1; /* name is quoted; then ":" */
}
__attribute__((noinline)) void* grow_the_cache(int i) { return malloc(96 + i % 16); }
__attribute__((noinline)) void* load_the_index(void) { return malloc(200000); }
int main(int argc, char** argv) {
  static void* keep[400000];
  int k = 0;
  for (int i = 0; i < 300000; i++) { keep[k] = grow_the_cache(i); memset(keep[k++], 1, 96); } /* ~31 MB */
  for (int i = 0; i < 20; i++) { keep[k] = load_the_index(); memset(keep[k++], 2, 200000); }  /* 4 MB */
  /* churn that leaves nothing behind: freed memory the purge can return */
  for (int r = 0; r < 3; r++) {
    void* tmp[2000];
    for (int i = 0; i < 2000; i++) tmp[i] = malloc(5000);
    for (int i = 0; i < 2000; i++) free(tmp[i]);
  }
  /* holes: 1000-byte blocks, every other one freed; after a pause (the class has taken
     nothing for half the purge delay) 600-byte requests borrow them and 40-byte ones may
     carve them (docs/design.md "Borrowing", "Carving"), so the counters are not 0 */
  static void* holes[4000];
  for (int i = 0; i < 4000; i++) { holes[i] = malloc(1000); memset(holes[i], 3, 1000); }
  for (int i = 0; i < 4000; i += 2) free(holes[i]);
  usleep(700000);
  for (int i = 0; i < 2000; i++) { keep[k] = malloc(600); memset(keep[k++], 4, 600); }
  for (int i = 0; i < 2000; i++) { keep[k] = malloc(40); memset(keep[k++], 5, 40); }
  /* Keel's own counters as it sees them, without allocating (under another allocator
     there is no keel_stats_json: -1); then "ready" through write(), not stdio, whose
     buffer would be one more allocation after the figures were taken. */
  size_t (*json)(char*, size_t) = (size_t (*)(char*, size_t))dlsym(RTLD_DEFAULT, "keel_stats_json");
  if (json) json(stats, sizeof stats);
  int n = snprintf(line, sizeof line, "ready %d borrowed_blocks=%lld carved_holes=%lld\n", k,
                   counter("\"borrowed_blocks\""), counter("\"carved_holes\""));
  if (write(1, line, n) != n) return 1;
  sleep(atoi(argv[1]));
  return 0;
}
"""


@pytest.fixture
def hog(tmp_path, cc):
    src = tmp_path / "hog.c"
    src.write_text(HOG)
    exe = tmp_path / "hog"
    subprocess.run([cc, "-O1", "-g", "-fno-builtin", str(src), "-o", str(exe), "-ldl"], check=True)
    return exe


def start_under_keel(exe: Path, keel_path: str, extra_env: dict | None = None) -> subprocess.Popen:
    """Starts exe under Keel; its "ready ..." line is kept in p.ready_line."""
    env = dict(os.environ, LD_PRELOAD=keel_path, **(extra_env or {}))
    p = subprocess.Popen([str(exe), "30"], stdout=subprocess.PIPE, text=True, env=env)
    p.ready_line = p.stdout.readline()
    assert p.ready_line.startswith("ready"), p.ready_line
    time.sleep(1.5)  # Keel publishes its statistics after the first second
    return p


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_stats_json_and_top(hog, keel_path):
    p = start_under_keel(hog, keel_path)
    try:
        r = keel("stats", str(p.pid), "--json", check=True)
        s = json.loads(r.stdout)
        assert s["pid"] == p.pid
        # 300,000 blocks of 112 B and 20 of 256 KiB spans were allocated and kept.
        assert 30e6 < s["allocated"] < 45e6, s["allocated"]
        assert s["committed"] >= s["active"] >= s["allocated"] * 0.9
        assert s["rss_bytes"] >= s["allocated"]
        busiest = max(s["classes"], key=lambda c: c["blocks_in_use"] * c["block_size"])
        assert busiest["block_size"] == 112  # requests of 97..111 B (96 B has its own class)
        in_use = {c["block_size"]: c["blocks_in_use"] for c in s["classes"]}
        assert in_use.get(96, 0) + in_use[112] >= 299000
        # Lock counters (layout 3): 300,000 small blocks took the central locks thousands
        # of times; the page heap's lock at least once per slab.
        assert s["locks"]["central"]["acquired"] > 1000, s["locks"]
        assert 0 < s["locks"]["page heap"]["acquired"] < s["locks"]["central"]["acquired"]
        assert all(v["contended"] <= v["acquired"] for v in s["locks"].values())
        # layouts 7 and 8: the counters as published are the library's own (keel_stats_json
        # inside the process, just before "ready"; the program allocates nothing after)
        own = dict(kv.split("=") for kv in p.ready_line.split()[2:])
        assert int(own["borrowed_blocks"]) + int(own["carved_holes"]) > 0, (
            f"the hog no longer makes Keel borrow or carve ({own}): the comparison below "
            "would compare zeros")
        assert "borrowed_blocks" in s, "libkeel does not publish layout 7"
        assert "carved_holes" in s, "libkeel does not publish layout 8"
        assert "caches_taken_back" in s, "libkeel does not publish layout 9"
        assert "gathers" in s and "blocks_gathered" in s, "libkeel does not publish layout 10"
        assert s["borrowed_blocks"] == int(own["borrowed_blocks"]), (s["borrowed_blocks"], own)
        assert s["carved_holes"] == int(own["carved_holes"]), (s["carved_holes"], own)
        t = keel("top", str(p.pid), "--count", "2", "--interval", "0.3", check=True)
        assert t.stdout.count("busiest size classes") == 2 and "112 B" in t.stdout
        assert t.stdout.count("central lock") == 2
    finally:
        stop(p)


def test_purge_returns_memory(hog, keel_path):
    # A long purge delay keeps the freed churn memory committed until asked.
    p = start_under_keel(hog, keel_path, {"KEEL_PURGE_DELAY": "600000"})
    try:
        before = json.loads(keel("stats", str(p.pid), "--json", check=True).stdout)
        r = keel("purge", str(p.pid), check=True)
        assert "returned" in r.stdout
        after = json.loads(keel("stats", str(p.pid), "--json", check=True).stdout)
        assert after["purged_bytes"] > before["purged_bytes"]
        assert after["committed"] < before["committed"]
    finally:
        stop(p)


def test_profile_names_the_biggest_allocator(hog, keel_path, tmp_path):
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        pytest.skip("go is not installed (go tool pprof reads the profile)")
    p = start_under_keel(hog, keel_path, {"KEEL_PROFILE_RATE": "256K",
                                           "KEEL_PROFILE_PREFIX": str(tmp_path / "prof"),
                                           "KEEL_PROFILE_AT_EXIT": "0"})
    try:
        r = keel("profile", str(p.pid), check=True)
        path = r.stdout.strip()
        assert Path(path).is_file() and path.startswith(str(tmp_path))
        top = subprocess.run([go, "tool", "pprof", "-top", str(hog), path], capture_output=True,
                             text=True, timeout=120, env=dict(os.environ, HOME=str(tmp_path)))
        assert top.returncode == 0, top.stderr
        lines = [line for line in top.stdout.splitlines()
                 if line.strip().endswith(("grow_the_cache", "load_the_index"))]
        assert lines and lines[0].strip().endswith("grow_the_cache"), top.stdout
    finally:
        stop(p)


def test_profile_requires_profiling(hog, keel_path):
    p = start_under_keel(hog, keel_path)
    try:
        r = keel("profile", str(p.pid))
        assert r.returncode == 1 and "KEEL_PROFILE_RATE" in r.stderr
    finally:
        stop(p)


def test_profile_that_cannot_be_written_is_named(hog, keel_path, tmp_path):
    where = tmp_path / "no-such-dir" / "prof"
    p = start_under_keel(hog, keel_path, {"KEEL_PROFILE_RATE": "256K", "KEEL_PROFILE_PREFIX": str(where),
                                           "KEEL_PROFILE_AT_EXIT": "0"})
    try:
        r = keel("profile", str(p.pid))
        assert r.returncode == 1 and "could not write" in r.stderr and str(where) in r.stderr, r.stderr
    finally:
        stop(p)


def test_errors_are_clear(hog):
    r = keel("stats", "999999")
    assert r.returncode == 1 and "no process with PID 999999" in r.stderr
    p = subprocess.Popen([str(hog), "30"], stdout=subprocess.PIPE, text=True)  # not under Keel
    try:
        p.stdout.readline()
        r = keel("stats", str(p.pid))
        assert r.returncode == 1 and "not running Keel" in r.stderr
    finally:
        stop(p)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_stats_match_redis_used_memory(keel_path):
    """`keel stats PID` on a running Redis under Keel agrees with its INFO memory."""
    server = shutil.which("redis-server")
    if not server or not shutil.which("redis-cli"):
        pytest.skip("redis-server/redis-cli not installed: apt-get install redis-server redis-tools")
    port = free_port()
    d = tempfile.mkdtemp(prefix="keel-live-redis.")
    p = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", d],
                         env=dict(os.environ, LD_PRELOAD=keel_path),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cli = ["redis-cli", "-p", str(port)]
    try:
        for _ in range(100):
            if subprocess.run(cli + ["ping"], capture_output=True, text=True).stdout.strip() == "PONG":
                break
            time.sleep(0.1)
        # About 60 MB of data.
        subprocess.run(["redis-benchmark", "-p", str(port), "-t", "set", "-n", "200000",
                        "-r", "200000", "-d", "200", "-P", "32", "-q"], check=True,
                       capture_output=True, timeout=120)
        time.sleep(1.5)
        info = subprocess.run(cli + ["info", "memory"], capture_output=True, text=True).stdout
        used = int(next(line.split(":")[1] for line in info.splitlines()
                        if line.startswith("used_memory:")))
        s = json.loads(keel("stats", str(p.pid), "--json", check=True).stdout)
        # Redis counts used_memory with malloc_usable_size: the same blocks Keel counts.
        assert abs(s["allocated"] - used) <= 0.05 * used, (s["allocated"], used)
    finally:
        stop(p)
        shutil.rmtree(d, ignore_errors=True)


SPARSE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
/* 100,000 blocks of 1000 B (Keel's 1008 B class, 4 blocks a 4 KiB page), 9 in 10 freed
   at random: pages that hold one or two blocks in use, at random offsets. */
int main(int argc, char** argv) {
  static void* p[100000];
  srand(7);
  for (int i = 0; i < 100000; i++) p[i] = malloc(1000);
  for (int i = 0; i < 100000; i++) if (rand() % 10) { free(p[i]); p[i] = 0; }
  printf("ready\n");
  fflush(stdout);
  sleep(atoi(argv[1]));
  return 0;
}
"""


def test_stats_mesh_estimate(tmp_path, cc, keel_path):
    src, exe = tmp_path / "sparse.c", tmp_path / "sparse"
    src.write_text(SPARSE)
    subprocess.run([cc, "-O1", "-fno-builtin", str(src), "-o", str(exe)], check=True)
    # All classes from the start: the 1000-byte blocks are then all in the 1008 B class
    # (the first 4 MiB would otherwise go to the coarse 1024 B class).
    p = start_under_keel(exe, keel_path, {"KEEL_FINE_CLASSES": "0"})
    try:
        s = json.loads(keel("stats", str(p.pid), "--json", "--mesh", check=True).stdout)
        est = s["mesh_estimate"]
        row = next(r for r in est["classes"] if r["block_size"] == 1008)
        page = s["os_page_size"]
        # ~99 MiB of slabs, ~10 % in use: most pages are wholly free, and the rest hold
        # one or two blocks at random offsets, so nearly all candidates pair up.
        assert row["pages"] * page >= 95e6
        assert row["free_pages"] > 0.4 * row["pages"]
        assert row["candidates"] > 0 and row["pages"] >= row["free_pages"] + row["candidates"]
        assert 0.35 * row["candidates"] < row["pair_saved"] <= 0.5 * row["candidates"]
        assert row["pair_views"] == 2 * row["pair_saved"]
        assert row["group_saved"] >= row["pair_saved"]
        assert est["pair_saved_bytes"] >= row["pair_saved"] * page
        text = keel("stats", str(p.pid), "--mesh", check=True).stdout
        assert "meshing estimate" in text and "1008 B" in text
    finally:
        stop(p)


# ---- published layouts, from synthetic files -------------------------------------------
# Offsets written out from src/core/publish.c's keel_published_t (its _Static_asserts),
# not taken from keel_lab.live, so a slip in either shows.

def published_bytes(version: int, pid: int, mesh: tuple | None = None,
                    borrowed: int = 0, carved: int = 0, idle: int = 0, gathers: int = 0,
                    blocks_gathered: int = 0) -> bytearray:
    """A /dev/shm/keel-<pid> as a Keel of layout `version` writes it: two size classes,
    two locks, `answered` far ahead (a reader's request counts as answered at once),
    for layouts 5 to 7 keel_mesh_stats_t = `mesh` (state, barrier, then 11 counters)
    for layout 7 borrowed_blocks = `borrowed`, for 8 carved_holes = `carved`, for 9
    caches_taken_back = `idle` and for 10 `gathers` and `blocks_gathered`. Layout 6 has 127
    classes and 73 mesh rows, 5 had 120 and 72; 7 appends borrowed_blocks at 11136, 8
    carved_holes at 11144, 9 caches_taken_back at 11152, 10 gathers and blocks_gathered at
    11160 and 11168."""
    nlocks, mesh_stats = (5560, 11040) if version >= 6 else (5280, 10688)
    buf = bytearray(mesh_stats + (96 if version >= 5 else 0) + (8 if version >= 7 else 0) +
                    (8 if version >= 8 else 0) + (8 if version >= 9 else 0) + (16 if version >= 10 else 0))
    struct.pack_into("<QIIQ", buf, 0, live.MAGIC, version, 480, pid)
    struct.pack_into("<Q", buf, 32, 1 << 40)                 # answered
    struct.pack_into("<QQQ", buf, 56, 2, 123456, 0)           # seq (even), updated_ms, purged
    struct.pack_into("<I", buf, 352, 2)                       # nclasses
    stats = [7 << 20, 8 << 20, 1 << 20, 64 << 20, 10 << 20, 0, 1 << 19, 0, 3 << 20, 5, 2, 3,
             4096, 2 << 20]
    struct.pack_into("<II14Q", buf, 360, 0, 0, *stats)        # keel_stats_t
    struct.pack_into("<5Q", buf, 480, 1008, 4000, 100, 1100, 1100 * 65536)
    struct.pack_into("<5Q", buf, 520, 16, 50, 10, 1, 65536)
    if version >= 3:
        struct.pack_into("<I", buf, nlocks, 2)                # nlocks
        struct.pack_into("<6Q", buf, nlocks + 8, 1000, 10, 1, 200, 2, 0)
    if version >= 5:
        struct.pack_into("<II11Q", buf, mesh_stats, *mesh)
    if version >= 7:
        struct.pack_into("<Q", buf, 11136, borrowed)
    if version >= 8:
        struct.pack_into("<Q", buf, 11144, carved)
    if version >= 9:
        struct.pack_into("<Q", buf, 11152, idle)
    if version >= 10:
        struct.pack_into("<QQ", buf, 11160, gathers, blocks_gathered)
    return buf


MESH_ON = (1, 2, 40, 100, 21843, 40 * 4096, 60, 1, 7, 3, 2, 1_500_000, 250_000_000)


@pytest.fixture
def fake_published(tmp_path, monkeypatch):
    """Writes a synthetic statistics file for this test's own PID and points
    live.shm_path at it; returns the writer."""
    def write(buf: bytearray) -> int:
        path = tmp_path / f"keel-{os.getpid()}"
        path.write_bytes(bytes(buf))
        monkeypatch.setattr(live, "shm_path", lambda pid: path)
        return os.getpid()
    return write


@pytest.mark.parametrize("version", [5, 6, 7, 8])
def test_parse_mesh_stats(fake_published, version):
    assert live.LAYOUT_VERSION == 10 and set(live.LAYOUTS_READ) == {2, 3, 4, 5, 6, 7, 8, 9, 10}
    pid = fake_published(published_bytes(version, os.getpid(), MESH_ON))
    snap = live.read(pid, timeout=0.5)
    assert snap.layout == version
    assert snap.stats["allocated"] == 7 << 20 and snap.stats["os_page_size"] == 4096
    assert [c.block_size for c in snap.classes] == [1008, 16]
    assert snap.locks["central"]["acquired"] == 1000 and snap.locks["page heap"]["contended"] == 2
    assert snap.mesh_stats == {"state": 1, "barrier": 2, "groups": 40, "views": 100,
                               "view_limit": 21843, "file_bytes": 40 * 4096, "meshed": 60,
                               "failed": 1, "eroded": 7, "left": 3, "released": 2,
                               "longest_ns": 1_500_000, "busy_ns": 250_000_000}
    # the same figures from a plain buffer
    assert live._read_consistent(bytes(published_bytes(version, 42, MESH_ON)), 42).mesh_stats == snap.mesh_stats


@pytest.mark.parametrize("version", [2, 3, 4])
def test_older_layouts_still_read(fake_published, version):
    pid = fake_published(published_bytes(version, os.getpid()))
    snap = live.read(pid, timeout=0.5)
    assert snap.layout == version and snap.mesh_stats is None and snap.borrowed_blocks is None
    assert snap.stats["allocated"] == 7 << 20 and len(snap.classes) == 2
    assert bool(snap.locks) == (version >= 3)


@pytest.mark.parametrize("version", [5, 6, 7, 8])
def test_parse_borrowed_blocks(fake_published, version):
    pid = fake_published(published_bytes(version, os.getpid(), MESH_ON, borrowed=12345))
    snap = live.read(pid, timeout=0.5)
    assert snap.layout == version
    assert snap.borrowed_blocks == (12345 if version >= 7 else None)
    assert snap.mesh_stats["busy_ns"] == 250_000_000  # the field before it, unmoved
    # a layout-7 file cut short before the field: no figure rather than garbage
    short = bytes(published_bytes(7, 42, MESH_ON, borrowed=12345))[:-8]
    assert live._read_consistent(short, 42).borrowed_blocks is None


@pytest.mark.parametrize("version", [7, 8])
def test_parse_carved_holes(fake_published, version):
    pid = fake_published(published_bytes(version, os.getpid(), MESH_ON, borrowed=12345, carved=678))
    snap = live.read(pid, timeout=0.5)
    assert snap.layout == version and snap.borrowed_blocks == 12345  # the field before it, unmoved
    assert snap.carved_holes == (678 if version >= 8 else None)
    # a layout-8 file cut short before the field: no figure rather than garbage
    short = bytes(published_bytes(8, 42, MESH_ON, borrowed=12345, carved=678))[:-8]
    snap = live._read_consistent(short, 42)
    assert snap.carved_holes is None and snap.borrowed_blocks == 12345


def test_unknown_layout_refused(fake_published):
    pid = fake_published(published_bytes(11, os.getpid(), MESH_ON))
    with pytest.raises(live.LiveError, match="known layout"):
        live.read(pid, timeout=0.5)


def _stats_cmd(pid: int, as_json: bool) -> None:
    livecmd.cmd_stats(argparse.Namespace(pid=pid, json=as_json, mesh=False, classes=10))


def test_stats_shows_meshing(fake_published, capsys):
    pid = fake_published(published_bytes(6, os.getpid(), MESH_ON))
    _stats_cmd(pid, True)
    doc = json.loads(capsys.readouterr().out)
    ms = doc["mesh_stats"]
    assert ms["state_name"] == "on" and ms["barrier_name"] == "kernel"
    assert ms["views"] == 100 and ms["meshed"] == 60 and ms["longest_ns"] == 1_500_000
    _stats_cmd(pid, False)
    out = capsys.readouterr().out
    assert "meshing (KEEL_MESH=on" in out
    for text in ("kernel", "100 / 21,843", "60 pages (0.2 MiB)", "1.50 ms", "0.250 s"):
        assert text in out, (text, out)


@pytest.mark.parametrize("version,mesh", [(7, (0,) * 13), (6, (0,) * 13), (5, (0,) * 13), (4, None)])
def test_stats_without_meshing_unchanged(fake_published, capsys, version, mesh):
    pid = fake_published(published_bytes(version, os.getpid(), mesh))
    _stats_cmd(pid, True)
    assert "mesh_stats" not in json.loads(capsys.readouterr().out)
    _stats_cmd(pid, False)
    out = capsys.readouterr().out
    assert "busiest size classes" in out and "meshing" not in out


@pytest.mark.parametrize("version,field,key,row", [
    (7, "borrowed", "borrowed_blocks", ("borrowed", "12,345 blocks", "larger classes' slabs")),
    (8, "carved", "carved_holes", ("carved", "12,345 holes", "smaller blocks")),
    (9, "idle", "caches_taken_back", ("idle caches", "12,345 taken back", "waiting threads")),
    (10, "gathers", "gathers", ("gathers", "12,345 (0 blocks)", "other threads' bins"))])
def test_stats_shows_a_counter(fake_published, capsys, version, field, key, row):
    pid = fake_published(published_bytes(version, os.getpid(), (0,) * 13, **{field: 12345}))
    _stats_cmd(pid, True)
    assert json.loads(capsys.readouterr().out)[key] == 12345
    _stats_cmd(pid, False)
    out = capsys.readouterr().out
    assert all(text in out for text in row), out


@pytest.mark.parametrize("version,field,key,since", [
    (7, "borrowed", "borrowed_blocks", 7), (6, "borrowed", "borrowed_blocks", 7),
    (8, "carved", "carved_holes", 8), (7, "carved", "carved_holes", 8),
    (9, "idle", "caches_taken_back", 9), (8, "idle", "caches_taken_back", 9),
    (10, "gathers", "gathers", 10), (9, "gathers", "gathers", 10)])
def test_stats_without_a_counter(fake_published, capsys, version, field, key, since):
    # 0 (from the layout that has the counter on) is in the JSON but not the table; an
    # older layout has neither, whatever the bytes where it would be
    value = 0 if version >= since else 12345
    pid = fake_published(published_bytes(version, os.getpid(), (0,) * 13, **{field: value}))
    _stats_cmd(pid, True)
    doc = json.loads(capsys.readouterr().out)
    assert doc.get(key) == (0 if version >= since else None)
    _stats_cmd(pid, False)
    out = capsys.readouterr().out
    assert "busiest size classes" in out and field not in out


def test_suite_mesh_metrics(fake_published):
    from keel_lab.suites.base import mesh_stats_metrics, published_mesh_stats
    pid = fake_published(published_bytes(6, os.getpid(), MESH_ON))
    ms = published_mesh_stats(pid)
    assert mesh_stats_metrics(ms, "idle_1KiB") == {
        "mesh_pages_idle_1KiB": 60, "mesh_longest_ms_idle_1KiB": 1.5,
        "mesh_busy_s_idle_1KiB": 0.25, "mesh_eroded_idle_1KiB": 7,
        "mesh_file_kib_idle_1KiB": 160}
    assert mesh_stats_metrics(ms, None, ("views", "pages", "longest_ms")) == {
        "mesh_views": 100, "mesh_pages": 60, "mesh_longest_ms": 1.5}
    # meshing refused, off, a layout-4 Keel, or nothing published: nothing recorded
    assert mesh_stats_metrics({**ms, "state": 2}, "x") == {}
    assert mesh_stats_metrics(None, "x") == {}
    fake_published(published_bytes(4, os.getpid()))
    assert published_mesh_stats(pid) is None
    assert published_mesh_stats(999999999) is None


MESHY = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
/* 40,000 blocks of 1000 B (the 1008 B class, 4 a page), 7 in 10 freed at random:
   sparse pages that meshing can put together. */
int main(int argc, char** argv) {
  static void* p[40000];
  srand(11);
  for (int i = 0; i < 40000; i++) p[i] = malloc(1000);
  for (int i = 0; i < 40000; i++) if (rand() % 10 < 7) { free(p[i]); p[i] = 0; }
  printf("ready\n");
  fflush(stdout);
  sleep(atoi(argv[1]));
  return 0;
}
"""


def test_stats_show_meshing_of_a_real_process(tmp_path, cc, keel_path):
    src, exe = tmp_path / "meshy.c", tmp_path / "meshy"
    src.write_text(MESHY)
    subprocess.run([cc, "-O1", "-fno-builtin", str(src), "-o", str(exe)], check=True)
    p = start_under_keel(exe, keel_path, {"KEEL_MESH": "on", "KEEL_FINE_CLASSES": "0"})
    try:
        deadline = time.monotonic() + 10
        while True:
            ms = live.read(p.pid).mesh_stats
            assert ms is not None, "libkeel does not publish layout 5"
            if ms["state"] == live.MESH_STATE_REFUSED:
                pytest.skip("meshing refused here (needs /dev/userfaultfd: root, or "
                            "vm.unprivileged_userfaultfd=1)")
            if ms["views"] > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        s = json.loads(keel("stats", str(p.pid), "--json", check=True).stdout)
        m = s["mesh_stats"]
        assert m["state"] == 1 and m["state_name"] == "on", m
        assert m["views"] > 0 and m["meshed"] > 0 and m["groups"] > 0, m
        assert m["views"] <= m["view_limit"] and m["barrier"] in (1, 2)
        assert m["file_bytes"] >= m["groups"] * s["os_page_size"] // 2
        text = keel("stats", str(p.pid), check=True).stdout
        assert "meshing (KEEL_MESH=on" in text and "given back" in text
    finally:
        stop(p)


# ---- a process that exits between reads: one line, status 1 (offline) ------------------


@pytest.fixture
def short_lived(tmp_path, monkeypatch):
    """A child process with a synthetic statistics file of its own, and a live.read that
    makes the child exit right after a chosen read (as a real process may, between
    keel stats' or keel top's reads)."""
    child = subprocess.Popen(["sleep", "30"])
    path = tmp_path / f"keel-{child.pid}"
    path.write_bytes(bytes(published_bytes(8, child.pid, (0,) * 13)))
    monkeypatch.setattr(live, "shm_path", lambda pid: path)
    real_read = live.read
    reads: list[int] = []

    def read(pid, timeout=3.0):
        snap = real_read(pid, timeout)
        reads.append(pid)
        if len(reads) == child.exit_after_read:
            child.kill()
            child.wait()
        return snap
    monkeypatch.setattr(live, "read", read)
    child.exit_after_read = 1
    child.reads = reads
    yield child
    stop(child)


def _one_line(err: str, pid: int) -> None:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0] == (f"keel: error: process {pid} exited while its "
                                            "statistics were being read"), err


@pytest.mark.parametrize("as_json", [True, False])
def test_stats_when_the_process_exits_after_the_read(short_lived, capsys, as_json):
    rc = livecmd.cmd_stats(argparse.Namespace(pid=short_lived.pid, json=as_json, mesh=False,
                                              classes=10))
    assert rc == 1 and short_lived.reads == [short_lived.pid]
    out, err = capsys.readouterr()
    assert out == ""
    _one_line(err, short_lived.pid)


def test_top_when_the_process_exits_between_frames(short_lived, capsys):
    short_lived.exit_after_read = 2           # the second frame's read, before its RSS
    rc = livecmd.cmd_top(argparse.Namespace(pid=short_lived.pid, count=3, interval=0.01,
                                            classes=8))
    assert rc == 1 and len(short_lived.reads) == 2
    out, err = capsys.readouterr()
    assert out.count("busiest size classes") == 1      # the first frame was shown
    _one_line(err, short_lived.pid)


def test_rss_and_the_statistics_file_of_a_process_gone():
    p = subprocess.Popen(["true"])
    p.wait()
    with pytest.raises(live.LiveError, match=f"process {p.pid} exited"):
        live.rss_kib(p.pid)


def test_parse_gathers(fake_published, capsys):
    pid = fake_published(published_bytes(10, os.getpid(), MESH_ON, idle=3, gathers=2300, blocks_gathered=19_000))
    snap = live.read(pid, timeout=0.5)
    assert snap.caches_taken_back == 3  # the field before them, unmoved
    assert (snap.gathers, snap.blocks_gathered) == (2300, 19_000)
    _stats_cmd(pid, True)
    doc = json.loads(capsys.readouterr().out)
    assert (doc["gathers"], doc["blocks_gathered"]) == (2300, 19_000)
    # a layout-10 file cut short before the fields: no figures rather than garbage
    short = bytes(published_bytes(10, 42, MESH_ON, idle=3, gathers=2300, blocks_gathered=19_000))[:-8]
    snap = live._read_consistent(short, 42)
    assert snap.gathers is None and snap.blocks_gathered is None and snap.caches_taken_back == 3
