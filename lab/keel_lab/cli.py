"""keel: the Keel lab's command line."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Optional

from . import __version__
from .allocators import ALL_NAMES, AllocatorNotFound, BadAllocatorSpec, find, parse
from .paths import default_build_dir

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

DESCRIPTION = """\
The Keel lab: which allocator does a process use, run programs and servers under
glibc, jemalloc, tcmalloc, mimalloc or Keel, compare them, and deploy the winner.

  keel which PID                      which allocator a running process really uses
  keel which -- CMD ARGS...           ... or a command (started, inspected, stopped)
  keel run --allocator keel -- CMD    run a command under an allocator (LD_PRELOAD)
  keel bench micro threads --quick    compare allocators (results JSON + summary)
  keel report results.json            self-contained HTML report with charts
  keel recommend results.json         who wins on speed, memory and tail latency
  keel deploy keel --for redis        the snippet that makes a service use it
  keel options                        Keel's tuning variables (KEEL_*)
  keel stats PID | keel top PID       look inside a running process under Keel
  keel purge PID | keel profile PID   return its free memory now | write a heap profile
  keel suites | keel allocators       what can be benchmarked, what is installed
"""


def _console(stderr: bool = False):
    from rich.console import Console
    c = Console(stderr=stderr, highlight=False)
    if not c.is_terminal and "COLUMNS" not in os.environ:
        c = Console(stderr=stderr, highlight=False, width=120)   # logs, pipes: no wrapping at 80
    return c


def err(msg: str) -> None:
    print(f"keel: error: {msg}", file=sys.stderr)


# What reading a results file whose inner structure summary.validate() did not foresee
# raises: reported as one line naming the file rather than as a traceback.
STRUCTURE_ERRORS = (TypeError, ValueError, AttributeError, KeyError, IndexError)


def _structure_error(path, e: Exception) -> str:
    return (f"{path}: unexpected structure in the results file ({type(e).__name__}: {e}); "
            f"was it written by keel bench?")


# ---------------------------------------------------------------------------------
# allocators


def cmd_allocators(args) -> int:
    con = _console()
    from rich.table import Table
    t = Table(title="allocators", title_justify="left")
    t.add_column("name")
    t.add_column("library")
    t.add_column("status")
    for n in ALL_NAMES:
        try:
            a = find(n, args.build_dir)
            t.add_row(n, a.path or "(none: the C library's malloc)", "[green]ok[/]")
        except AllocatorNotFound as e:
            t.add_row(n, "-", f"[red]missing[/]: {e}")
    con.print(t)
    return EXIT_OK


# ---------------------------------------------------------------------------------


def cmd_which(args) -> int:
    from .which import Terminated, WhichError, inspect_command, inspect_pid, predict_command
    try:
        if args.command:
            if args.no_run:
                res = predict_command(args.command)
            else:
                res = inspect_command(args.command, wait=args.wait)
        else:
            if not args.pid:
                err("give a PID (keel which 1234) or a command after -- (keel which -- CMD ...)")
                return EXIT_USAGE
            try:
                pid = int(args.pid)
            except ValueError:
                err(f"{args.pid!r} is not a PID; to inspect a command put it after --: "
                    f"keel which -- {args.pid} ...")
                return EXIT_USAGE
            res = inspect_pid(pid)
    except WhichError as e:
        err(str(e))
        return EXIT_FAIL
    except Terminated as e:
        import signal
        err(f"{signal.Signals(e.signum).name}: stopped the command and what it started")
        return 128 + e.signum
    if args.json:
        print(json.dumps(res.to_dict(), indent=1))
    else:
        print(res.render())
    return EXIT_OK


def _glibc_preload(cmd0: str, env: dict) -> Optional[str]:
    """glibc asked for, but the program links another allocator itself (Debian's
    redis-server: libjemalloc), which would serve malloc with nothing preloaded: the
    libc.so.6 to preload so that glibc's malloc comes first, by deploy's rule (the
    bench's too), said on stderr. None when nothing needs preloading (or the program
    cannot be checked)."""
    import shutil
    from .deploy import glibc_preload
    prog = cmd0 if "/" in cmd0 else shutil.which(cmd0, path=env.get("PATH", os.defpath))
    if not prog or not os.path.isfile(prog):
        return None
    libc, why = glibc_preload(prog)
    if why:
        said = " ".join(line.lstrip("# ") for line in why)
        if libc:
            said += f" Running it with LD_PRELOAD={libc}."
        print(f"keel: {said}", file=sys.stderr)
    return libc


def cmd_run(args) -> int:
    if not args.command:
        err("nothing to run: keel run --allocator NAME -- CMD ARGS...")
        return EXIT_USAGE
    try:
        a = parse(args.allocator, args.build_dir)
    except AllocatorNotFound as e:
        err(str(e))
        return EXIT_USAGE
    env = a.env()
    preload = a.path
    if a.path is None:
        preload = _glibc_preload(args.command[0], env)
        if preload:
            env["LD_PRELOAD"] = preload
    if args.verbose:
        how = " ".join([f"LD_PRELOAD={preload}" if preload else "no LD_PRELOAD",
                        *(f"{k}={v}" for k, v in a.extra_env)])
        print(f"keel: running under {a.name} ({how}): "
              f"{shlex.join(args.command)}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(args.command[0], args.command, env)
    except FileNotFoundError:
        err(f"command not found: {args.command[0]}")
        return 127
    except PermissionError:
        err(f"permission denied: {args.command[0]}")
        return 126
    except OSError as e:
        err(f"cannot run {args.command[0]}: {e}")
        return 126


def _suite_options(items: list[str]) -> dict:
    out: dict = {}
    for it in items or []:
        if "=" not in it or "." not in it.split("=", 1)[0]:
            raise ValueError(f"--set wants SUITE.KEY=VALUE (e.g. micro.programs=tree,xthread), "
                             f"not {it!r}")
        k, v = it.split("=", 1)
        suite, key = k.split(".", 1)
        out.setdefault(suite, {})[key] = v
    return out


def cmd_bench(args) -> int:
    from .bench import BenchError, print_summary, run_bench, run_status
    names = [s for part in args.suites for s in part.split(",") if s]
    allocs, missing = [], []
    for spec in [s.strip() for s in args.allocators.split(",") if s.strip()]:
        try:
            allocs.append(parse(spec, args.build_dir))
        except BadAllocatorSpec as e:
            err(str(e))
            return EXIT_USAGE
        except AllocatorNotFound as e:
            missing.append(str(e))
    if missing:
        for m in missing:
            if args.skip_missing:
                print(f"keel: skipping: {m}", file=sys.stderr)
            else:
                err(m)
        if not args.skip_missing:
            print("keel: (use --skip-missing to run without them)", file=sys.stderr)
            return EXIT_USAGE
    try:
        options = _suite_options(args.set)
    except ValueError as e:
        err(str(e))
        return EXIT_USAGE
    con_err = _console(stderr=True)
    command = "keel " + shlex.join(sys.argv[1:]) if args.command_line is None else args.command_line
    try:
        doc, out = run_bench(names, allocs, rounds=args.rounds, quick=args.quick, out=args.out,
                             build_dir=args.build_dir, options=options, console=con_err,
                             lock=not args.no_lock, command=command)
    except BenchError as e:
        err(str(e))
        return EXIT_USAGE
    con = _console()
    print_summary(doc, con, details=args.details)
    con.print(f"results: {out}")
    status = run_status(doc)
    if args.report:
        from .report import write_report
        from .summary import ResultsError
        html = Path(out).with_suffix(".html")
        try:
            con.print(f"report: {write_report(out, html)}")
        except (ResultsError, OSError, *STRUCTURE_ERRORS) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else e
            err(f"cannot write the report {html}: {why} (the results are in {out}; "
                f"retry with: keel report {out})")
            status = status or EXIT_FAIL
    if status == 130:
        con.print("[yellow]interrupted: the results file holds the runs that finished "
                  "(marked incomplete)[/]")
    return status


def cmd_report(args) -> int:
    from .report import write_report
    from .summary import ResultsError
    try:
        out = write_report(args.results, args.output)
    except ResultsError as e:
        err(str(e))
        return EXIT_FAIL
    except OSError as e:
        err(f"cannot write the report: {e}")
        return EXIT_FAIL
    except STRUCTURE_ERRORS as e:
        err(_structure_error(args.results, e))
        return EXIT_FAIL
    print(f"report: {out}")
    return EXIT_OK


def cmd_recommend(args) -> int:
    from .recommend import recommend, render_text
    from .summary import ResultsError, load
    try:
        doc = load(args.results)
        text = json.dumps(recommend(doc), indent=1) if args.json else render_text(doc)
    except ResultsError as e:
        err(str(e))
        return EXIT_FAIL
    except STRUCTURE_ERRORS as e:
        err(_structure_error(args.results, e))
        return EXIT_FAIL
    print(text)
    return EXIT_OK


def cmd_deploy(args) -> int:
    from .deploy import DeployError, snippet
    if len(args.name_unit) > 2:
        err(f"too many arguments: {' '.join(args.name_unit)} (want NAME [UNIT])")
        return EXIT_USAGE
    name, unit = args.name_unit[0], (args.name_unit[1] if len(args.name_unit) > 1 else None)
    try:
        print(snippet(name, args.target, unit, args.build_dir, mesh=args.mesh), end="")
    except DeployError as e:
        err(str(e))
        return EXIT_USAGE
    return EXIT_OK


def cmd_options(args) -> int:
    from .keel_options import OPTIONS
    if args.json:
        print(json.dumps([o.__dict__ for o in OPTIONS], indent=1))
        return EXIT_OK
    from rich.table import Table
    t = Table(title="Keel options: environment variables (KEEL_<NAME>), keel_conf and "
                    "keel_option_set() names (<name> in lower case)",
              title_justify="left", show_lines=True)
    t.add_column("variable", style="bold", no_wrap=True)
    t.add_column("type")
    t.add_column("default", no_wrap=True)
    t.add_column("meaning")
    for o in OPTIONS:
        t.add_row(o.env, o.kind, o.default, o.meaning)
    con = _console()
    con.print(t)
    con.print("Sizes take K/M/G suffixes (1K = 1024); durations milliseconds or seconds with "
              "an s suffix; booleans 1/0, on/off, yes/no, true/false. "
              "A bad value prints a warning and the default is used.\n"
              "A program may set its own defaults with  const char* keel_conf = "
              "\"purge_delay:250,thp:never\";  the environment overrides them. While it "
              "runs, keel_option_set(\"purge_delay\", \"250\") changes any option except "
              "check, huge_page_size and switching profile_rate on or off.\n"
              "Example: keel run --allocator keel -- env KEEL_STATS=1 KEEL_PURGE_DELAY=200 "
              "PROGRAM")
    return EXIT_OK


def cmd_suites(args) -> int:
    from . import suites
    con = _console()
    from rich.table import Table
    t = Table(title="benchmark suites", title_justify="left")
    t.add_column("suite", style="bold")
    t.add_column("status")
    t.add_column("what it measures")
    for name, cls in sorted(suites.REGISTRY.items()):
        t.add_row(name, "[green]available[/]", cls.description)
    for name, why in sorted(suites.UNAVAILABLE.items()):
        t.add_row(name, "[red]unavailable[/]", why)
    con.print(t)
    return EXIT_OK


# ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog="keel", description=DESCRIPTION, formatter_class=fmt)
    p.add_argument("--version", action="version", version=f"keel-lab {__version__}")
    p.add_argument("--build-dir", type=Path, default=None,
                   help="Keel's CMake build directory: libkeel.so and the bench/ programs "
                        "(default: $KEEL_BUILD_DIR, else <checkout>/build)")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    w = sub.add_parser("which", formatter_class=fmt,
                       help="which allocator a process really uses, and how it got there",
                       description="""\
Which allocator a running process really uses -- glibc, jemalloc, tcmalloc, mimalloc,
Keel, or one compiled into the program (e.g. Redis's own static jemalloc) -- and how:
LD_PRELOAD, /etc/ld.so.preload, linked (DT_NEEDED) or static.

Reads /proc/PID/maps, /proc/PID/exe, /proc/PID/environ and the loader's own list of
loaded objects (/proc/PID/mem, needs root or the same user), and the ELF files.

  keel which 1234
  keel which $(pidof redis-server)
  keel which -- redis-server --port 7000     start it, inspect after --wait, stop it
  keel which --no-run -- mariadbd            predict from the binary and the environment""")
    w.add_argument("pid", nargs="?", help="process ID")
    w.add_argument("--wait", type=float, default=0.5,
                   help="with a command: seconds to let it start before inspecting (default 0.5)")
    w.add_argument("--no-run", action="store_true",
                   help="with a command: do not start it; predict from the executable, ldd "
                        "and the current environment")
    w.add_argument("--json", action="store_true", help="machine-readable output")
    w.set_defaults(func=cmd_which)

    r = sub.add_parser("run", formatter_class=fmt, help="run a command under an allocator",
                       description="""\
Runs a command with LD_PRELOAD set to the allocator (glibc: LD_PRELOAD removed, or set
to the C library when the program links another allocator itself, as Debian's
redis-server links libjemalloc). The command replaces keel (exec), so its exit status is
the command's.

  keel run --allocator keel -- redis-server --port 7000
  keel run --allocator /opt/keel/libkeel.so -- ./myprogram""")
    r.add_argument("--allocator", "-a", required=True,
                   help=f"{', '.join(ALL_NAMES)}, or a path to a .so; +VAR=VALUE adds to "
                        "the environment, +mesh = +KEEL_MESH=on (e.g. keel+mesh)")
    r.add_argument("--verbose", "-v", action="store_true", help="say what is run")
    r.set_defaults(func=cmd_run)

    b = sub.add_parser("bench", formatter_class=fmt, help="compare allocators on suites",
                       description="""\
Runs each suite ROUNDS times under each allocator. Within a round the allocators take
turns in an order that rotates every round; each run gets a fresh temporary directory.
Results go to a JSON file (rewritten after every run; Ctrl-C stops cleanly and keeps
the finished runs, marked incomplete) and a summary table is printed: median per
metric and allocator, xN = N times worse than the best, % = spread of the runs.
Only one benchmark runs at a time per machine (shared lock with bench/run.py).

  keel bench micro threads --quick --allocators glibc,jemalloc,keel
  keel bench redis-frag --allocators jemalloc,keel,keel+mesh   (Keel with KEEL_MESH=on too)
  keel bench micro --rounds 5 --set micro.programs=tree,xthread --out results/tree.json
  keel suites        (what is available)""")
    b.add_argument("suites", nargs="+", metavar="SUITE", help="suite names (keel suites)")
    b.add_argument("--allocators", default=",".join(ALL_NAMES),
                   help="comma-separated: names, paths, or LABEL=/path/lib.so, each "
                        "optionally followed by +VAR=VALUE (set in its environment; VAR in "
                        "capitals, repeatable) or +mesh (= +KEEL_MESH=on). A variant is a "
                        "column of its own, named as written: --allocators keel,keel+mesh "
                        "compares Keel with and without meshing (default: all five)")
    b.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    b.add_argument("--quick", action="store_true", help="small sizes: a first look, not numbers "
                                                         "to quote")
    b.add_argument("--out", "-o", type=Path, default=None,
                   help="results JSON (default: results/bench-DATE-SUITES.json)")
    b.add_argument("--set", action="append", metavar="SUITE.KEY=VALUE",
                   help="suite option, repeatable (e.g. threads.counts=1,64,1024)")
    b.add_argument("--report", action="store_true", help="also write the HTML report")
    b.add_argument("--details", action="store_true",
                   help="show per-item metrics (each micro program, each thread count) too")
    b.add_argument("--skip-missing", action="store_true",
                   help="leave out allocators that are not installed instead of failing")
    b.add_argument("--no-lock", action="store_true",
                   help="do not wait for other benchmarks on this machine")
    b.set_defaults(func=cmd_bench, command_line=None)

    rp = sub.add_parser("report", help="self-contained HTML report from a results file",
                        description="Writes an HTML page with the summary tables, charts "
                                    "(inline SVG), the recommendation and the run details.")
    rp.add_argument("results", type=Path, help="results JSON from keel bench")
    rp.add_argument("-o", "--output", type=Path, default=None,
                    help="HTML file (default: the results file with .html)")
    rp.set_defaults(func=cmd_report)

    rc = sub.add_parser("recommend", help="which allocator wins, per suite, and by how much",
                        description="Per suite: the winner on speed, on memory (RSS) and on "
                                    "tail latency (p99), the margin, and whether the margin "
                                    "is bigger than the spread of the runs.")
    rc.add_argument("results", type=Path)
    rc.add_argument("--json", action="store_true")
    rc.set_defaults(func=cmd_recommend)

    d = sub.add_parser("deploy", formatter_class=fmt,
                       help="print the config snippet that makes a service use an allocator",
                       description="""\
Prints (does not apply) what makes a service use the allocator: a systemd drop-in with
LD_PRELOAD, mysqld_safe's malloc-lib, or PostgreSQL's cluster environment file, with
where to put it and the commands to reload, restart and check.
--mesh (Keel only) also sets KEEL_MESH=on and prints what meshing needs on the machine:
a sysctl.d file for vm.max_map_count, a udev rule giving a group /dev/userfaultfd, and
how to check it works (keel stats PID). Without access to /dev/userfaultfd libkeel warns
and runs without meshing.

  keel deploy keel --for redis                 (unit redis-server.service)
  keel deploy jemalloc --for mariadb
  keel deploy keel --for postgres 15/main
  keel deploy keel --for systemd myapp.service
  keel deploy keel --for redis --mesh          (with meshing, docs/meshing.md)""")
    d.add_argument("name_unit", nargs="+", metavar="NAME [UNIT]",
                   help=f"allocator ({', '.join(ALL_NAMES)} or a path to a .so), then for "
                        f"--for systemd the unit (optional for the others: redis-server, "
                        f"mariadb; postgres: the cluster, e.g. 15/main)")
    d.add_argument("--for", dest="target", required=True,
                   choices=["mariadb", "redis", "postgres", "systemd"])
    d.add_argument("--mesh", action="store_true",
                   help="Keel only: also turn meshing on (KEEL_MESH=on) and print the "
                        "machine settings it needs (vm.max_map_count, /dev/userfaultfd "
                        "group) and how to check it")
    d.set_defaults(func=cmd_deploy)

    o = sub.add_parser("options", help="Keel's run-time options (KEEL_* variables)")
    o.add_argument("--json", action="store_true")
    o.set_defaults(func=cmd_options)

    s = sub.add_parser("suites", help="list the benchmark suites")
    s.set_defaults(func=cmd_suites)
    a = sub.add_parser("allocators", help="list the allocators and whether they are installed")
    a.set_defaults(func=cmd_allocators)
    from . import livecmd
    livecmd.add_parsers(sub, fmt)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # argparse does not take positionals after an option (deploy NAME --for X UNIT)
        if getattr(args, "cmd", None) == "deploy" and not any(e.startswith("-") for e in extra):
            args.name_unit += extra
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "cmd", None):
        parser.print_help()
        return EXIT_USAGE
    if command and args.cmd not in ("which", "run"):
        parser.error("'--' and a command only go with 'which' and 'run'")
    args.command = command
    args.build_dir = (args.build_dir or default_build_dir()).resolve()
    if args.cmd == "which" and command and args.pid:
        parser.error("give either a PID or a command after --, not both")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("keel: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
