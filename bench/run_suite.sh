#!/bin/sh
# Standard benchmark suite (`make bench`): runs kvidx-bench over the shipped
# Mooncake trace in the standard configs and writes $OUT/latest.md (plus
# sweep.csv / sweep.png).  Usage: run_suite.sh BENCH_BIN TRACE OUT_DIR
# Budget: under 5 minutes on 2 cores.  Exit status 1 if any run failed its
# verification (kinds disagree, errors); results are still written.
set -u
BIN=${1:-build/kvidx-bench}
TRACE=${2:-bench/data/mooncake_conversation_trace.jsonl.gz}
OUT=${3:-bench/results}
mkdir -p "$OUT"
MD="$OUT/latest.md.tmp"
START=$(date +%s)
fail=0

cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //')
[ -n "$cpu" ] || cpu=$(uname -m)
cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo '?')
mem=$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo 2>/dev/null)
ccv=$(${CC:-cc} --version 2>/dev/null | head -n1)
rev=$(git rev-parse --short HEAD 2>/dev/null || echo 'uncommitted')

cat >"$MD" <<EOF
# kvidx benchmark results

Made by \`make bench\` (bench/run_suite.sh) on $(date -u '+%Y-%m-%d %H:%M UTC'), git $rev.

- Machine: $cpu, $cores cores online, $mem RAM, $(uname -sr); load average at
  start: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null) (other jobs on the machine inflate the numbers)
- Compiler: $ccv, flags \`-std=c11 -O2 -g\` (CFLAGS_BASE)
- Workload: Mooncake FAST'25 conversation trace (12,031 requests, bench/data), replayed
  through the mock engine of bench/kvidx-bench.c; events generated once, in memory,
  before timing; every kind replays the identical op stream, single threaded.
- block-ops/s = (blocks stored + blocks removed + blocks queried) / replay time (no
  per-op timers in that pass; fastest repetition); events/s from an events-only
  pass; queries/s and find_matches latency from a separate pass timing each call
  (clock_gettime; its ~20-30 ns overhead is included in the latencies, subtracted
  for queries/s). A '*' marks a kind too slow to repeat: all its numbers come from
  the one timed pass. Bytes counted through kvidx_config alloc/free hooks; bytes/block
  = bytes allocated / blocks held at the end of the replay.
- Performance numbers are measured, never asserted; checksums (every score of every
  find_matches and every event status) must agree across kinds.
EOF

run() { # label, args...
  label=$1; shift
  echo "=== $label: $BIN $*"
  "$BIN" --trace "$TRACE" --md "$MD" --label "$label" "$@" || { fail=1; echo "!!! $label failed"; }
}

run "A: W=16, C=2048, F=1" -W 16 -C 2048 -F 1 --min-time 2 \
  --writers 1 --readers 1 --sweep --csv "$OUT/sweep.csv" --png "$OUT/sweep.png"
run "B: W=64, C=16384, F=16" -W 64 -C 16384 -F 16 --min-time 2 --ref-max-ops 12000 \
  --writers 1 --readers 1
run "C: collision-heavy (W=16, C=2048, F=4, 25% of local hashes from a pool of 16)" \
  -W 16 -C 2048 -F 4 --collide 0.25 --collide-pool 16 --min-time 1 --ref-max-ops 8000
run "D: memory at W=256 (C=1024, F=2)" -W 256 -C 1024 -F 2 --min-time 0.5 --no-reference
run "E: kvidx-guided routing (W=16, C=2048, F=1)" -W 16 -C 2048 -F 1 --route kvidx --min-time 1

if command -v hyperfine >/dev/null 2>&1; then
  echo "=== hyperfine: whole runs per kind"
  H="$OUT/.hyperfine.md"
  common="-q --trace $TRACE -W 16 -C 2048 -F 1 --min-time 0"
  if hyperfine -N --warmup 1 --runs 5 --export-markdown "$H" \
      -n radix "$BIN $common --kinds radix" \
      -n positional "$BIN $common --kinds positional" \
      -n reference "$BIN $common --kinds reference"; then
    {
      echo
      echo "### hyperfine: whole runs (parse + hash + mock engine + replay), W=16, C=2048, F=1"
      echo
      echo "Command per kind: \`$BIN $common --kinds KIND\` (each run replays the op"
      echo "stream 3 times: timed, untimed, events only; trace parsing and event"
      echo "generation are the same fixed cost in every run)."
      echo
      cat "$H"
    } >>"$MD"
  fi
  rm -f "$H"
else
  echo "(hyperfine not installed: skipping whole-run comparison)"
fi

END=$(date +%s)
printf '\nSuite wall time: %ss.\n' "$((END - START))" >>"$MD"
mv "$MD" "$OUT/latest.md"
echo "wrote $OUT/latest.md ($((END - START))s)"
exit $fail
