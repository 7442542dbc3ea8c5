"""micro: libkeel's C benchmark programs (bench/*.c, built as <build>/bench/<name>; the
list is bench/programs.txt).

One run = every selected program once under one allocator, each started through the
`measure` launcher from bench/ (it forks, sets LD_PRELOAD in the child only, execs the
program and reports wall time and the wait4 rusage: peak RSS of the program itself,
not of this Python process, see bench/README.md). RSS over time is sampled every
100 ms across the whole run (one series, the programs one after the other).

Metrics: per program "<program>.wall_s", ".cpu_s", ".rss_peak_kib"; over the programs
the geometric means "wall_s_geomean", "cpu_s_geomean", "rss_peak_kib_geomean" and the
largest peak "rss_peak_kib". Every program prints a checksum that must not depend on
the allocator; they are kept in "checksums" and compared by the summary.

Options (keel bench --set micro.KEY=VALUE): programs=tree,xthread  scale=0.5
threads=N (for the threaded programs)  timeout=SECONDS (per program).
Quick: bignum, tree, xthread, mixed, larson at scale 0.25 (about 2-4 s per run).
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from ..measure import RssSampler, geomean
from ..paths import SOURCE_DIR
from ..procs import describe_exit, stop, tail
from .base import Suite, SuiteContext, SuiteError

# name -> (one-line description, takes a thread-count argument), in run order: the list
# bench/run.py runs and bench/CMakeLists.txt builds, one program a line (NAME yes|no TEXT).
with open(SOURCE_DIR / "bench" / "programs.txt") as _f:
    _rows = [line.split(None, 2) for line in _f if line.strip() and not line.startswith("#")]
PROGRAMS = {name: (desc.strip(), threads == "yes") for name, threads, desc in _rows}
QUICK_PROGRAMS = ("bignum", "tree", "xthread", "mixed", "larson")
QUICK_SCALE = 0.25
CHECKSUM_RE = re.compile(r"\bchecksum=([0-9a-fA-F]+)\b")


def _positive(ctx: SuiteContext, key: str, default, conv):
    """Option `key` as a number > 0 (conv: int or float), SuiteError naming it otherwise."""
    raw = ctx.options.get(key, default)
    try:
        v = conv(raw)
    except (TypeError, ValueError):
        v = None
    if v is None or not v > 0 or (conv is float and not math.isfinite(v)):
        kind = "a whole number" if conv is int else "a number"
        raise SuiteError(f"micro: option {key}={raw!r}: expected {kind} > 0")
    return v


class MicroSuite(Suite):
    name = "micro"
    description = ("libkeel's C benchmark programs (bench/): wall time, CPU time and peak "
                   "RSS per program")
    needs_packages = ("build-essential", "cmake", "ninja-build")

    # -- configuration ------------------------------------------------------------
    def bench_dir(self, ctx: SuiteContext) -> Path:
        return Path(ctx.options.get("bench_dir") or Path(ctx.build_dir) / "bench")

    def programs(self, ctx: SuiteContext) -> list[str]:
        spec = ctx.options.get("programs")
        if spec:
            progs = [p.strip() for p in str(spec).split(",") if p.strip()]
            unknown = [p for p in progs if p not in PROGRAMS]
            if unknown:
                raise SuiteError(f"micro: unknown program(s) {', '.join(unknown)} "
                                 f"(known: {', '.join(PROGRAMS)})")
            return progs
        return list(QUICK_PROGRAMS if ctx.quick else PROGRAMS)

    def scale(self, ctx: SuiteContext) -> float:
        return _positive(ctx, "scale", QUICK_SCALE if ctx.quick else 1.0, float)

    def threads(self, ctx: SuiteContext) -> Optional[int]:
        if ctx.options.get("threads") in (None, ""):
            return None
        return _positive(ctx, "threads", None, int)

    def timeout(self, ctx: SuiteContext) -> float:
        return _positive(ctx, "timeout", 60.0 if ctx.quick else 300.0, float)

    def check_options(self, ctx: SuiteContext) -> None:
        self.programs(ctx)
        self.scale(ctx)
        self.threads(ctx)
        self.timeout(ctx)

    def check(self, ctx: SuiteContext) -> None:
        self.check_options(ctx)
        d = self.bench_dir(ctx)
        progs = self.programs(ctx)
        absent = [p for p in progs + ["measure"] if not os.access(d / p, os.X_OK)]
        if absent:
            b = Path(ctx.build_dir)
            raise SuiteError(
                f"micro: benchmark program(s) not built in {d}: {', '.join(absent)}. Build "
                f"them with: cmake -S {SOURCE_DIR} -B {b} -G Ninja && cmake --build {b} "
                f"--target keel_bench")

    # -- running --------------------------------------------------------------------
    def run(self, ctx: SuiteContext) -> dict:
        self.check(ctx)
        d = self.bench_dir(ctx)
        progs = self.programs(ctx)
        scale = self.scale(ctx)
        threads = self.threads(ctx)
        timeout = self.timeout(ctx)
        measure = d / "measure"
        notes: list[str] = []
        t0 = time.monotonic()
        series: list[list[float]] = []
        metrics: dict[str, Any] = {}   # numbers; None for a geomean of nothing
        phases, checksums, failures = [], {}, []
        for i, prog in enumerate(progs):
            ctx.progress(f"{prog} ({i + 1}/{len(progs)})", i / len(progs))
            args = [repr(scale) if scale != int(scale) else str(int(scale))]
            if threads and PROGRAMS[prog][1]:
                args.append(str(threads))
            r = self._run_one(ctx, d / prog, args, measure, timeout, t0, series)
            if r.get("error"):
                failures.append(f"{prog}: {r['error']}")
                continue
            metrics[f"{prog}.wall_s"] = round(r["wall_s"], 4)
            metrics[f"{prog}.cpu_s"] = round(r["cpu_s"], 4)
            metrics[f"{prog}.rss_peak_kib"] = r["rss_peak_kib"]
            phases.append({"phase": prog, "rss_kib": r["rss_peak_kib"]})
            checksums[prog] = r["checksum"]
        ctx.progress("done", 1.0)
        if failures:
            raise SuiteError(f"micro under {ctx.allocator.name}: " + "\n".join(failures))
        done = [p for p in progs if p in checksums]

        def mean_of(key: str, digits: int) -> Optional[float]:
            # None when no program has a value > 0 (e.g. times rounded to 0 at a tiny scale)
            g = geomean(metrics[f"{p}.{key}"] for p in done)
            return None if g is None else round(g, digits)
        metrics["wall_s_geomean"] = mean_of("wall_s", 4)
        metrics["cpu_s_geomean"] = mean_of("cpu_s", 4)
        metrics["rss_peak_kib_geomean"] = mean_of("rss_peak_kib", 1)
        metrics["rss_peak_kib"] = max(metrics[f"{p}.rss_peak_kib"] for p in done)
        return {
            "metrics": metrics,
            "series": {"rss_kib": series},
            "phases": phases,
            "phase_label": "program (peak RSS)",
            "checksums": checksums,
            "headline": {"speed": "wall_s_geomean", "memory": "rss_peak_kib_geomean"},
            "params": {"programs": progs, "scale": scale, "threads": threads},
            "notes": notes,
        }

    def _run_one(self, ctx: SuiteContext, prog: Path, args: list[str], measure, timeout: float,
                 t0: float, series: list) -> dict:
        wd = Path(ctx.workdir)
        rep = wd / f"{prog.name}.report"
        out_p, err_p = wd / f"{prog.name}.out", wd / f"{prog.name}.err"
        rep.unlink(missing_ok=True)
        argv = [str(measure), str(rep), ctx.allocator.path or "-", str(prog)] + args
        env = ctx.allocator.env()
        env.pop("LD_PRELOAD", None)      # the launcher sets it for the program only
        with open(out_p, "wb") as out_f, open(err_p, "wb") as err_f:
            p = subprocess.Popen(argv, cwd=wd, env=env, stdin=subprocess.DEVNULL, stdout=out_f,
                                 stderr=err_f, start_new_session=True)
            sampler = RssSampler(p.pid, interval=0.1, children=True, t0=t0).start()
            timed_out = False
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                sampler.stop()
                stop(p)
        series.extend(sampler.series)
        stdout = out_p.read_text(errors="replace")
        stderr = err_p.read_text(errors="replace")
        if timed_out:
            return {"error": f"timed out after {timeout:g} s (killed)"}
        if p.returncode != 0 or not rep.exists():
            return {"error": f"the measure launcher failed ({describe_exit(p.returncode)})"
                             + ("\n" + tail(stderr) if stderr.strip() else "")}
        fields = dict(kv.split("=", 1) for kv in rep.read_text().split())
        code = os.waitstatus_to_exitcode(int(fields["status"]))
        res = {"wall_s": int(fields["wall_ns"]) / 1e9,
               "rss_peak_kib": int(fields.get("peak_kib", fields["maxrss_kib"])),
               "cpu_s": (int(fields["utime_us"]) + int(fields["stime_us"])) / 1e6}
        if "cannot be preloaded" in stderr:
            return {"error": f"the dynamic loader could not preload {ctx.allocator.path}:\n"
                             + tail(stderr)}
        if code != 0:
            return {"error": describe_exit(code) + ("\n" + tail(stderr) if stderr.strip() else "")}
        sums = CHECKSUM_RE.findall(stdout)
        if len(sums) != 1:
            return {"error": f"expected one 'checksum=' in the output, got {len(sums)}:\n"
                             + tail(stdout + "\n" + stderr)}
        res["checksum"] = sums[0].lower()
        return res
