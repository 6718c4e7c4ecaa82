#!/bin/sh
# Runs each make target named on the command line, keeps going after a
# failure, and ends with the plain closing line "N passed, N failed".
pass=0; fail=0; failed=""
for t in "$@"; do
  echo "=== $t"
  if ${MAKE:-make} --no-print-directory "$t"; then pass=$((pass+1)); else fail=$((fail+1)); failed="$failed $t"; fi
done
[ -n "$failed" ] && echo "failed parts:$failed"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
