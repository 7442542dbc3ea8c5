"""keel which: real processes under Debian's jemalloc, under libkeel.so, static and
prefixed allocators, missing and unreadable PIDs."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import keel
from keel_lab import which as which_mod
from keel_lab.elf import Elf
from keel_lab.which import WhichError, inspect_command, inspect_pid, predict_command


def _start(cmd, env_extra=None, **kw):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.update(env_extra or {})
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, **kw)
    time.sleep(0.4)
    assert p.poll() is None, f"{cmd} exited early ({p.returncode})"
    return p


def _stop(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


@pytest.fixture
def sleeper():
    procs = []

    def start(preload=None, cmd=("sleep", "30")):
        p = _start(list(cmd), {"LD_PRELOAD": preload} if preload else None)
        procs.append(p)
        return p
    yield start
    for p in procs:
        _stop(p)


def test_plain_process_uses_glibc(sleeper):
    p = sleeper()
    r = inspect_pid(p.pid)
    assert r.allocator == "glibc"
    assert r.how == "linked"
    assert r.library and "libc.so" in r.library
    assert r.ld_preload == ""


def test_preloaded_jemalloc(sleeper, jemalloc_path):
    p = sleeper(jemalloc_path)
    r = inspect_pid(p.pid)
    assert r.allocator == "jemalloc", r.render()
    assert r.how == "LD_PRELOAD"
    assert os.path.realpath(r.library) == os.path.realpath(jemalloc_path)
    assert "environ" in r.detail
    # and through the CLI, as JSON
    out = keel("which", str(p.pid), "--json", check=True)
    d = json.loads(out.stdout)
    assert d["allocator"] == "jemalloc" and d["how"] == "LD_PRELOAD"


def test_preloaded_keel(sleeper, keel_path):
    p = sleeper(keel_path)
    r = inspect_pid(p.pid)
    assert r.allocator == "keel", r.render()
    assert r.how == "LD_PRELOAD"
    text = keel("which", str(p.pid), check=True).stdout
    assert "keel" in text and "LD_PRELOAD" in text


def test_keel_preloaded_over_a_linked_jemalloc(tmp_path, keel_path):
    """redis-server links libjemalloc.so.2 (Debian) and rewrites its environment area
    (process title), so /proc/PID/environ no longer shows LD_PRELOAD: the loader's
    link map still shows keel loaded first."""
    redis = shutil.which("redis-server")
    if not redis:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    sock = tmp_path / "r.sock"
    p = _start([redis, "--port", "0", "--unixsocket", str(sock), "--save", "",
                "--appendonly", "no", "--dir", str(tmp_path)], {"LD_PRELOAD": keel_path})
    try:
        r = inspect_pid(p.pid)
        assert r.allocator == "keel", r.render()
        assert r.how == "LD_PRELOAD"
        linked = [o for o in r.others if o["family"] == "jemalloc"]
        if "libjemalloc" in " ".join(Elf(os.path.realpath(redis)).needed):
            assert linked and linked[0]["how"] == "linked"
            assert "not used" in linked[0]["why"]
    finally:
        _stop(p)


def test_redis_linked_jemalloc_without_preload(tmp_path):
    redis = shutil.which("redis-server")
    if not redis:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    if "libjemalloc.so.2" not in Elf(os.path.realpath(redis)).needed:
        pytest.skip("this redis-server does not link libjemalloc.so.2")
    p = _start([redis, "--port", "0", "--unixsocket", str(tmp_path / "r.sock"), "--save", "",
                "--dir", str(tmp_path)])
    try:
        r = inspect_pid(p.pid)
        assert r.allocator == "jemalloc" and r.how == "linked", r.render()
        assert "DT_NEEDED" in r.detail
    finally:
        _stop(p)


def test_static_jemalloc_in_the_executable(tmp_path, cc, keel_path):
    from keel_lab.allocators import LIBDIRS
    archive = next((Path(d) / "libjemalloc.a" for d in LIBDIRS if (Path(d) / "libjemalloc.a").exists()),
                   None)
    if archive is None:
        pytest.skip("libjemalloc.a is not installed (apt-get install libjemalloc-dev)")
    src = tmp_path / "s.c"
    src.write_text('#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n'
                   'int main(void){void*p=malloc(100);printf("%p\\n",p);fflush(stdout);'
                   'sleep(30);free(p);return 0;}\n')
    exe = tmp_path / "static_je"
    r = subprocess.run([cc, "-O1", "-fno-builtin", str(src), "-o", str(exe), str(archive), "-lpthread", "-lm",
                        "-ldl"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    p = _start([str(exe)], {"LD_PRELOAD": keel_path})
    try:
        res = inspect_pid(p.pid)
        assert res.allocator == "jemalloc" and res.how == "static", res.render()
        assert "cannot replace" in res.detail
        assert any(o["family"] == "keel" for o in res.others)   # preloaded but not used
    finally:
        _stop(p)


def test_prefixed_static_allocator_is_reported_as_the_programs_own(tmp_path, cc):
    """Like Redis built from source: je_malloc in the executable, malloc from elsewhere."""
    src = tmp_path / "p.c"
    src.write_text('#include <stdlib.h>\n#include <unistd.h>\n'
                   'void* je_malloc(size_t n){return malloc(n);}\n'
                   'int main(void){void*p=je_malloc(10);sleep(30);free(p);return 0;}\n')
    exe = tmp_path / "prefixed"
    r = subprocess.run([cc, "-O1", "-rdynamic", str(src), "-o", str(exe)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    p = _start([str(exe)])
    try:
        res = inspect_pid(p.pid)
        assert res.allocator == "glibc"
        assert res.own_allocator and res.own_allocator.startswith("jemalloc")
        assert "regardless of LD_PRELOAD" in res.render()
    finally:
        _stop(p)


def test_nonexistent_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    with pytest.raises(WhichError, match="no process with PID"):
        inspect_pid(p.pid)
    out = keel("which", str(p.pid))
    assert out.returncode == 1
    assert f"no process with PID {p.pid}" in out.stderr
    assert "Traceback" not in out.stderr


def test_bad_arguments():
    out = keel("which", "notapid")
    assert out.returncode == 2 and "not a PID" in out.stderr
    out = keel("which")
    assert out.returncode == 2 and "give a PID" in out.stderr


def test_kernel_thread():
    if not Path("/proc/2/status").exists() or "kthreadd" not in Path("/proc/2/status").read_text():
        pytest.skip("PID 2 is not kthreadd here (container without kernel threads)")
    with pytest.raises(WhichError, match="kernel thread|permission"):
        inspect_pid(2)


def test_permission_denied_message(sleeper, monkeypatch):
    p = sleeper()
    real = which_mod._proc_read

    def deny(pid, name, binary=False):
        if name == "maps":
            raise PermissionError(13, "Permission denied")
        return real(pid, name, binary)
    monkeypatch.setattr(which_mod, "_proc_read", deny)
    with pytest.raises(WhichError, match="permission denied"):
        inspect_pid(p.pid)


def test_permission_denied_for_real_as_another_user(sleeper):
    """An unprivileged user inspecting root's process gets the clear message."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a check as another user")
    setpriv = shutil.which("setpriv")
    if not setpriv:
        pytest.skip("setpriv is missing (apt-get install util-linux)")
    p = sleeper()
    code = ("import sys; from keel_lab.which import inspect_pid, WhichError\n"
            "try:\n inspect_pid(int(sys.argv[1]))\nexcept WhichError as e:\n print(e)\n")
    r = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
                        sys.executable, "-c", code, str(p.pid)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(Path(which_mod.__file__).parents[1])})
    if "Permission denied" in r.stderr and "python" in r.stderr.lower() and not r.stdout:
        pytest.skip(f"the venv is not readable by nobody: {r.stderr.strip()[-200:]}")
    assert "permission denied" in r.stdout, (r.stdout, r.stderr)
    assert "root" in r.stdout


def test_which_command_starts_inspects_and_stops_it(jemalloc_path):
    env = {**os.environ, "LD_PRELOAD": jemalloc_path}
    res = inspect_command(["sleep", "30"], wait=0.3, env=env)
    assert res.allocator == "jemalloc" and res.how == "LD_PRELOAD"
    assert res.method == "live"
    time.sleep(0.1)
    assert not Path(f"/proc/{res.pid}").exists() or \
        Path(f"/proc/{res.pid}/stat").read_text().split(")")[1].split()[0] == "Z", \
        "the inspected command was not stopped"


def test_which_command_via_cli(keel_path):
    env = {**os.environ, "LD_PRELOAD": keel_path}
    out = keel("which", "--", "sleep", "30", env=env, check=True)
    assert "keel" in out.stdout and "LD_PRELOAD" in out.stdout
    pid = int(out.stdout.split()[1].rstrip(":"))
    assert not Path(f"/proc/{pid}").exists()


def test_short_lived_command_is_predicted(jemalloc_path):
    res = inspect_command(["true"], wait=0.5, env={**os.environ, "LD_PRELOAD": jemalloc_path})
    assert res.method == "predicted"
    assert res.allocator == "jemalloc" and res.how == "LD_PRELOAD"
    res = predict_command(["ls"], env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    assert res.allocator == "glibc"


def test_elf_reader_agrees_with_readelf():
    readelf = shutil.which("readelf")
    if not readelf:
        pytest.skip("readelf is missing (apt-get install binutils)")
    exe = os.path.realpath(shutil.which("ls"))
    out = subprocess.run([readelf, "-dW", exe], capture_output=True, text=True).stdout
    needed = [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]
    assert Elf(exe).needed == needed
    libc = next(line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                if "/libc.so" in line or "/libc-" in line)
    syms = Elf(libc).defined_symbols("dynsym", {"malloc", "__libc_malloc", "no_such_symbol"})
    assert syms == {"malloc", "__libc_malloc"}


STATIC_SRC = r"""
#include <stdio.h>
#include <stdlib.h>
/* Leaves a mark when it runs: keel which --no-run must never start it. */
int main(void) {
  const char* mark = getenv("KEEL_TEST_MARK");
  FILE* f = mark ? fopen(mark, "w") : NULL;
  if (f) fclose(f);
  void* p = malloc(100);
  printf("%p\n", p);
  return 0;
}
"""


@pytest.mark.parametrize("flag", ["-static", "-static-pie"])
def test_no_run_never_executes_a_static_binary(tmp_path, cc, flag):
    """A static executable ignores LD_TRACE_LOADED_OBJECTS and would simply run: --no-run
    judges it from its symbols instead, says so, and the program leaves no mark. A
    static-pie binary has a PT_DYNAMIC but no PT_INTERP, and is static all the same."""
    src = tmp_path / "s.c"
    src.write_text(STATIC_SRC)
    exe = tmp_path / "static_prog"
    r = subprocess.run([cc, flag, "-O1", str(src), "-o", str(exe)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot link with {flag} here (libc6-dev's static libc.a missing?): "
                    f"{r.stderr.strip()[-300:]}")
    assert Elf(exe).interp is None and Elf(exe).is_static
    mark = tmp_path / "ran"
    env = {**os.environ, "KEEL_TEST_MARK": str(mark)}
    # the mark works: running it for real leaves one
    subprocess.run([str(exe)], env=env, check=True, capture_output=True)
    assert mark.exists()
    mark.unlink()

    res = predict_command([str(exe)], env=env)
    assert not mark.exists(), "predict_command ran the static binary"
    assert res.allocator == "glibc" and res.how == "static", res.render()
    assert any(n.startswith("static executable") and "not by running it" in n for n in res.notes)
    out = keel("which", "--no-run", "--", str(exe), env=env, check=True)
    assert not mark.exists(), "keel which --no-run ran the static binary"
    assert "static executable (no program interpreter)" in out.stdout
    # LD_PRELOAD cannot reach it, and the output says so rather than blaming the loader
    out = keel("which", "--no-run", "--", str(exe), check=True,
               env={**env, "LD_PRELOAD": "/nonexistent/libfoo.so"})
    assert not mark.exists()
    assert "LD_PRELOAD and /etc/ld.so.preload do not apply" in out.stdout
    assert "the loader ignored it" not in out.stdout


def test_no_run_traces_a_dynamic_binary_through_its_loader(tmp_path, cc):
    """A dynamic executable is listed by its loader (ld.so EXE), never started."""
    src = tmp_path / "d.c"
    src.write_text(STATIC_SRC)
    exe = tmp_path / "dynamic_prog"
    subprocess.run([cc, "-O1", str(src), "-o", str(exe)], check=True)
    mark = tmp_path / "ran"
    res = predict_command([str(exe)], env={**os.environ, "KEEL_TEST_MARK": str(mark)})
    assert not mark.exists()
    assert res.allocator == "glibc" and res.how == "linked", res.render()
    assert res.library and "libc.so" in res.library
