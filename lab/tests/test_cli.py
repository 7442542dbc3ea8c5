"""The CLI: help, keel run, keel deploy, keel options, keel suites, the suite registry."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import BUILD, build_jemalloc_linked, keel
from keel_lab import suites
from keel_lab.keel_options import OPTIONS
from keel_lab.paths import SOURCE_DIR


@pytest.mark.parametrize("sub", ["", "which", "run", "bench", "report", "recommend", "deploy",
                                 "options", "suites", "allocators"])
def test_help(sub):
    r = keel(*([sub] if sub else []), "--help", check=True)
    assert "usage: keel" in r.stdout


def test_entry_point_and_module_agree():
    exe = shutil.which("keel", path=os.path.dirname(sys.executable))
    if not exe:
        pytest.skip("the keel entry point is not installed in this venv (pip install -e lab)")
    r = subprocess.run([exe, "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and "keel-lab" in r.stdout


def test_no_command_prints_help():
    r = keel()
    assert r.returncode == 2 and "keel which PID" in r.stdout


# -- keel run -------------------------------------------------------------------------


def test_run_sets_ld_preload(jemalloc_path):
    r = keel("run", "--allocator", "jemalloc", "--", "sh", "-c", 'echo "[$LD_PRELOAD]"',
             check=True)
    assert r.stdout.strip() == f"[{jemalloc_path}]"


def test_run_glibc_removes_ld_preload(jemalloc_path):
    env = {**os.environ, "LD_PRELOAD": jemalloc_path}
    r = keel("run", "-a", "glibc", "--", "sh", "-c", 'echo "[${LD_PRELOAD-unset}]"', env=env,
             check=True)
    assert r.stdout.strip() == "[unset]"


WHO_SERVES_MALLOC_SRC = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
/* Linked to libjemalloc: prints the object whose malloc the program calls. */
int main(void) {
  void* (*volatile f)(size_t) = malloc;
  Dl_info i;
  if (!dladdr((void*)f, &i) || !i.dli_fname) return 3;
  printf("%s\n", i.dli_fname);
  return 0;
}
"""


def test_run_glibc_preloads_libc_for_a_program_linked_to_another_allocator(tmp_path, cc):
    """keel run --allocator glibc -- PROGRAM, where PROGRAM links libjemalloc (Debian's
    redis-server): removing LD_PRELOAD would leave it on jemalloc; libc is preloaded
    instead, and keel says so."""
    exe = build_jemalloc_linked(cc, tmp_path, "who", WHO_SERVES_MALLOC_SRC, "-ldl")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    plain = subprocess.run([str(exe)], capture_output=True, text=True, env=env, check=True)
    assert "libjemalloc" in plain.stdout            # the program on its own
    out = keel("run", "-a", "glibc", "--", str(exe), env=env, check=True)
    assert "libc.so" in out.stdout and "libjemalloc" not in out.stdout, out
    assert "links libjemalloc.so.2 itself" in out.stderr and "LD_PRELOAD=" in out.stderr
    # a program that links no other allocator: LD_PRELOAD removed, nothing said
    out = keel("run", "-a", "glibc", "--", "sh", "-c", 'echo "[${LD_PRELOAD-unset}]"',
               env=env, check=True)
    assert out.stdout.strip() == "[unset]" and out.stderr == ""


def test_run_passes_the_exit_status():
    r = keel("run", "-a", "glibc", "--", "sh", "-c", "exit 7")
    assert r.returncode == 7


def test_run_with_missing_allocator_says_how_to_get_it(tmp_path):
    r = keel("run", "--allocator", str(tmp_path / "libnothere.so"), "--", "true")
    assert r.returncode == 2
    assert "does not exist" in r.stderr
    # keel not built in this build dir: the message says how to build it
    empty = tmp_path / "emptybuild"
    empty.mkdir()
    r = keel("--build-dir", str(empty), "run", "--allocator", "keel", "--", "true")
    assert r.returncode == 2
    assert "libkeel.so not found" in r.stderr and "cmake" in r.stderr
    r = keel("run", "--allocator", "nosuch", "--", "true")
    assert r.returncode == 2 and "unknown allocator" in r.stderr


def test_run_missing_debian_allocator_names_the_package(monkeypatch, tmp_path):
    from keel_lab import allocators
    monkeypatch.setattr(allocators, "LIBDIRS", [str(tmp_path)])
    with pytest.raises(allocators.AllocatorNotFound, match="apt-get install libmimalloc2.0"):
        allocators.find("mimalloc")


def test_run_unknown_command():
    r = keel("run", "-a", "glibc", "--", "/nonexistent/program")
    assert r.returncode == 127 and "command not found" in r.stderr


# -- keel deploy ----------------------------------------------------------------------


def test_deploy_systemd_dropin(jemalloc_path):
    r = keel("deploy", "jemalloc", "--for", "systemd", "myapp", check=True)
    out = r.stdout
    assert "/etc/systemd/system/myapp.service.d/keel-allocator.conf" in out
    assert f'[Service]\nEnvironment="LD_PRELOAD={jemalloc_path}"' in out
    assert "systemctl daemon-reload" in out and "systemctl restart myapp.service" in out
    assert "keel which $(systemctl show -p MainPID --value myapp.service)" in out


def test_deploy_redis_and_mariadb(jemalloc_path):
    out = keel("deploy", "jemalloc", "--for", "redis", check=True).stdout
    assert "/etc/systemd/system/redis-server.service.d/keel-allocator.conf" in out
    assert f'Environment="LD_PRELOAD={jemalloc_path}"' in out
    out = keel("deploy", "jemalloc", "--for", "mariadb", check=True).stdout
    assert "/etc/systemd/system/mariadb.service.d/keel-allocator.conf" in out
    assert f"[mysqld_safe]\nmalloc-lib={jemalloc_path}" in out


def test_deploy_postgres_uses_the_cluster_environment_file(jemalloc_path):
    out = keel("deploy", "jemalloc", "--for", "postgres", "15/main", check=True).stdout
    assert "/etc/postgresql/15/main/environment" in out
    assert f"LD_PRELOAD = '{jemalloc_path}'" in out
    assert "systemctl restart postgresql@15-main.service" in out


def test_deploy_keel_from_the_build_dir(keel_path):
    out = keel("deploy", "keel", "--for", "redis", check=True).stdout
    assert f"LD_PRELOAD={keel_path}" in out
    assert "KEEL_MESH" not in out and "userfaultfd" not in out   # meshing only with --mesh


def test_deploy_warns_about_paths_services_cannot_see(jemalloc_path):
    """A library under /tmp: hidden from units with PrivateTmp= (and here, also from
    other users: mkdtemp makes the directory 0700). The library lies under /tmp itself,
    wherever pytest's tmp_path is ($TMPDIR may point elsewhere)."""
    if os.path.realpath("/tmp") != "/tmp":
        pytest.skip("/tmp is a symbolic link here")
    d = tempfile.mkdtemp(prefix="keel-deploy-test-", dir="/tmp")
    try:
        lib = os.path.join(d, "libjemalloc.so.2")
        shutil.copy(jemalloc_path, lib)
        out = keel("deploy", lib, "--for", "redis", check=True).stdout
    finally:
        shutil.rmtree(d)
    warning = out[out.index("# WARNING:"):out.index("/usr/local/lib/ && sudo ldconfig")]
    assert f"{lib} is under /tmp/, which hardened units hide (PrivateTmp=" in warning
    assert f"directory {d} is not world-searchable" in warning
    assert "keel deploy /usr/local/lib/libjemalloc.so.2" in out


def _mesh_machine_part(out: str) -> None:
    """What every --mesh snippet prints for the machine, before the service's steps."""
    assert "vm.max_map_count = 1048576" in out
    assert ("echo 'vm.max_map_count = 1048576' | sudo tee /etc/sysctl.d/60-keel-mesh.conf\n"
            "sudo sysctl --system\n") in out
    assert "sudo groupadd --system keel-mesh" in out
    rule = 'KERNEL=="userfaultfd", GROUP="keel-mesh", MODE="0660"'
    assert f"\n{rule}\n" in out
    assert f"echo '{rule}' | sudo tee /etc/udev/rules.d/60-keel-mesh.rules" in out
    assert "udevadm trigger --action=add --sysname-match=userfaultfd" in out
    # what happens without it, and the broader grants named as trade-offs, not commands
    assert "prints one warning" in out and "runs without meshing" in out
    assert "vm.unprivileged_userfaultfd = 1" in out and "exploit aid" in out
    assert "\nsudo sysctl -w" not in out and "unprivileged_userfaultfd = 1\n" not in out
    # the group exists before the restart that names it
    assert out.index("groupadd") < out.index("sudo systemctl restart")
    # how to check it works
    assert "'meshing' section, state on, barrier kernel" in out
    assert "RssAnon + RssFile + the keel-mesh memfd" in out


def test_deploy_mesh_redis(keel_path):
    out = keel("deploy", "keel", "--for", "redis", "--mesh", check=True).stdout
    _mesh_machine_part(out)
    assert (f'[Service]\nEnvironment="LD_PRELOAD={keel_path}"\nEnvironment=KEEL_MESH=on\n'
            "SupplementaryGroups=keel-mesh\n"
            # Debian's redis-server.service has PrivateDevices=yes
            "BindPaths=-/dev/userfaultfd\nDeviceAllow=/dev/userfaultfd rw\n") in out
    assert "keel stats $(systemctl show -p MainPID --value redis-server.service)" in out
    assert out.index("/etc/sysctl.d/60-keel-mesh.conf") < out.index("keel-allocator.conf")


def test_deploy_mesh_mariadb_and_mysqld_safe(keel_path):
    out = keel("deploy", "keel", "--for", "mariadb", "--mesh", check=True).stdout
    _mesh_machine_part(out)
    # Debian's mariadb.service: User=mysql, PrivateDevices=false
    assert (f'Environment="LD_PRELOAD={keel_path}"\nEnvironment=KEEL_MESH=on\n'
            "SupplementaryGroups=keel-mesh\n#") in out
    assert "\nBindPaths=" not in out and "\nDeviceAllow=" not in out
    # mysqld_safe: no option sets a variable, so the snippet says how it reaches mariadbd
    safe = out[out.index("[mysqld_safe]"):]
    assert f"[mysqld_safe]\nmalloc-lib={keel_path}\n" in safe
    assert "echo 'export KEEL_MESH=on' | sudo tee -a /etc/default/mariadb" in safe
    assert "KEEL_MESH=on mysqld_safe" in safe
    assert "sudo usermod -aG keel-mesh mysql" in safe


def test_deploy_mesh_postgres(keel_path):
    out = keel("deploy", "keel", "--for", "postgres", "15/main", "--mesh", check=True).stdout
    _mesh_machine_part(out)
    assert f"LD_PRELOAD = '{keel_path}'\nKEEL_MESH = 'on'\n" in out
    assert "sudo usermod -aG keel-mesh postgres" in out
    assert "SupplementaryGroups" not in out.replace("a SupplementaryGroups=", "")
    assert "keel stats $(sudo head -1 /var/lib/postgresql/15/main/postmaster.pid)" in out
    assert "forked child never meshes" in out


def test_deploy_mesh_systemd_unit(keel_path):
    # --mesh may come before or after the unit
    out = keel("deploy", "keel", "--for", "systemd", "myapp", "--mesh", check=True).stdout
    assert out == keel("deploy", "keel", "--mesh", "--for", "systemd", "myapp",
                       check=True).stdout
    _mesh_machine_part(out)
    assert (f'Environment="LD_PRELOAD={keel_path}"\nEnvironment=KEEL_MESH=on\n'
            "SupplementaryGroups=keel-mesh\n") in out
    # the unit's PrivateDevices= is not known: explained, not written into the drop-in
    assert "\nBindPaths=" not in out and "add BindPaths=-/dev/userfaultfd" in out
    assert "keel stats $(systemctl show -p MainPID --value myapp.service)" in out


def test_deploy_mesh_one_liners_write_the_lines_shown(keel_path):
    """The 'in one command' lines write exactly the lines printed above them."""
    for target in (["redis"], ["postgres", "15/main"]):
        out = keel("deploy", "keel", "--for", *target, "--mesh", check=True).stdout
        lines = out.splitlines()
        checked = 0
        for i, line in enumerate(lines):
            m = re.match(r"(?:sudo mkdir -p \S+ && )?((?:printf|echo) .*)"
                         r" \| sudo tee (?:-a )?(\S+)$", line)
            if not m:
                continue
            shown = []   # the lines after "<file> with:" / "<file>:" up to the next comment
            j = max(k for k in range(i) if lines[k].startswith("#") and
                    m.group(2) in lines[k])
            for x in lines[j + 1:]:
                if x.startswith("#") or not x:
                    break
                shown.append(x)
            r = subprocess.run(["bash", "-c", m.group(1)], capture_output=True, text=True,
                               check=True)
            assert shown and r.stdout.splitlines() == shown, line
            checked += 1
        assert checked == 3   # the sysctl file, the udev rule, the drop-in or environment file


def test_deploy_mesh_is_for_keel_only(jemalloc_path):
    for name in ("jemalloc", "glibc"):
        r = keel("deploy", name, "--for", "redis", "--mesh")
        assert r.returncode == 2 and "--mesh is a Keel option" in r.stderr and not r.stdout
    r = keel("deploy", "keel+mesh", "--for", "redis")
    assert r.returncode == 2 and "keel deploy keel --for redis --mesh" in r.stderr


def _libc_path() -> str:
    from pathlib import Path
    return os.path.realpath(next(
        line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
        if "/libc.so" in line or "/libc-" in line))


@pytest.fixture
def je_linked_prog(tmp_path, cc):
    """A program linked to libjemalloc (as Debian's redis-server is)."""
    return str(build_jemalloc_linked(cc, tmp_path, "je_linked", "#include <stdlib.h>\nint main(void){"
                                     "void* p = malloc(10); free(p); return 0;}\n"))


def test_deploy_glibc_for_debian_redis_preloads_libc():
    """Debian's redis-server links libjemalloc: with nothing preloaded it runs jemalloc,
    so 'glibc' is LD_PRELOAD=libc.so.6 (as the bench measures it), not 'remove it'."""
    from keel_lab.servers import linked_mallocs
    redis = shutil.which("redis-server")
    if not redis:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    if not linked_mallocs(redis):
        pytest.skip("this redis-server links no other allocator")
    out = keel("deploy", "glibc", "--for", "redis", check=True).stdout
    libc = _libc_path()
    assert f'[Service]\nEnvironment="LD_PRELOAD={libc}"' in out, out
    assert "libjemalloc" in out and "links" in out and "itself" in out
    assert "remove the drop-in" not in out and "rm -f" not in out


def test_deploy_glibc_preloads_libc_for_a_program_linked_to_another_allocator(
        monkeypatch, je_linked_prog):
    from keel_lab import deploy
    monkeypatch.setattr(deploy, "target_program", lambda *a, **kw: je_linked_prog)
    libc = _libc_path()
    out = deploy.snippet("glibc", "systemd", "myapp", BUILD)
    assert f'[Service]\nEnvironment="LD_PRELOAD={libc}"' in out
    assert f"{je_linked_prog} links libjemalloc" in out
    assert "remove the drop-in" not in out
    out = deploy.snippet("glibc", "mariadb", None, BUILD)
    assert f'Environment="LD_PRELOAD={libc}"' in out
    assert f"[mysqld_safe]\nmalloc-lib={libc}" in out
    assert "remove malloc-lib" not in out
    out = deploy.snippet("glibc", "postgres", "15/main", BUILD)
    assert f"LD_PRELOAD = '{libc}'" in out


def test_deploy_glibc_for_a_plain_program_removes_the_preload(monkeypatch, jemalloc_path):
    from keel_lab import deploy
    plain = os.path.realpath(shutil.which("sleep"))
    monkeypatch.setattr(deploy, "target_program", lambda *a, **kw: plain)
    # a library preloaded into keel itself is not taken for the program's own allocator
    monkeypatch.setenv("LD_PRELOAD", jemalloc_path)
    out = deploy.snippet("glibc", "systemd", "myapp", BUILD)
    assert "glibc is what runs when nothing is preloaded: remove the drop-in" in out
    assert "LD_PRELOAD=" not in out
    out = deploy.snippet("glibc", "mariadb", None, BUILD)
    assert "remove malloc-lib from the [mysqld_safe] section" in out
    # the program not found here: today's text too
    monkeypatch.setattr(deploy, "target_program", lambda *a, **kw: None)
    out = deploy.snippet("glibc", "redis", None, BUILD)
    assert "remove the drop-in" in out


def test_deploy_errors(tmp_path):
    r = keel("deploy", str(tmp_path / "libnothere.so"), "--for", "redis")
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = keel("deploy", "glibc", "--for", "systemd")
    assert r.returncode == 2 and "needs the unit name" in r.stderr
    r = keel("deploy", "glibc", "--for", "nginx")
    assert r.returncode == 2


# -- keel options ---------------------------------------------------------------------


def test_options_table_matches_options_c():
    src = SOURCE_DIR / "src" / "core" / "options.c"
    if not src.exists():
        pytest.skip(f"{src} is not here (the lab is installed outside a Keel checkout)")
    text = src.read_text()
    in_c = {"KEEL_" + n.upper() for n in re.findall(r'\{"([a-z0-9_]+)", K_[A-Z]+,', text)}
    assert len(in_c) >= 14, in_c
    assert in_c == {o.env for o in OPTIONS}, (
        "keel_lab/keel_options.py and src/core/options.c disagree: "
        f"only in options.c: {sorted(in_c - {o.env for o in OPTIONS})}, "
        f"only in the lab: {sorted({o.env for o in OPTIONS} - in_c)}")
    # defaults: the C initialiser
    assert ".purge_delay_ms = 1000" in text and ".background_purge = true" in text
    assert ".tcache_bytes = 1u << 20" in text


def test_options_command():
    out = keel("options", check=True).stdout
    for o in OPTIONS:
        assert o.env in out
    import json
    d = json.loads(keel("options", "--json", check=True).stdout)
    assert {x["env"] for x in d} == {o.env for o in OPTIONS}


# -- suites -----------------------------------------------------------------------------


def test_suites_listed():
    out = keel("suites", check=True).stdout
    assert "micro" in out and "threads" in out
    assert "micro" in suites.REGISTRY and "threads" in suites.REGISTRY


def test_registry_survives_broken_suite_modules(monkeypatch):
    import importlib
    real = importlib.import_module

    def fake(name, *a, **kw):
        if name.endswith(".boom"):
            raise RuntimeError("kaboom at import")
        return real(name, *a, **kw)
    monkeypatch.setattr(suites, "MODULES", {**suites.MODULES, "boom": ("boom",),
                                             "ghost_not_written": ("ghost",)})
    monkeypatch.setattr(suites, "REGISTRY", {})
    monkeypatch.setattr(suites, "UNAVAILABLE", {})
    monkeypatch.setattr(suites.importlib, "import_module", fake)
    suites._load()
    assert "micro" in suites.REGISTRY and "threads" in suites.REGISTRY
    assert "kaboom" in suites.UNAVAILABLE["boom"]
    assert "does not exist" in suites.UNAVAILABLE["ghost"]
    with pytest.raises(suites.SuiteError, match="not available"):
        suites.get("boom")
    with pytest.raises(suites.SuiteError, match="unknown suite"):
        suites.get("nonesuch")


def test_allocators_command():
    out = keel("allocators", check=True).stdout
    assert "glibc" in out and "keel" in out


def test_build_dir_default_is_the_checkout():
    if (SOURCE_DIR / "CMakeLists.txt").exists() and (SOURCE_DIR / "build").is_dir() \
            and "KEEL_BUILD_DIR" not in os.environ:
        assert BUILD == SOURCE_DIR / "build"
