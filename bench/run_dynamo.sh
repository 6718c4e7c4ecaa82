#!/bin/sh
# Side-by-side suite (`make bench-dynamo`): kvidx against NVIDIA Dynamo's own
# indexers on identical event files.  For each mock-engine configuration:
#   1. kvidx-bench --write-events writes the event stream (Dynamo's replay format);
#   2. kvidx-bench --replay FILE --kind K --time REPS   for positional, radix, reference,
#      and positional-sized: positional with --blocks-per-worker C (the file's
#      engine cache size, which a router knows; not the default config);
#   3. dynamo-replay FILE B --time REPS                 for arena_c, positional, crt
#      (when ../shared/anchors/dynamo exists; otherwise skipped with a note);
#   4. answers: every query's worker:score line, kvidx (each kind) vs arena_c.
# All in one run, so the ratios compare like with like on a shared machine.
# Writes $OUT/dynamo.md (HEAP=keep: $OUT/dynamo-keep.md).  Usage: run_dynamo.sh BENCH_BIN TRACE OUT_DIR
# Environment: REPS (5), ROUNDS (1: with N > 1 every backend runs N times,
# interleaved, and the run with the median secs is reported: fairer when other
# jobs load the machine unevenly; each round runs kvidx-positional and arena_c
# first, back to back, and their ratio per round and its median are printed
# too, with the ratio of the two tools' fastest repetitions), DYNAMO_ANCHOR
# (../shared/anchors/dynamo), CONFIGS
# (lines "label|kvidx-bench workload flags"), KINDS, BACKENDS, HEAP (default:
# glibc's malloc settings; keep: both tools run with MALLOC_MMAP_THRESHOLD_ and
# MALLOC_TRIM_THRESHOLD_ set so glibc keeps freed memory, and a repetition's
# index does not fault in pages the last one gave back: the fresh index per
# repetition then costs both sides what it costs a long-lived router).
set -u
BIN=${1:-build/kvidx-bench}
TRACE=${2:-bench/data/mooncake_conversation_trace.jsonl.gz}
OUT=${3:-bench/results}
REPS=${REPS:-5}
ROUNDS=${ROUNDS:-1}
ANCHOR=${DYNAMO_ANCHOR:-../shared/anchors/dynamo}
KINDS=${KINDS:-positional positional-sized radix reference}
BACKENDS=${BACKENDS:-arena_c positional crt}
. "$(dirname "$0")/dynamo_common.sh"
CONFIGS=${CONFIGS:-$DYNAMO_FILES}
case ${HEAP:=default} in
  default) NAME=dynamo.md; HEAP_TEXT="glibc malloc with default settings (dynamo-replay sets no global allocator)" ;;
  keep)
    NAME=dynamo-keep.md
    MALLOC_MMAP_THRESHOLD_=1000000000 MALLOC_TRIM_THRESHOLD_=4000000000
    export MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_
    HEAP_TEXT="glibc malloc told to keep freed memory, the same for both (MALLOC_MMAP_THRESHOLD_=$MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_=$MALLOC_TRIM_THRESHOLD_)" ;;
  *) echo "run_dynamo.sh: HEAP must be default or keep" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvidx-dynamo.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT INT TERM
START=$(date +%s)
fail=0

find_dynamo

MD="$OUT/$NAME.tmp"
CMD=bench-dynamo; [ "$HEAP" = keep ] && CMD=bench-dynamo-keep
rev=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //')
{
  echo "# kvidx vs Dynamo's indexers, side by side"
  echo
  echo "Made by \`make $CMD\` (bench/run_dynamo.sh; REPS=$REPS) on $(date -u '+%Y-%m-%d %H:%M UTC'), git $rev."
  echo
  echo "- Machine: ${cpu:-?}, $(getconf _NPROCESSORS_ONLN) cores online, load average at start"
  echo "  $(cut -d' ' -f1-3 /proc/loadavg); shared with other jobs: compare ratios within this run only."
  echo "- Event files: \`$BIN --trace $TRACE FLAGS --write-events FILE\` (mock engine over the"
  echo "  conversation trace: random routing, per-worker LRU, vLLM-order eviction)."
  echo "- kvidx: \`$BIN --replay FILE --kind K --time $REPS\` (default config except the kind;"
  echo "  kvidx-positional-sized adds \`--blocks-per-worker C\`, the file's per-worker cache size:"
  echo "  cfg.blocks_per_worker, so seq tables start with that room; not the default config;"
  echo "  compiled with the Makefile's BENCH_CFLAGS). Dynamo: \`dynamo-replay FILE B --time $REPS\`"
  echo "  (${DYN:-not available}; release, LTO, target-cpu=native)."
  echo "- Both: parsing before the clock; each repetition into a fresh index (created and"
  echo "  destroyed outside the clock); secs = wall time applying every line in file order;"
  echo "  the median of $REPS repetitions$( [ "$ROUNDS" -gt 1 ] && echo " (and of $ROUNDS interleaved runs of each tool)"); latency = one find_matches call; p = sorted[p*queries/1000];"
  echo "  block-ops = sum of n over S, R and Q lines; checksum = sum of all scores. Both use"
  echo "  $HEAP_TEXT, and both apply"
  echo "  each line from its own heap buffer, made before the clock and freed once applied"
  echo "  (dynamo-replay's RouterEvents; kvidx-bench's default since 7a9015e, --no-event-buffers"
  echo "  for the old way): both indexes meet a heap holding the pages the events leave."
  echo "- bytes/held block: kvidx_get_stats().bytes / .blocks taken at the peak of held blocks"
  echo "  (an extra untimed replay; Dynamo reports no memory figure); peak = kvidx_get_stats().peak_bytes."
  echo "- answers: each query's worker:score line compared with arena_c's (\`--expect\`)."
  echo
} >"$MD"

# kvidx-bench's flags for kind K (K-sized: cfg.blocks_per_worker = $cap, the
# file's -C, set per file below)
kargs() { case $1 in *-sized) echo "--kind ${1%-sized} --blocks-per-worker ${cap:-0}" ;; *) echo "--kind $1" ;; esac; }

TABLE="$TMP/table"
: >"$TABLE"
printf '%s\n' "$CONFIGS" | while IFS='|' read -r label flags; do
  [ -n "$label" ] || continue
  cap=$(printf '%s\n' "$flags" | sed -n 's/.*-C \([0-9][0-9]*\).*/\1/p') # the file's -C, for kargs
  f="$TMP/events"
  echo "=== $label: $BIN --trace $TRACE $flags --write-events FILE"
  # shellcheck disable=SC2086
  wrote=$("$BIN" -q --trace "$TRACE" $flags --write-events "$f" </dev/null) || { echo "!!! $label: write failed"; echo FAIL >>"$TMP/fail"; continue; }
  echo "$wrote"
  echo "[$label]" >>"$TMP/stderr"
  : >"$TMP/all"
  : >"$TMP/pairs"
  r=0
  while [ $r -lt "$ROUNDS" ]; do
    r=$((r + 1))
    # kvidx-positional and arena_c first and back to back (the pair the
    # ratio is about: the machine's phase changes over minutes), then the rest
    pos=""; arena=""
    for k in $(printf '%s\n' $KINDS | grep -x positional) $(printf '%s\n' $KINDS | grep -vx positional) \
        $( [ -n "$DYN" ] && printf 'dyn:%s\n' $BACKENDS | grep -x dyn:arena_c) \
        $( [ -n "$DYN" ] && printf 'dyn:%s\n' $BACKENDS | grep -vx dyn:arena_c); do
      case $k in
        dyn:*) b=${k#dyn:}
          l=$("$DYN" "$f" "$b" --time "$REPS" 2>>"$TMP/stderr" </dev/null) || { echo "!!! dynamo $b failed"; echo FAIL >>"$TMP/fail"; } ;;
        # shellcheck disable=SC2046
        *) l=$("$BIN" --replay "$f" $(kargs "$k") --time "$REPS" 2>>"$TMP/stderr" </dev/null) || { echo "!!! kvidx $k failed"; echo FAIL >>"$TMP/fail"; } ;;
      esac
      echo "$l"
      [ -n "$l" ] && echo "$l" >>"$TMP/all"
      case $k in positional) pos=$(field "$l" block_ops_per_s) ;; dyn:arena_c) arena=$(field "$l" block_ops_per_s) ;; esac
    done
    [ -n "$pos" ] && [ -n "$arena" ] && echo "$pos $arena" >>"$TMP/pairs"
  done
  # per backend, the round with the median secs (sorted ascending, index n/2)
  : >"$TMP/lines"
  for b in $(cut -d' ' -f1 "$TMP/all" | awk '!seen[$0]++'); do
    grep "^$b " "$TMP/all" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^secs=/) print substr($i, 6), $0 }' |
      sort -g | cut -d' ' -f2- | awk '{ l[NR] = $0 } END { print l[int(NR / 2) + 1] }' >>"$TMP/lines"
  done
  if [ -n "$DYN" ]; then
    "$DYN" "$f" arena_c >"$TMP/answers" 2>>"$TMP/stderr" </dev/null
    ans=""
    for k in $KINDS; do
      # shellcheck disable=SC2046
      a=$("$BIN" --replay "$f" $(kargs "$k") --expect "$TMP/answers" 2>>"$TMP/stderr" </dev/null | tail -n 1)
      ans="$ans${ans:+, }$k $(field "$a" differ)/$(field "$a" queries) differ"
    done
    echo "answers vs arena_c: $ans"
  else
    ans="(no dynamo-replay)"
  fi
  # table rows: label, backend, M/s, p50, p99, p999, bytes/block, peak, checksum
  ac=$(grep '^backend=arena_c ' "$TMP/lines" | head -n 1)
  acr=$(field "$ac" block_ops_per_s)
  while read -r l; do
    b=$(field "$l" backend); r=$(field "$l" block_ops_per_s)
    bpb=$(field "$l" bytes_per_held_block); pk=$(field "$l" peak_bytes)
    printf '%s|%s|%s|%s|%s|%s|%s|%s|%s|%s\n' "$label" "$b" "$r" "${acr:-0}" "$(field "$l" p50_ns)" \
      "$(field "$l" p99_ns)" "$(field "$l" p999_ns)" "${bpb:--}" "${pk:--}" "$(field "$l" checksum)" >>"$TABLE"
  done <"$TMP/lines"
  # ratios of kvidx-positional to every backend
  pr=$(field "$(grep '^backend=kvidx-positional ' "$TMP/lines")" block_ops_per_s)
  rat=""
  while read -r l; do
    b=$(field "$l" backend); r=$(field "$l" block_ops_per_s)
    [ "$b" = kvidx-positional ] && continue
    rat="$rat${rat:+, }$(awk -v a="${pr:-0}" -v b="$r" 'BEGIN { printf "%.2fx", (b > 0 ? a / b : 0) }') $b"
  done <"$TMP/lines"
  # the same ratio per round (kvidx-positional and arena_c run back to back)
  # and its median (of an even count, the mean of the middle two): steadier
  # than the ratio of the median runs when the machine's speed changes
  # between rounds
  if [ -s "$TMP/pairs" ]; then
    rat="$rat; per round vs arena_c: $(awk '{ printf "%s%.2fx", (NR > 1 ? " " : ""), ($2 > 0 ? $1 / $2 : 0) }' "$TMP/pairs")"
    rat="$rat, median $(awk '{ print ($2 > 0 ? $1 / $2 : 0) }' "$TMP/pairs" | median | awk '{ printf "%.2fx", $1 }')"
  fi
  # the fastest repetition of each over all rounds (the tools' sorted
  # rep_secs on stderr): the one other jobs disturbed least, a floor to read
  # beside the medians on a shared machine, not a replacement for them
  best=$(awk -v L="[$label]" '$0 == L { on = 1; next } /^\[/ { on = 0 }
    on && /rep_secs\(sorted\)=\[/ {
      b = $0 ~ /backend=kvidx-positional / ? "k" : $0 ~ /backend=arena_c / ? "a" : ""
      if (b == "") next
      x = $0; sub(/.*rep_secs\(sorted\)=\[/, "", x); x += 0
      if (!(b in m) || x < m[b]) m[b] = x
    }
    END { if (("k" in m) && ("a" in m) && m["k"] > 0) printf "%.2fx (%.4f s against %.4f s)", m["a"] / m["k"], m["k"], m["a"] }' "$TMP/stderr")
  [ -n "$best" ] && rat="$rat; fastest repetitions vs arena_c: $best"
  cs=$(for x in $(cut -d' ' -f10 "$TMP/lines" | sort -u); do printf '%s ' "$x"; done)
  printf '%s|RATIO|kvidx-positional vs: %s|answers vs arena_c: %s|checksums: %s\n' "$label" "$rat" "$ans" "$cs" >>"$TABLE"
  echo "$wrote" | sed "s/^/$label|WROTE|/" >>"$TABLE"
done

# the table
{
  echo "| file | backend | M block-ops/s | vs arena_c | p50 µs | p99 µs | p99.9 µs | bytes / held block | peak bytes | checksum |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  awk -F'|' '$2 != "RATIO" && $2 != "WROTE" {
    vs = ($4 > 0) ? sprintf("%.2fx", $3 / $4) : "-"
    bpb = ($8 == "-") ? "-" : sprintf("%.0f", $8)
    pk = ($9 == "-") ? "-" : sprintf("%.1f MiB", $9 / 1048576)
    printf "| %s | %s | %.2f | %s | %.2f | %.2f | %.2f | %s | %s | %s |\n", $1, $2, $3 / 1e6, vs, $5 / 1e3, $6 / 1e3, $7 / 1e3, bpb, pk, $10
  }' "$TABLE"
  echo
  awk -F'|' '$2 == "RATIO" { printf "- **%s**: %s; %s; %s\n", $1, $3, $4, $5 }' "$TABLE"
  awk -F'|' '$2 == "WROTE" { sub(/^wrote [^:]*: /, "", $3); printf "- %s file: %s\n", $1, $3 }' "$TABLE"
} >"$TMP/table.md"
cat "$TMP/table.md" >>"$MD"
if grep -q 'rejected(apply errors)=[1-9]' "$TMP/stderr" 2>/dev/null; then
  echo "- NOTE: a Dynamo backend rejected events (see its stderr, below)." >>"$MD"
fi
{
  echo
  echo "Per-repetition times (sorted), from the tools' stderr:"
  echo
  echo '```'
  grep 'rep_secs\|^\[' "$TMP/stderr" | sed 's/; bytes_per_held_block = .*//; s/^/  /'
  echo '```'
} >>"$MD"
END=$(date +%s)
printf '\nSuite wall time: %ss. Command: `make %s` (or `HEAP=%s sh bench/run_dynamo.sh %s %s %s`).\n' \
  "$((END - START))" "$CMD" "$HEAP" "$BIN" "$TRACE" "$OUT" >>"$MD"
mv "$MD" "$OUT/$NAME"
echo
cat "$TMP/table.md"
echo "wrote $OUT/$NAME ($((END - START))s)"
[ -s "$TMP/fail" ] && fail=1
exit $fail
