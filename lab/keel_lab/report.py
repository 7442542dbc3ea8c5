"""`keel report`: a self-contained HTML report from a results file.

Everything is inline: charts are SVG drawn by matplotlib and embedded in the page, the
style sheet is in the page, and nothing is loaded from anywhere else, so the file can
be mailed or attached to an issue. Charts (each an <svg class="chart"> with a stable id):

  chart-<suite>-points-<key>    <key> (throughput, p95_ms, rss_kib, ...) vs threads/clients
  chart-<suite>-series-<key>    RSS (or another sampled value) over time, every run
  chart-<suite>-latency         mean/p50/p95/p99 per allocator (median of runs, min-max bars)
  chart-<suite>-phases-<key>    RSS / fragmentation per phase of the workload
  chart-<suite>-headline        the suite's headline metrics per allocator
  chart-<suite>-detail-<metric> per-item metrics (e.g. each micro program) relative to the best

The page is written to a temporary file next to the target and renamed, so a failure
never leaves a half-written report.
"""
from __future__ import annotations

import datetime as dt
import html
import io
import os
import re
import statistics
import tempfile
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from . import __version__  # noqa: E402
from .keel_options import OPTIONS  # noqa: E402
from .recommend import KINDS, overall, recommend  # noqa: E402
from .summary import (SuiteSummary, direction, fmt_spread, fmt_value, load,  # noqa: E402
                      summarize)

COLORS = {"glibc": "#7f7f7f", "jemalloc": "#1f77b4", "tcmalloc": "#ff7f0e",
          "mimalloc": "#9467bd", "keel": "#2ca02c"}
EXTRA_COLORS = ["#d62728", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
LATENCY_KEYS = ("mean_ms", "p50_ms", "p95_ms", "p99_ms")

plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "keel-lab", "font.size": 9,
                     "axes.spines.top": False, "axes.spines.right": False,
                     "axes.grid": True, "grid.alpha": 0.3, "figure.dpi": 100})


def _color(alloc: str, order: list[str]) -> str:
    if alloc in COLORS:
        return COLORS[alloc]
    extra = [a for a in order if a not in COLORS]
    return EXTRA_COLORS[extra.index(alloc) % len(EXTRA_COLORS)] if alloc in extra else "#000"


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", s).strip("-") or "x"


_ID_RE = re.compile(r'\bid="([^"]+)"')


def _svg(fig, chart_id: str, title: str) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    s = buf.getvalue()
    s = s[s.index("<svg"):]
    s = re.sub(r"<metadata>.*?</metadata>", "", s, flags=re.S)
    # ids must be unique in the page: prefix matplotlib's own with the chart id
    for old in set(_ID_RE.findall(s)):
        new = f"{chart_id}-{old}"
        s = s.replace(f'id="{old}"', f'id="{new}"').replace(f"#{old})", f"#{new})") \
             .replace(f'href="#{old}"', f'href="#{new}"')
    s = s.replace("<svg ", f'<svg id="{chart_id}" class="chart" role="img" '
                           f'aria-label="{html.escape(title)}" ', 1)
    return f'<figure class="chart">{s}<figcaption>{html.escape(title)}</figcaption></figure>'


def _ok_runs(doc: dict, suite: str) -> list[dict]:
    return [r for r in doc["suites"][suite].get("runs", []) if r.get("ok")]


def _num(v) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# ---------------------------------------------------------------------------------
# charts


def chart_points(doc: dict, suite: str, order: list[str]) -> list[str]:
    runs = _ok_runs(doc, suite)
    data: dict[str, dict[str, dict[float, list[float]]]] = {}   # key -> alloc -> x -> values
    x_label = "x"
    for r in runs:
        res = r["result"]
        x_label = res.get("x_label", x_label)
        for p in res.get("points") or []:
            x = _num(p.get("x"))
            if x is None:
                continue
            for k, v in p.items():
                if k == "x" or _num(v) is None:
                    continue
                data.setdefault(k, {}).setdefault(r["allocator"], {}).setdefault(x, []).append(v)
    out = []
    for key, per in data.items():
        fig, ax = plt.subplots(figsize=(5.3, 3.3))
        xs_all = sorted({x for a in per.values() for x in a})
        for a in [a for a in order if a in per] + [a for a in per if a not in order]:
            xs = sorted(per[a])
            med = [statistics.median(per[a][x]) for x in xs]
            lo = [min(per[a][x]) for x in xs]
            hi = [max(per[a][x]) for x in xs]
            c = _color(a, order)
            ax.plot(xs, med, marker="o", ms=3, label=a, color=c)
            if any(h != l_ for h, l_ in zip(hi, lo, strict=True)):
                ax.fill_between(xs, lo, hi, color=c, alpha=0.15, linewidth=0)
        if xs_all and xs_all[0] > 0 and xs_all[-1] / xs_all[0] >= 16:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs_all)
            ax.set_xticklabels([f"{x:g}" for x in xs_all])
        d = direction(key)
        ax.set_xlabel(x_label)
        ax.set_ylabel(key + (f"  ({d} is better)" if d else ""))
        ax.legend(fontsize=8)
        title = f"{suite}: {key} vs {x_label} (median of rounds, band = min-max)"
        ax.set_title(title, fontsize=9)
        out.append(_svg(fig, f"chart-{_slug(suite)}-points-{_slug(key)}", title))
    return out


def chart_series(doc: dict, suite: str, order: list[str]) -> list[str]:
    runs = _ok_runs(doc, suite)
    keys = []
    for r in runs:
        for k, v in (r["result"].get("series") or {}).items():
            if isinstance(v, list) and v and k not in keys:
                keys.append(k)
    out = []
    for key in keys:
        fig, ax = plt.subplots(figsize=(5.3, 3.3))
        mib = key.endswith("_kib")
        labelled = set()
        for r in sorted(runs, key=lambda r: order.index(r["allocator"]) if r["allocator"] in order else 99):
            pts = [p for p in (r["result"].get("series") or {}).get(key, [])
                   if isinstance(p, (list, tuple)) and len(p) == 2
                   and _num(p[0]) is not None and _num(p[1]) is not None]
            if not pts:
                continue
            a = r["allocator"]
            ys = [p[1] / 1024 if mib else p[1] for p in pts]
            ax.plot([p[0] for p in pts], ys, color=_color(a, order), alpha=0.85, linewidth=1.2,
                    label=None if a in labelled else a)
            labelled.add(a)
        ax.set_xlabel("seconds")
        ax.set_ylabel(key.replace("_kib", " (MiB)") if mib else key)
        ax.legend(fontsize=8)
        title = f"{suite}: {key.replace('_kib', '')} over time (every run)"
        ax.set_title(title, fontsize=9)
        out.append(_svg(fig, f"chart-{_slug(suite)}-series-{_slug(key)}", title))
    return out


def _grouped_bars(ax, groups: list[str], allocs: list[str], med, lo, hi, order) -> None:
    n = max(len(allocs), 1)
    w = 0.8 / n
    for i, a in enumerate(allocs):
        xs = [g + (i - (n - 1) / 2) * w for g in range(len(groups))]
        m = [med(a, g) for g in groups]
        vals = [v if v is not None else 0 for v in m]
        err_lo = [max(0, (v or 0) - (lo(a, g) or 0)) if v is not None else 0
                  for v, g in zip(m, groups, strict=True)]
        err_hi = [max(0, (hi(a, g) or 0) - (v or 0)) if v is not None else 0
                  for v, g in zip(m, groups, strict=True)]
        ax.bar(xs, vals, w, label=a, color=_color(a, order),
               yerr=[err_lo, err_hi] if any(err_lo) or any(err_hi) else None,
               capsize=2, error_kw={"elinewidth": 0.8})
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=20 if len(groups) > 5 else 0, ha="right" if len(groups) > 5 else "center")
    ax.legend(fontsize=8)


def chart_latency(ss: SuiteSummary, suite: str, order: list[str]) -> list[str]:
    keys = [k for k in LATENCY_KEYS if k in ss.metrics]
    if not keys:
        return []
    allocs = [a for a in ss.allocators if any(a in ss.metrics[k] for k in keys)]
    def stat(attr: str):
        def get(a: str, k: str) -> Optional[float]:
            st = ss.metrics[k].get(a)
            return getattr(st, attr) if st is not None else None
        return get

    fig, ax = plt.subplots(figsize=(5.3, 3.3))
    _grouped_bars(ax, keys, allocs, stat("median"), stat("min"), stat("max"), order)
    ax.set_ylabel("milliseconds (lower is better)")
    title = f"{suite}: latency percentiles (median of rounds, bars = min-max)"
    ax.set_title(title, fontsize=9)
    return [_svg(fig, f"chart-{_slug(suite)}-latency", title)]


def chart_phases(doc: dict, suite: str, order: list[str]) -> list[str]:
    runs = _ok_runs(doc, suite)
    data: dict[str, dict[str, dict[str, list[float]]]] = {}   # key -> alloc -> phase -> values
    phases: list[str] = []
    label = "phase"
    for r in runs:
        label = r["result"].get("phase_label", label)
        for p in r["result"].get("phases") or []:
            name = str(p.get("phase", "?"))
            if name not in phases:
                phases.append(name)
            for k, v in p.items():
                if k != "phase" and _num(v) is not None:
                    data.setdefault(k, {}).setdefault(r["allocator"], {}).setdefault(name, []).append(v)
    out = []
    for key, per in data.items():
        allocs = [a for a in order if a in per] + [a for a in per if a not in order]
        mib = key.endswith("_kib")
        conv = (lambda v: v / 1024) if mib else (lambda v: v)  # noqa: E731

        def agg(fn, a, g, per=per, conv=conv):     # this key's values (bound now)
            vals = per.get(a, {}).get(g)
            return conv(fn(vals)) if vals else None

        fig, ax = plt.subplots(figsize=(5.3, 3.3))
        _grouped_bars(ax, phases, allocs, lambda a, g: agg(statistics.median, a, g),
                      lambda a, g: agg(min, a, g), lambda a, g: agg(max, a, g), order)
        ax.set_ylabel(key.replace("_kib", " (MiB)") if mib else key)
        title = f"{suite}: {key.replace('_kib', '')} per {label}"
        ax.set_title(title, fontsize=9)
        out.append(_svg(fig, f"chart-{_slug(suite)}-phases-{_slug(key)}", title))
    return out


# A metric's words for a reader: the raw key's parts, with these spelled out. The unit
# comes from the suffix; KiB are shown in MiB.
_WORDS = {"rss": "RSS", "thp": "THP", "kib": "", "mib": "", "ms": "", "us": "", "s": "",
          "qps": "queries/s", "tps": "transactions/s", "rps": "requests/s", "p50": "p50",
          "p95": "p95", "p99": "p99", "vmhwm": "VmHWM", "anon": "anonymous", "txn": "transaction",
          "pct": "%", "geomean": "geometric mean", "b": "bytes"}
_UNITS = (("_kib", "MiB", 1 / 1024), ("_mib", "MiB", 1.0), ("_ms", "ms", 1.0), ("_us", "µs", 1.0),
          ("_s", "s", 1.0))


def readable_metric(metric: str, largest: Optional[float] = None) -> tuple[str, str, float]:
    """(label, unit, scale) of a raw metric key: rss_peak_kib -> ("RSS peak", "MiB", 1/1024);
    KiB stay KiB where the largest value is below a MiB."""
    unit, scale = "", 1.0
    for suffix, u, f in _UNITS:
        if metric.endswith(suffix):
            unit, scale = u, f
            break
    if metric.endswith("_kib") and largest is not None and largest < 1024:
        unit, scale = "KiB", 1.0
    words = [_WORDS.get(w, w) for w in re.split(r"[_.]", metric)]
    label = " ".join(w for w in words if w).strip()
    return (label[:1].upper() + label[1:]) if label else metric, unit, scale


def _readable_label(metric: str, largest: Optional[float] = None) -> str:
    label, unit, _ = readable_metric(metric, largest)
    return f"{label} ({unit})" if unit else label


def largest_median(per: dict) -> Optional[float]:
    meds = [st.median for st in per.values() if st.median is not None]
    return max(meds) if meds else None


def chart_headline(ss: SuiteSummary, suite: str, order: list[str]) -> list[str]:
    ms = [m for k, _l in KINDS if (m := ss.headline.get(k)) and m in ss.metrics]
    ms = list(dict.fromkeys(ms))
    if not ms:
        return []
    fig, axes = plt.subplots(1, len(ms), figsize=(3.2 * len(ms) + 0.6, 3.0), squeeze=False)
    for ax, m in zip(axes[0], ms, strict=True):
        per = ss.metrics[m]
        allocs = [a for a in ss.allocators if a in per]
        scale = readable_metric(m, largest_median(per))[2]   # the unit its title names
        meds = [per[a].median * scale for a in allocs]
        errs = [[(per[a].median - per[a].min) * scale for a in allocs],
                [(per[a].max - per[a].median) * scale for a in allocs]]
        ax.bar(allocs, meds, color=[_color(a, order) for a in allocs], yerr=errs, capsize=3)
        d = direction(m)
        ax.set_title(_readable_label(m, largest_median(per)) + (f", {d} is better" if d else ""), fontsize=9)
        ax.tick_params(axis="x", rotation=20)
    title = f"{suite}: headline metrics (median of rounds, bars = min-max)"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return [_svg(fig, f"chart-{_slug(suite)}-headline", title)]


def chart_detail(ss: SuiteSummary, suite: str, order: list[str], has_points: bool) -> list[str]:
    if has_points:
        return []
    groups: dict[str, list[str]] = {}
    for m in ss.metrics:
        if "." in m:
            item, suffix = m.split(".", 1)
            groups.setdefault(suffix, []).append(item)
    out = []
    for suffix, items in groups.items():
        if direction(suffix) is None:
            continue
        allocs = [a for a in ss.allocators if any(a in ss.metrics[f"{i}.{suffix}"] for i in items)]

        lower = direction(suffix) == "lower"
        lo_attr, hi_attr = ("min", "max") if lower else ("max", "min")

        def ratio(a, i, attr="median", suffix=suffix, lower=lower):   # this suffix's (bound now)
            m = f"{i}.{suffix}"
            st = ss.metrics[m].get(a)
            best = ss.metrics[m].get(ss.best.get(m, ""))
            if st is None or best is None:
                return None
            v, b = getattr(st, attr), best.median
            if lower:
                return v / b if b > 0 else None
            return b / v if v > 0 else None

        fig, ax = plt.subplots(figsize=(5.3, 3.3))
        _grouped_bars(ax, items, allocs, ratio, lambda a, i, at=lo_attr: ratio(a, i, at),
                      lambda a, i, at=hi_attr: ratio(a, i, at), order)
        ax.axhline(1.0, color="#333", linewidth=0.8)
        ax.set_ylabel(f"{suffix}: x the best (1 = best)")
        title = f"{suite}: {suffix} per item relative to the best allocator (lower bar is better)"
        ax.set_title(title, fontsize=9)
        out.append(_svg(fig, f"chart-{_slug(suite)}-detail-{_slug(suffix)}", title))
    return out


# ---------------------------------------------------------------------------------
# HTML

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
 max-width:1100px;padding:0 1.2em 3em;color:#222}
h1{font-size:1.6em;margin:.8em 0 .2em}h2{margin-top:1.8em;border-bottom:2px solid #ddd}
h3{margin:1.2em 0 .4em}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right;vertical-align:top}
th{background:#f4f4f4}td.l,th.l{text-align:left}
td.best{background:#e6f4e6;font-weight:600}.noisy{color:#b36b00}
.dim{color:#888}.bad{color:#b00020}.ok{color:#1a7f37}
.badge{display:inline-block;padding:1px 8px;border-radius:9px;font-size:12px;
 background:#eee}.badge.bad{background:#fde7ea}.badge.ok{background:#e6f4e6}
figure.chart{display:inline-block;margin:.4em .6em .8em 0;vertical-align:top;max-width:100%}
figure.chart svg{max-width:100%;height:auto}
figcaption{font-size:12px;color:#555}
pre{background:#f7f7f7;padding:.5em;overflow-x:auto;font-size:12px;white-space:pre-wrap}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:2px 14px}
dl.meta dt{font-weight:600}dl.meta dd{margin:0}
"""


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def _table_html(ss: SuiteSummary) -> str:
    rows = []
    head = "".join(f"<th>{_e(a)}</th>" for a in ss.allocators)
    rows.append(f"<tr><th class=l>metric</th><th class=l>better</th>{head}</tr>")
    for m in ss.ordered_metrics(details=True):
        per = ss.metrics[m]
        cells = []
        for a in ss.allocators:
            st = per.get(a)
            if st is None:
                cells.append("<td class=bad>FAIL</td>" if ss.runs_failed.get(a) else "<td>-</td>")
                continue
            txt = _e(fmt_value(st.median))
            if st.ratio is not None:
                txt += f' <span class=dim>x{st.ratio:.2f}</span>'
            if len(st.values) > 1:
                cls = "noisy" if st.noisy else "dim"
                txt += f' <span class={cls}>{_e(fmt_spread(st.spread))}</span>'
            best = ss.best.get(m) == a and len(per) > 1
            cells.append(f"<td{' class=best' if best else ''}>{txt}</td>")
        rows.append(f"<tr><td class=l>{_e(m)}</td><td class='l dim'>{_e(direction(m) or '')}</td>"
                    + "".join(cells) + "</tr>")
    return (f'<table class=summary id="table-{_slug(ss.name)}">' + "".join(rows) + "</table>"
            "<p class=dim>Median of the rounds; xN: N times worse than the best allocator "
            "(x1.00 = best, highlighted); %: spread of the runs, (max-min)/median, in orange "
            "above 10%.</p>")


def _headline_table_html(ss: SuiteSummary) -> str:
    """The suite's headline metrics with readable names and units: the table a reader
    needs first (the full one is folded away below it)."""
    ms = [m for m in dict.fromkeys(ss.headline.values()) if m in ss.metrics]
    if not ms:
        return ""
    head = "".join(f"<th>{_e(a)}</th>" for a in ss.allocators)
    rows = [f"<tr><th class=l>what</th><th class=l>better</th>{head}</tr>"]
    for m in ms:
        per = ss.metrics[m]
        scale = readable_metric(m, largest_median(per))[2]
        cells = []
        for a in ss.allocators:
            st = per.get(a)
            if st is None:
                cells.append("<td>-</td>")
                continue
            txt = _e(fmt_value(st.median * scale if st.median is not None else None))
            if st.ratio is not None:
                txt += f' <span class=dim>x{st.ratio:.2f}</span>'
            best = ss.best.get(m) == a and len(per) > 1
            cells.append(f"<td{' class=best' if best else ''}>{txt}</td>")
        rows.append(f"<tr><td class=l>{_e(_readable_label(m, largest_median(per)))}</td>"
                    f"<td class='l dim'>{_e(direction(m) or '')}</td>" + "".join(cells) + "</tr>")
    return (f'<table class=summary id="headline-{_slug(ss.name)}">' + "".join(rows) + "</table>")


def _meta_html(doc: dict) -> str:
    m = doc.get("meta", {})
    mach = m.get("machine", {}) or {}
    git = ((m.get("keel") or {}).get("git") or {})
    items = [
        ("started", m.get("started")), ("finished", m.get("finished")),
        ("elapsed", f"{m.get('elapsed_s')} s" if m.get("elapsed_s") is not None else None),
        ("status", "complete" if m.get("complete") else
         ("INTERRUPTED: partial results" if m.get("interrupted") else "incomplete")),
        ("command", m.get("command")),
        ("rounds", m.get("rounds")), ("quick", m.get("quick")),
        ("suites", ", ".join(m.get("suites") or [])),
        ("allocators", ", ".join(m.get("allocators") or [])),
        ("machine", f"{mach.get('hostname', '?')}: {mach.get('cpu_model', '?')}, "
                    f"{mach.get('nproc', '?')} CPUs, "
                    f"{(_num(mach.get('memory_kib')) or 0) / 1048576:.1f} GiB RAM"),
        ("OS / kernel", f"{mach.get('os') or '?'} / Linux {mach.get('kernel', '?')}"),
        ("transparent huge pages", mach.get("thp")),
        ("load average", f"{_load(mach.get('load'))} at start, {_load(mach.get('load_end'))} at end"),
        ("Keel revision", str(git.get("describe") or git.get("revision") or "unknown")
         + (" (uncommitted changes)" if git.get("dirty") else "")),
        ("suite options", m.get("options") or None),
        ("lab version", m.get("lab_version")),
    ]
    dl = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items if v not in (None, ""))
    arows = ["<tr><th class=l>allocator</th><th class=l>library</th><th class=l>package</th>"
             "<th class=l>version</th></tr>"]
    for a, info in (m.get("allocator_info") or {}).items():
        lib = info.get("real_path") or info.get("path") or "(none: glibc's own malloc)"
        if info.get("env"):
            lib += " with " + " ".join(f"{k}={v}" for k, v in info["env"].items())
        ver = info.get("version") or ((info.get("git") or {}).get("describe")) or ""
        arows.append(f"<tr><td class=l>{_e(a)}</td><td class=l>{_e(lib)}</td>"
                     f"<td class=l>{_e(info.get('package') or '')}</td><td class=l>{_e(ver)}</td></tr>")
    return f'<dl class=meta id="meta">{dl}</dl><table id="allocators">{"".join(arows)}</table>'


def _load(v) -> str:
    return f"{v[0]:.2f}" if isinstance(v, list) and v and _num(v[0]) is not None else "?"


def _recommend_html(doc: dict) -> str:
    recs = recommend(doc)
    parts = ['<table id="recommendations"><tr><th class=l>suite</th><th class=l>on</th>'
             '<th class=l>metric</th><th class=l>winner</th><th>margin</th><th>noise</th>'
             '<th class=l>verdict</th></tr>']
    for r in recs:
        for kind, label in KINDS:
            v = r["verdicts"].get(kind)
            if not v:
                continue
            cls = {"clear": "ok", "within noise": "noisy"}.get(v["verdict"], "dim")
            margin = f"{v['margin'] * 100:.1f}%" if v.get("margin") is not None else "-"
            noise = f"{v['noise'] * 100:.1f}%" if v.get("n", 0) > 1 else "?"
            parts.append(f"<tr><td class=l>{_e(r['suite'])}</td><td class=l>{_e(label)}</td>"
                         f"<td class=l>{_e(_readable_label(v['metric']))}</td><td class=l><b>{_e(v['winner'])}</b>"
                         f"{' over ' + _e(v['runner_up']) if v.get('runner_up') else ''}</td>"
                         f"<td>{margin}</td><td>{noise}</td>"
                         f"<td class='l {cls}'>{_e(v['text'])}</td></tr>")
    parts.append("</table>")
    ov = overall(recs)
    if ov:
        parts.append("<ul>" + "".join(f"<li>{_e(x)}</li>" for x in ov) + "</ul>")
    return "".join(parts)


def render(doc: dict, source: str = "", charts: bool = True) -> str:
    """The page as a string. charts=False leaves the charts out (fast previews, tests)."""
    sums = summarize(doc)
    meta = doc.get("meta", {})
    order = list(meta.get("allocators") or [])
    for ss in sums.values():
        for a in ss.allocators:
            if a not in order:
                order.append(a)
    complete = meta.get("complete")
    badge = ('<span class="badge ok">complete</span>' if complete else
             '<span class="badge bad">INCOMPLETE: interrupted, partial results</span>'
             if meta.get("interrupted") else '<span class="badge bad">incomplete</span>')
    body = [f"<h1>Keel lab report</h1><p>{badge} {_e(', '.join(sums))} &middot; "
            f"{_e(meta.get('started'))} &middot; {len(order)} allocators &middot; "
            f"{_e(meta.get('rounds'))} round(s){' &middot; quick' if meta.get('quick') else ''}"
            f"{' &middot; from ' + _e(source) if source else ''}</p>"]
    body.append("<h2 id=recommendation>Recommendation</h2>")
    body.append(_recommend_html(doc))
    for name, ss in sums.items():
        s = _slug(name)
        body.append(f'<h2 id="suite-{s}">{_e(name)}</h2>')
        if ss.description:
            body.append(f"<p>{_e(ss.description)}</p>")
        ok = sum(ss.runs_ok.values())
        bad = sum(ss.runs_failed.values())
        body.append(f"<p class=dim>{ok} successful run(s)"
                    f"{f', <span class=bad>{bad} failed</span>' if bad else ''}.</p>")
        # The answer first: the headline chart and the headline metrics in words and
        # units; every metric (raw names) and the other charts folded away below.
        if charts:
            head = chart_headline(ss, name, order)
            if head:
                body.append(f'<div class=charts id="headline-charts-{s}">' + "".join(head) + "</div>")
        body.append(_headline_table_html(ss))
        figs = []
        if charts:
            pts = chart_points(doc, name, order)
            figs += pts
            figs += chart_latency(ss, name, order)
            figs += chart_series(doc, name, order)
            figs += chart_phases(doc, name, order)
            figs += chart_detail(ss, name, order, has_points=bool(pts))
        if ss.metrics or figs:
            body.append(f'<details id="details-{s}"><summary>Every metric ({len(ss.metrics)}) and '
                        f'{len(figs)} more chart(s)</summary>')
            if ss.metrics:
                body.append(_table_html(ss))
            if figs:
                body.append(f'<div class=charts id="charts-{s}">' + "".join(figs) + "</div>")
            body.append("</details>")
        if ss.problems:
            body.append("<h3 class=bad>Problems</h3><ul>" +
                        "".join(f"<li class=bad>{_e(p)}</li>" for p in ss.problems) + "</ul>")
        if ss.errors:
            body.append("<h3 class=bad>Errors</h3>" +
                        "".join(f"<pre class=bad>{_e(e)}</pre>" for e in ss.errors))
        if ss.notes:
            body.append("<h3>Notes</h3><ul>" + "".join(f"<li>{_e(n)}</li>" for n in ss.notes)
                        + "</ul>")
    body.append("<h2 id=meta-section>Run details</h2>")
    body.append(_meta_html(doc))
    infos = meta.get("allocator_info") or {}
    if "keel" in order or any((infos.get(a) or {}).get("is_keel") for a in order):
        rows = "".join(f"<tr><td class=l>{_e(o.env)}</td><td class=l>{_e(o.default)}</td>"
                       f"<td class=l>{_e(o.meaning)}</td></tr>" for o in OPTIONS)
        body.append("<h3>Keel options (environment)</h3><table id=keel-options><tr>"
                    "<th class=l>variable</th><th class=l>default</th><th class=l>meaning</th>"
                    f"</tr>{rows}</table>")
    now = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    body.append(f"<p class=dim>Generated {now} by keel-lab {__version__}.</p>")
    title = f"Keel lab report: {', '.join(sums)} ({meta.get('started', '')})"
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width, initial-scale=1'>"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


def write_report(results: str | Path, out: Optional[str | Path] = None) -> Path:
    """Renders results into out (default: results path with .html). Raises
    summary.ResultsError for a bad results file; nothing is written then."""
    results = Path(results)
    doc = load(results)
    out = Path(out) if out else results.with_suffix(".html")
    page = render(doc, source=results.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
        m = os.umask(0)
        os.umask(m)
        os.chmod(tmp, 0o666 & ~m)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
