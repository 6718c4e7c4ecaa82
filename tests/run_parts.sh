#!/bin/sh
# Runs each make target named on the command line, keeps going after a
# failure, and ends with the plain closing line "N passed, N failed" (plus
# ", N skipped" when a part said "SKIPPED:" — a part that cannot run must
# say so, and then it is not counted as passed).  Each part's wall time is
# printed after it and again, slowest first, at the end (CI has 15 minutes).
# A part's prerequisites build $JOBS at a time (default: the cores).
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
pass=0; fail=0; skip=0; failed=""; skipped=""
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvidx-parts.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
start_all=$(date +%s)
for t in "$@"; do
  echo "=== $t"
  start=$(date +%s)
  { ${MAKE:-make} --no-print-directory -j"$jobs" "$t"; echo $? >"$tmp/rc"; } 2>&1 | tee "$tmp/out"
  secs=$(( $(date +%s) - start ))
  echo "--- $t: ${secs} s"
  echo "$secs $t" >>"$tmp/times"
  if [ "$(cat "$tmp/rc")" != 0 ]; then fail=$((fail+1)); failed="$failed $t"
  elif grep -q 'SKIPPED:' "$tmp/out"; then skip=$((skip+1)); skipped="$skipped $t"
  else pass=$((pass+1)); fi
done
echo "part times (s), slowest first; all: $(( $(date +%s) - start_all )) s"
sort -rn "$tmp/times" | sed 's/^/  /'
[ -n "$skipped" ] && echo "skipped parts:$skipped"
[ -n "$failed" ] && echo "failed parts:$failed"
if [ "$skip" -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"
else echo "$pass passed, $fail failed"; fi
[ "$fail" -eq 0 ]
