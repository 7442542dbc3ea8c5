#!/usr/bin/env bash
# emu-bash.sh -- runs a test script whose arguments name programs built for another
# architecture, in a cross build whose tests run under qemu-user (see
# cmake/toolchain-aarch64.cmake, which makes this script KEEL_BASH there).
#
# Usage: emu-bash.sh <emulator> [emulator args...] -- <script> [args...]
#   e.g. emu-bash.sh qemu-aarch64 -L /usr/aarch64-linux-gnu -- run_misuse.sh build/tests/test_misuse double_free_small ...
#
# Every argument after the script that is an ELF file for a machine other than this
# one is replaced by a launcher ("exec <emulator> <program> \"$@\""), so the script can
# run it as a plain program: the machine has no binfmt_misc to do that. The script
# itself, its other arguments, its exit status and its output are unchanged. qemu-user
# dies of the signal that killed the emulated program, so "died of SIGABRT" checks keep
# working. QEMU_PAGESIZE and QEMU_LD_PREFIX in the environment reach qemu as usual.
set -u

emu=()
while [[ $# -gt 0 && "$1" != "--" ]]; do emu+=("$1"); shift; done
if [[ $# -lt 2 || ${#emu[@]} -eq 0 ]]; then
  echo "usage: $0 <emulator> [args...] -- <script> [args...]" >&2
  exit 2
fi
shift # --
script=$1
shift

# e_machine (ELF header offset 18, little-endian) of this machine's own programs.
elf_machine() {
  local magic
  magic=$(od -An -tx1 -N4 "$1" 2>/dev/null | tr -d ' \n')
  [[ "$magic" == 7f454c46 ]] || return 1
  od -An -tu2 -j18 -N2 "$1" | tr -d ' \n'
}
host_machine=$(elf_machine /bin/bash)

dir=""
cleanup() { [[ -n "$dir" ]] && rm -rf "$dir"; }
trap cleanup EXIT
args=()
n=0
for a in "$@"; do
  m=""
  [[ -f "$a" && -x "$a" ]] && m=$(elf_machine "$a" || true)
  if [[ -n "$m" && "$m" != "$host_machine" ]]; then
    [[ -n "$dir" ]] || dir=$(mktemp -d "${TMPDIR:-/tmp}/keel-emu.XXXXXX")
    n=$((n + 1))
    launcher=$dir/$n-$(basename "$a")
    {
      echo '#!/bin/sh'
      printf 'exec'
      printf ' %q' "${emu[@]}" "$(readlink -f "$a")"
      printf ' "$@"\n'
    } >"$launcher"
    chmod +x "$launcher"
    args+=("$launcher")
  else
    args+=("$a")
  fi
done

st=0
/bin/bash "$script" "${args[@]+"${args[@]}"}" || st=$?
exit "$st"
