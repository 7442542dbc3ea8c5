"""Sphinx search (Debian's sphinxsearch 2.2 searchd): index a deterministic corpus, then
serve a fixed query mix from N client processes over SphinxQL, once with transparent
huge pages allowed for searchd and once with them disabled for the whole process.

THP off = prctl(PR_SET_THP_DISABLE, 1) in the child before exec (inherited by
everything searchd forks), plus KEEL_THP=never for Keel; THP on = the machine's own
setting (not changed here) plus KEEL_THP=dense, Keel's THP-aware mode (it collapses the
huge pages its dense memory fills in the background instead of taking huge pages at fault
time: issue 33), or the variant's own KEEL_THP where it sets one (keel+KEEL_THP=always);
THP always (on request) = the machine's setting plus KEEL_THP=always (huge pages at fault
time, kept whole); dense (on request) = the same as on. The machine-wide setting in
/sys/kernel/mm/transparent_hugepage/enabled is only read, never written.

Client workers are separate processes (`python -m keel_lab.suites.sphinx worker ...`)
so the Python clients do not share one GIL.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from .. import live, paths, procfs, procs
from ..clients import MySQLMini
from ..corpus import CORPUS_VERSION, Corpus
from .. import servers as sv
from ..measure import RssSampler, percentile
from .base import Suite, SuiteContext, SuiteError, opt_bool, opt_env, opt_float, opt_list, size_mode

THP_SYSFS = "/sys/kernel/mm/transparent_hugepage/enabled"
# Each THP setting of the suite and the KEEL_THP policy Keel runs under in it.
THP_MODES = {"on": "dense", "off": "never", "dense": "dense", "always": "always"}


def keel_thp_for(allocator, thp: str) -> Optional[str]:
    """The KEEL_THP searchd runs under in THP setting `thp`: the suite's policy for it,
    except that THP 'on' keeps a Keel variant's own KEEL_THP (keel+KEEL_THP=always is
    compared with keel in one run); None: leave the variable as the variant has it."""
    own = dict(getattr(allocator, "extra_env", ()) or ()).get("KEEL_THP")
    if thp == "on" and own:
        return None
    return THP_MODES[thp]


# What keel stats says of a Keel process, in KiB (issue 33's breakdown), under these names.
KEEL_FIGURES = ("allocated", "cached", "active", "committed", "metadata")


def keel_figures(pid: int, prefix: str) -> dict:
    """Keel's own accounting of a running process (keel stats), or {} when it does not
    run Keel (or publishes nothing): allocated, cached (free blocks in thread and
    transfer caches), active, committed and metadata, in KiB, and its threads."""
    try:
        snap = live.read(pid, timeout=3.0)
    except (live.LiveError, OSError):
        return {}
    out = {f"{prefix}_{k}_kib": snap.stats[k] // 1024 for k in KEEL_FIGURES if k in snap.stats}
    out[f"{prefix}_threads"] = snap.stats.get("threads")
    return out


def machine_thp() -> str:
    try:
        text = Path(THP_SYSFS).read_text()
        return text[text.index("[") + 1:text.index("]")]
    except (OSError, ValueError):
        return "unknown"


def thp_enabled(pid: int) -> Optional[int]:
    """THP_enabled from /proc/PID/status (0 after PR_SET_THP_DISABLE)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("THP_enabled:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


class Sphinx(Suite):
    """Corpus -> indexer (under the allocator: index_seconds, indexer_rss_peak_kib) ->
    searchd with THP on, then a fresh searchd with THP off; each serves the query mix
    from N client processes. Options (--set sphinx.KEY=VALUE): docs, clients, seconds,
    thp=on,off (also dense), idle_seconds=3 (the wait before rss_idle_kib), cache=0
    (regenerate the corpus), cache_dir, extra_env, tiny."""

    name = "sphinx"
    description = ("Sphinx searchd: a fixed SphinxQL query mix from N clients over a "
                   "Zipf-word corpus, with transparent huge pages on and off")
    needs_packages = ("sphinxsearch",)

    SIZES = {   # documents, client processes, seconds per THP setting
        "full": (500_000, 16, 60),
        "quick": (50_000, 8, 10),
        "tiny": (3_000, 2, 2),
    }

    def check(self, ctx: SuiteContext) -> None:
        sv.which(sv.SphinxServer.binary, sv.SphinxServer.package)
        sv.which("indexer", "sphinxsearch")

    def run(self, ctx: SuiteContext) -> dict:
        self.check(ctx)
        mode = size_mode(ctx)
        ndocs, clients, secs = self.SIZES[mode]
        ndocs = int(opt_float(ctx, "docs", ndocs))
        clients = int(opt_float(ctx, "clients", clients))
        secs = opt_float(ctx, "seconds", secs)
        modes = opt_list(ctx, "thp", ("on", "off"), conv=str)
        if not modes or any(x not in THP_MODES for x in modes):
            raise SuiteError(f"option thp={','.join(modes)}: use on, off, dense, always or a "
                             "list of them (on,off)")
        result: dict = {"metrics": {}, "series": {}, "notes": []}
        m = result["metrics"]
        work = Path(ctx.workdir) / "sphinx"
        work.mkdir(parents=True, exist_ok=True)

        ctx.progress(f"corpus of {ndocs} documents", 0.0)
        corpus = Corpus(ndocs)
        tsv = self._corpus_file(ctx, corpus, work, mode)
        queries = corpus.queries(200)
        qfile = work / "queries.json"
        qfile.write_text(json.dumps(queries))

        index_conf = f"""
source src
{{
    type = tsvpipe
    tsvpipe_command = cat {tsv}
    tsvpipe_attr_uint = gid
    tsvpipe_field = title
    tsvpipe_field = body
}}
index idx
{{
    source = src
    path = {work / 'idx'}
    docinfo = extern
    dict = keywords
    min_word_len = 1
}}
"""
        conf = work / "indexer.conf"
        conf.write_text(index_conf + "\nindexer\n{\n    mem_limit = 256M\n}\n")
        ctx.progress("indexer", 0.1)
        env = ctx.allocator.env()
        t = time.monotonic()
        out = self._run_indexer(conf, env, m)
        m["index_seconds"] = round(time.monotonic() - t, 2)
        if f"total {ndocs} docs" not in out:
            raise SuiteError(f"indexer did not index {ndocs} documents:\n{out[-2000:]}")

        peaks = []
        self.thp_state: dict = {}
        for i, thp in enumerate(modes):
            frac = 0.2 + 0.8 * i / len(modes)
            ctx.progress(f"searchd, THP {thp}: {clients} clients x {secs:.0f}s", frac)
            r = self._serve(ctx, index_conf, thp, qfile, clients, secs, work,
                            opt_float(ctx, "idle_seconds", 3.0))
            for k, v in r.items():
                if k != "series":
                    m[f"thp_{thp}_{k}"] = v
            result["series"][f"rss_kib_thp_{thp}"] = r["series"]
            peaks.append(r["rss_peak_kib"] or 0)
        head = modes[0]
        for k in ("qps", "mean_ms", "p50_ms", "p95_ms", "p99_ms"):
            m[{"qps": "throughput"}.get(k, k)] = m.get(f"thp_{head}_{k}")
        m["rss_peak_kib"] = max(peaks)
        m["rss_final_kib"] = m.get(f"thp_{head}_rss_final_kib")
        result["notes"] += [
            f"size {mode}: {ndocs} documents (Zipf(1.07) words from a 60k vocabulary), "
            f"200 fixed SphinxQL queries (terms, AND, OR + GROUP BY, phrases, @title, "
            f"ORDER BY attr, bm25), {clients} client processes for {secs:.0f}s per THP setting, "
            f"after one warm-up pass; a fresh searchd per setting.",
            f"THP: machine setting is '{machine_thp()}' (not changed). 'on' = that setting plus "
            f"KEEL_THP=dense (a variant's own KEEL_THP where it sets one); 'dense' = the same; "
            f"'always' = that setting plus KEEL_THP=always; "
            f"'off' = prctl(PR_SET_THP_DISABLE) on searchd plus KEEL_THP=never. "
            f"With 'madvise', only memory the allocator madvises gets huge pages when on. "
            f"throughput/latency/rss_final_kib headline values are from THP {head}; "
            f"thp_<mode>_* hold each setting. THP_enabled in /proc/PID/status of searchd: "
            + ", ".join(f"{k}={v}" for k, v in self.thp_state.items()) + ".",
            f"rss_final_kib is read as the clients stop, rss_idle_kib {opt_float(ctx, 'idle_seconds', 3.0):g} s "
            "later with searchd idle; under Keel, keel_final_* and keel_idle_* are its own "
            "figures (keel stats) at those moments.",
            "The query clients run on the same machine (and cores) as searchd; "
            "latency is measured in the clients, per query, connection kept open.",
        ]
        return result

    # ----------------------------------------------------------------------------
    def _corpus_file(self, ctx: SuiteContext, corpus: Corpus, work: Path, mode: str) -> Path:
        """Quick and full corpora are cached (generating 500k documents takes a minute
        or two); the cache dir is ctx.options['cache_dir'] or ~/.cache/keel-lab. The file
        name carries the corpus format version, the size and the seed."""
        if mode != "tiny" and opt_bool(ctx, "cache", True):
            cache = Path(ctx.options.get("cache_dir") or paths.cache_dir())
            cache.mkdir(parents=True, exist_ok=True)
            path = cache / f"sphinx-corpus-v{CORPUS_VERSION}-{corpus.ndocs}-{corpus.seed}.tsv"
            if not path.exists():
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                try:
                    corpus.write_tsv(tmp)
                    os.replace(tmp, path)
                finally:
                    if tmp.exists():
                        tmp.unlink()
            return path
        path = work / "corpus.tsv"
        corpus.write_tsv(path)
        return path

    def _run_indexer(self, conf: Path, env: dict, m: dict) -> str:
        log = conf.parent / "indexer.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen([sv.which("indexer", "sphinxsearch"), "--config", str(conf), "--all"],
                                    stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                    env=env, cwd=str(conf.parent), start_new_session=True,
                                    preexec_fn=procs.pdeathsig)
            try:
                with RssSampler(proc.pid, interval=0.1) as samp:
                    rc = proc.wait(3600)
            except BaseException:
                procs.stop(proc, grace=5.0)
                raise
        m["indexer_rss_peak_kib"] = samp.peak_kib
        out = log.read_text(errors="replace")
        if rc != 0:
            raise SuiteError(f"indexer failed (exit status {rc})\n{sv.log_tail(log)}")
        return out

    def _serve(self, ctx, index_conf, thp, qfile, clients, secs, work, idle_s) -> dict:
        extra = opt_env(ctx)
        policy = keel_thp_for(ctx.allocator, thp)
        if policy is not None:
            extra["KEEL_THP"] = policy
        srv = sv.SphinxServer(ctx.allocator, workdir=work, index_conf=index_conf, extra_env=extra,
                              preexec=procs.thp_disable if thp == "off" else None,
                              ready_query="SELECT id FROM idx LIMIT 1")
        workers: list[subprocess.Popen] = []
        errs: list = []
        try:
            srv.start()
            r: dict = {}
            state = thp_enabled(srv.run_pid)
            if thp == "off" and state not in (0, None):
                raise SuiteError(f"PR_SET_THP_DISABLE did not take: searchd's THP_enabled is {state}")
            self.thp_state[thp] = state
            # warm-up: every query once, and a check that they all work
            with MySQLMini(srv.port, timeout=120) as c:
                for q in json.loads(qfile.read_text()):
                    try:
                        c.query(q)
                    except Exception as e:
                        srv.check_alive("the warm-up queries")
                        raise SuiteError(f"searchd: query {q!r} failed: {e}") from None
            r["rss_after_warmup_kib"] = srv.rss_kib()
            outs = [work / f"worker-{thp}-{i}.json" for i in range(clients)]
            cmd = [sys.executable, "-m", "keel_lab.suites.sphinx", "worker", str(srv.port),
                   str(qfile), str(secs)]
            env = dict(os.environ)
            env.pop("LD_PRELOAD", None)
            pkg_root = str(Path(__file__).resolve().parents[2])
            env["PYTHONPATH"] = pkg_root + os.pathsep + env.get("PYTHONPATH", "")
            with RssSampler(srv.pid, interval=0.2) as samp:
                for i, out in enumerate(outs):
                    errs.append(open(str(out) + ".err", "wb"))
                    workers.append(subprocess.Popen(
                        [*cmd, str(i * 37), str(out)], env=env, stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL, stderr=errs[-1],
                        start_new_session=True, preexec_fn=procs.pdeathsig))
                deadline = time.monotonic() + secs + 120
                while any(w.poll() is None for w in workers):
                    srv.check_alive(f"the query run (THP {thp})")
                    if time.monotonic() > deadline:
                        raise SuiteError(f"sphinx query workers did not finish within {secs + 120:.0f}s")
                    time.sleep(0.2)
            srv.check_alive(f"the query run (THP {thp})")
            lat: list[float] = []
            errors, elapsed = 0, 0.0
            for w, out in zip(workers, outs, strict=True):
                if w.returncode != 0 or not out.exists():
                    raise SuiteError(f"sphinx query worker failed ({w.returncode}):\n"
                                     f"{sv.log_tail(Path(str(out) + '.err'))}")
                d = json.loads(out.read_text())
                lat += d["lat_ms"]
                errors += d["errors"]
                elapsed = max(elapsed, d["seconds"])
                if d.get("first_error"):
                    r.setdefault("first_error", d["first_error"])
            if errors and not lat:
                raise SuiteError(f"searchd: every query failed, e.g. {r.get('first_error')}")
            lat.sort()
            r.update({
                "queries": len(lat), "errors": errors,
                "qps": round(len(lat) / elapsed, 2) if elapsed else None,
                "mean_ms": round(sum(lat) / len(lat), 4) if lat else None,
                "p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95),
                "p99_ms": percentile(lat, 99),
                "rss_peak_kib": samp.peak_kib, "rss_final_kib": srv.rss_kib(),
                "anon_huge_kib": procfs.smaps_rollup_kib(srv.run_pid, "AnonHugePages", absent=0),
                "vmhwm_kib": procfs.status_kib(srv.run_pid, "VmHWM", absent=0),
                "series": samp.series,
            })
            r.update(keel_figures(srv.run_pid, "keel_final"))
            # Idle memory, as an operator's server sits between bursts: allocators that
            # return free memory on a timer (Keel: purge_delay) have done so by then.
            time.sleep(idle_s)
            srv.check_alive(f"the idle wait (THP {thp})")
            r["rss_idle_kib"] = srv.rss_kib()
            r.update(keel_figures(srv.run_pid, "keel_idle"))
            return r
        finally:
            for w in workers:
                procs.stop(w, grace=5.0)
            for f in errs:
                f.close()
            srv.stop()


# ---------------------------------------------------------------------------------
# client worker process


def _worker(port: int, qfile: str, seconds: float, offset: int, out: str) -> None:
    queries = json.loads(Path(qfile).read_text())
    lat: list[float] = []
    errors = 0
    first_error = None
    c = MySQLMini(port, timeout=60)
    i = offset
    t0 = time.perf_counter()
    end = t0 + seconds
    pc = time.perf_counter
    try:
        while True:
            t = pc()
            if t >= end:
                break
            q = queries[i % len(queries)]
            i += 1
            try:
                c.query(q)
                lat.append(round((pc() - t) * 1000.0, 4))
            except (ConnectionError, OSError):
                raise
            except Exception as e:  # an error reply from searchd
                errors += 1
                first_error = first_error or f"{q}: {e}"
    finally:
        c.close()
    Path(out).write_text(json.dumps({"lat_ms": lat, "errors": errors, "first_error": first_error,
                                     "seconds": pc() - t0}))


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "worker":
        _worker(int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    else:
        sys.exit("usage: python -m keel_lab.suites.sphinx worker PORT QUERIES.json SECONDS "
                 "OFFSET OUT.json")
