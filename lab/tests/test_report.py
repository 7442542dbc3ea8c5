"""keel report / keel recommend on a small realistic results file, the page checked in
headless Chromium; bad results files give clean errors and write nothing."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import FIXTURES, keel
from keel_lab.recommend import recommend, render_text
from keel_lab.report import render, write_report
from keel_lab.summary import ResultsError, load, summarize

EXPECTED_CHARTS = {
    "chart-redis-points-throughput", "chart-redis-points-p95_ms", "chart-redis-points-rss_kib",
    "chart-redis-headline", "chart-redis-latency", "chart-redis-series-rss_kib",
    "chart-redis-phases-rss_kib", "chart-redis-phases-used_memory_kib", "chart-redis-phases-frag",
    "chart-threads-points-rss_per_thread_kib", "chart-threads-points-rss_kib",
    "chart-threads-points-start_ms", "chart-threads-headline",
    "chart-micro-headline", "chart-micro-phases-rss_kib", "chart-micro-detail-wall_s",
    "chart-micro-detail-cpu_s", "chart-micro-detail-rss_peak_kib",
}


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.svg_ids, self.ids, self.urls, self.tags = [], [], [], {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        if tag == "svg" and "chart" in (a.get("class") or ""):
            self.svg_ids.append(a.get("id"))
        if a.get("id"):
            self.ids.append(a["id"])
        for k in ("src", "href", "xlink:href"):
            v = a.get(k)
            if v and not v.startswith("#") and not v.startswith("data:"):
                self.urls.append((tag, k, v))


def _parse(text: str) -> _Collect:
    c = _Collect()
    c.feed(text)
    return c


def test_summary_of_the_fixture(results_small):
    doc = load(results_small)
    s = summarize(doc)
    redis = s["redis"]
    assert redis.headline == {"speed": "throughput", "memory": "rss_peak_kib", "tail": "p99_ms"}
    assert redis.best["throughput"] == "keel" and redis.best["p99_ms"] == "keel"
    assert redis.runs_failed == {"glibc": 1} and len(redis.errors) == 1
    st = redis.metrics["throughput"]["glibc"]
    assert len(st.values) == 2 and st.ratio > 1.05          # glibc ~9% slower than keel
    assert redis.metrics["throughput"]["keel"].ratio == 1.0
    assert s["threads"].headline["memory"] == "rss_per_thread_kib"


def test_recommend(results_small):
    recs = {r["suite"]: r for r in recommend(load(results_small))}
    v = recs["redis"]["verdicts"]
    assert v["speed"]["winner"] == "keel" and v["speed"]["runner_up"] == "jemalloc"
    assert v["tail"]["metric"] == "p99_ms"
    assert recs["threads"]["verdicts"]["memory"]["winner"] == "glibc"
    assert recs["threads"]["verdicts"]["memory"]["verdict"] == "clear"
    # micro: glibc and jemalloc have the same RSS in the fixture: within the noise
    assert recs["micro"]["verdicts"]["memory"]["verdict"] == "within noise"
    text = render_text(load(results_small))
    assert "within the noise" in text and "margin is real" in text
    out = keel("recommend", str(results_small), check=True).stdout
    assert "redis" in out and "overall" in out
    as_json = {r["suite"]: r for r in
               json.loads(keel("recommend", str(results_small), "--json", check=True).stdout)}
    assert as_json.keys() == recs.keys() == {"redis", "threads", "micro"}
    for name, r in recs.items():    # the JSON is what recommend() says, verdict by verdict
        assert as_json[name]["verdicts"].keys() == r["verdicts"].keys()
        for kind, v in r["verdicts"].items():
            assert {k: as_json[name]["verdicts"][kind][k] for k in ("winner", "verdict", "metric")} \
                == {k: v[k] for k in ("winner", "verdict", "metric")}
    assert as_json["redis"]["verdicts"]["speed"]["winner"] == "keel"


def test_single_round_says_noise_unknown(results_small):
    doc = load(results_small)
    for s in doc["suites"].values():
        s["runs"] = [r for r in s["runs"] if r["round"] == 1]
    text = render_text(doc)
    assert "noise is unknown" in text


@pytest.fixture(scope="module")
def report_html(tmp_path_factory) -> Path:
    """The fixture's report, rendered once for the tests that look at it."""
    d = tmp_path_factory.mktemp("report")
    res = d / "results_small.json"
    shutil.copy(FIXTURES / "results_small.json", res)
    return write_report(res, d / "report.html")


def test_report_html_is_self_contained_and_has_every_chart(report_html):
    text = report_html.read_text()
    c = _parse(text)
    assert set(c.svg_ids) == EXPECTED_CHARTS
    assert len(c.ids) == len(set(c.ids)), "duplicate element ids"
    assert c.urls == [], f"external references: {c.urls}"
    assert not re.search(r"url\((?!#)", text), "CSS url() pointing outside the page"
    assert "@import" not in text
    # tables, recommendation, meta block, Keel options (keel is among the allocators)
    for i in ("table-redis", "table-threads", "table-micro", "recommendations", "meta",
              "allocators", "keel-options"):
        assert i in c.ids, i
    assert "AMD EPYC 7B13" in text and "libjemalloc2" in text and "5.3.0-1" in text
    assert "redis-server exited during the run" in text      # the failed run is shown
    assert "7cec43e" in text                                  # Keel git revision


def _outside_details(text: str) -> str:
    return re.sub(r"<details.*?</details>", "", text, flags=re.S)


def _metric_keys(results: Path) -> set[str]:
    from keel_lab.summary import summarize
    doc = json.loads(results.read_text())
    return {m for ss in summarize(doc).values() for m in ss.metrics if "_" in m}


def _check_answer_first(text: str, keys: set[str]) -> None:
    """The verdict, then each suite's headline chart, then its folded details; no raw
    metric key outside the folded parts."""
    verdict = text.index('id="recommendations"')
    first_chart = text.index('id="headline-charts-')
    first_details = text.index("<details")
    assert verdict < first_chart < first_details
    outside = _outside_details(text)
    shown = sorted(k for k in keys if re.search(rf"(?<![\w.]){re.escape(k)}(?![\w.])", outside))
    assert not shown, f"raw metric keys outside the folded tables: {shown[:10]}"


def test_report_answer_first(report_html):
    _check_answer_first(report_html.read_text(), _metric_keys(report_html.with_name("results_small.json")))
    assert "RSS peak (MiB)" in report_html.read_text() or "RSS (MiB)" in report_html.read_text()


def test_readable_metric_names():
    from keel_lab.report import readable_metric
    assert readable_metric("rss_peak_kib") == ("RSS peak", "MiB", 1 / 1024)
    assert readable_metric("thp_on_p99_ms") == ("THP on p99", "ms", 1.0)
    assert readable_metric("thp_off_qps")[0] == "THP off queries/s"


def test_report_in_headless_chromium(report_html, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or \
        shutil.which("google-chrome")
    if not chromium:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    out = report_html
    profile = tmp_path / "profile"
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}"]
    r = subprocess.run(cmd + ["--dump-dom", out.as_uri()], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    dom = _parse(r.stdout)
    assert set(dom.svg_ids) == EXPECTED_CHARTS, sorted(set(EXPECTED_CHARTS) ^ set(dom.svg_ids))
    # the charts were parsed as SVG with content, not left as text
    assert dom.tags.get("path", 0) > 100 and dom.tags.get("text", 0) > 50
    assert dom.tags.get("table", 0) >= 5
    _check_answer_first(r.stdout, _metric_keys(report_html.with_name("results_small.json")))
    shot = tmp_path / "shot.png"
    r = subprocess.run(cmd + ["--hide-scrollbars", "--window-size=1200,2400",
                              f"--screenshot={shot}", out.as_uri()], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and shot.stat().st_size > 20000, r.stderr[-2000:]


def test_report_cli_default_output_next_to_results(results_small):
    doc = json.loads(results_small.read_text())       # one suite keeps it quick
    doc["suites"] = {"threads": doc["suites"]["threads"]}
    results_small.write_text(json.dumps(doc))
    r = keel("report", str(results_small), check=True)
    html = results_small.with_suffix(".html")
    assert html.exists() and str(html) in r.stdout
    assert 'id="chart-threads-points-rss_per_thread_kib"' in html.read_text()


@pytest.mark.parametrize("content,message", [
    (None, "does not exist"),
    ("", "is empty"),
    ("{not json", "not valid JSON"),
    ('{"hello": 1}', "not a keel bench results file"),
    ('{"format": "keel-lab-results", "meta": {}, "suites": {"x": {"runs": [{"ok": true, '
     '"allocator": "glibc"}]}}}', "no metrics"),
])
def test_bad_results_file_gives_a_clean_error_and_writes_nothing(tmp_path, content, message):
    res = tmp_path / "results.json"
    if content is not None:
        res.write_text(content)
    out = tmp_path / "report.html"
    with pytest.raises(ResultsError, match=message):
        write_report(res, out)
    assert not out.exists()
    r = keel("report", str(res), "-o", str(out))
    assert r.returncode == 1
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()
    assert list(tmp_path.glob(".report.html*")) == []      # no temp file left behind
    r = keel("recommend", str(res))
    assert r.returncode == 1 and message in r.stderr


def test_existing_report_is_kept_when_rendering_fails(results_small, tmp_path, monkeypatch):
    out = tmp_path / "r.html"
    out.write_text("previous report")
    import keel_lab.report as rep

    def boom(*a, **kw):
        raise RuntimeError("chart failed")
    monkeypatch.setattr(rep, "render", boom)
    with pytest.raises(RuntimeError):
        rep.write_report(results_small, out)
    assert out.read_text() == "previous report"


def test_incomplete_results_are_marked(results_small, tmp_path):
    doc = json.loads(results_small.read_text())
    doc["meta"].update(complete=False, interrupted=True)
    html = render(doc, charts=False)
    assert "INCOMPLETE" in html
    assert "incomplete" in render_text(doc)


def test_diagnostic_suite_says_nothing_to_rank(results_small):
    """A suite of counts only (mariadb-cachesim's instructions and misses per
    transaction) is not 'no usable results': it has nothing a verdict is made of."""
    doc = load(results_small)
    for i, r in enumerate(doc["suites"]["micro"]["runs"]):
        r["result"] = {"metrics": {"ir_per_txn": 2.3e6 + i, "ll_miss_per_txn": 5000.0 + i}}
    recs = {r["suite"]: r for r in recommend(doc)}
    assert recs["micro"]["verdicts"] == {} and recs["micro"]["diagnostic"]
    text = render_text(doc)
    assert "nothing to rank" in text
    # a suite whose runs all failed still says so
    for r in doc["suites"]["micro"]["runs"]:
        r.update(ok=False, error="boom", result=None)
    text = render_text(doc)
    assert "no usable results" in text and "nothing to rank" not in text


# -- inner structure of a results file: one clear line, not a traceback (offline) -------


def _runs(doc):
    return doc["suites"]["redis"]["runs"]


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d["meta"].update(allocators=5), "meta.allocators must be a list of names"),
    (lambda d: d["meta"].update(machine="big"), "meta.machine must be an object"),
    (lambda d: d["meta"]["keel"].update(git=[1]), "meta.keel.git must be an object"),
    (lambda d: d["meta"]["allocator_info"].update(glibc="x"), "meta.allocator_info.glibc must be"),
    (lambda d: _runs(d)[0].update(allocator=["keel"]), "run 1: the allocator must be a name"),
    (lambda d: _runs(d)[0].update(result="fast"), "run 1: \"result\" must be an object"),
    (lambda d: _runs(d)[0]["result"].update(headline=[1]), "result.headline must be an object"),
    (lambda d: _runs(d)[0]["result"].update(headline={"speed": ["x"]}),
     "result.headline must map kinds to metric names"),
    (lambda d: _runs(d)[0]["result"].update(notes=5), "result.notes must be a list"),
    (lambda d: _runs(d)[0]["result"].update(points=[3]), "result.points must be a list of objects"),
    (lambda d: _runs(d)[0]["result"].update(series={"rss_kib": 7}),
     "result.series must map names to lists"),
    (lambda d: _runs(d)[0]["result"].update(checksums="abc"), "result.checksums must be an object"),
])
def test_wrong_inner_structure_is_one_line(results_small, tmp_path, capsys, mutate, message):
    from keel_lab import cli
    doc = json.loads(results_small.read_text())
    mutate(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match=re.escape(message)):
        load(bad)
    out = tmp_path / "bad.html"
    for argv in (["report", str(bad), "-o", str(out)], ["recommend", str(bad)],
                 ["recommend", str(bad), "--json"]):
        assert cli.main(argv) == 1, argv
        captured = capsys.readouterr()
        lines = captured.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("keel: error: ") and message in lines[0]
        assert captured.out == ""
    assert not out.exists()


def test_odd_informational_fields_still_render(results_small):
    """What only the report's run details show (load average, memory, revision) may be
    odd without stopping the report."""
    doc = load(results_small)
    doc["meta"]["machine"].update(load=["high"], load_end=None, memory_kib="lots")
    doc["meta"]["keel"]["git"]["describe"] = 1234
    _runs(doc)[0]["result"]["series"]["rss_kib"].append(["later", "more"])
    html = render(doc, charts=False)
    assert "? at start" in html and "0.0 GiB RAM" in html and "1234" in html


def test_unforeseen_structure_error_is_one_line(results_small, capsys, monkeypatch):
    """Whatever validate() does not foresee still ends in one line naming the file."""
    from keel_lab import cli, recommend as rec_mod, report as rep_mod

    def bad(*a, **kw):
        raise KeyError("verdicts")
    monkeypatch.setattr(rec_mod, "recommend", bad)
    monkeypatch.setattr(rep_mod, "render", bad)
    for argv in (["recommend", str(results_small)], ["report", str(results_small)]):
        assert cli.main(argv) == 1
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and "unexpected structure in the results file" in lines[0]
        assert str(results_small) in lines[0] and "KeyError" in lines[0]


# -- which metrics are better higher -------------------------------------------------------


def test_redis_ops_rps_metrics_get_a_winner(results_small):
    """redis-ops' per-test requests/s (<test>_<config>_rps) and redis-frag's fill_rps_<size>
    are higher-is-better: they get a best allocator and ratios."""
    from keel_lab.summary import direction
    for m in ("set_p16c50_rps", "lpop_c200_rps", "fill_rps_1KiB", "fill_rps_3B"):
        assert direction(m) == "higher", m
    for m in ("set_p16c50_p99_ms", "lpop_c200_mean_ms"):
        assert direction(m) == "lower", m
    doc = load(results_small)
    for r in _runs(doc):
        if r.get("ok"):
            # keel's runs are the fastest in the fixture
            r["result"]["metrics"]["set_p16c50_rps"] = {"keel": 300000, "jemalloc": 250000,
                                                        "glibc": 200000}[r["allocator"]]
    ss = summarize(doc)["redis"]
    assert ss.best["set_p16c50_rps"] == "keel"
    per = ss.metrics["set_p16c50_rps"]
    assert per["keel"].ratio == 1.0 and per["glibc"].ratio == pytest.approx(1.5)
