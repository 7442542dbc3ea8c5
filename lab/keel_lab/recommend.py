"""Which allocator wins, per suite, on speed, memory and tail latency -- and whether the
margin is larger than the noise of the runs."""
from __future__ import annotations

from typing import Any, Optional

from .summary import SuiteSummary, direction, fmt_value, summarize

KINDS = (("speed", "throughput / speed"), ("memory", "memory (RSS)"),
         ("tail", "tail latency (p99)"))


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%" if x < 0.1 else f"{x * 100:.0f}%"


def _verdict(ss: SuiteSummary, metric: str) -> Optional[dict]:
    per = ss.metrics.get(metric) or {}
    d = direction(metric)
    if not per or d is None:
        return None
    ranked = sorted(per, key=lambda a: per[a].median, reverse=(d == "higher"))
    win = ranked[0]
    w = per[win]
    ranking = [(a, per[a].ratio) for a in ranked]
    out: dict[str, Any] = {"metric": metric, "better": d, "winner": win, "winner_median": w.median,
           "ranking": [{"allocator": a, "ratio_to_best": r} for a, r in ranking],
           "runner_up": None, "margin": None, "noise": w.spread, "verdict": "only one allocator",
           "n": len(w.values)}
    if len(ranked) < 2:
        out["text"] = f"only {win} has results"
        return out
    ru = ranked[1]
    r = per[ru]
    if d == "lower":
        margin = (r.median / w.median - 1) if w.median > 0 else 0.0
        overlap = w.max >= r.min
    else:
        margin = (w.median / r.median - 1) if r.median > 0 else 0.0
        overlap = w.min <= r.max
    noise = max(w.spread, r.spread)
    out.update(runner_up=ru, runner_up_median=r.median, margin=margin, noise=noise)
    pct = _pct(margin)
    npct = _pct(noise)
    if min(len(w.values), len(r.values)) < 2:
        out["verdict"] = "noise unknown"
        out["text"] = (f"{win} by {pct} over {ru} ({fmt_value(w.median)} vs {fmt_value(r.median)}); "
                       f"a single run each, so the noise is unknown: use --rounds 3 or more")
    elif overlap or margin <= noise:
        out["verdict"] = "within noise"
        out["text"] = (f"no clear winner: {win} leads {ru} by {pct} ({fmt_value(w.median)} vs "
                       f"{fmt_value(r.median)}), within the noise (runs spread up to {npct})")
    else:
        out["verdict"] = "clear"
        out["text"] = (f"{win} by {pct} over {ru} ({fmt_value(w.median)} vs {fmt_value(r.median)}); "
                       f"runs spread at most {npct}, so the margin is real")
    if len(ranked) > 2:
        out["text"] += "; ranking: " + ", ".join(
            a if i == 0 or r is None else f"{a} x{r:.2f}" for i, (a, r) in enumerate(ranking))
    return out


def recommend(doc: dict) -> list[dict]:
    """[{suite, description, verdicts: {kind: verdict dict}, errors}]"""
    out = []
    for name, ss in summarize(doc).items():
        verdicts = {}
        for kind, _label in KINDS:
            m = ss.headline.get(kind)
            if m:
                v = _verdict(ss, m)
                if v:
                    verdicts[kind] = v
        out.append({"suite": name, "description": ss.description, "verdicts": verdicts,
                    "errors": len(ss.errors), "problems": ss.problems,
                    # counts to read, no throughput, memory or latency to rank by
                    "diagnostic": not ss.headline and not ss.errors})
    return out


def overall(recs: list[dict]) -> list[str]:
    """One line per kind: who wins how many suites (clear or single-run margins)."""
    lines = []
    for kind, label in KINDS:
        wins: dict[str, int] = {}
        total, unclear = 0, 0
        for r in recs:
            v = r["verdicts"].get(kind)
            if not v or v.get("runner_up") is None:
                continue
            total += 1
            if v["verdict"] in ("clear", "noise unknown"):
                wins[v["winner"]] = wins.get(v["winner"], 0) + 1
            else:
                unclear += 1
        if total:
            parts = [f"{a} wins {n} of {total} suite(s)"
                     for a, n in sorted(wins.items(), key=lambda x: -x[1])]
            if unclear:
                parts.append(f"{unclear} without a clear winner (within the noise)")
            lines.append(f"{label}: " + "; ".join(parts))
    return lines


def render_text(doc: dict) -> str:
    recs = recommend(doc)
    lines = []
    meta = doc.get("meta", {})
    if not meta.get("complete", True):
        lines.append("NOTE: these results are incomplete (the bench was interrupted or is "
                     "still running)")
    for r in recs:
        lines.append(f"{r['suite']}: {r['description']}".rstrip(": "))
        if not r["verdicts"] and r.get("diagnostic"):
            lines.append("  nothing to rank: its metrics are diagnostic counts (see the summary table)")
        elif not r["verdicts"]:
            lines.append("  no usable results" + (f" ({r['errors']} error(s))" if r["errors"] else ""))
        for kind, label in KINDS:
            v = r["verdicts"].get(kind)
            if v:
                lines.append(f"  {label} [{v['metric']}, {v['better']} is better]: {v['text']}")
        for p in r["problems"]:
            lines.append(f"  PROBLEM: {p}")
        if r["errors"]:
            lines.append(f"  ({r['errors']} failed run(s): see the report)")
    ov = overall(recs)
    if ov:
        lines.append("overall:")
        lines += ["  " + x for x in ov]
    return "\n".join(lines)
