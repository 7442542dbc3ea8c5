import subprocess
import sys
import time

import pytest

from keel_lab.measure import (RssSampler, geomean, latency_summary, percentile,
                              read_vmrss_kib, spread, tree_rss_kib)


def test_percentiles_match_numpy_linear():
    xs = list(range(1, 101))          # 1..100
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 95) == pytest.approx(95.05)
    assert percentile(xs, 99) == pytest.approx(99.01)
    assert percentile([7], 99) == 7
    assert percentile([], 50) is None


def test_latency_summary():
    s = latency_summary([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["mean_ms"] == 22.0
    assert s["p50_ms"] == 3.0
    assert s["p99_ms"] == pytest.approx(96.16)
    assert s["max_ms"] == 100.0 and s["count"] == 5
    assert latency_summary([]) == {}


def test_spread_and_geomean():
    assert spread([10, 11, 9]) == pytest.approx(0.2)
    assert spread([5]) == 0.0
    assert geomean([1, 4]) == pytest.approx(2.0)
    assert geomean([]) is None


def test_rss_sampler_sees_a_child_grow_and_gives_peak_and_final():
    code = ("import time; time.sleep(0.3); b = bytearray(64 * 1024 * 1024); "
            "b[::4096] = b'x' * len(b[::4096]); time.sleep(0.6); del b; time.sleep(0.5)")
    # a launcher shell whose child does the work: children=True must add it in
    p = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "{code}"; true'])
    try:
        with RssSampler(p.pid, interval=0.1, children=True) as s:
            p.wait(timeout=30)
        assert s.peak_kib is not None and s.peak_kib > 60 * 1024, s.series
        assert len(s.series) >= 5
        assert s.series[0][0] <= s.series[-1][0]
        r = s.result()
        assert r["rss_peak_kib"] == s.peak_kib and r["rss_final_kib"] == s.final_kib
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_rss_of_missing_process_is_none():
    p = subprocess.Popen(["true"])
    p.wait()
    assert read_vmrss_kib(p.pid) is None
    assert tree_rss_kib(p.pid) is None
    s = RssSampler(p.pid, interval=0.05).start()
    time.sleep(0.2)
    s.stop()
    assert s.peak_kib is None
