"""PostgreSQL under pgbench: select-only (-S) and TPC-B-like across a client sweep.
The server's memory is the postmaster plus its backends (one process per client), so
RSS here is summed over the process tree."""
from __future__ import annotations

import re

from .. import procfs
from .. import servers as sv
from ..measure import RssSampler, geomean
from .base import (Suite, SuiteContext, SuiteError, cpu_us_per_txn, opt_env, opt_float, opt_list,
                   size_mode)


# pgbench's report: key, type, the patterns tried in turn (the first that matches counts)
PGBENCH_FIELDS = (
    ("tps", float, r"^tps = ([\d.]+) \(without initial connection time\)", r"^tps = ([\d.]+)"),
    ("mean_ms", float, r"^latency average = ([\d.]+) ms"),
    ("stddev_ms", float, r"^latency stddev = ([\d.]+) ms"),
    ("transactions", int, r"^number of transactions actually processed: (\d+)"),
    ("failed", int, r"^number of failed transactions: (\d+)"),
)


def parse_pgbench(text: str) -> dict:
    out: dict = {}
    for key, conv, *patterns in PGBENCH_FIELDS:
        for pat in patterns:
            m = re.search(pat, text, re.M)
            if m:
                out[key] = conv(m.group(1))
                break
    return out


PGBENCH_THREADS = 4   # pgbench -j cap (see the run loop)


class Postgres(Suite):
    """One cluster (initdb as the postgres user), pgbench -i, then at each client count
    a select-only and a TPC-B-like run (points: x = clients; tpcb_* keys for TPC-B).
    Options (--set postgres.KEY=VALUE): clients=1,4,16,64, seconds, scale, extra_env, tiny."""

    name = "postgres"
    description = ("PostgreSQL 15 under pgbench: select-only and TPC-B-like at 1-64 clients; "
                   "TPS, average latency, RSS of postmaster + backends")
    needs_packages = ("postgresql", "postgresql-contrib")

    SIZES = {   # scale, clients, seconds per run
        "full": (20, (1, 4, 16, 64), 30),
        "quick": (2, (1, 4, 16, 64), 4),
        "tiny": (1, (4,), 2),
    }

    def check(self, ctx: SuiteContext) -> None:
        srv = sv.PostgresServer(ctx.allocator)
        for prog in ("postgres", "initdb", "pgbench", "psql"):
            srv._pg(prog)

    def run(self, ctx: SuiteContext) -> dict:
        self.check(ctx)
        mode = size_mode(ctx)
        scale, sweep, secs = self.SIZES[mode]
        sweep = opt_list(ctx, "clients", sweep)
        secs = int(opt_float(ctx, "seconds", secs))
        scale = int(opt_float(ctx, "scale", scale))
        result: dict = {"metrics": {}, "points": [], "x_label": "clients", "notes": []}
        m = result["metrics"]
        srv = sv.PostgresServer(ctx.allocator, max_connections=max(sweep) + 20,
                                extra_env=opt_env(ctx))
        try:
            ctx.progress("initdb and start", 0.0)
            srv.start()
            result["notes"] += srv.notes
            pgb = [srv._pg("pgbench"), "-h", "127.0.0.1", "-p", str(srv.port), "-U", srv.dbuser]
            ctx.progress(f"pgbench -i -s {scale}", 0.05)
            sv.run_client([*pgb, "-i", "-q", "-s", str(scale), "postgres"], servers=[srv],
                          timeout=1800, what="pgbench -i")
            m["rss_after_init_kib"] = srv.tree_rss_kib()

            total = 2 * len(sweep)
            step = 0
            with RssSampler(srv.pid, interval=0.25, children=True) as whole:
                for clients in sweep:
                    point: dict = {"x": clients}
                    for wl, flags in (("select", ["-S"]), ("tpcb", [])):
                        ctx.progress(f"pgbench {wl} {clients} clients {secs}s", 0.1 + 0.9 * step / total)
                        step += 1
                        # RssAnon summed too: VmRSS counts shared_buffers pages once per
                        # backend that touched them.
                        cpu0 = procfs.cpu_seconds(srv.run_pid, tree=True)
                        # One pgbench thread per connection up to PGBENCH_THREADS: with two
                        # connections on a thread, select-only at 4 clients ran at either
                        # ~58k or ~90k TPS, switching from run to run under every allocator
                        # (glibc and Keel alike, the same two levels); -j 4 gives ~93k every run.
                        with RssSampler(srv.pid, interval=0.2, children=True) as samp, \
                                RssSampler(srv.pid, interval=0.2, children=True, field="RssAnon") as anon:
                            out = sv.run_client([*pgb, *flags, "-c", str(clients), "-j",
                                              str(min(clients, PGBENCH_THREADS)), "-T", str(secs), "postgres"],
                                             servers=[srv], timeout=secs + 300,
                                             what=f"pgbench {wl} -c {clients}")
                        res = parse_pgbench(out)
                        if "tps" not in res:
                            raise SuiteError(f"pgbench {wl} -c {clients}: no tps in its output:\n"
                                             f"{out[-2000:]}")
                        if res.get("failed"):
                            raise SuiteError(f"pgbench {wl} -c {clients}: {res['failed']} failed "
                                             f"transactions")
                        cpu = cpu_us_per_txn(cpu0, procfs.cpu_seconds(srv.run_pid, tree=True), res["tps"], secs)
                        pre = "" if wl == "select" else "tpcb_"
                        point[f"{pre}cpu_us_per_txn"] = cpu
                        m[f"cpu_us_per_txn_{wl}_c{clients}"] = cpu
                        point[f"{pre}throughput"] = res["tps"]
                        point[f"{pre}mean_ms"] = res.get("mean_ms")
                        point[f"{pre}rss_kib"] = samp.peak_kib
                        point[f"{pre}anon_kib"] = anon.peak_kib
                        m[f"{wl}_tps_c{clients}"] = res["tps"]
                        m[f"{wl}_mean_ms_c{clients}"] = res.get("mean_ms")
                        m[f"{wl}_rss_kib_c{clients}"] = samp.peak_kib
                    result["points"].append(point)
            srv.check_alive("the run")
            pts = result["points"]
            m["throughput"] = geomean([p["throughput"] for p in pts])
            m["mean_ms"] = geomean([p["mean_ms"] for p in pts])
            m["tpcb_throughput"] = geomean([p["tpcb_throughput"] for p in pts])
            m["tpcb_mean_ms"] = geomean([p["tpcb_mean_ms"] for p in pts])
            m["rss_peak_kib"] = max([whole.peak_kib or 0] + [p.get(k) or 0 for p in pts
                                                          for k in ("rss_kib", "tpcb_rss_kib")])
            m["anon_peak_kib"] = max(p.get(k) or 0 for p in pts for k in ("anon_kib", "tpcb_anon_kib"))
            m["rss_final_kib"] = srv.tree_rss_kib()
            result["series"] = {"rss_kib": whole.series}
            result["notes"].append(
                f"size {mode}: pgbench scale {scale}, select-only (-S) then TPC-B-like at "
                f"{', '.join(map(str, sweep))} clients, {secs}s each, -j min(clients, {PGBENCH_THREADS}); "
                "shared_buffers=128MB, fsync/synchronous_commit/full_page_writes off. "
                "throughput / mean_ms are geometric means of the select-only runs, tpcb_* of "
                "the TPC-B-like runs. RSS is summed over postmaster + backends (peak during a "
                "run; VmRSS counts shared memory pages in every backend that touched them), "
                "anon_kib sums RssAnon (private memory: what the allocator controls).")
        finally:
            srv.stop(timeout=60)
        return result
