"""Real servers under real allocators, end to end through the suites, at a tiny size.

These start redis-server / mariadbd / postgres / searchd on 127.0.0.1 in throw-away
directories. They hold /tmp/keel-bench.lock (the lab's one-benchmark-at-a-time lock)
while they run, and skip if a benchmark keeps it busy for too long
(KEEL_TEST_LOCK_WAIT seconds, default 600). Each smoke test is sized to finish in well
under a minute on the 2-core machine.
"""
from __future__ import annotations

import fcntl
import os
import random
import signal
import socket
import tempfile
import time
from pathlib import Path

import pytest

from keel_lab import servers
from keel_lab.suites.base import SuiteError
from keel_lab.allocators import Allocator, AllocatorNotFound, find, parse
from keel_lab.procfs import descendants, pid_running
from keel_lab.servers import RedisServer, live_servers
from keel_lab.suites.base import SuiteContext

BUILD = Path(os.environ.get("KEEL_BUILD_DIR") or Path(__file__).resolve().parents[2] / "build")
LOCK = Path(tempfile.gettempdir()) / "keel-bench.lock"


def have(prog: str) -> bool:
    try:
        servers.which(prog, "x")
        return True
    except SuiteError:
        return False


need_redis = pytest.mark.skipif(not (have("redis-server") and have("redis-benchmark")),
                                reason="redis-server not installed: sudo apt-get install "
                                       "redis-server redis-tools")


@pytest.fixture(scope="module")
def bench_lock():
    """Holds the machine's benchmark lock for the module's tests."""
    wait = float(os.environ.get("KEEL_TEST_LOCK_WAIT", "600"))
    with open(LOCK, "a") as f:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.skip(f"{LOCK} is held by a running benchmark for more than {wait:.0f}s")
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def allocator(spec: str) -> Allocator:
    try:
        return parse(spec, BUILD)
    except AllocatorNotFound as e:
        pytest.skip(str(e))


_RECORDERS: list[Recorder] = []


@pytest.fixture(autouse=True)
def _servers_seen_at_stop(monkeypatch):
    """Every server stopped during a test tells that test's Recorders its pid, its
    descendants and its own directory just before it is stopped, so assert_nothing_left
    checks every server the test ran, also one that no progress message saw alive
    (Sphinx starts searchd after its progress message for the phase)."""
    real_stop = servers.Server.stop

    def stop(self, *a, **kw):
        if self.pid is not None and not self._stopped:
            for rec in _RECORDERS:
                rec.saw(self)
        return real_stop(self, *a, **kw)
    monkeypatch.setattr(servers.Server, "stop", stop)
    yield
    _RECORDERS.clear()


class Recorder:
    """A progress callback that remembers the pids of the servers running at each call
    (and can act on a message); with the autouse fixture above, also those of every
    server stopped while it exists."""

    def __init__(self, on=None):
        self.messages: list[str] = []
        self.pids: set[int] = set()              # running at a progress message
        self.stopped_pids: set[int] = set()      # servers and their descendants, at stop
        self.own_dirs: set[Path] = set()   # throw-away dirs the servers made themselves
        self.on = on
        _RECORDERS.append(self)

    @property
    def all_pids(self) -> set[int]:
        return self.pids | self.stopped_pids

    def saw(self, srv) -> None:
        self.stopped_pids.add(srv.pid)
        self.stopped_pids.update(descendants(srv.pid))
        if srv._own_dir and srv.dir:
            self.own_dirs.add(srv.dir)

    def __call__(self, message, fraction=None):
        self.messages.append(message)
        for s in live_servers():
            self.pids.add(s.pid)
            self.pids.update(descendants(s.pid))   # e.g. postgres' auxiliary processes
            if s._own_dir and s.dir:
                self.own_dirs.add(s.dir)
        if self.on:
            self.on(message)


def make_ctx(alloc: Allocator, tmp_path: Path, progress=None, **options) -> SuiteContext:
    options.setdefault("tiny", True)
    return SuiteContext(allocator=alloc, quick=True, workdir=tmp_path, options=options,
                        progress=progress or Recorder(), build_dir=BUILD)


def assert_nothing_left(pids, dirs=()) -> None:
    """pids: every process of the servers the test ran (Recorder.all_pids). For a test
    that started servers an empty set is a mistake, not a pass: it would check nothing."""
    pids = set(pids)
    assert pids, "no server process was recorded: nothing to check (no server started?)"
    assert live_servers() == []
    left = [p for p in pids if pid_running(p)]
    assert left == [], f"processes still running: {left}"
    kept = [d for d in dirs if Path(d).exists()]
    assert kept == [], f"throw-away dirs not removed: {kept}"


# --------------------------------------------------------------------------------------


def expected_frag_keys():
    """Keys held after redis-frag's fill, overwrite and delete in tiny mode, worked out
    from the suite's seeds."""
    from keel_lab.suites import redis as r
    keys, fill, over, _ = r.RedisFrag.SIZES["tiny"]
    rng = random.Random(r.FILL_SEED)
    held = {rng.randrange(keys) for _ in range(fill)}
    after_fill = len(held)
    for j in range(len(r.RedisFrag.OVERWRITE_SIZES)):
        rng = random.Random(r.OVERWRITE_SEED + j)
        held |= {rng.randrange(keys) for _ in range(over)}
    after_over = len(held)
    held -= set(random.Random(r.DELETE_SEED).sample(range(keys), keys // 2))
    return after_fill, after_over, len(held)


@need_redis
@pytest.mark.parametrize("alloc_name", ["glibc", "jemalloc", "keel", "keel+mesh"])
def test_redis_frag_tiny(alloc_name, tmp_path, bench_lock):
    from keel_lab.suites.redis import RedisFrag
    alloc = allocator(alloc_name)
    rec = Recorder()
    t = time.monotonic()
    res = RedisFrag().run(make_ctx(alloc, tmp_path, rec, idle_seconds=1))
    assert time.monotonic() - t < 60
    phases = res["phases"]
    names = [p["phase"] for p in phases]
    assert names == [f"{ph} {sz}" for sz in ("3B", "1KiB")
                     for ph in ("fill", "overwrite", "delete", "idle")]
    for p in phases:
        assert p["rss_kib"] > 1000 and p["used_memory_kib"] > 0 and p["frag"] > 0
        assert p["held_kib"] > 1000
    m = res["metrics"]
    for ph in ("fill", "overwrite", "delete", "idle"):
        for sz in ("3B", "1KiB"):
            held, rss = m[f"held_{ph}_kib_{sz}"], m[f"rss_{ph}_kib_{sz}"]
            assert 0 < m[f"pss_{ph}_kib_{sz}"] <= rss * 1.05
            if not m.get(f"mesh_views_{ph}_{sz}"):     # nothing meshed: held is VmRSS
                assert held == pytest.approx(rss, rel=0.05)
    assert m["held_final_kib"] == m["held_idle_kib_3B"] + m["held_idle_kib_1KiB"]
    # every allocator gets the same data: the key counts follow from the seeds alone
    assert {m[f"keys_{ph}_{sz}"] for sz in ("3B", "1KiB")
            for ph in ("fill", "overwrite", "delete")} == set(expected_frag_keys()), m
    if alloc_name != "keel+mesh":
        assert not any(k.startswith("mesh_views") for k in m)
    assert any("held_*_kib" in n for n in res["notes"])
    for sz in ("3B", "1KiB"):
        assert len(res["series"][f"rss_kib_{sz}"]) >= 3
        assert all(kib > 0 for _t, kib in res["series"][f"rss_kib_{sz}"])
        assert m[f"keys_delete_{sz}"] < m[f"keys_overwrite_{sz}"]
    # 1 KiB values take more memory than 3-byte ones
    assert m["rss_fill_kib_1KiB"] > m["rss_fill_kib_3B"]
    assert m["rss_peak_kib"] >= max(p["rss_kib"] for p in phases) * 0.9
    assert m["rss_final_kib"] > 0
    assert any("RSS" in n for n in res["notes"])
    if alloc_name == "glibc":   # redis links jemalloc itself: glibc is forced by preloading libc
        assert any("libc.so.6" in n for n in res["notes"])
    if alloc.is_keel:           # the meshing estimate, read from the live server
        for sz in ("3B", "1KiB"):
            assert 0 < m[f"mesh_est_groups_rss_kib_{sz}"] <= m[f"mesh_est_pairs_rss_kib_{sz}"] \
                <= m[f"rss_idle_kib_{sz}"]
    else:
        assert not any(k.startswith("mesh_est") for k in m)
    assert len(rec.pids) == 2   # a fresh server per value size
    assert_nothing_left(rec.all_pids)


@need_redis
def test_redis_ops_tiny(tmp_path, bench_lock):
    from keel_lab.suites.redis import RedisOps
    rec = Recorder()
    res = RedisOps().run(make_ctx(allocator("glibc"), tmp_path, rec))
    m = res["metrics"]
    assert m["throughput"] > 0
    for k in ("p50_ms", "p95_ms", "p99_ms", "rss_peak_kib", "rss_final_kib", "set_p16c50_rps",
              "lpop_c200_p99_ms"):
        assert m[k] is not None and m[k] > 0, k
    assert m["p50_ms"] <= m["p99_ms"]
    assert_nothing_left(rec.all_pids)


def test_missing_binary_clear_error(tmp_path, monkeypatch):
    from keel_lab.suites.redis import RedisFrag
    monkeypatch.setattr(RedisServer, "binary", "/nonexistent/redis-server")
    with pytest.raises(SuiteError, match=r"^redis-server not found: install it with "
                                         r"sudo apt-get install redis-server$"):
        RedisFrag().run(make_ctx(Allocator("glibc", None), tmp_path))
    with pytest.raises(SuiteError, match="redis-server not found"):
        RedisServer().start()
    assert live_servers() == []


def test_which_names_the_package():
    with pytest.raises(SuiteError, match="frobd not found: install it with sudo apt-get install frob"):
        servers.which("frobd", "frob")


def test_port_in_use_is_reported():
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(SuiteError, match=f"port {port} on 127.0.0.1 is in use"):
            servers.free_port(port)
        if have("redis-server"):
            with pytest.raises(SuiteError, match="is in use"):
                RedisServer(port=port).start()
        assert servers.free_port() != port
    finally:
        s.close()
    assert live_servers() == []


@need_redis
def test_server_killed_mid_run(tmp_path, bench_lock):
    """SIGKILL the server during the overwrite phase: SuiteError naming the death, with
    the log tail, and nothing left running."""
    from keel_lab.suites.redis import RedisFrag
    killed: list[int] = []

    def kill_at_overwrite(msg):
        if "overwrite" in msg and not killed:
            for s in live_servers():
                killed.append(s.pid)
                os.kill(s.pid, signal.SIGKILL)

    rec = Recorder(kill_at_overwrite)
    with pytest.raises(SuiteError) as ei:
        RedisFrag().run(make_ctx(allocator("glibc"), tmp_path, rec, idle_seconds=1))
    msg = str(ei.value)
    assert "redis-server" in msg and "died" in msg and "SIGKILL" in msg, msg
    assert "last" in msg and "lines of" in msg, msg     # the log tail
    assert killed
    assert_nothing_left(rec.all_pids | set(killed))


@need_redis
def test_interrupt_stops_the_server(tmp_path, bench_lock):
    """Ctrl-C (KeyboardInterrupt) in the middle of a run propagates, and the server is
    stopped on the way out."""
    from keel_lab.suites.redis import RedisFrag

    def interrupt(msg):
        if "delete" in msg:
            raise KeyboardInterrupt

    rec = Recorder(interrupt)
    with pytest.raises(KeyboardInterrupt):
        RedisFrag().run(make_ctx(allocator("glibc"), tmp_path, rec, idle_seconds=1))
    assert rec.pids
    assert_nothing_left(rec.all_pids)


@need_redis
def test_allocator_that_does_not_load_is_an_error(tmp_path):
    bogus = tmp_path / "libnotreally.so"
    bogus.write_text("not an ELF file\n")
    srv = RedisServer(Allocator("bogus", str(bogus)), workdir=tmp_path, startup_timeout=30)
    with pytest.raises(SuiteError, match="the allocator did not load"):
        srv.start()
    assert srv.pid is not None and not pid_running(srv.pid)
    assert live_servers() == []


@need_redis
def test_server_context_manager_and_idempotent_stop(tmp_path):
    with RedisServer(allocator("jemalloc"), workdir=tmp_path) as srv:
        pid = srv.pid
        assert srv.alive() and srv.rss_kib() > 0
        with srv.client() as c:
            assert c.command("SET", "a", "b") == "OK"
            assert c.command("GET", "a") == b"b"
        srv.check_alive()
    assert not pid_running(pid)
    assert srv.stop() == srv.returncode == 0      # idempotent, clean exit after SIGTERM
    with pytest.raises(SuiteError):
        srv.check_alive()
    assert live_servers() == []


@need_redis
def test_assert_nothing_left_checks_servers_no_message_saw(tmp_path):
    """The helper the smoke tests end with: a server that no progress message saw alive
    is still checked, and an empty set of pids fails instead of passing."""
    rec = Recorder()
    with RedisServer(allocator("glibc"), workdir=tmp_path) as srv:
        pid = srv.pid
    assert rec.pids == set() and rec.all_pids == {pid}
    assert_nothing_left(rec.all_pids)
    with pytest.raises(AssertionError, match="no server process was recorded"):
        assert_nothing_left(set())


# --------------------------------------------------------------------------------------
# one small sweep point of the database suites


@pytest.mark.skipif(not (have("mariadbd") and have("sysbench") and have("mariadb-install-db")),
                    reason="sudo apt-get install mariadb-server mariadb-client sysbench")
def test_mariadb_smoke(tmp_path, bench_lock):
    from keel_lab.suites.mariadb import MariaDB
    rec = Recorder()
    t = time.monotonic()
    res = MariaDB().run(make_ctx(allocator("glibc"), tmp_path, rec))
    assert time.monotonic() - t < 60
    (pt,) = res["points"]
    assert pt["x"] == 4 and pt["throughput"] > 0 and pt["p95_ms"] > 0 and pt["rss_kib"] > 10000
    assert 0 < pt["cpu_us_per_txn"] < 1e6
    m = res["metrics"]
    assert m["insert_tps"] > 0 and m["rss_peak_kib"] >= pt["rss_kib"] and m["rss_final_kib"] > 0
    assert res["x_label"] == "threads"
    assert_nothing_left(rec.all_pids)


@pytest.mark.skipif(not (have("mariadbd") and have("sysbench") and have("mariadb-install-db")),
                    reason="sudo apt-get install mariadb-server mariadb-client sysbench")
def test_mariadb_pool_smoke(tmp_path, bench_lock):
    from keel_lab.suites.mariadb import MariaDBPool
    rec = Recorder()
    alloc = find("keel", BUILD) if (BUILD / "libkeel.so").is_file() else allocator("glibc")
    res = MariaDBPool().run(make_ctx(alloc, tmp_path, rec, idle_seconds=1.5))
    m = res["metrics"]
    assert m["tps_cycle1"] > 0 and m["rss_busy_kib_cycle1"] > 10000
    assert m["rss_final_kib"] == m["rss_idle_kib_cycle1"] > 10000
    assert m["rss_peak_kib"] >= m["rss_final_kib"] * 0.9
    assert [p["phase"] for p in res["phases"]] == ["prepare", "busy 1", "idle 1"]
    assert m["held_final_kib"] == m["held_idle_kib_cycle1"] == res["phases"][2]["held_kib"]
    assert m["held_final_kib"] == pytest.approx(m["rss_final_kib"], rel=0.05)   # no meshing
    assert 0 < m["pss_idle_kib_cycle1"] <= m["rss_idle_kib_cycle1"] * 1.05
    if alloc.is_keel:
        assert 0 < m["mesh_est_pairs_rss_kib_final"] <= m["rss_final_kib"]
    assert_nothing_left(rec.all_pids)


@pytest.mark.skipif(not (have("mariadbd") and have("sysbench") and have("valgrind")),
                    reason="sudo apt-get install mariadb-server sysbench valgrind")
def test_mariadb_cachesim_smoke(tmp_path, bench_lock):
    """mariadbd under callgrind: exactly the counted transactions, per-transaction counts
    of a plausible size, the allocator's share found in its own library."""
    from keel_lab.suites.mariadb import MariaDBCacheSim
    rec = Recorder()
    alloc = find("keel", BUILD) if (BUILD / "libkeel.so").is_file() else allocator("glibc")
    res = MariaDBCacheSim().run(make_ctx(alloc, tmp_path, rec))
    m = res["metrics"]
    assert m["transactions"] == 100
    # an oltp_read_only transaction is 14 statements: a million instructions or more
    assert 3e5 < m["ir_per_txn"] < 3e7
    assert 0 < m["ll_miss_per_txn"] < m["d1_miss_per_txn"] < m["ir_per_txn"] / 10
    assert 0 < m["i1_miss_per_txn"]
    # the allocator runs, and is a small part of the server's work
    assert 100 < m["alloc_ir_per_txn"] < m["ir_per_txn"] / 10
    assert_nothing_left(rec.all_pids)


@pytest.mark.skipif(servers.pg_bindir() is None, reason="sudo apt-get install postgresql")
def test_postgres_smoke(tmp_path, bench_lock):
    from keel_lab.suites.postgres import Postgres
    rec = Recorder()
    alloc = find("keel", BUILD) if (BUILD / "libkeel.so").is_file() else allocator("glibc")
    t = time.monotonic()
    res = Postgres().run(make_ctx(alloc, tmp_path, rec))
    assert time.monotonic() - t < 60
    (pt,) = res["points"]
    assert pt["x"] == 4
    for k in ("throughput", "mean_ms", "rss_kib", "anon_kib", "tpcb_throughput", "tpcb_rss_kib",
              "cpu_us_per_txn", "tpcb_cpu_us_per_txn"):
        assert pt[k] and pt[k] > 0, k
    m = res["metrics"]
    assert m["rss_peak_kib"] >= pt["rss_kib"] and m["rss_final_kib"] > 0
    assert rec.own_dirs     # postgres keeps its cluster in its own dir (the server user must reach it)
    assert_nothing_left(rec.all_pids, rec.own_dirs)


@pytest.mark.skipif(not (have("searchd") and have("indexer")),
                    reason="sudo apt-get install sphinxsearch")
def test_sphinx_smoke(tmp_path, bench_lock):
    from keel_lab.suites.sphinx import Sphinx
    rec = Recorder()
    t = time.monotonic()
    res = Sphinx().run(make_ctx(allocator("glibc"), tmp_path, rec))
    assert time.monotonic() - t < 60
    m = res["metrics"]
    assert m["thp_on_errors"] == 0 and m["thp_off_errors"] == 0
    assert any("THP_enabled" in n and "off=0" in n for n in res["notes"])
    for mode in ("on", "off"):
        assert m[f"thp_{mode}_qps"] > 0 and m[f"thp_{mode}_queries"] > 10
        assert m[f"thp_{mode}_p50_ms"] <= m[f"thp_{mode}_p99_ms"]
        assert res["series"][f"rss_kib_thp_{mode}"]
    assert m["throughput"] == m["thp_on_qps"] and m["rss_peak_kib"] > 0
    assert m["thp_off_rss_idle_kib"] > 0 and "thp_off_keel_final_allocated_kib" not in m
    assert_nothing_left(rec.all_pids)


def test_sphinx_thp_on_keeps_a_variants_own_policy():
    """THP 'on' runs Keel under KEEL_THP=dense, its THP-aware mode, unless the variant sets
    its own (issue 33: a variant's setting once showed the suite's figures instead);
    'off' is always never, 'always' always."""
    from keel_lab.allocators import Allocator
    from keel_lab.suites.sphinx import keel_thp_for
    plain = Allocator("keel", "/x/libkeel.so")
    always = Allocator("keel+KEEL_THP=always", "/x/libkeel.so", (("KEEL_THP", "always"),))
    assert keel_thp_for(plain, "on") == "dense"
    assert keel_thp_for(always, "on") is None          # the variant's always stands
    assert always.env({})["KEEL_THP"] == "always"
    assert keel_thp_for(always, "off") == "never"
    assert keel_thp_for(always, "dense") == "dense"
    assert keel_thp_for(plain, "always") == "always"
    assert keel_thp_for(Allocator("glibc", None), "on") == "dense"


def test_sphinx_thp_dense_under_keel(tmp_path, bench_lock):
    """thp=dense: one searchd, under KEEL_THP=dense; a mode the suite does not know is
    refused before anything starts."""
    from keel_lab.suites.sphinx import Sphinx, THP_MODES
    assert THP_MODES == {"on": "dense", "off": "never", "dense": "dense", "always": "always"}
    rec = Recorder()
    res = Sphinx().run(make_ctx(allocator("keel"), tmp_path, rec, thp="dense"))
    m = res["metrics"]
    assert m["thp_dense_errors"] == 0 and m["thp_dense_qps"] > 0
    assert "thp_on_qps" not in m and m["throughput"] == m["thp_dense_qps"]
    # Keel's own figures beside RSS, as the clients stop and once idle (the breakdown)
    for when in ("final", "idle"):
        assert m[f"thp_dense_keel_{when}_allocated_kib"] > 0
        assert m[f"thp_dense_keel_{when}_committed_kib"] >= m[f"thp_dense_keel_{when}_allocated_kib"]
    assert m["thp_dense_rss_idle_kib"] > 0
    assert any("'on' = that setting plus KEEL_THP=dense" in n for n in res["notes"])
    with pytest.raises(SuiteError, match="use on, off, dense, always"):
        Sphinx().run(make_ctx(allocator("keel"), tmp_path, rec, thp="sometimes"))
    assert_nothing_left(rec.all_pids)
