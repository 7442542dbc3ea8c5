"""The bench driver: suites x rounds x allocators, results JSON, progress, summary.

Order: for each suite, for each round, every allocator once, in an order that rotates
from round to round (A B C, then B C A, then C A B ...) so that slow drifts of a shared
machine spread over all allocators. Every run gets a fresh temporary work directory,
removed afterwards. The results file is rewritten (atomically) after every run, so an
interrupted bench leaves its finished runs behind, marked "complete": false.

Only one benchmark runs at a time on a machine: the bench takes the same lock as
bench/run.py (/tmp/keel-bench.lock) and waits for whoever holds it.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Optional, TextIO

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Table

from . import __version__
from . import suites as suite_registry
from .allocators import Allocator
from .paths import SOURCE_DIR
from .suites.base import SuiteContext, SuiteError
from .summary import FORMAT, direction, fmt_spread, fmt_value, summarize

LOCK_PATH = Path(tempfile.gettempdir()) / "keel-bench.lock"


class BenchError(RuntimeError):
    """Setup problem (exit status 2)."""


# ---------------------------------------------------------------------------------
# facts about the machine and the software


def _run(cmd: list[str], cwd: Optional[Path] = None) -> Optional[str]:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def os_release() -> Optional[str]:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return None


def machine_info() -> dict:
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1])
    except OSError:
        pass
    thp = None
    try:
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    except OSError:
        pass
    return {"hostname": socket.gethostname(), "nproc": os.cpu_count(),
            "memory_kib": mem, "kernel": platform.release(), "cpu_model": cpu_model(),
            "os": os_release(), "arch": platform.machine(), "thp": thp,
            "load": list(os.getloadavg())}


def package_of(path: str) -> tuple[Optional[str], Optional[str]]:
    """(Debian package, version) that ships path, via dpkg-query."""
    for p in dict.fromkeys([path, os.path.realpath(path)]):
        out = _run(["dpkg-query", "-S", p])
        if out:
            pkg = out.splitlines()[0].split(":", 1)[0].strip()
            if "," in pkg:
                pkg = pkg.split(",")[0].strip()
            ver = _run(["dpkg-query", "-W", "-f=${Version}", pkg])
            return pkg, ver
    return None, None


def allocator_info(a: Allocator) -> dict:
    """Library, package and version of an allocator; "env": a variant's extra environment
    (keel+mesh: {"KEEL_MESH": "on"}); "is_keel": Keel, under whatever name."""
    extra = {"env": dict(a.extra_env), "is_keel": a.is_keel}
    if a.path is None:
        pkg, ver = package_of(f"/lib/{_multiarch()}/libc.so.6")
        return {"path": None, "real_path": None, "package": pkg or "libc6",
                "version": ver or (os.confstr("CS_GNU_LIBC_VERSION") or None), **extra}
    real = os.path.realpath(a.path)
    info: dict[str, Any] = {"path": a.path, "real_path": real, **extra}
    pkg, ver = package_of(a.path)
    info["package"], info["version"] = pkg, ver
    try:
        info["sha256"] = hashlib.sha256(Path(real).read_bytes()).hexdigest()
    except OSError:
        info["sha256"] = None
    if pkg is None:
        git = git_info(Path(real).parent)
        if git:
            info["git"] = git
    return info


def _multiarch() -> str:
    from .allocators import multiarch
    return multiarch()


def git_info(where: Path = SOURCE_DIR) -> Optional[dict]:
    rev = _run(["git", "rev-parse", "HEAD"], cwd=where)
    if not rev:
        return None
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where)
    return {"revision": rev, "dirty": bool(dirty), "describe": _run(
        ["git", "describe", "--always", "--dirty"], cwd=where)}


# ---------------------------------------------------------------------------------
# the lock shared with bench/run.py


class MachineLock:
    def __init__(self, console: Console, path: Path = LOCK_PATH):
        self.console, self.path = console, path
        self.f: Optional[TextIO] = None

    def __enter__(self):
        try:
            f = self.f = open(self.path, "a+")
        except OSError as e:
            self.console.print(f"[yellow]warning: cannot open {self.path} ({e}); not checking "
                               "for other benchmarks[/]")
            return self
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip()
            self.console.print(f"another benchmark is running ({holder or self.path}); "
                               "waiting for it to finish (Ctrl-C to give up)...")
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(f"keel bench, pid {os.getpid()} since {dt.datetime.now():%H:%M:%S}")
        f.flush()
        return self

    def __exit__(self, *exc):
        if self.f:
            self.f.close()


# ---------------------------------------------------------------------------------


def _clean(x: Any) -> Any:
    """JSON-safe copy: NaN/inf -> None, tuples -> lists, Paths -> str."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    if x is None or isinstance(x, (str, int, bool)):
        return x
    return str(x)


def write_json_atomic(doc: dict, out: Path) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_clean(doc), f, indent=1, allow_nan=False)
            f.write("\n")
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_writable(out: Path) -> None:
    """BenchError unless the results file can be written (its directory created if
    needed, a file made in it), so that a typo in --out fails at once, not after the
    first run."""
    if out.is_dir():
        raise BenchError(f"--out {out} is a directory: give a file name, e.g. "
                         f"{out / 'results.json'}")
    blocked = next((d for d in (out.parent, *out.parent.parents) if d.exists() and not d.is_dir()),
                   None)
    if blocked is not None:
        raise BenchError(f"cannot write the results file {out}: {blocked} is not a directory")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        where = f" ({e.filename})" if e.filename and str(e.filename) != str(out.parent) else ""
        raise BenchError(f"cannot write the results file {out}: {e.strerror or e}{where}") from None


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def default_out(suites: list[str]) -> Path:
    return Path("results") / f"bench-{dt.datetime.now():%Y%m%d-%H%M%S}-{'-'.join(suites)}.json"


def rotation(allocs: list, rnd: int) -> list:
    k = rnd % len(allocs)
    return allocs[k:] + allocs[:k]


class _Terminate(Exception):
    pass


def run_bench(suite_names: list[str], allocs: list[Allocator], rounds: int = 3,
              quick: bool = False, out: Optional[Path] = None, build_dir: Path = Path("build"),
              options: Optional[dict] = None, console: Optional[Console] = None,
              lock: bool = True, command: Optional[str] = None) -> tuple[dict, Path]:
    """Runs the bench; returns (results document, path written). Raises BenchError for
    setup problems. Ctrl-C (or SIGTERM) stops it: the document is then marked
    interrupted and incomplete, and still written."""
    console = console or Console(stderr=True)
    options = options or {}
    if rounds < 1:
        raise BenchError("--rounds must be at least 1")
    if not allocs:
        raise BenchError("no allocators to compare")
    names = [a.name for a in allocs]
    if len(set(names)) != len(names):
        raise BenchError(f"an allocator is listed twice: {', '.join(names)}")
    unknown = [s for s in suite_names
               if s not in suite_registry.REGISTRY and not suite_registry.unavailable_reason(s)]
    if unknown:
        known = sorted(set(suite_registry.REGISTRY) | set(suite_registry.UNAVAILABLE))
        raise BenchError(f"unknown suite(s) {', '.join(unknown)} (known: {', '.join(known)})")
    if not suite_names:
        raise BenchError("no suites given")
    stray = [s for s in options if s not in suite_names]
    if stray:
        raise BenchError(f"--set names suite(s) {', '.join(stray)}, which this bench does not "
                         f"run ({', '.join(suite_names)})")
    for s in suite_names:      # a bad --set value: one line now, not a failed suite later
        cls = suite_registry.REGISTRY.get(s)
        if cls is not None:
            try:
                cls().check_options(SuiteContext(allocator=allocs[0], quick=quick, workdir=Path("."),
                                                 options=dict(options.get(s, {})),
                                                 build_dir=build_dir))
            except SuiteError as e:
                raise BenchError(str(e)) from None
    out = Path(out) if out else default_out(suite_names)
    check_writable(out)

    started = dt.datetime.now().astimezone()
    meta: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"), "finished": None, "elapsed_s": None,
        "complete": False, "interrupted": False,
        "command": command, "lab_version": __version__,
        "suites": list(suite_names), "allocators": names, "rounds": rounds, "quick": quick,
        "options": options,
        "allocator_info": {a.name: allocator_info(a) for a in allocs},
        "machine": machine_info(),
        "keel": {"git": git_info(SOURCE_DIR), "build_dir": str(build_dir),
                 "source_dir": str(SOURCE_DIR)},
        "python": platform.python_version(),
    }
    doc: dict = {"format": FORMAT, "version": 1, "meta": meta, "suites": {}}
    for s in suite_names:
        cls = suite_registry.REGISTRY.get(s)
        doc["suites"][s] = {"description": cls.description if cls else "", "error": None,
                            "runs": []}
    t_start = time.monotonic()

    def save(final: bool = False) -> None:
        meta["elapsed_s"] = round(time.monotonic() - t_start, 2)
        if final:
            meta["finished"] = dt.datetime.now().astimezone().isoformat(timespec="seconds")
            meta["machine"]["load_end"] = list(os.getloadavg())
        doc["summary"] = summary_json(doc)
        try:
            write_json_atomic(doc, out)
        except OSError as e:
            raise BenchError(f"cannot write the results file {out}: {e.strerror or e}") from None

    total = len(suite_names) * rounds * len(allocs)
    old_term = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    if hasattr(signal, "SIGTERM") and _main_thread():
        signal.signal(signal.SIGTERM, on_term)
    lock_cm = MachineLock(console) if lock else _Null()
    try:
        with lock_cm:
            save()
            console.print(f"keel bench: {len(suite_names)} suite(s) x {rounds} round(s) x "
                          f"{len(allocs)} allocator(s) = {total} runs"
                          f"{' (quick)' if quick else ''}; results: {out}")
            load = os.getloadavg()[0]
            if load > 0.5 * (os.cpu_count() or 1):
                console.print(f"[yellow]note: the machine is busy (load {load:.2f} on "
                              f"{os.cpu_count()} CPUs): results will be noisy[/]")
            _loop(doc, suite_names, allocs, rounds, quick, build_dir, options, console,
                  total, save)
            meta["complete"] = not meta["interrupted"]
    except KeyboardInterrupt:
        meta["interrupted"] = True
        meta["complete"] = False
        console.print("[yellow]interrupted: writing the runs finished so far[/]")
    finally:
        if _main_thread():
            signal.signal(signal.SIGTERM, old_term)
        save(final=True)
    return doc, out


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _loop(doc, suite_names, allocs, rounds, quick, build_dir, options, console, total, save):
    meta = doc["meta"]
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("runs"), TimeElapsedColumn(),
                        TextColumn("left"), TimeRemainingColumn(), console=console,
                        transient=True)
    done = 0
    with progress:
        task = progress.add_task("starting", total=total)
        for s in suite_names:
            entry = doc["suites"][s]
            n_runs = rounds * len(allocs)
            try:
                cls = suite_registry.get(s)
                suite = cls()
                ctx0 = SuiteContext(allocator=allocs[0], quick=quick, workdir=Path("."),
                                    options=dict(options.get(s, {})), build_dir=build_dir)
                suite.check(ctx0)
            except SuiteError as e:
                entry["error"] = str(e)
                console.print(f"[red]suite {s}: {e}[/]\n[red]skipping suite {s}[/]")
                done += n_runs
                progress.update(task, completed=done)
                save()
                continue
            except Exception as e:  # noqa: BLE001 -- a broken suite must not stop the bench
                entry["error"] = f"internal error in suite {s}: {type(e).__name__}: {e}"
                entry["traceback"] = traceback.format_exc()
                console.print(f"[red]{entry['error']}[/]")
                done += n_runs
                progress.update(task, completed=done)
                save()
                continue
            for rnd in range(rounds):
                for pos, a in enumerate(rotation(allocs, rnd)):
                    label = f"{s} round {rnd + 1}/{rounds} {a.name}"
                    progress.update(task, description=label)

                    def report(msg: str, fraction: Optional[float] = None, _l=label,
                               _d=done) -> None:
                        progress.update(task, description=f"{_l}: {msg}",
                                        completed=_d + (min(max(fraction, 0), 1)
                                                        if fraction is not None else 0))

                    run = {"round": rnd + 1, "position": pos + 1, "allocator": a.name,
                           "started": dt.datetime.now().astimezone().isoformat(timespec="seconds")}
                    # a variant's name may hold a / (keel+KEEL_PROFILE_PREFIX=/tmp/p)
                    safe = re.sub(r"[^A-Za-z0-9_.+=-]+", "_", a.name)
                    wd = Path(tempfile.mkdtemp(prefix=f"keel-{s}-{safe}-r{rnd + 1}-"))
                    t0 = time.monotonic()
                    try:
                        ctx = SuiteContext(allocator=a, quick=quick, workdir=wd, progress=report,
                                           options=dict(options.get(s, {})), build_dir=build_dir)
                        result = suite.run(ctx)
                        if not isinstance(result, dict) or not isinstance(result.get("metrics"), dict):
                            raise SuiteError(f"suite {s} returned no metrics")
                        run.update(ok=True, result=result)
                    except SuiteError as e:
                        run.update(ok=False, error=str(e))
                    except KeyboardInterrupt:
                        meta["interrupted"] = True
                        run.update(ok=False, error="interrupted (Ctrl-C)", interrupted=True)
                    except Exception as e:  # noqa: BLE001
                        run.update(ok=False, error=f"internal error: {type(e).__name__}: {e}",
                                   traceback=traceback.format_exc())
                    finally:
                        shutil.rmtree(wd, ignore_errors=True)
                    run["duration_s"] = round(time.monotonic() - t0, 3)
                    if not run.get("interrupted"):
                        entry["runs"].append(run)
                    done += 1
                    progress.update(task, completed=done, description=label)
                    if run.get("interrupted"):
                        save()
                        raise KeyboardInterrupt
                    if run["ok"]:
                        progress.console.print(f"  {label}: ok ({run['duration_s']:.1f} s)"
                                               + _brief(run["result"]))
                    else:
                        progress.console.print(f"  [red]{label}: FAILED: {run['error']}[/]")
                    save()


def _brief(result: dict) -> str:
    m = result.get("metrics", {})
    head = result.get("headline") or {}
    keys = [k for k in list(head.values()) + ["throughput", "p99_ms", "rss_peak_kib"]
            if k in m]
    keys = list(dict.fromkeys(keys))[:3]
    return "".join(f"  {k}={fmt_value(m[k])}" for k in keys)


# ---------------------------------------------------------------------------------
# summaries


def summary_json(doc: dict) -> dict:
    out = {}
    for name, ss in summarize(doc).items():
        out[name] = {
            "headline": ss.headline,
            "best": ss.best,
            "errors": len(ss.errors), "problems": ss.problems,
            "metrics": {m: {a: {"median": st.median, "min": st.min, "max": st.max,
                                "n": len(st.values), "spread": round(st.spread, 4),
                                "ratio_to_best": None if st.ratio is None else round(st.ratio, 4)}
                            for a, st in per.items()}
                        for m, per in ss.metrics.items()},
        }
    return out


def summary_tables(doc: dict, details: bool = False) -> list[Table]:
    """One rich table per suite: rows = metrics, columns = allocators; each cell is the
    median, its ratio to the best allocator (x1.00 = best) and the spread of the runs.
    Without details, the headline metrics in words and units (as the HTML report's
    short table); with details, every metric under its raw name."""
    from .report import largest_median, readable_metric
    tables = []
    meta = doc.get("meta", {})
    for name, ss in summarize(doc).items():
        n = meta.get("rounds", "?")
        t = Table(title=f"{name}: median of {n} round{'' if n == 1 else 's'}",
                  title_justify="left", show_lines=False)
        t.add_column("metric" if details else "what", style="bold")
        t.add_column("better", style="dim")
        for a in ss.allocators:
            t.add_column(a, justify="right")
        head = [m for m in dict.fromkeys(ss.headline.values()) if m in ss.metrics]
        shown = ss.ordered_metrics(details=True) if details or not head else head
        for m in shown:
            per = ss.metrics[m]
            d = direction(m) or ""
            label, unit, scale = readable_metric(m, largest_median(per))
            if details or not head:
                label, scale = m, 1.0
            elif unit:
                label += f" ({unit})"
            cells = []
            for a in ss.allocators:
                st = per.get(a)
                if st is None:
                    cells.append("[red]FAIL[/]" if ss.runs_failed.get(a) else "-")
                    continue
                txt = fmt_value(st.median * scale if st.median is not None else None)
                if st.ratio is not None:
                    txt += f" x{st.ratio:.2f}"
                if len(st.values) > 1:
                    sp = fmt_spread(st.spread)
                    txt += f" [yellow]{sp}[/]" if st.noisy else f" [dim]{sp}[/]"
                if ss.best.get(m) == a and len(per) > 1:
                    txt = f"[green bold]{txt}[/]"
                cells.append(txt)
            t.add_row(label, d, *cells)
        hidden = len(ss.metrics) - len(shown)
        caption = ["xN: N times the best (x1.00 = best, green); %: spread of the runs, "
                   "(max-min)/median, yellow above 10%"]
        if hidden:
            caption.append(f"{hidden} more metric(s): --details, or keel report")
        if ss.errors:
            caption.append(f"[red]{len(ss.errors)} error(s)[/]")
        if ss.problems:
            caption.append("[red]" + "; ".join(ss.problems) + "[/]")
        if caption:
            t.caption = "; ".join(caption)
            t.caption_justify = "left"
        tables.append(t)
    return tables


def print_summary(doc: dict, console: Console, details: bool = False) -> None:
    """The answer first (who wins, by how much, against the noise), then the tables."""
    from .recommend import render_text
    from .summary import ResultsError
    try:
        console.print(render_text(doc), markup=False, highlight=False)
    except (ResultsError, KeyError, TypeError, ValueError):
        pass  # the tables below still say what was measured
    for t in summary_tables(doc, details=details):
        console.print(t)
    for name, ss in summarize(doc).items():
        for e in ss.errors:
            console.print(f"[red]{name}: {e}[/]")
        for p in ss.problems:
            console.print(f"[red]{name}: PROBLEM: {p}[/]")


def run_status(doc: dict) -> int:
    """Exit status for a finished bench: 130 interrupted, 1 errors/problems, 0 fine."""
    if doc["meta"].get("interrupted"):
        return 130
    sums = summarize(doc)
    if any(ss.errors or ss.problems for ss in sums.values()):
        return 1
    return 0

