"""Redis suites: fragmentation after a fill / overwrite / delete / idle cycle
(redis-frag), and throughput + latency under redis-benchmark (redis-ops)."""
from __future__ import annotations

import csv
import io
import os
import random
import threading
import time
from pathlib import Path
from typing import Optional

from .. import servers as sv
from ..measure import RssSampler, geomean
from .base import (HELD_NOTE, MESH_STATS_NOTE, Suite, SuiteContext, SuiteError, held_metrics,
                   mesh_estimate_metrics, mesh_stats_metrics, opt_env, opt_float, opt_list,
                   published_mesh_stats, size_mode)

KEY_FMT = "key:%012d"          # the keys redis-benchmark -r makes of __rand_int__

# Seeds of redis-frag's phases. redis-benchmark -r draws new random keys every run, and
# some runs draw the same keys in two overwrite phases: live data after the overwrite then
# differed 2.8x between runs of one allocator (3 B values: used_memory 100 vs 280 MB). The
# fill and overwrites are therefore sent from fixed seeds, so every allocator stores the
# same keys with the same values.
FILL_SEED = 1
OVERWRITE_SEED = 2             # + the overwrite's index
DELETE_SEED = 42


def size_label(n: int) -> str:
    return f"{n // 1024}KiB" if n >= 1024 and n % 1024 == 0 else f"{n}B"


def parse_benchmark_csv(text: str) -> dict[str, dict[str, float]]:
    """redis-benchmark --csv (7.x): "test","rps","avg_latency_ms","min_latency_ms",
    "p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"."""
    lines = [line for line in text.replace("\r", "\n").splitlines() if line.startswith('"')]
    out: dict[str, dict[str, float]] = {}
    header: Optional[list[str]] = None
    for row in csv.reader(io.StringIO("\n".join(lines))):
        if row and row[0] == "test":
            header = row
            continue
        if header is None or len(row) != len(header):
            continue
        rec = {}
        for k, v in zip(header[1:], row[1:], strict=True):
            try:
                rec[k] = float(v)
            except ValueError:
                pass
        out[row[0]] = rec
    return out


def _benchmark(srv: sv.RedisServer, ctx: SuiteContext, args: list[str], what: str,
               timeout: float = 900) -> dict[str, dict[str, float]]:
    argv = [sv.which("redis-benchmark", "redis-tools"), "-h", "127.0.0.1", "-p", str(srv.port),
            "--csv", *args]
    out = sv.run_client(argv, servers=[srv], timeout=timeout, what=what)
    res = parse_benchmark_csv(out)
    if not res:
        raise SuiteError(f"{what}: no results in redis-benchmark's output:\n{out[-2000:]}")
    return res


def _set_commands(rng: random.Random, keyspace: int, count: int, vsize: int,
                  batch: int = 4096):
    """SET commands in Redis' wire protocol, in chunks: `count` SETs of `vsize` bytes of
    'x' (as redis-benchmark -d sends) to keys KEY_FMT % randrange(keyspace)."""
    head = b"*3\r\n$3\r\nSET\r\n$%d\r\n" % len(KEY_FMT % 0)
    tail = b"\r\n$%d\r\n%s\r\n" % (vsize, b"x" * vsize)
    fmt = KEY_FMT.encode()
    pick = rng.randrange
    done = 0
    while done < count:
        n = min(batch, count - done)
        yield b"".join(head + fmt % pick(keyspace) + tail for _ in range(n))
        done += n


def _mass_set(srv: sv.RedisServer, workdir, rng: random.Random, keyspace: int, count: int,
              vsize: int, what: str, timeout: float = 900) -> float:
    """Sends `count` SETs from `rng` through `redis-cli --pipe` (Redis' mass insertion, one
    connection, replies read as they come) and returns the seconds it took. The commands
    are written into a FIFO by a thread, so nothing is stored on disk."""
    fifo = os.path.join(str(workdir), f"redis-pipe-{os.getpid()}-{threading.get_ident()}")
    os.mkfifo(fifo)
    failure: list[BaseException] = []

    def feed():
        try:
            with open(fifo, "wb") as out:
                for chunk in _set_commands(rng, keyspace, count, vsize):
                    out.write(chunk)
        except BrokenPipeError:
            pass                # the client died or was killed: run_client reports it
        except BaseException as e:          # noqa: BLE001 - reported below
            failure.append(e)

    writer = threading.Thread(target=feed, name="redis-frag-feed", daemon=True)
    writer.start()
    t = time.monotonic()
    try:
        out = sv.run_client([sv.which("redis-cli", "redis-tools"), "-h", "127.0.0.1",
                             "-p", str(srv.port), "--pipe"],
                            servers=[srv], timeout=timeout, what=what, stdin_path=Path(fifo))
    finally:
        if writer.is_alive():
            # the client never opened the FIFO (or stopped reading): unblock the writer
            try:
                fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
                os.close(fd)
            except OSError:
                pass
        writer.join(5)
        os.unlink(fifo)
    seconds = time.monotonic() - t
    if failure:
        raise SuiteError(f"{what}: writing the commands failed: {failure[0]}")
    # "errors: 0, replies: 2000000"
    tail = [line for line in out.splitlines() if line.startswith("errors:")]
    try:
        errors, replies = (int(x.split(":")[1]) for x in tail[-1].split(","))
    except (IndexError, ValueError):
        raise SuiteError(f"{what}: no reply count in redis-cli --pipe's output:\n{out[-2000:]}") from None
    if errors or replies != count:
        raise SuiteError(f"{what}: {errors} errors, {replies} of {count} replies:\n{out[-2000:]}")
    return seconds


class RedisSuite(Suite):
    """What both Redis suites need: redis-server and redis-benchmark. (No name: not a
    suite of its own.)"""

    needs_packages = ("redis-server", "redis-tools")

    def check(self, ctx: SuiteContext) -> None:
        sv.which(sv.RedisServer.binary, sv.RedisServer.package)
        sv.which("redis-benchmark", "redis-tools")
        sv.which("redis-cli", "redis-tools")


class RedisFrag(RedisSuite):
    """A fresh redis-server per value size (3 B, 1 KiB): fill (SETs of random keys,
    seeded, sent by redis-cli --pipe), overwrite with 64/700/16-byte values (seeded the
    same way), DEL a seeded random half of the keyspace (pipelined), idle. After each
    phase: RSS, INFO used_memory and mem_fragmentation_ratio ("phases", "<phase>
    <size>"); RSS over the idle phase in series rss_kib_<size> (and over the whole run in
    run_rss_kib_<size>). Next to each
    rss_<phase>_kib_<size>: held_<phase>_kib_<size> (meshed pages counted once; the one
    to compare under keel+mesh), pss_<phase>_kib_<size>, mesh_views_<phase>_<size>;
    while Keel meshes, what meshing did so far (its published statistics):
    mesh_pages_<phase>_<size>, mesh_longest_ms_, mesh_busy_s_, mesh_eroded_, mesh_file_kib_.
    Options (--set redis-frag.KEY=VALUE): idle_seconds, value_sizes=3,1024,
    extra_env=NAME=VALUE,..., tiny=1 (test size)."""

    name = "redis-frag"
    description = ("Redis memory after fill (3 B / 1 KiB values), overwrite with mixed sizes, "
                   "deleting a random half, and idling: RSS per phase")

    SIZES = {
        # keyspace, fill SETs, overwrite SETs per size, idle seconds
        "full": (1_000_000, 2_000_000, 500_000, 30.0),
        "quick": (100_000, 200_000, 50_000, 5.0),
        "tiny": (10_000, 20_000, 5_000, 1.0),
    }
    VALUE_SIZES = (3, 1024)
    OVERWRITE_SIZES = (64, 700, 16)

    def run(self, ctx: SuiteContext) -> dict:
        self.check(ctx)
        mode = size_mode(ctx)
        keys, fill, over, idle = self.SIZES[mode]
        idle = opt_float(ctx, "idle_seconds", idle)
        sizes = opt_list(ctx, "value_sizes", self.VALUE_SIZES)
        result: dict = {"metrics": {}, "series": {}, "phases": [], "notes": []}
        peaks: list[int] = []
        finals: list[int] = []
        for i, vsize in enumerate(sizes):
            label = size_label(vsize)
            self._one(ctx, result, label, vsize, keys, fill, over, idle,
                      base_frac=i / len(sizes), span=1 / len(sizes), peaks=peaks, finals=finals)
        m = result["metrics"]
        m["rss_peak_kib"] = max(peaks)
        m["rss_final_kib"] = sum(finals)
        held = [m.get(f"held_idle_kib_{size_label(v)}") for v in sizes]
        if None not in held:
            m["held_final_kib"] = sum(held)
        result["notes"] += [
            f"size {mode}: {fill} SETs over {keys} random keys, then {over} SETs each of "
            f"{'/'.join(str(s) for s in self.OVERWRITE_SIZES)} B, then DEL of a random half "
            f"of the keyspace, then {idle:.0f}s idle; a fresh redis-server per value size. "
            f"Keys come from fixed seeds (fill {FILL_SEED}, overwrites {OVERWRITE_SEED}.., "
            f"delete {DELETE_SEED}), so every allocator holds the same data; the SETs go "
            "through redis-cli --pipe (one connection), so fill_rps is Redis' mass-insertion "
            "rate with a Python feeder, not redis-benchmark's.",
            "Compare allocators on RSS, not on mem_fragmentation_ratio: the ratio is RSS divided "
            "by used_memory, and used_memory is Redis' own count built from the allocator's "
            "malloc_usable_size, so each allocator's size-class rounding changes the divisor; "
            "RSS is what the machine actually pays.",
            "rss_final_kib is the RSS after idling summed over the value sizes; "
            "rss_peak_kib the highest RSS seen in any of them. activedefrag is off "
            "(Redis' default; it only works with its own jemalloc).",
            "held_final_kib: held_idle_kib summed over the value sizes. " + HELD_NOTE,
        ]
        if any(k.startswith("mesh_pages_") for k in m):
            result["notes"].append(MESH_STATS_NOTE)
        return result

    def _one(self, ctx, result, label, vsize, keys, fill, over, idle, base_frac, span,
             peaks, finals) -> None:
        m = result["metrics"]
        steps = 3 + len(self.OVERWRITE_SIZES)
        done = 0

        def progress(msg):
            ctx.progress(f"{label}: {msg}", base_frac + span * done / steps)

        srv = sv.RedisServer(ctx.allocator, workdir=ctx.workdir, extra_env=opt_env(ctx))
        try:
            srv.start()
            for n in srv.notes:
                if n not in result["notes"]:
                    result["notes"].append(n)
            whole = RssSampler(srv.pid, interval=0.25).start()
            client = None
            try:
                client = srv.client(timeout=120)

                def phase(name: str, seconds: float) -> None:
                    srv.check_alive(name)
                    info = client.info("memory")
                    rss = srv.rss_kib()
                    held = held_metrics(srv.run_pid, name, label)
                    # one phase entry per (phase, value size): the report groups by name
                    rec = {"phase": f"{name} {label}", "rss_kib": rss,
                           "used_memory_kib": int(info["used_memory"]) // 1024,
                           "frag": float(info.get("mem_fragmentation_ratio", "nan"))}
                    if f"held_{name}_kib_{label}" in held:
                        rec["held_kib"] = held[f"held_{name}_kib_{label}"]
                    result["phases"].append(rec)
                    m[f"rss_{name}_kib_{label}"] = rss
                    m.update(held)
                    m.update(mesh_stats_metrics(published_mesh_stats(srv.run_pid), f"{name}_{label}"))
                    m[f"used_memory_{name}_kib_{label}"] = rec["used_memory_kib"]
                    m[f"keys_{name}_{label}"] = int(client.command("DBSIZE"))
                    if name != "idle":
                        m[f"seconds_{name}_{label}"] = round(seconds, 2)

                progress(f"fill, {fill} SETs of {vsize} B over {keys} keys")
                fill_s = _mass_set(srv, ctx.workdir, random.Random(FILL_SEED), keys, fill, vsize,
                                   f"redis-cli --pipe fill ({label})")
                m[f"fill_rps_{label}"] = round(fill / fill_s) if fill_s > 0 else None
                phase("fill", fill_s)
                done += 1

                t = time.monotonic()
                for j, osize in enumerate(self.OVERWRITE_SIZES):
                    progress(f"overwrite, {over} SETs of {osize} B")
                    _mass_set(srv, ctx.workdir, random.Random(OVERWRITE_SEED + j), keys, over,
                              osize, f"redis-cli --pipe overwrite {osize} B ({label})")
                    done += 1
                phase("overwrite", time.monotonic() - t)

                progress(f"delete a random half of {keys} keys")
                t = time.monotonic()
                rng = random.Random(DELETE_SEED)
                victims = rng.sample(range(keys), keys // 2)
                errors = client.pipeline((("DEL", KEY_FMT % k) for k in victims), batch=1000)
                if errors:
                    raise SuiteError(f"redis: {errors} errors deleting keys")
                phase("delete", time.monotonic() - t)
                done += 1

                progress(f"idle {idle:.0f}s")
                with RssSampler(srv.pid, interval=0.25) as idle_s:
                    sv.sleep_watching(idle, [srv], "the idle phase")
                result["series"][f"rss_kib_{label}"] = idle_s.series
                phase("idle", idle)
                m.update(mesh_estimate_metrics(srv.run_pid, m[f"rss_idle_kib_{label}"], label))
                done += 1
            finally:
                if client is not None:
                    client.close()
                whole.stop()
            srv.check_alive("the run")
            result["series"][f"run_rss_kib_{label}"] = whole.series
            peaks.append(whole.peak_kib or 0)
            finals.append(m[f"rss_idle_kib_{label}"])
        except (ConnectionError, OSError) as e:
            if not srv.alive():
                raise SuiteError(srv.died_message(f"redis-frag ({label})")) from None
            raise SuiteError(f"redis-frag ({label}): lost the connection to redis-server: {e}") from None
        finally:
            srv.stop()


class RedisOps(RedisSuite):
    """redis-benchmark -t set,get,lpush,lpop with -P 16 -c 50 and with -c 200 unpipelined
    (--csv: rps, avg/p50/p95/p99 latency per test), server RSS sampled throughout. While
    Keel meshes (keel+mesh), after the run: mesh_views (views now), mesh_pages (pages given
    back) and mesh_longest_ms (its longest operation) from its published statistics.
    Options: extra_env, tiny."""

    name = "redis-ops"
    description = ("Redis SET/GET/LPUSH/LPOP throughput and latency with redis-benchmark: "
                   "pipelined (-P 16 -c 50) and 200 unpipelined clients")

    TESTS = "set,get,lpush,lpop"
    SIZES = {   # requests pipelined, requests unpipelined, keyspace
        "full": (2_000_000, 400_000, 1_000_000),
        "quick": (300_000, 60_000, 100_000),
        "tiny": (20_000, 5_000, 10_000),
    }

    def run(self, ctx: SuiteContext) -> dict:
        self.check(ctx)
        mode = size_mode(ctx)
        n_pipe, n_plain, keys = self.SIZES[mode]
        configs = [("p16c50", ["-P", "16", "-c", "50", "-n", str(n_pipe)]),
                   ("c200", ["-c", "200", "-n", str(n_plain)])]
        result: dict = {"metrics": {}, "notes": []}
        m = result["metrics"]
        srv = sv.RedisServer(ctx.allocator, workdir=ctx.workdir, extra_env=opt_env(ctx))
        try:
            srv.start()
            result["notes"] += srv.notes
            rps, p50, p95, p99, means = [], [], [], [], []
            with RssSampler(srv.pid, interval=0.2) as samp:
                for i, (cname, args) in enumerate(configs):
                    ctx.progress(f"redis-benchmark {cname}", i / len(configs))
                    res = _benchmark(srv, ctx, ["-t", self.TESTS, "-r", str(keys), "-d", "64",
                                                "--precision", "3", *args],
                                     f"redis-benchmark {cname}")
                    for test, rec in res.items():
                        key = f"{test.lower()}_{cname}"
                        m[f"{key}_rps"] = rec.get("rps")
                        for q in ("p50", "p95", "p99"):
                            m[f"{key}_{q}_ms"] = rec.get(f"{q}_latency_ms")
                        m[f"{key}_mean_ms"] = rec.get("avg_latency_ms")
                        rps.append(rec.get("rps", 0))
                        p50.append(rec.get("p50_latency_ms", 0))
                        p95.append(rec.get("p95_latency_ms", 0))
                        p99.append(rec.get("p99_latency_ms", 0))
                        means.append(rec.get("avg_latency_ms", 0))
            srv.check_alive("the run")
            ms = published_mesh_stats(srv.run_pid)
            mesh = mesh_stats_metrics(ms, None, ("views", "pages", "longest_ms"))
            m.update(mesh)
            if mesh:
                result["notes"].append(
                    "mesh_views: views meshing had at the end; mesh_pages: pages it gave back "
                    "during the run; mesh_longest_ms: its longest operation (writers to those "
                    "pages waited that long). From the server's published statistics.")
            elif ms and ms["state"] != 0:
                result["notes"].append(f"KEEL_MESH was on but meshing did not run (state "
                                       f"{ms['state']}: 2 refused, 3 a forked child)")
            m["throughput"] = geomean(rps)
            m["p50_ms"] = _mean(p50)
            m["p95_ms"] = _mean(p95)
            m["p99_ms"] = _mean(p99)
            m["mean_ms"] = _mean(means)
            m["rss_peak_kib"] = samp.peak_kib
            m["rss_final_kib"] = samp.final_kib
            result["series"] = {"rss_kib": samp.series}
            result["notes"].append(
                f"size {mode}: tests {self.TESTS}, 64-byte values, keyspace {keys}; "
                f"{n_pipe} requests each with -P 16 -c 50, {n_plain} with -c 200 unpipelined. "
                "throughput is the geometric mean of the 8 tests' requests/s; p50/p95/p99/mean_ms "
                "are the means of the tests' values; per-test values are in the metrics.")
        finally:
            srv.stop()
        return result


def _mean(xs) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


SUITES = [RedisFrag, RedisOps]
