#!/bin/sh
# Runs each make target named on the command line, keeps going after a
# failure, and ends with the plain closing line "N passed, N failed" (plus
# ", N skipped" when a part said "SKIPPED:" — a part that cannot run must
# say so, and then it is not counted as passed).
pass=0; fail=0; skip=0; failed=""; skipped=""
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvidx-parts.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
for t in "$@"; do
  echo "=== $t"
  { ${MAKE:-make} --no-print-directory "$t"; echo $? >"$tmp/rc"; } 2>&1 | tee "$tmp/out"
  if [ "$(cat "$tmp/rc")" != 0 ]; then fail=$((fail+1)); failed="$failed $t"
  elif grep -q 'SKIPPED:' "$tmp/out"; then skip=$((skip+1)); skipped="$skipped $t"
  else pass=$((pass+1)); fi
done
[ -n "$skipped" ] && echo "skipped parts:$skipped"
[ -n "$failed" ] && echo "failed parts:$failed"
if [ "$skip" -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"
else echo "$pass passed, $fail failed"; fi
[ "$fail" -eq 0 ]
