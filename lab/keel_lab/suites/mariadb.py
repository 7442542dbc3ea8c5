"""MariaDB under sysbench: oltp_read_only across a thread sweep (one server thread per
connection, so many threads means many per-thread allocator caches), then oltp_insert."""
from __future__ import annotations

import glob
import os
import re
import subprocess

from .. import cachesim, procfs
from .. import servers as sv
from ..measure import RssSampler, geomean
from .base import (HELD_NOTE, MESH_STATS_NOTE, Suite, SuiteContext, SuiteError, cpu_us_per_txn,
                   held_metrics, mesh_estimate_metrics, mesh_stats_metrics, opt_env, opt_float,
                   opt_list, published_mesh_stats, size_mode)


def parse_sysbench(text: str) -> dict:
    """TPS, latency (ms) and error counts from sysbench 1.0's final report."""
    out: dict = {}
    m = re.search(r"transactions:\s+(\d+)\s+\(([\d.]+) per sec", text)
    if m:
        out["transactions"] = int(m.group(1))
        out["tps"] = float(m.group(2))
    m = re.search(r"queries:\s+(\d+)\s+\(([\d.]+) per sec", text)
    if m:
        out["qps"] = float(m.group(2))
    for key, pat in (("errors", r"ignored errors:\s+(\d+)"), ("reconnects", r"reconnects:\s+(\d+)")):
        m = re.search(pat, text)
        if m:
            out[key] = int(m.group(1))
    lat = text.split("Latency (ms):", 1)
    if len(lat) == 2:
        for key, pat in (("min_ms", r"min:\s+([\d.]+)"), ("mean_ms", r"avg:\s+([\d.]+)"),
                         ("max_ms", r"max:\s+([\d.]+)"),
                         ("p95_ms", r"95th percentile:\s+([\d.]+)")):
            m = re.search(pat, lat[1])
            if m:
                out[key] = float(m.group(1))
    return out


def check_mariadb_and_sysbench() -> None:
    """SuiteError naming the package of the first missing program the suites run."""
    sv.which(sv.MariaDBServer.binary, sv.MariaDBServer.package)
    sv.which("mariadb-install-db", "mariadb-server")
    sv.which("mariadb", "mariadb-client")
    sv.which("sysbench", "sysbench")


def start_and_prepare(srv: sv.MariaDBServer, ctx: SuiteContext, result: dict, tables: int,
                      rows: int) -> list[str]:
    """Starts the server, creates sysbench's database and user, fills `tables` tables of
    `rows` rows; returns the sysbench command line up to the test name's place
    ([sysbench, connection and table options...])."""
    ctx.progress("mariadb-install-db and start", 0.0)
    srv.start()
    result["notes"] += srv.notes
    srv.sql("CREATE DATABASE sbtest; "
            "CREATE USER 'sbtest'@'127.0.0.1' IDENTIFIED BY 'sbtest'; "
            "GRANT ALL PRIVILEGES ON sbtest.* TO 'sbtest'@'127.0.0.1';")
    sb = [sv.which("sysbench", "sysbench"), "--db-driver=mysql", "--mysql-host=127.0.0.1",
          f"--mysql-port={srv.port}", "--mysql-user=sbtest", "--mysql-password=sbtest",
          "--mysql-db=sbtest", f"--tables={tables}", f"--table-size={rows}"]
    ctx.progress(f"sysbench prepare ({tables} x {rows} rows)", 0.05)
    sv.run_client([sb[0], "oltp_read_only", *sb[1:], f"--threads={min(tables, 4)}", "prepare"],
                  servers=[srv], timeout=1800, what="sysbench prepare")
    return sb


class MariaDB(Suite):
    """One mariadbd (fresh datadir from mariadb-install-db), one sysbench prepare, then
    oltp_read_only at each thread count (points: x = threads) and oltp_insert.
    Options (--set mariadb.KEY=VALUE): threads=1,8,64, seconds, extra_env, tiny."""

    name = "mariadb"
    description = ("MariaDB (mariadbd) under sysbench oltp_read_only across 1-256 threads, "
                   "and oltp_insert: TPS, p95 latency, server RSS")
    needs_packages = ("mariadb-server", "mariadb-client", "sysbench")

    SIZES = {
        # tables, rows per table, read-only thread sweep, seconds per point,
        # insert threads, insert seconds, buffer pool
        "full": (4, 100_000, (1, 2, 4, 8, 16, 32, 64, 128, 256), 30, 16, 60, "256M"),
        "quick": (2, 10_000, (1, 8, 64, 256), 5, 8, 5, "128M"),
        "tiny": (1, 2_000, (4,), 3, 4, 2, "64M"),
    }

    def check(self, ctx: SuiteContext) -> None:
        check_mariadb_and_sysbench()

    def run(self, ctx: SuiteContext) -> dict:
        self.check(ctx)
        mode = size_mode(ctx)
        tables, rows, sweep, secs, ins_threads, ins_secs, pool = self.SIZES[mode]
        sweep = opt_list(ctx, "threads", sweep)
        secs = int(opt_float(ctx, "seconds", secs))
        result: dict = {"metrics": {}, "points": [], "x_label": "threads", "notes": []}
        m = result["metrics"]
        srv = sv.MariaDBServer(ctx.allocator, workdir=ctx.workdir, buffer_pool=pool,
                               max_connections=max(sweep) + 44, extra_env=opt_env(ctx))
        try:
            sb = start_and_prepare(srv, ctx, result, tables, rows)
            m["rss_after_prepare_kib"] = srv.rss_kib()

            total = len(sweep) + 1
            with RssSampler(srv.pid, interval=0.25) as whole:
                for i, threads in enumerate(sweep):
                    ctx.progress(f"oltp_read_only, {threads} threads, {secs}s", 0.1 + 0.9 * i / total)
                    cpu0 = procfs.cpu_seconds(srv.run_pid)
                    with RssSampler(srv.pid, interval=0.2) as samp:
                        res = self._run(srv, [sb[0], "oltp_read_only", *sb[1:]], threads, secs,
                                        f"sysbench oltp_read_only --threads={threads}")
                    cpu = cpu_us_per_txn(cpu0, procfs.cpu_seconds(srv.run_pid), res.get("tps"), secs)
                    point = {"x": threads, "throughput": res.get("tps"), "p95_ms": res.get("p95_ms"),
                             "mean_ms": res.get("mean_ms"), "rss_kib": srv.rss_kib(),
                             "rss_peak_kib": samp.peak_kib, "cpu_us_per_txn": cpu}
                    m[f"cpu_us_per_txn_ro_t{threads}"] = cpu
                    result["points"].append(point)
                    m[f"ro_tps_t{threads}"] = res.get("tps")
                    m[f"ro_p95_ms_t{threads}"] = res.get("p95_ms")
                    m[f"ro_rss_kib_t{threads}"] = point["rss_kib"]

                ctx.progress(f"oltp_insert, {ins_threads} threads, {ins_secs}s", 0.1 + 0.9 * len(sweep) / total)
                res = self._run(srv, [sb[0], "oltp_insert", *sb[1:]], ins_threads, ins_secs,
                                f"sysbench oltp_insert --threads={ins_threads}")
                m["insert_tps"] = res.get("tps")
                m["insert_p95_ms"] = res.get("p95_ms")
                m["insert_mean_ms"] = res.get("mean_ms")
            srv.check_alive("the run")
            tps = [p["throughput"] for p in result["points"]]
            m["throughput"] = geomean(tps)
            m["p95_ms"] = geomean([p["p95_ms"] for p in result["points"]])
            m["mean_ms"] = geomean([p["mean_ms"] for p in result["points"]])
            m["rss_peak_kib"] = whole.peak_kib
            m["rss_final_kib"] = whole.final_kib
            result["series"] = {"rss_kib": whole.series}
            result["notes"].append(
                f"size {mode}: {tables} tables x {rows} rows, oltp_read_only at "
                f"{', '.join(map(str, sweep))} threads for {secs}s each (one server start, one "
                f"prepare), then oltp_insert with {ins_threads} threads for {ins_secs}s; "
                f"innodb_buffer_pool_size={pool}, no binlog, flush_log_at_trx_commit=0. "
                "throughput / p95_ms / mean_ms are geometric means over the read-only sweep; "
                "points: rss_kib after each point, rss_peak_kib during it.")
        finally:
            srv.stop(timeout=60)
        return result

    @staticmethod
    def _run(srv: sv.MariaDBServer, argv: list[str], threads: int, secs: int, what: str) -> dict:
        out = sv.run_client([*argv, f"--threads={threads}", f"--time={secs}", "--percentile=95",
                          "--report-interval=0", "run"],
                         servers=[srv], timeout=secs + 300, what=what)
        res = parse_sysbench(out)
        if "tps" not in res:
            raise SuiteError(f"{what}: no transactions in sysbench's output:\n{out[-2000:]}")
        if res.get("reconnects"):
            raise SuiteError(f"{what}: {res['reconnects']} reconnects (did mariadbd restart?)")
        return res




class MariaDBPool(Suite):
    """Server memory after a connection pool goes away, the pattern behind "MariaDB's
    RSS only grows": one mariadbd, one sysbench prepare, then `cycles` times a pool of
    `threads` connections runs oltp_read_write (range sorts, DISTINCT, updates, deletes,
    inserts: per-connection and per-query memory) for `seconds` and disconnects, and the
    server idles for `idle_seconds`. RSS after prepare, peak during each cycle, and after
    each idle (there also held_idle_kib_cycleN, meshed pages counted once: the one to
    compare under keel+mesh, pss_idle_kib_cycleN and mesh_views_idle_cycleN); under Keel
    also what meshing could give back after the last idle
    (keel stats --mesh; docs/meshing.md), and while it meshes what meshing did so far
    (mesh_pages_idle_cycleN, mesh_longest_ms_, mesh_busy_s_, mesh_eroded_, mesh_file_kib_:
    its published statistics). Options (--set mariadb-pool.KEY=VALUE):
    threads, seconds, idle_seconds, cycles, extra_env, tiny."""

    name = "mariadb-pool"
    description = ("MariaDB RSS after pools of connections ran read-write work and went away "
                   "(idle RSS per cycle)")
    needs_packages = ("mariadb-server", "mariadb-client", "sysbench")

    SIZES = {
        # tables, rows per table, pool threads, seconds of work, idle seconds, cycles, buffer pool
        "full": (4, 100_000, 256, 30, 15.0, 2, "256M"),
        "quick": (2, 10_000, 128, 8, 5.0, 2, "128M"),
        "tiny": (1, 2_000, 8, 2, 1.0, 1, "64M"),
    }

    def check(self, ctx: SuiteContext) -> None:
        check_mariadb_and_sysbench()

    def run(self, ctx: SuiteContext) -> dict:
        self.check(ctx)
        tables, rows, threads, secs, idle, cycles, pool = self.SIZES[size_mode(ctx)]
        threads = int(opt_float(ctx, "threads", threads))
        secs = int(opt_float(ctx, "seconds", secs))
        idle = opt_float(ctx, "idle_seconds", idle)
        cycles = int(opt_float(ctx, "cycles", cycles))
        result: dict = {"metrics": {}, "series": {}, "phases": [], "notes": []}
        m = result["metrics"]
        srv = sv.MariaDBServer(ctx.allocator, workdir=ctx.workdir, buffer_pool=pool,
                               max_connections=threads + 44, extra_env=opt_env(ctx))
        try:
            sb = start_and_prepare(srv, ctx, result, tables, rows)
            m["rss_prepare_kib"] = srv.rss_kib()
            result["phases"].append({"phase": "prepare", "rss_kib": m["rss_prepare_kib"]})
            with RssSampler(srv.pid, interval=0.25) as whole:
                for c in range(1, cycles + 1):
                    ctx.progress(f"cycle {c}: {threads} connections, oltp_read_write {secs}s",
                                 0.1 + 0.9 * (c - 1) / cycles)
                    with RssSampler(srv.pid, interval=0.2) as busy:
                        res = MariaDB._run(srv, [sb[0], "oltp_read_write", *sb[1:]], threads, secs,
                                           f"sysbench oltp_read_write --threads={threads}")
                    m[f"tps_cycle{c}"] = res["tps"]
                    m[f"rss_busy_kib_cycle{c}"] = busy.peak_kib
                    ctx.progress(f"cycle {c}: connections closed, idle {idle:.0f}s",
                                 0.1 + 0.9 * (c - 0.5) / cycles)
                    sv.sleep_watching(idle, [srv], f"idle after cycle {c}")
                    m[f"rss_idle_kib_cycle{c}"] = srv.rss_kib()
                    held = held_metrics(srv.run_pid, "idle", f"cycle{c}")
                    m.update(held)
                    m.update(mesh_stats_metrics(published_mesh_stats(srv.run_pid), f"idle_cycle{c}"))
                    idle_rec = {"phase": f"idle {c}", "rss_kib": m[f"rss_idle_kib_cycle{c}"]}
                    if f"held_idle_kib_cycle{c}" in held:
                        idle_rec["held_kib"] = held[f"held_idle_kib_cycle{c}"]
                    result["phases"] += [{"phase": f"busy {c}", "rss_kib": busy.peak_kib}, idle_rec]
            srv.check_alive("the run")
            m["rss_peak_kib"] = whole.peak_kib
            m["rss_final_kib"] = m[f"rss_idle_kib_cycle{cycles}"]
            if f"held_idle_kib_cycle{cycles}" in m:
                m["held_final_kib"] = m[f"held_idle_kib_cycle{cycles}"]
            m["throughput"] = geomean([m[f"tps_cycle{c}"] for c in range(1, cycles + 1)])
            m.update(mesh_estimate_metrics(srv.run_pid, m["rss_final_kib"], "final"))
            result["series"] = {"rss_kib": whole.series}
            result["notes"].append(
                f"{tables} tables x {rows} rows, innodb_buffer_pool_size={pool}; {cycles} cycles of "
                f"{threads} connections running oltp_read_write for {secs}s, then disconnecting "
                f"and {idle:.0f}s idle. rss_final_kib is the RSS after the last idle: memory the "
                "connections used and gave back, or not (MariaDB keeps up to thread_cache_size "
                "threads; their caches stay).")
            result["notes"].append("held_final_kib: held_idle_kib after the last idle. "
                                   + HELD_NOTE)
            if any(k.startswith("mesh_pages_") for k in m):
                result["notes"].append(MESH_STATS_NOTE)
        finally:
            srv.stop(timeout=60)
        return result


class MariaDBCacheSim(Suite):
    """What MariaDB's own code pays for where its memory lies, counted instead of timed:
    mariadbd runs under valgrind's callgrind with its cache simulator (a first-level
    cache and, as the last level, this machine's L2, read from sysfs), serves sysbench
    oltp_read_only with `threads` connections, and only a fixed number of transactions
    (`events`, after a warm-up of a fifth as many) is counted. Per transaction:
    instructions (ir_per_txn), first-level data misses (d1_miss_per_txn), last-level
    data misses (ll_miss_per_txn), instruction-cache misses (i1_miss_per_txn), and the
    allocator's own instructions (alloc_ir_per_txn: its library's functions, or glibc's
    malloc sources). The counts repeat within a few percent where TPS on a shared
    2-core machine spreads 20-30 %. Valgrind runs one thread at a time: it sees the
    working set and the placement of blocks within one core's caches, not two cores
    fighting over a line, TLB misses or the scheduler. Options (--set
    mariadb-cachesim.KEY=VALUE): threads, events, ll=SIZE,WAYS,LINE (valgrind's --LL),
    extra_env, tiny."""

    name = "mariadb-cachesim"
    description = ("MariaDB under sysbench inside valgrind's cache simulator: instructions "
                   "and cache misses per transaction (deterministic, no timing)")
    needs_packages = ("mariadb-server", "mariadb-client", "sysbench", "valgrind")

    SIZES = {
        # tables, rows per table, connections, counted transactions, buffer pool
        "full": (4, 100_000, 64, 10_000, "256M"),
        "quick": (2, 10_000, 64, 3_200, "128M"),
        "tiny": (1, 2_000, 4, 100, "64M"),
    }

    def check(self, ctx: SuiteContext) -> None:
        check_mariadb_and_sysbench()
        sv.which("valgrind", "valgrind")
        sv.which("callgrind_control", "valgrind")

    def run(self, ctx: SuiteContext) -> dict:
        self.check(ctx)
        tables, rows, threads, events, pool = self.SIZES[size_mode(ctx)]
        threads = int(opt_float(ctx, "threads", threads))
        events = int(opt_float(ctx, "events", events))
        ll = str(ctx.options.get("ll") or cachesim.host_cache() or "")
        out = ctx.workdir / "callgrind.out"
        wrapper = [sv.which("valgrind", "valgrind"), "--tool=callgrind", "--cache-sim=yes",
                   "--instr-atstart=no", f"--callgrind-out-file={out}"]
        if ll:
            wrapper.append(f"--LL={ll}")
        # Valgrind knows no io_uring and cannot reserve the buffer pool's largest size
        # (by default 8 TiB of address space in 10.11): native AIO off, the maximum = size.
        binary = sv.which(sv.MariaDBServer.binary, sv.MariaDBServer.package)
        opts = subprocess.run([binary, "--no-defaults", "--help", "--verbose"],
                              capture_output=True, text=True, timeout=60).stdout
        args = ["--innodb-use-native-aio=0"]
        if "innodb-buffer-pool-size-max" in opts:
            args.append(f"--innodb-buffer-pool-size-max={pool}")
        result: dict = {"metrics": {}, "notes": []}
        m = result["metrics"]
        srv = sv.MariaDBServer(ctx.allocator, workdir=ctx.workdir, buffer_pool=pool,
                               max_connections=threads + 44, extra_env=opt_env(ctx),
                               startup_timeout=600, stop_timeout=300, wrapper=wrapper,
                               args=args)
        try:
            sb = start_and_prepare(srv, ctx, result, tables, rows)
            read_only = [sb[0], "oltp_read_only", *sb[1:], f"--threads={threads}", "--time=0"]
            warm = max(threads, events // 5)
            ctx.progress(f"warm-up: {warm} transactions, {threads} connections", 0.3)
            sv.run_client([*read_only, f"--events={warm}", "run"], servers=[srv],
                          timeout=3600, what="sysbench warm-up")
            self._control(srv, "-i", "on")
            ctx.progress(f"counted: {events} transactions, {threads} connections", 0.45)
            text = sv.run_client([*read_only, f"--events={events}", "run"], servers=[srv],
                                 timeout=3600, what="sysbench oltp_read_only (counted)")
            self._control(srv, "-i", "off")
            self._control(srv, "-d")
            srv.check_alive("the run")
        finally:
            srv.stop(timeout=300)
        counted = parse_sysbench(text)
        txns = counted.get("transactions", 0)
        if not txns:
            raise SuiteError(f"no transactions in sysbench's output:\n{text[-2000:]}")
        if counted.get("reconnects"):
            raise SuiteError(f"{counted['reconnects']} reconnects (did mariadbd restart?)")
        dumps = sorted(glob.glob(f"{out}.*"))
        if not dumps:
            raise SuiteError(f"callgrind wrote no dump ({out}.N); server log:\n"
                             f"{sv.log_tail(srv.log_path)}")
        part = cachesim.allocator_part(srv.preload)
        total = cachesim.parse(dumps[0], part)
        for d in dumps[1:]:
            total = cachesim.add(total, cachesim.parse(d, part))
        t, a = total["totals"], total["part"]
        if not t.get("Ir"):
            raise SuiteError(f"callgrind counted nothing in {', '.join(map(os.path.basename, dumps))}")

        def per(v: float) -> float:
            return round(v / txns, 1)
        m["transactions"] = txns
        m["ir_per_txn"] = per(t["Ir"])
        m["d1_miss_per_txn"] = per(t.get("D1mr", 0) + t.get("D1mw", 0))
        m["ll_miss_per_txn"] = per(t.get("DLmr", 0) + t.get("DLmw", 0))
        m["i1_miss_per_txn"] = per(t.get("I1mr", 0))
        m["alloc_ir_per_txn"] = per(a["Ir"])
        m["alloc_d1_miss_per_txn"] = per(a.get("D1mr", 0) + a.get("D1mw", 0))
        result["notes"].append(
            f"{tables} tables x {rows} rows, innodb_buffer_pool_size={pool}; mariadbd under "
            f"valgrind --tool=callgrind --cache-sim=yes{' --LL=' + ll if ll else ''} "
            f"(L1 as valgrind detects it), native AIO off; {warm} transactions of warm-up, then "
            f"{txns} counted with {threads} connections. Counts per transaction, whole server "
            "(all threads); alloc_*: the allocator's own functions. Valgrind serializes "
            "threads: no cross-core line sharing, TLB or scheduling effects here.")
        return result

    @staticmethod
    def _control(srv: sv.MariaDBServer, *args: str) -> None:
        """callgrind_control on the server's pid (-i on/off, -d dump)."""
        r = subprocess.run([sv.which("callgrind_control", "valgrind"), *args, str(srv.pid)],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise SuiteError(f"callgrind_control {' '.join(args)} {srv.pid} failed: "
                             f"{(r.stdout + r.stderr)[-1000:]}")
