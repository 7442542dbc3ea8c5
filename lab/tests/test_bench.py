"""keel bench: order of runs, errors, Ctrl-C, results JSON, and real micro/threads runs."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import BUILD, keel
from keel_lab import suites
from keel_lab.allocators import Allocator
from keel_lab.bench import BenchError, rotation, run_bench
from keel_lab.summary import load, summarize
from keel_lab.suites.base import Suite, SuiteContext, SuiteError

A, B, C = Allocator("a", None), Allocator("b", None), Allocator("c", None)


def test_rotation():
    assert rotation([1, 2, 3], 0) == [1, 2, 3]
    assert rotation([1, 2, 3], 1) == [2, 3, 1]
    assert rotation([1, 2, 3], 4) == [2, 3, 1]


class FakeSuite(Suite):
    name = "fake"
    description = "a fake suite for the driver's tests"
    calls: list = []
    fail_on: set = set()          # (round-ish call index) to fail
    interrupt_on: int = -1

    def run(self, ctx):
        i = len(FakeSuite.calls)
        FakeSuite.calls.append((ctx.allocator.name, Path(ctx.workdir)))
        assert Path(ctx.workdir).is_dir()
        (Path(ctx.workdir) / "scratch").write_text("x")
        ctx.progress("working", 0.5)
        if i == FakeSuite.interrupt_on:
            raise KeyboardInterrupt
        if i in FakeSuite.fail_on:
            raise SuiteError(f"fake failure on call {i}")
        if i in getattr(FakeSuite, "crash_on", ()):
            raise ValueError("a bug in the suite")
        v = {"a": 100.0, "b": 90.0, "c": 120.0}[ctx.allocator.name]
        return {"metrics": {"throughput": v + i, "p99_ms": 1000 / v, "rss_peak_kib": 1000 + i},
                "series": {"rss_kib": [[0, 1], [1, 2]]}}


@pytest.fixture
def fake(monkeypatch):
    FakeSuite.calls, FakeSuite.fail_on, FakeSuite.interrupt_on = [], set(), -1
    FakeSuite.crash_on = set()
    monkeypatch.setitem(suites.REGISTRY, "fake", FakeSuite)
    return FakeSuite


def test_alternating_order_and_results_json(fake, tmp_path):
    out = tmp_path / "r.json"
    doc, path = run_bench(["fake"], [A, B, C], rounds=3, out=out, lock=False)
    assert path == out
    assert [c[0] for c in fake.calls] == list("abc" "bca" "cab")
    for _a, wd in fake.calls:
        assert not wd.exists(), "the run's work directory was not removed"
    on_disk = load(out)
    assert on_disk["meta"]["complete"] is True and on_disk["meta"]["interrupted"] is False
    runs = on_disk["suites"]["fake"]["runs"]
    assert [(r["round"], r["position"], r["allocator"]) for r in runs][:4] == \
        [(1, 1, "a"), (1, 2, "b"), (1, 3, "c"), (2, 1, "b")]
    assert all(r["ok"] and r["duration_s"] >= 0 for r in runs)
    m = on_disk["meta"]
    for k in ("started", "finished", "machine", "allocator_info", "keel", "rounds", "quick"):
        assert k in m, k
    for k in ("nproc", "memory_kib", "kernel", "cpu_model"):
        assert m["machine"][k], k
    assert m["rounds"] == 3 and m["allocators"] == ["a", "b", "c"]
    assert on_disk["summary"]["fake"]["best"]["throughput"] == "c"


def test_a_failing_run_is_recorded_and_the_bench_goes_on(fake, tmp_path):
    fake.fail_on = {1}
    fake.crash_on = {3}
    doc, out = run_bench(["fake"], [A, B], rounds=2, out=tmp_path / "r.json", lock=False)
    runs = load(out)["suites"]["fake"]["runs"]
    assert len(runs) == 4
    assert runs[1]["ok"] is False and "fake failure on call 1" in runs[1]["error"]
    assert runs[3]["ok"] is False and "ValueError" in runs[3]["error"]
    assert "traceback" in runs[3]
    assert runs[2]["ok"] and runs[0]["ok"]
    s = summarize(doc)["fake"]
    assert s.runs_failed == {"b": 1, "a": 1}


def test_unavailable_suite_is_an_error_in_the_results_not_a_crash(fake, tmp_path, monkeypatch):
    monkeypatch.setitem(suites.UNAVAILABLE, "ghost", "keel_lab/suites/ghost.py does not exist")
    doc, out = run_bench(["ghost", "fake"], [A], rounds=1, out=tmp_path / "r.json", lock=False)
    d = load(out)
    assert "does not exist" in d["suites"]["ghost"]["error"]
    assert len(d["suites"]["fake"]["runs"]) == 1 and d["suites"]["fake"]["runs"][0]["ok"]


def test_setup_errors():
    with pytest.raises(BenchError, match="unknown suite"):
        run_bench(["nonesuch"], [A], lock=False)
    with pytest.raises(BenchError, match="listed twice"):
        run_bench(["micro"], [A, A], lock=False)
    with pytest.raises(BenchError, match="rounds"):
        run_bench(["micro"], [A], rounds=0, lock=False)
    with pytest.raises(BenchError, match="does not run"):
        run_bench(["micro"], [A], options={"mikro": {"scale": "1"}}, lock=False)


def test_ctrl_c_keeps_the_finished_runs(fake, tmp_path):
    fake.interrupt_on = 2
    doc, out = run_bench(["fake"], [A, B], rounds=3, out=tmp_path / "r.json", lock=False)
    d = load(out)
    assert d["meta"]["interrupted"] is True and d["meta"]["complete"] is False
    assert len(d["suites"]["fake"]["runs"]) == 2
    assert d["meta"]["finished"]
    for _a, wd in fake.calls:
        assert not wd.exists()


# ---------------------------------------------------------------------------------
# real runs (short: --quick sizes)


def _need_micro():
    if not (BUILD / "bench" / "measure").exists():
        pytest.skip(f"bench programs are not built in {BUILD}/bench "
                    f"(cmake --build {BUILD} --target keel_bench)")


def _measure(tmp_path, code):
    """Runs `python3 -c code` under bench/measure; returns its report's fields."""
    rep = tmp_path / "report"
    r = subprocess.run([str(BUILD / "bench" / "measure"), str(rep), "-", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return {k: int(v) for k, v in (kv.split("=", 1) for kv in rep.read_text().split())}


def test_measure_reads_the_peak_exactly_while_running_and_at_exit(tmp_path):
    """The launcher's peak_kib is read from /proc while the program runs and again as it
    exits (ptrace exit stop): a peak held for a while, and one built in the program's last
    moment, are both seen; a signal the program handles still reaches it."""
    _need_micro()
    base = _measure(tmp_path, "pass")
    assert base["status"] == 0 and base["samples"] >= 1 and base["at_exit"] == 1
    held = _measure(tmp_path, "import time\nb = bytearray(64 << 20)\ntime.sleep(0.2)\ndel b")
    assert held["peak_kib"] >= base["peak_kib"] + (64 << 10) - 1024, (base, held)
    assert held["samples"] >= 50
    # touched and exited at once: only the exit reading can see it
    last = _measure(tmp_path, "b = bytearray(48 << 20)\nimport os\nos._exit(0)")
    assert last["at_exit"] == 1 and last["peak_kib"] >= base["peak_kib"] + (48 << 10) - 1024
    sig = _measure(tmp_path, "import os, signal\nseen = []\n"
                             "signal.signal(signal.SIGUSR1, lambda *a: seen.append(1))\n"
                             "os.kill(os.getpid(), signal.SIGUSR1)\nos._exit(3 if not seen else 7)")
    assert sig["status"] >> 8 == 7


def test_bench_micro_quick_end_to_end(tmp_path, jemalloc_path):
    _need_micro()
    out = tmp_path / "micro.json"
    r = keel("bench", "micro", "--quick", "--allocators", "glibc,jemalloc", "--rounds", "1",
             "--out", str(out), timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "wall_s_geomean" in r.stdout and "glibc" in r.stdout and "jemalloc" in r.stdout
    d = load(out)
    assert d["meta"]["complete"] and d["meta"]["quick"] and d["meta"]["rounds"] == 1
    info = d["meta"]["allocator_info"]
    assert info["jemalloc"]["package"] == "libjemalloc2" and info["jemalloc"]["version"]
    assert info["glibc"]["version"]
    runs = d["suites"]["micro"]["runs"]
    assert [r["allocator"] for r in runs] == ["glibc", "jemalloc"]
    for run in runs:
        assert run["ok"], run.get("error")
        m = run["result"]["metrics"]
        for k in ("wall_s_geomean", "cpu_s_geomean", "rss_peak_kib_geomean", "tree.wall_s",
                  "tree.rss_peak_kib"):
            assert m[k] > 0, k
        assert run["result"]["series"]["rss_kib"]
    assert not summarize(d)["micro"].problems       # checksums agree across allocators
    r = keel("report", str(out), check=True)
    assert out.with_suffix(".html").exists()


def test_bench_threads_and_a_broken_suite(tmp_path):
    """threads runs with small counts while micro fails its check (no programs in the
    build dir): the error is reported and recorded, threads still runs."""
    empty = tmp_path / "emptybuild"
    empty.mkdir()
    out = tmp_path / "t.json"
    r = keel("--build-dir", str(empty), "bench", "micro", "threads", "--set",
             "threads.counts=1,16", "--allocators", "glibc", "--rounds", "2", "--out", str(out),
             timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "not built" in r.stderr
    d = load(out)
    assert "not built" in d["suites"]["micro"]["error"] and d["suites"]["micro"]["runs"] == []
    runs = d["suites"]["threads"]["runs"]
    assert len(runs) == 2 and all(x["ok"] for x in runs)
    pts = runs[0]["result"]["points"]
    assert [p["x"] for p in pts] == [1, 16]
    assert all(p["rss_per_thread_kib"] > 0 for p in pts)
    assert runs[0]["result"]["metrics"]["rss_per_thread_kib"] == pts[-1]["rss_per_thread_kib"]


def test_bench_threads_blocks(tmp_path):
    """blocks sets what each thread allocates: with 24 blocks (about 14 KiB live, written)
    a parked thread costs more than with none, by at least 8 KiB; 25 is refused."""
    per = {}
    for blocks in (0, 24):
        out = tmp_path / f"b{blocks}.json"
        r = keel("bench", "threads", "--set", "threads.counts=64", "--set",
                 f"threads.blocks={blocks}", "--allocators", "glibc", "--rounds", "1",
                 "--out", str(out), timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        res = load(out)["suites"]["threads"]["runs"][0]["result"]
        assert res["params"]["blocks"] == blocks
        per[blocks] = res["metrics"]["rss_per_thread_kib"]
    assert per[0] > 0 and per[24] - per[0] >= 8, per
    r = keel("bench", "threads", "--set", "threads.blocks=25", "--allocators", "glibc",
             "--out", str(tmp_path / "bad.json"))
    assert r.returncode != 0 and "blocks must be 0-24" in r.stdout + r.stderr


def test_bench_threads_work(tmp_path):
    """work makes each thread allocate and free blocks before it parks: glibc keeps its
    tcache (up to 7 chunks of each size up to 1 KiB) and its arena's free chunks, so a
    burst of 512 blocks of 16 B - 1 KiB costs a parked thread more than no work at all,
    by at least 16 KiB (about 260 KiB go through each thread's hands)."""
    per = {}
    for work in ("0", "512"):
        out = tmp_path / f"w{work}.json"
        r = keel("bench", "threads", "--set", "threads.counts=16", "--set", f"threads.work={work}",
                 "--set", "threads.work_burst=1", "--allocators", "glibc", "--rounds", "1",
                 "--out", str(out), timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        res = load(out)["suites"]["threads"]["runs"][0]["result"]
        assert res["params"]["work"] == int(work) and res["params"]["work_burst"] == 1
        per[work] = res["metrics"]["rss_per_thread_kib"]
    assert per["512"] - per["0"] >= 16, per


def test_bench_bad_set_and_missing_allocator(tmp_path):
    r = keel("bench", "threads", "--set", "nodot=1", "--allocators", "glibc")
    assert r.returncode == 2 and "SUITE.KEY=VALUE" in r.stderr
    r = keel("bench", "threads", "--allocators", f"glibc,{tmp_path}/libnothere.so")
    assert r.returncode == 2 and "does not exist" in r.stderr and "--skip-missing" in r.stderr


def _threads_park_procs():
    out = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            if (p.info["name"] or "").startswith("threads_park"):
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


def test_sigint_stops_cleanly_and_writes_partial_results(tmp_path):
    out = tmp_path / "i.json"
    before = set(_threads_park_procs())
    p = subprocess.Popen([sys.executable, "-m", "keel_lab", "bench", "threads", "--set",
                          "threads.counts=1,4,16,64,256", "--allocators", "glibc",
                          "--rounds", "50", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         # As from a terminal: a test run started in the background
                         # (nohup, CI) has SIGINT ignored, which the child inherits and
                         # Python then keeps.
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            time.sleep(0.2)
            if p.poll() is not None:
                break
            try:
                if len(json.loads(out.read_text())["suites"]["threads"]["runs"]) >= 1:
                    break
            except (OSError, ValueError, KeyError):
                pass
        assert p.poll() is None, p.communicate()
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr
    d = load(out)
    assert d["meta"]["interrupted"] is True and d["meta"]["complete"] is False
    n = len(d["suites"]["threads"]["runs"])
    assert 1 <= n < 50
    assert all(r["ok"] for r in d["suites"]["threads"]["runs"])
    time.sleep(0.2)
    assert set(_threads_park_procs()) - before == set(), "threads_park left running"


class EnvSuite(Suite):
    """Records the environment each allocator gives the programs it runs."""
    name = "envsuite"
    description = "records env() per allocator"
    seen: dict = {}

    def run(self, ctx):
        env = ctx.allocator.env({})
        EnvSuite.seen[ctx.allocator.name] = (env, ctx.allocator.is_keel, Path(ctx.workdir))
        return {"metrics": {"rss_final_kib": 1000 + len(env)}}


def test_keel_variants_are_columns_of_their_own(monkeypatch, tmp_path):
    from keel_lab.report import render
    monkeypatch.setitem(suites.REGISTRY, "envsuite", EnvSuite)
    EnvSuite.seen = {}
    lib = tmp_path / "libkeel.so"
    lib.write_bytes(b"")
    plain = Allocator("keel", str(lib))
    mesh = Allocator("keel+mesh", str(lib), (("KEEL_MESH", "on"),))
    odd = Allocator("keel+KEEL_PROFILE_PREFIX=/tmp/p", str(lib),
                    (("KEEL_PROFILE_PREFIX", "/tmp/p"),))
    doc, _ = run_bench(["envsuite"], [plain, mesh, odd], rounds=1, out=tmp_path / "r.json",
                       lock=False)
    assert EnvSuite.seen["keel"][0] == {"LD_PRELOAD": str(lib)}
    assert EnvSuite.seen["keel+mesh"][0] == {"LD_PRELOAD": str(lib), "KEEL_MESH": "on"}
    assert all(is_keel for _e, is_keel, _w in EnvSuite.seen.values())
    assert EnvSuite.seen["keel+KEEL_PROFILE_PREFIX=/tmp/p"][2].parent == \
        EnvSuite.seen["keel"][2].parent          # a / in the name makes no subdirectory
    on_disk = load(tmp_path / "r.json")
    info = on_disk["meta"]["allocator_info"]
    assert on_disk["meta"]["allocators"] == ["keel", "keel+mesh",
                                             "keel+KEEL_PROFILE_PREFIX=/tmp/p"]
    assert info["keel"]["env"] == {} and info["keel+mesh"]["env"] == {"KEEL_MESH": "on"}
    assert info["keel+mesh"]["is_keel"] is True
    assert [r["allocator"] for r in on_disk["suites"]["envsuite"]["runs"]] == \
        ["keel", "keel+mesh", "keel+KEEL_PROFILE_PREFIX=/tmp/p"]
    ss = summarize(on_disk)["envsuite"]
    assert set(ss.allocators) == {"keel", "keel+mesh", "keel+KEEL_PROFILE_PREFIX=/tmp/p"}
    # the report shows Keel's options for a variant alone too, and says what it sets
    on_disk["meta"]["allocators"] = ["keel+mesh"]
    on_disk["meta"]["allocator_info"] = {"keel+mesh": info["keel+mesh"]}
    on_disk["suites"]["envsuite"]["runs"] = on_disk["suites"]["envsuite"]["runs"][1:2]
    html = render(on_disk, charts=False)
    assert "id=keel-options" in html and "with KEEL_MESH=on" in html


# ---------------------------------------------------------------------------------
# setup and output errors: one line, non-zero status, before anything runs (offline)


@pytest.fixture
def nothing_runs(monkeypatch):
    """Makes sure the bench under test starts no suite (the errors come first)."""
    import keel_lab.bench as bench_mod

    def boom(*a, **kw):
        raise AssertionError("the bench started running suites")
    monkeypatch.setattr(bench_mod, "_loop", boom)


def _bench_cli(capsys, *args: str) -> tuple[int, str]:
    from keel_lab import cli
    rc = cli.main(["bench", *args, "--allocators", "glibc", "--no-lock"])
    return rc, capsys.readouterr().err


def _one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("keel: error: "), err
    assert "Traceback" not in err and "internal error" not in err
    return lines[0]


def test_unwritable_out_is_one_line(tmp_path, capsys, nothing_runs):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, message in ((afile / "r.json", f"{afile} is not a directory"),
                         (tmp_path, "is a directory: give a file name")):
        rc, err = _bench_cli(capsys, "threads", "--out", str(out))
        assert rc == 2
        line = _one_error_line(err)
        assert message in line and str(out) in line
    assert afile.read_text() == "x"


def test_read_only_out_directory_is_one_line(tmp_path, capsys, nothing_runs):
    if os.geteuid() == 0:
        pytest.skip("root can write into a read-only directory")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        rc, err = _bench_cli(capsys, "threads", "--out", str(ro / "r.json"))
    finally:
        ro.chmod(0o755)
    assert rc == 2 and "Permission denied" in _one_error_line(err)
    assert list(ro.iterdir()) == []


def test_results_file_that_cannot_be_rewritten_mid_bench(fake, tmp_path):
    """The directory of the results file turns into a file after the first run: the
    bench ends with a BenchError naming the file, not an OSError traceback."""
    sub = tmp_path / "sub"
    out = sub / "r.json"

    class Sabotage(FakeSuite):
        def run(self, ctx):
            res = super().run(ctx)
            shutil.rmtree(sub)
            sub.write_text("not a directory any more")
            return res
    suites.REGISTRY["fake"] = Sabotage
    with pytest.raises(BenchError, match=f"cannot write the results file {out}"):
        run_bench(["fake"], [A], rounds=1, out=out, lock=False)


@pytest.mark.parametrize("setting,message", [
    ("micro.scale=x", "micro: option scale='x': expected a number > 0"),
    ("micro.scale=0", "micro: option scale='0': expected a number > 0"),
    ("micro.scale=nan", "micro: option scale='nan'"),
    ("micro.threads=two", "micro: option threads='two': expected a whole number > 0"),
    ("micro.timeout=-5", "micro: option timeout='-5'"),
    ("micro.programs=nosuch", "micro: unknown program(s) nosuch"),
    ("threads.stack_kib=big", "threads: option stack_kib='big'"),
    ("threads.settle_ms=x", "threads: option settle_ms='x'"),
    ("threads.counts=1,x", "threads: bad counts"),
    ("threads.blocks=25", "threads: blocks must be 0-24, not 25"),
    ("threads.work=-1", "threads: option work='-1'"),
    ("threads.work_burst=2", "threads: work_burst must be 0 or 1, not 2"),
])
def test_bad_set_value_is_one_line_before_anything_runs(tmp_path, capsys, nothing_runs,
                                                       setting, message):
    suite = setting.split(".", 1)[0]
    out = tmp_path / "r.json"
    rc, err = _bench_cli(capsys, suite, "--set", setting, "--out", str(out))
    assert rc == 2
    assert message in _one_error_line(err)
    assert not out.exists()


def test_micro_options_are_checked_by_the_suite_too():
    """run() and check() go through the same checks as the bench's early one."""
    from keel_lab.suites.micro import MicroSuite
    ctx = SuiteContext(allocator=A, quick=True, workdir=Path("."), options={"scale": "x"})
    with pytest.raises(SuiteError, match="option scale='x'"):
        MicroSuite().check(ctx)
    with pytest.raises(SuiteError, match="option scale='x'"):
        MicroSuite().run(ctx)
    ok = SuiteContext(allocator=A, quick=True, workdir=Path("."),
                      options={"scale": "0.5", "threads": "4", "timeout": "30"})
    s = MicroSuite()
    assert (s.scale(ok), s.threads(ok), s.timeout(ok)) == (0.5, 4, 30.0)
    dflt = SuiteContext(allocator=A, quick=False, workdir=Path("."))
    assert (s.scale(dflt), s.threads(dflt), s.timeout(dflt)) == (1.0, None, 300.0)


def test_bench_report_failure_is_one_line_and_keeps_the_results(tmp_path, capsys, monkeypatch):
    """--report after a finished bench: a report that cannot be written is one error line
    that says where the results are and how to retry, and the status is non-zero."""
    import keel_lab.bench as bench_mod
    from conftest import FIXTURES
    doc = json.loads((FIXTURES / "results_small.json").read_text())
    for s in doc["suites"].values():           # no failed runs: the bench itself is fine
        s["runs"] = [r for r in s["runs"] if r.get("ok")]
    out = tmp_path / "r.json"
    out.write_text(json.dumps(doc))
    assert bench_mod.run_status(doc) == 0
    monkeypatch.setattr(bench_mod, "run_bench", lambda *a, **kw: (doc, out))
    (tmp_path / "r.html").mkdir()              # the report's path is taken by a directory
    rc, err = _bench_cli(capsys, "micro", "--report", "--out", str(out))
    assert rc == 1
    line = _one_error_line(err)
    assert f"cannot write the report {tmp_path / 'r.html'}" in line
    assert f"keel report {out}" in line
    assert json.loads(out.read_text()) == doc
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".r.html")] == []
    # a failure while rendering, too
    (tmp_path / "r.html").rmdir()
    import keel_lab.report as report_mod

    def broken(*a, **kw):
        raise ValueError("a chart failed")
    monkeypatch.setattr(report_mod, "render", broken)
    rc, err = _bench_cli(capsys, "micro", "--report", "--out", str(out))
    assert rc == 1 and "a chart failed" in _one_error_line(err)
    assert not (tmp_path / "r.html").exists()
