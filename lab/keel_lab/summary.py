"""From a results document (keel bench's JSON) to per-suite statistics: medians per
allocator and metric, the ratio to the best allocator, and the spread of the runs.

Used by the terminal table, `keel recommend` and `keel report`, so the three agree.
"""
from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .measure import spread

FORMAT = "keel-lab-results"
NOISY = 0.10            # spread above which a median is flagged as noisy

# rps: requests per second (redis-ops' <test>_<config>_rps, redis-frag's fill_rps_<size>)
_HIGHER = re.compile(r"(throughput|tps|qps|(^|_)rps(_|$)|ops|per_s|_rate|hit)", re.I)
_LOWER = re.compile(r"(_ms|_us|_ns|_s|_kib|_mib|_bytes|_pages|rss|frag|time|latency|faults|"
                    r"overhead|_geomean|_per_txn)$|^(rss|frag|wall|cpu)", re.I)
# what meshing did (pages given back, views, views written since): counts to read, not
# scores (mesh_pages would otherwise read as "pages, lower is better")
_NEUTRAL = re.compile(r"^mesh_(pages|views|eroded)", re.I)

# what recommend/report call the "headline" metrics of a suite, in order of preference
SPEED_KEYS = ("throughput", "tps", "qps", "ops_per_s", "wall_s_geomean", "wall_s", "start_ms")
MEMORY_KEYS = ("rss_peak_kib", "rss_final_kib", "rss_per_thread_kib", "rss_kib",
               "rss_peak_kib_geomean")
TAIL_KEYS = ("p99_ms", "p95_ms")


class ResultsError(RuntimeError):
    """A results file that cannot be used, with a message for the operator."""


def direction(metric: str) -> Optional[str]:
    """'higher' or 'lower' (is better), or None when the name does not say."""
    base = metric.rsplit(".", 1)[-1]
    if _NEUTRAL.search(base):
        return None
    if _HIGHER.search(base):
        return "higher"
    if _LOWER.search(base):
        return "lower"
    return None


def load(path: str | Path) -> dict:
    """Reads and checks a results file; ResultsError with a clear message otherwise."""
    p = Path(path)
    if not p.exists():
        raise ResultsError(f"results file {p} does not exist")
    if p.is_dir():
        raise ResultsError(f"{p} is a directory, not a results file")
    try:
        text = p.read_text()
    except OSError as e:
        raise ResultsError(f"cannot read {p}: {e.strerror or e}") from None
    if not text.strip():
        raise ResultsError(f"{p} is empty (was the bench killed before it wrote anything?)")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultsError(f"{p} is not valid JSON (line {e.lineno}, column {e.colno}: "
                           f"{e.msg}); is it a keel bench results file?") from None
    validate(doc, str(p))
    return doc


def _names(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def validate(doc: Any, where: str = "results") -> None:
    """Checks the structure that the summary, `keel recommend` and `keel report` rely on;
    ResultsError naming the first part that is wrong."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ResultsError(f"{where} is not a keel bench results file (no "
                           f"\"format\": \"{FORMAT}\" at the top)")
    if not isinstance(doc.get("meta"), dict) or not isinstance(doc.get("suites"), dict):
        raise ResultsError(f"{where}: \"meta\" and \"suites\" must be objects")
    meta = doc["meta"]
    for key in ("suites", "allocators"):
        if meta.get(key) is not None and not _names(meta[key]):
            raise ResultsError(f"{where}: meta.{key} must be a list of names")
    for key in ("machine", "keel", "allocator_info", "options"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            raise ResultsError(f"{where}: meta.{key} must be an object")
    if not isinstance((meta.get("keel") or {}).get("git") or {}, dict):
        raise ResultsError(f"{where}: meta.keel.git must be an object")
    for a, info in (meta.get("allocator_info") or {}).items():
        if not isinstance(info, dict) or not isinstance(info.get("git") or {}, dict) \
                or not isinstance(info.get("env") or {}, dict):
            raise ResultsError(f"{where}: meta.allocator_info.{a} must be an object "
                               f"(with objects for git and env)")
    for name, s in doc["suites"].items():
        if not isinstance(s, dict) or not isinstance(s.get("runs", []), list):
            raise ResultsError(f"{where}: suite {name!r} has no list of runs")
        for i, r in enumerate(s.get("runs", [])):
            at = f"{where}: suite {name!r}, run {i + 1}"
            if not isinstance(r, dict) or "allocator" not in r:
                raise ResultsError(f"{at}: no allocator")
            if not isinstance(r["allocator"], str):
                raise ResultsError(f"{at}: the allocator must be a name, not {r['allocator']!r}")
            res = r.get("result")
            if res is not None and not isinstance(res, dict):
                raise ResultsError(f"{at}: \"result\" must be an object")
            if r.get("ok") and not isinstance((res or {}).get("metrics"), dict):
                raise ResultsError(f"{at}: no metrics")
            _validate_result(res or {}, at)


# the optional parts of a run's result (suites/base.py) and the type each must have
_RESULT_PARTS = (("headline", dict, "an object"), ("checksums", dict, "an object"),
                 ("series", dict, "an object"), ("notes", list, "a list"),
                 ("points", list, "a list"), ("phases", list, "a list"))


def _validate_result(res: dict, at: str) -> None:
    for key, typ, what in _RESULT_PARTS:
        v = res.get(key)
        if v is not None and not isinstance(v, typ):
            raise ResultsError(f"{at}: result.{key} must be {what}")
    if not all(isinstance(m, str) for m in (res.get("headline") or {}).values()):
        raise ResultsError(f"{at}: result.headline must map kinds to metric names")
    for key in ("points", "phases"):
        if not all(isinstance(p, dict) for p in res.get(key) or []):
            raise ResultsError(f"{at}: result.{key} must be a list of objects")
    if not all(isinstance(v, list) for v in (res.get("series") or {}).values()):
        raise ResultsError(f"{at}: result.series must map names to lists of [t, value]")


@dataclass
class Stat:
    values: list[float]
    median: float
    min: float
    max: float
    spread: float            # (max - min) / median
    ratio: Optional[float] = None   # >= 1: times worse than the best (1.0 = best)

    @property
    def noisy(self) -> bool:
        return len(self.values) > 1 and self.spread > NOISY


@dataclass
class SuiteSummary:
    name: str
    description: str
    allocators: list[str]
    metrics: dict[str, dict[str, Stat]] = field(default_factory=dict)  # metric -> alloc -> Stat
    best: dict[str, str] = field(default_factory=dict)                 # metric -> allocator
    runs_ok: dict[str, int] = field(default_factory=dict)
    runs_failed: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)                    # run/suite errors
    problems: list[str] = field(default_factory=list)                  # e.g. checksum mismatch
    headline: dict[str, str] = field(default_factory=dict)             # speed/memory/tail -> metric
    notes: list[str] = field(default_factory=list)

    def ordered_metrics(self, details: bool = True) -> list[str]:
        head = [m for m in self.headline.values() if m in self.metrics]
        rest = [m for m in self.metrics if m not in head and "." not in m]
        items = [m for m in self.metrics if m not in head and "." in m] if details else []
        return list(dict.fromkeys(head + rest + items))


def _num(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return float(v)


def summarize(doc: dict) -> dict[str, SuiteSummary]:
    meta = doc.get("meta", {})
    order = list(meta.get("allocators") or [])
    out: dict[str, SuiteSummary] = {}
    for name, s in doc.get("suites", {}).items():
        runs = s.get("runs", [])
        allocs = list(order) or list(dict.fromkeys(r["allocator"] for r in runs))
        for r in runs:
            if r["allocator"] not in allocs:
                allocs.append(r["allocator"])
        ss = SuiteSummary(name, s.get("description", ""), allocs)
        if s.get("error"):
            ss.errors.append(s["error"])
        values: dict[str, dict[str, list[float]]] = {}
        headline: dict[str, str] = {}
        checks: dict[str, dict[str, set]] = {}
        for r in runs:
            a = r["allocator"]
            if not r.get("ok"):
                ss.runs_failed[a] = ss.runs_failed.get(a, 0) + 1
                ss.errors.append(f"{a}, round {r.get('round', '?')}: {r.get('error', 'failed')}")
                continue
            ss.runs_ok[a] = ss.runs_ok.get(a, 0) + 1
            res = r.get("result") or {}
            for m, v in (res.get("metrics") or {}).items():
                x = _num(v)
                if x is not None:
                    values.setdefault(m, {}).setdefault(a, []).append(x)
            for k, m in (res.get("headline") or {}).items():
                headline.setdefault(k, m)
            for prog, c in (res.get("checksums") or {}).items():
                checks.setdefault(prog, {}).setdefault(str(c), set()).add(a)
            for n in res.get("notes") or []:
                if n not in ss.notes:
                    ss.notes.append(n)
        for prog, seen in checks.items():
            if len(seen) > 1:
                desc = "; ".join(f"{c}: {', '.join(sorted(al))}" for c, al in seen.items())
                ss.problems.append(f"{prog}: checksum differs between allocators ({desc})")
        for m, per in values.items():
            stats = {}
            for a, vals in per.items():
                med = statistics.median(vals)
                stats[a] = Stat(vals, med, min(vals), max(vals), spread(vals) or 0.0)
            d = direction(m)
            if d and stats:
                pick = max if d == "higher" else min
                best = pick(stats, key=lambda a: stats[a].median)
                ss.best[m] = best
                b = stats[best].median
                for st in stats.values():
                    if d == "lower":
                        st.ratio = (st.median / b) if b > 0 else (1.0 if st.median == 0 else None)
                    else:
                        st.ratio = (b / st.median) if st.median > 0 else None
            ss.metrics[m] = stats
        for kind, keys in (("speed", SPEED_KEYS), ("memory", MEMORY_KEYS), ("tail", TAIL_KEYS)):
            m = headline.get(kind)
            if m not in ss.metrics:
                m = next((k for k in keys if k in ss.metrics), None)
            if m:
                ss.headline[kind] = m
        out[name] = ss
    return out


def fmt_value(v: Optional[float]) -> str:
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    if a == 0:
        return "0"
    return f"{v:.3g}"


def fmt_spread(s: Optional[float]) -> str:
    if s is None:
        return "-"
    return f"{s * 100:.1f}%" if s < 0.1 else f"{s * 100:.0f}%"
