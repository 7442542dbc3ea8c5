"""Snippets that make a service run under an allocator (what `keel deploy` prints).

Nothing is changed on the machine: the operator reviews and applies the snippet.
"""
from __future__ import annotations

import glob
import os
import stat
from pathlib import Path
from typing import Optional

from .allocators import AllocatorNotFound, find

TARGETS = ("systemd", "mariadb", "redis", "postgres")
DROPIN_NAME = "keel-allocator.conf"


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
    if problems:
        out.append("# WARNING:")
        out += [f"#   {p}" for p in problems]
        out.append("#   Install the library somewhere system-wide first, e.g.:")
        out.append(f"#     sudo install -m 0644 {path} /usr/local/lib/ && sudo ldconfig")
        out.append(f"#   and deploy that path: keel deploy /usr/local/lib/{os.path.basename(path)} ...")
    return out


def _systemd(unit: str, path: Optional[str], extra_note: list[str] = ()) -> list[str]:
    dropin_dir = f"/etc/systemd/system/{unit}.d"
    dropin = f"{dropin_dir}/{DROPIN_NAME}"
    out = []
    if path is None:
        out.append("# glibc is what runs when nothing is preloaded: remove the drop-in")
        out.append(f"sudo rm -f {dropin}")
    else:
        out.append(f"# 1. create {dropin} with:")
        out.append("[Service]")
        out.append(f'Environment="LD_PRELOAD={path}"')
        out.append("")
        out.append("#    in one command:")
        out.append(f"sudo mkdir -p {dropin_dir} && printf '[Service]\\nEnvironment=\"LD_PRELOAD={path}\"\\n' "
                   f"| sudo tee {dropin}")
        out.append("#    (or: sudo systemctl edit " + unit + ", and paste the two lines)")
    out.append("# 2. reload systemd and restart the service:")
    out.append(f"sudo systemctl daemon-reload && sudo systemctl restart {unit}")
    out.append("# 3. check what it really uses:")
    out.append(f"keel which $(systemctl show -p MainPID --value {unit})")
    out += list(extra_note)
    return out


def pg_clusters() -> list[str]:
    return sorted("/".join(Path(p).parts[-2:]) for p in glob.glob("/etc/postgresql/*/*")
                  if Path(p, "postgresql.conf").exists())


def snippet(name: str, target: str, unit: Optional[str] = None,
            build_dir: Path = Path("build")) -> str:
    if target not in TARGETS:
        raise DeployError(f"unknown target {target!r}: use one of {', '.join(TARGETS)}")
    try:
        alloc = find(name, build_dir)
    except AllocatorNotFound as e:
        raise DeployError(str(e)) from None
    path = alloc.path
    if path is not None:
        path = os.path.abspath(path)
        if not os.path.isfile(path):
            raise DeployError(f"{path} does not exist")
    problems = readable_by_services(path) if path else []
    out = _header(alloc.name, path, problems)

    if target == "systemd":
        if not unit:
            raise DeployError("--for systemd needs the unit name: keel deploy NAME --for "
                              "systemd UNIT (e.g. myservice.service)")
        out += _systemd(unit_name(unit), path)
    elif target == "redis":
        u = unit_name(unit or "redis-server")
        out += _systemd(u, path, [
            "# Redis's INFO memory still shows mem_allocator as the allocator it was built",
            "# with (Debian: jemalloc, linked dynamically), whatever is preloaded: use keel",
            "# which to see the real one. A Redis built from source with its own static",
            "# jemalloc (je_malloc) keeps using it for its data: LD_PRELOAD has no effect there.",
        ])
    elif target == "mariadb":
        u = unit_name(unit or "mariadb")
        out += ["# Debian's mariadb.service starts mariadbd directly, so the systemd drop-in",
                "# is what counts:"]
        out += _systemd(u, path)
        out.append("")
        out.append("# If MariaDB is started through mysqld_safe instead (no systemd, some "
                   "containers),")
        if path is None:
            out.append("# remove malloc-lib from the [mysqld_safe] section.")
        else:
            out.append("# put this in /etc/mysql/mariadb.conf.d/99-keel-allocator.cnf:")
            out.append("[mysqld_safe]")
            out.append(f"malloc-lib={path}")
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
            out.append(f"# 1. add this line to {env_file}:")
            out.append(f"LD_PRELOAD = '{path}'")
            out.append("#    in one command:")
            out.append(f"echo \"LD_PRELOAD = '{path}'\" | sudo tee -a {env_file}")
        out.append("# 2. restart the cluster:")
        out.append(f"sudo systemctl restart {svc}")
        out.append("# 3. check what the postmaster really uses:")
        out.append(f"keel which $(sudo head -1 /var/lib/postgresql/{ver}/{name_}/postmaster.pid)")
        if clusters and cl not in clusters:
            out.append(f"# note: no cluster {cl} here (found: {', '.join(clusters)})")
    return "\n".join(out) + "\n"
