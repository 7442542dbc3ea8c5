#!/usr/bin/env bash
# Install / run / remove test of Keel's Debian packages (debian/, scripts/package.sh).
# Needs root (it installs and removes packages system-wide).
#
#   1. builds the packages for this machine (scripts/package.sh), unless --debs DIR
#      already holds them;
#   2. apt-get install ./libkeel0_*.deb ./libkeel-dev_*.deb;
#   3. libkeel-dev: compiles a program with `pkg-config --cflags --libs keel` and runs it;
#   4. MariaDB through mysqld_safe --malloc-lib=/usr/lib/<triplet>/libkeel.so.0, in a
#      throw-away data directory (mariadb-install-db), on 127.0.0.1 and a socket of its
#      own; proves that mariadbd runs on Keel (/proc/<pid>/maps names the installed
#      library; LD_PRELOAD in its environment; the lab's `keel which PID` when the
#      checkout has .venv/bin/keel), runs a few statements, stops mariadbd by PID
#      (SIGTERM, clean shutdown);
#   5. apt-get purge of both packages, then checks that none of their files is left and
#      that ldconfig no longer knows libkeel;
#   6. with --arm64 (and qemu-user): the arm64 libkeel0 .deb, unpacked (not installed),
#      preloaded into an arm64 program under qemu-aarch64, which must print Keel's
#      statistics.
#
# Usage: tests/package/test_package.sh [--debs DIR] [--arm64] [--keep]
#   --debs DIR  use the .debs in DIR (default: build them into a temporary directory)
#   --arm64     also step 6 (builds the arm64 packages too unless --debs has them)
#   --keep      keep the throw-away directory
# Exit status: 0 pass, 1 fail, 77 skip (not root, or MariaDB not installed).
# The last line is "N passed, M failed".
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

debs=""
arm64=0
keep=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --debs) debs=$(realpath -m "$2"); shift 2 ;;
    --arm64) arm64=1; shift ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "test_package: unknown option $1" >&2; exit 2 ;;
  esac
done

T0=$SECONDS
passed=0 failed=0
say()  { printf '[package %3ds] %s\n' $((SECONDS - T0)) "$*"; }
ok()   { passed=$((passed + 1)); say "ok: $*"; }
bad()  { failed=$((failed + 1)); say "FAIL: $*"; }
finish() { echo "$passed passed, $failed failed"; exit $((failed > 0)); }
die()  { bad "$*"; finish; }

if [[ $(id -u) -ne 0 ]]; then
  say "SKIP: needs root (installs and removes packages)"
  exit 77
fi
for t in mysqld_safe mariadb-install-db mariadb; do
  command -v $t >/dev/null || { say "SKIP: $t not installed (scripts/install-deps.sh)"; exit 77; }
done

arch=$(dpkg --print-architecture)
triplet=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
lib=/usr/lib/$triplet/libkeel.so.0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/keel-package.XXXXXX")
chmod 755 "$tmp"
mysqld_safe_pid="" mpid="" installed_by_us=0

cleanup() {
  local st=$?
  if [[ -n "$mpid" ]] && kill -0 "$mpid" 2>/dev/null; then
    say "cleanup: stopping mariadbd (pid $mpid)"
    kill -TERM "$mpid" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$mpid" 2>/dev/null || break; sleep 0.3; done
    kill -KILL "$mpid" 2>/dev/null
  fi
  if [[ -n "$mysqld_safe_pid" ]] && kill -0 "$mysqld_safe_pid" 2>/dev/null; then
    kill -TERM "$mysqld_safe_pid" 2>/dev/null
    wait "$mysqld_safe_pid" 2>/dev/null
  fi
  if ((installed_by_us)) && dpkg-query -W -f='${Status}' libkeel0 2>/dev/null | grep -q installed; then
    say "cleanup: purging the packages"
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq libkeel-dev libkeel0 >/dev/null 2>&1
  fi
  if ((keep)); then say "kept $tmp"; else rm -rf "$tmp"; fi
  exit $st
}
trap cleanup EXIT
trap 'say interrupted; exit 130' INT TERM

for p in libkeel0 libkeel-dev; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    die "$p is already installed on this machine: this test installs and purges it; remove it first"
  fi
done

# ---- 1. the packages ---------------------------------------------------------------------
if [[ -z "$debs" ]]; then
  debs=$tmp/debs
  pargs=(--out "$debs" --nocheck --arch "$arch")
  ((arm64)) && [[ $arch != arm64 ]] && pargs=(--out "$debs" --nocheck --arch both)
  say "building the packages: scripts/package.sh ${pargs[*]}"
  bash "$here/scripts/package.sh" "${pargs[@]}" >"$tmp/package.log" 2>&1 ||
    { tail -n 30 "$tmp/package.log"; die "scripts/package.sh failed"; }
fi
deb0=$(ls "$debs"/libkeel0_*_"$arch".deb 2>/dev/null | head -n 1)
debdev=$(ls "$debs"/libkeel-dev_*_"$arch".deb 2>/dev/null | head -n 1)
[[ -f "$deb0" && -f "$debdev" ]] || die "no libkeel0/libkeel-dev .deb for $arch in $debs"
ok "packages: $(basename "$deb0") $(basename "$debdev")"

# ---- 2. install --------------------------------------------------------------------------
say "apt-get install $(basename "$deb0") $(basename "$debdev")"
installed_by_us=1
if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
     "$deb0" "$debdev" >"$tmp/apt-install.log" 2>&1; then
  ok "installed: $(dpkg-query -W -f='${Package} ${Version} ${Status}\n' libkeel0 libkeel-dev | tr '\n' ';')"
else
  cat "$tmp/apt-install.log"
  die "apt-get install failed"
fi
dpkg -L libkeel0 libkeel-dev | sort -u >"$tmp/files.txt"
grep -E 'libkeel|keel\.(h|pc)' "$tmp/files.txt" | sed 's/^/    /'
[[ -e "$lib" ]] && ok "$lib exists -> $(readlink -f "$lib")" || bad "$lib missing"
# (ld.so.cache names /lib/<triplet>/...: /lib is /usr/lib on a merged-/usr system.)
cached=$(ldconfig -p | sed -n 's/^[[:space:]]*libkeel\.so\.0 .*=> //p' | head -n 1)
if [[ -n "$cached" && "$(readlink -f "$cached")" == "$(readlink -f "$lib")" ]]; then
  ok "ldconfig knows libkeel.so.0 => $cached"
else
  bad "ldconfig -p: libkeel.so.0 => '${cached}', not $lib"
fi

# ---- 3. libkeel-dev ------------------------------------------------------------------------
cat >"$tmp/hello.c" <<'EOF'
#include <keel.h>
#include <stdio.h>
#include <stdlib.h>
int main(void) {
  char* volatile p = malloc(100); /* volatile: the compiler may not drop an unused malloc */
  keel_stats_t s;
  s.size = sizeof s;
  int rc = keel_stats_get(&s);
  printf("keel %s: stats rc %d, allocated %llu, page size %llu\n", keel_version(), rc,
         (unsigned long long)s.allocated, (unsigned long long)s.os_page_size);
  free(p);
  return rc != 0 || s.allocated == 0;
}
EOF
if flags=$(pkg-config --cflags --libs keel) &&
   cc -O1 "$tmp/hello.c" -o "$tmp/hello" $flags 2>"$tmp/cc.log" && out=$("$tmp/hello"); then
  ok "pkg-config --cflags --libs keel = '$flags'; linked program: $out"
  loaded=$(ldd "$tmp/hello" | sed -n 's/^[[:space:]]*libkeel\.so\.0 => \([^ ]*\).*/\1/p')
  [[ -n "$loaded" && "$(readlink -f "$loaded")" == "$(readlink -f "$lib")" ]] &&
    ok "it loads libkeel.so.0 => $loaded" || bad "ldd: $(ldd "$tmp/hello" | grep keel)"
else
  cat "$tmp/cc.log" 2>/dev/null
  bad "building or running a program against libkeel-dev failed"
fi

# ---- 4. MariaDB through mysqld_safe --malloc-lib ----------------------------------------
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
data=$tmp/data sock=$tmp/mariadb.sock pidf=$tmp/mariadbd.pid err=$tmp/mariadbd.err
say "mariadb-install-db into $data"
if ! timeout 120 mariadb-install-db --no-defaults --user=root --datadir="$data" \
       --auth-root-authentication-method=normal --skip-test-db >"$tmp/install-db.log" 2>&1; then
  tail -n 20 "$tmp/install-db.log"
  die "mariadb-install-db failed"
fi
say "mysqld_safe --no-defaults --malloc-lib=$lib ... (127.0.0.1:$port)"
mysqld_safe --no-defaults --malloc-lib="$lib" --user=root --skip-syslog \
  --datadir="$data" --socket="$sock" --port="$port" --bind-address=127.0.0.1 \
  --pid-file="$pidf" --log-error="$err" --tmpdir="$tmp" --skip-log-bin \
  --innodb-buffer-pool-size=64M --skip-name-resolve </dev/null >"$tmp/mysqld_safe.out" 2>&1 &
mysqld_safe_pid=$!
sql() { timeout 30 mariadb --no-defaults --protocol=socket -S "$sock" -u root -N -B "$@"; }
for _ in $(seq 1 240); do
  [[ -s "$pidf" ]] && sql -e 'SELECT 1' >/dev/null 2>&1 && break
  kill -0 "$mysqld_safe_pid" 2>/dev/null || break
  sleep 0.25
done
mpid=$(cat "$pidf" 2>/dev/null || true)
if [[ -z "$mpid" ]] || ! sql -e 'SELECT 1' >/dev/null 2>&1; then
  cat "$tmp/mysqld_safe.out"; tail -n 30 "$err" 2>/dev/null
  die "mariadbd did not come up through mysqld_safe"
fi
ok "mariadbd pid $mpid ($(readlink /proc/$mpid/exe)) answers: $(sql -e 'SELECT VERSION()')"
grep -m1 "LD_PRELOAD" "$err" "$tmp/mysqld_safe.out" 2>/dev/null | sed 's/^/    /'
real=$(readlink -f "$lib")
if grep -qF "$real" "/proc/$mpid/maps"; then
  ok "/proc/$mpid/maps maps $real:"
  grep -F "$real" "/proc/$mpid/maps" | head -n 2 | sed 's/^/    /'
else
  bad "/proc/$mpid/maps does not map $real"
fi
if tr '\0' '\n' <"/proc/$mpid/environ" | grep -q "^LD_PRELOAD=.*$lib"; then
  ok "mariadbd's environment: $(tr '\0' '\n' <"/proc/$mpid/environ" | grep '^LD_PRELOAD=')"
else
  bad "mariadbd's environment has no LD_PRELOAD with $lib"
fi
keel_cli=$here/.venv/bin/keel
if [[ -x "$keel_cli" ]]; then
  say "$keel_cli which $mpid:"
  if "$keel_cli" which "$mpid" >"$tmp/which.txt" 2>&1; then
    sed 's/^/    /' "$tmp/which.txt"
    grep -qE "allocator: +keel \($real\)" "$tmp/which.txt" && ok "keel which: allocator keel ($real)" ||
      bad "keel which does not name Keel at $real"
  else
    sed 's/^/    /' "$tmp/which.txt"
    bad "keel which $mpid failed"
  fi
else
  say "note: $keel_cli not found (scripts/setup-venv.sh makes it): keel which not run"
fi
res=$(sql -e "CREATE DATABASE t; USE t; CREATE TABLE k (id INT PRIMARY KEY, v VARCHAR(200)) ENGINE=InnoDB;
              INSERT INTO k SELECT seq, REPEAT('keel', 1 + seq % 40) FROM seq_1_to_20000;
              SELECT COUNT(*), SUM(LENGTH(v)) FROM k;" 2>&1)
[[ "$res" =~ ^20000$'\t'[0-9]+$ ]] && ok "20000 rows written and read back: $res" || bad "SQL: $res"

say "stopping mariadbd by pid ($mpid, SIGTERM)"
kill -TERM "$mpid"
for _ in $(seq 1 200); do kill -0 "$mpid" 2>/dev/null || break; sleep 0.3; done
if kill -0 "$mpid" 2>/dev/null; then
  bad "mariadbd still running 60 s after SIGTERM"
else
  mpid=""
  grep -q "Shutdown complete" "$err" && ok "mariadbd: Shutdown complete" || bad "no 'Shutdown complete' in $err"
fi
for _ in $(seq 1 50); do kill -0 "$mysqld_safe_pid" 2>/dev/null || break; sleep 0.2; done
if kill -0 "$mysqld_safe_pid" 2>/dev/null; then
  bad "mysqld_safe still running after mariadbd stopped"
else
  wait "$mysqld_safe_pid" 2>/dev/null
  mysqld_safe_pid=""
  ok "mysqld_safe exited (it does not restart a server that shut down cleanly)"
fi

# ---- 5. remove -----------------------------------------------------------------------
say "apt-get purge libkeel-dev libkeel0"
if DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq libkeel-dev libkeel0 >"$tmp/apt-purge.log" 2>&1; then
  installed_by_us=0
  ok "purged: $(dpkg-query -W -f='${Package} ${Status}\n' libkeel0 libkeel-dev 2>&1 | tr '\n' ';')"
else
  cat "$tmp/apt-purge.log"
  bad "apt-get purge failed"
fi
left=()
while IFS= read -r f; do
  [[ -z "$f" || "$f" == "/." ]] && continue
  if [[ -L "$f" || -f "$f" ]]; then
    left+=("$f")
  elif [[ -d "$f" ]] && ! dpkg -S "$f" >/dev/null 2>&1; then
    left+=("$f/ (directory no other package owns)")
  fi
done <"$tmp/files.txt"
if ((${#left[@]} == 0)); then
  ok "none of the $(wc -l <"$tmp/files.txt") paths of the packages is left (directories other packages own excepted)"
else
  bad "left behind: ${left[*]}"
fi
ldconfig -p | grep -q libkeel && bad "ldconfig -p still lists libkeel" || ok "ldconfig -p has no libkeel"
ls /var/lib/dpkg/info/libkeel* >/dev/null 2>&1 && bad "dpkg still has info files: $(ls /var/lib/dpkg/info/libkeel*)" ||
  ok "no /var/lib/dpkg/info/libkeel* left"

# ---- 6. arm64 (unpacked, under qemu) ------------------------------------------------------
if ((arm64)); then
  deba=$(ls "$debs"/libkeel0_*_arm64.deb 2>/dev/null | head -n 1)
  if [[ ! -f "$deba" ]]; then
    bad "--arm64: no libkeel0_*_arm64.deb in $debs"
  elif ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
    bad "--arm64: qemu-aarch64 or aarch64-linux-gnu-gcc missing (scripts/install-deps.sh --cross)"
  else
    dpkg-deb -x "$deba" "$tmp/arm64"
    alib=$tmp/arm64/usr/lib/aarch64-linux-gnu/libkeel.so.0
    printf '#include <stdlib.h>\nint main(void){free(malloc(100));return 0;}\n' >"$tmp/a.c"
    aarch64-linux-gnu-gcc -O1 "$tmp/a.c" -o "$tmp/a-arm64"
    for p in 4096 65536; do
      out=$(qemu-aarch64 -L /usr/aarch64-linux-gnu -p $p -E LD_PRELOAD="$alib" -E KEEL_STATS=1 \
              "$tmp/a-arm64" 2>&1)
      if grep -q "^keel: statistics" <<<"$out" && grep -qE "os_page_size +$p" <<<"$out"; then
        ok "arm64 .deb's library preloaded under qemu -p $p: $(grep -E 'os_page_size' <<<"$out" | tr -s ' ')"
      else
        bad "arm64 .deb's library under qemu -p $p: $out"
      fi
    done
  fi
fi

say "done"
finish
