# runner.sh -- the command line that scripts/soak.sh and scripts/suites.sh share: which
# servers or suites (--only), under which allocators (--alloc), which libkeel.so (--lib),
# where the results go (--results). Sourced by them.
#
# Before runner_parse the script sets its defaults (only, alloc, lib, results) and USAGE
# (the options of its usage line), and defines runner_own_option for its own options:
# called with the words left, it takes $1 (and its value $2), sets RUNNER_TOOK to how
# many words it used (it is 2 on the call), or returns 1 when $1 is not one of its options.

# runner_parse "$@": reads the command line into only, alloc, lib, results (and whatever
# runner_own_option sets); an unknown word prints the usage and exits 2. Then makes the
# results directory and sets allocs: (glibc keel) for --alloc both, else the one.
runner_parse() {
  while (($#)); do
    RUNNER_TOOK=2
    case $1 in
      --alloc) alloc=$2 ;;
      --only) only=$2 ;;
      --lib) lib=$2 ;;
      --results) results=$2 ;;
      *) runner_own_option "$@" || { echo "usage: $0 $USAGE" >&2; exit 2; } ;;
    esac
    shift "$RUNNER_TOOK"
  done
  mkdir -p "$results"
  case $alloc in both) allocs=(glibc keel) ;; keel|glibc) allocs=("$alloc") ;; *) exit 2 ;; esac
}
