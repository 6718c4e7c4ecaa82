#!/bin/sh
# `make bench-floor`: how much of the event lines' time is the worker seq
# tables' work, and what that leaves for the 2x-arena_c target of issue 12;
# and how many dependent steps the slowest queries walk (the p99 targets).
# For each mock-engine configuration (the files of `make bench-dynamo`):
#   1. kvidx-bench --write-events FILE, and FILE without its Q lines;
#   2. per round (ROUNDS, interleaved): kvidx-bench --replay FILE --walk-floor
#      --time REPS (the whole file, timed as --time does, then the slowest
#      1% of queries' walk steps: see --walk-floor in kvidx-bench.c),
#      dynamo-replay FILE arena_c and dynamo-replay on the
#      file without queries (when ../shared/anchors/dynamo exists), and
#      kvidx-bench --replay FILE --seq-floor --time REPS (the S/R/C lines
#      through kvidx, and through the seq tables alone: see --seq-floor in
#      kvidx-bench.c);
#   3. the medians over rounds, and: kvidx's query time (its find_matches
#      calls in the whole-file replay, summed: query_secs), the event time
#      kvidx may take to be 2x arena_c on the whole file (arena_c's whole
#      file / 2 minus kvidx's queries), and the
#      seq tables' time against it; the seq tables' ns per operation beside
#      --seq-floor's bare probe of tables as large (the machine's floor);
#      p99 beside arena_c's, and the slowest 1%'s steps beside the machine's
#      cache-miss latency.
# Writes $OUT/floor.md.  Usage: run_floor.sh BENCH_BIN TRACE OUT_DIR
# Environment: REPS (9), ROUNDS (3), DYNAMO_ANCHOR (../shared/anchors/dynamo),
# CONFIGS (lines "label|kvidx-bench workload flags").
set -u
BIN=${1:-build/kvidx-bench}
TRACE=${2:-bench/data/mooncake_conversation_trace.jsonl.gz}
OUT=${3:-bench/results}
REPS=${REPS:-9}
ROUNDS=${ROUNDS:-3}
ANCHOR=${DYNAMO_ANCHOR:-../shared/anchors/dynamo}
. "$(dirname "$0")/dynamo_common.sh"
CONFIGS=${CONFIGS:-$DYNAMO_FILES}
mkdir -p "$OUT"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvidx-floor.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT INT TERM
fail=0

find_dynamo

MD="$OUT/floor.md.tmp"
rev=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //')
{
  echo "# The floors: the seq tables and the query walk"
  echo
  echo "Made by \`make bench-floor\` (bench/run_floor.sh; REPS=$REPS, ROUNDS=$ROUNDS) on $(date -u '+%Y-%m-%d %H:%M UTC'), git $rev."
  echo
  echo "- Machine: ${cpu:-?}, $(getconf _NPROCESSORS_ONLN) cores online, load average at start"
  echo "  $(cut -d' ' -f1-3 /proc/loadavg); shared with other jobs: compare figures within this run only."
  echo "- Every figure is seconds for one replay: the median of $REPS repetitions in one process,"
  echo "  then the median of $ROUNDS interleaved rounds.  Event files and tools as in dynamo.md;"
  echo "  glibc malloc with default settings in both tools."
  echo "- whole: \`$BIN --replay FILE --walk-floor --time $REPS\` (timed as \`--time\`) and"
  echo "  \`dynamo-replay FILE arena_c --time $REPS\`."
  echo "  events: the same without the Q lines (\`--seq-floor\`'s first replay; dynamo-replay on"
  echo "  the file without Q lines).  seq tables: \`--seq-floor\`'s second replay, the S/R/C"
  echo "  lines through the worker seq tables alone (kvidx's map code, used as its stores and"
  echo "  removals use it), the work any design keeping a per-worker map from each held seq does."
  echo "- kvidx queries: the whole-file replay's find_matches calls, each timed on its own, summed"
  echo "  (\`query_secs\`).  Events for 2x = arena_c whole / 2 - kvidx queries: the event time kvidx"
  echo "  may take for its whole file to run in half arena_c's."
  echo
} >"$MD"

ROWS="$TMP/rows"
: >"$ROWS"
printf '%s\n' "$CONFIGS" | while IFS='|' read -r label flags; do
  [ -n "$label" ] || continue
  f="$TMP/events" nq="$TMP/events-nq"
  echo "=== $label: $BIN --trace $TRACE $flags --write-events FILE"
  # shellcheck disable=SC2086
  "$BIN" -q --trace "$TRACE" $flags --write-events "$f" </dev/null || { echo "!!! $label: write failed"; echo FAIL >>"$TMP/fail"; continue; }
  grep -v '^Q' "$f" >"$nq"
  : >"$TMP/kw"; : >"$TMP/kq"; : >"$TMP/ke"; : >"$TMP/ks"; : >"$TMP/aw"; : >"$TMP/ae"; : >"$TMP/kn"; : >"$TMP/bn"
  for k in p99 ap99 sp sr sh sb sns mns; do : >"$TMP/w$k"; done
  r=0
  while [ $r -lt "$ROUNDS" ]; do
    r=$((r + 1))
    l=$("$BIN" --replay "$f" --walk-floor --time "$REPS" 2>&1 </dev/null) || { echo "!!! kvidx --walk-floor failed: $l"; echo FAIL >>"$TMP/fail"; }
    echo "$l"; field "$l" secs >>"$TMP/kw"; field "$l" query_secs >>"$TMP/kq"
    field "$l" p99_ns >>"$TMP/wp99"; field "$l" slow_probes >>"$TMP/wsp"; field "$l" slow_runs_probed >>"$TMP/wsr"
    field "$l" slow_runs_hinted >>"$TMP/wsh"; field "$l" slow_blocks >>"$TMP/wsb"; field "$l" slow_ns >>"$TMP/wsns"
    field "$l" miss_ns >>"$TMP/wmns"
    l=$("$BIN" --replay "$f" --seq-floor --time "$REPS" 2>&1 </dev/null) || { echo "!!! kvidx --seq-floor failed: $l"; echo FAIL >>"$TMP/fail"; }
    echo "$l"; field "$l" events_secs >>"$TMP/ke"; field "$l" seq_tables_secs >>"$TMP/ks"
    field "$l" seq_ns_per_op >>"$TMP/kn"; field "$l" bare_probe_ns >>"$TMP/bn"
    bare="$(field "$l" bare_tables) x $(field "$l" bare_places)"
    if [ -n "$DYN" ]; then
      l=$("$DYN" "$f" arena_c --time "$REPS" 2>/dev/null </dev/null) || { echo "!!! dynamo arena_c failed"; echo FAIL >>"$TMP/fail"; }
      echo "$l"; field "$l" secs >>"$TMP/aw"; field "$l" p99_ns >>"$TMP/wap99"
      l=$("$DYN" "$nq" arena_c --time "$REPS" 2>/dev/null </dev/null) || { echo "!!! dynamo arena_c (no queries) failed"; echo FAIL >>"$TMP/fail"; }
      echo "$l"; field "$l" secs >>"$TMP/ae"
    fi
  done
  printf '%s|%s|%s|%s|%s|%s|%s|%s|%s|%s\n' "$label" "$(median <"$TMP/kw")" "$(median <"$TMP/ke")" "$(median <"$TMP/ks")" \
    "$(median <"$TMP/aw")" "$(median <"$TMP/ae")" "$(median <"$TMP/kn")" "$(median <"$TMP/bn")" "$bare" \
    "$(median <"$TMP/kq")" >>"$ROWS"
  printf '%s|%s|%s|%s|%s|%s|%s|%s|%s\n' "$label" "$(median <"$TMP/wp99")" "$(median <"$TMP/wap99")" \
    "$(median <"$TMP/wsp")" "$(median <"$TMP/wsr")" "$(median <"$TMP/wsh")" "$(median <"$TMP/wsb")" \
    "$(median <"$TMP/wsns")" "$(median <"$TMP/wmns")" >>"$TMP/walk"
done

{
  echo "| file | kvidx whole | kvidx events | kvidx queries | seq tables | seq tables / kvidx events | arena_c whole | arena_c events | whole: kvidx vs arena_c | events for 2x | seq tables / events for 2x |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  awk -F'|' '{
    q = $10
    if ($5 != "") { vs = sprintf("%.2fx", $5 / $2); need = $5 / 2 - q; nd = sprintf("%.4f", need); fl = need > 0 ? sprintf("%.2f", $4 / need) : "over" }
    else { vs = "-"; nd = "-"; fl = "-" }
    printf "| %s | %.4f | %.4f | %.4f | %.4f | %.2f | %s | %s | %s | %s | %s |\n", $1, $2, $3, q, $4, $4 / $3, ($5 == "" ? "-" : $5), ($6 == "" ? "-" : $6), vs, nd, fl
  }' "$ROWS"
  echo
  echo "| file | seq-table operations: ns each | bare probe: ns each | tables x places (bare probe) |"
  echo "|---|---:|---:|---|"
  awk -F'|' '{ printf "| %s | %.1f | %.1f | %s |\n", $1, $7, $8, $9 }' "$ROWS"
  echo
  echo "seq-table operations: seq tables / (stored blocks + parents + removed blocks).  Bare probe:"
  echo "\`--seq-floor\`'s measure of the machine (kvidx-bench.c, bare_probe_ns): as many tables as workers"
  echo "held blocks at the end, each of the largest seq table's places (16 bytes, half used),"
  echo "probed for random absent keys 20 at a time per table, each key's line asked for 8 keys"
  echo "ahead, read only: what this machine gives for a seq table's kind of access."
  echo
  echo "seq tables / events for 2x >= 1: with a seq table per worker as fast as kvidx's, the 2x target"
  echo "is out of reach on that file whatever the rest of the event path costs."
  echo
  echo "## The query walk"
  echo
  echo "| file | p99 µs | arena_c p99 µs | slowest 1%: probes / runs probed / runs hinted | steps | blocks matched | µs | ns per step | miss ns | steps x miss µs |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  [ -s "$TMP/walk" ] && awk -F'|' '{
    st = $4 + $5 + $6
    printf "| %s | %.2f | %s | %.1f / %.1f / %.1f | %.1f | %.0f | %.2f | %.0f | %.0f | %.2f |\n", $1, $2 / 1000,
      ($3 == "" ? "-" : sprintf("%.2f", $3 / 1000)), $4, $5, $6, st, $7, $8 / 1000, (st > 0 ? $8 / st : 0), $9, st * $9 / 1000
  }' "$TMP/walk"
  echo
  echo "From \`--walk-floor\`: the queries at or above p99 in the median repetition (their median latency,"
  echo "mean counts), counted by a private copy of kvidx whose walk reports each step (bench/walk_floor.c)."
  echo "A step is a child-map probe or a run read; each step's address comes from the one before it."
  echo "miss ns: a load that misses every cache (a pointer chase over 64 MiB or the index's peak if larger)."
  echo "A walk takes about steps x miss ns unless its prefetches run ahead; p99 <= 1 µs at miss ns"
  echo "allows about 1000 / miss ns steps' worth of misses."
  [ -n "$DYN" ] || echo "(no dynamo-replay: $ANCHOR not found or not built; kvidx columns only)"
} >>"$MD"
[ -s "$TMP/fail" ] && fail=1
mv "$MD" "$OUT/floor.md"
cat "$OUT/floor.md"
exit $fail
