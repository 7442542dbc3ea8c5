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

from conftest import build_jemalloc_linked, keel
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


# ---- a library the program links, preloaded (LD_PRELOAD=libc.so.6 over a linked jemalloc)


def _libc_path() -> str:
    return next(line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                if "/libc.so" in line or "/libc-" in line)


def test_libc_preloaded_over_a_linked_jemalloc_in_redis(tmp_path):
    """How the lab measures "glibc" for Debian's redis-server (servers._choose_preload):
    LD_PRELOAD=libc.so.6. libc is also a linked dependency, and Redis rewrites its
    environment area, so only the loader's link map (libc loaded before libjemalloc)
    shows that glibc serves malloc."""
    redis = shutil.which("redis-server")
    if not redis:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    if "libjemalloc.so.2" not in Elf(os.path.realpath(redis)).needed:
        pytest.skip("this redis-server does not link libjemalloc.so.2")
    libc = _libc_path()
    p = _start([redis, "--port", "0", "--unixsocket", str(tmp_path / "r.sock"), "--save", "",
                "--appendonly", "no", "--dir", str(tmp_path)], {"LD_PRELOAD": libc})
    try:
        r = inspect_pid(p.pid)
        if which_mod.link_map_order(p.pid) is None:
            pytest.skip("the loader's link map is not readable here (needs ptrace rights)")
        assert r.allocator == "glibc", r.render()
        assert r.how == "LD_PRELOAD", r.render()
        assert os.path.realpath(r.library) == os.path.realpath(libc)
        je = [o for o in r.others if o["family"] == "jemalloc"]
        assert je and je[0]["how"] == "linked" and "not used" in je[0]["why"], r.render()
    finally:
        _stop(p)


WIPE_ENV_SRC = r"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
extern char** environ;
/* Links libjemalloc, then blanks its environment area as Redis does for its process
   title: /proc/PID/environ then shows no LD_PRELOAD. */
int main(void) {
  char* start = environ[0];
  char* end = start;
  for (char** e = environ; *e; e++) end = *e + strlen(*e) + 1;
  if (start) memset(start, 0, end - start);
  void* p = malloc(100);
  sleep(30);
  free(p);
  return 0;
}
"""


@pytest.fixture
def je_linked_prog(tmp_path, cc):
    exe = build_jemalloc_linked(cc, tmp_path, "je_linked", WIPE_ENV_SRC)
    assert "libjemalloc.so.2" in Elf(exe).needed
    return exe


def test_libc_preloaded_over_a_linked_jemalloc_small_program(je_linked_prog):
    libc = _libc_path()
    p = _start([str(je_linked_prog)], {"LD_PRELOAD": libc})
    try:
        if which_mod.link_map_order(p.pid) is None:
            pytest.skip("the loader's link map is not readable here (needs ptrace rights)")
        r = inspect_pid(p.pid)
        assert r.ld_preload == ""        # the environment area was blanked
        assert r.allocator == "glibc" and r.how == "LD_PRELOAD", r.render()
        assert any(o["family"] == "jemalloc" and "not used" in o["why"] for o in r.others)
        assert any("rewrote its environment" in n for n in r.notes)
    finally:
        _stop(p)
    # without the preload the linked jemalloc serves malloc, and libc stays "linked"
    p = _start([str(je_linked_prog)])
    try:
        r = inspect_pid(p.pid)
        assert r.allocator == "jemalloc" and r.how == "linked", r.render()
        assert not r.notes, r.render()
    finally:
        _stop(p)
    # predicted from ldd's load order, the same answer
    res = predict_command([str(je_linked_prog)], env={**os.environ, "LD_PRELOAD": libc})
    assert res.allocator == "glibc" and res.how == "LD_PRELOAD", res.render()


def test_second_preload_after_a_linked_libc_is_not_taken_for_dlopen(je_linked_prog, keel_path):
    """LD_PRELOAD="libc.so.6 libkeel.so" with the environment area blanked: libc is
    loaded first and serves malloc; libkeel comes next, preloaded (not dlopen()ed)."""
    p = _start([str(je_linked_prog)], {"LD_PRELOAD": f"{_libc_path()} {keel_path}"})
    try:
        if which_mod.link_map_order(p.pid) is None:
            pytest.skip("the loader's link map is not readable here (needs ptrace rights)")
        r = inspect_pid(p.pid)
        assert r.allocator == "glibc" and r.how == "LD_PRELOAD", r.render()
        kl = [o for o in r.others if o["family"] == "keel"]
        assert kl and kl[0]["how"] == "LD_PRELOAD" and "comes after glibc" in kl[0]["why"], \
            r.render()
    finally:
        _stop(p)


# ---- keel which -- CMD: what the command leaves behind is stopped too


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


def _kill_if_running(*pids):
    for pid in pids:
        if pid and _running(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _wait_file(path: Path, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text().split()[0])
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written")


def _forking_script(tmp_path: Path, then: str = "exit 0") -> tuple[Path, Path]:
    """A script that forks a sleeper into its own session (setsid), writes the sleeper's
    PID, then runs `then`."""
    pidfile = tmp_path / "sleeper.pid"
    script = tmp_path / "forker.sh"
    script.write_text(f"#!/bin/sh\nsetsid sleep 300 </dev/null >/dev/null 2>&1 &\n"
                      f"echo $! > {pidfile}\n{then}\n")
    script.chmod(0o755)
    return script, pidfile


def test_which_command_stops_a_child_that_left_the_session(tmp_path):
    script, pidfile = _forking_script(tmp_path)
    sleeper = None
    try:
        out = keel("which", "--", str(script), timeout=60)
        sleeper = _wait_file(pidfile)
        time.sleep(0.2)
        assert not _running(sleeper), f"the setsid sleeper {sleeper} outlived keel which"
        # the command exited and left the sleeper: that is what was inspected
        assert out.returncode == 0, out.stderr
        assert "glibc" in out.stdout and "daemonised" in out.stdout, out.stdout
    finally:
        _kill_if_running(sleeper)
    # and in this process (pytest's), through the function
    pidfile.unlink()
    sleeper = None
    try:
        res = inspect_command([str(script)], wait=0.3)
        sleeper = _wait_file(pidfile)
        assert res.pid == sleeper and res.allocator == "glibc", res.render()
        time.sleep(0.2)
        assert not _running(sleeper), f"the setsid sleeper {sleeper} outlived inspect_command"
        assert not Path(f"/proc/{sleeper}").exists(), "the sleeper was not reaped"
    finally:
        _kill_if_running(sleeper)
    assert which_mod._subreaper(None) is False    # the setting was put back


def _pids_with_arg(arg: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if arg in d.joinpath("cmdline").read_bytes().decode("utf-8", "replace"):
                    out.append(int(d.name))
            except OSError:
                pass
    return [p for p in out if _running(p)]


def test_which_command_stops_a_daemonised_redis(tmp_path):
    """redis-server --daemonize yes: the started process forks the server and exits; the
    server is inspected, then stopped (it removes its pidfile when it shuts down)."""
    redis = shutil.which("redis-server")
    if not redis:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    sock = str(tmp_path / "r.sock")
    pidfile = tmp_path / "redis.pid"
    try:
        res = inspect_command([redis, "--port", "0", "--unixsocket", sock, "--save", "",
                               "--dir", str(tmp_path), "--daemonize", "yes",
                               "--pidfile", str(pidfile)], wait=1.0,
                              env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
        assert res.method == "live" and any("daemonised" in n for n in res.notes), res.render()
        assert res.allocator in ("jemalloc", "glibc"), res.render()
        time.sleep(0.2)
        assert not _running(res.pid), f"the daemonised redis-server {res.pid} outlived it"
        assert not _pids_with_arg(sock), "a redis-server outlived keel which"
    finally:
        _kill_if_running(*_pids_with_arg(sock))


def test_sigterm_to_keel_which_stops_the_command(tmp_path):
    """keel which -- CMD --wait 60, then SIGTERM to keel: the command (its own session)
    and what it forked into another session are stopped before keel exits."""
    cmdpid = tmp_path / "cmd.pid"
    script, pidfile = _forking_script(tmp_path, then=f"echo $$ > {cmdpid}\nexec sleep 300")
    env = {**os.environ, "COLUMNS": "160"}
    k = subprocess.Popen([sys.executable, "-m", "keel_lab", "which", "--wait", "60", "--",
                          str(script)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    sleeper = cmd = None
    try:
        sleeper, cmd = _wait_file(pidfile), _wait_file(cmdpid)
        time.sleep(0.3)
        k.send_signal(signal.SIGTERM)
        out, err_ = k.communicate(timeout=20)
        assert k.returncode == 128 + signal.SIGTERM, (k.returncode, out, err_)
        assert "SIGTERM" in err_ and "Traceback" not in err_
        time.sleep(0.2)
        assert not _running(cmd), "the command outlived keel which"
        assert not _running(sleeper), "the setsid sleeper outlived keel which"
    finally:
        if k.poll() is None:
            k.kill()
            k.wait()
        _kill_if_running(sleeper, cmd)
