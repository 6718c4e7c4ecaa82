#!/bin/sh
# Growth latency and writer scaling (`make bench-growth`) -> $OUT/growth.md.
#   growth:  one index grown from empty to GROWTH_BLOCKS (4,194,304) held blocks by
#            256 workers, 64-block stores, no removals, READERS (1) reader threads
#            querying stored chains; worst and p99.9 kvidx_store latency; then
#            without a reader, with glibc's default settings and with glibc
#            keeping freed memory (the worst stores are free() calls that
#            return memory to the kernel: munmap or heap trim), then with
#            KVIDX_F_DEFER_FREE and kvidx_reclaim between stores (timed apart),
#            glibc's defaults, without and with READERS reader threads.
#   scaling: the W16 C2048 F1 mock-engine stream; 1, 2, 4 and 8 writer threads on disjoint
#            workers (SCALE_WRITERS), then READERS alone and with one writer.
# Usage: run_growth.sh BENCH_BIN TRACE OUT_DIR.  Environment: GROWTH_BLOCKS,
# READERS, SCALE_WRITERS (1,2,4,8: past the cores too), KINDS (positional radix), CONC_TIME (2).
set -u
BIN=${1:-build/kvidx-bench}
TRACE=${2:-bench/data/mooncake_conversation_trace.jsonl.gz}
OUT=${3:-bench/results}
GROWTH_BLOCKS=${GROWTH_BLOCKS:-4194304}
READERS=${READERS:-1}
SCALE_WRITERS=${SCALE_WRITERS:-1,2,4,8}
KINDS=${KINDS:-positional radix}
CONC_TIME=${CONC_TIME:-2}
mkdir -p "$OUT"
MD="$OUT/growth.md.tmp"
START=$(date +%s)
fail=0
rev=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //')
{
  echo "# kvidx growth latency and writer scaling"
  echo
  echo "Made by \`make bench-growth\` (bench/run_growth.sh) on $(date -u '+%Y-%m-%d %H:%M UTC'), git $rev."
  echo "Machine: ${cpu:-?}, $(getconf _NPROCESSORS_ONLN) cores online, load average at start"
  echo "$(cut -d' ' -f1-3 /proc/loadavg) (shared with other jobs). Default config except the kind."
  echo "Threads share the cores: with 2 cores, a reader thread competes with the writer."
} >"$MD"
run() { # title, args...
  title=$1; shift
  echo "=== $title: $BIN $*"
  o=$("$BIN" "$@" </dev/null 2>&1); rc=$?
  printf '%s\n' "$o"
  [ $rc = 0 ] || { fail=1; echo "!!! failed (status $rc)"; }
  {
    echo
    echo "## $title"
    echo
    echo "\`$BIN $*\`$( [ $rc = 0 ] || echo " (exit status $rc: FAILED)")"
    echo
    echo '```'
    printf '%s\n' "$o"
    echo '```'
  } >>"$MD"
}
for k in $KINDS; do
  run "growth to $GROWTH_BLOCKS held blocks, $k, $READERS reader(s)" \
    --growth --kind "$k" --growth-blocks "$GROWTH_BLOCKS" --growth-workers 256 --growth-len 64 --readers "$READERS"
done
# the library's own stalls, without a reader thread competing for the cores
run "growth to $GROWTH_BLOCKS held blocks, positional, no reader" \
  --growth --kind positional --growth-blocks "$GROWTH_BLOCKS" --growth-workers 256 --growth-len 64 --readers 0
# the same with glibc told to keep freed memory: an old table's free() is then
# not a munmap or a heap trim, whose cost on a VM is the kernel's, not kvidx's
KEEP_ENV="MALLOC_MMAP_THRESHOLD_=1000000000 MALLOC_TRIM_THRESHOLD_=4000000000"
(export $KEEP_ENV
 run "growth to $GROWTH_BLOCKS held blocks, positional, no reader, glibc keeping freed memory ($KEEP_ENV)" \
   --growth --kind positional --growth-blocks "$GROWTH_BLOCKS" --growth-workers 256 --growth-len 64 --readers 0
 exit $fail) || fail=1
# glibc's defaults, the frees moved out of the stores by the library itself
run "growth to $GROWTH_BLOCKS held blocks, positional, no reader, KVIDX_F_DEFER_FREE (kvidx_reclaim between stores)" \
  --growth --kind positional --growth-blocks "$GROWTH_BLOCKS" --growth-workers 256 --growth-len 64 --readers 0 --defer-free
run "growth to $GROWTH_BLOCKS held blocks, positional, $READERS reader(s), KVIDX_F_DEFER_FREE (kvidx_reclaim between stores)" \
  --growth --kind positional --growth-blocks "$GROWTH_BLOCKS" --growth-workers 256 --growth-len 64 --readers "$READERS" --defer-free
for k in $KINDS; do
  run "writer scaling, $k, W16 C2048 F1" -q --trace "$TRACE" -W 16 -C 2048 -F 1 --scaling --kind "$k" \
    --scale-writers "$SCALE_WRITERS" --readers "$READERS" --mixed-writers 1 --conc-time "$CONC_TIME"
done
END=$(date +%s)
{
  echo
  echo "Fields: store_worst_ns = the slowest single kvidx_store (store_worst_at_held = blocks held"
  echo "before it); store_worst_cpu_ns = the same in the writer thread's CPU time (wall time also"
  echo "counts the time the scheduler gave the core to the reader or to other jobs: 2 cores, shared);"
  echo "store_p999_ns over every store; readers' query_max_ns / p99.9 during the growth;"
  echo "wrong_answers = queries whose answer missed the chain's worker at full depth (must be 0);"
  echo "eagain = find_matches_ex gave up on a write in progress; with --defer-free, reclaim_worst_ns ="
  echo "the slowest kvidx_reclaim that freed something (called after each store, not in its timing)."
  echo "Scaling: total and per-thread"
  echo "block-ops/s of writers replaying their workers' history (clear, then every event) in a"
  echo "loop; fraction_of_alone = reader queries/s with one writer running / readers alone."
  echo
  echo "Suite wall time: $((END - START))s."
} >>"$MD"
mv "$MD" "$OUT/growth.md"
echo "wrote $OUT/growth.md ($((END - START))s)"
exit $fail
