"""Starting and stopping real servers (redis-server, mariadbd, postgres, searchd) under
an allocator, for the lab's suites.

Every server here:
  * runs with the allocator's environment (LD_PRELOAD) plus extra variables;
  * listens on 127.0.0.1 only, on a free port (or the one asked for; a port in use is
    a SuiteError that says so);
  * keeps its files (data, socket, log) in a throw-away directory;
  * is the real server process (Server.pid is mariadbd's / the postmaster's own pid,
    never a wrapper's: wrappers exec, setuid is done by subprocess itself);
  * is checked for the preloaded library in /proc/PID/maps once it answers;
  * can be polled for "died mid-run" (check_alive raises SuiteError with its log tail);
  * stops with stop(): its stop signal, SIGKILL after a timeout, leftover children
    too; idempotent, safe in finally blocks; also a context manager. A stop that is
    interrupted (a second Ctrl-C) still kills the server and its children by pid, and
    the directory is removed only once they are confirmed gone.
A module-level registry (live_servers) holds every started, not yet stopped server; an
atexit hook stops whatever is left, and each server gets PR_SET_PDEATHSIG so it does
not outlive a lab process that was SIGKILLed.

Also here: which (a program, or the package to install), free_port, log_tail, and
run_client (runs a load generator while watching the servers, so a server crash stops
the run at once).

Elsewhere: the protocol clients (Redis, MySQL/SphinxQL) are in keel_lab.clients, the
/proc readers in keel_lab.procfs, the RSS sampler in keel_lab.measure, and the
preexec_fn helpers and process killers in keel_lab.procs.
"""
from __future__ import annotations

import atexit
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Optional
from collections.abc import Callable, Sequence

from . import procs
from .allocators import Allocator
from .clients import MySQLMini, RedisClient
from .errors import SuiteError
from .measure import RssSampler
from .procfs import descendants, pid_running, rss_kib, tree_kib

LOG_TAIL_LINES = 40

# --------------------------------------------------------------------------------------
# small helpers


def which(binary: str, package: str, extra_dirs: Sequence[str] = ()) -> str:
    """Full path of a program, or SuiteError telling which package installs it."""
    if "/" in binary:
        if os.access(binary, os.X_OK):
            return binary
    else:
        path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin:/bin"
        for d in list(extra_dirs) + path.split(":"):
            if d and os.access(os.path.join(d, binary), os.X_OK):
                return os.path.join(d, binary)
    raise SuiteError(f"{os.path.basename(binary)} not found: install it with "
                     f"sudo apt-get install {package}")


def pg_bindir() -> Optional[str]:
    """Newest /usr/lib/postgresql/*/bin (or $PG_BINDIR)."""
    if os.environ.get("PG_BINDIR"):
        return os.environ["PG_BINDIR"]
    cands = []
    for p in Path("/usr/lib/postgresql").glob("*/bin"):
        try:
            cands.append((int(p.parent.name), str(p)))
        except ValueError:
            pass
    return max(cands)[1] if cands else None


def port_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port(port: Optional[int] = None) -> int:
    """The requested port if it is free on 127.0.0.1 (SuiteError if not), else any free one."""
    if port:
        if not port_free(port):
            raise SuiteError(f"port {port} on 127.0.0.1 is in use (another server is "
                             f"listening there): pick another port or stop that server")
        return port
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def log_tail(path: Optional[Path], n: int = LOG_TAIL_LINES) -> str:
    if not path:
        return ""
    try:
        data = Path(path).read_bytes()[-65536:].decode("utf-8", "replace").replace("\r", "\n")
    except OSError:
        return f"(no log at {path})"
    lines = [line for line in data.splitlines() if line.strip()][-n:]
    if not lines:
        return f"({path} is empty)"
    return f"last {len(lines)} lines of {path}:\n" + "\n".join("  " + line for line in lines)


def describe_status(rc: Optional[int]) -> str:
    if rc is None:
        return "unknown exit status"
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def linked_libc(binary: str) -> Optional[str]:
    """The libc.so.6 a program loads (from ldd), None if unknown."""
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"libc\.so\.6 => (\S+)", out)
    return os.path.realpath(m.group(1)) if m else None


def linked_mallocs(binary: str) -> list[str]:
    """Other allocators a program links itself (Debian's redis-server: libjemalloc)."""
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return sorted(set(re.findall(r"(lib(?:jemalloc|tcmalloc\w*|mimalloc)[\w.-]*\.so[\w.]*)", out)))


# --------------------------------------------------------------------------------------
# servers

_live: dict[int, Server] = {}
_live_lock = threading.Lock()


def live_servers() -> list[Server]:
    """Servers started and not yet stopped (by any suite in this process)."""
    with _live_lock:
        return list(_live.values())


def stop_all() -> None:
    for s in live_servers():
        try:
            s.stop(timeout=10)
        except Exception:
            pass


atexit.register(stop_all)


class Server:
    """Base class. Subclasses set name/binary/package and implement _prepare, _argv,
    _ready."""

    name = "server"
    binary = ""
    package = ""
    stop_signal = signal.SIGTERM
    run_as: Optional[str] = None       # user to run the server as (postgres as root)

    def __init__(self, allocator: Optional[Allocator] = None, *, workdir: Optional[Path] = None,
                 port: Optional[int] = None, extra_env: Optional[dict] = None,
                 startup_timeout: float = 60.0, stop_timeout: float = 30.0,
                 preexec: Optional[Callable[[], None]] = None, args: Sequence[str] = (),
                 verify_preload: bool = True, wrapper: Sequence[str] = ()):
        self.allocator = allocator or Allocator("glibc", None)
        self.requested_port = port
        self.port = 0
        self.extra_env = dict(extra_env or {})
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.preexec = preexec
        self.extra_args = list(args)
        # a program the server runs under (valgrind ...): it must exec the server in the
        # same process, so that pid, maps and the stop signal are still the server's
        self.wrapper = list(wrapper)
        self.verify_preload = verify_preload
        self._own_dir = workdir is None
        self._given_dir = Path(workdir) if workdir else None
        self.dir: Optional[Path] = None
        self.log_path: Optional[Path] = None
        self.popen: Optional[subprocess.Popen] = None
        self.pid: Optional[int] = None
        self.returncode: Optional[int] = None
        self.preload: Optional[str] = None        # what LD_PRELOAD holds
        self.notes: list[str] = []
        self._stopped = False
        self._kids: list[int] = []      # the server's descendants, as stop() saw them
        self._log_fh: Optional[IO[bytes]] = None

    # start() makes the directory and starts the process: what the subclasses' _prepare,
    # _argv and _ready and the suites use once it has, with a clear error before.
    @property
    def run_dir(self) -> Path:
        """The directory of this run (made by start())."""
        if self.dir is None:
            raise RuntimeError(f"{self.name} has no directory: start() it first")
        return self.dir

    @property
    def run_pid(self) -> int:
        """The server's process ID (once start() has started it)."""
        if self.pid is None:
            raise RuntimeError(f"{self.name} has no process: start() it first")
        return self.pid

    # -- to override ---------------------------------------------------------------
    def _prepare(self) -> None:
        """Create data directories etc. (before the server starts)."""

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _server_env_base(self) -> Optional[dict]:
        return None  # os.environ

    def binary_path(self) -> str:
        """The server program (SuiteError naming the package if it is missing)."""
        return which(self.binary, self.package)

    # -- lifecycle -------------------------------------------------------------------
    def _make_dir(self) -> Path:
        if self._own_dir:
            d = Path(tempfile.mkdtemp(prefix=f"keel-{self.name}-"))
        else:
            d = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=self._given_dir))
        return d

    def _choose_preload(self, binary: str) -> Optional[str]:
        if self.allocator.path:
            return self.allocator.path
        # glibc asked for, but the program brings its own allocator (Debian's redis links
        # libjemalloc): preloading libc.so.6 puts glibc's malloc first in the lookup order.
        own = linked_mallocs(binary)
        if own:
            libc = linked_libc(binary)
            if libc:
                self.notes.append(f"{self.name} links {', '.join(own)} itself: 'glibc' means "
                                  f"LD_PRELOAD={libc}, which makes malloc/free resolve to glibc")
                return libc
        return None

    def env(self) -> dict:
        env = self.allocator.env(self._server_env_base())
        env.pop("LD_PRELOAD", None)
        if self.preload:
            env["LD_PRELOAD"] = self.preload
        env.update(self.extra_env)
        return env

    def _preexec(self) -> None:
        procs.pdeathsig()
        if self.preexec is not None:
            self.preexec()

    def start(self) -> Server:
        if self.popen is not None:
            raise RuntimeError(f"{self.name} already started")
        binary = self.binary_path()
        self.port = free_port(self.requested_port)
        self.dir = self._make_dir()
        self.log_path = self.run_dir / f"{self.name}.log"
        try:
            self.preload = self._choose_preload(binary)
            self._prepare()
            argv = [*self.wrapper, *self._argv()]
            self._log_fh = open(self.log_path, "ab")
            kw: dict = {}
            if self.run_as:
                pw = pwd.getpwnam(self.run_as)
                kw = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
            self.popen = subprocess.Popen(
                argv, env=self.env(), stdin=subprocess.DEVNULL, stdout=self._log_fh,
                stderr=subprocess.STDOUT, cwd=str(self.dir), start_new_session=True,
                preexec_fn=self._preexec, **kw)
            self.pid = self.popen.pid
            with _live_lock:
                _live[self.pid] = self
            self._wait_ready()
            self._check_preload()
        except BaseException:
            self.stop(timeout=10)
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if not self.alive():
                raise SuiteError(self.died_message("start-up"))
            try:
                if self._ready():
                    return
            except (OSError, SuiteError, subprocess.SubprocessError):
                pass
            if time.monotonic() > deadline:
                raise SuiteError(f"{self.name} (pid {self.pid}) not ready after "
                                 f"{self.startup_timeout:.0f}s\n{log_tail(self.log_path)}")
            time.sleep(0.2)

    def _check_preload(self) -> None:
        if not (self.verify_preload and self.allocator.path):
            return
        lib = os.path.realpath(self.preload or self.allocator.path)
        try:
            maps = Path(f"/proc/{self.pid}/maps").read_text()
        except OSError as e:
            raise SuiteError(f"cannot read /proc/{self.pid}/maps of {self.name}: {e}") from None
        if lib not in maps:
            libs = sorted({line.split()[-1] for line in maps.splitlines()
                           if ".so" in line.split()[-1]})
            raise SuiteError(
                f"the allocator did not load: /proc/{self.pid}/maps of {self.name} does not "
                f"contain {lib} (LD_PRELOAD={self.preload}). Mapped libraries: "
                f"{', '.join(os.path.basename(x) for x in libs)}\n{log_tail(self.log_path)}")

    def alive(self) -> bool:
        if self.popen is None:
            return False
        rc = self.popen.poll()
        if rc is not None:
            self.returncode = rc
            return False
        return True

    def check_alive(self, during: str = "the run") -> None:
        """SuiteError with the log tail if the server is gone."""
        if self._stopped:
            raise SuiteError(f"{self.name} was already stopped before {during}")
        if not self.alive():
            raise SuiteError(self.died_message(during))

    def died_message(self, during: str = "the run") -> str:
        return (f"{self.name} (pid {self.pid}) died during {during}, "
                f"{describe_status(self.returncode)}\n{log_tail(self.log_path)}")

    def rss_kib(self) -> Optional[int]:
        """VmRSS of the server process (None before start() or once it is gone)."""
        return rss_kib(self.pid) if self.pid else None

    def tree_rss_kib(self, field: str = "VmRSS") -> Optional[int]:
        """`field` of /proc/PID/status summed over the server and its descendants."""
        return tree_kib(self.pid, field) if self.pid else None

    def sampler(self, interval: float = 0.2, children: bool = False,
                field: str = "VmRSS") -> RssSampler:
        """An RssSampler of the server (children=True: with its descendants)."""
        return RssSampler(self.run_pid, interval=interval, children=children, field=field)

    def stop(self, timeout: Optional[float] = None) -> Optional[int]:
        """Stop signal, then SIGKILL after `timeout`; then leftover descendants.
        Idempotent. Returns the exit status (negative: killed by that signal).

        Interrupted part-way (a second Ctrl-C while it waits for the server to exit) or
        failing, it still kills the server and the children it saw, by pid, then raises
        that exception again. The directory is removed only once the server has exited
        and those children are gone: if that cannot be confirmed, the directory is kept,
        the server stays in live_servers() (the atexit hook stops it again) and stop()
        raises (SuiteError naming what still runs, if nothing else was raised)."""
        if self._stopped:
            return self.returncode
        timeout = self.stop_timeout if timeout is None else timeout
        pending: Optional[BaseException] = None
        try:
            self._terminate(timeout)
        except BaseException as e:  # noqa: BLE001 -- KeyboardInterrupt too: kill, then re-raise
            pending = e
            try:
                self._kill_now()
            except BaseException:  # noqa: BLE001 -- another Ctrl-C: the check below decides
                pass
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        running = self._still_running()
        if running:
            if pending is None:
                pending = SuiteError(
                    f"{self.name} (pid {self.pid}) did not stop: still running: "
                    f"{', '.join(map(str, running))}" + (f"; its directory {self.dir} is kept"
                                                         if self._own_dir and self.dir else ""))
            raise pending
        self._stopped = True
        if self.popen is not None:
            self.returncode = self.popen.returncode
        with _live_lock:
            if self.pid is not None:
                _live.pop(self.pid, None)
        try:
            self._cleanup()
        finally:
            if self._own_dir and self.dir is not None:
                shutil.rmtree(self.dir, ignore_errors=True)
        if pending is not None:
            raise pending
        return self.returncode

    def _terminate(self, timeout: float) -> None:
        """stop()'s orderly part: the stop signal, SIGKILL after `timeout`, then the
        children seen under the server (postgres' backends) ended by pid."""
        if self.popen is None:
            return
        self._note_children()
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(self.stop_signal)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self._note_children()
                try:
                    self.popen.kill()
                except ProcessLookupError:
                    pass
                self.popen.wait(30)
        procs.kill_pids(self._kids)

    def _kill_now(self) -> None:
        """stop()'s way out when interrupted: SIGKILL to the server and to the children
        seen under it, by pid, and a short wait for them to go."""
        if self.popen is None:
            return
        self._note_children()
        try:
            self.popen.kill()
        except ProcessLookupError:
            pass
        procs.kill_pids(self._kids, signals=(signal.SIGKILL,), wait=2.0)
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass

    def _note_children(self) -> None:
        """Adds the server's current descendants to those stop() ends (while it runs)."""
        if self.popen is not None and self.popen.poll() is None:
            self._kids += [k for k in descendants(self.popen.pid) if k not in self._kids]

    def _still_running(self) -> list[int]:
        """The server's pid and its children's that stop() has not seen go."""
        if self.popen is None:
            return []
        left = [] if self.popen.poll() is not None else [self.popen.pid]
        return left + [k for k in self._kids if pid_running(k)]

    def _cleanup(self) -> None:
        """Subclass hook, after the process is gone and before the dir is removed."""

    def __enter__(self) -> Server:
        if self.popen is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} pid={self.pid} port={self.port} alloc={self.allocator.name}>"


# ---- Redis ---------------------------------------------------------------------------


class RedisServer(Server):
    name = "redis-server"
    binary = "redis-server"
    package = "redis-server"

    def _argv(self) -> list[str]:
        data = self.run_dir / "data"
        data.mkdir(exist_ok=True)
        return [self.binary_path(), "--bind", "127.0.0.1", "--port", str(self.port),
                "--protected-mode", "yes", "--save", "", "--appendonly", "no",
                "--dir", str(data), "--daemonize", "no", "--supervised", "no",
                "--logfile", "", "--loglevel", "notice", *self.extra_args]

    def _ready(self) -> bool:
        with RedisClient(self.port, timeout=2) as c:
            return c.command("PING") == "PONG"

    def client(self, timeout: float = 60.0) -> RedisClient:
        return RedisClient(self.port, timeout=timeout)


def _sql_client(argv: list, what: str, query: str, timeout: float) -> str:
    """Runs a command-line SQL client once; its output, or SuiteError with its stderr."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SuiteError(f"{what}: {query[:80]!r} failed: {r.stderr.strip()}")
    return r.stdout.strip()


# ---- MariaDB -------------------------------------------------------------------------


class MariaDBServer(Server):
    name = "mariadbd"
    binary = "mariadbd"
    package = "mariadb-server"

    def __init__(self, *a, buffer_pool: str = "128M", max_connections: int = 300, **kw):
        kw.setdefault("startup_timeout", 120.0)
        super().__init__(*a, **kw)
        self.buffer_pool = buffer_pool
        self.max_connections = max_connections

    @property
    def socket_path(self) -> str:
        return str(self.run_dir / "mariadb.sock")

    def _user_opt(self) -> list[str]:
        return ["--user=root"] if os.geteuid() == 0 else []

    def _prepare(self) -> None:
        install = which("mariadb-install-db", "mariadb-server")
        which("mariadb", "mariadb-client")
        data = self.run_dir / "data"
        log = self.run_dir / "install-db.log"
        with open(log, "wb") as fh:
            try:
                rc = procs.run_group(
                    [install, "--no-defaults", *self._user_opt(), f"--datadir={data}",
                     "--auth-root-authentication-method=normal", "--skip-test-db",
                     f"--innodb-buffer-pool-size={self.buffer_pool}", "--innodb-log-file-size=64M"],
                    timeout=180, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                    cwd=str(self.dir), preexec_fn=procs.pdeathsig)
            except subprocess.TimeoutExpired:
                raise SuiteError(f"mariadb-install-db timed out after 180s\n{log_tail(log)}") from None
        if rc != 0:
            raise SuiteError(f"mariadb-install-db failed ({describe_status(rc)})\n{log_tail(log)}")

    def _argv(self) -> list[str]:
        d = self.run_dir
        return [self.binary_path(), "--no-defaults", *self._user_opt(),
                f"--datadir={d / 'data'}", f"--tmpdir={d}", f"--socket={self.socket_path}",
                f"--port={self.port}", "--bind-address=127.0.0.1", f"--pid-file={d / 'mariadbd.pid'}",
                "--skip-name-resolve", f"--innodb-buffer-pool-size={self.buffer_pool}",
                "--innodb-log-file-size=64M", "--innodb-flush-log-at-trx-commit=0",
                "--innodb-doublewrite=0", "--skip-log-bin",
                f"--max-connections={self.max_connections}", "--performance-schema=OFF",
                *self.extra_args]

    def sql(self, query: str, timeout: float = 60.0) -> str:
        return _sql_client([which("mariadb", "mariadb-client"), "--no-defaults", "--protocol=socket",
                            "-S", self.socket_path, "-u", "root", "-N", "-B", "-e", query],
                           "mariadb client", query, timeout)

    def _ready(self) -> bool:
        return self.sql("SELECT 1", timeout=10) == "1"


# ---- PostgreSQL ----------------------------------------------------------------------


class PostgresServer(Server):
    """initdb + postgres. As root, runs as the `postgres` user (initdb refuses root); the
    pid is the postmaster's. RSS of the server = the postmaster and its backends
    (tree_rss_kib). Stops with SIGINT (fast shutdown: clients are disconnected)."""

    name = "postgres"
    binary = "postgres"
    package = "postgresql"
    stop_signal = signal.SIGINT

    def __init__(self, *a, shared_buffers: str = "128MB", max_connections: int = 100,
                 settings: Optional[dict] = None, **kw):
        kw.setdefault("startup_timeout", 90.0)
        super().__init__(*a, **kw)
        self.shared_buffers = shared_buffers
        self.max_connections = max_connections
        self.settings = dict(settings or {})
        self.bindir = pg_bindir()
        if os.geteuid() == 0:
            self.run_as = "postgres"
        self.dbuser = self.run_as or pwd.getpwuid(os.geteuid()).pw_name

    def _make_dir(self) -> Path:
        # The server user must reach the directory: our own dir in the system tmp
        # (a given workdir may be 0700 root), always removed on stop.
        self._own_dir = True
        d = Path(tempfile.mkdtemp(prefix="keel-postgres-"))
        os.chmod(d, 0o755)
        return d

    def _pg(self, prog: str) -> str:
        if not self.bindir:
            raise SuiteError("postgres not found: install it with sudo apt-get install postgresql")
        return which(os.path.join(self.bindir, prog), "postgresql")

    def _server_env_base(self) -> Optional[dict]:
        if self.run_as:
            return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(self.dir)}
        return None

    def binary_path(self) -> str:
        return self._pg("postgres")

    def _prepare(self) -> None:
        initdb = self._pg("initdb")
        self._pg("psql")
        kw: dict = {}
        if self.run_as:
            try:
                pw = pwd.getpwnam(self.run_as)
            except KeyError:
                raise SuiteError("running as root, but there is no 'postgres' user to run the "
                                 "server as (sudo apt-get install postgresql creates it)") from None
            kw = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
            for p in (self.run_dir, *self.run_dir.rglob("*")):
                os.chown(p, pw.pw_uid, pw.pw_gid)
            if self.preload and subprocess.run(["test", "-r", self.preload], **kw).returncode != 0:
                libdir = self.run_dir / "lib"
                libdir.mkdir()
                shutil.copy2(self.preload, libdir)
                self.preload = str(libdir / os.path.basename(self.preload))
                os.chmod(libdir, 0o755)
                os.chmod(self.preload, 0o644)
                self.notes.append(f"user {self.run_as} cannot read the allocator library: "
                                  f"using a copy, {self.preload}")
        self.sockdir = self.run_dir / "sock"
        self.sockdir.mkdir()
        if self.run_as:
            os.chown(self.sockdir, kw["user"], kw["group"])
        log = self.run_dir / "initdb.log"
        base = self._server_env_base()
        env = dict(os.environ if base is None else base)
        env.pop("LD_PRELOAD", None)
        with open(log, "wb") as fh:
            try:
                rc = procs.run_group([initdb, "-D", str(self.run_dir / "data"), "-U", self.dbuser, "-A",
                                      "trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"],
                                     timeout=180, env=env, stdin=subprocess.DEVNULL, stdout=fh,
                                     stderr=subprocess.STDOUT, cwd=str(self.dir),
                                     preexec_fn=procs.pdeathsig, **kw)
            except subprocess.TimeoutExpired:
                raise SuiteError(f"initdb timed out after 180s\n{log_tail(log)}") from None
        if rc != 0:
            raise SuiteError(f"initdb failed ({describe_status(rc)})\n{log_tail(log)}")

    def _argv(self) -> list[str]:
        settings = {"listen_addresses": "127.0.0.1", "shared_buffers": self.shared_buffers,
                    "max_connections": str(self.max_connections), "fsync": "off",
                    "synchronous_commit": "off", "full_page_writes": "off",
                    "logging_collector": "off", "log_min_messages": "warning",
                    "work_mem": "8MB", "maintenance_work_mem": "64MB"}
        settings.update(self.settings)
        argv = [self.binary_path(), "-D", str(self.run_dir / "data"), "-k", str(self.sockdir),
                "-p", str(self.port)]
        for k, v in settings.items():
            argv += ["-c", f"{k}={v}"]
        return argv + self.extra_args

    def psql(self, query: str, db: str = "postgres", timeout: float = 120.0) -> str:
        return _sql_client([self._pg("psql"), "-X", "-q", "-h", "127.0.0.1", "-p", str(self.port),
                            "-U", self.dbuser, "-d", db, "-At", "-v", "ON_ERROR_STOP=1", "-c", query],
                           "psql", query, timeout)

    def _ready(self) -> bool:
        return self.psql("SELECT 1", timeout=10) == "1"


# ---- Sphinx searchd ------------------------------------------------------------------


class SphinxServer(Server):
    """Sphinx searchd (Debian's sphinxsearch 2.2) in the foreground (--nodetach, watchdog
    off, so the pid is searchd's own), SphinxQL on 127.0.0.1:port. The caller gives the
    index section(s) of the config and where the index files are."""

    name = "searchd"
    binary = "searchd"
    package = "sphinxsearch"

    def __init__(self, *a, index_conf: str = "", ready_query: str = "SHOW STATUS", **kw):
        super().__init__(*a, **kw)
        self.index_conf = index_conf
        self.ready_query = ready_query      # e.g. a query on the index: ready = index loaded

    def _prepare(self) -> None:
        d = self.run_dir
        self.conf_path = d / "sphinx.conf"
        self.conf_path.write_text(f"""{self.index_conf}
searchd
{{
    listen = 127.0.0.1:{self.port}:mysql41
    log = {d / 'searchd-own.log'}
    query_log = {d / 'query.log'}
    pid_file = {d / 'searchd.pid'}
    binlog_path =
    workers = threads
    watchdog = 0
    read_timeout = 30
    client_timeout = 60
    max_children = 0
    seamless_rotate = 0
    preopen_indexes = 1
    unlink_old = 1
}}
""")

    def _argv(self) -> list[str]:
        return [self.binary_path(), "--config", str(self.conf_path), "--nodetach",
                *self.extra_args]

    def _ready(self) -> bool:
        with MySQLMini(self.port, timeout=5) as c:
            c.query(self.ready_query)
        return True

    def log_text(self) -> str:
        out = ""
        for p in (self.log_path, self.run_dir / "searchd-own.log"):
            if p is None:
                continue
            try:
                out += p.read_text(errors="replace")
            except OSError:
                pass
        return out

    def died_message(self, during: str = "the run") -> str:
        own = log_tail(self.run_dir / "searchd-own.log") if self.dir else ""
        return super().died_message(during) + ("\n" + own if own else "")


# --------------------------------------------------------------------------------------
# load generators


def run_client(argv: Sequence[str], *, servers: Sequence[Server] = (), timeout: float = 600.0,
               out_path: Optional[Path] = None, env: Optional[dict] = None, what: str = "",
               check: bool = True, stdin_path: Optional[Path] = None,
               user: Optional[str] = None) -> str:
    """Runs a client program (redis-benchmark, sysbench, pgbench...) to the end and
    returns its output (stdout+stderr). Meanwhile polls the servers: if one dies the
    client is killed and SuiteError names the server and shows its log tail. The client
    is killed on timeout, on exceptions and on KeyboardInterrupt too."""
    what = what or os.path.basename(argv[0])
    own_out = out_path is None
    if out_path is None:
        fd, name = tempfile.mkstemp(prefix="keel-client-", suffix=".out")
        os.close(fd)
        out_path = Path(name)
    proc = None
    try:
        with open(out_path, "wb") as out, \
                (open(stdin_path, "rb") if stdin_path else open(os.devnull, "rb")) as inp:
            kw: dict = {}
            if user:
                pw = pwd.getpwnam(user)
                kw = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
            try:
                proc = subprocess.Popen(list(argv), stdin=inp, stdout=out, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True, preexec_fn=procs.pdeathsig, **kw)
            except FileNotFoundError:
                raise SuiteError(f"{argv[0]} not found") from None
            deadline = time.monotonic() + timeout
            while True:
                try:
                    rc = proc.wait(0.2)
                    break
                except subprocess.TimeoutExpired:
                    pass
                for s in servers:
                    if not s.alive():
                        procs.stop(proc, grace=5.0)
                        raise SuiteError(s.died_message(f"{what}"))
                if time.monotonic() > deadline:
                    procs.stop(proc, grace=5.0)
                    raise SuiteError(f"{what} did not finish within {timeout:.0f}s\n"
                                     f"{log_tail(out_path, 20)}")
        text = Path(out_path).read_text(errors="replace")
        for s in servers:
            if not s.alive():
                raise SuiteError(s.died_message(what))
        if check and rc != 0:
            raise SuiteError(f"{what} failed ({describe_status(rc)}): {' '.join(argv)}\n"
                             f"{log_tail(out_path, 30)}")
        return text
    finally:
        if proc is not None and proc.poll() is None:
            procs.stop(proc, grace=5.0)
        if own_out:
            try:
                os.unlink(out_path)
            except OSError:
                pass


def sleep_watching(seconds: float, servers: Sequence[Server], during: str = "idle") -> None:
    """Sleeps, checking every 0.2 s that the servers are still alive."""
    end = time.monotonic() + seconds
    while True:
        for s in servers:
            s.check_alive(during)
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(0.2, left))
