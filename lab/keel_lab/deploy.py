"""Snippets that make a service run under an allocator (what `keel deploy` prints).

Nothing is changed on the machine: the operator reviews and applies the snippet.

With mesh=True (`keel deploy keel --mesh`, Keel only) the snippet also turns meshing on
(KEEL_MESH=on, docs/meshing.md) and prints what the machine needs for it, once and before
the restart: room for kernel mappings (vm.max_map_count, a sysctl.d file) and a write
barrier that holds for the kernel's writes too (a group that may open /dev/userfaultfd,
given by a udev rule; the service joins it through SupplementaryGroups= or, where no
systemd unit starts it, as a member of the group). Without the barrier libkeel warns
once and runs without meshing; without the mappings it meshes within a small budget.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .allocators import AllocatorNotFound, find

TARGETS = ("systemd", "mariadb", "redis", "postgres")
DROPIN_NAME = "keel-allocator.conf"

# Meshing (--mesh): what the machine needs, printed for the operator.
MESH_GROUP = "keel-mesh"
MESH_SYSCTL_FILE = "/etc/sysctl.d/60-keel-mesh.conf"
MESH_MAP_COUNT = 1048576
MESH_SYSCTL = f"vm.max_map_count = {MESH_MAP_COUNT}"
MESH_UDEV_FILE = "/etc/udev/rules.d/60-keel-mesh.rules"
MESH_UDEV_RULE = f'KERNEL=="userfaultfd", GROUP="{MESH_GROUP}", MODE="0660"'


@dataclass(frozen=True)
class ServiceTraits:
    """What meshing needs to know about a service's unit: the user it runs as (None:
    not known, a unit of the operator's) and whether the unit has PrivateDevices=yes
    (a private /dev without /dev/userfaultfd; None: not known)."""
    user: Optional[str] = None
    private_devices: Optional[bool] = None


# Debian's units: redis-server.service runs as redis with PrivateDevices=yes;
# mariadb.service runs as mysql with PrivateDevices=false.
REDIS_TRAITS = ServiceTraits("redis", True)
MARIADB_TRAITS = ServiceTraits("mysql", False)


class DeployError(RuntimeError):
    pass


def unit_name(name: str) -> str:
    """redis-server -> redis-server.service; postgresql@15-main stays a service too."""
    if name.endswith(".service"):
        return name
    if "." in name and name.rsplit(".", 1)[-1] in ("socket", "target", "timer", "mount"):
        raise DeployError(f"{name} is not a service unit: LD_PRELOAD needs the .service that "
                          "runs the program")
    return f"{name}.service"


def readable_by_services(path: str) -> list[str]:
    """Problems that would stop a service user from loading the library."""
    problems = []
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
        if not st.st_mode & stat.S_IROTH:
            problems.append(f"{real} is not world-readable (chmod o+r): services running "
                            "as their own user could not load it")
    except OSError as e:
        problems.append(f"cannot stat {real}: {e}")
    d = Path(real).parent
    while d != d.parent:
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                problems.append(f"directory {d} is not world-searchable (chmod o+x): services "
                                "running as their own user could not reach the library")
                break
        except OSError:
            break
        d = d.parent
    for prefix, why in (("/home/", "ProtectHome="), ("/root/", "ProtectHome="),
                        ("/run/user/", "ProtectHome="), ("/tmp/", "PrivateTmp="),
                        ("/var/tmp/", "PrivateTmp=")):
        if real.startswith(prefix):
            problems.append(f"{real} is under {prefix}, which hardened units hide ({why}; "
                            "Debian's redis-server and mariadb units use it)")
    return problems


def _header(alloc_name: str, path: Optional[str], problems: list[str]) -> list[str]:
    out = []
    if path:
        out.append(f"# allocator: {alloc_name} = {path}")
    if problems and path:
        out.append("# WARNING:")
        out += [f"#   {p}" for p in problems]
        out.append("#   Install the library somewhere system-wide first, e.g.:")
        out.append(f"#     sudo install -m 0644 {path} /usr/local/lib/ && sudo ldconfig")
        out.append(f"#   and deploy that path: keel deploy /usr/local/lib/{os.path.basename(path)} ...")
    return out


def _quote(line: str) -> str:
    """A line as one quoted shell word: in single quotes, or in double quotes when it
    holds a single quote and nothing a double-quoted word would expand."""
    if "'" not in line:
        return f"'{line}'"
    if not any(c in line for c in '"$`\\!'):
        return f'"{line}"'
    return "'" + line.replace("'", "'\"'\"'") + "'"


def _dropin_lines(path: str, mesh: Optional[ServiceTraits]) -> tuple[list[str], list[str]]:
    """The drop-in's lines, and comments that explain the meshing ones."""
    lines = ["[Service]", f'Environment="LD_PRELOAD={path}"']
    if mesh is None:
        return lines, []
    lines.append("Environment=KEEL_MESH=on")
    why = ["#    KEEL_MESH=on turns meshing on."]
    if mesh.user != "root":
        lines.append(f"SupplementaryGroups={MESH_GROUP}")
        if mesh.user:
            why.append(f"#    SupplementaryGroups=: the service runs as {mesh.user}, who may "
                       f"then open")
            why.append("#    /dev/userfaultfd (M2).")
        else:
            why += ["#    SupplementaryGroups=: a service that runs as another user than root",
                    "#    (User=, DynamicUser=) may then open /dev/userfaultfd (M2); a root "
                    "service",
                    "#    needs no group."]
    if mesh.private_devices:
        lines += ["BindPaths=-/dev/userfaultfd", "DeviceAllow=/dev/userfaultfd rw"]
        why += ["#    BindPaths=, DeviceAllow=: Debian's unit has PrivateDevices=yes, whose "
                "private /dev",
                "#    has no userfaultfd: these put it back, and nothing else."]
    elif mesh.private_devices is None:
        why += ["#    If the unit has PrivateDevices=yes (systemctl show -p PrivateDevices "
                "UNIT), its",
                "#    private /dev has no userfaultfd: add BindPaths=-/dev/userfaultfd and",
                "#    DeviceAllow=/dev/userfaultfd rw (only then: on another unit DeviceAllow= "
                "would",
                "#    close every other device)."]
    return lines, why


def _systemd(unit: str, path: Optional[str], extra_note: Sequence[str] = (),
             mesh: Optional[ServiceTraits] = None) -> list[str]:
    dropin_dir = f"/etc/systemd/system/{unit}.d"
    dropin = f"{dropin_dir}/{DROPIN_NAME}"
    out = []
    if path is None:
        out.append("# glibc is what runs when nothing is preloaded: remove the drop-in")
        out.append(f"sudo rm -f {dropin}")
    else:
        lines, why = _dropin_lines(path, mesh)
        out.append(f"# 1. create {dropin} with:")
        out += lines
        out += why
        out.append("")
        out.append("#    in one command:")
        out.append(f"sudo mkdir -p {dropin_dir} && printf '%s\\n' "
                   f"{' '.join(_quote(x) for x in lines)} | sudo tee {dropin}")
        out.append(f"#    (or: sudo systemctl edit {unit}, and paste the "
                   f"{'two' if len(lines) == 2 else len(lines)} lines)")
    out.append("# 2. reload systemd and restart the service:")
    out.append(f"sudo systemctl daemon-reload && sudo systemctl restart {unit}")
    out.append("# 3. check what it really uses:")
    pid = f"$(systemctl show -p MainPID --value {unit})"
    out.append(f"keel which {pid}")
    if mesh is not None and path is not None:
        out += _mesh_check(pid, step="4. ")
    out += list(extra_note)
    return out


def _mesh_machine() -> list[str]:
    """What the machine needs for meshing: printed once, applied before the restart."""
    bar = "# " + "=" * 84
    return [
        bar,
        "# MESHING, on the machine: once, before the service restarts below. Without M2",
        "# libkeel prints one warning (in the service's log) and runs without meshing; without",
        "# M1 it meshes only within Debian's default budget (~11,000 views, ~40 MiB).",
        bar,
        "# M1. Room for kernel mappings: each meshed page view is a mapping, and Keel uses at",
        "#     most a third of vm.max_map_count. The full gain on large heaps needs >= 524288;",
        "#     Debian 12 ships 65530, Fedora, Arch and Ubuntu 24.04 ship 1048576. Skip M1 if",
        "#     `sysctl vm.max_map_count` already shows 1048576 or more (never lower it).",
        f"#     {MESH_SYSCTL_FILE}:",
        MESH_SYSCTL,
        "#     in one command, then load it:",
        f"echo {_quote(MESH_SYSCTL)} | sudo tee {MESH_SYSCTL_FILE}",
        "sudo sysctl --system",
        "#",
        "# M2. A write barrier that holds for the kernel's writes too: userfaultfd through",
        "#     /dev/userfaultfd (Linux 6.1+; root only, 0600, by default). Narrowest grant: a",
        f"#     group ({MESH_GROUP}) that may open it, by a udev rule. Create the group first:",
        "#     a unit naming a group that does not exist fails to start.",
        f"sudo groupadd --system {MESH_GROUP}",
        f"#     {MESH_UDEV_FILE}:",
        MESH_UDEV_RULE,
        "#     in one command, then apply it now (udev applies it at every boot):",
        f"echo {_quote(MESH_UDEV_RULE)} | sudo tee {MESH_UDEV_FILE}",
        "sudo udevadm control --reload && "
        "sudo udevadm trigger --action=add --sysname-match=userfaultfd",
        f"ls -l /dev/userfaultfd    # crw-rw---- 1 root {MESH_GROUP} ...",
        "#     Broader, not advised: the service as root or with CAP_SYS_PTRACE, or",
        "#     vm.unprivileged_userfaultfd = 1 (any process may then use userfaultfd, an",
        "#     exploit aid). KEEL_MESH=user takes a user-mode barrier instead, where a read(2)",
        "#     into a block being meshed can fail with EFAULT: not for databases.",
        bar,
        "",
    ]


def _mesh_check(pid: str, step: str = "") -> list[str]:
    """How to see that meshing works in the restarted service."""
    pad = "#" + " " * (len(step) + 1)
    return [
        f"# {step}check meshing: keel stats shows a 'meshing' section, state on, barrier kernel",
        f"{pad}(as root or the service's user; state refused: see the warning in its log):",
        f"keel stats {pid}",
        f"{pad}VmRSS does not show the gain (it counts a meshed page once per view): the",
        f"{pad}memory held is RssAnon + RssFile + the keel-mesh memfd.",
    ]


def _mysqld_safe_mesh() -> list[str]:
    """KEEL_MESH through mysqld_safe: it has no option that sets a variable, but mariadbd
    inherits its environment."""
    return [
        "# mysqld_safe has no option that sets a variable, but mariadbd inherits its",
        "# environment: KEEL_MESH=on must be in mysqld_safe's. Debian's /etc/init.d/mariadb",
        "# reads /etc/default/mariadb:",
        "echo 'export KEEL_MESH=on' | sudo tee -a /etc/default/mariadb",
        "# elsewhere: KEEL_MESH=on mysqld_safe ... (a container: ENV KEEL_MESH=on, or",
        "# docker run -e KEEL_MESH=on). mariadbd switches to its user (mysql) with that",
        "# user's groups, so the user joins the group (M2):",
        f"sudo usermod -aG {MESH_GROUP} mysql",
        "# In a container, vm.max_map_count is the host's (M1 on the host) and",
        "# /dev/userfaultfd must be passed in (docker run --device /dev/userfaultfd), owned",
        "# by a group mariadbd's user is in there. Check: keel stats $(pidof mariadbd).",
    ]


def unit_program(unit: str) -> Optional[str]:
    """The program a systemd unit's ExecStart= runs (systemctl show), None if unknown
    (no such unit, or no systemd here)."""
    try:
        r = subprocess.run(["systemctl", "show", "-p", "ExecStart", "--value", unit],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"\bpath=(\S+)", r.stdout) if r.returncode == 0 else None
    return m.group(1) if m and os.path.isfile(m.group(1)) else None


def target_program(target: str, unit: Optional[str] = None,
                   pg_version: Optional[str] = None) -> Optional[str]:
    """The server program the snippet is for, on this machine: the unit's ExecStart=,
    else where Debian installs it; None if it is not found here."""
    if target in ("systemd", "redis", "mariadb") and unit:
        prog = unit_program(unit)
        if prog:
            return prog
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/local/bin",
                            "/usr/sbin", "/usr/bin"])
    names = {"redis": ["redis-server"], "mariadb": ["mariadbd", "mysqld"]}.get(target, [])
    for n in names:
        found = shutil.which(n, path=path)
        if found:
            return found
    if target == "postgres" and pg_version:
        cand = f"/usr/lib/postgresql/{pg_version}/bin/postgres"
        if os.path.isfile(cand):
            return cand
    return None


def own_allocators(program: str) -> tuple[list[str], Optional[str]]:
    """(other allocators the program links itself, its libc.so.6) from ldd, through
    servers.linked_mallocs and linked_libc, with LD_PRELOAD out of ldd's environment (a
    library preloaded into keel would otherwise show up as the program's own)."""
    from .servers import linked_libc, linked_mallocs
    saved = os.environ.pop("LD_PRELOAD", None)
    try:
        own = linked_mallocs(program)
        return own, (linked_libc(program) if own else None)
    finally:
        if saved is not None:
            os.environ["LD_PRELOAD"] = saved


def glibc_preload(program: Optional[str]) -> tuple[Optional[str], list[str]]:
    """For 'glibc': (the libc to preload, why) when the program links another allocator
    itself (Debian's redis-server: libjemalloc), which would otherwise serve malloc
    with nothing preloaded; (None, []) when nothing needs preloading. The same rule as
    the bench's (servers.Server._choose_preload)."""
    if not program:
        return None, []
    own, libc = own_allocators(program)
    if not own:
        return None, []
    if not libc:
        return None, [f"# WARNING: {program} links {', '.join(own)} itself, and its C library "
                      "was not found (ldd): with nothing preloaded it runs on that allocator, "
                      "not glibc"]
    return libc, [
        f"# {program} links {', '.join(own)} itself: with nothing preloaded that",
        "# allocator serves malloc, not glibc. Preloading the C library puts glibc's malloc",
        "# first in the lookup order (what keel bench measures as 'glibc').",
    ]


def pg_clusters() -> list[str]:
    return sorted("/".join(Path(p).parts[-2:]) for p in glob.glob("/etc/postgresql/*/*")
                  if Path(p, "postgresql.conf").exists())


def snippet(name: str, target: str, unit: Optional[str] = None,
            build_dir: Path = Path("build"), mesh: bool = False) -> str:
    """What makes the service run under the allocator; mesh: with KEEL_MESH=on (Keel
    only) and the machine settings meshing needs."""
    if target not in TARGETS:
        raise DeployError(f"unknown target {target!r}: use one of {', '.join(TARGETS)}")
    try:
        alloc = find(name, build_dir)
    except AllocatorNotFound as e:
        if name.endswith("+mesh"):
            raise DeployError(f"{e}; for meshing: keel deploy {name.removesuffix('+mesh')} "
                              f"--for {target} --mesh") from None
        raise DeployError(str(e)) from None
    if mesh and not alloc.is_keel:
        raise DeployError(f"--mesh is a Keel option (KEEL_MESH=on), and {alloc.name} is not "
                          "Keel")
    path = alloc.path
    if path is not None:
        path = os.path.abspath(path)
        if not os.path.isfile(path):
            raise DeployError(f"{path} does not exist")
    why_libc: list[str] = []
    if path is None:
        # glibc: nothing to preload, unless the program brings its own allocator
        pg_ver = None
        if target == "postgres":
            pg_ver = (unit or (pg_clusters() or ["15/main"])[0]).replace("-", "/", 1)
            pg_ver = pg_ver.removeprefix("postgresql@").split("/", 1)[0]
        u = unit or {"redis": "redis-server", "mariadb": "mariadb"}.get(target)
        u = unit_name(u) if u and target != "postgres" else None
        path, why_libc = glibc_preload(target_program(target, u, pg_ver))
    problems = readable_by_services(path) if path else []
    out = _header(alloc.name, path, problems)
    out += why_libc
    if mesh:
        out.append("# meshing: KEEL_MESH=on (docs/meshing.md) gives back memory that deletes "
                   "left scattered")
        out += [""] + _mesh_machine()

    if target == "systemd":
        if not unit:
            raise DeployError("--for systemd needs the unit name: keel deploy NAME --for "
                              "systemd UNIT (e.g. myservice.service)")
        out += _systemd(unit_name(unit), path, mesh=ServiceTraits() if mesh else None)
    elif target == "redis":
        u = unit_name(unit or "redis-server")
        out += _systemd(u, path, [
            "# Redis's INFO memory still shows mem_allocator as the allocator it was built",
            "# with (Debian: jemalloc, linked dynamically), whatever is preloaded: use keel",
            "# which to see the real one. A Redis built from source with its own static",
            "# jemalloc (je_malloc) keeps using it for its data: LD_PRELOAD has no effect there.",
        ], mesh=REDIS_TRAITS if mesh else None)
    elif target == "mariadb":
        u = unit_name(unit or "mariadb")
        out += ["# Debian's mariadb.service starts mariadbd directly, so the systemd drop-in",
                "# is what counts:"]
        out += _systemd(u, path, mesh=MARIADB_TRAITS if mesh else None)
        if mesh:
            out.append("# note: meshing makes no new view while the process has locked "
                       "memory")
            out.append("# (VmLck > 0: MariaDB's memlock option).")
        out.append("")
        out.append("# If MariaDB is started through mysqld_safe instead (no systemd, some "
                   "containers),")
        if path is None:
            out.append("# remove malloc-lib from the [mysqld_safe] section.")
        else:
            out.append("# put this in /etc/mysql/mariadb.conf.d/99-keel-allocator.cnf:")
            out.append("[mysqld_safe]")
            out.append(f"malloc-lib={path}")
            if mesh:
                out += _mysqld_safe_mesh()
    elif target == "postgres":
        clusters = pg_clusters()
        cl = (unit or (clusters[0] if clusters else "15/main")).replace("-", "/", 1)
        cl = cl.removeprefix("postgresql@").removesuffix(".service")
        if "/" not in cl:
            raise DeployError(f"postgres: give the cluster as VERSION/NAME (e.g. 15/main), "
                              f"not {unit!r}" + (f"; clusters here: {', '.join(clusters)}"
                                                 if clusters else ""))
        ver, name_ = cl.split("/", 1)
        env_file = f"/etc/postgresql/{ver}/{name_}/environment"
        svc = f"postgresql@{ver}-{name_}.service"
        out.append("# Debian starts PostgreSQL through pg_ctlcluster, which empties the "
                   "environment")
        out.append("# except for the cluster's 'environment' file: a systemd Environment= "
                   "never")
        out.append("# reaches postgres. Set LD_PRELOAD in that file instead.")
        if path is None:
            out.append(f"# 1. remove the LD_PRELOAD line from {env_file}")
        else:
            lines = [f"LD_PRELOAD = '{path}'"] + (["KEEL_MESH = 'on'"] if mesh else [])
            out.append(f"# 1. add {'these lines' if mesh else 'this line'} to {env_file}:")
            out += lines
            out.append("#    in one command:")
            words = " ".join(_quote(x) for x in lines)
            out.append(f"echo {words} | sudo tee -a {env_file}" if len(lines) == 1 else
                       f"printf '%s\\n' {words} | sudo tee -a {env_file}")
            if mesh:
                out.append("#    and let the cluster's owner (postgres) open "
                           "/dev/userfaultfd (M2): pg_ctlcluster")
                out.append("#    starts postgres as the owner with the owner's groups, "
                           "so a SupplementaryGroups=")
                out.append("#    would not reach it; the owner joins the group:")
                out.append(f"sudo usermod -aG {MESH_GROUP} postgres")
        out.append("# 2. restart the cluster:")
        out.append(f"sudo systemctl restart {svc}")
        out.append("# 3. check what the postmaster really uses:")
        pid = f"$(sudo head -1 /var/lib/postgresql/{ver}/{name_}/postmaster.pid)"
        out.append(f"keel which {pid}")
        if mesh and path is not None:
            out += _mesh_check(pid, step="4. ")
            out.append("# note: PostgreSQL serves each connection in a backend forked from "
                       "the postmaster, and a")
            out.append("# forked child never meshes (docs/meshing.md, section 0): only the "
                       "postmaster's own heap")
            out.append("# is meshed, so expect little from meshing here.")
        if clusters and cl not in clusters:
            out.append(f"# note: no cluster {cl} here (found: {', '.join(clusters)})")
    return "\n".join(out) + "\n"
